/**
 * The cap of an owner's stored records on the registry stream (`limit_owner_records`): a live write
 * that would store a new key for an owner who already has `RECONCILE_MAX_RECORDS` stored records
 * (active or disabled: what one reconciliation scan can read) is refused: not stored (a tombstone
 * at its rev, as other refusals), listed among the owner's refused records, counted (health, the
 * rejection metric's `owner_records` label). Disabled records count (SPEC §2.6's "Disabled records
 * never count" is about activation); enabled ones are capped the same way, before admission. An
 * update or a delete of a stored key always passes; a delete makes room (and requests the owner's
 * reconciliation, which may store the refused key); the refused key written again is stored and
 * its entry cleared. The count is read under the owner's row lock, so a row another writer (a
 * scan's page) commits while the live write waits for that lock counts. Real PostgreSQL, and the
 * in-memory store alike.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Ref } from "effect"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import * as Metrics from "../../src/services/platform/Metrics.js"
import { Registry } from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import { eventually, run } from "../delivery/worker-support.js"
import { ev, memoryStack, plc, rev, sqlStack, WH, whRecordValue } from "../support/stack.js"

const OWNER = plc(1)
const OTHER = plc(2)
const CAP = 3
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1", RECONCILE_MAX_RECORDS: String(CAP) }

const paused = whRecordValue(`at://${plc(9)}`, { enabled: false })
const enabled = whRecordValue(`at://${plc(9)}`)

const wh = (owner: string, rkey: string, n: number, record: unknown, operation: "create" | "update" = "create") =>
  ev(owner, WH, rkey, { record, rev: rev(n), cid: `bafy${rkey}${n}`, operation })
const del = (owner: string, rkey: string, n: number) => ev(owner, WH, rkey, { operation: "delete", rev: rev(n) })

/** One registry-stream batch; each event's registry outcome (`rejected:<limit>` for a refusal over a limit). */
const live = (events: ReadonlyArray<RecordEvent>) =>
  Effect.map(run(events), (r) =>
    r.outcomes.map((o) => {
      const reg = "registry" in o ? o.registry : undefined
      if (reg === undefined) return o._tag
      return reg._tag === "rejected" ? `rejected:${reg.limit}` : reg._tag
    }))

const storedRkeys = (owner: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<{ rkey: string }>`SELECT rkey FROM webhooks WHERE owner_did = ${owner} ORDER BY rkey`.pipe(
        Effect.map((rows) => rows.map((r) => r.rkey))
      )
  )

/** The owner's refused records as the owners' API reads them (`RejectedStore.list`). */
const listed = (owner: string) =>
  Effect.flatMap(RejectedStore.RejectedStore, (s) => s.list(owner)).pipe(
    Effect.map((entries) => entries.map((e) => ({ rkey: e.rkey, rev: e.rev, reason: e.reason, source: e.source })))
  )

const requested = (owner: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ n: number }>`
      SELECT count(*)::int AS n FROM owners WHERE did = ${owner} AND reconcile_requested_at IS NOT NULL`.pipe(
      Effect.map((rows) => (rows[0]?.n ?? 0) > 0)
    ))

/** The rejection metric's `owner_records` series, from the metrics exposition (0 before its first). */
const metricOwnerRecords = Effect.map(Metrics.exposition, (text) => {
  const name = `firehook_registry_admission_rejected_total{limit="owner_records"} `
  const line = text.split("\n").find((l) => l.startsWith(name))
  return line === undefined ? 0 : Number(line.slice(name.length))
})

const sql = () => RejectedStore.layerSql.pipe(Layer.provideMerge(sqlStack({ env: ENV })))

