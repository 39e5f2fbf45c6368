/**
 * Backfill (SPEC §5.2, §6.1) on a real PostgreSQL: owner discovery (stored records, the stream, the
 * relay, the operator), keyset passes with a durable continuation (a capped pass continued by the
 * next; a crash resumes at the next page), owner failures counted without stopping, the database
 * going down during a pass (health unhealthy, not ready, then recovery), and the whole path with the
 * real Reconciler against a fake PDS.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Deferred, Effect, Either, Fiber, Layer } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import { Processor } from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import { type ReconcileOutcome, Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { INITIAL_PASS, ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import * as ReconcileStoreMod from "../../src/services/reconciliation/ReconcileStore.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { didDoc, fakeServer } from "../support/fakeAtproto.js"
import { COMPLETE, downableStore, Fakes, reconcileStack, waitFor } from "../support/reconcile.js"
import { plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// Fakes

interface Recon {
  readonly calls: Array<string>
  outcome: (did: string) => ReconcileOutcome
  /** runs before answering (gates, failure injection) */
  hook: (did: string) => Effect.Effect<void>
}

const newRecon = (): Recon => ({ calls: [], outcome: () => COMPLETE, hook: () => Effect.void })

const fakeReconciler = (recon: Recon) =>
  Layer.succeed(Reconciler, {
    reconcile: (did) =>
      Effect.gen(function*() {
        recon.calls.push(did)
        yield* recon.hook(did)
        return recon.outcome(did)
      }),
    stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
  })

/** The PostgreSQL store, failing every call with a StoreError while `down.value` is true. */
const downable = (down: { value: boolean }) =>
  Layer.effect(ReconcileStore, Effect.map(ReconcileStoreMod.makeSql, (real) => downableStore(real, down)))

const FAST: Backfill.BackfillOptions = {
  repassInterval: null,
  infraRetryBase: "10 millis",
  infraRetryMax: "50 millis",
  busyRetries: 2,
  busyRetryDelay: "1 millis"
}

/** Backfill.make's environment (the store and the database come from the enclosing layer). */
const env = (recon: Recon, vars: Record<string, string> = {}) =>
  Layer.mergeAll(
    fakeReconciler(recon),
    SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }),
    Config.layerValue(testConfig({ WEBHOOK_ALLOW_INSECURE_DEV: "1", ...vars }))
  )

const store = ReconcileStore
const addOwners = (dids: ReadonlyArray<string>) => Effect.flatMap(store, (s) => s.addOwners(dids, "operator"))
const passState = Effect.flatMap(store, (s) => s.passState(INITIAL_PASS))

/** Distinct DIDs in ascending order (as the database orders them). */
const dids = (from: number, n: number) => Array.from({ length: n }, (_, i) => plc(from + i)).sort()

// ---------------------------------------------------------------------------------------------

