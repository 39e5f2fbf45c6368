/**
 * Prometheus text exposition (format 0.0.4) of every Effect `Metric` in the process.
 *
 * Services declare their metrics with `Metric.counter` / `Metric.gauge` / `Metric.histogram`
 * (names prefixed `firehook_`); `/metrics` renders `Metric.snapshot`. Names and label keys are
 * sanitized to the Prometheus grammar, label values escaped.
 */
import { Effect, Metric, MetricKey, MetricLabel, MetricState, Option } from "effect"
import type { MetricPair } from "effect"

const labelsOf = (labels: Readonly<Record<string, string>>) =>
  Object.entries(labels).map(([k, v]) => MetricLabel.make(k, v))

/**
 * A counter with its labels fixed in its key. `Metric.tagged` merges its labels into a new array on
 * every update, so each update builds and hashes a new metric key to find its state (several µs per
 * update, measured on the delivery path); a counter made here finds its state through a cached
 * hook, like an untagged one. The exported series are the same as with `Metric.tagged`.
 */
export const labelledCounter = (
  name: string,
  options: { readonly description?: string; readonly incremental?: boolean },
  labels: Readonly<Record<string, string>>
): Metric.Metric.Counter<number> =>
  Metric.fromMetricKey(MetricKey.taggedWithLabels(MetricKey.counter(name, options), labelsOf(labels)))

/** {@link labelledCounter} for a gauge. */
export const labelledGauge = (
  name: string,
  options: { readonly description?: string },
  labels: Readonly<Record<string, string>>
): Metric.Metric.Gauge<number> =>
  Metric.fromMetricKey(MetricKey.taggedWithLabels(MetricKey.gauge(name, options), labelsOf(labels)))

/**
 * A family of {@link labelledCounter}s of one name: `family(labels)` returns the counter for those
 * label values, made once and kept (building a labelled key per update is measurable on hot
 * paths). Callers pass the label keys in one fixed order; the number of distinct label sets is
 * bounded by the caller's enumerations.
 */
export const labelledCounterFamily = (
  name: string,
  options: { readonly description?: string; readonly incremental?: boolean }
) => {
  const cache = new Map<string, Metric.Metric.Counter<number>>()
  return (labels: Readonly<Record<string, string>>): Metric.Metric.Counter<number> => {
    // called per update on hot paths (every delivery attempt): a key without an intermediate array
    let key = ""
    for (const k in labels) key += `${labels[k]}\u0000`
    let counter = cache.get(key)
    if (counter === undefined) {
      counter = labelledCounter(name, options, labels)
      cache.set(key, counter)
    }
    return counter
  }
}

const sanitizeName = (s: string): string => {
  const cleaned = s.replace(/[^a-zA-Z0-9_:]/g, "_")
  return /^[a-zA-Z_:]/.test(cleaned) ? cleaned : `_${cleaned}`
}
const sanitizeLabel = (s: string): string => {
  const cleaned = s.replace(/[^a-zA-Z0-9_]/g, "_")
  return /^[a-zA-Z_]/.test(cleaned) ? cleaned : `_${cleaned}`
}
const escapeValue = (s: string): string => s.replace(/\\/g, "\\\\").replace(/\n/g, "\\n").replace(/"/g, "\\\"")
const escapeHelp = (s: string): string => s.replace(/\\/g, "\\\\").replace(/\n/g, "\\n")

const num = (n: number | bigint): string => {
  if (typeof n === "bigint") return n.toString()
  if (Number.isNaN(n)) return "NaN"
  if (n === Infinity) return "+Inf"
  if (n === -Infinity) return "-Inf"
  return String(n)
}

const labels = (pairs: ReadonlyArray<readonly [string, string]>): string =>
  pairs.length === 0 ? "" : `{${pairs.map(([k, v]) => `${sanitizeLabel(k)}="${escapeValue(v)}"`).join(",")}}`

interface Family {
  type: "counter" | "gauge" | "histogram" | "summary"
  help: string
  lines: Array<string>
}

/** Render metric pairs as Prometheus text. Exported for tests. */
export const render = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>): string => {
  const families = new Map<string, Family>()
  const family = (name: string, type: Family["type"], help: string): Family => {
    let f = families.get(name)
    if (f === undefined) {
      f = { type, help, lines: [] }
      families.set(name, f)
    }
    return f
  }
  for (const pair of pairs) {
    const key = pair.metricKey
    const name = sanitizeName(key.name)
    const help = Option.getOrElse(key.description, () => key.name)
    const tags = key.tags.map((t) => [t.key, t.value] as const)
    const state: unknown = pair.metricState
    if (MetricState.isCounterState(state)) {
      family(name, "counter", help).lines.push(`${name}${labels(tags)} ${num(state.count)}`)
    } else if (MetricState.isGaugeState(state)) {
      family(name, "gauge", help).lines.push(`${name}${labels(tags)} ${num(state.value)}`)
    } else if (MetricState.isHistogramState(state)) {
      const f = family(name, "histogram", help)
      for (const [bound, count] of state.buckets) {
        f.lines.push(`${name}_bucket${labels([...tags, ["le", num(bound)]])} ${num(count)}`)
      }
      if (!state.buckets.some(([b]) => b === Infinity)) {
        f.lines.push(`${name}_bucket${labels([...tags, ["le", "+Inf"]])} ${num(state.count)}`)
      }
      f.lines.push(`${name}_sum${labels(tags)} ${num(state.sum)}`)
      f.lines.push(`${name}_count${labels(tags)} ${num(state.count)}`)
    } else if (MetricState.isSummaryState(state)) {
      const f = family(name, "summary", help)
      for (const [q, v] of state.quantiles) {
        if (Option.isSome(v)) f.lines.push(`${name}${labels([...tags, ["quantile", num(q)]])} ${num(v.value)}`)
      }
      f.lines.push(`${name}_sum${labels(tags)} ${num(state.sum)}`)
      f.lines.push(`${name}_count${labels(tags)} ${num(state.count)}`)
    } else if (MetricState.isFrequencyState(state)) {
      const f = family(name, "counter", help)
      for (const [value, count] of state.occurrences) {
        f.lines.push(`${name}${labels([...tags, ["key", value]])} ${num(count)}`)
      }
    }
  }
  const out: Array<string> = []
  for (const [name, f] of [...families.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    out.push(`# HELP ${name} ${escapeHelp(f.help)}`)
    out.push(`# TYPE ${name} ${f.type}`)
    out.push(...f.lines)
  }
  return out.join("\n") + "\n"
}

const residentMemory = Metric.gauge("firehook_process_resident_memory_bytes", {
  description: "Resident set size of the process in bytes"
})
const heapUsed = Metric.gauge("firehook_process_heap_used_bytes", { description: "JavaScript heap in use, bytes" })

/** Sample process gauges, then render every metric. */
export const exposition: Effect.Effect<string> = Effect.gen(function*() {
  const mem = process.memoryUsage()
  yield* Metric.set(residentMemory, mem.rss)
  yield* Metric.set(heapUsed, mem.heapUsed)
  const pairs = yield* Metric.snapshot
  return render(pairs)
})
