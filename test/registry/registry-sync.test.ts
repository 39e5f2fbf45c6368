/**
 * The intake leader's registry follows changes other processes make (SPEC §6.4, issue 16), on a
 * real PostgreSQL database: the triggers of migration 0005 record and notify a completed
 * reconciliation and a 410 mark, written here with plain SQL as another process would;
 * `RegistrySync.follow` syncs the owner on the notification, or at the next catch-up round when
 * the notification was missed (TestClock drives the rounds), fenced by the owner's state.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, Layer, Queue, TestClock } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as Config from "../../src/services/platform/Config.js"
import { StoreError, Tx } from "../../src/services/platform/Persistence.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryMod from "../../src/services/registry/Registry.js"
import * as RegistryChanges from "../../src/services/registry/RegistryChanges.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RegistrySync from "../../src/services/registry/RegistrySync.js"
import * as Db from "../support/db.js"
import { plc, rev, testConfig, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)

const row = (owner: string, rkey: string, active = true) => {
  const v = validateWhRecord(
    whRecordValue(`at://${owner}/app.bsky.feed.post`, { url: `https://${rkey}.example/hook` }),
    {
      allowInsecureDev: false
    }
  )
  if (Either.isLeft(v)) throw new Error(`invalid fixture: ${v.left}`)
  return toRow(owner, rkey, v.right.record, v.right.scope, rev(1), 1, undefined, active)
}

const TestLayer = RegistryMod.layer.pipe(
  Layer.provideMerge(RegistryChanges.layerSql),
  Layer.provideMerge(Layer.mergeAll(RegistryStore.layerSql, Tx.layerSql)),
  Layer.provideMerge(Layer.mergeAll(Db.layer(), Config.layerValue(testConfig())))
)

type Synced = readonly [RegistrySync.SyncTrigger, string | undefined]

/** Seed `rows` (owners with `status`), load them into memory, and follow from a horizon taken before. */
const setup = (
  rows: ReadonlyArray<RegistryStore.WebhookRow>,
  status: Record<string, string>,
  options: Partial<RegistrySync.FollowOptions> = {}
) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const store = yield* RegistryStore.RegistryStore
    const registry = yield* Registry
    const changes = yield* RegistryChanges.RegistryChanges
    yield* sql`TRUNCATE webhooks, owners, registry_changes, tombstones`
    for (const [did, s] of Object.entries(status)) {
      yield* sql`INSERT INTO owners (did, reconcile_status) VALUES (${did}, ${s})`
    }
    for (const r of rows) yield* store.upsert(r)
    const from = yield* changes.horizon
    yield* registry.reload
    const synced = yield* Queue.unbounded<Synced>()
    const fiber = yield* Effect.fork(
      RegistrySync.follow({
        from,
        registry,
        reloadAll: registry.reload,
        interval: "5 seconds",
        onSynced: (trigger, did) => Queue.offer(synced, [trigger, did]),
        ...options
      })
    )
    return { sql, registry, synced, fiber }
  })

const rkeys = (registry: RegistryMod.RegistryShape, did: string) =>
  registry.index.byOwner(did).map((w) => w.rkey).sort()

/** Until the follower's LISTEN session is established. */
const listening = Db.listening(RegistryChanges.CHANNEL)

const completeScan = (sql: SqlClient.SqlClient, did: string) =>
  sql`UPDATE owners SET reconcile_status = 'complete', completed_at = now() WHERE did = ${did}`

const markGone = (sql: SqlClient.SqlClient, did: string, rkey: string) =>
  sql`UPDATE webhooks SET gone_at = now() WHERE owner_did = ${did} AND rkey = ${rkey}`

/**
 * A store change another process could make that a sync makes visible: the row is deactivated, and
 * its gone mark notifies (the `gone_at` trigger). A gone mark alone changes no matching (SPEC §4.3).
 */
const deactivate = (sql: SqlClient.SqlClient, did: string, rkey: string) =>
  sql`UPDATE webhooks SET active = false, gone_at = now() WHERE owner_did = ${did} AND rkey = ${rkey}`

