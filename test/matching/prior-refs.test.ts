/**
 * Prior references a batch at a time (SPEC §2.4): the processor reads a batch's stored rows in one
 * statement, applies the batch's puts and removes in order in memory, and writes each key's final
 * state in one statement. Several events of one batch touching the same key must behave exactly
 * as one statement per event did: on the in-memory store and on PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, type Layer, Ref } from "effect"
import type { RecordEvent, StreamEvent } from "../../src/schemas/RecordEvent.js"
import { eventId } from "../../src/services/matching/Canonical.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { PriorRefsStore } from "../../src/services/matching/PriorRefsStore.js"
import { type ProcessOptions, Processor } from "../../src/services/matching/Processor.js"
import { ev, memoryStack, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const bobPost = `at://${BOB}/${POST}/3kbobpost`
const bobPost2 = `at://${BOB}/${POST}/3kbobpost2`
const likeOf = (uri: string) => ({ $type: LIKE, subject: { uri, cid: "bafyx" }, createdAt: "2026-01-01T00:00:00Z" })
const uriOf = (collection: string, rkey: string) => `at://${ALICE}/${collection}/${rkey}`

const W = { registryWriter: true } satisfies ProcessOptions
const run = (batch: ReadonlyArray<StreamEvent>) => Effect.flatMap(Processor, (p) => p.processEvents(batch, W))

/** the event ids delivered to BOB's backlink webhook for one of ALICE's records (sorted) */
const deliveries = (rkey: string) =>
  Effect.gen(function*() {
    const sql = yield* Effect.serviceOption(SqlClient.SqlClient)
    if (sql._tag === "Some") {
      const rows = yield* sql.value<{ event_id: string }>`
        SELECT event_id FROM outbox WHERE owner_did = ${BOB} AND webhook_rkey = 'bl' AND event_rkey = ${rkey}`.pipe(
        Effect.orDie
      )
      return rows.map((r) => r.event_id).sort()
    }
    const state = yield* Effect.serviceOption(Outbox.MemoryOutboxState)
    if (state._tag === "None") return yield* Effect.dieMessage("no outbox to look at")
    const s = yield* Ref.get(state.value)
    const out: Array<string> = []
    for (const r of s.rows.values()) {
      if (r.ownerDid === BOB && r.webhookRkey === "bl" && r.eventRkey === rkey) out.push(r.eventId)
    }
    return out.sort()
  })
const ids = (events: ReadonlyArray<RecordEvent>) => events.map((e) => eventId(e)).sort()

const stored = (uri: string) => Effect.flatMap(PriorRefsStore, (s) => s.read([uri])).pipe(Effect.map((m) => m.get(uri)))

