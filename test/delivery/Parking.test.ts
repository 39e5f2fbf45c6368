/**
 * The mover's pass (Parking.ts) against a recording store, on the TestClock: what it parks and
 * unparks as an origin's circuit opens, probes, re-opens and closes.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Queue, TestClock } from "effect"
import { type CircuitBreaker, makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import {
  type DeliveryStoreShape,
  PARK_CHUNK,
  PARK_ORIGINS_MAX,
  type ParkedOrigin
} from "../../src/services/delivery/DeliveryStore.js"
import { nudge, PARK_CHUNKS_PER_PASS, parkPass } from "../../src/services/delivery/Parking.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import { StoreError } from "../../src/services/platform/Persistence.js"

const O = "https://bad.example"

/** The parts of a worker the mover's pass reads: a fresh state, the breaker, the store and a wake queue. */
const passEnv = (store: unknown, breaker: CircuitBreaker) =>
  Effect.map(
    Queue.sliding<void>(1),
    (wake) => ({ state: makeState(), breaker, store: store as DeliveryStoreShape, wake }) as unknown as WorkerEnv
  )

describe("Parking.parkPass", () => {
  it.effect("parks while open or probing, unparks what it parked when the origin recovers early", () =>
    Effect.gen(function*() {
      const calls: Array<readonly ["park" | "unpark", ReadonlyArray<ParkedOrigin>]> = []
      const store = {
        park: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (calls.push(["park", origins]), 5)),
        unpark: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (calls.push(["unpark", origins]), 5))
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000, probeTimeoutMs: 60_000 })
      const env = yield* passEnv(store, breaker)
      const pass = () => Effect.zipRight(Effect.sync(() => calls.splice(0)), parkPass(env))

      // closed, nothing parked: no statement at all
      expect(yield* pass()).toEqual({ parked: 0, unparked: 0 })
      expect(calls).toEqual([])

      // opens at 0: parked to the cool-down's end, and the claim loop is woken
      breaker.onTransientFailure(O, 0)
      expect(yield* pass()).toEqual({ parked: 5, unparked: 0 })
      expect(calls).toEqual([["park", [{ origin: O, untilMs: 1_000 }]]])
      expect(env.state.notified).toBe(true)
      expect(env.state.parked.get(O)).toBe(1_000)

      // the probe at 1 s: parked until its deadline
      yield* TestClock.adjust(Duration.millis(1_000))
      expect(breaker.canAttempt(O, 1_000)).toBe("probe")
      yield* pass()
      expect(calls).toEqual([["park", [{ origin: O, untilMs: 61_000 }]]])

      // the probe fails at 1.5 s: open for 2 s, earlier than the probe's deadline: the rows parked
      // to the deadline come back and are parked to the new end
      yield* TestClock.adjust(Duration.millis(500))
      breaker.onTransientFailure(O, 1_500)
      yield* pass()
      expect(calls).toEqual([
        ["unpark", [{ origin: O, untilMs: 61_000 }]],
        ["park", [{ origin: O, untilMs: 3_500 }]]
      ])

      // an attempt started before the trip succeeds: closed before 3.5 s, the parked rows are due now
      breaker.onSuccess(O)
      expect(yield* pass()).toEqual({ parked: 0, unparked: 5 })
      expect(calls).toEqual([["unpark", [{ origin: O, untilMs: 3_500 }]]])
      expect(env.state.parked.size).toBe(0)
      expect(env.state.unparkedRows).toBe(10)

      // nothing held or parked any more: no statement
      yield* pass()
      expect(calls).toEqual([])
    }))

  it.effect("a cool-down that ends on its own: nothing to unpark", () =>
    Effect.gen(function*() {
      const calls: Array<string> = []
      const store = {
        park: () => Effect.sync(() => (calls.push("park"), 0)),
        unpark: () => Effect.sync(() => (calls.push("unpark"), 0))
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      yield* parkPass(env)
      expect(calls).toEqual(["park"])
      // no rows moved: the claim loop is not woken
      expect(env.state.notified).toBe(false)
      // cool-down over, no probe yet: not held; the rows are due at 1 s on their own
      yield* TestClock.adjust(Duration.millis(1_000))
      yield* parkPass(env)
      expect(calls).toEqual(["park"])
      expect(env.state.parked.size).toBe(0)
    }))

  it.effect("an open origin nothing asks for any more (its webhook is gone) stops counting as open", () =>
    Effect.gen(function*() {
      const store = { park: () => Effect.succeed(0), unpark: () => Effect.succeed(0) }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      // a receiver that failed, then its webhook was deleted: no row ever asks for its probe
      breaker.onTransientFailure(O, 0)
      yield* parkPass(env)
      yield* TestClock.adjust(Duration.minutes(10))
      yield* parkPass(env)
      expect(breaker.openCount(10 * 60_000)).toBe(1)
      // 30 min after the cool-down's end the mover's pass has the breaker forget it
      yield* TestClock.adjust(Duration.minutes(20).pipe(Duration.sum(Duration.seconds(1))))
      yield* parkPass(env)
      expect(breaker.openCount(30 * 60_000 + 1_000)).toBe(0)
      expect(breaker.get(O)).toBeUndefined()
    }))

  /**
   * An origin that recovered early (parked to 1 s, closed at 0.5 s), against a store whose
   * `unpark` answers `answers` in turn (a number of rows moved, or "fail").
   */
  const recoveredEarly = (answers: Array<number | "fail">) =>
    Effect.gen(function*() {
      const unparks: Array<ReadonlyArray<ParkedOrigin>> = []
      const store = {
        park: () => Effect.succeed(3),
        unpark: (origins: ReadonlyArray<ParkedOrigin>) =>
          Effect.suspend(() => {
            unparks.push(origins)
            const a = answers.shift() ?? 0
            return a === "fail"
              ? Effect.fail(new StoreError({ op: "delivery.unpark", code: "57P01" }))
              : Effect.succeed(a)
          })
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      yield* parkPass(env)
      yield* TestClock.adjust(Duration.millis(500))
      breaker.onSuccess(O)
      return { env, unparks }
    })

  it.effect("an origin that recovers early gets every parked row back, beyond one statement's chunk", () =>
    Effect.gen(function*() {
      const { env, unparks } = yield* recoveredEarly([PARK_CHUNK, 7])
      // old code: one statement (10,000 rows), the rest left parked until the cool-down's end
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: PARK_CHUNK + 7 })
      expect(unparks).toEqual([[{ origin: O, untilMs: 1_000 }], [{ origin: O, untilMs: 1_000 }]])
      expect(env.state.parked.size).toBe(0)
    }))

  it.effect("a failed unpark is tried again by the next pass", () =>
    Effect.gen(function*() {
      const { env, unparks } = yield* recoveredEarly(["fail", 5])
      expect(Either.isLeft(yield* Effect.either(parkPass(env)))).toBe(true)
      // old code: the origin was already forgotten; no second unpark, its rows parked until 1 s
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: 5 })
      expect(unparks).toEqual([[{ origin: O, untilMs: 1_000 }], [{ origin: O, untilMs: 1_000 }]])
      expect(env.state.parked.size).toBe(0)
    }))

  it.effect("rows moved by a park statement before a later one of the pass failed are unparked when the origin recovers early", () =>
    Effect.gen(function*() {
      // the first statement moves a whole chunk, the second fails (a dropped connection)
      let parks = 0
      const unparks: Array<ReadonlyArray<ParkedOrigin>> = []
      const store = {
        park: () =>
          Effect.suspend(() =>
            ++parks === 1
              ? Effect.succeed(PARK_CHUNK)
              : Effect.fail(new StoreError({ op: "delivery.park", code: "57P01" }))
          ),
        unpark: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (unparks.push(origins), PARK_CHUNK - 1))
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 60_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      expect(Either.isLeft(yield* Effect.either(parkPass(env)))).toBe(true)
      expect(parks).toBe(2)
      // recorded although the pass failed: the rows of the first statement are at 60 s
      expect(env.state.parked.get(O)).toBe(60_000)
      // an attempt started before the trip succeeds at 1 s: closed again
      yield* TestClock.adjust(Duration.seconds(1))
      breaker.onSuccess(O)
      // old code: nothing held, nothing recorded: no unpark, the rows waited until 60 s
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: PARK_CHUNK - 1 })
      expect(unparks).toEqual([[{ origin: O, untilMs: 60_000 }]])
      expect(env.state.parked.size).toBe(0)
    }))

  it.effect("a park statement that fails before moving a row: the recorded time unparks nothing and costs one statement", () =>
    Effect.gen(function*() {
      const calls: Array<string> = []
      let fail = true
      const store = {
        park: () =>
          Effect.suspend(
            () => (calls.push("park"),
              fail ? Effect.fail(new StoreError({ op: "delivery.park", code: "57P01" })) : Effect.succeed(0))
          ),
        unpark: () => Effect.sync(() => (calls.push("unpark"), 0))
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 60_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      expect(Either.isLeft(yield* Effect.either(parkPass(env)))).toBe(true)
      // still held: the next pass parks again (the recorded time does not stop it)
      fail = false
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: 0 })
      expect(calls).toEqual(["park", "park"])
      // recovered early: one unpark that moves nothing, and the claim loop is not woken for it
      breaker.onSuccess(O)
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: 0 })
      expect(calls).toEqual(["park", "park", "unpark"])
      expect(env.state.notified).toBe(false)
      expect(env.state.parked.size).toBe(0)
    }))

  it.effect("held again until an earlier time with more parked rows than one pass unparks: the later time is kept until they are all back", () =>
    Effect.gen(function*() {
      const unparks: Array<ReadonlyArray<ParkedOrigin>> = []
      let unparkAnswer = PARK_CHUNK
      const store = {
        park: () => Effect.succeed(0),
        unpark: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (unparks.push(origins), unparkAnswer))
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000, probeTimeoutMs: 60_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      yield* parkPass(env)
      // the probe at 1 s: parked until its deadline, 61 s
      yield* TestClock.adjust(Duration.millis(1_000))
      expect(breaker.canAttempt(O, 1_000)).toBe("probe")
      yield* parkPass(env)
      expect(env.state.parked.get(O)).toBe(61_000)
      // the probe fails at 1.5 s: open until 3.5 s; the pass unparks whole chunks up to its bound
      yield* TestClock.adjust(Duration.millis(500))
      breaker.onTransientFailure(O, 1_500)
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: PARK_CHUNKS_PER_PASS * PARK_CHUNK })
      // old code: 3.5 s was recorded and the rows still at 61 s were never unparked
      expect(env.state.parked.get(O)).toBe(61_000)
      unparks.splice(0)
      unparkAnswer = 7
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: 7 })
      expect(unparks).toEqual([[{ origin: O, untilMs: 61_000 }]])
      expect(env.state.parked.get(O)).toBe(3_500)
    }))

  it.effect("an open origin with a backlog beyond one statement's chunk is parked whole in one pass, up to the pass's bound", () =>
    Effect.gen(function*() {
      // the store moves a full chunk twice, then the rest; then, for a second origin, full chunks for ever
      const answers = [PARK_CHUNK, PARK_CHUNK, 7]
      let parks = 0
      const store = {
        park: () => Effect.sync(() => (parks++, answers.shift() ?? PARK_CHUNK)),
        unpark: () => Effect.succeed(0)
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 60_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      expect(yield* parkPass(env)).toEqual({ parked: 2 * PARK_CHUNK + 7, unparked: 0 })
      expect(parks).toBe(3)
      // never more than PARK_CHUNKS_PER_PASS statements in one pass: the next pass goes on
      parks = 0
      expect(yield* parkPass(env)).toEqual({ parked: PARK_CHUNKS_PER_PASS * PARK_CHUNK, unparked: 0 })
      expect(parks).toBe(PARK_CHUNKS_PER_PASS)
    }))
})

