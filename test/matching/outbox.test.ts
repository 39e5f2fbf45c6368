/**
 * The matching pipeline on real PostgreSQL: outbox dedupe, chunking, bounds, corruption, the
 * transaction boundary, NOTIFY, and fencing through the SQL store.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Deferred, Effect, Fiber, Layer, Option, Stream } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { buildPayload } from "../../src/services/matching/Canonical.js"
import { matchEvent } from "../../src/services/matching/Match.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { StoreError, Tx } from "../../src/services/platform/Persistence.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const DAVE = plc(4)
const POST = "app.bsky.feed.post"

const run = (batch: ReadonlyArray<StreamEvent>, finalize?: Effect.Effect<void, StoreError>) =>
  Effect.flatMap(
    Processor,
    (p) =>
      p.processEvents(batch, finalize === undefined ? { registryWriter: true } : { registryWriter: true, finalize })
  )

const count = (table: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<{ n: string }>`SELECT count(*)::text AS n FROM ${sql(table)}`.pipe(Effect.map((r) => Number(r[0]?.n ?? 0)))
  )

/** Register n webhooks (one per owner) watching `scopeDid`, in batches. */
const registerMany = (n: number, scopeDid: string, offset = 100) =>
  Effect.gen(function*() {
    const events = Array.from({ length: n }, (_, i) =>
      whEv(plc(offset + i), "w", whRecordValue(`at://${scopeDid}`), { rev: rev(1) }))
    for (let i = 0; i < events.length; i += 128) {
      yield* run(events.slice(i, i + 128))
    }
  })

