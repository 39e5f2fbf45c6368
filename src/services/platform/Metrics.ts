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

const FAMILY_TYPES = ["counter", "gauge", "histogram", "summary"] as const

interface Family {
  type: (typeof FAMILY_TYPES)[number]
  help: string
  lines: Array<string>
}

/** Render metric pairs as Prometheus text. Exported for tests. */
export const render = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>): string => renderFamilies(familiesOf(pairs))

/**
 * Effect's counters that are decremented as well as incremented (`effect_fiber_active`: the fibers
 * alive now), exposed as the gauges they are, so that nobody takes their `rate()`.
 */
const COUNTERS_THAT_GO_DOWN: ReadonlySet<string> = new Set(["effect_fiber_active"])

/** The metric families of `pairs`, by name. */
const familiesOf = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>): Map<string, Family> => {
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
      family(name, COUNTERS_THAT_GO_DOWN.has(name) ? "gauge" : "counter", help).lines.push(
        `${name}${labels(tags)} ${num(state.count)}`
      )
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
  return families
}

/** Families as Prometheus text, by name; each family's `# HELP` and `# TYPE` once, then its samples. */
const renderFamilies = (families: ReadonlyMap<string, Family>): string => {
  const out: Array<string> = []
  for (const [name, f] of [...families.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    out.push(`# HELP ${name} ${escapeHelp(f.help)}`)
    out.push(`# TYPE ${name} ${f.type}`)
    out.push(...f.lines)
  }
  return out.join("\n") + "\n"
}

/**
 * Another process's exposition (made by {@link render}: the delivery child's) to serve with this
 * process's own, each of its samples given `labels` (e.g. `process="delivery-child"`), so that no
 * series of the two processes share a name and labels.
 */
export interface ForeignExposition {
  readonly text: string
  readonly labels: Readonly<Record<string, string>>
}

/**
 * The families of an exposition made by {@link render}: `# HELP` starts a family, `# TYPE` gives
 * its type, the sample lines that follow are its own. Anything else (a sample before any family, a
 * family of unknown type) is dropped.
 */
const parseFamilies = (text: string): Map<string, Family> => {
  const families = new Map<string, Family>()
  let current: { readonly name: string; readonly family: Family } | undefined = undefined
  for (const line of text.split("\n")) {
    if (line.startsWith("# HELP ")) {
      const rest = line.slice("# HELP ".length)
      const space = rest.indexOf(" ")
      const name = space < 0 ? rest : rest.slice(0, space)
      current = {
        name,
        family: { type: "gauge", help: unescapeHelp(space < 0 ? "" : rest.slice(space + 1)), lines: [] }
      }
      families.delete(name)
    } else if (line.startsWith("# TYPE ") && current !== undefined) {
      const [name, type] = line.slice("# TYPE ".length).split(" ")
      const known = FAMILY_TYPES.find((t) => t === type)
      if (name === current.name && known !== undefined) {
        current.family.type = known
        families.set(current.name, current.family)
      }
    } else if (line.length > 0 && !line.startsWith("#") && current !== undefined && families.has(current.name)) {
      current.family.lines.push(line)
    }
  }
  return families
}

const unescapeHelp = (s: string): string => s.replace(/\\(\\|n)/g, (_, c: string) => (c === "n" ? "\n" : "\\"))

/** A sample line (`name{…} value` or `name value`) with `extra` (rendered labels) first in its label set. */
const withLabels = (line: string, extra: string): string => {
  // a metric name holds neither `{` nor a space, so the first of them ends it
  const brace = line.indexOf("{")
  const space = line.indexOf(" ")
  if (brace >= 0 && (space < 0 || brace < space)) {
    const rest = line.slice(brace + 1)
    return `${line.slice(0, brace)}{${extra}${rest.startsWith("}") ? "" : ","}${rest}`
  }
  return space < 0 ? line : `${line.slice(0, space)}{${extra}}${line.slice(space)}`
}

/**
 * This process's metrics with other processes' expositions merged in: one family per name (this
 * process's help and type; a foreign family whose type differs is left out), the foreign samples
 * labelled as their {@link ForeignExposition} says.
 */
export const merge = (
  pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>,
  others: ReadonlyArray<ForeignExposition>
): string => {
  const families = familiesOf(pairs)
  for (const other of others) {
    const pairsOfLabels = Object.entries(other.labels).map(([k, v]) => [k, v] as const)
    const extra = labels(pairsOfLabels).slice(1, -1)
    for (const [name, foreign] of parseFamilies(other.text)) {
      const own = families.get(name)
      if (own !== undefined && own.type !== foreign.type) continue
      const target = own ?? { type: foreign.type, help: foreign.help, lines: [] }
      for (const line of foreign.lines) target.lines.push(extra.length === 0 ? line : withLabels(line, extra))
      families.set(name, target)
    }
  }
  return renderFamilies(families)
}

const residentMemory = Metric.gauge("firehook_process_resident_memory_bytes", {
  description: "Resident set size of the process in bytes"
})
const heapUsed = Metric.gauge("firehook_process_heap_used_bytes", { description: "JavaScript heap in use, bytes" })

/** {@link exposition} with other processes' expositions merged in ({@link merge}). */
export const exposeWith = (others: ReadonlyArray<ForeignExposition>): Effect.Effect<string> =>
  Effect.gen(function*() {
    const mem = process.memoryUsage()
    yield* Metric.set(residentMemory, mem.rss)
    yield* Metric.set(heapUsed, mem.heapUsed)
    const pairs = yield* Metric.snapshot
    return merge(pairs, others)
  })

/** Sample process gauges, then render every metric of this process. */
export const exposition: Effect.Effect<string> = exposeWith([])
