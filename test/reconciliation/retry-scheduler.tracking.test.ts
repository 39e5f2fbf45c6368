/**
 * RetryScheduler (SPEC §5.4) under TestClock with a fixed Random: which owners a round tracks and
 * forgets (completed, reset or gone meanwhile; superseded), the tracking bound and the requests'
 * budget (a request wakes an owner tracked as failed even when that budget is full), and the swap
 * of owners completed elsewhere (in batches, at most swapSyncMax a round, from 10 min before the
 * first round).
 * The store and the reconciler are fakes of their Tags (./retry-scheduler-support.ts).
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Layer } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import { halfJitter } from "../support/halfJitter.js"
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
  it.scoped("a PDS's Retry-After is waited before the backoff's next delay, also by a requested owner", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    const C = plc(3)
    fail(world, A)
    fail(world, B)
    fail(world, C)
    world.retryAfter.set(A, 30_000)
    world.retryAfter.set(C, 30_000)
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      // all first tried after half of 5 s (halfJitter); then B after half of 10 s, A and C 30 s later
      yield* advance(2_500)
      yield* advance(5_000)
      expect(callTimes(world, B)).toEqual([2_500, 7_500])
      expect(callTimes(world, A)).toEqual([2_500])
      // a reconciliation request for A while it waits: it still waits for the PDS, then goes at once
      const owner = world.owners.get(A)
      if (owner !== undefined) owner.requested = true
      yield* s.tick
      yield* advance(20_000)
      expect(callTimes(world, A)).toEqual([2_500])
      yield* advance(5_000)
      expect(callTimes(world, A)).toEqual([2_500, 32_500])
      expect(callTimes(world, C)).toEqual([2_500])
      yield* advance(5_000)
      expect(callTimes(world, C)).toEqual([2_500, 37_500])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner completed meanwhile is forgotten without a reconciliation", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // tracked by the round at start
      const owner = world.owners.get(A)
      if (owner !== undefined) owner.status = "complete"
      yield* advance(2_500)
      expect(world.calls).toEqual([])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner completed, reset to unknown, or gone meanwhile is forgotten without a reconciliation", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    const C = plc(3)
    fail(world, A)
    fail(world, B)
    fail(world, C)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // all three tracked by the round at start
      expect((yield* s.tracked).map((t) => t.did)).toEqual([A, B, C])
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0 })
      world.owners.set(B, { status: "unknown", failureCount: 0, failedSeq: 0 })
      world.owners.delete(C)
      yield* advance(2_500)
      expect(world.calls).toEqual([])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner whose scan began elsewhere meanwhile is left to that scan: no reconciliation superseding it", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      expect((yield* s.tracked).map((t) => t.did)).toEqual([A])
      // a sweep (or another replica) begins A's scan before the attempt is due; if that scan fails,
      // A is listed again as failed (and a crashed one after the stale-scan time)
      world.owners.set(A, { status: "scanning", failureCount: 1, failedSeq: 0 })
      yield* advance(2_500)
      expect(world.calls).toEqual([])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a superseded attempt (a newer scan of the owner fenced it off) ends the tracking, like a success", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    world.behaviour.set(A, "superseded")
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      yield* advance(2_500)
      expect(callTimes(world, A)).toEqual([2_500])
      // not retried on its backoff: the newer scan completes the owner, or fails and is listed again
      expect(yield* s.tracked).toEqual([])
      expect((yield* s.stats).recovered).toBe(1)
      yield* advance(30_000)
      expect(callTimes(world, A)).toEqual([2_500])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a request for an owner tracked as failed but completed elsewhere since is reconciled at once, not skipped", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      fail(world, A, 10)
      const s = yield* scheduler(world, { trackedMax: 1 })
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 9, inFlight: false }])
      // another process completes A; then A's account asks for a reconciliation (`#sync`)
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(A, "succeed")
      yield* advance(60_000)
      expect(callTimes(world, A)).toEqual([60_000])
      expect(world.owners.get(A)).toMatchObject({ status: "complete", requested: false })
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a round's free slots go to owners not tracked yet, not to the ones already tracked (oldest failure first)", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      world.behaviour.set(A, gate)
      fail(world, A) // the oldest failure: tracked first, and still failed while its attempt runs
      const s = yield* scheduler(world, { trackedMax: 2 })
      expect((yield* s.tracked).map((t) => t.did)).toEqual([A])
      fail(world, B)
      yield* advance(60_000)
      expect((yield* s.tracked).map((t) => t.did)).toEqual([A, B])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner whose backoff is exactly at the cap is released after its failed attempt", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A, 3) // attempt index 2: 1 s × 2^2 = the 4 s cap
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 2, inFlight: false }])
      yield* advance(2_000)
      expect(callTimes(world, A)).toEqual([2_000])
      // released (rediscovered by a later round, oldest failure first)
      expect(yield* s.tracked).toEqual([])
    }).pipe(
      Effect.provide(deps(world, { RETRY_SCHEDULER_BASE_MS: "1000", RETRY_SCHEDULER_MAX_MS: "4000" })),
      Effect.withRandom(halfJitter)
    )
  })

  it.scoped("an owner tracked for a request keeps its backoff: a round does not wake it again", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      yield* scheduler(world)
      // requested, and every scan refused (too many scans elsewhere): the request stays
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(A, "busy")
      yield* advance(60_000)
      // attempts at +2.5, +5, +10, +20, +40 s; the round at 120 s lists requests again
      yield* advance(80_000)
      expect(callTimes(world, A)).toEqual([62_500, 67_500, 77_500, 97_500, 137_500])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("requested owners beyond their budget are not tracked, beside a failed owner tracked in flight", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    const C = plc(3)
    return Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      world.behaviour.set(A, gate)
      fail(world, A)
      const s = yield* scheduler(world, { trackedMax: 1 })
      world.owners.set(B, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.owners.set(C, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      yield* advance(60_000)
      expect((yield* s.tracked).map((t) => t.did)).toEqual([A, B])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a request for an owner tracked as failed wakes it also when the requests' own budget is full", () => {
    const world = newWorld()
    const A = plc(1)
    const R = plc(2)
    return Effect.gen(function*() {
      fail(world, A, 10) // tracked from attempt 9: its next attempt far away
      // R's scans are refused every time: it holds the requests' budget (1)
      world.owners.set(R, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(R, "busy")
      const s = yield* scheduler(world, { trackedMax: 1 })
      expect((yield* s.tracked).map((t) => t.did).sort()).toEqual([A, R].sort())
      world.behaviour.set(A, "succeed")
      const a = world.owners.get(A)
      if (a !== undefined) a.requested = true
      yield* advance(60_000)
      expect(callTimes(world, A)).toEqual([60_000])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a request for an owner tracked as failed wakes it also when older requests wait beyond the full requests' budget", () => {
    const world = newWorld()
    const Q = plc(1)
    const A = plc(2)
    const R = plc(3)
    return Effect.gen(function*() {
      world.owners.set(Q, { status: "complete", failureCount: 0, failedSeq: 0, requested: false })
      fail(world, A, 10) // tracked from attempt 9: its next attempt far away
      // R's scans are refused every time: it holds the requests' budget (1)
      world.owners.set(R, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(R, "busy")
      world.behaviour.set(Q, "busy")
      const s = yield* scheduler(world, { trackedMax: 1 })
      expect((yield* s.tracked).map((t) => t.did).sort()).toEqual([A, R].sort())
      // Q's request is older than A's (listed first) and the full budget cannot take it: it must
      // not take the place of A's in the round's reading
      const q = world.owners.get(Q)
      if (q !== undefined) q.requested = true
      world.behaviour.set(A, "succeed")
      const a = world.owners.get(A)
      if (a !== undefined) a.requested = true
      yield* advance(60_000)
      expect(callTimes(world, A)).toEqual([60_000])
      expect(callTimes(world, Q)).toEqual([])
      // A done, its slot is not the requests': Q still waits for R's
      expect((yield* s.tracked).map((t) => t.did)).toEqual([R])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("each round swaps owners completed elsewhere into memory, unless a new scan has begun since", () => {
    const world = newWorld()
    const complete = (did: string) => {
      world.owners.set(did, { status: "complete", failureCount: 0, failedSeq: world.seq++ })
      world.completed.push(did)
    }
    return Effect.gen(function*() {
      yield* scheduler(world)
      complete(plc(7))
      complete(plc(8))
      yield* advance(60_000)
      expect(world.swapped).toEqual([plc(7), plc(8)])
      complete(plc(9))
      // plc(10) completed, then a new scan of it began before the sync read it: its pages stay in
      // the database until that scan completes (SPEC §5.3)
      complete(plc(10))
      world.owners.set(plc(10), { status: "scanning", failureCount: 0, failedSeq: world.seq++ })
      yield* advance(60_000)
      expect(world.swapped).toEqual([plc(7), plc(8), plc(9)])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("the swap sync reads completed owners in batches: more than one batch are all swapped in one round", () => {
    const world = newWorld()
    const dids = Array.from({ length: 300 }, (_, i) => plc(1_000 + i))
    return Effect.gen(function*() {
      yield* scheduler(world)
      for (const did of dids) {
        world.owners.set(did, { status: "complete", failureCount: 0, failedSeq: world.seq++ })
        world.completed.push(did)
      }
      yield* advance(60_000)
      expect(world.swapped).toEqual(dids)
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("the swap sync takes at most swapSyncMax owners a round; the rest in the next round", () => {
    const world = newWorld()
    const dids = Array.from({ length: 300 }, (_, i) => plc(1_000 + i))
    return Effect.gen(function*() {
      yield* scheduler(world, { swapSyncMax: 256 })
      for (const did of dids) {
        world.owners.set(did, { status: "complete", failureCount: 0, failedSeq: world.seq++ })
        world.completed.push(did)
      }
      yield* advance(60_000)
      expect(world.swapped).toEqual(dids.slice(0, 256))
      yield* advance(60_000)
      expect(world.swapped).toEqual(dids)
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("the swap sync starts 10 min before its first round (completions around startup), then follows its cursor", () => {
    const world = newWorld()
    const margins: Array<number> = []
    const layer = Layer.mergeAll(
      Layer.succeed(ReconcileStore, {
        ...fakeStore(world),
        completedCursor: (marginMs: number) => Effect.sync(() => margins.push(marginMs)).pipe(Effect.as("0"))
      }),
      fakeReconciler(world),
      Config.layerValue(testConfig())
    )
    return Effect.gen(function*() {
      yield* scheduler(world)
      yield* advance(60_000)
      expect(margins).toEqual([600_000])
    }).pipe(Effect.provide(layer), Effect.withRandom(halfJitter))
  })
})
