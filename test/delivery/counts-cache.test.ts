/**
 * SPEC §6.2: `/health` answers within 1 s whatever the database does. The `delivery` section's
 * backlog counts come from a cache refreshed in the background (a fiber of the worker's scope,
 * each read bounded), so a health request never waits on the counts query; counts older than 5 s
 * are marked `stale`. A store whose counts query hangs, on the TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Layer, Option, Scope, TestClock } from "effect"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import * as CountsCache from "../../src/services/delivery/CountsCache.js"
import { COUNTS_TIMEOUT, COUNTS_TTL_MS, type DeliveryCounts } from "../../src/services/delivery/DeliveryStore.js"
import * as Worker from "../../src/services/delivery/Worker.js"
import { makeState } from "../../src/services/delivery/WorkerState.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"

const REFRESH = CountsCache.COUNTS_REFRESH_MS
const TIMEOUT = Duration.toMillis(COUNTS_TIMEOUT)

/** A counts query that answers, hangs (until interrupted) or fails, as the test says. */
const fakeCounts = () => {
  const calls = { started: 0, interrupted: 0 }
  let mode: "answer" | "hang" | "fail" = "answer"
  let value: DeliveryCounts = { pending: 3, leased: 2, deadLetter: 1, autoDisabledWebhooks: 0, goneWebhooks: 0 }
  const counts: Effect.Effect<DeliveryCounts, StoreError> = Effect.suspend(() => {
    calls.started++
    if (mode === "answer") return Effect.succeed(value)
    if (mode === "fail") return Effect.fail(new StoreError({ op: "delivery.counts", code: "57P01" }))
    return Effect.never.pipe(Effect.onInterrupt(() =>
      Effect.sync(() => {
        calls.interrupted++
      })
    ))
  })
  return {
    counts,
    calls,
    answer: (v: DeliveryCounts) => {
      mode = "answer"
      value = v
    },
    hang: () => {
      mode = "hang"
    },
    fail: () => {
      mode = "fail"
    }
  }
}

/** Let the forked fibers run without moving the clock. */
const settle = Effect.yieldNow().pipe(Effect.repeatN(20))

/** `eff`'s result, required to be there without the clock moving (a read that waited on the query would not be). */
const atOnce = <A, E>(eff: Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.fork(eff)
    yield* settle
    const exit = yield* Fiber.poll(fiber)
    if (Option.isNone(exit)) {
      yield* Fiber.interrupt(fiber)
      return yield* Effect.dieMessage("did not answer without waiting")
    }
    return yield* exit.value
  })

const HealthTest = Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })))

