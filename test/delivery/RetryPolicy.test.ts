import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Either, Exit, Fiber, Option, Random, Ref, Schedule, TestClock } from "effect"
import { parseRetryAfter } from "../../src/services/delivery/Classify.js"
import {
  defaultRetryConfig,
  nextDelay,
  retryAfterDelayMs,
  type RetryConfig,
  retrySchedule,
  validateRetryConfig
} from "../../src/services/delivery/RetryPolicy.js"

const ms = (o: Option.Option<Duration.Duration>): number | "dead" =>
  Option.match(o, { onNone: () => "dead" as const, onSome: Duration.toMillis })

const delays = (cfg: RetryConfig, upTo: number, retryAfter?: number) =>
  Effect.forEach(Array.from({ length: upTo }, (_, i) => i + 1), (n) => Effect.map(nextDelay(cfg, n, retryAfter), ms))

describe("nextDelay", () => {
  it.effect("exact delays for attempts 1–12 with r = 0.5 (×0.75), cap, then dead letter", () =>
    Effect.gen(function*() {
      const out = yield* delays(defaultRetryConfig, 12)
      expect(out).toEqual([
        750, // 1 s
        1_500, // 2 s
        3_000, // 4 s
        6_000, // 8 s
        12_000, // 16 s
        24_000, // 32 s
        48_000, // 64 s
        96_000, // 128 s
        192_000, // 256 s
        225_000, // 512 s → capped at 300 s
        225_000, // 1024 s → capped at 300 s
        "dead" // attempt 12 of 12 was the last
      ])
    }).pipe(Effect.withRandom(Random.fixed([0.5]))))

  it.effect("equal jitter spans [0.5, 1.0] of the capped delay", () =>
    Effect.gen(function*() {
      const low = yield* delays(defaultRetryConfig, 11).pipe(Effect.withRandom(Random.fixed([0])))
      const high = yield* delays(defaultRetryConfig, 11).pipe(Effect.withRandom(Random.fixed([1])))
      expect(low).toEqual([500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 150_000, 150_000])
      expect(high).toEqual([1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000, 300_000])
      // one random draw per delay, used in order
      const mixed = yield* delays(defaultRetryConfig, 3).pipe(Effect.withRandom(Random.fixed([0, 1, 0.2])))
      expect(mixed).toEqual([500, 2_000, 2_400])
    }))

  it.effect("configurable base, cap and attempts", () =>
    Effect.gen(function*() {
      const cfg: RetryConfig = { baseMs: 250, maxMs: 1_500, maxAttempts: 5 }
      expect(yield* delays(cfg, 6)).toEqual([250, 500, 1_000, 1_500, "dead", "dead"])
      expect(yield* delays({ baseMs: 1_000, maxMs: 300_000, maxAttempts: 1 }, 1)).toEqual(["dead"])
      // 50 attempts: no overflow, stays at the cap
      const fifty = yield* delays({ baseMs: 1_000, maxMs: 300_000, maxAttempts: 50 }, 50)
      expect(fifty[48]).toBe(300_000)
      expect(fifty[49]).toBe("dead")
    }).pipe(Effect.withRandom(Random.fixed([1]))))

  it.effect("Retry-After (delta-seconds) overrides without jitter, capped at 1 h then at the cap", () =>
    Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const d = (cfg: RetryConfig, v: string, attempt = 1) =>
        Effect.map(nextDelay(cfg, attempt, parseRetryAfter(v, now)), ms)
      expect(yield* d(defaultRetryConfig, "120")).toBe(120_000)
      expect(yield* d(defaultRetryConfig, "0")).toBe(0)
      expect(yield* d(defaultRetryConfig, "3")).toBe(3_000) // even below the computed delay
      expect(yield* d(defaultRetryConfig, "7200")).toBe(300_000) // → 1 h → 5 min cap
      const longCap: RetryConfig = { baseMs: 1_000, maxMs: 7_200_000, maxAttempts: 12 }
      expect(yield* d(longCap, "7200")).toBe(3_600_000) // the 1 h cap binds first
      expect(yield* d(longCap, "1800")).toBe(1_800_000)
      // an unparseable header falls back to the jittered exponential delay
      expect(yield* d(defaultRetryConfig, "soon", 3)).toBe(2_000)
      // no retry-after can revive a spent budget
      expect(yield* d(defaultRetryConfig, "10", 12)).toBe("dead")
    }).pipe(Effect.withRandom(Random.fixed([0]))))

  it.effect("Retry-After HTTP-date relative to the Clock, with caps", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.UTC(2026, 0, 15, 12, 0, 0))
      const now = yield* Clock.currentTimeMillis
      const d = (cfg: RetryConfig, v: string) => Effect.map(nextDelay(cfg, 2, parseRetryAfter(v, now)), ms)
      expect(yield* d(defaultRetryConfig, "Thu, 15 Jan 2026 12:01:30 GMT")).toBe(90_000)
      expect(yield* d(defaultRetryConfig, "Thu, 15 Jan 2026 11:00:00 GMT")).toBe(0) // past → now
      expect(yield* d(defaultRetryConfig, "Thu, 15 Jan 2026 18:00:00 GMT")).toBe(300_000)
      expect(yield* d({ ...defaultRetryConfig, maxMs: 86_400_000 }, "Thu, 15 Jan 2026 18:00:00 GMT")).toBe(3_600_000)
    }))
})

describe("the Retry-After override given a value it cannot honour", () => {
  it("a negative Retry-After is due now, never before now", () => {
    expect(retryAfterDelayMs(defaultRetryConfig, -5_000)).toBe(0)
    expect(retryAfterDelayMs(defaultRetryConfig, 0)).toBe(0)
  })

  it.effect("a NaN Retry-After is ignored: the jittered exponential delay applies", () =>
    Effect.gen(function*() {
      expect(ms(yield* nextDelay(defaultRetryConfig, 3, Number.NaN))).toBe(2_000)
      expect(ms(yield* nextDelay(defaultRetryConfig, 12, Number.NaN))).toBe("dead")
    }).pipe(Effect.withRandom(Random.fixed([0]))))
})

