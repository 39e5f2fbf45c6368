/**
 * A record refused for an admission limit (SPEC §2.6) is admitted once room is freed: a live write
 * that frees room (the delete or pause of an active webhook, a version that is invalid, one that
 * narrows a scope) requests a reconciliation of the owners whose records were refused for that
 * limit (`owners.reconcile_requested_at`, in the batch's transaction), and the reconcile role's
 * RetryScheduler then scans them: the scan stores the refused record and the swap admits it.
 * `limit_owner` requests the owner only; the global limits request other owners, at most
 * `ROOM_REQUESTS_MAX` per batch, oldest refusal first, none already requested. Real PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Duration, Effect, Layer, Ref } from "effect"
import { identityLayer, reconciliationLayer } from "../../src/layers/Reconciliation.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { Registry, ROOM_REQUESTS_MAX } from "../../src/services/registry/Registry.js"
import * as RegistryChanges from "../../src/services/registry/RegistryChanges.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { run } from "../delivery/worker-support.js"
import * as Db from "../support/db.js"
import { didDoc, fakePlc, type FakeRepo, fakeServer, pdsHandler } from "../support/fakeAtproto.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { memoryStack, plc, rev, sqlServices, sqlStack, testConfig, WH, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const hook = whRecordValue(`at://${plc(9)}`)
/** owners requested per freeing batch under a global limit (Registry.ROOM_REQUESTS_MAX) */
const K = 16

/** the owners with a pending reconciliation request */
const requested = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<{ did: string }>`SELECT did FROM owners WHERE reconcile_requested_at IS NOT NULL ORDER BY did`.pipe(
      Effect.map((rows) => rows.map((r) => r.did))
    )
)

const refusals = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<{ owner_did: string; rkey: string; reason: string }>`
    SELECT owner_did, rkey, reason FROM rejected_records ORDER BY owner_did, rkey`)

describe("room freed for a record refused by limit_owner (PostgreSQL)", () => {
  it.scopedLive("a delete of an active webhook requests the owner's reconciliation, in the batch", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      yield* run([
        whEv(ALICE, "x", hook, { rev: rev(1) }),
        whEv(ALICE, "y", hook, { rev: rev(2) }),
        whEv(ALICE, "z", hook, { rev: rev(3) }),
        // Bob is at his limit too, and has no refusal
        whEv(BOB, "b1", hook, { rev: rev(1) }),
        whEv(BOB, "b2", hook, { rev: rev(2) })
      ])
      expect(yield* refusals).toEqual([{ owner_did: ALICE, rkey: "z", reason: "limit_owner" }])
      expect(yield* requested).toEqual([])
      // a delete of a key that holds no registration frees nothing; nor does an owner without refusals
      yield* run([whEv(ALICE, "nope", undefined, { operation: "delete", rev: rev(4) })])
      yield* run([whEv(BOB, "b1", undefined, { operation: "delete", rev: rev(4) })])
      expect(yield* requested).toEqual([])
      // Alice deletes y: room for z
      yield* run([whEv(ALICE, "y", undefined, { operation: "delete", rev: rev(5) })])
      expect(yield* requested).toEqual([ALICE])
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["x"])
    }).pipe(
      Effect.scoped,
      Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "2" } }))
    ))

  it.scopedLive("a pause (enabled: false) frees room too", () =>
    Effect.gen(function*() {
      yield* run([
        whEv(ALICE, "x", hook, { rev: rev(1) }),
        whEv(ALICE, "y", hook, { rev: rev(2) })
      ])
      expect(yield* refusals).toEqual([{ owner_did: ALICE, rkey: "y", reason: "limit_owner" }])
      yield* run([
        whEv(ALICE, "x", whRecordValue(`at://${plc(9)}`, { enabled: false }), { operation: "update", rev: rev(3) })
      ])
      expect(yield* requested).toEqual([ALICE])
    }).pipe(
      Effect.scoped,
      Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" } }))
    ))
})

/** The memory stack over `state` (the test reads the store's state directly). */
const memoryOver = (state: RegistryStore.MemoryRegistryState, env: Record<string, string>) =>
  memoryStack({
    env,
    registryStore: Layer.effect(RegistryStore.RegistryStore, Effect.map(Ref.make(state), RegistryStore.makeMemoryOver))
  })

