/**
 * A strict reader of the Prometheus text exposition format 0.0.4 for tests: it returns every
 * violation it finds (an empty list = valid), and the families it read. Stricter than Prometheus
 * where the format only recommends: counters end `_total`, histograms are complete.
 */

export interface Sample {
  readonly name: string
  readonly labels: ReadonlyArray<readonly [string, string]>
  readonly value: number
  readonly line: number
}

export interface PromFamily {
  readonly name: string
  help: string | undefined
  type: string | undefined
  readonly samples: Array<Sample>
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/
const TYPES = new Set(["counter", "gauge", "histogram", "summary", "untyped"])

/** `{a="x",b="y"}` from `s` at `i` (at the `{`): the labels and the index after `}`, or an error. */
const readLabels = (
  s: string,
  i: number
): { labels: Array<readonly [string, string]>; next: number } | string => {
  const labels: Array<readonly [string, string]> = []
  let p = i + 1
  for (let guard = 0; guard < 10_000; guard++) {
    if (s[p] === "}") return { labels, next: p + 1 }
    const eq = s.indexOf("=", p)
    if (eq < 0) return "label without ="
    const name = s.slice(p, eq)
    if (!LABEL_NAME.test(name)) return `bad label name ${JSON.stringify(name)}`
    if (s[eq + 1] !== "\"") return "label value not quoted"
    let v = ""
    let q = eq + 2
    for (;; q++) {
      const c = s[q]
      if (c === undefined) return "unterminated label value"
      if (c === "\n") return "raw newline in label value"
      if (c === "\"") break
      if (c === "\\") {
        const n = s[q + 1]
        if (n === "\\") v += "\\"
        else if (n === "\"") v += "\""
        else if (n === "n") v += "\n"
        else return `bad escape \\${n ?? ""} in label value`
        q++
      } else v += c
    }
    labels.push([name, v])
    p = q + 1
    if (s[p] === ",") p++
    else if (s[p] !== "}") return "labels not separated by ,"
  }
  return "too many labels"
}

const parseValue = (s: string): number | undefined => {
  if (s === "+Inf" || s === "Inf") return Infinity
  if (s === "-Inf") return -Infinity
  if (s === "NaN") return NaN
  if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(s)) return undefined
  return Number(s)
}

const key = (labels: ReadonlyArray<readonly [string, string]>, without: string | undefined = undefined) =>
  JSON.stringify(labels.filter(([k]) => k !== without).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))

/** The family a sample name belongs to, given the declared families (histogram/summary suffixes). */
const familyOf = (name: string, families: ReadonlyMap<string, PromFamily>): string => {
  for (const suffix of ["_bucket", "_sum", "_count"]) {
    if (name.endsWith(suffix)) {
      const base = name.slice(0, -suffix.length)
      const f = families.get(base)
      if (f !== undefined && (f.type === "histogram" || (f.type === "summary" && suffix !== "_bucket"))) return base
    }
  }
  return name
}