describe("Backfill passes", () => {
  layer(Layer.mergeAll(ReconcileStoreMod.layerSql, RegistryStore.layerSql).pipe(Layer.provideMerge(Db.layer())), {
    timeout: "120 seconds",
    excludeTestServices: true
  })("on PostgreSQL", (it) => {
    it.scoped("1,001 owners with a pass cap of 1,000: the continuation is stored and the next pass finishes", () => {
      const recon = newRecon()
      const owners = dids(10_000, 1_001)
      return Effect.gen(function*() {
        yield* addOwners(owners)
        const b = yield* Backfill.make(FAST)
        const first = yield* b.runPass
        expect(first).toEqual({ owners: 1_000, failed: 0, completed: false })
        expect(recon.calls).toEqual(owners.slice(0, 1_000))
        expect(yield* passState).toMatchObject({ continuation: owners[999], ownersDone: 1_000, completedAt: undefined })
        const second = yield* b.runPass
        expect(second).toEqual({ owners: 1, failed: 0, completed: true })
        expect(recon.calls.slice(1_000)).toEqual([owners[1_000]])
        const done = yield* passState
        expect(done?.continuation).toBeUndefined()
        expect(done?.ownersDone).toBe(1_001)
        expect(done?.completedAt).toBeInstanceOf(Date)
        // a completed pass: the next one starts from the beginning
        recon.calls.length = 0
        const again = yield* b.runPass
        expect(again).toMatchObject({ owners: 1_000, completed: false })
        expect(recon.calls[0]).toBe(owners[0])
        // leave the pass finished for the next test
        yield* b.runPass
      }).pipe(Effect.provide(env(recon)))
    }, 120_000)

    it.scoped("a crash during page k+1 resumes at page k+1", () => {
      const recon = newRecon()
      return Effect.gen(function*() {
        const all = yield* Effect.flatMap(store, (s) => s.ownersPage(undefined, 2_000))
        const gate = yield* Deferred.make<void>()
        const pages = [all.slice(0, 50), all.slice(50, 100), all.slice(100, 150)]
        const crashAt = pages[2]?.[10] ?? ""
        recon.hook = (did) => (did === crashAt ? Deferred.await(gate) : Effect.void)
        const b = yield* Backfill.make(FAST)
        const fiber = yield* Effect.fork(b.runPass)
        yield* waitFor(() => recon.calls.includes(crashAt))
        // the process dies in the middle of page 3
        yield* Fiber.interrupt(fiber)
        expect(yield* passState).toMatchObject({ continuation: pages[1]?.[49], ownersDone: 100 })
        // a new process (a new Backfill on the same database) resumes at page 3
        recon.calls.length = 0
        recon.hook = () => Effect.void
        const restarted = yield* Backfill.make(FAST)
        const result = yield* restarted.runPass
        expect(recon.calls.slice(0, 50)).toEqual(pages[2])
        expect(recon.calls).not.toContain(pages[1]?.[49])
        expect(result).toEqual({ owners: 901, failed: 0, completed: true })
        expect(yield* passState).toMatchObject({ ownersDone: 1_001, continuation: undefined })
      }).pipe(Effect.provide(env(recon)))
    }, 120_000)

    it.scoped("owner failures are counted and the pass goes on; a busy owner is left to the RetryScheduler", () => {
      const recon = newRecon()
      return Effect.gen(function*() {
        // finish whatever pass is in progress, then a pass over all owners
        const b = yield* Backfill.make(FAST)
        let r = yield* b.runPass
        while (!r.completed) r = yield* b.runPass
        const all = yield* Effect.flatMap(store, (s) => s.ownersPage(undefined, 2_000))
        const failing = new Set([all[3], all[70], all[500]])
        const busy = all[7] ?? ""
        recon.calls.length = 0
        recon.outcome = (did) =>
          did === busy ? { _tag: "busy" } : failing.has(did) ? { _tag: "failed", kind: "pds_status" } : COMPLETE
        const first = yield* b.runPass
        expect(first).toEqual({ owners: 1_000, failed: 4, completed: false })
        // the busy owner was retried (busyRetries = 2), then marked failed for the RetryScheduler
        expect(recon.calls.filter((d) => d === busy)).toHaveLength(3)
        expect(yield* Effect.flatMap(store, (s) => s.ownerState(busy))).toMatchObject({
          status: "failed",
          lastFailureKind: "busy"
        })
        const stats = yield* b.stats
        expect(stats.ownersFailed).toBe(4)
        expect(stats.ownersDone).toBeGreaterThanOrEqual(1_000)
      }).pipe(Effect.provide(env(recon)))
    }, 120_000)
  })

  layer(Layer.mergeAll(ReconcileStoreMod.layerSql, RegistryStore.layerSql).pipe(Layer.provideMerge(Db.layer())), {
    timeout: "120 seconds",
    excludeTestServices: true
  })("known owners", (it) => {
    it.scoped("stored records ∪ the stream ∪ the relay's listReposByCollection (paged) ∪ the operator list", () => {
      const recon = newRecon()
      const [stored, streamed, relay1, relay2, relay3, operator, cli, unknown] = dids(20_000, 8)
      return Effect.gen(function*() {
        // a stored record (no owners row) and an owner seen on the stream
        const v = validateWhRecord(whRecordValue(`at://${plc(1)}`), { allowInsecureDev: false })
        if (Either.isLeft(v)) return yield* Effect.die("fixture")
        yield* Effect.flatMap(RegistryStore.RegistryStore, (s) =>
          Effect.zipRight(
            s.upsert(toRow(stored ?? "", "w", v.right.record, v.right.scope, rev(1), 1, undefined, true)),
            s.bumpGeneration(streamed ?? "", rev(1))
          ))
        yield* Effect.flatMap(store, (s) => s.addOwners([cli ?? ""], "operator"))
        // an owner row that came from nowhere listed (e.g. a scan) is not a known owner
        yield* Effect.flatMap(store, (s) => s.begin(unknown ?? "", { maxOtherScanning: 8, staleScanMs: 900_000 }))
        const relay = yield* fakeServer((req) => {
          if (req.path !== "/xrpc/com.atproto.sync.listReposByCollection") return { status: 404, body: "{}" }
          expect(req.query.get("collection")).toBe("place.wisp.v2.wh")
          return req.query.get("cursor") === null
            ? { status: 200, body: JSON.stringify({ repos: [{ did: relay1 }, { did: relay2 }], cursor: "next/page" }) }
            : { status: 200, body: JSON.stringify({ repos: [{ did: relay3 }, { did: "alice.test" }] }) }
        })
        const result = yield* Backfill.make(FAST).pipe(
          Effect.flatMap((b) => b.runPass),
          Effect.provide(env(recon, { OWNER_DISCOVERY_URL: relay.url, BACKFILL_OWNERS: operator ?? "" }))
        )
        expect(result.completed).toBe(true)
        expect(recon.calls).toEqual([stored, streamed, relay1, relay2, relay3, operator, cli].sort())
        expect(relay.requests.map((r) => r.query.get("cursor"))).toEqual([null, "next/page"])
        expect(relay.requests[1]?.rawQuery).toContain("cursor=next%2Fpage")
      })
    })

    it.scoped("a relay cursor that is not well-formed UTF-16 ends discovery as a failure; the pass goes on", () => {
      const recon = newRecon()
      const [first] = dids(30_000, 1)
      return Effect.gen(function*() {
        // "\ud800" in the JSON: a lone surrogate, which no URL can carry
        const relay = yield* fakeServer(() => ({
          status: 200,
          body: JSON.stringify({ repos: [{ did: first }], cursor: "p\ud800" })
        }))
        const stats = yield* Effect.gen(function*() {
          const b = yield* Backfill.make(FAST)
          const r = yield* b.runPass
          expect(r.completed).toBe(true)
          return yield* b.stats
        }).pipe(Effect.provide(env(recon, { OWNER_DISCOVERY_URL: relay.url })))
        expect(stats.discoveryFailures).toBe(1)
        expect(relay.requests).toHaveLength(1)
        // the page's owners were recorded before its cursor was refused
        expect(recon.calls).toContain(first)
      })
    })

    it.scoped("a relay that fails is counted; the pass goes on with the owners it knows", () => {
      const recon = newRecon()
      return Effect.gen(function*() {
        const relay = yield* fakeServer(() => ({ status: 503, body: "{}" }))
        const stats = yield* Effect.gen(function*() {
          const b = yield* Backfill.make(FAST)
          const r = yield* b.runPass
          expect(r.completed).toBe(true)
          return yield* b.stats
        }).pipe(Effect.provide(env(recon, { OWNER_DISCOVERY_URL: relay.url })))
        expect(stats.discoveryFailures).toBe(1)
        expect(recon.calls.length).toBeGreaterThan(0)
      })
    })
  })

  layer(Db.layer(), { timeout: "120 seconds", excludeTestServices: true })(
    "the database goes down during the pass",
    (it) => {
      it.scoped("infrastructure unhealthy and not ready while down; the pass resumes from its continuation", () => {
        const recon = newRecon()
        const down = { value: false }
        const owners = dids(30_000, 120)
        const lifecycleLayer = Lifecycle.layer({ shutdownTimeout: "5 seconds" })
        const layers = Backfill.layer(FAST).pipe(
          Layer.provideMerge(Health.layer),
          Layer.provideMerge(lifecycleLayer),
          Layer.provideMerge(downable(down)),
          Layer.provideMerge(env(recon))
        )
        return Effect.gen(function*() {
          yield* addOwners(owners)
          const lifecycle = yield* Lifecycle.Lifecycle
          const health = yield* Health.Health
          const backfill = yield* Backfill.Backfill
          yield* lifecycle.setPhase("reconciling-live")
          expect((yield* health.report).ready).toBe(true)
          // the database dies while page 2 is being reconciled
          const crashAt = owners[60] ?? ""
          recon.hook = (did) => Effect.sync(() => void (did === crashAt && (down.value = true)))
          yield* backfill.start
          yield* waitFor(() => recon.calls.includes(crashAt))
          // the pass fails on its next store call: wait for health to say so (bounded), not a fixed time
          let report = yield* health.report
          for (let waited = 0; report.ready && waited < 10_000; waited += 10) {
            yield* Effect.sleep("10 millis")
            report = yield* health.report
          }
          expect(report.ready).toBe(false)
          expect(report.body["backfill"]).toMatchObject({ infrastructureHealthy: false, initialPassDone: false })
          // it comes back: the pass resumes from page 2 (page 1 is not redone)
          recon.hook = () => Effect.void
          const before = recon.calls.length
          down.value = false
          yield* backfill.awaitInitialPass
          const after = recon.calls.slice(before)
          expect(after.slice(0, 50)).toEqual(owners.slice(50, 100))
          expect(after).not.toContain(owners[0])
          expect(new Set(recon.calls)).toEqual(new Set(owners))
          const healthy = yield* health.report
          expect(healthy.ready).toBe(true)
          expect(healthy.body["backfill"]).toMatchObject({
            running: false,
            infrastructureHealthy: true,
            initialPassDone: true
          })
          // no DID in the health body
          expect(JSON.stringify(healthy.body)).not.toContain("did:")
        }).pipe(Effect.provide(layers))
      }, 60_000)

      it.scoped("stop interrupts the running pass (the Lifecycle stage `backfill`)", () => {
        const recon = newRecon()
        const layers = Backfill.layer(FAST).pipe(
          Layer.provideMerge(Health.layer),
          Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
          Layer.provideMerge(ReconcileStoreMod.layerSql),
          Layer.provideMerge(env(recon))
        )
        return Effect.gen(function*() {
          yield* addOwners(dids(40_000, 3))
          const interrupted = yield* Deferred.make<void>()
          recon.hook = () => Effect.never.pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
          const backfill = yield* Backfill.Backfill
          yield* backfill.start
          yield* waitFor(() => recon.calls.length > 0)
          const report = yield* (yield* Lifecycle.Lifecycle).shutdown
          expect(report.clean).toBe(true)
          yield* Deferred.await(interrupted)
          expect((yield* backfill.stats).running).toBe(false)
        }).pipe(Effect.provide(layers))
      })
    }
  )
})

