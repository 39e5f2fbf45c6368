/**
 * The outbox row of an event matched again by a new version of its webhook (another fingerprint:
 * the direct stream read the event before the registry stream read the webhook's new URL, and the
 * registration replay matched it again), on real PostgreSQL: the delivery id is the same (event +
 * owner + rkey), so the row is moved to the new version, pending and due now, when nothing of it was
 * tried (pending with no attempt, or cancelled `subscription_changed` whatever its fingerprint: a
 * webhook back at the row's version is revived), and counted as inserted; a row attempted, leased,
 * delivered, dead-lettered or cancelled for another reason is kept (a leased untried row keeps its
 * version and lease but is marked `moved_to`: test/matching/outbox-move-leased.test.ts). Through
 * each statement that writes rows (`insertRows`, `insertBatch`, `commitBatch`), and in memory.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Ref } from "effect"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as Db from "../support/db.js"
import { plc } from "../support/stack.js"

const OWNER = plc(1)
const OLD_URL = "https://old.example/hook"
const NEW_URL = "https://new.example:8443/hook"

const row = (id: string, fingerprint: string, targetUrl: string): Outbox.OutboxRow => ({
  deliveryId: id,
  eventId: `ev-${id}`,
  ownerDid: OWNER,
  webhookRkey: "w1",
  matchKind: "direct",
  eventDid: plc(2),
  eventCollection: "app.bsky.feed.post",
  eventRkey: "p1",
  eventOperation: "create",
  targetUrl,
  signingMode: "none",
  secretId: undefined,
  fingerprint
})
const oldRow = (id: string) => row(id, "fp-old", OLD_URL)
/** the new version: another URL, signing and secret */
const newRow = (id: string): Outbox.OutboxRow => ({
  ...row(id, "fp-new", NEW_URL),
  signingMode: "secret_id",
  secretId: "s1"
})
const body = (id: string): Outbox.EventBody => ({ eventId: `ev-${id}`, body: "{}", sha256: "sha" })

interface Stored {
  readonly target_url: string
  readonly fingerprint: string
  readonly signing_mode: string
  readonly secret_id: string | null
  readonly origin: string | null
  readonly status: string
  readonly attempt_count: number
  readonly last_error_kind: string | null
  readonly finished: boolean
  readonly due: boolean
}

const stored = (id: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<Stored>`SELECT target_url, fingerprint, signing_mode, secret_id, origin, status, attempt_count,
        last_error_kind, finished_at IS NOT NULL AS finished, next_attempt_at <= now() AS due
      FROM outbox WHERE delivery_id = ${id}`.pipe(Effect.map((r) => r[0]))
  )

/** set the stored row's delivery state (as the workers would have left it) */
const setState = (id: string, set: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(`UPDATE outbox SET ${set} WHERE delivery_id = $1`, [id]))

const store = Effect.flatMap(Outbox.OutboxStore, Effect.succeed)

const moved = {
  target_url: NEW_URL,
  fingerprint: "fp-new",
  signing_mode: "secret_id",
  secret_id: "s1",
  origin: Outbox.originKey(NEW_URL),
  status: "pending",
  last_error_kind: null,
  finished: false,
  due: true
}

