/**
 * Backfill's promised bounds (SPEC §5.2) on the TestClock, with the pass state in memory: owners of
 * a page are reconciled at most `BACKFILL_CONCURRENCY` at a time, and after the initial sweep a new
 * sweep runs every 24 h (the default `repassInterval`), not before; an owner refused for capacity
 * is tried 10 more times 1 s apart by default, then marked failed (`busy`) for the RetryScheduler;
 * a capped pass is continued by the next within the sweep; `start` is idempotent.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Fiber, Layer, Option, TestClock } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import {
  INITIAL_PASS,
  ReconcileStore,
  type ReconcileStoreShape
} from "../../src/services/reconciliation/ReconcileStore.js"
import { fakeReconcileStore, memoryPassState } from "../support/fakeReconcileStore.js"
import { halfJitter } from "../support/halfJitter.js"
import { COMPLETE } from "../support/reconcile.js"
import { plc, testConfig } from "../support/stack.js"

const OWNERS = Array.from({ length: 6 }, (_, i) => plc(1 + i)).sort()

interface Recon {
  readonly calls: Array<string>
  inFlight: number
  maxInFlight: number
  /** when set, each reconciliation waits for it */
  gate: Deferred.Deferred<void> | undefined
  /** owners refused for capacity (`busy`), and the TestClock time of each call */
  readonly busy: Set<string>
  readonly busyCalls: Array<number>
  /** `markFailedIdle` calls: did and kind */
  readonly idleMarks: Array<readonly [string, string]>
}

const newRecon = (): Recon => ({
  calls: [],
  inFlight: 0,
  maxInFlight: 0,
  gate: undefined,
  busy: new Set(),
  busyCalls: [],
  idleMarks: []
})

/** Backfill.make's environment: a fake reconciler, the pass state in memory, a transport never used. */
const env = (
  recon: Recon,
  vars: Record<string, string> = {},
  wrap: (store: ReconcileStoreShape) => ReconcileStoreShape = (store) => store
) =>
  Layer.mergeAll(
    Layer.succeed(Reconciler, {
      reconcile: (did) =>
        Effect.gen(function*() {
          recon.calls.push(did)
          recon.inFlight++
          recon.maxInFlight = Math.max(recon.maxInFlight, recon.inFlight)
          if (recon.gate !== undefined) yield* Deferred.await(recon.gate)
          if (recon.busy.has(did)) {
            recon.busyCalls.push(yield* Clock.currentTimeMillis)
            return { _tag: "busy" } as const
          }
          return COMPLETE
        }).pipe(Effect.ensuring(Effect.sync(() => void recon.inFlight--))),
      stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
    }),
    Layer.succeed(
      ReconcileStore,
      wrap(fakeReconcileStore({
        ...memoryPassState(),
        addOwners: () => Effect.void,
        markFailedIdle: (did, kind) => Effect.sync(() => recon.idleMarks.push([did, kind]) > 0),
        ownersPage: (after, limit) =>
          Effect.succeed(OWNERS.filter((did) => after === undefined || did > after).slice(0, limit))
      }))
    ),
    Layer.succeed(SafeHttp, { request: () => Effect.die("no request expected") }),
    Config.layerValue(testConfig(vars))
  )

/** Let the forked sweep run as far as it can without the clock moving. */
const settle = Effect.gen(function*() {
  for (let i = 0; i < 200; i++) yield* Effect.yieldNow()
})

