/**
 * What a batch writes besides its outbox rows, on real PostgreSQL (SPEC §3.3, §3.5): the quarantine
 * rows of corrupt and oversized events (in a transaction and in one statement), none for a replay,
 * the batch's quarantine count, and the NOTIFY only when a row was inserted.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Deferred, Effect, Fiber, Stream } from "effect"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { buildPayload } from "../../src/services/matching/Canonical.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { type ProcessOptions, Processor } from "../../src/services/matching/Processor.js"
import * as Db from "../support/db.js"
import { seriesValue } from "../support/metricSeries.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"

const W = { registryWriter: true } satisfies ProcessOptions
/** a finalize without cursor data: the batch runs in a transaction (separate statements) */
const inTransaction = { registryWriter: true, finalize: Effect.void } satisfies ProcessOptions

const run = (batch: ReadonlyArray<RecordEvent>, options: ProcessOptions = W) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, options))

const quarantineRows = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<{ reason: string; stream: string; relay: string; cursor: string | null }>`
    SELECT reason, stream, relay, cursor::text AS cursor FROM quarantine ORDER BY id`
)

/** the count of `firehook_events_quarantined_total{reason}` (served on /metrics, SPEC §6.2) */
const quarantinedMetric = (reason: string) => seriesValue("firehook_events_quarantined_total", { reason })

/** store the event's id with another body, so that enqueueing it is corruption */
const corruptBodyOf = (e: RecordEvent) =>
  Effect.gen(function*() {
    const payload = buildPayload(e, e.record)
    if (payload._tag === "Left") return yield* Effect.dieMessage("payload")
    const sql = yield* SqlClient.SqlClient
    yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256)
      VALUES (${payload.right.eventId}, '{}', 'not-the-hash')`
  })

describe("quarantine rows", () => {
  it.layer(sqlStack())("corruption and oversized events", (it) => {
    it.effect("in a transaction, a corrupt event's quarantine row is written with its cursor", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "c", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        const e = ev(BOB, POST, "tx-corrupt", { rev: rev(10), timeUs: 1_700_000_000_200_001, stream: "direct" })
        yield* corruptBodyOf(e)
        const counted = yield* quarantinedMetric("corruption")
        const r = yield* run([e], inTransaction)
        expect((yield* quarantinedMetric("corruption")) - counted).toBe(1)
        expect(r.outcomes[0]).toMatchObject({ _tag: "quarantined", reason: "corruption" })
        expect(r.quarantined).toBe(1)
        expect(r.inserted).toBe(0)
        expect(yield* quarantineRows).toEqual([
          { reason: "corruption", stream: "direct", relay: "wss://relay.test", cursor: "1700000000200001" }
        ])
      }))

    it.effect("in one statement, an oversized event's quarantine row keeps its cursor and counts in the result", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM quarantine`
        yield* run([whEv(ALICE, "big", whRecordValue(`at://${BOB}`), { rev: rev(2) })])
        const counted = yield* quarantinedMetric("payload_too_large")
        const r = yield* run([
          ev(BOB, POST, "small", { rev: rev(20), timeUs: 1_700_000_000_300_001, stream: "direct" }),
          ev(BOB, POST, "huge", {
            rev: rev(21),
            timeUs: 1_700_000_000_300_002,
            stream: "direct",
            record: { text: "x".repeat(600 * 1024) }
          })
        ])
        expect(r.outcomes.map((o) => o._tag)).toEqual(["enqueued", "quarantined"])
        expect(r.quarantined).toBe(1)
        expect((yield* quarantinedMetric("payload_too_large")) - counted).toBe(1)
        expect(yield* quarantineRows).toEqual([
          { reason: "payload_too_large", stream: "direct", relay: "wss://relay.test", cursor: "1700000000300002" }
        ])
      }))
  })

  it.layer(sqlStack())("bodies over one chunk", (it) => {
    it.effect("bodies written in several chunks: a corrupt event is still detected, quarantined, and gets no rows", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        // nine bodies of ~480 KiB: more than one 4 MiB chunk, so the bodies go in separate inserts
        const batch = Array.from({ length: 9 }, (_, i) =>
          ev(BOB, POST, `big${i}`, {
            rev: rev(60 + i),
            timeUs: 1_700_000_000_600_001 + i,
            stream: "direct",
            record: { text: `${i}`.repeat(480 * 1024) }
          }))
        const corrupt = batch[4]
        if (corrupt === undefined) return yield* Effect.dieMessage("batch")
        yield* corruptBodyOf(corrupt)
        const r = yield* run(batch)
        expect(r.outcomes.map((o) => o._tag)).toEqual([
          "enqueued",
          "enqueued",
          "enqueued",
          "enqueued",
          "quarantined",
          "enqueued",
          "enqueued",
          "enqueued",
          "enqueued"
        ])
        expect(r.outcomes[4]).toMatchObject({ reason: "corruption" })
        expect(r.inserted).toBe(8)
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ event_rkey: string }>`SELECT event_rkey FROM outbox ORDER BY event_rkey`
        expect(rows.map((x) => x.event_rkey)).toEqual(["big0", "big1", "big2", "big3", "big5", "big6", "big7", "big8"])
        expect(yield* quarantineRows).toEqual([
          { reason: "corruption", stream: "direct", relay: "wss://relay.test", cursor: "1700000000600005" }
        ])
      }))
  })

  it.layer(sqlStack())("no corruption", (it) => {
    it.effect("a batch and its replay, in one statement or in a transaction, quarantine nothing", () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        const batch = [
          ev(BOB, POST, "r1", { rev: rev(30), timeUs: 1_700_000_000_400_001 }),
          ev(BOB, POST, "r2", { rev: rev(31), timeUs: 1_700_000_000_400_002 })
        ]
        const first = yield* run(batch)
        expect(first.inserted).toBe(2)
        const replay = yield* run(batch)
        expect(replay).toMatchObject({ inserted: 0, duplicates: 2, quarantined: 0 })
        const again = yield* run(batch, inTransaction)
        expect(again).toMatchObject({ inserted: 0, duplicates: 2, quarantined: 0 })
        expect(replay.outcomes.map((o) => o._tag)).toEqual(["enqueued", "enqueued"])
        expect(yield* quarantineRows).toEqual([])
      }))
  })
})

