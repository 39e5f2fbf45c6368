/**
 * The late failure marks' bounds (SPEC §5.3 step 5; FailureMarks.ts) under TestClock with a fixed
 * Random and a fake store whose `markFailed` fails while the database is "down": at most
 * `maxPending` owners wait (a newer scan of a waiting owner replaces its mark, also at the bound),
 * and a mark is retried for at most `giveUpAfterMs` (then left to the stale-scan check), on an
 * equal-jitter exponential backoff from `baseMs`; a mark written late is counted as the owner's
 * failure (`firehook_reconcile_failures_total{kind}`), once.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Metric, Random, TestClock } from "effect"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as FailureMarks from "../../src/services/reconciliation/FailureMarks.js"
import * as Metrics from "../../src/services/reconciliation/ReconcileMetrics.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { settle } from "../support/settle.js"
import { plc } from "../support/stack.js"

/** A store whose marks fail while `down.value`; `written` holds the marks it took. */
const world = () => {
  const down = { value: true }
  const attempts: Array<string> = []
  /** the TestClock time of each attempt */
  const attemptsAt: Array<number> = []
  const written: Array<readonly [string, number, string]> = []
  const store = fakeReconcileStore({
    markFailed: (did, token, kind) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        attempts.push(did)
        attemptsAt.push(now)
        if (down.value) return Effect.fail(new StoreError({ op: "test", code: "57P01" }))
        written.push([did, token, kind])
        return Effect.succeed(true)
      })
  })
  return { down, attempts, attemptsAt, written, store }
}

describe("FailureMarks", () => {
  it.scoped("at most maxPending owners wait for the database; a newer scan of a waiting owner replaces its mark", () => {
    const w = world()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      const marks = yield* FailureMarks.make(w.store, {
        baseMs: 1_000,
        capMs: 1_000,
        giveUpAfterMs: 60_000,
        maxPending: 1
      })
      yield* marks.defer(A, 1, "database_error")
      yield* settle
      expect(yield* marks.pending).toBe(1)
      // beyond the bound: left to the stale-scan check
      yield* marks.defer(B, 1, "interrupted")
      yield* settle
      expect(yield* marks.pending).toBe(1)
      // A's newer scan (token 2) replaces A's waiting mark, though the bound is reached
      yield* marks.defer(A, 2, "interrupted")
      yield* settle
      expect(yield* marks.pending).toBe(1)
      // the database answers again: only A's newest mark is written; B's never was queued
      w.down.value = false
      yield* TestClock.adjust(Duration.seconds(2))
      yield* settle
      expect(w.written).toEqual([[A, 2, "interrupted"]])
      expect(w.attempts).not.toContain(B)
      expect(yield* marks.pending).toBe(0)
    }).pipe(Effect.withRandom(Random.fixed([0.5])))
  })

  it.scoped("a mark is retried for at most giveUpAfterMs, then left to the stale-scan check", () => {
    const w = world()
    const A = plc(3)
    return Effect.gen(function*() {
      const marks = yield* FailureMarks.make(w.store, {
        baseMs: 1_000,
        capMs: 1_000,
        giveUpAfterMs: 5_000,
        maxPending: 4
      })
      yield* marks.defer(A, 1, "database_error")
      yield* settle
      expect(yield* marks.pending).toBe(1)
      // the database stays down past the give-up bound
      for (let i = 0; i < 20; i++) yield* Effect.zipRight(TestClock.adjust(Duration.seconds(1)), settle)
      expect(yield* marks.pending).toBe(0)
      const tries = w.attempts.length
      expect(tries).toBeGreaterThan(1)
      expect(tries).toBeLessThanOrEqual(12)
      // nothing retries it any more (it would write the mark now that the database answers)
      w.down.value = false
      for (let i = 0; i < 20; i++) yield* Effect.zipRight(TestClock.adjust(Duration.seconds(1)), settle)
      expect(w.attempts.length).toBe(tries)
      expect(w.written).toEqual([])
    }).pipe(Effect.withRandom(Random.fixed([0.5])))
  })

  it.scoped("a mark is retried on an equal-jitter exponential backoff from baseMs; once written it is counted once", () => {
    const w = world()
    const A = plc(4)
    const kind = "late_mark_backoff_test"
    const failures = Effect.map(Metric.value(Metrics.reconcileFailures({ kind })), (s) => s.count)
    return Effect.gen(function*() {
      const before = yield* failures
      const marks = yield* FailureMarks.make(w.store, {
        baseMs: 1_000,
        capMs: 8_000,
        giveUpAfterMs: 600_000,
        maxPending: 4
      })
      yield* marks.defer(A, 1, kind)
      // delays 1 s, 2 s, 4 s, 8 s, 8 s, each × 0.75 with the fixed Random
      for (let i = 0; i < 5_250; i += 250) yield* Effect.zipRight(TestClock.adjust(Duration.millis(250)), settle)
      expect(w.attemptsAt).toEqual([0, 750, 2_250, 5_250])
      w.down.value = false
      for (let i = 0; i < 6_000; i += 250) yield* Effect.zipRight(TestClock.adjust(Duration.millis(250)), settle)
      expect(w.attemptsAt).toEqual([0, 750, 2_250, 5_250, 11_250])
      expect(w.written).toEqual([[A, 1, kind]])
      expect((yield* failures) - before).toBe(1)
    }).pipe(Effect.withRandom(Random.fixed([0.5])))
  })
})
