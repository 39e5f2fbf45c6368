/**
 * The outbox move of a row a worker holds untried, on real PostgreSQL (migration 0018,
 * `outbox.moved_to`). The registration replay matches an event with a new version of its webhook
 * while the old version's row is leased (claimed, no attempt yet): the move keeps the row's status,
 * lease and version (the worker holds it) and writes the new version to `moved_to` only, counting
 * nothing. The worker's screen then sees the new version and cancels the row
 * `subscription_changed`; that settle applies the move instead: the new version's fields, pending,
 * due now, not terminal (no audit row, no attempt), answered as not applied (no `cancelled` is
 * published), and the workers are woken. Before, the row was cancelled and the new version never
 * got the event. Any other settle clears `moved_to`, except a deferral without an attempt (an owner
 * `scanning` defers before the screen compares versions), which keeps it for the next screen.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Effect, Fiber, Layer, Stream, TestServices } from "effect"
import { DeliveryStore, layerSql as deliveryLayerSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as Db from "../support/db.js"
import { plc } from "../support/stack.js"

const OLD_URL = "https://old.example/hook"
const NEW_URL = "https://new.example:8443/hook"

const row = (id: string, fingerprint: string, targetUrl: string): Outbox.OutboxRow => ({
  deliveryId: id,
  eventId: `ev-${id}`,
  ownerDid: plc(1),
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
const v1 = (id: string) => row(id, "fp-v1", OLD_URL)
/** the new version: another URL, signing, secret and match kind */
const v2 = (id: string): Outbox.OutboxRow => ({
  ...row(id, "fp-v2", NEW_URL),
  matchKind: "backlink",
  signingMode: "secret_id",
  secretId: "s1"
})
const body = (id: string): Outbox.EventBody => ({ eventId: `ev-${id}`, body: "{}", sha256: "sha" })
const empty = { prior: undefined, corruption: [], quarantine: [], cursors: [] }

interface Stored {
  readonly status: string
  readonly match_kind: string
  readonly target_url: string
  readonly signing_mode: string
  readonly secret_id: string | null
  readonly fingerprint: string
  readonly origin: string | null
  readonly attempt_count: number
  readonly last_error_kind: string | null
  readonly leased: boolean
  readonly finished: boolean
  readonly due: boolean
  readonly moved_to: unknown
}

const stored = (id: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<Stored>`SELECT status, match_kind, target_url, signing_mode, secret_id, fingerprint, origin, attempt_count,
        last_error_kind, lease_token IS NOT NULL AS leased, finished_at IS NOT NULL AS finished,
        next_attempt_at <= now() AS due, moved_to
      FROM outbox WHERE delivery_id = ${id}`.pipe(Effect.map((r) => r[0]))
  )

const countFor = (table: "audit" | "delivery_attempts", id: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<{ n: number }>`SELECT count(*)::int AS n FROM ${sql(table)} WHERE delivery_id = ${id}`.pipe(
        Effect.map((r) => r[0]?.n ?? 0)
      )
  )

const commit = (bodies: ReadonlyArray<Outbox.EventBody>, rows: ReadonlyArray<Outbox.OutboxRow>) =>
  Effect.gen(function*() {
    const c = (yield* Outbox.OutboxStore).commitBatch
    if (c === undefined) return yield* Effect.dieMessage("the SQL store commits in one statement")
    return yield* c({ ...empty, bodies, rows })
  })

/** enqueue `ids` for version 1, claim them (no request yet) and replay their events for version 2 */
const claimedThenReplayed = (ids: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const ds = yield* DeliveryStore
    yield* sql`DELETE FROM outbox`
    yield* commit(ids.map(body), ids.map(v1))
    const claimed = yield* ds.claim("host:w:1", 100, 60_000)
    expect(claimed.rows.map((r) => r.deliveryId).sort()).toEqual([...ids].sort())
    const replay = yield* commit(ids.map(body), ids.map(v2))
    // nothing claimable yet: the rows count as neither inserted nor moved
    expect(replay.inserted).toBe(0)
    expect([...replay.insertedIds]).toEqual([])
    const tokens = new Map(claimed.rows.map((r) => [r.deliveryId, r.leaseToken]))
    return (id: string) => tokens.get(id) ?? ""
  })

const newVersion = {
  match_kind: "backlink",
  target_url: NEW_URL,
  signing_mode: "secret_id",
  secret_id: "s1",
  fingerprint: "fp-v2",
  origin: Outbox.originKey(NEW_URL)
}