describe("NOTIFY (SPEC §4.1)", () => {
  it.effect("a batch that inserts no outbox row (a replay) sends no NOTIFY", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "n", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      const batch = [ev(BOB, POST, "once", { rev: rev(40), timeUs: 1_700_000_000_500_001 })]
      expect((yield* run(batch)).inserted).toBe(1)
      const pg = yield* PgClient.PgClient
      const sql = yield* SqlClient.SqlClient
      const listener = yield* pg.listen(Outbox.NOTIFY_CHANNEL).pipe(Stream.take(1), Stream.runCollect, Effect.fork)
      yield* Db.listening(Outbox.NOTIFY_CHANNEL)
      // the replay, in one statement and in a transaction, then a marker: notifications arrive in
      // commit order, so the marker is the first one only if the replays sent none
      expect((yield* run(batch)).inserted).toBe(0)
      expect((yield* run(batch, inTransaction)).inserted).toBe(0)
      yield* sql`SELECT pg_notify(${Outbox.NOTIFY_CHANNEL}, 'marker')`
      const got = yield* Fiber.join(listener)
      expect(Chunk.toReadonlyArray(got)).toEqual(["marker"])
    }).pipe(Effect.scoped, Effect.provide(sqlStack())), 30_000)
})

describe("a transaction batch queued ahead of one-statement batches", () => {
  it.effect(
    "is committed on its own, with its finalize; the one-statement batch behind it commits its cursor",
    () =>
      Effect.gen(function*() {
        const processor = yield* Processor
        // hold the worker in a transaction until `gate` opens, so that the next two batches queue up
        const gate = yield* Deferred.make<void>()
        const held = yield* Effect.fork(
          processor.processEvents([], { registryWriter: false, finalize: Deferred.await(gate) })
        )
        const finalized: Array<string> = []
        // a registration from the registry stream: registry rows, so a transaction with its finalize
        const registration = yield* Effect.fork(
          processor.processEvents([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })], {
            registryWriter: true,
            finalize: Effect.sync(() => void finalized.push("registry")),
            cursor: { stream: "registry", relay: "wss://relay.test", cursor: 7n }
          })
        )
        yield* Effect.yieldNow()
        const direct = yield* Effect.fork(
          processor.processEvents([ev(BOB, POST, "behind", { rev: rev(50), stream: "direct" })], {
            registryWriter: false,
            finalize: Effect.dieMessage("finalize must not run: the statement writes the cursor"),
            cursor: { stream: "direct", relay: "wss://relay.test", cursor: 900n }
          })
        )
        yield* Effect.yieldNow()
        yield* Deferred.succeed(gate, undefined)
        yield* Fiber.join(held)
        const r = yield* Fiber.join(registration)
        expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "active" } })
        expect(finalized).toEqual(["registry"])
        const d = yield* Fiber.join(direct)
        // the registration committed first: the event behind it matched the new webhook
        expect(d.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
        const cursors = yield* CursorStore.CursorStore
        expect(yield* cursors.load("direct", "wss://relay.test")).toBe(900n)
        expect(yield* cursors.load("registry", "wss://relay.test")).toBeUndefined()
      }).pipe(Effect.provide(sqlStack())),
    30_000
  )
})
