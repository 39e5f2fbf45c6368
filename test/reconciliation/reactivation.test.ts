/**
 * An account's reactivation reconciles its owner promptly (Reactivations.ts): the store's request
 * stamp (known owners only, one pending per owner, a cap, cleared by the next scan's begin) and its
 * listing (`only`: the owners to wake), the requester's bounds, and the whole path with the intake
 * and reconcile roles in two "processes" on one database: an owner whose scan found "Could not
 * find repo" (its webhooks removed) gets its webhooks back on `#account active: true`, without a
 * sweep; a deactivation (`active: false`) removes the owner's webhooks the same way (its PDS
 * answers "Could not find repo"); an unknown DID requests nothing.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Deferred, Duration, Effect, Layer, Metric } from "effect"
import { identityLayer, reconciliationLayer } from "../../src/layers/Reconciliation.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Reactivations from "../../src/services/reconciliation/Reactivations.js"
import * as Metrics from "../../src/services/reconciliation/ReconcileMetrics.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../../src/services/reconciliation/ReconcileStore.js"
import * as Db from "../support/db.js"
import { didDoc, fakePlc, type FakeRepo, fakeServer, listRecordsRequests, pdsHandler } from "../support/fakeAtproto.js"
import { accountFrame, commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { plc, rev, sqlServices, testConfig, WH, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const T0 = 1_700_000_000_000_000
const hook = whRecordValue(`at://${plc(9)}`)
const STALE = 900_000

const count = (metric: Metric.Metric.Counter<number>) => Effect.map(Metric.value(metric), (s) => s.count)

/** Poll `cond` (bounded): waits for real sockets, PostgreSQL and the scheduler's rounds. */
const eventually = <E, R>(cond: Effect.Effect<boolean, E, R>, what: string, timeoutMs = 20_000) =>
  Effect.gen(function*() {
    for (let waited = 0; waited < timeoutMs; waited += 25) {
      if (yield* cond) return
      yield* Effect.sleep("25 millis")
    }
    return yield* Effect.dieMessage(`never happened: ${what}`)
  })

describe("reconciliation requests (store)", () => {
  it.scoped("known owners only, one pending each, at most pendingMax pending; listed while not scanning; cleared by begin", () =>
    Effect.gen(function*() {
      const store = yield* ReconcileStore.ReconcileStore
      yield* store.addOwners([ALICE, BOB], "operator")

      expect(yield* store.requestReconcile([ALICE, CAROL], 10)).toEqual({ requested: [ALICE], overCap: 0 })
      // a repeat is coalesced; an unknown DID gets no row
      expect(yield* store.requestReconcile([ALICE, ALICE], 10)).toEqual({ requested: [], overCap: 0 })
      expect(yield* store.ownerState(CAROL)).toBeUndefined()
      // one pending at a cap of one: BOB is left out (counted)
      expect(yield* store.requestReconcile([BOB], 1)).toEqual({ requested: [], overCap: 1 })
      expect((yield* store.ownerState(ALICE))?.reconcileRequested).toBe(true)
      expect((yield* store.ownerState(BOB))?.reconcileRequested).toBe(false)

      const listed = (exclude: ReadonlyArray<string> = []) =>
        store.reconcileRequests({ limit: 10, staleScanMs: STALE, exclude })
      expect(yield* listed()).toEqual([ALICE])
      expect(yield* listed([ALICE])).toEqual([])

      // the scan begun satisfies the request
      const begun = yield* store.begin(ALICE, { maxOtherScanning: 8, staleScanMs: STALE })
      expect(begun._tag).toBe("begun")
      expect((yield* store.ownerState(ALICE))?.reconcileRequested).toBe(false)
      expect(yield* listed()).toEqual([])
      // a request made while it scans is kept for after it (not listed while the scan is fresh)
      expect(yield* store.requestReconcile([ALICE], 10)).toEqual({ requested: [ALICE], overCap: 0 })
      expect(yield* listed()).toEqual([])
      if (begun._tag === "begun") yield* store.markFailed(ALICE, begun.token, "pds_status")
      expect(yield* listed()).toEqual([ALICE])
      expect(yield* store.requestReconcile([], 10)).toEqual({ requested: [], overCap: 0 })
    }).pipe(
      Effect.provide(ReconcileStore.layerSql.pipe(Layer.provideMerge(Db.layer())))
    ))

  it.scoped("only: none but the given owners are listed, whatever older requests wait", () =>
    Effect.gen(function*() {
      const store = yield* ReconcileStore.ReconcileStore
      yield* store.addOwners([ALICE, BOB, CAROL], "operator")
      // ALICE's request is the oldest, then BOB's; CAROL has none
      expect(yield* store.requestReconcile([ALICE], 10)).toEqual({ requested: [ALICE], overCap: 0 })
      expect(yield* store.requestReconcile([BOB], 10)).toEqual({ requested: [BOB], overCap: 0 })
      const listed = (limit: number, only?: ReadonlyArray<string>) =>
        store.reconcileRequests({ limit, staleScanMs: STALE, exclude: [], only })
      expect(yield* listed(1)).toEqual([ALICE])
      expect(yield* listed(1, [BOB, CAROL])).toEqual([BOB])
      expect(yield* listed(10, [CAROL])).toEqual([])
      expect(yield* listed(10, [])).toEqual([])
      expect(yield* listed(10)).toEqual([ALICE, BOB])
    }).pipe(
      Effect.provide(ReconcileStore.layerSql.pipe(Layer.provideMerge(Db.layer())))
    ))
})