describe("outbox: the move of a leased row not yet attempted", () => {
  it.layer(Layer.mergeAll(Outbox.layerSql, deliveryLayerSql).pipe(Layer.provideMerge(Db.layer())))("pg", (it) => {
    it.effect("the replay marks it; its cancel subscription_changed moves it to the new version and wakes", () =>
      Effect.gen(function*() {
        const ds = yield* DeliveryStore
        const token = yield* claimedThenReplayed(["x"])
        // the worker still holds the old version: only the mark changed
        expect(yield* stored("x")).toMatchObject({
          status: "leased",
          leased: true,
          target_url: OLD_URL,
          fingerprint: "fp-v1",
          moved_to: newVersion
        })
        const listener = yield* ds.wakeups.pipe(Stream.take(1), Stream.runCollect, Effect.fork)
        yield* Db.listening(Outbox.NOTIFY_CHANNEL)
        // the screen sees the new version: cancelled without a request, applied as the move
        expect(yield* ds.cancel("x", token("x"), "subscription_changed")).toBe(false)
        expect(yield* stored("x")).toEqual({
          ...newVersion,
          status: "pending",
          attempt_count: 0,
          last_error_kind: null,
          leased: false,
          finished: false,
          due: true,
          moved_to: null
        })
        expect(yield* countFor("audit", "x")).toBe(0)
        expect(yield* countFor("delivery_attempts", "x")).toBe(0)
        const woken = yield* Fiber.join(listener).pipe(Effect.timeout("10 seconds"), TestServices.provideLive)
        expect(Chunk.size(woken)).toBe(1)
        // a worker claims it at the new version
        const again = yield* ds.claim("host:w:2", 10, 60_000)
        expect(again.rows.map((r) => [r.deliveryId, r.targetUrl, r.fingerprint])).toEqual([["x", NEW_URL, "fp-v2"]])
      }))

    it.effect("another settle clears the mark; a deferral keeps it until the next screen", () =>
      Effect.gen(function*() {
        const ds = yield* DeliveryStore
        const token = yield* claimedThenReplayed(["retried", "delivered", "released", "deferred"])
        const attempt = (outcome: "retry" | "delivered") => ({
          startedAtMs: 1_000,
          durationMs: 5,
          outcome,
          errorKind: outcome === "retry" ? "http_5xx" : undefined,
          httpStatus: outcome === "retry" ? 503 : 200,
          responseExcerpt: undefined
        })
        expect(
          yield* ds.reschedule("retried", token("retried"), {
            attemptCount: 1,
            errorKind: "http_5xx",
            httpStatus: 503,
            attempt: attempt("retry"),
            delayMs: 60_000
          })
        ).toBe(true)
        expect(
          yield* ds.markDelivered("delivered", token("delivered"), {
            attemptCount: 1,
            httpStatus: 200,
            attempt: attempt("delivered")
          })
        ).toBe(true)
        expect(yield* ds.cancel("released", token("released"), "webhook_deleted")).toBe(true)
        expect(yield* ds.defer("deferred", token("deferred"), 0)).toBe(true)
        expect(yield* stored("retried")).toMatchObject({ status: "pending", fingerprint: "fp-v1", moved_to: null })
        expect(yield* stored("delivered")).toMatchObject({ status: "delivered", fingerprint: "fp-v1", moved_to: null })
        expect(yield* stored("released")).toMatchObject({ status: "cancelled", fingerprint: "fp-v1", moved_to: null })
        expect(yield* countFor("audit", "released")).toBe(1)
        expect(yield* stored("deferred")).toMatchObject({
          status: "pending",
          fingerprint: "fp-v1",
          moved_to: newVersion
        })
        // the deferred row's next claim and screen: cancelled subscription_changed, applied as the move
        const next = yield* ds.claim("host:w:2", 10, 60_000)
        expect(next.rows.map((r) => r.deliveryId)).toEqual(["deferred"])
        expect(yield* ds.cancel("deferred", next.rows[0]?.leaseToken ?? "", "subscription_changed")).toBe(false)
        expect(yield* stored("deferred")).toMatchObject({ ...newVersion, status: "pending", moved_to: null })
        // a row without a mark is cancelled as before
        expect(yield* ds.cancel("retried", "not-its-token", "subscription_changed")).toBe(false)
      }))

    it.effect("a row of the replay's own version, or attempted, is not marked; a pending move clears a mark", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const ds = yield* DeliveryStore
        yield* sql`DELETE FROM outbox`
        yield* commit([body("same"), body("tried")], [v1("same"), v1("tried")])
        const claimed = yield* ds.claim("host:w:1", 10, 60_000)
        expect(claimed.rows).toHaveLength(2)
        yield* sql`UPDATE outbox SET attempt_count = 1 WHERE delivery_id = 'tried'`
        yield* commit([body("same")], [v1("same")])
        yield* commit([body("tried")], [v2("tried")])
        expect(yield* stored("same")).toMatchObject({ status: "leased", moved_to: null })
        expect(yield* stored("tried")).toMatchObject({ status: "leased", fingerprint: "fp-v1", moved_to: null })
        // a marked row released to pending untried (its worker gone) is moved whole by a later replay
        yield* sql`UPDATE outbox SET moved_to = '{"fingerprint": "fp-v2"}'::jsonb, status = 'pending',
          lease_token = NULL, leased_until = NULL WHERE delivery_id = 'same'`
        expect((yield* commit([body("same")], [v2("same")])).inserted).toBe(1)
        expect(yield* stored("same")).toMatchObject({ ...newVersion, status: "pending", moved_to: null })
      }))
  })
})