describe("Backfill bounds (SPEC §5.2)", () => {
  for (const concurrency of [1, 2, 4]) {
    it.scoped(`BACKFILL_CONCURRENCY=${concurrency}: at most ${concurrency} owner(s) of a page reconciled at once`, () => {
      const recon = newRecon()
      return Effect.gen(function*() {
        recon.gate = yield* Deferred.make<void>()
        const b = yield* Backfill.make({ repassInterval: null })
        yield* b.start
        yield* settle
        expect(recon.inFlight).toBe(concurrency)
        yield* Deferred.succeed(recon.gate, undefined)
        yield* b.awaitInitialPass
        expect(recon.calls).toEqual(OWNERS)
        expect(recon.maxInFlight).toBe(concurrency)
      }).pipe(Effect.provide(env(recon, { BACKFILL_CONCURRENCY: String(concurrency) })))
    })
  }

  it.scoped("after the initial sweep, the next sweep starts 24 h later by default, not before", () => {
    const recon = newRecon()
    return Effect.gen(function*() {
      const b = yield* Backfill.make()
      yield* b.start
      yield* b.awaitInitialPass
      expect(recon.calls).toEqual(OWNERS)
      yield* TestClock.adjust("23 hours")
      yield* settle
      expect(recon.calls).toHaveLength(OWNERS.length)
      yield* TestClock.adjust("59 minutes")
      yield* TestClock.adjust("59 seconds")
      yield* settle
      expect(recon.calls).toHaveLength(OWNERS.length)
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(recon.calls).toEqual([...OWNERS, ...OWNERS])
      expect((yield* b.stats).passes).toBe(2)
      // and again 24 h after the second sweep finished
      yield* TestClock.adjust("24 hours")
      yield* settle
      expect(recon.calls).toHaveLength(3 * OWNERS.length)
    }).pipe(Effect.provide(env(recon)))
  })

  it.scoped("an owner refused for capacity is retried 10 times 1 s apart by default, then marked failed (busy)", () => {
    const recon = newRecon()
    const busy = OWNERS[0] ?? ""
    recon.busy.add(busy)
    return Effect.gen(function*() {
      const b = yield* Backfill.make({ repassInterval: null })
      yield* b.start
      for (let i = 0; i < 12; i++) {
        yield* settle
        yield* TestClock.adjust("1 second")
      }
      yield* b.awaitInitialPass
      expect(recon.busyCalls).toEqual(Array.from({ length: 11 }, (_, i) => i * 1_000))
      expect(recon.idleMarks).toEqual([[busy, "busy"]])
      expect(yield* b.stats).toMatchObject({ ownersDone: OWNERS.length, ownersFailed: 1 })
    }).pipe(Effect.provide(env(recon)))
  })

  it.scoped("a capped pass is continued by the next: the initial sweep is done only once every owner was visited", () => {
    const recon = newRecon()
    return Effect.gen(function*() {
      const b = yield* Backfill.make({ repassInterval: null, pageSize: 2, maxOwnersPerPass: 2 })
      yield* b.start
      yield* b.awaitInitialPass
      expect(recon.calls).toEqual(OWNERS)
      // three capped passes of 2 owners, then one that finds no owner left and completes the sweep
      expect(yield* b.stats).toMatchObject({ initialPassDone: true, passes: 4, ownersDone: OWNERS.length })
    }).pipe(Effect.provide(env(recon)))
  })

  it.scoped("start is idempotent: a second start runs no second sweep", () => {
    const recon = newRecon()
    return Effect.gen(function*() {
      const b = yield* Backfill.make({ repassInterval: null })
      yield* b.start
      yield* b.start
      yield* b.awaitInitialPass
      // a second sweeper would be waiting for the claimed page (its poll interval, 5 s)
      yield* TestClock.adjust("10 seconds")
      yield* settle
      expect(recon.calls).toEqual(OWNERS)
      expect((yield* b.stats).passes).toBe(1)
    }).pipe(Effect.provide(env(recon)))
  })

  it.scoped("a pass handles at most maxOwnersPerPass owners: its last page is cut to the owners left", () => {
    const recon = newRecon()
    return Effect.gen(function*() {
      const b = yield* Backfill.make({ repassInterval: null, pageSize: 4, maxOwnersPerPass: 5 })
      expect(yield* b.runPass).toEqual({ owners: 5, failed: 0, completed: false })
      expect(recon.calls).toEqual(OWNERS.slice(0, 5))
      expect(yield* b.runPass).toEqual({ owners: 1, failed: 0, completed: true })
      expect(recon.calls).toEqual(OWNERS)
    }).pipe(Effect.provide(env(recon)))
  })

  it.scoped("the infrastructure retry backoff starts over after a pass that succeeded (1 s, not where it left off)", () => {
    const recon = newRecon()
    const down = { value: true, finishOnce: false }
    const third = OWNERS[2] ?? ""
    const thirdAt: Array<number> = []
    const unavailable = new StoreError({ op: "test", code: "57P01" })
    const wrap = (store: ReconcileStoreShape): ReconcileStoreShape => ({
      ...store,
      passState: (pass) => (down.value ? Effect.fail(unavailable) : store.passState(pass)),
      finishPage: (ref, last, holder) =>
        down.finishOnce
          ? Effect.sync(() => void (down.finishOnce = false)).pipe(Effect.zipRight(Effect.fail(unavailable)))
          : store.finishPage(ref, last, holder),
      ownersPage: (after, limit) =>
        Effect.tap(
          store.ownersPage(after, limit),
          (dids) =>
            Effect.flatMap(Clock.currentTimeMillis, (now) =>
              Effect.sync(() => {
                // the second pass's page: the database fails as it is finished
                if (dids[0] === third) {
                  thirdAt.push(now)
                  if (thirdAt.length === 1) down.finishOnce = true
                }
              }))
        )
    })
    return Effect.gen(function*() {
      const b = yield* Backfill.make({ repassInterval: null, pageSize: 2, maxOwnersPerPass: 2 })
      yield* b.start
      // down: passes fail at 0, 0.75 s, 2.25 s (equal jitter × 0.75 of 1 s, 2 s, 4 s …)
      for (let t = 0; t < 5_000; t += 250) yield* Effect.zipRight(settle, TestClock.adjust("250 millis"))
      expect(recon.calls).toEqual([])
      down.value = false
      // at 5.25 s a pass succeeds (2 owners); the next one fails finishing its page
      for (let t = 5_000; t < 5_500; t += 250) yield* Effect.zipRight(settle, TestClock.adjust("250 millis"))
      yield* settle
      expect(thirdAt).toEqual([5_250])
      expect((yield* b.stats).infrastructureHealthy).toBe(false)
      // retried 0.75 s later (the backoff starts over), and its page taken over at once
      for (let t = 5_500; t < 6_500; t += 250) yield* Effect.zipRight(settle, TestClock.adjust("250 millis"))
      expect(recon.calls.filter((did) => did === third)).toHaveLength(2)
      yield* b.awaitInitialPass
      expect(yield* Clock.currentTimeMillis).toBe(6_500)
      expect(yield* b.stats).toMatchObject({ infrastructureHealthy: true, initialPassDone: true })
    }).pipe(Effect.provide(env(recon, {}, wrap)), Effect.withRandom(halfJitter))
  })

  it.scoped("an interrupted pass tries to give its page back for at most 2 s (a database that hangs does not hold shutdown)", () => {
    const recon = newRecon()
    const released: Array<string> = []
    const wrap = (store: ReconcileStoreShape): ReconcileStoreShape => ({
      ...store,
      releaseClaim: (_ref, last) => Effect.sync(() => void released.push(last)).pipe(Effect.zipRight(Effect.never))
    })
    return Effect.gen(function*() {
      recon.gate = yield* Deferred.make<void>()
      const b = yield* Backfill.make({ repassInterval: null })
      const pass = yield* Effect.fork(b.runPass)
      yield* settle
      expect(recon.inFlight).toBeGreaterThan(0)
      const interrupting = yield* Effect.fork(Fiber.interrupt(pass))
      yield* settle
      expect(released).toEqual([OWNERS[OWNERS.length - 1]])
      yield* TestClock.adjust("1999 millis")
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(interrupting))).toBe(true)
      yield* TestClock.adjust("1 millis")
      yield* settle
      expect(Option.isSome(yield* Fiber.poll(interrupting))).toBe(true)
    }).pipe(Effect.provide(env(recon, {}, wrap)))
  })

  it.scoped("a pass with no owner left waits (poll interval) for a page another pass holds instead of trying to complete the sweep", () => {
    const recon = newRecon()
    let completes = 0
    const wrap = (store: ReconcileStoreShape): ReconcileStoreShape => ({
      ...store,
      completePass: (ref, frontier) =>
        Effect.sync(() => void completes++).pipe(Effect.zipRight(store.completePass(ref, frontier)))
    })
    return Effect.gen(function*() {
      recon.gate = yield* Deferred.make<void>()
      const holder = yield* Backfill.make({ repassInterval: null })
      const waiter = yield* Backfill.make({ repassInterval: null })
      const first = yield* Effect.fork(holder.runPass)
      yield* settle
      expect(recon.inFlight).toBeGreaterThan(0)
      const second = yield* Effect.fork(waiter.runPass)
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(second))).toBe(true)
      expect(completes).toBe(0)
      yield* Deferred.succeed(recon.gate, undefined)
      expect(yield* Fiber.join(first)).toEqual({ owners: OWNERS.length, failed: 0, completed: true })
      yield* TestClock.adjust("5 seconds")
      expect(yield* Fiber.join(second)).toEqual({ owners: 0, failed: 0, completed: true })
      expect(completes).toBe(1)
      expect(recon.calls).toEqual(OWNERS)
    }).pipe(Effect.provide(env(recon, {}, wrap)))
  })

  it.scoped("a beat the database did not take does not stop the heartbeat: the holder beats again every 5 s", () => {
    const recon = newRecon()
    const beats: Array<number> = []
    const wrap = (store: ReconcileStoreShape): ReconcileStoreShape => ({
      ...store,
      beatClaim: (ref, last, holder) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          beats.push(now)
          return beats.length === 1
            ? Effect.fail(new StoreError({ op: "test", code: "57P01" }))
            : store.beatClaim(ref, last, holder)
        })
    })
    return Effect.gen(function*() {
      recon.gate = yield* Deferred.make<void>()
      const b = yield* Backfill.make({ repassInterval: null })
      const pass = yield* Effect.fork(b.runPass)
      yield* settle
      for (let i = 0; i < 4; i++) yield* Effect.zipRight(TestClock.adjust("5 seconds"), settle)
      expect(beats).toEqual([5_000, 10_000, 15_000, 20_000])
      yield* Deferred.succeed(recon.gate, undefined)
      expect(yield* Fiber.join(pass)).toMatchObject({ owners: OWNERS.length, completed: true })
    }).pipe(Effect.provide(env(recon, {}, wrap)))
  })

  it.scoped("a page whose holder stopped beating is taken over 30 s after this replica last saw its beat move (default)", () => {
    const recon = newRecon()
    return Effect.gen(function*() {
      const store = yield* ReconcileStore
      // a replica that died holding the sweep's only page
      const { state } = yield* store.startPass(INITIAL_PASS, 0)
      expect(yield* store.claimPage({ pass: INITIAL_PASS, sweep: state.sweep }, undefined, OWNERS, "dead-1")).toBe(true)
      const b = yield* Backfill.make({ repassInterval: null })
      const pass = yield* Effect.fork(b.runPass)
      for (let t = 0; t < 25_000; t += 5_000) yield* Effect.zipRight(settle, TestClock.adjust("5 seconds"))
      yield* settle
      expect(recon.calls).toEqual([])
      yield* TestClock.adjust("5 seconds")
      expect(yield* Fiber.join(pass)).toEqual({ owners: OWNERS.length, failed: 0, completed: true })
      expect(recon.calls).toEqual(OWNERS)
      expect(yield* Clock.currentTimeMillis).toBe(30_000)
    }).pipe(Effect.provide(env(recon)))
  })
})