/** Parse `text` strictly; `errors` lists every violation. */
export const checkExposition = (text: string): { errors: Array<string>; families: Map<string, PromFamily> } => {
  const errors: Array<string> = []
  const families = new Map<string, PromFamily>()
  const closed = new Set<string>()
  let current: string | undefined
  const seriesSeen = new Set<string>()
  if (!text.endsWith("\n")) errors.push("exposition does not end with a newline")
  const lines = text.split("\n")
  if (lines.at(-1) === "") lines.pop()
  const enter = (name: string, n: number) => {
    if (current !== name) {
      if (current !== undefined) closed.add(current)
      if (closed.has(name)) errors.push(`line ${n}: family ${name} is not contiguous`)
      current = name
    }
  }
  lines.forEach((line, idx) => {
    const n = idx + 1
    if (line.startsWith("#")) {
      const m = /^# (HELP|TYPE) (\S+)(?: (.*))?$/.exec(line)
      if (m === null) return // a plain comment
      const [, what, name = "", rest = ""] = m
      if (!METRIC_NAME.test(name)) errors.push(`line ${n}: bad metric name ${name}`)
      enter(name, n)
      let f = families.get(name)
      if (f === undefined) {
        f = { name, help: undefined, type: undefined, samples: [] }
        families.set(name, f)
      }
      if (what === "HELP") {
        if (f.help !== undefined) errors.push(`line ${n}: second HELP for ${name}`)
        if (/\\[^\\n]/.test(rest.replace(/\\\\/g, ""))) errors.push(`line ${n}: bad escape in HELP of ${name}`)
        f.help = rest
      } else {
        if (f.type !== undefined) errors.push(`line ${n}: second TYPE for ${name}`)
        if (f.samples.length > 0) errors.push(`line ${n}: TYPE of ${name} after its samples`)
        if (!TYPES.has(rest)) errors.push(`line ${n}: unknown type ${rest} for ${name}`)
        f.type = rest
      }
      return
    }
    if (line.trim() === "") {
      errors.push(`line ${n}: empty line`)
      return
    }
    const nameEnd = line.search(/[{ ]/)
    if (nameEnd <= 0) {
      errors.push(`line ${n}: no value: ${line}`)
      return
    }
    const name = line.slice(0, nameEnd)
    if (!METRIC_NAME.test(name)) errors.push(`line ${n}: bad metric name ${name}`)
    let labels: Array<readonly [string, string]> = []
    let rest = line.slice(nameEnd)
    if (rest.startsWith("{")) {
      const r = readLabels(line, nameEnd)
      if (typeof r === "string") {
        errors.push(`line ${n}: ${r}: ${line}`)
        return
      }
      labels = r.labels
      rest = line.slice(r.next)
    }
    const names = labels.map(([k]) => k)
    if (new Set(names).size !== names.length) errors.push(`line ${n}: duplicate label name: ${line}`)
    const parts = rest.trim().split(/ +/)
    if (!rest.startsWith(" ") || parts.length < 1 || parts.length > 2) {
      errors.push(`line ${n}: bad value part: ${line}`)
      return
    }
    const value = parseValue(parts[0] ?? "")
    if (value === undefined) {
      errors.push(`line ${n}: bad value: ${line}`)
      return
    }
    if (Number.isNaN(value)) errors.push(`line ${n}: NaN: ${line}`)
    const fname = familyOf(name, families)
    const f = families.get(fname)
    if (f === undefined || f.type === undefined || f.help === undefined) {
      errors.push(`line ${n}: sample of ${fname} before its HELP and TYPE`)
      return
    }
    enter(fname, n)
    const series = `${name}${key(labels)}`
    if (seriesSeen.has(series)) errors.push(`line ${n}: duplicate series ${series}`)
    seriesSeen.add(series)
    f.samples.push({ name, labels, value, line: n })
  })

  for (const f of families.values()) {
    if (f.help === undefined) errors.push(`${f.name}: no HELP`)
    if (f.type === undefined) errors.push(`${f.name}: no TYPE`)
    if (f.type === "counter") {
      if (!f.name.endsWith("_total")) errors.push(`${f.name}: counter whose name does not end in _total`)
      for (const s of f.samples) {
        if (s.name !== f.name) errors.push(`line ${s.line}: ${s.name} in counter ${f.name}`)
        if (!(s.value >= 0) || !Number.isFinite(s.value)) errors.push(`line ${s.line}: counter value ${s.value}`)
      }
    } else if (f.name.endsWith("_total")) {
      errors.push(`${f.name}: a ${f.type ?? "?"} whose name ends in _total`)
    }
    if (f.type === "gauge") {
      for (const s of f.samples) if (s.name !== f.name) errors.push(`line ${s.line}: ${s.name} in gauge ${f.name}`)
    }
    if (f.type === "histogram") {
      const bySeries = new Map<string, { buckets: Array<[number, number]>; sum?: number; count?: number }>()
      const of = (labels: ReadonlyArray<readonly [string, string]>) => {
        const k = key(labels, "le")
        let e = bySeries.get(k)
        if (e === undefined) {
          e = { buckets: [] }
          bySeries.set(k, e)
        }
        return e
      }
      for (const s of f.samples) {
        if (s.name === `${f.name}_bucket`) {
          const le = s.labels.find(([k]) => k === "le")?.[1]
          const bound = le === undefined ? undefined : parseValue(le)
          if (bound === undefined || Number.isNaN(bound)) {
            errors.push(`line ${s.line}: bucket without a valid le`)
            continue
          }
          of(s.labels).buckets.push([bound, s.value])
        } else if (s.name === `${f.name}_sum`) of(s.labels).sum = s.value
        else if (s.name === `${f.name}_count`) of(s.labels).count = s.value
        else errors.push(`line ${s.line}: ${s.name} in histogram ${f.name}`)
      }
      for (const [k, e] of bySeries) {
        const where = `${f.name}${k}`
        if (e.sum === undefined) errors.push(`${where}: no _sum`)
        if (e.count === undefined) errors.push(`${where}: no _count`)
        const les = e.buckets.map(([b]) => b)
        for (let i = 1; i < les.length; i++) {
          if (!((les[i] ?? 0) > (les[i - 1] ?? 0))) errors.push(`${where}: le not increasing at ${les[i]}`)
        }
        for (let i = 1; i < e.buckets.length; i++) {
          if ((e.buckets[i]?.[1] ?? 0) < (e.buckets[i - 1]?.[1] ?? 0)) {
            errors.push(`${where}: buckets not cumulative at le=${e.buckets[i]?.[0]}`)
          }
        }
        const inf = e.buckets.find(([b]) => b === Infinity)
        if (inf === undefined) errors.push(`${where}: no le="+Inf" bucket`)
        else if (inf[1] !== e.count) errors.push(`${where}: +Inf bucket ${inf[1]} != _count ${e.count}`)
      }
    }
  }
  return { errors, families }
}
