/**
 * RetryScheduler (SPEC §5.4) under TestClock with a fixed Random: the backoff Schedule's exact
 * delays and cap, the first round at start, attempt timing, the tracking bound, success forgetting
 * the attempt count, owners with a reconciliation request (their own budget; kept across a refused
 * scan), the swap of owners completed elsewhere, and `stop` (in-flight attempts
 * interrupted at once; drained or not by the deadline).
 * The store and the reconciler are fakes of their Tags.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Clock, Deferred, Duration, Effect, Fiber, Layer, Random, Schedule, TestClock } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { type ReconcileOutcome, Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore, type ReconcileStoreShape } from "../../src/services/reconciliation/ReconcileStore.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import type { ReconcileStatus } from "../../src/services/registry/RegistryStore.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { halfJitter } from "../support/halfJitter.js"
import { COMPLETE } from "../support/reconcile.js"
import { settle } from "../support/settle.js"
import { plc, testConfig } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// Fakes

interface FakeOwner {
  status: ReconcileStatus
  failureCount: number
  /** order of the last failure (oldest first) */
  failedSeq: number
  /** a reconciliation request is pending (an account's reactivation); a begun scan clears it */
  requested?: boolean
}

/**
 * `hang`: the PDS read never answers; `hangSlowMark`: the same, and the interrupted scan's failure
 * mark takes 10 s (a slow database); a Deferred: answers (success) when it is completed.
 */
type Behaviour = "fail" | "succeed" | "busy" | "superseded" | "hang" | "hangSlowMark" | Deferred.Deferred<void>

interface World {
  readonly owners: Map<string, FakeOwner>
  readonly calls: Array<{ readonly did: string; readonly at: number }>
  readonly behaviour: Map<string, Behaviour>
  readonly interrupted: Array<string>
  readonly completed: Array<string>
  readonly swapped: Array<string>
  seq: number
  active: number
  maxActive: number
}

const newWorld = (): World => ({
  owners: new Map(),
  calls: [],
  behaviour: new Map(),
  interrupted: [],
  completed: [],
  swapped: [],
  seq: 0,
  active: 0,
  maxActive: 0
})

const fail = (world: World, did: string, failureCount = 1) =>
  world.owners.set(did, { status: "failed", failureCount, failedSeq: world.seq++ })

const fakeStore = (world: World): ReconcileStoreShape =>
  fakeReconcileStore({
    ownerState: (did) =>
      Effect.sync(() => {
        const o = world.owners.get(did)
        return o === undefined
          ? undefined
          : {
            did,
            generation: 1,
            status: o.status,
            scanGeneration: 1,
            snapshotRev: undefined,
            failureCount: o.failureCount,
            lastFailureKind: undefined,
            scanStartedAt: undefined,
            completedAt: undefined,
            failedAt: undefined,
            reconcileRequested: o.requested === true
          }
      }),
    retryCandidates: (options) =>
      Effect.sync(() =>
        [...world.owners]
          .filter(([did, o]) => o.status === "failed" && !options.exclude.includes(did))
          .sort(([, a], [, b]) => a.failedSeq - b.failedSeq)
          .slice(0, options.limit)
          .map(([did, o]) => ({ did, status: "failed" as const, failureCount: o.failureCount }))
      ),
    reconcileRequests: (options) =>
      Effect.sync(() =>
        [...world.owners]
          .filter(([did, o]) => o.requested === true && !options.exclude.includes(did))
          .slice(0, options.limit)
          .map(([did]) => did)
      ),
    completedSince: (cursor, limit) =>
      Effect.sync(() => {
        const from = Number(cursor)
        const dids = world.completed.slice(from, from + limit)
        return { dids, cursor: String(from + dids.length) }
      })
  })

