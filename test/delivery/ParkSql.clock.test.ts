/**
 * The park clock (ParkSql.makeParkClock) keeps the offset it carries cool-down ends with stable
 * against the noise of each measurement, whatever the offset in use: `unpark` looks for the rows at
 * exactly the time `park` wrote (`=`), so a 1 s jump of the offset between them leaves an origin that
 * recovered early with its rows parked until the cool-down's end.
 *
 * The database's `clock_timestamp()` is scripted here (a statement answering the worker's Clock plus
 * `dbAheadMs`), so each measurement is exact; the measurement on real PostgreSQL and the statements
 * are tested in policy-bounds.test.ts ("the park clock") and worker.noisy.test.ts.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, TestClock } from "effect"
import { makeParkClock, PARK_CLOCK_REMEASURE_MS } from "../../src/services/delivery/ParkSql.js"

const origins = [{ origin: "https://a.example", untilMs: 120_000 }]

/** A park clock over a database whose clock is `ahead.ms` ahead of the worker's, read as it is at each measurement. */
const scripted = (ahead: { ms: number }) => {
  const measuring =
    ((..._args: ReadonlyArray<unknown>) =>
      Effect.map(Clock.currentTimeMillis, (now) => [{ ms: now + ahead.ms }])) as unknown as SqlClient.SqlClient
  return makeParkClock(measuring)
}

/** The end `origins` is carried to after the clock is measured again (one remeasure interval later). */
const remeasured = (clock: ReturnType<typeof makeParkClock>) =>
  Effect.zipRight(
    TestClock.adjust(Duration.millis(PARK_CLOCK_REMEASURE_MS)),
    Effect.map(clock.shift(origins), (o) => o[0]?.untilMs)
  )

describe("ParkSql.makeParkClock: the offset in use is stable at the tolerance's edge", () => {
  it.effect("a database ~1 s ahead measured 1,001 ms then 999 ms: the ends park wrote do not move", () =>
    Effect.gen(function*() {
      const ahead = { ms: 1_001 }
      const clock = scripted(ahead)
      expect((yield* clock.shift(origins))[0]?.untilMs).toBe(121_001)
      // 2 ms of round-trip noise: old code rounded 999 to none and moved the end to 120,000
      ahead.ms = 999
      expect(yield* remeasured(clock)).toBe(121_001)
      ahead.ms = 1_500
      expect(yield* remeasured(clock)).toBe(121_001)
    }))

  it.effect("the same at -1 s (a database behind the worker)", () =>
    Effect.gen(function*() {
      const ahead = { ms: -1_001 }
      const clock = scripted(ahead)
      expect((yield* clock.shift(origins))[0]?.untilMs).toBe(118_999)
      ahead.ms = -999
      expect(yield* remeasured(clock)).toBe(118_999)
    }))

  it.effect("an offset under 1 s from the start is taken as none, and a skew growing past 1 s replaces it", () =>
    Effect.gen(function*() {
      const ahead = { ms: 999 }
      const clock = scripted(ahead)
      expect(yield* clock.shift(origins)).toBe(origins)
      ahead.ms = -999
      expect(yield* remeasured(clock)).toBe(120_000)
      ahead.ms = 1_000
      expect(yield* remeasured(clock)).toBe(121_000)
    }))

  it.effect("a skew that really changed by 1 s or more replaces the offset, and one gone under 1 s is taken as none", () =>
    Effect.gen(function*() {
      const ahead = { ms: 5_000 }
      const clock = scripted(ahead)
      expect((yield* clock.shift(origins))[0]?.untilMs).toBe(125_000)
      ahead.ms = 4_001
      expect(yield* remeasured(clock)).toBe(125_000)
      ahead.ms = 3_000
      expect(yield* remeasured(clock)).toBe(123_000)
      // 2.5 s away from the offset in use and under 1 s: none, never an offset under the tolerance
      ahead.ms = 500
      expect(yield* remeasured(clock)).toBe(120_000)
      // and from none, noise under 1 s changes nothing
      ahead.ms = 999
      expect(yield* remeasured(clock)).toBe(120_000)
    }))

  it.effect("the offset is measured at most once per interval", () =>
    Effect.gen(function*() {
      const ahead = { ms: 5_000 }
      const clock = scripted(ahead)
      expect((yield* clock.shift(origins))[0]?.untilMs).toBe(125_000)
      ahead.ms = 9_000
      yield* TestClock.adjust(Duration.millis(PARK_CLOCK_REMEASURE_MS - 1))
      expect((yield* clock.shift(origins))[0]?.untilMs).toBe(125_000)
    }))
})
