/**
 * The prior-reference table's bound within one batch (SPEC §2.4: "when the table is full, new keys
 * are refused … while existing keys stay updatable"). A batch is checked against the rows the table
 * will hold once it is written: a row the batch removed (a delete, or an update that drops its
 * references) makes room for a new key later in the same batch, as it would in the next batch; a
 * key written, cleared and written again counts once; and a removed key written again takes its
 * place back, so the bound is never exceeded. On the in-memory store and on PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, type Layer, Ref } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import type { PriorRefLimits } from "../../src/services/matching/PriorRefIndex.js"
import { PriorRefsStore } from "../../src/services/matching/PriorRefsStore.js"
import { make as makeProcessor } from "../../src/services/matching/Processor.js"
import type { FirehookConfig } from "../../src/services/platform/Config.js"
import type { Tx } from "../../src/services/platform/Persistence.js"
import type { Registry } from "../../src/services/registry/Registry.js"
import { ev, memoryStack, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const LIKE = "app.bsky.feed.like"
const bobPost = `at://${BOB}/app.bsky.feed.post/3kbobpost`
const likeOf = (uri: string) => ({ $type: LIKE, subject: { uri, cid: "bafyx" }, createdAt: "2026-01-01T00:00:00Z" })
const uriOf = (rkey: string) => `at://${ALICE}/${LIKE}/${rkey}`
const like = (rkey: string, n: number) => ev(ALICE, LIKE, rkey, { rev: rev(n), record: likeOf(bobPost) })
const unlike = (rkey: string, n: number) => ev(ALICE, LIKE, rkey, { rev: rev(n), operation: "delete" })
const unreferenced = (rkey: string, n: number) =>
  ev(ALICE, LIKE, rkey, { rev: rev(n), operation: "update", record: { text: "no reference" } })

const limits = (maxRows: number): PriorRefLimits => ({ maxRefs: 100, maxBytes: 32 * 1024, ttlSeconds: 3600, maxRows })

/** the number of deliveries to BOB's backlink webhook for one of ALICE's records */
const deliveries = (rkey: string) =>
  Effect.gen(function*() {
    const sql = yield* Effect.serviceOption(SqlClient.SqlClient)
    if (sql._tag === "Some") {
      const rows = yield* sql.value<{ n: number }>`
        SELECT count(*)::int AS n FROM outbox WHERE owner_did = ${BOB} AND webhook_rkey = 'bl' AND event_rkey = ${rkey}`
        .pipe(Effect.orDie)
      return rows[0]?.n ?? 0
    }
    const state = yield* Effect.serviceOption(Outbox.MemoryOutboxState)
    if (state._tag === "None") return yield* Effect.dieMessage("no outbox to look at")
    let n = 0
    for (const r of (yield* Ref.get(state.value)).rows.values()) {
      if (r.ownerDid === BOB && r.webhookRkey === "bl" && r.eventRkey === rkey) n++
    }
    return n
  })

const stored = (rkey: string) =>
  Effect.flatMap(PriorRefsStore, (s) => s.read([uriOf(rkey)])).pipe(Effect.map((m) => m.get(uriOf(rkey))))
const rows = Effect.flatMap(PriorRefsStore, (s) => s.count)

/**
 * A processor with a table bound of `maxRows` and Bob's backlink webhook (its record's own scope
 * reference takes one row); `run` processes a batch, `check` compares the refusals, the table's
 * rows and the key index.
 */
const setup = (maxRows: number) =>
  Effect.gen(function*() {
    const p = yield* makeProcessor(limits(maxRows))
    const run = (batch: ReadonlyArray<StreamEvent>) => p.processEvents(batch, { registryWriter: true })
    const check = (refused: number, n: number) =>
      Effect.gen(function*() {
        expect(yield* p.stats).toMatchObject({ priorRefsRefused: refused, priorRefKeys: n })
        expect(yield* rows).toBe(n)
      })
    yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
    return { run, check }
  })

/** what `setup` needs of a stack */
type Stack = Layer.Layer<FirehookConfig | Outbox.OutboxStore | PriorRefsStore | Registry | Tx, unknown>

const scenarios = (name: string, stack: () => Stack) =>
  describe(`${name}: the table's bound within one batch`, () => {
    for (const together of [false, true]) {
      it.scoped(
        `a delete frees its row for a new key (${together ? "in the same batch" : "control: in the next batch"})`,
        () =>
          Effect.gen(function*() {
            const { check, run } = yield* setup(2)
            yield* run([like("r1", 10)])
            yield* check(0, 2)
            if (together) yield* run([unlike("r1", 11), like("r2", 12)])
            else {
              yield* run([unlike("r1", 11)])
              yield* run([like("r2", 12)])
            }
            expect(yield* stored("r1")).toBeUndefined()
            expect(yield* stored("r2")).toMatchObject({ refs: [bobPost], live: true })
            yield* check(0, 2)
            // so the unlike of r2 still reaches Bob's backlink webhook
            yield* run([unlike("r2", 13)])
            expect(yield* deliveries("r2")).toBe(2)
            yield* check(0, 1)
          }).pipe(Effect.provide(stack()))
      )
    }

    it.scoped("an update that drops its references frees its row for a new key in the same batch", () =>
      Effect.gen(function*() {
        const { check, run } = yield* setup(2)
        yield* run([like("r1", 10)])
        yield* run([unreferenced("r1", 11), like("r2", 12)])
        expect(yield* stored("r1")).toBeUndefined()
        expect(yield* stored("r2")).toMatchObject({ refs: [bobPost], live: true })
        yield* check(0, 2)
      }).pipe(Effect.provide(stack())))

    it.scoped("a new key written, cleared and written again in one batch counts once", () =>
      Effect.gen(function*() {
        const { check, run } = yield* setup(3)
        yield* run([like("r1", 10), unreferenced("r1", 11), like("r1", 12), like("r2", 13)])
        expect(yield* stored("r1")).toMatchObject({ rev: rev(12), refs: [bobPost] })
        expect(yield* stored("r2")).toMatchObject({ refs: [bobPost] })
        yield* check(0, 3)
        // now full: the next new key is refused, an existing one stays updatable
        yield* run([
          like("r3", 14),
          ev(ALICE, LIKE, "r1", { rev: rev(15), operation: "update", record: likeOf(bobPost) })
        ])
        expect(yield* stored("r3")).toBeUndefined()
        expect(yield* stored("r1")).toMatchObject({ rev: rev(15) })
        yield* check(1, 3)
      }).pipe(Effect.provide(stack())))

    it.scoped("a stored key the batch removed takes its place back when written again: the bound holds", () =>
      Effect.gen(function*() {
        const { check, run } = yield* setup(2)
        yield* run([like("r1", 10)])
        // r2 takes the place r1 freed; r1 created again is then a new key of a full table
        yield* run([unlike("r1", 11), like("r2", 12), like("r1", 13)])
        expect(yield* stored("r1")).toBeUndefined()
        expect(yield* stored("r2")).toMatchObject({ refs: [bobPost] })
        yield* check(1, 2)
        // removed and written again with nothing in between: its own place, not refused
        yield* run([unlike("r2", 14), like("r2", 15)])
        expect(yield* stored("r2")).toMatchObject({ rev: rev(15), refs: [bobPost] })
        yield* check(1, 2)
      }).pipe(Effect.provide(stack())))
  })

scenarios("in memory", () => memoryStack())
scenarios("PostgreSQL", () => sqlStack())