describe("retrySchedule", () => {
  const sequence: [number, ...Array<number>] = [0.13, 0.97, 0.5, 0, 1, 0.42, 0.77, 0.01, 0.66, 0.3, 0.88, 0.21]

  for (
    const cfg of [
      defaultRetryConfig,
      { baseMs: 300, maxMs: 20_000, maxAttempts: 9 },
      { baseMs: 1_000, maxMs: 300_000, maxAttempts: 1 },
      { baseMs: 2_000, maxMs: 3_600_000, maxAttempts: 20 }
    ] satisfies ReadonlyArray<RetryConfig>
  ) {
    it.effect(`agrees with nextDelay (base ${cfg.baseMs}, cap ${cfg.maxMs}, attempts ${cfg.maxAttempts})`, () =>
      Effect.gen(function*() {
        const fromSchedule = yield* Schedule.run(
          retrySchedule(cfg),
          0,
          Array.from({ length: cfg.maxAttempts + 5 }, (_, i) => i)
        ).pipe(Effect.withRandom(Random.fixed(sequence)))
        const expected = yield* delays(cfg, cfg.maxAttempts).pipe(Effect.withRandom(Random.fixed(sequence)))
        // Schedule.run also reports the output of the final (done) step: drop it.
        const scheduled = Array.from(fromSchedule).slice(0, -1).map(Duration.toMillis)
        expect(scheduled).toHaveLength(cfg.maxAttempts - 1)
        expect([...scheduled, "dead"]).toEqual(expected)
      }))
  }

  it.effect("drives Effect.retry: exactly maxAttempts attempts at the nextDelay instants (TestClock)", () =>
    Effect.gen(function*() {
      const cfg = defaultRetryConfig
      const attempts = yield* Ref.make<ReadonlyArray<number>>([])
      const failing = Effect.flatMap(
        Clock.currentTimeMillis,
        (t) => Effect.zipRight(Ref.update(attempts, (a) => [...a, t]), Effect.fail("boom" as const))
      )
      const fiber = yield* Effect.fork(Effect.retry(failing, retrySchedule(cfg)))
      // not done before the clock moves: the first retry waits 750 ms
      yield* TestClock.adjust(Duration.millis(749))
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      expect(yield* Ref.get(attempts)).toHaveLength(1)
      yield* TestClock.adjust(Duration.hours(1))
      const exit = yield* Fiber.await(fiber)
      expect(Exit.isFailure(exit)).toBe(true)
      const times = yield* Ref.get(attempts)
      expect(times).toHaveLength(cfg.maxAttempts)
      const gaps = times.slice(1).map((t, i) => t - (times[i] ?? 0))
      expect(gaps).toEqual((yield* delays(cfg, cfg.maxAttempts)).slice(0, -1))
    }).pipe(Effect.withRandom(Random.fixed([0.5]))))

  it.effect("the exact instants with a fine-grained TestClock", () =>
    Effect.gen(function*() {
      const cfg: RetryConfig = { baseMs: 100, maxMs: 1_000, maxAttempts: 6 }
      const attempts = yield* Ref.make<ReadonlyArray<number>>([])
      const failing = Effect.flatMap(Clock.currentTimeMillis, (t) =>
        Effect.zipRight(Ref.update(attempts, (a) => [...a, t]), Effect.fail("boom" as const)))
      const fiber = yield* Effect.fork(Effect.retry(failing, retrySchedule(cfg)))
      yield* TestClock.adjust(Duration.millis(10_000))
      expect(Exit.isFailure(yield* Fiber.await(fiber))).toBe(true)
      // r = 0.5 → 75, 150, 300, 600, 750 (cap 1000 × 0.75)
      expect(yield* Ref.get(attempts)).toEqual([0, 75, 225, 525, 1_125, 1_875])
    }).pipe(Effect.withRandom(Random.fixed([0.5]))))
})

describe("validateRetryConfig", () => {
  it("accepts the defaults and the documented ranges, rejects the rest", () => {
    expect(validateRetryConfig(defaultRetryConfig)).toEqual(Either.right(defaultRetryConfig))
    for (const maxAttempts of [1, 50]) {
      expect(Either.isRight(validateRetryConfig({ ...defaultRetryConfig, maxAttempts }))).toBe(true)
    }
    // the ranges' edges are valid: a cap equal to the base (no growth), a base of exactly 1 h
    for (
      const edge of [
        { baseMs: 1, maxMs: 1, maxAttempts: 12 },
        { baseMs: 5_000, maxMs: 5_000, maxAttempts: 12 },
        { baseMs: 3_600_000, maxMs: 86_400_000, maxAttempts: 12 }
      ]
    ) {
      expect(validateRetryConfig(edge)).toEqual(Either.right(edge))
    }
    for (
      const bad of [
        { ...defaultRetryConfig, maxAttempts: 0 },
        { ...defaultRetryConfig, maxAttempts: 51 },
        { ...defaultRetryConfig, maxAttempts: 2.5 },
        { ...defaultRetryConfig, baseMs: 0 },
        { ...defaultRetryConfig, baseMs: 400_000 }, // above the cap
        { baseMs: 3_600_001, maxMs: 86_400_000, maxAttempts: 12 },
        { ...defaultRetryConfig, maxMs: 86_400_001 }
      ]
    ) {
      expect(validateRetryConfig(bad)).toEqual(Either.left("invalid_retry_config"))
    }
  })
})
