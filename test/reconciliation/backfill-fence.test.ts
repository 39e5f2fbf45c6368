/**
 * Backfill passes of two replicas on one PostgreSQL (SPEC §6.4): the shared continuation only moves
 * forward, a replica claims a page before scanning it so two replicas never scan the same page at
 * once, a page claimed by a replica that died is rescanned by another within the bound, and a
 * replica still in an old sweep cannot write into a newer one (issue 14 item 12).
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Clock, Deferred, Duration, Effect, Fiber, Layer, Option, TestClock, TestContext } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import {
  INITIAL_PASS,
  ReconcileStore,
  type ReconcileStoreShape
} from "../../src/services/reconciliation/ReconcileStore.js"
import * as ReconcileStoreMod from "../../src/services/reconciliation/ReconcileStore.js"
import * as Db from "../support/db.js"
import { COMPLETE, downableStore, liveClockStore, waitFor, wrapStore } from "../support/reconcile.js"
import { plc, testConfig } from "../support/stack.js"

interface Recon {
  readonly calls: Array<string>
  hook: (did: string) => Effect.Effect<void>
}

const newRecon = (): Recon => ({ calls: [], hook: () => Effect.void })

/** One replica's Backfill environment (its own reconciler; the store is the shared database). */
const replica = (recon: Recon) =>
  Layer.mergeAll(
    Layer.succeed(Reconciler, {
      reconcile: (did) =>
        Effect.gen(function*() {
          recon.calls.push(did)
          yield* recon.hook(did)
          return COMPLETE
        }),
      stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
    }),
    SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }),
    Config.layerValue(testConfig({ WEBHOOK_ALLOW_INSECURE_DEV: "1" }))
  )

/** A replica with its own view of the shared store (a wrapper: live clock, failures, pauses). */
const replicaWith = (recon: Recon, store: ReconcileStoreShape) =>
  Layer.merge(replica(recon), Layer.succeed(ReconcileStore, store))

const options = (maxOwnersPerPass: number): Backfill.BackfillOptions => ({
  repassInterval: null,
  infraRetryBase: "10 millis",
  infraRetryMax: "50 millis",
  busyRetries: 0,
  pageSize: 10,
  maxOwnersPerPass
})

const passState = Effect.flatMap(ReconcileStore, (s) => s.passState(INITIAL_PASS))

describe("Backfill passes of two replicas", () => {
  layer(ReconcileStoreMod.layerSql.pipe(Layer.provideMerge(Db.layer())), {
    timeout: "60 seconds",
    excludeTestServices: true
  })("on PostgreSQL", (it) => {
    it.scoped(
      "a pass overtaken by another replica never moves the continuation backwards and does not rescan its owners",
      () => {
        const a = newRecon()
        const b = newRecon()
        const owners = Array.from({ length: 60 }, (_, i) => plc(500 + i)).sort()
        return Effect.gen(function*() {
          const store = yield* ReconcileStore
          yield* store.addOwners(owners, "operator")
          const gate = yield* Deferred.make<void>()
          a.hook = (did) => (did === owners[0] ? Deferred.await(gate) : Effect.void)
          const replicaA = yield* Backfill.make(options(20)).pipe(Effect.provide(replica(a)))
          const replicaB = yield* Backfill.make(options(30)).pipe(Effect.provide(replica(b)))
          // replica A starts the sweep and is slow on its first page
          const fiberA = yield* Effect.fork(replicaA.runPass)
          yield* waitFor(() => a.calls.includes(owners[0] ?? ""))
          // replica B meanwhile scans three pages (a capped pass): not A's page, which A claimed
          expect(yield* replicaB.runPass).toEqual({ owners: 30, failed: 0, completed: false })
          expect(b.calls).toEqual(owners.slice(10, 40))
          // the frontier is B's last page; done through nothing yet (A's first page is not finished)
          expect(yield* passState).toMatchObject({ continuation: undefined, frontier: owners[39], ownersDone: 30 })
          // A finishes its first page: the frontier stays where B left it
          yield* Deferred.succeed(gate, undefined)
          const resultA = yield* Fiber.join(fiberA)
          expect(resultA).toEqual({ owners: 20, failed: 0, completed: false })
          // A went on from the frontier, not over the owners B had scanned
          expect(a.calls).toEqual([...owners.slice(0, 10), ...owners.slice(40, 50)])
          expect(yield* passState).toMatchObject({ continuation: owners[49], ownersDone: 50, completedAt: undefined })
          // the sweep still finishes, and a finished sweep starts over from the beginning
          expect(yield* replicaB.runPass).toEqual({ owners: 10, failed: 0, completed: true })
          expect(b.calls.slice(30)).toEqual(owners.slice(50))
          const done = yield* passState
          expect(done).toMatchObject({ continuation: undefined, ownersDone: 60 })
          expect(done?.completedAt).toBeInstanceOf(Date)
          a.calls.length = 0
          expect(yield* replicaA.runPass).toEqual({ owners: 20, failed: 0, completed: false })
          expect(a.calls).toEqual(owners.slice(0, 20))
          expect(yield* passState).toMatchObject({ continuation: owners[19], ownersDone: 20, completedAt: undefined })
        })
      },
      60_000
    )
  })
})

