/**
 * The shared homes of small helpers (issue 13): backoff with jitter, rate-limited logging, driver
 * error codes, labelled-counter families, stats health sections. Each replaced several copies, so
 * each formula is pinned here once.
 */
import { SqlError } from "@effect/sql/SqlError"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, HashSet, Metric, Random, Schedule, TestClock } from "effect"
import * as Backoff from "../../src/services/platform/Backoff.js"
import * as ErrorCode from "../../src/services/platform/ErrorCode.js"
import * as Health from "../../src/services/platform/Health.js"
import * as LockKeys from "../../src/services/platform/LockKeys.js"
import * as Metrics from "../../src/services/platform/Metrics.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"

const delays = (schedule: Schedule.Schedule<Duration.Duration>, n: number) =>
  Schedule.run(Schedule.delays(schedule), 0, Array.from({ length: n }, () => undefined)).pipe(
    Effect.map((c) => Array.from(c).map(Duration.toMillis))
  )

describe("Backoff", () => {
  it("ceiling: min(cap, base · 2ⁿ), finite for any n", () => {
    expect([0, 1, 2, 3, 10].map((n) => Backoff.ceilingMillis(100, 1_000, n))).toEqual([100, 200, 400, 800, 1_000])
    expect(Backoff.ceilingMillis(1, 1e12, 1_000_000)).toBe(2 ** 30)
    expect(Duration.toMillis(Backoff.exponential("250 millis", "30 seconds", 3))).toBe(2_000)
  })

  it("full jitter is floor(r · ceiling); equal jitter floor/round of ceiling · (0.5 + 0.5 r)", () => {
    expect(Backoff.fullJitterMillis(1_000, 0.5)).toBe(500)
    expect(Backoff.fullJitterMillis(999, 0.9999)).toBe(998)
    expect(Backoff.equalJitterMillis(1_000, 0)).toBe(500)
    expect(Backoff.equalJitterMillis(1_001, 0, "floor")).toBe(500)
    expect(Backoff.equalJitterMillis(1_001, 0, "round")).toBe(501)
  })

  it.effect("delays draw one Random.next each (Random.fixed makes them exact)", () =>
    Effect.gen(function*() {
      const full = yield* Backoff.fullJitter("100 millis", "1 second", 2)
      const equal = yield* Backoff.equalJitter("100 millis", "1 second", 2)
      expect(Duration.toMillis(full)).toBe(100) // 0.25 × 400
      expect(Duration.toMillis(equal)).toBe(250) // 400 × (0.5 + 0.125)
    }).pipe(Effect.withRandom(Random.fixed([0.25]))))

  it.effect("schedules: full jitter with a floor, equal jitter, both capped", () =>
    Effect.gen(function*() {
      expect(yield* delays(Backoff.fullJitterSchedule({ base: "100 millis", cap: "1 second", min: "30 millis" }), 6))
        .toEqual([
          50,
          100,
          200,
          400,
          500,
          500
        ])
      expect(yield* delays(Backoff.fullJitterSchedule({ base: "100 millis", cap: "1 second" }), 1)).toEqual([50])
      expect(yield* delays(Backoff.equalJitterSchedule({ base: "100 millis", cap: "1 second" }), 5)).toEqual([
        75,
        150,
        300,
        600,
        750
      ])
    }).pipe(Effect.withRandom(Random.fixed([0.5]))))
})

describe("RateLimitedLog", () => {
  it.effect("lets a key through once per interval and counts what it held back", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const limiter = RateLimitedLog.make({ everyMs: 60_000 })
      const log = (key: string) =>
        limiter.run(key, (suppressed) => Effect.sync(() => void lines.push(`${key} suppressed=${suppressed}`)))
      yield* log("a")
      yield* log("a")
      yield* log("b")
      yield* TestClock.adjust("59 seconds")
      yield* log("a")
      yield* TestClock.adjust("1 second")
      yield* log("a")
      expect(lines).toEqual(["a suppressed=0", "b suppressed=0", "a suppressed=2"])
    }))

  it.effect("its memory of keys is bounded", () =>
    Effect.gen(function*() {
      const lines: Array<string> = []
      const limiter = RateLimitedLog.make({ maxKeys: 2 })
      const log = (key: string) => limiter.run(key, () => Effect.sync(() => void lines.push(key)))
      for (const k of ["a", "b", "c", "d", "a"]) yield* log(k)
      // past the bound the memory is cleared, so `a` is let through again at once
      expect(lines).toEqual(["a", "b", "c", "d", "a"])
    }))
})