describe("the cap of an owner's stored records on the registry stream (PostgreSQL)", () => {
  it.scopedLive("a new disabled key over the cap is refused: not stored, tombstoned, listed, counted", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const db = yield* SqlClient.SqlClient
      const metricBefore = yield* metricOwnerRecords
      expect(yield* live([wh(OWNER, "a", 1, paused), wh(OWNER, "b", 2, paused), wh(OWNER, "c", 3, paused)]))
        .toEqual(["disabled", "disabled", "disabled"])
      // another owner's records do not count towards this owner's cap
      expect(yield* live([wh(OTHER, "x", 1, paused)])).toEqual(["disabled"])
      expect(yield* live([wh(OWNER, "d", 4, paused)])).toEqual(["rejected:owner_records"])
      expect(yield* storedRkeys(OWNER)).toEqual(["a", "b", "c"])
      expect(yield* db`SELECT rkey, rev FROM tombstones WHERE owner_did = ${OWNER}`).toEqual([
        { rkey: "d", rev: rev(4) }
      ])
      expect(yield* listed(OWNER)).toEqual([
        { rkey: "d", rev: rev(4), reason: "limit_owner_records", source: "stream" }
      ])
      expect(RejectedStore.REJECTION_REASONS).toContain("limit_owner_records")
      expect((yield* registry.stats).rejected.owner_records).toBe(1)
      expect((yield* metricOwnerRecords) - metricBefore).toBe(1)
      // the other owner is far from the cap
      expect(yield* live([wh(OTHER, "y", 2, paused)])).toEqual(["disabled"])
    }).pipe(Effect.scoped, Effect.provide(sql())))

  it.scopedLive("updates and deletes of stored keys pass at the cap; a delete makes room for the refused key", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      yield* live([wh(OWNER, "a", 1, paused), wh(OWNER, "b", 2, paused), wh(OWNER, "c", 3, paused)])
      expect(yield* live([wh(OWNER, "d", 4, paused)])).toEqual(["rejected:owner_records"])
      // at the cap: an update of a stored key (paused → paused, paused → enabled) is stored
      expect(yield* live([wh(OWNER, "a", 5, paused, "update"), wh(OWNER, "b", 6, enabled, "update")])).toEqual([
        "disabled",
        "active"
      ])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey)).toEqual(["b"])
      // the refused key written again is still refused (its entry follows the newest sighting)
      expect(yield* live([wh(OWNER, "d", 7, paused, "update")])).toEqual(["rejected:owner_records"])
      expect(yield* listed(OWNER)).toEqual([
        { rkey: "d", rev: rev(7), reason: "limit_owner_records", source: "stream" }
      ])
      expect(yield* requested(OWNER)).toBe(false)
      // a delete of a stored (paused) key passes and makes room: the owner's reconciliation is
      // requested (its scan may store the refused key), as for the other limits
      expect(yield* live([del(OWNER, "c", 8)])).toEqual(["deleted"])
      expect(yield* requested(OWNER)).toBe(true)
      // the refused key written again is stored now, and its entry leaves the list
      expect(yield* live([wh(OWNER, "d", 9, paused, "update")])).toEqual(["disabled"])
      expect(yield* storedRkeys(OWNER)).toEqual(["a", "b", "d"])
      expect(yield* listed(OWNER)).toEqual([])
      // and the cap holds again
      expect(yield* live([wh(OWNER, "e", 10, paused)])).toEqual(["rejected:owner_records"])
      expect(yield* storedRkeys(OWNER)).toEqual(["a", "b", "d"])
    }).pipe(Effect.scoped, Effect.provide(sql())))

  it.scopedLive("enabled records are capped too, before admission; an invalid one keeps its error kind", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      yield* live([wh(OWNER, "a", 1, paused), wh(OWNER, "b", 2, paused), wh(OWNER, "c", 3, enabled)])
      expect(yield* live([wh(OWNER, "d", 4, enabled)])).toEqual(["rejected:owner_records"])
      expect(registry.index.byOwner(OWNER).map((w) => w.rkey)).toEqual(["c"])
      expect(yield* storedRkeys(OWNER)).toEqual(["a", "b", "c"])
      expect(yield* live([wh(OWNER, "e", 5, whRecordValue(`at://${plc(9)}`, { secretId: "not valid!" }))])).toEqual([
        "invalid"
      ])
      expect((yield* listed(OWNER)).map((e) => [e.rkey, e.reason])).toEqual([
        ["e", "secret_id"],
        ["d", "limit_owner_records"]
      ])
      // pausing an enabled stored key at the cap passes, and frees no stored-record room
      expect(yield* live([wh(OWNER, "c", 6, paused, "update")])).toEqual(["disabled"])
      expect(yield* live([wh(OWNER, "d", 7, enabled, "update")])).toEqual(["rejected:owner_records"])
      // a commit that deletes a stored key and creates a new one: the delete is applied first
      expect(yield* live([wh(OWNER, "f", 8, enabled), del(OWNER, "a", 8)])).toEqual(["active", "deleted"])
      expect(yield* storedRkeys(OWNER)).toEqual(["b", "c", "f"])
    }).pipe(Effect.scoped, Effect.provide(sql())))

  it.scopedLive("a row another writer commits while the live write waits for the owner's lock counts", () =>
    Effect.gen(function*() {
      const db = yield* SqlClient.SqlClient
      yield* live([wh(OWNER, "a", 1, paused), wh(OWNER, "b", 2, paused)])
      const locked = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      // as a scan's page: the owner's row lock, then a row, committed once the live write waits
      const page = yield* db.withTransaction(Effect.gen(function*() {
        yield* db`SELECT 1 FROM owners WHERE did = ${OWNER} FOR UPDATE`
        yield* db`
          INSERT INTO webhooks (${db.literal(RegistryStore.WEBHOOK_COLUMNS)})
          SELECT owner_did, 'c', rev, generation, cid, record, scope_uri, scope_did, backlinks, url, events,
            enabled, active, signing_mode, secret_id, fingerprint, gone_at
          FROM webhooks WHERE owner_did = ${OWNER} AND rkey = 'a'`
        yield* Deferred.succeed(locked, undefined)
        yield* Deferred.await(release)
      })).pipe(Effect.fork)
      yield* Deferred.await(locked)
      const write = yield* live([wh(OWNER, "d", 3, paused)]).pipe(Effect.fork)
      yield* eventually(
        "the live write waits for the owner's lock",
        db<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND wait_event_type = 'Lock'`,
        (rows) => rows[0]?.n === 1
      )
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(page)
      expect(yield* Fiber.join(write)).toEqual(["rejected:owner_records"])
      expect(yield* storedRkeys(OWNER)).toEqual(["a", "b", "c"])
    }).pipe(Effect.scoped, Effect.provide(sql())))
})

describe("the cap of an owner's stored records (in memory)", () => {
  it.effect("the in-memory store counts the owner's rows the same way", () => {
    const state = RegistryStore.emptyMemoryState()
    const stack = memoryStack({
      env: ENV,
      registryStore: Layer.effect(
        RegistryStore.RegistryStore,
        Effect.map(Ref.make(state), RegistryStore.makeMemoryOver)
      )
    })
    const rkeys = () => [...state.rows.values()].filter((r) => r.ownerDid === OWNER).map((r) => r.rkey).sort()
    return Effect.gen(function*() {
      yield* live([wh(OWNER, "a", 1, paused), wh(OWNER, "b", 2, paused), wh(OWNER, "c", 3, enabled)])
      expect(yield* live([wh(OWNER, "d", 4, paused), wh(OWNER, "e", 5, enabled)])).toEqual([
        "rejected:owner_records",
        "rejected:owner_records"
      ])
      expect(rkeys()).toEqual(["a", "b", "c"])
      expect([...state.rejected.values()].map((e) => [e.rkey, e.reason]).sort()).toEqual([
        ["d", "limit_owner_records"],
        ["e", "limit_owner_records"]
      ])
      expect(yield* live([wh(OWNER, "a", 6, enabled, "update"), del(OWNER, "b", 7)])).toEqual(["active", "deleted"])
      expect([...state.reconcileRequested]).toEqual([OWNER])
      expect(yield* live([wh(OWNER, "d", 8, paused, "update")])).toEqual(["disabled"])
      expect(rkeys()).toEqual(["a", "c", "d"])
      expect([...state.rejected.values()].map((e) => e.rkey)).toEqual(["e"])
    }).pipe(Effect.provide(stack))
  })
})