/** Policy audit (SPEC §4.3 parking): the pass's bounds, its wake-ups and the attempt's nudge. */
describe("Parking: bounds and wake-ups", () => {
  /** A store that records every statement and moves `n` rows per statement. */
  const recording = (n: { park: number; unpark: number }) => {
    const calls: Array<readonly ["park" | "unpark", ReadonlyArray<ParkedOrigin>]> = []
    const store = {
      park: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (calls.push(["park", origins]), n.park)),
      unpark: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (calls.push(["unpark", origins]), n.unpark))
    }
    return { calls, store }
  }

  it.effect("a second pass while the origin is still open to the same time unparks nothing", () =>
    Effect.gen(function*() {
      const { calls, store } = recording({ park: 0, unpark: 0 })
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      yield* parkPass(env)
      yield* parkPass(env)
      expect(calls).toEqual([["park", [{ origin: O, untilMs: 1_000 }]], ["park", [{ origin: O, untilMs: 1_000 }]]])
    }))

  it.effect("a pass that only unparks rows wakes the claim loop", () =>
    Effect.gen(function*() {
      const { store } = recording({ park: 0, unpark: 4 })
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      // no row moved: nobody is woken
      yield* parkPass(env)
      expect(env.state.notified).toBe(false)
      expect(yield* Queue.size(env.wake)).toBe(0)
      // recovered before 1 s: the rows parked to 1 s are due now, and the claim loop must know
      breaker.onSuccess(O)
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: 4 })
      expect(env.state.notified).toBe(true)
      expect(yield* Queue.size(env.wake)).toBe(1)
    }))

  it.effect("unparking is bounded per pass too: at most PARK_CHUNKS_PER_PASS statements, the next pass goes on", () =>
    Effect.gen(function*() {
      const { calls, store } = recording({ park: 0, unpark: PARK_CHUNK })
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      breaker.onTransientFailure(O, 0)
      yield* parkPass(env)
      breaker.onSuccess(O)
      calls.splice(0)
      expect(yield* parkPass(env)).toEqual({ parked: 0, unparked: PARK_CHUNKS_PER_PASS * PARK_CHUNK })
      expect(calls.length).toBe(PARK_CHUNKS_PER_PASS)
      // not finished: the origin is still remembered, so the next pass unparks again
      expect(env.state.parked.get(O)).toBe(1_000)
    }))

  it.effect("one pass parks at most PARK_ORIGINS_MAX origins", () =>
    Effect.gen(function*() {
      const { calls, store } = recording({ park: 0, unpark: 0 })
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const env = yield* passEnv(store, breaker)
      for (let i = 0; i <= PARK_ORIGINS_MAX; i++) breaker.onTransientFailure(`https://o${i}.example`, 0)
      yield* parkPass(env)
      expect(calls.map(([op, origins]) => [op, origins.length])).toEqual([["park", PARK_ORIGINS_MAX]])
      expect(env.state.parked.size).toBe(PARK_ORIGINS_MAX)
    }))

  /** The env of `nudge`: the breaker, the parked origins and the mover's wake queue. */
  const nudgeEnv = (breaker: CircuitBreaker) =>
    Effect.gen(function*() {
      const base = yield* passEnv({}, breaker)
      const parkWake = yield* Queue.sliding<void>(1)
      const env: WorkerEnv = { ...base, parkWake }
      const woken = Effect.map(Queue.takeAll(parkWake), (taken) => taken.length > 0)
      return { env, woken }
    })

  it.effect("nudge wakes the mover when the origin tripped, when a probe is granted, and when it closed while parked", () =>
    Effect.gen(function*() {
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000 })
      const { env, woken } = yield* nudgeEnv(breaker)
      // closed and never parked: nothing to do
      nudge(env, O, 0)
      expect(yield* woken).toBe(false)
      // tripped, not parked yet: stale
      breaker.onTransientFailure(O, 0)
      nudge(env, O, 0)
      expect(yield* woken).toBe(true)
      // parked to exactly the cool-down's end: nothing to do
      env.state.parked.set(O, 1_000)
      nudge(env, O, 500)
      expect(yield* woken).toBe(false)
      // a probe granted: its rows must be held to the probe's deadline
      nudge(env, O, 1_000, "probe")
      expect(yield* woken).toBe(true)
      // closed again while its rows are parked: they must come back
      breaker.onSuccess(O)
      nudge(env, O, 1_000)
      expect(yield* woken).toBe(true)
    }))

  it.effect("nudge: an origin still counting failures (closed) with parked rows wakes the mover", () =>
    Effect.gen(function*() {
      const breaker = makeCircuitBreaker({ threshold: 3, cooldownMs: 1_000 })
      const { env, woken } = yield* nudgeEnv(breaker)
      breaker.onTransientFailure(O, 0)
      env.state.parked.set(O, 1_000)
      nudge(env, O, 0)
      expect(yield* woken).toBe(true)
    }))
})