describe("RegistrySync", () => {
  it.layer(TestLayer, { timeout: 60_000 })("on PostgreSQL", (it) => {
    it.effect("a notification: a completed owner is swapped in at once; a gone webhook stays matched", () =>
      Effect.gen(function*() {
        const { registry, sql, synced, fiber } = yield* setup([row(BOB, "b1"), row(BOB, "b2")], {
          [ALICE]: "scanning",
          [BOB]: "complete"
        })
        yield* listening
        expect(rkeys(registry, ALICE)).toEqual([])
        // another process completes Alice's scan: her rows were written during it
        yield* Effect.flatMap(RegistryStore.RegistryStore, (s) => s.upsert(row(ALICE, "a1")))
        yield* completeScan(sql, ALICE)
        expect(yield* Queue.take(synced)).toEqual(["notification", ALICE])
        expect(rkeys(registry, ALICE)).toEqual(["a1"])
        // another process's delivery got a 410 for Bob's b2: followed, and b2 stays in matching (its
        // new matches are enqueued and parked as webhook_disabled until it is resumed)
        yield* markGone(sql, BOB, "b2")
        expect(yield* Queue.take(synced)).toEqual(["notification", BOB])
        expect(rkeys(registry, BOB)).toEqual(["b1", "b2"])
        // intake's own kind of write (a new version of the record clears gone_at) notifies too
        yield* Effect.flatMap(RegistryStore.RegistryStore, (s) => s.upsert({ ...row(BOB, "b2"), rev: rev(2) }))
        expect(yield* Queue.take(synced)).toEqual(["notification", BOB])
        expect(rkeys(registry, BOB)).toEqual(["b1", "b2"])
        const b2 = (yield* Effect.flatMap(RegistryStore.RegistryStore, (s) => s.ownerRows(BOB))).find((r) =>
          r.rkey === "b2"
        )
        expect(b2?.gone).toBe(false)
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("a scanning or failed owner keeps its pre-scan registrations; a gone mark changes no matching", () =>
      Effect.gen(function*() {
        const { registry, sql, synced, fiber } = yield* setup([row(ALICE, "a1"), row(ALICE, "a2"), row(BOB, "b1")], {
          [ALICE]: "scanning",
          [BOB]: "failed"
        })
        yield* listening
        // a snapshot page of Alice's scan lands in the store only; then one of her hooks goes gone
        yield* Effect.flatMap(RegistryStore.RegistryStore, (s) => s.upsert(row(ALICE, "page")))
        yield* markGone(sql, ALICE, "a2")
        expect(yield* Queue.take(synced)).toEqual(["notification", ALICE])
        expect(rkeys(registry, ALICE)).toEqual(["a1", "a2"])
        // Bob's last scan failed: what its pages left in the store is not swapped in either
        yield* Effect.flatMap(RegistryStore.RegistryStore, (s) => s.upsert(row(BOB, "page")))
        yield* markGone(sql, BOB, "b1")
        expect(yield* Queue.take(synced)).toEqual(["notification", BOB])
        expect(rkeys(registry, BOB)).toEqual(["b1"])
        // the scan completes: the reconciled set, the gone webhook included (it is parked, not dropped)
        yield* completeScan(sql, ALICE)
        expect(yield* Queue.take(synced)).toEqual(["notification", ALICE])
        expect(rkeys(registry, ALICE)).toEqual(["a1", "a2", "page"])
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("missed notifications: the catch-up round syncs the changed owners, each change once", () =>
      Effect.gen(function*() {
        const { registry, sql, synced, fiber } = yield* setup([row(ALICE, "a1"), row(BOB, "b1")], {}, {
          listen: false
        })
        yield* deactivate(sql, ALICE, "a1")
        expect(rkeys(registry, ALICE)).toEqual(["a1"])
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["catch_up", ALICE])
        expect(rkeys(registry, ALICE)).toEqual([])
        // the next round has nothing new (Alice's change is not synced again), the one after Bob's
        yield* TestClock.adjust("5 seconds")
        yield* deactivate(sql, BOB, "b1")
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["catch_up", BOB])
        expect(rkeys(registry, BOB)).toEqual([])
        expect(yield* Queue.size(synced)).toBe(0)
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("more changed owners than a round syncs one by one: the whole registry is reloaded", () =>
      Effect.gen(function*() {
        const { registry, sql, synced, fiber } = yield* setup(
          [row(ALICE, "a1"), row(BOB, "b1"), row(CAROL, "c1")],
          {},
          { listen: false, maxPerRound: 2 }
        )
        for (const did of [ALICE, BOB, CAROL]) {
          yield* deactivate(sql, did, did === ALICE ? "a1" : did === BOB ? "b1" : "c1")
        }
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["reload", undefined])
        expect(registry.index.size).toBe(0)
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("a change seen again (an open transaction holds the horizon back) is not synced again", () =>
      Effect.gen(function*() {
        const { registry, sql, synced, fiber } = yield* setup([row(ALICE, "a1"), row(BOB, "b1")], {}, {
          listen: false
        })
        // another session's transaction, open with a transaction id: the horizon stays at or below it
        const other = yield* sql.reserve
        yield* other.executeValues("BEGIN", [])
        yield* other.executeValues("SELECT pg_current_xact_id()", [])
        yield* deactivate(sql, ALICE, "a1")
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["catch_up", ALICE])
        expect(rkeys(registry, ALICE)).toEqual([])
        // the next rounds read Alice's change again: already synced; Bob's is the next one synced
        yield* TestClock.adjust("5 seconds")
        yield* TestClock.adjust("5 seconds")
        yield* deactivate(sql, BOB, "b1")
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["catch_up", BOB])
        expect(yield* Queue.size(synced)).toBe(0)
        yield* other.executeValues("COMMIT", [])
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.scoped))

    it.effect("an owner whose sync failed is synced by the next round (the horizon moves only after a round's syncs)", () =>
      Effect.gen(function*() {
        const real = yield* Registry
        const attempts = yield* Queue.unbounded<string>()
        let failures = 1
        const registry = {
          syncOwner: (did: string) =>
            Effect.zipRight(
              Queue.offer(attempts, did),
              Effect.suspend(() =>
                failures-- > 0 ? Effect.fail(new StoreError({ op: "test", code: "08006" })) : real.syncOwner(did)
              )
            )
        }
        const { sql, synced, fiber } = yield* setup([row(ALICE, "a1"), row(BOB, "b1")], {}, {
          listen: false,
          registry
        })
        yield* deactivate(sql, ALICE, "a1")
        yield* TestClock.adjust("5 seconds")
        // the round's sync of Alice fails
        expect(yield* Queue.take(attempts)).toBe(ALICE)
        expect(rkeys(real, ALICE)).toEqual(["a1"])
        // the next round syncs Alice, then Bob's later change
        yield* deactivate(sql, BOB, "b1")
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["catch_up", ALICE])
        expect(yield* Queue.take(synced)).toEqual(["catch_up", BOB])
        expect(rkeys(real, ALICE)).toEqual([])
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("exactly as many changed owners as a round syncs one by one: synced one by one, no reload", () =>
      Effect.gen(function*() {
        const { registry, sql, synced, fiber } = yield* setup([row(ALICE, "a1"), row(BOB, "b1")], {}, {
          listen: false,
          maxPerRound: 2
        })
        yield* deactivate(sql, ALICE, "a1")
        yield* deactivate(sql, BOB, "b1")
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(["catch_up", ALICE])
        expect(yield* Queue.take(synced)).toEqual(["catch_up", BOB])
        expect(registry.index.size).toBe(0)
        yield* Fiber.interrupt(fiber)
      }))
    it.effect("RegistryStore.markGone marks only the registration the 410 answered (same fingerprint), SPEC §4.3", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const store = yield* RegistryStore.RegistryStore
        yield* sql`TRUNCATE webhooks, owners, registry_changes, tombstones`
        const a = row(ALICE, "a")
        yield* store.upsert(a)
        // a 410 for an older version of the record (it changed since the delivery was enqueued)
        expect(yield* store.markGone(ALICE, "a", "an-older-fingerprint")).toBe(false)
        expect((yield* store.get(ALICE, "a")).row?.gone).toBe(false)
        expect(yield* store.markGone(ALICE, "a", a.fingerprint)).toBe(true)
        expect((yield* store.get(ALICE, "a")).row?.gone).toBe(true)
      }))
  })
})
