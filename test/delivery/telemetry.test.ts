/**
 * The delivery worker's series as operators meet them on `/metrics` (docs/operations.md, "Metrics
 * reference", delivery): what each Telemetry function records, under which name, labels and type,
 * and the histograms' buckets. (The metric registry is global to the test file: compare deltas.)
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import * as Telemetry from "../../src/services/delivery/Telemetry.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import * as Metrics from "../../src/services/platform/Metrics.js"
import { checkExposition, type PromFamily } from "../support/promText.js"

/** The families of this process's exposition, read strictly. */
const scrape = Effect.map(Metrics.exposition, (text) => {
  const { errors, families } = checkExposition(text)
  expect(errors.filter((e) => e.includes("firehook_delivery_"))).toEqual([])
  return families
})

/** `family`'s samples as `name{k="v",…} value` with the labels sorted, so that order does not matter. */
const samples = (family: PromFamily | undefined): Array<string> =>
  (family?.samples ?? []).map((s) => {
    const labels = [...s.labels].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    return `${s.name}{${labels.map(([k, v]) => `${k}="${v}"`).join(",")}} ${s.value}`
  })

/** The value of the sample `line` (as {@link samples} writes it, without the value) or 0. */
const valueOf = (family: PromFamily | undefined, line: string): number => {
  const found = samples(family).find((s) => s.startsWith(`${line} `))
  return found === undefined ? 0 : Number(found.slice(line.length + 1))
}

const ATTEMPTS = "firehook_delivery_attempts_total"
const NOT_ATTEMPTED = "firehook_delivery_not_attempted_total"
const FIRST = "firehook_delivery_first_attempt_latency_ms"
const DURATION = "firehook_delivery_attempt_duration_ms"

describe("Telemetry: the delivery series on /metrics", () => {
  it.effect("attempts are counted once each, by outcome and failure kind", () =>
    Effect.gen(function*() {
      const before = (yield* scrape).get(ATTEMPTS)
      Telemetry.countAttempt("delivered", "none")
      Telemetry.countAttempt("retry", "timeout")
      Telemetry.countAttempt("retry", "timeout")
      const after = (yield* scrape).get(ATTEMPTS)
      expect(after?.type).toBe("counter")
      const delta = (line: string) => valueOf(after, line) - valueOf(before, line)
      expect(delta(`${ATTEMPTS}{kind="none",outcome="delivered"}`)).toBe(1)
      expect(delta(`${ATTEMPTS}{kind="timeout",outcome="retry"}`)).toBe(2)
      // every sample carries exactly the two labels
      for (const s of after?.samples ?? []) expect(s.labels.map(([k]) => k).sort()).toEqual(["kind", "outcome"])
      expect(samples((yield* scrape).get(NOT_ATTEMPTED)).filter((s) => s.includes("timeout"))).toEqual([])
    }))

  it.effect("rows settled without an attempt are counted by reason, and not as attempts", () =>
    Effect.gen(function*() {
      const before = yield* scrape
      Telemetry.countNotAttempted("circuit_open")
      const after = yield* scrape
      expect(after.get(NOT_ATTEMPTED)?.type).toBe("counter")
      const line = `${NOT_ATTEMPTED}{reason="circuit_open"}`
      expect(valueOf(after.get(NOT_ATTEMPTED), line) - valueOf(before.get(NOT_ATTEMPTED), line)).toBe(1)
      expect(samples(after.get(ATTEMPTS))).toEqual(samples(before.get(ATTEMPTS)))
    }))

  it.effect("the two latency histograms: each its own, in ms, with buckets 1, 2, 4 … 1,048,576 ms and +Inf", () =>
    Effect.gen(function*() {
      const countAndSum = (families: ReadonlyMap<string, PromFamily>, name: string) => ({
        count: valueOf(families.get(name), `${name}_count{}`),
        sum: valueOf(families.get(name), `${name}_sum{}`)
      })
      const start = yield* scrape
      Telemetry.recordFirstAttemptLatency(3)
      const first = yield* scrape
      Telemetry.recordAttemptDuration(1_500)
      const second = yield* scrape
      const delta = (
        a: ReadonlyMap<string, PromFamily>,
        b: ReadonlyMap<string, PromFamily>,
        name: string
      ) => ({
        count: countAndSum(b, name).count - countAndSum(a, name).count,
        sum: countAndSum(b, name).sum - countAndSum(a, name).sum
      })
      expect(delta(start, first, FIRST)).toEqual({ count: 1, sum: 3 })
      expect(delta(start, first, DURATION)).toEqual({ count: 0, sum: 0 })
      expect(delta(first, second, DURATION)).toEqual({ count: 1, sum: 1_500 })
      expect(delta(first, second, FIRST)).toEqual({ count: 0, sum: 0 })
      const bounds = [...Array.from({ length: 21 }, (_, i) => String(2 ** i)), "+Inf"]
      for (const name of [FIRST, DURATION]) {
        const family = second.get(name)
        expect(family?.type).toBe("histogram")
        const les = (family?.samples ?? []).filter((s) => s.name === `${name}_bucket`).map((s) =>
          s.labels.find(([k]) => k === "le")?.[1]
        )
        expect(les).toEqual(bounds)
      }
      // 1,500 ms falls in the 2,048 ms bucket, not the 1,024 ms one
      const bucket = (le: string) => valueOf(second.get(DURATION), `${DURATION}_bucket{le="${le}"}`)
      expect(bucket("2048") - bucket("1024")).toBe(1)
    }))

  it.effect("in flight and open circuits are two gauges, each set to its own figure", () =>
    Effect.gen(function*() {
      const state = makeState()
      state.inFlight = 3
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 60_000 })
      breaker.onTransientFailure("https://a.example", 0)
      breaker.onTransientFailure("https://b.example", 0)
      const env = { state, breaker, clock: { unsafeCurrentTimeMillis: () => 1_000 } } as unknown as WorkerEnv
      Telemetry.setInFlight(env)
      Telemetry.updateOpenCircuits(env)
      const families = yield* scrape
      expect(families.get("firehook_delivery_in_flight")?.type).toBe("gauge")
      expect(families.get("firehook_delivery_open_circuits")?.type).toBe("gauge")
      expect(samples(families.get("firehook_delivery_in_flight"))).toEqual(["firehook_delivery_in_flight{} 3"])
      expect(samples(families.get("firehook_delivery_open_circuits"))).toEqual(["firehook_delivery_open_circuits{} 2"])
      Telemetry.setOpenCircuits(0)
      expect(samples((yield* scrape).get("firehook_delivery_open_circuits"))).toEqual([
        "firehook_delivery_open_circuits{} 0"
      ])
      expect(samples((yield* scrape).get("firehook_delivery_in_flight"))).toEqual(["firehook_delivery_in_flight{} 3"])
    }))
})