const scenarios = (name: string, stack: () => Layer.Layer<Processor | PriorRefsStore, unknown>) =>
  describe(`${name}: several events of one batch on the same key`, () => {
    it.effect("create, update without the reference, update with another, update without, delete", () =>
      Effect.gen(function*() {
        yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
        const batch = [
          ev(ALICE, LIKE, "r1", { rev: rev(10), record: likeOf(bobPost) }),
          ev(ALICE, LIKE, "r2", { rev: rev(10), record: likeOf(bobPost) }),
          ev(ALICE, LIKE, "r1", { rev: rev(11), operation: "update", record: { text: "no ref" } }),
          ev(ALICE, LIKE, "r2", { rev: rev(11), operation: "delete" }),
          ev(ALICE, LIKE, "r1", { rev: rev(12), operation: "update", record: likeOf(bobPost2) }),
          ev(ALICE, LIKE, "r1", { rev: rev(13), operation: "update", record: { text: "no ref" } }),
          ev(ALICE, LIKE, "r1", { rev: rev(14), operation: "delete" })
        ] as const
        yield* run(batch)
        // every event but the last delete (its references were cleared by the update before it)
        expect(yield* deliveries("r1")).toEqual(ids([batch[0], batch[2], batch[4], batch[5]]))
        expect(yield* deliveries("r2")).toEqual(ids([batch[1], batch[3]]))
        expect(yield* stored(uriOf(LIKE, "r1"))).toBeUndefined()
        expect(yield* stored(uriOf(LIKE, "r2"))).toBeUndefined()
        // only the wh record's own references remain in the key index
        expect((yield* (yield* Processor).stats).priorRefKeys).toBe(1)
        yield* run([ev(ALICE, LIKE, "r1", { rev: rev(15), operation: "update", record: { text: "x" } })])
        expect((yield* deliveries("r1")).length).toBe(4)
      }).pipe(Effect.provide(stack())))

    it.effect("a stored key: a stale replay, a delete and a re-create in one batch; the next batch sees the re-creation", () =>
      Effect.gen(function*() {
        yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
        const first = ev(ALICE, POST, "r3", { rev: rev(20), record: { text: "x", r: bobPost } })
        yield* run([first])
        const batch = [
          // older than the stored row: matches on its own references only, writes nothing
          ev(ALICE, POST, "r3", { rev: rev(19), operation: "update", record: { text: "old", r: bobPost2 } }),
          ev(ALICE, POST, "r3", { rev: rev(21), operation: "delete" }),
          ev(ALICE, POST, "r3", { rev: rev(22), record: { text: "again", r: bobPost2 } })
        ]
        yield* run(batch)
        const row = yield* stored(uriOf(POST, "r3"))
        expect(row).toMatchObject({ rev: rev(22), refs: [bobPost2], live: true })
        const last = ev(ALICE, POST, "r3", { rev: rev(23), operation: "update", record: { text: "none" } })
        yield* run([last])
        expect(yield* deliveries("r3")).toEqual(ids([first, ...batch, last]))
        expect(yield* stored(uriOf(POST, "r3"))).toBeUndefined()
        expect((yield* (yield* Processor).stats).priorRefKeys).toBe(1)
      }).pipe(Effect.provide(stack())))

    it.effect("a stored key removed, then written at a rev older than the stored row's: the write lands, as one event a batch", () =>
      Effect.gen(function*() {
        yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
        yield* run([ev(ALICE, POST, "r7", { rev: rev(60), record: { r: bobPost } })])
        // the delete removes the row; the (older) create then finds none and is stored
        yield* run([
          ev(ALICE, POST, "r7", { rev: rev(61), operation: "delete" }),
          ev(ALICE, POST, "r7", { rev: rev(59), record: { r: bobPost2 } })
        ])
        expect(yield* stored(uriOf(POST, "r7"))).toMatchObject({ rev: rev(59), refs: [bobPost2], live: true })
      }).pipe(Effect.provide(stack())))

    it.effect("a replayed older update or delete never matches on the references of a newer stored version", () =>
      Effect.gen(function*() {
        yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
        const created = ev(ALICE, POST, "r9", { rev: rev(70), record: { text: "x" } })
        const unrelated = ev(ALICE, POST, "r9", { rev: rev(71), operation: "update", record: { text: "y" } })
        const referencing = ev(ALICE, POST, "r9", { rev: rev(72), operation: "update", record: { r: bobPost } })
        yield* run([created, unrelated, referencing])
        expect(yield* deliveries("r9")).toEqual(ids([referencing]))
        // the stream rewinds: the version at rev 71 never referenced Bob, so it delivers nothing now
        yield* run([unrelated])
        expect(yield* deliveries("r9")).toEqual(ids([referencing]))
        // a record without references deleted, then created again with one: a replay of the delete
        // (which matched nothing) is older than the stored row
        const plain = ev(ALICE, POST, "r10", { rev: rev(80), record: { text: "x" } })
        const deleted = ev(ALICE, POST, "r10", { rev: rev(81), operation: "delete" })
        const again = ev(ALICE, POST, "r10", { rev: rev(82), record: { r: bobPost2 } })
        yield* run([plain, deleted, again])
        expect(yield* deliveries("r10")).toEqual(ids([again]))
        yield* run([deleted])
        expect(yield* deliveries("r10")).toEqual(ids([again]))
      }).pipe(Effect.provide(stack())))

    it.effect("too-complex updates: never a backlink match on stored references; a newer one clears them, a stale one does not", () =>
      Effect.gen(function*() {
        yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
        let deep: Record<string, unknown> = { r: bobPost2 }
        for (let i = 0; i < 40; i++) deep = { nested: deep }
        const first = ev(ALICE, POST, "r6", { rev: rev(50), record: { r: bobPost } })
        yield* run([first])
        const batch1 = [
          // older than the stored row: no backlink match, and the row stays
          ev(ALICE, POST, "r6", { rev: rev(49), operation: "update", record: deep }),
          ev(ALICE, POST, "r6", { rev: rev(51), operation: "delete" })
        ] as const
        yield* run(batch1)
        expect(yield* deliveries("r6")).toEqual(ids([first, batch1[1]]))
        const batch2 = [
          ev(ALICE, POST, "r6", { rev: rev(52), record: { r: bobPost } }),
          // newer: no backlink match, and its (empty) references clear the row
          ev(ALICE, POST, "r6", { rev: rev(53), operation: "update", record: deep }),
          ev(ALICE, POST, "r6", { rev: rev(54), operation: "delete" })
        ] as const
        yield* run(batch2)
        expect(yield* deliveries("r6")).toEqual(ids([first, batch1[1], batch2[0]]))
        expect(yield* stored(uriOf(POST, "r6"))).toBeUndefined()
        expect((yield* (yield* Processor).stats).priorRefKeys).toBe(1)
        expect((yield* (yield* Processor).stats).tooComplex).toBe(2)
      }).pipe(Effect.provide(stack())))
  })

scenarios("in memory", () => memoryStack())
scenarios("PostgreSQL", () => sqlStack())

describe("PostgreSQL: expired rows count as absent", () => {
  const expire = (uri: string, to: string) =>
    Effect.flatMap(
      SqlClient.SqlClient,
      (sql) =>
        sql`UPDATE prior_refs SET expires_at = now() - interval '1 second', rev = ${to} WHERE record_uri = ${uri}`.pipe(
          Effect.orDie
        )
    )

  it.effect("an expired row matches nothing, is removed by any rev, and is overwritten by any rev", () =>
    Effect.gen(function*() {
      yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
      const created = ev(ALICE, POST, "r4", { rev: rev(30), record: { r: bobPost } })
      yield* run([created, ev(ALICE, POST, "r5", { rev: rev(40), record: { r: bobPost } })])
      // expired, and with a rev newer than the events below
      yield* expire(uriOf(POST, "r4"), rev(99))
      yield* expire(uriOf(POST, "r5"), rev(99))
      yield* run([
        ev(ALICE, POST, "r4", { rev: rev(31), operation: "update", record: { text: "no ref" } }),
        ev(ALICE, POST, "r5", { rev: rev(41), operation: "update", record: { r: bobPost2 } })
      ])
      expect(yield* deliveries("r4")).toEqual(ids([created]))
      expect(yield* stored(uriOf(POST, "r4"))).toBeUndefined()
      expect(yield* stored(uriOf(POST, "r5"))).toMatchObject({ rev: rev(41), refs: [bobPost2], live: true })
    }).pipe(Effect.provide(sqlStack())))
})