describe("ErrorCode", () => {
  it("reads well-formed codes only, the cause's first", () => {
    expect(ErrorCode.ownCode({ code: "ECONNREFUSED" })).toBe("ECONNREFUSED")
    expect(ErrorCode.ownCode({ code: "postgres://user:secret@host" })).toBeUndefined()
    expect(ErrorCode.ownCode({ code: 42 })).toBeUndefined()
    expect(ErrorCode.ownCode({ code: "timeout" })).toBe("timeout")
    expect(ErrorCode.driverCode({ _tag: "StoreError", op: "secrets.get", code: "defect" })).toBe("defect")
    expect(ErrorCode.ownCode("ECONNREFUSED")).toBeUndefined()
    expect(ErrorCode.driverCode({ code: "X", cause: { code: "57014" } })).toBe("57014")
    expect(ErrorCode.driverCode({ cause: new Error("no code") })).toBeUndefined()
    expect(ErrorCode.codeOr(null)).toBe("unknown")
    expect(ErrorCode.codeOr({}, "unknown error")).toBe("unknown error")
  })

  it("names the driver's code-less errors of fixed text (a dropped connection), by exact text only", () => {
    // what `pg` raises when PostgreSQL restarts or a session is terminated mid-use (no `code`)
    const lost = new SqlError({ cause: new Error("Connection terminated unexpectedly"), message: "m" })
    expect(ErrorCode.codeOr(lost)).toBe("connection_lost")
    expect(ErrorCode.codeOr(new Error("Client has encountered a connection error and is not queryable"))).toBe(
      "connection_lost"
    )
    expect(ErrorCode.codeOr(new Error("timeout exceeded when trying to connect"))).toBe("timeout")
    // a code wins; any other text is never read
    expect(ErrorCode.codeOr(Object.assign(new Error("Connection terminated"), { code: "ECONNRESET" }))).toBe(
      "ECONNRESET"
    )
    expect(ErrorCode.codeOr(new Error("Connection terminated unexpectedly: postgres://u:secret@h"))).toBe("unknown")
  })
})

describe("LockKeys", () => {
  it("no two roles share a key", () => {
    const keys = [LockKeys.MIGRATION, LockKeys.INTAKE, LockKeys.MAINTENANCE, LockKeys.RECONCILE]
    expect(HashSet.size(HashSet.fromIterable(keys))).toBe(keys.length)
  })
})

describe("Metrics.labelledCounterFamily", () => {
  it.effect("one counter per label set, made once", () =>
    Effect.gen(function*() {
      const family = Metrics.labelledCounterFamily("firehook_test_family_total", { incremental: true })
      expect(family({ outcome: "ok" })).toBe(family({ outcome: "ok" }))
      expect(family({ outcome: "ok" })).not.toBe(family({ outcome: "failed" }))
      yield* Metric.increment(family({ outcome: "ok" }))
      yield* Metric.increment(family({ outcome: "ok" }))
      const state = yield* Metric.value(family({ outcome: "ok" }))
      expect(state.count).toBe(2)
    }))
})

describe("Health.statsSection", () => {
  it.effect("copies the named fields in order and asks `ready`", () =>
    Effect.gen(function*() {
      const stats = Effect.succeed({ connected: true, dropped: 3, secret: "x" })
      const section = yield* Health.statsSection(stats, ["dropped", "connected"], (s) => s.connected)
      expect(section).toEqual({ ready: true, body: { dropped: 3, connected: true } })
      expect(Object.keys(section.body)).toEqual(["dropped", "connected"])
      const always = yield* Health.statsSection(Effect.succeed({ connected: false }), ["connected"])
      expect(always.ready).toBe(true)
    }))
})