describe("room freed (in memory)", () => {
  it.effect("the in-memory store requests the owner of a limit_owner refusal", () => {
    const state = RegistryStore.emptyMemoryState()
    return Effect.gen(function*() {
      yield* run([whEv(ALICE, "x", hook, { rev: rev(1) }), whEv(ALICE, "y", hook, { rev: rev(2) })])
      expect([...state.reconcileRequested]).toEqual([])
      yield* run([whEv(ALICE, "x", undefined, { operation: "delete", rev: rev(3) })])
      expect([...state.reconcileRequested]).toEqual([ALICE])
    }).pipe(
      Effect.provide(memoryOver(state, { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" }))
    )
  })

  it.effect("a replayed write settled from the store requests nothing (the process that committed it did)", () => {
    const state = RegistryStore.emptyMemoryState()
    return Effect.gen(function*() {
      yield* run([whEv(ALICE, "x", hook, { rev: rev(1) }), whEv(ALICE, "y", hook, { rev: rev(2) })])
      // another process (the previous intake leader) committed the delete of x
      const store = yield* RegistryStore.RegistryStore
      yield* store.remove(ALICE, "x", { rev: rev(3), generation: 9 })
      // its replay here is stale: the index follows the store (x unregistered), nothing is requested
      yield* run([whEv(ALICE, "x", undefined, { operation: "delete", rev: rev(3) })])
      expect((yield* Registry).index.byOwner(ALICE)).toEqual([])
      expect([...state.reconcileRequested]).toEqual([])
    }).pipe(
      Effect.provide(memoryOver(state, { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" }))
    )
  })

  it.effect("at most ROOM_REQUESTS_MAX other owners per batch, however many of its writes free room", () => {
    const state = RegistryStore.emptyMemoryState()
    return Effect.gen(function*() {
      const waiting = Array.from({ length: ROOM_REQUESTS_MAX + 4 }, (_, i) => plc(100 + i))
      yield* run([whEv(ALICE, "a1", hook, { rev: rev(1) }), whEv(ALICE, "a2", hook, { rev: rev(2) })])
      for (const did of waiting) yield* run([whEv(did, "w", hook, { rev: rev(3) })])
      expect([...state.rejected.values()].filter((e) => e.reason === "limit_total")).toHaveLength(waiting.length)
      // one batch frees room twice: the second write finds the batch's quota used up
      yield* run([
        whEv(ALICE, "a1", undefined, { operation: "delete", rev: rev(4) }),
        whEv(ALICE, "a2", undefined, { operation: "delete", rev: rev(5) })
      ])
      expect(state.reconcileRequested.size).toBe(ROOM_REQUESTS_MAX)
      // the next batch that frees room requests the others
      yield* run([whEv(BOB, "b", hook, { rev: rev(6) })])
      yield* run([whEv(BOB, "b", undefined, { operation: "delete", rev: rev(7) })])
      expect([...state.reconcileRequested].sort()).toEqual([...waiting].sort())
    }).pipe(
      Effect.provide(memoryOver(state, { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2" }))
    )
  })

  it.effect("a write that frees a backlink scope DID requests the owners refused for that limit", () => {
    const state = RegistryStore.emptyMemoryState()
    return Effect.gen(function*() {
      const backlinks = (n: number) => whRecordValue(`at://${plc(n)}`, { backlinks: true })
      yield* run([whEv(ALICE, "a", backlinks(8), { rev: rev(1) })])
      yield* run([whEv(BOB, "b", backlinks(9), { rev: rev(2) })])
      expect([...state.rejected.values()].map((e) => [e.ownerDid, e.reason])).toEqual([[BOB, "limit_backlink_dids"]])
      expect([...state.reconcileRequested]).toEqual([])
      yield* run([whEv(ALICE, "a", undefined, { operation: "delete", rev: rev(3) })])
      expect([...state.reconcileRequested]).toEqual([BOB])
    }).pipe(
      Effect.provide(memoryOver(state, { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_BACKLINK_SCOPE_DIDS_MAX: "1" }))
    )
  })

  it.effect("the in-memory store requests no scanning or failed owner", () => {
    const state = RegistryStore.emptyMemoryState()
    return Effect.gen(function*() {
      const [scanning, failed, idle] = [plc(201), plc(202), plc(203)]
      yield* run([whEv(ALICE, "a", hook, { rev: rev(1) })])
      for (const did of [scanning, failed, idle]) yield* run([whEv(did, "w", hook, { rev: rev(2) })])
      for (const [did, status] of [[scanning, "scanning"], [failed, "failed"]] as const) {
        const owner = state.owners.get(did)
        if (owner === undefined) return expect.unreachable("the owner was seen")
        state.owners.set(did, { ...owner, status })
      }
      yield* run([whEv(ALICE, "a", undefined, { operation: "delete", rev: rev(3) })])
      expect([...state.reconcileRequested]).toEqual([idle])
    }).pipe(
      Effect.provide(memoryOver(state, { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }))
    )
  })
})

describe("room freed under a global limit (PostgreSQL)", () => {
  it.scopedLive(
    "requests at most ROOM_REQUESTS_MAX other owners per batch, oldest refusal first, none twice",
    () =>
      Effect.gen(function*() {
        const registry = yield* Registry
        const n = K + 4
        const waiting = Array.from({ length: n }, (_, i) => plc(100 + i))
        yield* run([
          whEv(ALICE, "a1", hook, { rev: rev(1) }),
          whEv(ALICE, "a2", hook, { rev: rev(2) })
        ])
        // one batch each, so that their refusals are seen one after the other (first_seen_at)
        for (const did of waiting) yield* run([whEv(did, "w", hook, { rev: rev(3) })])
        expect((yield* refusals).map((r) => r.reason)).toEqual(waiting.map(() => "limit_total"))
        expect(yield* requested).toEqual([])

        // Alice deletes one: the ROOM_REQUESTS_MAX oldest refusals' owners are requested, not Alice
        yield* run([whEv(ALICE, "a1", undefined, { operation: "delete", rev: rev(4) })])
        expect(yield* requested).toEqual(waiting.slice(0, K).sort())
        // another freeing batch: the owners already requested are skipped, the next ones requested
        yield* run([whEv(ALICE, "a2", undefined, { operation: "delete", rev: rev(5) })])
        expect(yield* requested).toEqual([...waiting].sort())
        expect(registry.index.size).toBe(0)
        expect(ROOM_REQUESTS_MAX).toBe(K)
      }).pipe(
        Effect.scoped,
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2" } }))
      ),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "a scanning or failed owner is not requested (its scan's swap, or the retry scheduler, admits)",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const [scanning, failed, idle] = [plc(201), plc(202), plc(203)]
        yield* run([whEv(ALICE, "a", hook, { rev: rev(1) })])
        for (const did of [scanning, failed, idle]) yield* run([whEv(did, "w", hook, { rev: rev(2) })])
        expect((yield* refusals).map((r) => r.reason)).toEqual(["limit_total", "limit_total", "limit_total"])
        yield* sql`UPDATE owners SET reconcile_status = 'scanning' WHERE did = ${scanning}`
        yield* sql`UPDATE owners SET reconcile_status = 'failed' WHERE did = ${failed}`
        yield* run([whEv(ALICE, "a", undefined, { operation: "delete", rev: rev(3) })])
        expect(yield* requested).toEqual([idle])
      }).pipe(
        Effect.scoped,
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" } }))
      ),
    { timeout: 60_000 }
  )

  it.scopedLive("the read of the oldest refusals uses the partial index", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // (a few rows: a sequential scan would be cheaper, so the planner is told not to)
      const plan = yield* Effect.zipRight(
        sql`SET LOCAL enable_seqscan = off`,
        sql<{ "QUERY PLAN": string }>`
          EXPLAIN SELECT owner_did, first_seen_at FROM rejected_records
          WHERE reason = 'limit_total' ORDER BY first_seen_at LIMIT 1000`
      ).pipe(sql.withTransaction)
      expect(plan.map((r) => r["QUERY PLAN"]).join("\n")).toContain("rejected_records_limit_since")
    }).pipe(Effect.scoped, Effect.provide(sqlStack())))
})

describe("end to end: the refused record becomes active within a scheduler round", () => {
  it.scopedLive(
    "Alice at her limit deletes a webhook: the reconcile process's scan admits the refused one, no sweep",
    () =>
      Effect.gen(function*() {
        const T0 = 1_700_000_000_000_000
        const fake = yield* Effect.acquireRelease(
          Effect.promise(() => startFakeJetstream()),
          (f) => Effect.promise(() => f.close())
        )
        const docs = new Map<string, unknown>()
        const repos = new Map<string, FakeRepo>()
        const plcServer = yield* fakePlc(docs)
        const pds = yield* fakeServer(pdsHandler(repos))
        docs.set(ALICE, didDoc(ALICE, pds.url))
        const config = testConfig({
          NODE_ENV: "test",
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "2",
          JETSTREAM_URL: fake.url,
          PLC_DIRECTORY_URL: plcServer.url,
          RETRY_SCHEDULER_INTERVAL_MS: "1000",
          RETRY_SCHEDULER_BASE_MS: "100"
        })
        const db = yield* Layer.build(Db.layer())
        const onDb = Layer.succeedContext(db)
        const sql = Context.get(db, SqlClient.SqlClient)
        const onSql = <A, E>(eff: Effect.Effect<A, E, SqlClient.SqlClient>) =>
          Effect.orDie(Effect.provideService(eff, SqlClient.SqlClient, sql))
        // the intake process (no reconcile role)
        const intake = yield* Layer.build(
          Intake.layer({
            reconfigureDelay: "50 millis",
            tuning: {
              batchRetryBase: Duration.millis(5),
              backoffBase: Duration.millis(10),
              backoffCap: Duration.millis(50)
            }
          }).pipe(
            Layer.provideMerge(Health.layer),
            Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
            // the leader follows registry changes of other processes (RegistrySync)
            Layer.provideMerge(
              RegistryChanges.layerSql.pipe(
                Layer.provideMerge(sqlServices().pipe(Layer.provideMerge(Config.layerValue(config))))
              )
            ),
            Layer.provide(onDb)
          )
        )
        const registry = Context.get(intake, Registry)
        // the reconcile process; its backfill is never started: no sweep
        yield* Layer.build(
          reconciliationLayer({ backfill: { repassInterval: null } }).pipe(
            Layer.provideMerge(identityLayer(config)),
            Layer.provideMerge(Health.layer),
            Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })),
            Layer.provideMerge(Config.layerValue(config)),
            Layer.provide(onDb)
          )
        )
        const active = () => registry.index.byOwner(ALICE).map((w) => w.rkey).sort()
        const poll = (cond: () => Effect.Effect<boolean>, what: string) =>
          Effect.gen(function*() {
            for (let waited = 0; waited < 20_000; waited += 25) {
              if (yield* cond()) return
              yield* Effect.sleep("25 millis")
            }
            return yield* Effect.dieMessage(`never happened: ${what}`)
          })

        fake.publish([
          commitFrame(ALICE, T0 + 1_000, WH, "a", "create", hook),
          commitFrame(ALICE, T0 + 2_000, WH, "b", "create", hook),
          commitFrame(ALICE, T0 + 3_000, WH, "c", "create", hook)
        ])
        yield* poll(
          () => Effect.map(onSql(refusals), (r) => r.length === 1 && r[0]?.reason === "limit_owner"),
          "c refused"
        )
        expect(active()).toEqual(["a", "b"])
        // her repo after she deletes b: a and c
        repos.set(ALICE, { rev: rev(100), records: [{ rkey: "a", value: hook }, { rkey: "c", value: hook }] })
        fake.publish([commitFrame(ALICE, T0 + 4_000, WH, "b", "delete")])
        yield* poll(() => Effect.sync(() => active().join() === "a,c"), "c active").pipe(
          Effect.tapDefect(() =>
            Effect.gen(function*() {
              console.log("on failure: active", active())
              console.log(
                "on failure: owners",
                yield* onSql(
                  sql`SELECT did, reconcile_status, reconcile_requested_at, snapshot_rev, last_failure_kind, failure_count FROM owners`
                )
              )
              console.log("on failure: webhooks", yield* onSql(sql`SELECT rkey, active, rev FROM webhooks`))
              console.log("on failure: tombs", yield* onSql(sql`SELECT rkey, rev, live FROM tombstones`))
              console.log("on failure: rejected", yield* onSql(refusals))
            })
          )
        )
        expect(yield* onSql(refusals)).toEqual([])
        const stored = yield* sql<{ rkey: string; active: boolean }>`
          SELECT rkey, active FROM webhooks WHERE owner_did = ${ALICE} ORDER BY rkey`
        expect(stored).toEqual([{ rkey: "a", active: true }, { rkey: "c", active: true }])
        expect(yield* onSql(requested)).toEqual([])
      }),
    { timeout: 60_000 }
  )
})