// ---------------------------------------------------------------------------------------------
// Page claims (SPEC §6.4): each test on its own database

const onDatabase = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  Effect.provide(eff, ReconcileStoreMod.layerSql.pipe(Layer.provideMerge(Db.layer())))

/** The claim timings of the TestClock tests: a beat every second, abandoned after 5 s, a poll every second. */
const HEARTBEAT_MS = 1_000
const ABANDONED_MS = 5_000
const POLL_MS = 1_000

const claimOptions = (maxOwnersPerPass: number, heartbeatMs = HEARTBEAT_MS): Backfill.BackfillOptions => ({
  ...options(maxOwnersPerPass),
  claimHeartbeat: Duration.millis(heartbeatMs),
  claimAbandonedAfter: Duration.millis(ABANDONED_MS),
  claimPollInterval: Duration.millis(POLL_MS)
})

const live = Clock.make()

/** Poll on the live clock (bounded) until `cond` holds: the replicas' I/O is real, their clock is not. */
const eventually = (cond: Effect.Effect<boolean>) =>
  Effect.gen(function*() {
    for (let i = 0; i < 2_000; i++) {
      if (yield* cond) return
      yield* Effect.withClock(Effect.sleep("5 millis"), live)
    }
    return yield* Effect.dieMessage("condition not reached in time")
  })

const ended = (fiber: Fiber.Fiber<unknown, unknown>) => Effect.map(Fiber.poll(fiber), Option.isSome)

/**
 * A replica's view of the store that counts each operation's completed calls (its progress seen
 * from outside) and the TestClock time of the first call of each.
 */
const observed = (store: ReconcileStoreShape) => {
  const done = new Map<string, number>()
  const firstAt = new Map<string, number>()
  const wrapped = wrapStore(store, (op, eff) =>
    Clock.currentTimeMillis.pipe(
      Effect.tap((t) => Effect.sync(() => void (firstAt.has(op) || firstAt.set(op, t)))),
      Effect.zipRight(eff),
      Effect.tap(() => Effect.sync(() => void done.set(op, (done.get(op) ?? 0) + 1)))
    ))
  return { store: wrapped, count: (op: string) => done.get(op) ?? 0, firstAt: (op: string) => firstAt.get(op) }
}

/**
 * Advance the TestClock by `ms` and wait until every counter in `woke` has moved (each replica
 * asleep on the clock woke and did its store call; it is asleep again right after) or `fiber`
 * ended.
 */
const step = (ms: number, woke: ReadonlyArray<() => number>, fiber: Fiber.Fiber<unknown, unknown>) =>
  Effect.gen(function*() {
    const before = woke.map((n) => n())
    yield* TestClock.adjust(Duration.millis(ms))
    yield* eventually(
      Effect.map(ended(fiber), (end) => end || woke.every((n, i) => n() > (before[i] ?? 0)))
    )
  })

const scanCounts = (calls: ReadonlyArray<string>) => {
  const counts = new Map<string, number>()
  for (const did of calls) counts.set(did, (counts.get(did) ?? 0) + 1)
  return counts
}

