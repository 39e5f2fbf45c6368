/**
 * The mover's pass (Parking.ts) against a recording store, on the TestClock: what it parks and
 * unparks as an origin's circuit opens, probes, re-opens and closes.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Queue, TestClock } from "effect"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import type { DeliveryStoreShape, ParkedOrigin } from "../../src/services/delivery/DeliveryStore.js"
import { parkPass } from "../../src/services/delivery/Parking.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"

const O = "https://bad.example"

describe("Parking.parkPass", () => {
  it.effect("parks while open or probing, unparks what it parked when the origin recovers early", () =>
    Effect.gen(function*() {
      const calls: Array<readonly ["park" | "unpark", ReadonlyArray<ParkedOrigin>]> = []
      const store = {
        park: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (calls.push(["park", origins]), 5)),
        unpark: (origins: ReadonlyArray<ParkedOrigin>) => Effect.sync(() => (calls.push(["unpark", origins]), 5))
      }
      const breaker = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000, probeTimeoutMs: 60_000 })
      // the pass reads only these parts of the worker
      const env = {
        state: makeState(),
        breaker,
        store: store as unknown as DeliveryStoreShape,
        wake: yield* Queue.sliding<void>(1)
      } as unknown as WorkerEnv
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
      const env = {
        state: makeState(),
        breaker,
        store: store as unknown as DeliveryStoreShape,
        wake: yield* Queue.sliding<void>(1)
      } as unknown as WorkerEnv
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
})