describe("Backfill with the real Reconciler", () => {
  layer(
    Backfill.layer(FAST).pipe(
      Layer.provideMerge(Health.layer),
      Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
      Layer.provideMerge(reconcileStack())
    ),
    { timeout: "120 seconds", excludeTestServices: true }
  )("against a fake PDS", (it) => {
    it.effect("the initial pass reconciles every known owner and swaps them into memory", () =>
      Effect.gen(function*() {
        const fakes = yield* Fakes
        const [a, b, c] = dids(50_000, 3)
        const hook = (n: number) => whRecordValue(`at://${plc(n)}`)
        for (const did of [a, b]) fakes.docs.set(did ?? "", didDoc(did ?? "", fakes.pds.url))
        fakes.docs.set(c ?? "", didDoc(c ?? "", "http://169.254.169.254"))
        fakes.repos.set(a ?? "", {
          rev: rev(100),
          records: [{ rkey: "x", value: hook(1) }, { rkey: "y", value: hook(2) }]
        })
        fakes.repos.set(b ?? "", { rev: rev(100), records: [] })
        // c's PDS fails: counted, the pass goes on, c keeps its registration
        yield* Effect.flatMap(Processor, (p) =>
          p.processEvents(
            [whEv(b ?? "", "old", hook(3), { rev: rev(1) }), whEv(c ?? "", "kept", hook(4), { rev: rev(1) })],
            { registryWriter: true }
          ))
        yield* Effect.flatMap(store, (s) => s.addOwners([a ?? ""], "operator"))
        const backfill = yield* Backfill.Backfill
        yield* backfill.start
        yield* backfill.start // idempotent
        yield* backfill.awaitInitialPass
        const registry = yield* Registry
        expect(registry.index.byOwner(a ?? "").map((w) => w.rkey).sort()).toEqual(["x", "y"])
        expect(registry.index.byOwner(b ?? "")).toEqual([])
        expect(registry.index.byOwner(c ?? "").map((w) => w.rkey)).toEqual(["kept"])
        const stats = yield* backfill.stats
        expect(stats).toMatchObject({ ownersDone: 3, ownersFailed: 1, passes: 1, initialPassDone: true })
        expect(yield* Effect.flatMap(store, (s) => s.ownerState(c ?? ""))).toMatchObject({ status: "failed" })
      }))
  })
})
