/**
 * The strict exposition reader of the end-to-end metrics test (test/support/promText.ts) catches
 * what it must, and `Metrics.render` / `Metrics.merge` output of awkward label values and help
 * texts passes it.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Metric, MetricBoundaries } from "effect"
import * as Metrics from "../../src/services/platform/Metrics.js"
import { checkExposition } from "../support/promText.js"

describe("the strict exposition reader", () => {
  it("finds each kind of violation", () => {
    const bad = [
      "# HELP a_total x",
      "# TYPE a_total counter",
      "a_total{k=\"v\\q\"} 1",
      "# HELP a_total again",
      "# HELP g gauge",
      "# TYPE g gauge",
      "g NaN",
      "# HELP c counter",
      "# TYPE c counter",
      "c 1",
      "# HELP h h",
      "# TYPE h histogram",
      "h_bucket{le=\"1\"} 3",
      "h_bucket{le=\"2\"} 2",
      "h_bucket{le=\"+Inf\"} 4",
      "h_count 5",
      "orphan 1",
      "a_total 2"
    ].join("\n") + "\n"
    const { errors } = checkExposition(bad)
    const has = (s: string) => expect(errors.some((e) => e.includes(s)), `${s} in ${errors.join("; ")}`).toBe(true)
    has("bad escape")
    has("second HELP")
    has("NaN")
    has("does not end in _total")
    has("not cumulative")
    has("+Inf bucket 4 != _count 5")
    has("no _sum")
    has("before its HELP and TYPE")
    has("not contiguous")
  })

  it.effect("Metrics.merge of awkward label values and help texts is valid", () =>
    Effect.gen(function*() {
      const odd = "a\\b\"c\nd} e,f=g"
      yield* Metric.increment(
        Metric.tagged(
          Metric.counter("firehook_test_odd_total", { description: "help with \\ and \n newline" }),
          "v",
          odd
        )
      )
      yield* Metric.update(
        Metric.histogram("firehook_test_odd_ms", MetricBoundaries.fromIterable([1, 10])).pipe(Metric.tagged("v", odd)),
        5
      )
      const pairs = yield* Metric.snapshot
      const own = Metrics.render(pairs)
      const merged = Metrics.merge(pairs, [{ text: own, labels: { process: "delivery-child" } }])
      for (const text of [own, merged]) {
        const { errors, families } = checkExposition(text)
        expect(errors.filter((e) => !e.startsWith("effect_fiber_"))).toEqual([])
        const odds = families.get("firehook_test_odd_total")?.samples ?? []
        expect(odds.map((s) => s.labels.find(([k]) => k === "v")?.[1])).toEqual(
          text === own ? [odd] : [odd, odd]
        )
      }
    }))
})