describe("outbox: an event matched again by a new version of its webhook", () => {
  it.layer(Outbox.layerSql.pipe(Layer.provideMerge(Db.layer())))("PostgreSQL", (it) => {
    it.effect("an untried pending row is moved to the new version and counts as inserted (insertRows)", () =>
      Effect.gen(function*() {
        const s = yield* store
        expect(yield* s.insertRows([oldRow("a")])).toBe(1)
        yield* setState("a", "next_attempt_at = now() + interval '1 hour'") // deferred (owner scanning)
        expect(yield* s.insertRows([oldRow("a")])).toBe(0) // same version: a duplicate
        expect((yield* stored("a"))?.target_url).toBe(OLD_URL)
        expect(yield* s.insertRows([newRow("a")])).toBe(1)
        expect(yield* stored("a")).toMatchObject({ ...moved, attempt_count: 0 })
        expect(yield* s.insertRows([newRow("a")])).toBe(0)
      }))

    it.effect("a row cancelled subscription_changed is pending again for the new version (insertBatch)", () =>
      Effect.gen(function*() {
        const s = yield* store
        yield* s.insertBatch([body("b")], [oldRow("b")])
        yield* setState(
          "b",
          "status = 'cancelled', last_error_kind = 'subscription_changed', finished_at = now(), last_http_status = NULL"
        )
        const r = yield* s.insertBatch([body("b")], [newRow("b")])
        expect(r.inserted).toBe(1)
        expect(yield* stored("b")).toMatchObject(moved)
      }))

    it.effect("a row cancelled subscription_changed is revived for the version it already has (insertRows)", () =>
      Effect.gen(function*() {
        const s = yield* store
        // the webhook went back to the row's version (URL1 → URL2 → URL1, or paused then resumed):
        // the row was cancelled at the middle version, its fingerprint is the current one again
        yield* s.insertRows([oldRow("r")])
        yield* setState(
          "r",
          "status = 'cancelled', last_error_kind = 'subscription_changed', finished_at = now(), crash_count = 1"
        )
        expect(yield* s.insertRows([oldRow("r")])).toBe(1)
        expect(yield* stored("r")).toMatchObject({
          target_url: OLD_URL,
          fingerprint: "fp-old",
          origin: Outbox.originKey(OLD_URL),
          status: "pending",
          attempt_count: 0,
          last_error_kind: null,
          finished: false,
          due: true
        })
        // pending again with the same version: a duplicate, not moved again
        yield* setState("r", "next_attempt_at = now() + interval '1 hour'")
        expect(yield* s.insertRows([oldRow("r")])).toBe(0)
        expect((yield* stored("r"))?.due).toBe(false)
      }))

    it.effect("in one statement, moved rows are in insertedIds; a delivery id given twice keeps the last", () =>
      Effect.gen(function*() {
        const s = yield* store
        const commit = s.commitBatch
        if (commit === undefined) return yield* Effect.dieMessage("the SQL store commits in one statement")
        const empty = { prior: undefined, corruption: [], quarantine: [], cursors: [] }
        yield* commit({ ...empty, bodies: [body("c")], rows: [oldRow("c")] })
        const r = yield* commit({
          ...empty,
          bodies: [body("c"), body("d")],
          rows: [newRow("c"), oldRow("d"), newRow("d")]
        })
        expect(r.inserted).toBe(2)
        expect([...r.insertedIds].sort()).toEqual(["c", "d"])
        expect(yield* stored("c")).toMatchObject(moved)
        expect(yield* stored("d")).toMatchObject(moved)
      }))

    it.effect("a row tried or finished otherwise is kept as it is, a duplicate", () =>
      Effect.gen(function*() {
        const s = yield* store
        const states: ReadonlyArray<readonly [string, string]> = [
          ["attempted", "attempt_count = 1, next_attempt_at = now() + interval '1 hour'"],
          ["leased", "status = 'leased', lease_token = 't', leased_until = now() + interval '1 minute'"],
          ["delivered", "status = 'delivered', attempt_count = 1, finished_at = now()"],
          ["dead", "status = 'dead_letter', last_error_kind = 'webhook_disabled', finished_at = now()"],
          ["cancelled-other", "status = 'cancelled', last_error_kind = 'webhook_disabled', finished_at = now()"],
          ["cancelled-tried", "status = 'cancelled', attempt_count = 2, last_error_kind = 'subscription_changed'"]
        ]
        for (const [id, set] of states) {
          yield* s.insertRows([oldRow(id)])
          yield* setState(id, set)
        }
        const before = yield* Effect.forEach(states, ([id]) => stored(id))
        expect(yield* s.insertRows(states.map(([id]) => newRow(id)))).toBe(0)
        expect(yield* Effect.forEach(states, ([id]) => stored(id))).toEqual(before)
        for (const r of before) expect(r?.fingerprint).toBe("fp-old")
      }))
  })

  it.effect("in memory, a row of another version is replaced and counts once", () =>
    Effect.gen(function*() {
      const s = yield* Outbox.OutboxStore
      const state = yield* Outbox.MemoryOutboxState
      expect(yield* s.insertRows([oldRow("m")])).toBe(1)
      expect(yield* s.insertRows([oldRow("m")])).toBe(0)
      expect((yield* s.insertBatch([body("m")], [newRow("m"), newRow("m")])).inserted).toBe(1)
      expect((yield* Ref.get(state)).rows.get("m")).toEqual(newRow("m"))
    }).pipe(Effect.provide(Outbox.layerMemory)))
})