describe("outbox on PostgreSQL", () => {
  it.layer(sqlStack())("dedupe", (it) => {
    it.effect("replaying the same batch twice adds zero rows and counts the duplicates", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        const batch = [
          ev(BOB, POST, "p1", { rev: rev(10), timeUs: 1_700_000_000_000_001 }),
          ev(BOB, POST, "p2", { rev: rev(11), timeUs: 1_700_000_000_000_002 })
        ]
        const first = yield* run(batch)
        expect(first.inserted).toBe(2)
        expect(first.duplicates).toBe(0)
        const second = yield* run(batch)
        expect(second.inserted).toBe(0)
        expect(second.duplicates).toBe(2)
        expect(yield* count("outbox")).toBe(2)
        expect(yield* count("delivery_events")).toBe(2)
      }))
  })

  it.effect("1,001 matches are inserted in chunks of at most 1,000 rows", () => {
    const chunks: Array<number> = []
    const CountingOutbox = Layer.effect(
      Outbox.OutboxStore,
      Effect.map(Outbox.makeSql, (s) => ({
        ...s,
        insertRows: (rows: ReadonlyArray<Outbox.OutboxRow>) => {
          chunks.push(rows.length)
          return s.insertRows(rows)
        }
      }))
    )
    return Effect.gen(function*() {
      yield* registerMany(1001, BOB)
      chunks.length = 0
      const r = yield* run([ev(BOB, POST, "hot", { rev: rev(50) })])
      expect(r.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1001 })
      expect(chunks).toEqual([1000, 1])
      expect(yield* count("outbox")).toBe(1001)
    }).pipe(
      Effect.provide(sqlStack({ env: { REGISTRY_DIRECT_SCOPE_DIDS_MAX: "10000" }, outbox: CountingOutbox }))
    )
  }, 120_000)

  it.layer(sqlStack())("bounds and corruption", (it) => {
    it.effect("an event whose fan-out exceeds the limit writes nothing; the rest of the call is enqueued", () =>
      Effect.gen(function*() {
        yield* registerMany(3, BOB)
        yield* run([whEv(ALICE, "solo", whRecordValue(`at://${ALICE}`), { rev: rev(1) })])
        const registry = yield* Registry
        const big = ev(BOB, POST, "big", { rev: rev(60) })
        const small = ev(ALICE, POST, "small", { rev: rev(61) })
        const item = (e: typeof big) => {
          const payload = buildPayload(e, e.record)
          if (payload._tag === "Left") return Effect.die("payload")
          return Effect.succeed({ event: e, payload: payload.right, matches: matchEvent(registry.index, e, []) })
        }
        const items = [yield* item(big), yield* item(small)]
        expect(items[0]?.matches.length).toBe(3)
        const tx = yield* Tx
        const result = yield* tx.withTransaction(
          Outbox.enqueue(items, { ...Outbox.defaultLimits(2), maxFanout: 2 })
        )
        expect(result.outcomes.map((o) => o._tag)).toEqual(["fanout_limit", "enqueued"])
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ event_rkey: string }>`SELECT event_rkey FROM outbox`
        expect(rows.map((r) => r.event_rkey)).toEqual(["small"])
        expect(yield* count("delivery_events")).toBe(1)
      }))

    it.effect("an existing event id with a different body is corruption: quarantined, no rows", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "c", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        const e = ev(BOB, POST, "c1", { rev: rev(70), timeUs: 1_700_000_000_123_456 })
        const payload = buildPayload(e, e.record)
        if (payload._tag === "Left") return yield* Effect.die("payload")
        const sql = yield* SqlClient.SqlClient
        yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES (${payload.right.eventId}, '{}', 'not-the-hash')`
        const before = yield* count("outbox")
        const r = yield* run([e])
        expect(r.outcomes[0]).toMatchObject({ _tag: "quarantined", reason: "corruption" })
        expect(yield* count("outbox")).toBe(before)
        const q = yield* sql<{ reason: string }>`SELECT reason FROM quarantine`
        expect(q.map((x) => x.reason)).toContain("corruption")
      }))

    it.effect("a payload over 512 KiB is quarantined as payload_too_large", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "big", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        const r = yield* run([ev(BOB, POST, "huge", { rev: rev(80), record: { text: "x".repeat(600 * 1024) } })])
        expect(r.outcomes[0]).toMatchObject({ _tag: "quarantined", reason: "payload_too_large" })
        const sql = yield* SqlClient.SqlClient
        const q = yield* sql<
          { row: string }
        >`SELECT row_to_json(q)::text AS row FROM quarantine q WHERE reason = 'payload_too_large'`
        expect(q.length).toBe(1)
        expect(q[0]?.row).not.toContain("xxxx")
      }))
  })

  it.layer(sqlStack())("what rows hold", (it) => {
    it.effect("outbox rows never contain payloads or secrets; signing mode and fingerprint are stored", () =>
      Effect.gen(function*() {
        yield* run([
          whEv(ALICE, "inline", whRecordValue(`at://${BOB}`, { secret: "INLINE-SECRET-123" }), { rev: rev(1) }),
          whEv(ALICE, "managed", whRecordValue(`at://${BOB}`, { secretId: "prod-key" }), { rev: rev(1) }),
          whEv(ALICE, "plain", whRecordValue(`at://${BOB}`), { rev: rev(1) })
        ])
        yield* run([ev(BOB, POST, "p", { rev: rev(90), record: { text: "RECORD-BODY-TEXT" } })])
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ webhook_rkey: string; signing_mode: string; secret_id: string | null; row: string }>`
          SELECT webhook_rkey, signing_mode, secret_id, row_to_json(o)::text AS row FROM outbox o ORDER BY webhook_rkey`
        expect(rows.map((r) => [r.webhook_rkey, r.signing_mode, r.secret_id])).toEqual([
          ["inline", "record_secret", null],
          ["managed", "secret_id", "prod-key"],
          ["plain", "none", null]
        ])
        for (const r of rows) {
          expect(r.row).not.toContain("INLINE-SECRET-123")
          expect(r.row).not.toContain("RECORD-BODY-TEXT")
        }
        const fps = new Set(rows.map((r) => JSON.parse(r.row).fingerprint))
        expect(fps.size).toBe(3)
        // the origin key of the target URL is stored for the claim's per-origin room
        for (const r of rows) {
          const row = JSON.parse(r.row)
          expect(row.origin).toBe(Outbox.originKey(row.target_url))
          expect(row.origin).toMatch(/^https?:\/\/[^/]+$/)
        }
        // the body is stored once for the three rows
        const bodies = yield* sql<
          { body: string }
        >`SELECT body FROM delivery_events WHERE body LIKE '%RECORD-BODY-TEXT%'`
        expect(bodies.length).toBe(1)
        expect(Object.keys(JSON.parse(bodies[0]?.body ?? "{}"))).toEqual([
          "cid",
          "collection",
          "did",
          "event",
          "id",
          "record",
          "rkey",
          "timestamp"
        ])
      }))
  })

  it.layer(sqlStack())("transaction boundary", (it) => {
    it.effect("a failing finalize rolls back the rows, the registry writes and the in-memory index", () =>
      Effect.gen(function*() {
        const registry = yield* Registry
        const r = yield* Effect.either(
          run(
            [whEv(ALICE, "tx", whRecordValue(`at://${BOB}`), { rev: rev(1) })],
            Effect.fail(new StoreError({ op: "cursor", code: "test" }))
          )
        )
        expect(r._tag).toBe("Left")
        expect(registry.index.size).toBe(0)
        expect((yield* (yield* RegistryStore).get(ALICE, "tx")).row).toBeUndefined()
        expect(yield* count("webhooks")).toBe(0)
        expect(yield* count("owners")).toBe(0)
        // the same batch then succeeds
        yield* run([whEv(ALICE, "tx", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        expect(registry.index.size).toBe(1)
      }))
  })

  it.scopedLive("a NOTIFY reaches listeners when rows are enqueued", () =>
    Effect.gen(function*() {
      const pg = yield* PgClient.PgClient
      const listener = yield* pg.listen(Outbox.NOTIFY_CHANNEL).pipe(Stream.take(1), Stream.runCollect, Effect.fork)
      yield* Db.listening(Outbox.NOTIFY_CHANNEL)
      yield* run([whEv(ALICE, "n", whRecordValue(`at://${BOB}`), { rev: rev(2) })])
      yield* run([ev(BOB, POST, "notify-me", { rev: rev(99) })])
      const got = yield* Fiber.join(listener).pipe(Effect.timeout("10 seconds"))
      expect(Chunk.size(got)).toBe(1)
    }).pipe(Effect.provide(sqlStack())), { timeout: 30_000 })

  it.layer(sqlStack())("one-statement batch commit", (it) => {
    const cursorOf = (stream: string) =>
      Effect.flatMap(CursorStore.CursorStore, (c) => c.load(stream, "wss://relay.test"))
    const bobPost = `at://${BOB}/${POST}/3kone`
    const batch = [
      ev(ALICE, POST, "one1", { rev: rev(110), record: { text: "x", reply: { parent: { uri: bobPost } } } }),
      ev(BOB, POST, "one2", { rev: rev(111) }),
      ev(ALICE, POST, "one3", { rev: rev(112), record: { text: "plain" } })
    ]
    const withCursor = (cursor: bigint) => ({
      registryWriter: true,
      finalize: Effect.dieMessage("finalize must not run: the statement writes the cursor"),
      cursor: { stream: "direct", relay: "wss://relay.test", cursor }
    })

    it.effect("prior references, bodies, rows, NOTIFY and the cursor commit together, or not at all", () =>
      Effect.gen(function*() {
        yield* run([
          whEv(CAROL, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) }),
          whEv(CAROL, "direct", whRecordValue(`at://${BOB}`), { rev: rev(1) })
        ])
        const rowsBefore = yield* count("outbox")
        const priorBefore = yield* count("prior_refs")
        const processor = yield* Processor
        // a cursor beyond bigint fails the statement: nothing of the batch is written
        const failed = yield* Effect.either(processor.processEvents(batch, withCursor(2n ** 70n)))
        expect(failed._tag).toBe("Left")
        expect(yield* count("outbox")).toBe(rowsBefore)
        expect(yield* count("prior_refs")).toBe(priorBefore)
        expect(yield* cursorOf("direct")).toBeUndefined()
        expect((yield* processor.stats).priorRefKeys).toBe(priorBefore)
        // the same batch commits whole
        const r = yield* processor.processEvents(batch, withCursor(1234n))
        expect(r.outcomes.map((o) => o._tag)).toEqual(["enqueued", "enqueued", "no_match"])
        expect(r.inserted).toBe(3) // one1 by backlink; one2 directly and by backlink
        expect(yield* count("outbox")).toBe(rowsBefore + 3)
        expect(yield* count("prior_refs")).toBe(priorBefore + 1)
        expect(yield* cursorOf("direct")).toBe(1234n)
        expect((yield* processor.stats).priorRefKeys).toBe(priorBefore + 1)
        // a replay inserts nothing new and never lowers the cursor
        const again = yield* processor.processEvents(batch, withCursor(1000n))
        expect(again.inserted).toBe(0)
        expect(again.duplicates).toBe(3)
        expect(yield* cursorOf("direct")).toBe(1234n)
      }))

    it.effect("a batch with a wh record and a registry writer runs in a transaction with its finalize", () =>
      Effect.gen(function*() {
        const processor = yield* Processor
        const saved: Array<bigint> = []
        yield* processor.processEvents([whEv(DAVE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })], {
          registryWriter: true,
          finalize: Effect.sync(() => void saved.push(7n)),
          cursor: { stream: "registry", relay: "wss://relay.test", cursor: 7n }
        })
        expect(saved).toEqual([7n])
        expect(yield* cursorOf("registry")).toBeUndefined()
      }))
  })

  describe("batches that arrive together", () => {
    const commits: Array<number> = []
    const CountingOutbox = Layer.effect(
      Outbox.OutboxStore,
      Effect.map(Outbox.makeSql, (s): Outbox.OutboxStoreShape => ({
        ...s,
        commitBatch: (c) => {
          commits.push(c.cursors.length)
          return s.commitBatch === undefined ? Effect.die("no commitBatch") : s.commitBatch(c)
        }
      }))
    )
    const cursorOf = (stream: string) =>
      Effect.flatMap(CursorStore.CursorStore, (c) => c.load(stream, "wss://relay.test"))
    const bobPost = `at://${BOB}/${POST}/3ktogether`
    const at = (stream: string, cursor: bigint) => ({
      registryWriter: false,
      finalize: Effect.dieMessage("finalize must not run: the statement writes the cursor"),
      cursor: { stream, relay: "wss://relay.test", cursor }
    })
    /**
     * Let the batch just forked reach the processor's queue: `processEvents` offers it without
     * waiting, so once the forked fiber has run (it runs before this fiber resumes) the batch is
     * queued, behind the ones forked before it.
     */
    const queued = Effect.yieldNow()
    /** hold the processor in a transaction until `open`, so that the next batches queue up */
    const holdProcessor = Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const processor = yield* Processor
      const held = yield* Effect.fork(
        processor.processEvents([], { registryWriter: false, finalize: Deferred.await(gate) })
      )
      return { open: Deferred.succeed(gate, undefined).pipe(Effect.zipRight(Fiber.join(held))) }
    })

    it.live("are written by one statement, each seeing what the one before it changed", () =>
      Effect.gen(function*() {
        yield* run([whEv(CAROL, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
        const processor = yield* Processor
        const hold = yield* holdProcessor
        yield* queued
        commits.length = 0
        const create = ev(ALICE, POST, "t1", {
          rev: rev(120),
          record: { text: "x", reply: { parent: { uri: bobPost } } }
        })
        const update = ev(ALICE, POST, "t1", { rev: rev(121), operation: "update", record: { text: "no ref" } })
        const a = yield* Effect.fork(processor.processEvents([create], at("direct", 500n)))
        yield* queued
        const b = yield* Effect.fork(processor.processEvents([update], at("backlink", 600n)))
        yield* queued
        yield* hold.open
        const ra = yield* Fiber.join(a)
        const rb = yield* Fiber.join(b)
        expect(commits).toEqual([2])
        expect(ra.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
        // the update matched through the reference the create (same statement) stored
        expect(rb.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
        expect(yield* cursorOf("direct")).toBe(500n)
        expect(yield* cursorOf("backlink")).toBe(600n)
        // the update removed the stored references
        expect((yield* processor.stats).priorRefKeys).toBe(1) // the wh record's own
      }).pipe(Effect.provide(sqlStack({ outbox: CountingOutbox }))), 30_000)

    it.live(
      "if their statement fails, they are retried one by one: only the failing batch fails",
      () =>
        Effect.gen(function*() {
          yield* run([whEv(CAROL, "d", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
          const processor = yield* Processor
          const hold = yield* holdProcessor
          yield* queued
          commits.length = 0
          const a = yield* Effect.fork(
            processor.processEvents([ev(BOB, POST, "ok1", { rev: rev(130) })], at("direct", 700n))
          )
          yield* queued
          // a cursor beyond bigint: its statement fails
          const b = yield* Effect.fork(
            Effect.either(
              processor.processEvents([ev(BOB, POST, "bad1", { rev: rev(131) })], at("backlink", 2n ** 70n))
            )
          )
          yield* queued
          yield* hold.open
          const ra = yield* Fiber.join(a)
          const rb = yield* Fiber.join(b)
          expect(commits).toEqual([2, 1, 1])
          expect(ra.inserted).toBe(1)
          expect(rb._tag).toBe("Left")
          expect(yield* cursorOf("direct")).toBe(700n)
          expect(yield* cursorOf("backlink")).toBeUndefined()
          const sql = yield* SqlClient.SqlClient
          const rows = yield* sql<
            { event_rkey: string }
          >`SELECT event_rkey FROM outbox WHERE event_rkey IN ('ok1', 'bad1')`
          expect(rows.map((r) => r.event_rkey)).toEqual(["ok1"])
        }).pipe(Effect.provide(sqlStack({ outbox: CountingOutbox }))),
      30_000
    )
  })

  it.layer(sqlStack())("fencing through the SQL store", (it) => {
    it.effect("replays never undo newer state; the registry reloads the same from the database", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "f", whRecordValue(`at://${BOB}`), { rev: rev(5) })])
        yield* run([whEv(ALICE, "f", undefined, { rev: rev(6), operation: "delete" })])
        const replay = yield* run([
          whEv(ALICE, "f", whRecordValue(`at://${BOB}`), { rev: rev(5), timeUs: 1_900_000_000_000_000 })
        ])
        expect(replay.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
        yield* run([whEv(ALICE, "g", whRecordValue(`at://${BOB}`, { events: ["create"] }), { rev: rev(5) })])
        const store = yield* RegistryStore
        expect((yield* store.get(ALICE, "f")).row).toBeUndefined()
        expect((yield* store.get(ALICE, "f")).tombstone?.rev).toBe(rev(6))
        const g = (yield* store.get(ALICE, "g")).row
        expect(g?.events).toEqual(["create"])
        expect(g?.active).toBe(true)
        expect(Option.isSome(Option.fromNullable(g?.fingerprint))).toBe(true)
        const loaded = yield* store.loadActive(10)
        expect(loaded.map((r) => r.rkey)).toEqual(["g"])
      }))
  })
})