describe("Reactivations.requester", () => {
  it.scopedLive("never waits: beyond its queue a DID is dropped (counted); the store's over-cap count is counted; non-canonical DIDs are ignored", () =>
    Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const calls: Array<ReadonlyArray<string>> = []
      const store = fakeReconcileStore({
        requestReconcile: (dids) =>
          Effect.gen(function*() {
            calls.push(dids)
            yield* Deferred.await(gate)
            return { requested: dids.slice(0, 1), overCap: dids.length - 1 }
          })
      })
      const queueDrops = Metrics.reactivationDropped({ reason: "queue" })
      const capDrops = Metrics.reactivationDropped({ reason: "cap" })
      const before = { queue: yield* count(queueDrops), cap: yield* count(capDrops) }
      const request = yield* Reactivations.requester(store, { queueMax: 2 })
      yield* request(plc(11))
      // the drainer has taken the first DID and waits on the store
      yield* eventually(Effect.sync(() => calls.length === 1), "first batch taken")
      yield* request("did:plc:NOT-CANONICAL")
      for (const i of [12, 13, 14]) yield* request(plc(i))
      expect((yield* count(queueDrops)) - before.queue).toBe(1)
      yield* Deferred.succeed(gate, undefined)
      yield* eventually(Effect.sync(() => calls.length === 2), "second batch taken")
      expect(calls).toEqual([[plc(11)], [plc(12), plc(13)]])
      yield* eventually(Effect.map(count(capDrops), (n) => n - before.cap === 1), "over-cap counted")
    }))
})

describe("Reactivations.requester: the pending cap and a database that fails", () => {
  it.scopedLive("by default at most 10,000 requests pending; a batch the store did not take is counted dropped (store), DID by DID", () =>
    Effect.gen(function*() {
      const caps: Array<number> = []
      let fail = false
      const store = fakeReconcileStore({
        requestReconcile: (dids, pendingMax) =>
          Effect.suspend(() => {
            caps.push(pendingMax)
            return fail
              ? Effect.fail(new StoreError({ op: "reconcile.requestReconcile", code: "57P01" }))
              : Effect.succeed({ requested: [...dids], overCap: 0 })
          })
      })
      const storeDrops = Metrics.reactivationDropped({ reason: "store" })
      const before = yield* count(storeDrops)
      const request = yield* Reactivations.requester(store)
      yield* request(plc(21))
      yield* eventually(Effect.sync(() => caps.length === 1), "first batch stamped")
      expect(caps).toEqual([Reactivations.PENDING_MAX])
      expect(Reactivations.PENDING_MAX).toBe(10_000)
      fail = true
      yield* Effect.forEach([plc(22), plc(23), plc(24)], request, { discard: true })
      yield* eventually(Effect.map(count(storeDrops), (n) => n - before >= 3), "store failures counted")
      expect((yield* count(storeDrops)) - before).toBe(3)
    }))
})

/** one process's matching on the shared database (the intake role) */
const matching = (config: Config.FirehookConfigShape) =>
  sqlServices().pipe(Layer.provideMerge(Config.layerValue(config)))

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
}