describe("a page holder whose beats fail (SPEC §6.4)", () => {
  it.scoped("stops scanning at abandonedAfter − heartbeat from its last beat taken, not a heartbeat later", () => {
    const failing = { value: false }
    const interruptedAt: Array<number> = []
    const layer = Layer.mergeAll(
      Layer.succeed(Reconciler, {
        reconcile: () =>
          Effect.never.pipe(
            Effect.onInterrupt(() =>
              Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => interruptedAt.push(t)))
            )
          ),
        stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
      }),
      Layer.succeed(
        ReconcileStore,
        (() => {
          const pass = memoryPassState()
          return fakeReconcileStore({
            ...pass,
            addOwners: () => Effect.void,
            ownersPage: (after, limit) =>
              Effect.succeed(OWNERS.filter((did) => after === undefined || did > after).slice(0, limit)),
            // a beat that fails at once (a refused connection), as soon as the database is away
            beatClaim: (ref, last, holder) =>
              failing.value
                ? Effect.fail(new StoreError({ op: "test", code: "ECONNREFUSED" }))
                : pass.beatClaim(ref, last, holder)
          })
        })()
      ),
      Layer.succeed(SafeHttp, { request: () => Effect.die("no request expected") }),
      Config.layerValue(testConfig())
    )
    return Effect.gen(function*() {
      // beats every 100 ms; another replica takes a page over 310 ms after its last beat, so the
      // holder stops 210 ms after the last beat the database took
      const b = yield* Backfill.make({
        repassInterval: null,
        claimHeartbeat: "100 millis",
        claimAbandonedAfter: "310 millis",
        claimPollInterval: "100 millis"
      })
      const pass = yield* Effect.fork(b.runPass)
      for (let t = 10; t <= 600 && interruptedAt.length === 0; t += 10) {
        yield* TestClock.adjust("10 millis")
        yield* settle
        // the beat at 100 ms is taken; those from 200 ms on fail at once
        if (t === 150) failing.value = true
      }
      expect(interruptedAt.length).toBeGreaterThan(0)
      // before: the beat at 300 ms failed with 10 ms left, the next one came at 400 ms
      expect(interruptedAt[0]).toBeLessThanOrEqual(100 + 210)
      expect(interruptedAt[0]).toBeGreaterThanOrEqual(100 + 200)
      yield* Fiber.interrupt(pass)
    }).pipe(Effect.provide(layer))
  })
})