const fakeReconciler = (world: World) =>
  Layer.succeed(Reconciler, {
    reconcile: (did) =>
      Effect.gen(function*() {
        world.calls.push({ did, at: yield* Clock.currentTimeMillis })
        world.active++
        world.maxActive = Math.max(world.maxActive, world.active)
        yield* Effect.yieldNow()
        const b = world.behaviour.get(did) ?? "fail"
        // refused: not begun, the request stays
        if (b === "busy") return { _tag: "busy" } as ReconcileOutcome
        // fenced off by a newer scan of the owner (begun elsewhere)
        if (b === "superseded") return { _tag: "superseded" } as ReconcileOutcome
        const begun = world.owners.get(did)
        if (begun !== undefined) begun.requested = false
        if (b === "hang") yield* Effect.never
        if (b === "hangSlowMark") yield* Effect.never.pipe(Effect.onInterrupt(() => Effect.sleep("10 seconds")))
        if (typeof b === "object") yield* Deferred.await(b)
        const owner = world.owners.get(did)
        if (b === "succeed" || typeof b === "object") {
          if (owner !== undefined) owner.status = "complete"
          return COMPLETE
        }
        if (owner !== undefined) {
          owner.failureCount++
          owner.failedSeq = world.seq++
        }
        return { _tag: "failed", kind: "pds_status" } as ReconcileOutcome
      }).pipe(
        Effect.ensuring(Effect.sync(() => void world.active--)),
        Effect.onInterrupt(() => Effect.sync(() => void world.interrupted.push(did)))
      ),
    stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
  })

const deps = (world: World, env: Record<string, string> = {}) =>
  Layer.mergeAll(
    Layer.succeed(ReconcileStore, fakeStore(world)),
    fakeReconciler(world),
    Config.layerValue(testConfig(env))
  )

/**
 * The scheduler (rounds forked into the test's scope), with a swap that records; its first round
 * (at start) has run when this returns.
 */
const scheduler = (world: World, options: RetryScheduler.RetrySchedulerOptions = {}) =>
  RetryScheduler.make({ swap: (did) => Effect.sync(() => void world.swapped.push(did)), ...options }).pipe(
    Effect.tap(() => settle)
  )

/** Advance the clock by `ms` and let woken fibers run. */
const advance = (ms: number) => Effect.zipRight(TestClock.adjust(Duration.millis(ms)), settle)

const callTimes = (world: World, did: string) => world.calls.filter((c) => c.did === did).map((c) => c.at)

// ---------------------------------------------------------------------------------------------

describe("retryBackoff (the Schedule)", () => {
  const delays = (random: Random.Random, n: number) =>
    Schedule.run(
      Schedule.delays(RetryScheduler.retryBackoff({ base: "5 seconds", cap: "1 hour" })),
      0,
      Array.from({ length: n }, () => undefined)
    ).pipe(
      Effect.map((c) => Chunk.toReadonlyArray(c).map(Duration.toMillis)),
      Effect.withRandom(random)
    )

  it.effect("full jitter: random × min(cap, 5 s × 2^n), exact with a fixed Random", () =>
    Effect.gen(function*() {
      expect(yield* delays(halfJitter, 14)).toEqual([
        2_500,
        5_000,
        10_000,
        20_000,
        40_000,
        80_000,
        160_000,
        320_000,
        640_000,
        1_280_000,
        // 5 s × 2^10 = 5,120 s > the 1 h cap: 0.5 × 3,600 s
        1_800_000,
        1_800_000,
        1_800_000,
        1_800_000
      ])
      expect(yield* delays(Random.fixed([0.999]), 12)).toEqual([
        4_995,
        9_990,
        19_980,
        39_960,
        79_920,
        159_840,
        319_680,
        639_360,
        1_278_720,
        2_557_440,
        3_596_400,
        3_596_400
      ])
    }))

  it.effect("at least 100 ms", () =>
    Effect.gen(function*() {
      expect(yield* delays(Random.fixed([0]), 3)).toEqual([100, 100, 100])
      expect(yield* delays(Random.fixed([0.01]), 3)).toEqual([100, 100, 200])
    }))
})

