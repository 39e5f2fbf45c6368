/**
 * docs/operations.md's "Metrics reference" against the source: every metric src/ declares
 * (`Metric.counter|gauge|histogram`, `Metrics.labelledCounter|labelledGauge|labelledCounterFamily`)
 * has a row, with its type, and every row names a metric src/ declares. (The end-to-end test
 * test/e2e/metrics-logs.test.ts compares a real scrape's families, with their labels.)
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"
import { ROOT } from "../support/proc.js"

const walk = (d: string): Array<string> =>
  Fs.readdirSync(d, { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? walk(Path.join(d, e.name)) : e.name.endsWith(".ts") ? [Path.join(d, e.name)] : []
  )

const TYPES: Record<string, string> = {
  counter: "counter",
  gauge: "gauge",
  histogram: "histogram",
  labelledCounter: "counter",
  labelledCounterFamily: "counter",
  labelledGauge: "gauge"
}

/** name → type of every metric declared in src/ */
const declared = (): Map<string, string> => {
  const out = new Map<string, string>()
  for (const file of walk(Path.join(ROOT, "src"))) {
    const text = Fs.readFileSync(file, "utf8")
    for (
      const m of text.matchAll(
        /\b(?:Metric\.(counter|gauge|histogram)|(labelledCounterFamily|labelledCounter|labelledGauge))\(\s*"(firehook_[a-z_]+)"/g
      )
    ) {
      out.set(m[3]!, TYPES[m[1] ?? m[2]!]!)
    }
  }
  return out
}

const documented = (): Map<string, string> => {
  const text = Fs.readFileSync(Path.join(ROOT, "docs/operations.md"), "utf8")
  const section = text.slice(text.indexOf("## Metrics reference"), text.indexOf("## Process tree"))
  const out = new Map<string, string>()
  for (const m of section.matchAll(/^\| `([a-z_:]+)(?:\{[a-z_,]+\})?` \| (\w+) \|/gm)) out.set(m[1]!, m[2]!)
  return out
}

describe("the metrics reference of docs/operations.md", () => {
  it("names every metric src/ declares, with its type, and no other", () => {
    const src = declared()
    const doc = documented()
    expect(src.size).toBeGreaterThan(50)
    expect([...src].filter(([name, type]) => doc.get(name) !== type)).toEqual([])
    expect([...doc.keys()].filter((name) => !src.has(name))).toEqual([])
  })
})