describe("an account's reactivation (intake and reconcile in separate processes)", () => {
  it.scopedLive(
    "an owner whose scan found no repo gets its webhooks back on #account active: true, without a sweep; active: false removes them without a sweep; unknown DIDs request nothing",
    () =>
      Effect.gen(function*() {
        const fake = yield* Effect.acquireRelease(
          Effect.promise(() => startFakeJetstream()),
          (f) => Effect.promise(() => f.close())
        )
        const docs = new Map<string, unknown>()
        const repos = new Map<string, FakeRepo>()
        const plcServer = yield* fakePlc(docs)
        const pds = yield* fakeServer(pdsHandler(repos))
        for (const did of [ALICE, BOB, CAROL]) docs.set(did, didDoc(did, pds.url))
        repos.set(BOB, { rev: rev(100), records: [{ rkey: "b", value: hook }] })
        const config = testConfig({
          NODE_ENV: "test",
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          JETSTREAM_URL: fake.url,
          PLC_DIRECTORY_URL: plcServer.url,
          RETRY_SCHEDULER_INTERVAL_MS: "1000",
          RETRY_SCHEDULER_BASE_MS: "100"
        })
        const db = yield* Layer.build(Db.layer())
        const onDb = Layer.succeedContext(db)
        const sql = Context.get(db, SqlClient.SqlClient)

        // the intake process (no reconcile role)
        yield* Layer.build(
          Intake.layer({ reconfigureDelay: "50 millis", tuning }).pipe(
            Layer.provideMerge(Health.layer),
            Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
            Layer.provideMerge(matching(config)),
            Layer.provide(onDb)
          )
        )
        // the reconcile process (no registry in memory); its backfill is never started: no sweep
        const recon = yield* Layer.build(
          reconciliationLayer({ backfill: { repassInterval: null } }).pipe(
            Layer.provideMerge(identityLayer(config)),
            Layer.provideMerge(Health.layer),
            Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
            Layer.provideMerge(Config.layerValue(config)),
            Layer.provide(onDb)
          )
        )
        const reconciler = Context.get(recon, Reconciler)

        const rkeys = (did: string) =>
          sql<{ rkey: string }>`SELECT rkey FROM webhooks WHERE owner_did = ${did} ORDER BY rkey`.pipe(
            Effect.orDie,
            Effect.map((rows) => rows.map((r) => r.rkey))
          )
        const requestedAt = (did: string) =>
          sql<{ r: Date | null }>`SELECT reconcile_requested_at AS r FROM owners WHERE did = ${did}`.pipe(
            Effect.orDie,
            Effect.map((rows) => rows.map((x) => x.r))
          )

        // Alice and Bob register a webhook each (the registry stream)
        fake.publish([
          commitFrame(ALICE, T0 + 1_000, WH, "a", "create", hook),
          commitFrame(BOB, T0 + 2_000, WH, "b", "create", hook)
        ])
        yield* eventually(
          Effect.map(Effect.all([rkeys(ALICE), rkeys(BOB)]), ([a, b]) => a.length === 1 && b.length === 1),
          "webhooks registered"
        )

        // Alice deactivates: her PDS answers "Could not find repo", and a scan removes her webhook
        const gone = yield* reconciler.reconcile(ALICE)
        expect(gone).toMatchObject({ _tag: "complete", repoFound: false, deleted: 1 })
        expect(yield* rkeys(ALICE)).toEqual([])

        // she reactivates; Bob deactivates (his PDS then answers "Could not find repo"); Carol (no owner) is active
        repos.set(ALICE, { rev: rev(200), records: [{ rkey: "a", value: hook }] })
        repos.delete(BOB)
        const requestsBefore = yield* count(Metrics.reactivationRequests)
        const bobScansBefore = listRecordsRequests(pds).filter((r) => r.query.get("repo") === BOB).length
        fake.publish([
          accountFrame(BOB, T0 + 3_000, false, "deactivated"),
          accountFrame(CAROL, T0 + 4_000, true),
          accountFrame(ALICE, T0 + 5_000, true)
        ])
        // her webhook comes back through the reconcile process's retry scheduler
        yield* eventually(Effect.map(rkeys(ALICE), (r) => r.length === 1), "Alice's webhook back")
        expect(yield* rkeys(ALICE)).toEqual(["a"])
        expect(yield* requestedAt(ALICE)).toEqual([null])
        // Bob's deactivation: his webhook is removed by the requested scan, not at the next sweep
        yield* eventually(Effect.map(rkeys(BOB), (r) => r.length === 0), "Bob's webhook removed")
        expect(yield* requestedAt(BOB)).toEqual([null])
        expect(listRecordsRequests(pds).filter((r) => r.query.get("repo") === BOB).length).toBe(bobScansBefore + 1)
        expect((yield* count(Metrics.reactivationRequests)) - requestsBefore).toBe(2)
        // nothing for Carol, who is no owner
        expect(yield* requestedAt(CAROL)).toEqual([])
      }),
    { timeout: 60_000 }
  )
})