describe("RetryScheduler", () => {
  it.scoped("the first round runs at start: an owner failed before start is retried without waiting an interval", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      // no clock adjustment: the round at start has tracked it
      expect(yield* Clock.currentTimeMillis).toBe(0)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      yield* advance(2_499)
      expect(callTimes(world, A)).toEqual([])
      yield* advance(1)
      expect(callTimes(world, A)).toEqual([2_500])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner with a reconciliation request is reconciled from attempt 0 though complete; a refused scan keeps the request and is retried; a complete owner without one is not tracked", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nothing requested yet
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.owners.set(B, { status: "complete", failureCount: 0, failedSeq: 0 })
      world.behaviour.set(A, "busy")
      yield* advance(60_000)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      yield* advance(2_500)
      expect(callTimes(world, A)).toEqual([62_500])
      // too many scans elsewhere: not begun, still requested, retried on the backoff
      expect(world.owners.get(A)?.requested).toBe(true)
      world.behaviour.set(A, "succeed")
      yield* advance(5_000)
      expect(callTimes(world, A)).toEqual([62_500, 67_500])
      expect(world.owners.get(A)?.requested).toBe(false)
      expect(yield* s.tracked).toEqual([])
      yield* advance(60_000)
      expect(yield* s.tracked).toEqual([])
      expect(callTimes(world, B)).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a request taken up by a scan begun elsewhere before the attempt is done: that scan is not superseded by a second one", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(A, "succeed")
      yield* advance(60_000)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      // before this process's attempt (at 62.5 s), another process (its scheduler, a sweep, the CLI)
      // begins a scan of A: its begin clears the request and A is scanning
      world.owners.set(A, { status: "scanning", failureCount: 0, failedSeq: 0, requested: false })
      yield* advance(2_500)
      // a begin here would bump A's generation and supersede the scan running elsewhere
      expect(callTimes(world, A)).toEqual([])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("owners with a request have their own budget: failing owners holding every slot do not hold them back", () => {
    const world = newWorld()
    const failing = [plc(10), plc(11), plc(12)]
    const R = plc(20)
    return Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      for (const did of failing) {
        world.behaviour.set(did, gate)
        fail(world, did)
      }
      world.owners.set(R, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(R, "succeed")
      const s = yield* scheduler(world, { trackedMax: 2 })
      expect((yield* s.tracked).map((t) => t.did).sort()).toEqual([R, ...failing.slice(0, 2)].sort())
    }).pipe(
      Effect.provide(deps(world, { RETRY_SCHEDULER_CONCURRENCY: "2" })),
      Effect.withRandom(halfJitter)
    )
  })

  it.scoped("a request for an owner already tracked as failed brings its next attempt to the next round, outside the requests' budget", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      // A has failed 10 times: tracked from attempt 9, its next attempt at 0.5 × min(1 h, 5 s × 2^9)
      fail(world, A, 10)
      const s = yield* scheduler(world, { trackedMax: 1 })
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 9, inFlight: false }])
      // A's account is reactivated (stamped), and so is B's; one round later
      world.behaviour.set(A, "succeed")
      world.behaviour.set(B, "succeed")
      const a = world.owners.get(A)
      if (a !== undefined) a.requested = true
      world.owners.set(B, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      yield* advance(60_000)
      // A at once (not at 1,280,000 ms), its request cleared; B tracked in the requests' budget of 1
      expect(callTimes(world, A)).toEqual([60_000])
      expect(world.owners.get(A)).toMatchObject({ status: "complete", requested: false })
      yield* advance(2_500) // B's attempt 0
      expect(callTimes(world, B)).toEqual([62_500])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("lists failed owners every interval and retries each on the exact backoff", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nobody has failed yet
      fail(world, A)
      yield* advance(59_999)
      expect(yield* s.tracked).toEqual([])
      yield* advance(1) // the next round, at 60 s
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      // attempts 0..4 at +2.5 s, +5 s, +10 s, +20 s, +40 s after the previous one
      const expected = [62_500, 67_500, 77_500, 97_500, 137_500]
      for (const [i, at] of expected.entries()) {
        const prev = i === 0 ? 60_000 : (expected[i - 1] ?? 0)
        yield* advance(at - prev - 1)
        expect(callTimes(world, A)).toHaveLength(i)
        yield* advance(1)
        expect(callTimes(world, A)).toEqual(expected.slice(0, i + 1))
      }
      expect((yield* s.tracked)[0]?.attempt).toBe(5)
      expect((yield* s.stats).attempts).toBe(5)
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner that failed often starts at its failure count; released after an attempt at the cap", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nobody has failed yet
      fail(world, A, 12) // attempt index 11: 5 s × 2^11 > 1 h
      yield* advance(70_000) // rounds every 70 s here, so no round coincides with an attempt
      expect((yield* s.tracked)[0]?.attempt).toBe(11)
      yield* advance(1_800_000 - 1)
      expect(callTimes(world, A)).toEqual([])
      yield* advance(1)
      expect(callTimes(world, A)).toEqual([1_870_000])
      // released at the cap (others may take the slot) and rediscovered by the next round
      expect(yield* s.tracked).toEqual([])
      yield* advance(20_000)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 12, inFlight: false }])
      yield* advance(1_800_000)
      expect(callTimes(world, A)).toEqual([1_870_000, 3_690_000])
    }).pipe(Effect.provide(deps(world, { RETRY_SCHEDULER_INTERVAL_MS: "70000" })), Effect.withRandom(halfJitter))
  })

  for (const concurrency of [1, 2]) {
    it.scoped(`at most 16 owners are tracked (oldest failure first); ${concurrency} attempt(s) at a time`, () => {
      const world = newWorld()
      const owners = Array.from({ length: 20 }, (_, i) => plc(100 + i))
      return Effect.gen(function*() {
        const gate = yield* Deferred.make<void>()
        for (const did of owners) world.behaviour.set(did, gate)
        const s = yield* scheduler(world) // the round at start: nobody has failed yet
        for (const did of owners) fail(world, did)
        yield* advance(60_000)
        const tracked = yield* s.tracked
        expect(tracked.map((t) => t.did)).toEqual(owners.slice(0, 16))
        expect((yield* s.stats).tracked).toBe(16)
        // all 16 are due at +2.5 s; only `concurrency` run, the others wait for a permit
        yield* advance(2_500)
        expect(world.calls).toHaveLength(concurrency)
        expect((yield* s.stats).inFlight).toBe(concurrency)
        // the next round admits nobody: all 16 slots are taken
        yield* advance(60_000 - 2_500)
        expect((yield* s.tracked).map((t) => t.did)).toEqual(owners.slice(0, 16))
        // they all succeed (one permit at a time) and are forgotten; the next round takes the rest
        yield* Deferred.succeed(gate, undefined)
        yield* settle
        expect(world.calls).toHaveLength(16)
        expect(world.maxActive).toBe(concurrency)
        expect(yield* s.tracked).toEqual([])
        yield* advance(60_000)
        expect((yield* s.tracked).map((t) => t.did)).toEqual(owners.slice(16))
      }).pipe(
        Effect.provide(deps(world, { RETRY_SCHEDULER_CONCURRENCY: String(concurrency) })),
        Effect.withRandom(halfJitter)
      )
    })
  }

  it.scoped("success forgets the owner and its attempt count; a new failure starts over", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nobody has failed yet
      fail(world, A)
      yield* advance(60_000) // tracked
      yield* advance(2_500) // attempt 0 fails
      yield* advance(5_000) // attempt 1 fails
      expect((yield* s.tracked)[0]?.attempt).toBe(2)
      world.behaviour.set(A, "succeed")
      yield* advance(10_000) // attempt 2 succeeds
      expect(callTimes(world, A)).toEqual([62_500, 67_500, 77_500])
      expect(yield* s.tracked).toEqual([])
      expect((yield* s.stats).recovered).toBe(1)
      // a slot freed: another owner can be tracked, and A failing again starts at attempt 0
      world.behaviour.set(A, "fail")
      fail(world, A)
      fail(world, B)
      yield* advance(120_000 - 77_500)
      expect(yield* s.tracked).toEqual([
        { did: A, attempt: 0, inFlight: false },
        { did: B, attempt: 0, inFlight: false }
      ])
      yield* advance(2_500)
      expect(callTimes(world, A)).toEqual([62_500, 67_500, 77_500, 122_500])
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

  it.scoped("requested owners beyond their budget are not tracked, though the listing may hold more (its limit also counts failed owners it may wake)", () => {
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