describe("Backfill page claims of two replicas (SPEC §6.4)", () => {
  it.scopedLive("two replicas started at the same instant scan every owner exactly once per sweep", () => {
    const a = newRecon()
    const b = newRecon()
    const owners = Array.from({ length: 60 }, (_, i) => plc(700 + i)).sort()
    return Effect.gen(function*() {
      const store = yield* ReconcileStore
      yield* store.addOwners(owners, "operator")
      const opts: Backfill.BackfillOptions = { ...options(1_000), pageSize: 5, claimPollInterval: "10 millis" }
      const replicaA = yield* Backfill.make(opts).pipe(Effect.provide(replica(a)))
      const replicaB = yield* Backfill.make(opts).pipe(Effect.provide(replica(b)))
      for (let sweep = 1; sweep <= 2; sweep++) {
        a.calls.length = 0
        b.calls.length = 0
        // each replica's first owner waits until both are inside a page
        const go = yield* Deferred.make<void>()
        const hold = (entered: Deferred.Deferred<void>) => {
          let first = true
          return (): Effect.Effect<void> => {
            if (!first) return Effect.void
            first = false
            return Deferred.succeed(entered, undefined).pipe(Effect.zipRight(Deferred.await(go)))
          }
        }
        const inA = yield* Deferred.make<void>()
        const inB = yield* Deferred.make<void>()
        a.hook = hold(inA)
        b.hook = hold(inB)
        const fa = yield* Effect.fork(replicaA.runPass)
        const fb = yield* Effect.fork(replicaB.runPass)
        yield* Deferred.await(inA)
        yield* Deferred.await(inB)
        // both are scanning now, not the same page
        expect(a.calls.filter((d) => b.calls.includes(d))).toEqual([])
        yield* Deferred.succeed(go, undefined)
        const ra = yield* Fiber.join(fa)
        const rb = yield* Fiber.join(fb)
        expect([ra.completed, rb.completed]).toEqual([true, true])
        expect(ra.owners + rb.owners).toBe(60)
        const counts = scanCounts([...a.calls, ...b.calls])
        expect([...counts.entries()].filter(([, n]) => n !== 1)).toEqual([])
        expect([...counts.keys()].sort()).toEqual(owners)
        const done = yield* passState
        expect(done).toMatchObject({ continuation: undefined, ownersDone: 60 })
        expect(done?.completedAt).toBeInstanceOf(Date)
      }
    }).pipe(onDatabase)
  }, 60_000)

  it.scopedLive("a replica still in an old sweep cannot complete a newer sweep", () => {
    const a = newRecon()
    const b = newRecon()
    const owners = Array.from({ length: 25 }, (_, i) => plc(800 + i)).sort()
    return Effect.gen(function*() {
      const store = yield* ReconcileStore
      yield* store.addOwners(owners, "operator")
      // A's completion of the sweep is held between its decision and the database
      const paused = yield* Deferred.make<void>()
      const resume = yield* Deferred.make<void>()
      let completions = 0
      const pausing = wrapStore(store, (op, eff) =>
        op === "completePass" && completions++ === 0
          ? Deferred.succeed(paused, undefined).pipe(Effect.zipRight(Deferred.await(resume)), Effect.zipRight(eff))
          : eff)
      const replicaA = yield* Backfill.make(options(1_000)).pipe(Effect.provide(replicaWith(a, pausing)))
      const replicaB = yield* Backfill.make(options(10)).pipe(Effect.provide(replica(b)))
      const fa = yield* Effect.fork(replicaA.runPass)
      yield* Deferred.await(paused)
      expect(a.calls).toEqual(owners)
      // meanwhile B completes that sweep and starts the next one
      expect(yield* replicaB.runPass).toMatchObject({ owners: 0, completed: true })
      expect(yield* replicaB.runPass).toEqual({ owners: 10, failed: 0, completed: false })
      expect(b.calls).toEqual(owners.slice(0, 10))
      const next = yield* passState
      expect(next).toMatchObject({ continuation: owners[9], ownersDone: 10, completedAt: undefined })
      // A's completion of the old sweep lands now: it does not complete the new one
      yield* Deferred.succeed(resume, undefined)
      expect(yield* Fiber.join(fa)).toEqual({ owners: 25, failed: 0, completed: true })
      const after = yield* passState
      expect(after).toMatchObject({ continuation: owners[9], ownersDone: 10, completedAt: undefined })
      expect(after?.startedAt).toEqual(next?.startedAt)
    }).pipe(onDatabase)
  }, 60_000)

  it.scopedLive("a replica still in an old sweep cannot move a newer sweep's continuation", () => {
    const a = newRecon()
    const b = newRecon()
    const owners = Array.from({ length: 25 }, (_, i) => plc(900 + i)).sort()
    return Effect.gen(function*() {
      const store = yield* ReconcileStore
      yield* store.addOwners(owners, "operator")
      const entered = yield* Deferred.make<void>()
      const gate = yield* Deferred.make<void>()
      a.hook = (did) =>
        did === owners[20]
          ? Deferred.succeed(entered, undefined).pipe(Effect.zipRight(Deferred.await(gate)))
          : Effect.void
      // A stalls in its third page and does not beat (a heartbeat of a day); B gives up on it fast
      const replicaA = yield* Backfill.make({ ...options(1_000), claimHeartbeat: "1 day" }).pipe(
        Effect.provide(replica(a))
      )
      const replicaB = yield* Backfill.make({
        ...options(10),
        claimAbandonedAfter: "50 millis",
        claimPollInterval: "10 millis"
      }).pipe(Effect.provide(replica(b)))
      const fa = yield* Effect.fork(replicaA.runPass)
      yield* Deferred.await(entered)
      expect(a.calls.slice(0, 20)).toEqual(owners.slice(0, 20))
      // B rescans A's page (abandoned: no beat), completes the sweep, and starts the next one
      expect(yield* replicaB.runPass).toEqual({ owners: 5, failed: 0, completed: true })
      expect(b.calls).toEqual(owners.slice(20))
      expect(yield* replicaB.runPass).toEqual({ owners: 10, failed: 0, completed: false })
      const next = yield* passState
      expect(next).toMatchObject({ continuation: owners[9], ownersDone: 10, completedAt: undefined })
      // A wakes up and finishes its page of the old sweep: the new sweep does not move
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(fa)).toEqual({ owners: 25, failed: 0, completed: true })
      const after = yield* passState
      expect(after).toMatchObject({ continuation: owners[9], ownersDone: 10, completedAt: undefined })
      expect(after?.startedAt).toEqual(next?.startedAt)
    }).pipe(onDatabase)
  }, 60_000)

  /**
   * A holds the first of three pages (its scan never ends) while B scans the other two and waits;
   * then A ends, `dies` says how. Returns the TestClock time from A's end to B's taking the page.
   */
  const holdThenEnd = (dies: boolean) => {
    const a = newRecon()
    const b = newRecon()
    const owners = Array.from({ length: 30 }, (_, i) => plc((dies ? 1_000 : 1_100) + i)).sort()
    return Effect.gen(function*() {
      const store = yield* ReconcileStore
      yield* store.addOwners(owners, "operator")
      const down = { value: false }
      const viewA = observed(downableStore(liveClockStore(store), down))
      const viewB = observed(liveClockStore(store))
      const entered = yield* Deferred.make<void>()
      a.hook = (
        did
      ) => (did === owners[0] ? Deferred.succeed(entered, undefined).pipe(Effect.zipRight(Effect.never)) : Effect.void)
      const replicaA = yield* Backfill.make(claimOptions(1_000)).pipe(Effect.provide(replicaWith(a, viewA.store)))
      const replicaB = yield* Backfill.make(claimOptions(1_000)).pipe(Effect.provide(replicaWith(b, viewB.store)))
      const fa = yield* Effect.fork(replicaA.runPass)
      yield* Deferred.await(entered)
      const fb = yield* Effect.fork(replicaB.runPass)
      // B scans the other two pages, finds no more, and waits for A's
      yield* eventually(Effect.map(ended(fb), (end) => end || viewB.count("ownersPage") >= 3))
      expect(b.calls).toEqual(owners.slice(10))
      // A's page stays A's while A is alive (it beats), however long its scan takes
      for (let i = 0; i < (3 * ABANDONED_MS) / POLL_MS; i++) {
        yield* step(POLL_MS, [() => viewA.count("beatClaim"), () => viewB.count("passState")], fb)
      }
      expect(b.calls).toEqual(owners.slice(10))
      expect(yield* ended(fb)).toBe(false)
      // A ends: killed (its connection gone first, so it cannot give the page back), or stopped
      if (dies) down.value = true
      yield* Fiber.interrupt(fa)
      const endedAt = yield* Clock.currentTimeMillis
      for (let i = 0; i < 20 && !(yield* ended(fb)); i++) yield* step(POLL_MS, [() => viewB.count("passState")], fb)
      expect(yield* Fiber.join(fb)).toEqual({ owners: 30, failed: 0, completed: true })
      expect(b.calls).toEqual([...owners.slice(10), ...owners.slice(0, 10)])
      const done = yield* passState
      expect(done).toMatchObject({ continuation: undefined, ownersDone: 30 })
      expect(done?.completedAt).toBeInstanceOf(Date)
      return (viewB.firstAt("takeClaim") ?? Number.POSITIVE_INFINITY) - endedAt
    }).pipe(Effect.provide(TestContext.TestContext), onDatabase)
  }

  it.scopedLive(
    "a replica killed while holding a page: the other rescans it within the bound",
    () =>
      Effect.gen(function*() {
        const waited = yield* holdThenEnd(true)
        // abandoned after 5 s without a beat (its last beat was at most one beat before its death),
        // seen at a poll (every second) of the waiting replica
        expect(waited).toBeGreaterThanOrEqual(ABANDONED_MS - HEARTBEAT_MS)
        expect(waited).toBeLessThanOrEqual(ABANDONED_MS + 2 * POLL_MS)
      }),
    60_000
  )

  it.scopedLive(
    "a replica stopped while holding a page gives it back: the other takes it at its next poll",
    () =>
      Effect.gen(function*() {
        const waited = yield* holdThenEnd(false)
        expect(waited).toBeLessThanOrEqual(POLL_MS)
      }),
    60_000
  )

  /**
   * A holds the only page; every owner's scan waits until interrupted (started and interrupted ones
   * recorded). `takeOver` ends A's hold on the page once A is inside it: every scan A had started
   * is interrupted (on the old code they ran on). `then` runs next, while the database is still
   * there (A's pass fails once it is gone); A is stopped after it.
   */
  const stopsScanning = (
    options: Backfill.BackfillOptions,
    view: (store: ReconcileStoreShape) => ReconcileStoreShape,
    takeOver: (store: ReconcileStoreShape) => Effect.Effect<void>,
    then: (a: Recon, started: ReadonlyArray<string>, fa: Fiber.Fiber<unknown, unknown>) => Effect.Effect<void> = () =>
      Effect.void
  ) => {
    const a = newRecon()
    const owners = Array.from({ length: 10 }, (_, i) => plc(1_200 + i)).sort()
    return Effect.gen(function*() {
      const store = yield* ReconcileStore
      yield* store.addOwners(owners, "operator")
      const interrupted: Array<string> = []
      const entered = yield* Deferred.make<void>()
      a.hook = (did) =>
        Deferred.succeed(entered, undefined).pipe(
          Effect.zipRight(Effect.never),
          Effect.onInterrupt(() => Effect.sync(() => void interrupted.push(did)))
        )
      const replicaA = yield* Backfill.make(options).pipe(Effect.provide(replicaWith(a, view(store))))
      const fa = yield* Effect.fork(replicaA.runPass)
      yield* Deferred.await(entered)
      const started = [...a.calls]
      expect(started.length).toBeGreaterThan(0)
      expect(started.length).toBeLessThan(owners.length)
      yield* takeOver(store)
      yield* eventually(Effect.sync(() => interrupted.length >= started.length))
      expect(interrupted.slice(0, started.length).sort()).toEqual([...started].sort())
      yield* then(a, started, fa)
      yield* Fiber.interrupt(fa)
    }).pipe(onDatabase)
  }

  it.scopedLive(
    "a holder whose beat finds its page taken over stops scanning it at once",
    () =>
      Effect.gen(function*() {
        // A's view of the store counts its calls: its beats and its polls of the pass
        const viewA: { current?: ReturnType<typeof observed> } = {}
        const count = (op: string) => viewA.current?.count(op) ?? 0
        let beatsBefore = 0
        yield* stopsScanning(
          { ...options(1_000), claimHeartbeat: "20 millis", claimPollInterval: "20 millis" },
          (store) => {
            viewA.current = observed(store)
            return viewA.current.store
          },
          (store) =>
            Effect.gen(function*() {
              const state = yield* store.passState(INITIAL_PASS)
              const claim = state?.claims[0]
              if (state === undefined || claim === undefined) return yield* Effect.dieMessage("no claimed page")
              const ref = { pass: INITIAL_PASS, sweep: state.sweep }
              beatsBefore = count("beatClaim")
              expect(yield* store.takeClaim(ref, claim, "another-replica")).toBe(true)
            }).pipe(Effect.orDie),
          (a, started, fa) =>
            Effect.gen(function*() {
              // at once: its first beat after the takeover (and at most one sent before it,
              // answered after it) stopped the scans
              expect(count("beatClaim") - beatsBefore).toBeGreaterThanOrEqual(1)
              expect(count("beatClaim") - beatsBefore).toBeLessThanOrEqual(2)
              // and starts no other owner of the page (it is another replica's now): A is back in
              // its pass, polling the pass state for a page to take, and has polled it twice since
              const polls = count("passState")
              yield* eventually(Effect.map(ended(fa), (end) => end || count("passState") >= polls + 2))
              expect(yield* ended(fa)).toBe(false)
              expect(a.calls).toEqual(started)
            })
        )
      }),
    60_000
  )

  it.scopedLive("a holder that cannot beat for abandonedAfter − heartbeat stops scanning its page", () => {
    const hung = { value: false }
    return Effect.gen(function*() {
      yield* stopsScanning(
        {
          ...options(1_000),
          claimHeartbeat: "20 millis",
          claimAbandonedAfter: "300 millis",
          claimPollInterval: "20 millis"
        },
        // its beats stop being answered (a database that does not answer this replica)
        (store) =>
          wrapStore(store, (op, eff) => Effect.suspend(() => (op === "beatClaim" && hung.value ? Effect.never : eff))),
        () => Effect.sync(() => void (hung.value = true))
      )
    })
  }, 60_000)
})
