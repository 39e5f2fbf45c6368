/**
 * RetryScheduler (SPEC §5.4) under TestClock with a fixed Random: `stop` (in-flight attempts
 * interrupted at once; drained or not by the deadline) and health (the infrastructure after a
 * failed database, the retryScheduler section).
 * The store and the reconciler are fakes of their Tags (./retry-scheduler-support.ts).
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Fiber, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import { captureLogs } from "../support/captureLogs.js"
import { halfJitter } from "../support/halfJitter.js"
import { settle } from "../support/settle.js"
import { plc, testConfig } from "../support/stack.js"
import {
  advance,
  callTimes,
  deps,
  fail,
  fakeReconciler,
  fakeStore,
  newWorld,
  scheduler
} from "./retry-scheduler-support.js"

describe("RetryScheduler", () => {
  it.scoped("stop interrupts an in-flight PDS read at once (it does not wait for the deadline)", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    fail(world, A)
    fail(world, B)
    world.behaviour.set(A, "hang")
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      yield* advance(2_500) // A in flight (hangs); B attempted (failed) or waiting for the permit
      expect((yield* s.stats).inFlight).toBe(1)
      expect((yield* s.tracked).find((t) => t.inFlight)?.did).toBe(A)
      const now = yield* Clock.currentTimeMillis
      const stopping = yield* Effect.fork(s.stop(now + 5_000))
      yield* settle
      // done without the clock moving: A's read was interrupted at once, B dropped
      expect(stopping.unsafePoll()).not.toBeNull()
      expect(yield* Fiber.join(stopping)).toEqual({ drained: true })
      expect(yield* Clock.currentTimeMillis).toBe(now)
      expect(world.interrupted).toEqual([A])
      expect(yield* s.tracked).toEqual([])
      expect((yield* s.stats).running).toBe(false)
      // nothing new is admitted afterwards
      const calls = world.calls.length
      fail(world, plc(3))
      yield* advance(600_000)
      expect(world.calls.length).toBe(calls)
      // stop is idempotent
      expect(yield* s.stop(0)).toEqual({ drained: true })
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("stop does not wait for an in-flight attempt that would finish before the deadline: it is interrupted", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    return Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      world.behaviour.set(A, gate)
      const s = yield* scheduler(world)
      yield* advance(2_500)
      expect((yield* s.stats).inFlight).toBe(1)
      const now = yield* Clock.currentTimeMillis
      const stopping = yield* Effect.fork(s.stop(now + 5_000))
      yield* settle
      expect(stopping.unsafePoll()).not.toBeNull()
      expect(yield* Fiber.join(stopping)).toEqual({ drained: true })
      expect(yield* Clock.currentTimeMillis).toBe(now)
      expect(world.interrupted).toEqual([A])
      // the attempt's answer arrives too late to count
      yield* Deferred.succeed(gate, undefined)
      yield* settle
      expect((yield* s.stats).recovered).toBe(0)
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("stop: drained false when an interrupted scan's failure mark outlasts the deadline", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    world.behaviour.set(A, "hangSlowMark")
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      yield* advance(2_500)
      const now = yield* Clock.currentTimeMillis
      const stopping = yield* Effect.fork(s.stop(now + 5_000))
      yield* settle
      expect(stopping.unsafePoll()).toBeNull()
      yield* advance(4_999)
      expect(stopping.unsafePoll()).toBeNull()
      yield* advance(1)
      expect(stopping.unsafePoll()).not.toBeNull()
      expect(yield* Fiber.join(stopping)).toEqual({ drained: false })
      // the mark finishes later (the layer's scope awaits it at the latest)
      yield* advance(5_000)
      expect(world.interrupted).toEqual([A])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("stop with nothing in flight drains at once", () => {
    const world = newWorld()
    fail(world, plc(1))
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // tracked, sleeping
      const now = yield* Clock.currentTimeMillis
      expect(yield* s.stop(now + 5_000)).toEqual({ drained: true })
      expect(yield* Clock.currentTimeMillis).toBe(now)
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an attempt the database fails reports the infrastructure unhealthy until an attempt reaches it again", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    const down = { value: false }
    const store = fakeStore(world)
    const layer = Layer.mergeAll(
      Layer.succeed(ReconcileStore, {
        ...store,
        ownerState: (did: string) =>
          down.value ? Effect.fail(new StoreError({ op: "reconcile.ownerState", code: "down" })) : store.ownerState(did)
      }),
      fakeReconciler(world),
      Config.layerValue(testConfig())
    )
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      expect((yield* s.stats).infrastructureHealthy).toBe(true)
      down.value = true
      yield* advance(2_500) // attempt 0: the owner's state cannot be read
      expect(callTimes(world, A)).toEqual([])
      expect(yield* s.stats).toMatchObject({ infrastructureHealthy: false, tracked: 1, attempts: 0 })
      down.value = false
      world.behaviour.set(A, "succeed")
      yield* advance(5_000) // attempt 1, before the next round: the database answers again
      expect(callTimes(world, A)).toEqual([7_500])
      expect(yield* s.stats).toMatchObject({ infrastructureHealthy: true, tracked: 0, recovered: 1 })
    }).pipe(Effect.provide(layer), Effect.withRandom(halfJitter))
  })

  it.scoped("a round that failed (the database down) is followed by the next within 5 s, not a whole interval", () => {
    const world = newWorld()
    const down = { value: true }
    const rounds = { value: 0 }
    const store = fakeStore(world)
    const layer = Layer.mergeAll(
      Layer.succeed(ReconcileStore, {
        ...store,
        retryCandidates: (options: Parameters<typeof store.retryCandidates>[0]) =>
          Effect.suspend(() => {
            rounds.value++
            return down.value
              ? Effect.fail(new StoreError({ op: "reconcile.retryCandidates", code: "down" }))
              : store.retryCandidates(options)
          })
      }),
      fakeReconciler(world),
      Config.layerValue(testConfig())
    )
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      yield* advance(100)
      expect(rounds.value).toBe(1)
      expect((yield* s.stats).infrastructureHealthy).toBe(false)
      yield* advance(5_000)
      expect(rounds.value).toBe(2)
      down.value = false
      yield* advance(5_000)
      expect(rounds.value).toBe(3)
      expect((yield* s.stats).infrastructureHealthy).toBe(true)
      // healthy again: the next round after the whole interval (60 s)
      yield* advance(30_000)
      expect(rounds.value).toBe(3)
      yield* advance(30_000)
      expect(rounds.value).toBe(4)
    }).pipe(Effect.provide(layer), Effect.withRandom(halfJitter))
  })

  it.scoped("rounds failing every 5 s (the database down) warn once a minute, not once a round", () => {
    const world = newWorld()
    const store = fakeStore(world)
    return Effect.gen(function*() {
      const logs = yield* captureLogs
      const layer = Layer.mergeAll(
        Layer.succeed(ReconcileStore, {
          ...store,
          retryCandidates: () => Effect.fail(new StoreError({ op: "reconcile.retryCandidates", code: "down" }))
        }),
        fakeReconciler(world),
        Config.layerValue(testConfig()),
        logs.layer
      )
      const failed = Effect.map(logs.lines, (ls) => ls.filter((l) => l.includes("retry scheduler round failed")))
      yield* Effect.gen(function*() {
        yield* scheduler(world)
        // 12 rounds in the first minute (at 0 s, then every 5 s): one warning
        for (let i = 0; i < 11; i++) yield* advance(5_000)
        expect(yield* failed).toHaveLength(1)
        // the round at 60 s: one more, saying how many were held back
        yield* advance(5_000)
        const lines = yield* failed
        expect(lines).toHaveLength(2)
        expect(lines[1]).toContain(`"suppressed":11`)
      }).pipe(Effect.provide(layer))
    }).pipe(Effect.withRandom(halfJitter))
  })

  it.scoped("health: the retryScheduler section is ready while the scheduler runs, not once it is stopped", () => {
    const world = newWorld()
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      const section = RetryScheduler.healthSection(s)
      expect(yield* section).toMatchObject({ ready: true, body: { running: true, tracked: 0 } })
      const now = yield* Clock.currentTimeMillis
      expect(yield* s.stop(now + 1_000)).toEqual({ drained: true })
      expect(yield* section).toMatchObject({ ready: false, body: { running: false } })
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })
})