describe("delivery health counts (SPEC §6.2)", () => {
  it.scoped("/health answers at once while the counts query hangs: the last counts, stale past 5 s, fresh again after", () =>
    Effect.gen(function*() {
      const fake = fakeCounts()
      const env = { state: makeState(), breaker: makeCircuitBreaker(), log: RateLimitedLog.make(), store: fake }
      const health = yield* Health.Health
      yield* (yield* Lifecycle.Lifecycle).setPhase("live")
      yield* health.register("delivery", yield* Worker.healthSection(env))
      yield* settle
      // t = 0: the first read has answered
      const first = yield* atOnce(health.report)
      expect(first.ready).toBe(true)
      expect(first.body["delivery"]).toEqual({
        pending: 3,
        leased: 2,
        deadLetter: 1,
        inFlight: 0,
        openCircuits: 0,
        autoDisabledWebhooks: 0,
        goneWebhooks: 0,
        stale: false
      })
      expect(fake.calls.started).toBe(1)
      // the database stops answering: the next read (t = 2 s) hangs; health reads never wait for it
      fake.hang()
      yield* TestClock.adjust(Duration.millis(REFRESH))
      yield* settle
      expect(fake.calls.started).toBe(2)
      expect((yield* atOnce(health.report)).body["delivery"]).toMatchObject({ pending: 3, stale: false })
      // t = 4.5 s: the hung read is abandoned (bounded), the cache keeps its counts
      yield* TestClock.adjust(Duration.millis(TIMEOUT))
      yield* settle
      expect(fake.calls.interrupted).toBe(1)
      // t = 5 s: five seconds old, still fresh
      yield* TestClock.adjust(Duration.millis(COUNTS_TTL_MS - REFRESH - TIMEOUT))
      expect((yield* atOnce(health.report)).body["delivery"]).toMatchObject({ stale: false })
      // past 5 s: stale, the last known counts, and readiness unaffected (the backlog never gates it)
      yield* TestClock.adjust(Duration.millis(1))
      const stale = yield* atOnce(health.report)
      expect(stale.ready).toBe(true)
      expect(stale.body["delivery"]).toEqual({
        pending: 3,
        leased: 2,
        deadLetter: 1,
        inFlight: 0,
        openCircuits: 0,
        autoDisabledWebhooks: 0,
        goneWebhooks: 0,
        stale: true
      })
      // the database answers again: the next read (t = 6.5 s) refreshes the counts
      fake.answer({ pending: 7, leased: 0, deadLetter: 4, autoDisabledWebhooks: 0, goneWebhooks: 0 })
      yield* TestClock.adjust(Duration.millis(2 * REFRESH + TIMEOUT - COUNTS_TTL_MS - 1))
      yield* settle
      expect(fake.calls.started).toBe(3)
      expect((yield* atOnce(health.report)).body["delivery"]).toMatchObject({
        pending: 7,
        leased: 0,
        deadLetter: 4,
        stale: false
      })
    }).pipe(Effect.provide(HealthTest)))

  it.scoped("before the first answer the counts are 0 and stale; a failing query keeps the last answer", () =>
    Effect.gen(function*() {
      const fake = fakeCounts()
      fake.hang()
      const errors: Array<string> = []
      const cache = yield* CountsCache.make({
        counts: fake.counts,
        stopped: () => false,
        onError: (e) =>
          Effect.sync(() => {
            errors.push(`${e.op} ${e.code}`)
          })
      })
      expect(yield* atOnce(cache.read)).toEqual({
        counts: { pending: 0, leased: 0, deadLetter: 0, autoDisabledWebhooks: 0, goneWebhooks: 0 },
        stale: true
      })
      yield* TestClock.adjust(Duration.millis(TIMEOUT))
      expect(errors).toEqual(["delivery.counts timeout"])
      fake.answer({ pending: 1, leased: 1, deadLetter: 1, autoDisabledWebhooks: 0, goneWebhooks: 0 })
      yield* TestClock.adjust(Duration.millis(REFRESH))
      expect(yield* atOnce(cache.read)).toEqual({
        counts: { pending: 1, leased: 1, deadLetter: 1, autoDisabledWebhooks: 0, goneWebhooks: 0 },
        stale: false
      })
      fake.fail()
      yield* TestClock.adjust(Duration.millis(REFRESH))
      expect(errors).toEqual(["delivery.counts timeout", "delivery.counts 57P01"])
      expect(yield* atOnce(cache.read)).toEqual({
        counts: { pending: 1, leased: 1, deadLetter: 1, autoDisabledWebhooks: 0, goneWebhooks: 0 },
        stale: false
      })
      yield* TestClock.adjust(Duration.millis(COUNTS_TTL_MS - REFRESH + 1))
      expect(yield* atOnce(cache.read)).toEqual({
        counts: { pending: 1, leased: 1, deadLetter: 1, autoDisabledWebhooks: 0, goneWebhooks: 0 },
        stale: true
      })
    }))

  it.effect("the refresh is owned by its scope and ends when the worker stops", () =>
    Effect.gen(function*() {
      const fake = fakeCounts()
      let stopped = false
      const scope = yield* Scope.make()
      yield* CountsCache.make({ counts: fake.counts, stopped: () => stopped, onError: () => Effect.void }).pipe(
        Scope.extend(scope)
      )
      yield* settle
      yield* TestClock.adjust(Duration.millis(REFRESH))
      expect(fake.calls.started).toBe(2)
      // the worker stops: no read after that
      stopped = true
      yield* TestClock.adjust(Duration.millis(10 * REFRESH))
      expect(fake.calls.started).toBe(2)
      // and a hung read is interrupted with the scope
      stopped = false
      const second = yield* Scope.make()
      fake.hang()
      yield* CountsCache.make({ counts: fake.counts, stopped: () => stopped, onError: () => Effect.void }).pipe(
        Scope.extend(second)
      )
      yield* settle
      expect(fake.calls.started).toBe(3)
      yield* Scope.close(second, Exit.void)
      expect(fake.calls.interrupted).toBe(1)
      yield* Scope.close(scope, Exit.void)
    }))
})

describe("delivery health counts: the answer's age (policy audit)", () => {
  it.scoped("an answer's age counts from the moment its query started, not from its end", () =>
    Effect.gen(function*() {
      const value: DeliveryCounts = { pending: 5, leased: 0, deadLetter: 0, autoDisabledWebhooks: 0, goneWebhooks: 0 }
      // a slow database: every counts query takes the refresh pause (2 s) to answer
      const cache = yield* CountsCache.make({
        counts: Effect.as(Effect.sleep(Duration.millis(REFRESH)), value),
        stopped: () => false,
        onError: () => Effect.void
      })
      // t = 2 s: the first query (started at 0) has answered
      yield* TestClock.adjust(Duration.millis(REFRESH))
      yield* settle
      expect(yield* cache.read).toEqual({ counts: value, stale: false })
      // t = 5 s + 1 ms: the second query (started at 4 s) is still running; the answer in hand was asked
      // for 5 s + 1 ms ago, so it is stale (it arrived only 3 s ago)
      yield* TestClock.adjust(Duration.millis(COUNTS_TTL_MS - REFRESH + 1))
      yield* settle
      expect(yield* cache.read).toEqual({ counts: value, stale: true })
    }))
})
