/**
 * `webhooks.parked` counts the rows parked since the count last restarted (`parked_since`: a resume,
 * or a new fingerprint), SPEC §4.3 (at most 10,000 parked rows per webhook). Rows parked before
 * that restart are not in the count: pruning, replaying or redelivering them gives no room back
 * (before, it did, and the count understated the rows parked since: 20,000 in one period). A
 * webhook deleted and created again with the same content (same owner, rkey and fingerprint) gets a
 * new row whose count starts at its creation (0019's default for new rows).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Operator from "../../src/services/operator/Operator.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { sqlStack } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

const OWNER = "did:plc:ownerownerownerownerowne"

/** Claim every due row and park it, as the worker does for a disabled webhook. */
const parkDue = Effect.gen(function*() {
  const store = yield* DeliveryStore
  for (let i = 0; i < 20; i++) {
    const claimed = yield* store.claim("worker", 1_000, 60_000, { defaultRoom: 1_000 })
    if (claimed.rows.length === 0) return
    yield* Effect.forEach(claimed.rows, (r) => store.parkDisabled(r.deliveryId, r.leaseToken), { discard: true })
  }
})

/** `n` pending rows `<prefix>1`…`<prefix>n` of webhook `w` (fingerprint `fp-w`). */
const enqueue = (prefix: string, n: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
        event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
      SELECT ${prefix} || g, 'ev', ${OWNER}, 'w', 'direct', ${OWNER}, 'app.bsky.feed.post', ${prefix} || g, 'create',
        'https://receiver.example/hook', 'secret_id', 'main', 'fp-w', 'https://receiver.example'
      FROM generate_series(1, ${n}) g`)

const parked = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => Effect.map(sql<{ parked: number }>`SELECT parked FROM webhooks`, (r) => r[0]?.parked)
)

const parkedRows = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ n: number }>`
      SELECT count(*)::int AS n FROM outbox WHERE status = 'dead_letter' AND last_error_kind = 'webhook_disabled'`,
    (r) => r[0]?.n
  ))

const disable = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql`UPDATE webhooks SET auto_disabled_at = now() WHERE owner_did = ${OWNER} AND rkey = 'w'`
)

/**
 * An auto-disabled webhook that parked 4 rows (`old1`…`old4`, enqueued a day ago), was resumed
 * without replay (count 0, the 4 rows stay), was disabled again and parked 3 rows (`new1`…`new3`).
 */
const twoPeriods = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* insertWebhook(OWNER, "w", { state: { auto_disabled_at: "now()" } })
  yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES ('ev', '{}', 'x')`
  yield* enqueue("old", 4)
  yield* sql`UPDATE outbox SET created_at = now() - interval '1 day' WHERE delivery_id LIKE 'old%'`
  yield* parkDue
  expect(yield* parked).toBe(4)
  const resumed = yield* (yield* WebhookState.WebhookStateStore).resume(OWNER, "w")
  expect(Option.isSome(resumed)).toBe(true)
  const since = yield* sql<{ set: boolean }>`SELECT parked_since IS NOT NULL AS set FROM webhooks`
  expect(since[0]?.set).toBe(true)
  expect(yield* parked).toBe(0)
  yield* disable
  yield* enqueue("new", 3)
  yield* parkDue
  expect(yield* parked).toBe(3)
  expect(yield* parkedRows).toBe(7)
})

/** An auto-disabled webhook `w` that parked 4 rows `old1`…`old4` (its count says 4). */
const parkOld = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* insertWebhook(OWNER, "w", { state: { auto_disabled_at: "now()" } })
  yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES ('ev', '{}', 'x')`
  yield* enqueue("old", 4)
  yield* parkDue
  expect(yield* parked).toBe(4)
})

const provide = <A, E, R>(self: Effect.Effect<A, E, R>) =>
  self.pipe(
    Effect.provide(
      Layer.mergeAll(deliveryStoreSql, WebhookState.layerSql).pipe(
        Layer.provideMerge(Operator.layer),
        Layer.provideMerge(sqlStack())
      )
    )
  )

describe("webhooks.parked counts the rows parked since parked_since", () => {
  it.effect("maintenance pruning rows parked before the resume leaves the count", () =>
    provide(Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* twoPeriods
      yield* sql`UPDATE outbox SET finished_at = now() - interval '31 days' WHERE delivery_id LIKE 'old%'`
      const counts = yield* Maintenance.runOnce()
      expect(counts.outbox).toBe(4)
      expect(yield* parkedRows).toBe(3)
      expect(yield* parked).toBe(3)
      // rows parked since the resume still give their room back when pruned
      yield* sql`UPDATE outbox SET finished_at = now() - interval '31 days'
        WHERE delivery_id = 'new1'`
      yield* sql`UPDATE webhooks SET parked_since = now() - interval '40 days'`
      yield* Maintenance.runOnce()
      expect(yield* parkedRows).toBe(2)
      expect(yield* parked).toBe(2)
    })), 60_000)

  it.effect(
    "redelivering a row parked before the resume (parked again) counts it once",
    () =>
      provide(Effect.gen(function*() {
        yield* twoPeriods
        const op = yield* Operator.Operator
        const one = yield* op.redeliver("old1")
        expect(one._tag).toBe("Redelivered")
        yield* parkDue
        // 3 rows of this period and old1, parked again in it (old code: 3)
        expect(yield* parkedRows).toBe(7)
        expect(yield* parked).toBe(4)
        // a row of this period redelivered and parked again: its room given back, then taken
        yield* op.redeliver("new1")
        yield* parkDue
        expect(yield* parked).toBe(4)
      })),
    60_000
  )

  it.effect(
    "replaying rows parked before the resume (parked again) counts them once",
    () =>
      provide(Effect.gen(function*() {
        yield* twoPeriods
        const op = yield* Operator.Operator
        const replay = yield* op.replayDeadLetters({
          owner: OWNER,
          webhook: "w",
          until: new Date(Date.now() - 3_600_000)
        })
        expect(replay.replayed).toBe(4)
        yield* parkDue
        // 3 rows of this period and the 4 old ones, parked again in it (old code: 4)
        expect(yield* parkedRows).toBe(7)
        expect(yield* parked).toBe(7)
      })),
    60_000
  )

  it.effect(
    "a new fingerprint restarts the count: rows of an earlier period of it give no room back",
    () =>
      provide(Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* parkOld
        // the row's creation started its count (0019's default for new rows); it is taken back to
        // before the rows parked so far, as a row created before 0019 would have had them
        yield* sql`UPDATE webhooks SET parked_since = NULL WHERE owner_did = ${OWNER} AND rkey = 'w'`
        // a new version, then the old one again: the trigger resets the state twice
        yield* sql`UPDATE webhooks SET fingerprint = 'fp-x' WHERE owner_did = ${OWNER} AND rkey = 'w'`
        yield* sql`UPDATE webhooks SET fingerprint = 'fp-w' WHERE owner_did = ${OWNER} AND rkey = 'w'`
        const after = yield* sql<{ parked: number; set: boolean }>`
        SELECT parked, parked_since IS NOT NULL AS set FROM webhooks`
        expect(after[0]).toEqual({ parked: 0, set: true })
        yield* disable
        yield* enqueue("new", 3)
        yield* parkDue
        expect(yield* parked).toBe(3)
        yield* sql`UPDATE outbox SET finished_at = now() - interval '31 days' WHERE delivery_id LIKE 'old%'`
        yield* Maintenance.runOnce()
        expect(yield* parkedRows).toBe(3)
        expect(yield* parked).toBe(3)
      })),
    60_000
  )

  it.effect(
    "a webhook deleted and created again with the same fingerprint: pruning rows parked under the deleted row gives no room to the new one (its count starts at its creation)",
    () =>
      provide(Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* parkOld
        // the record is deleted (RegistryStore.remove: DELETE FROM webhooks) and created again with the
        // same content (RegistryStore.upsert: INSERT, same fingerprint); the receiver still answers 410
        yield* sql`DELETE FROM webhooks WHERE owner_did = ${OWNER} AND rkey = 'w'`
        yield* insertWebhook(OWNER, "w", { state: { gone_at: "now()" } })
        expect(yield* parked).toBe(0)
        yield* enqueue("new", 3)
        yield* parkDue
        expect(yield* parked).toBe(3)
        // 30 days on, maintenance prunes the 4 rows parked under the deleted row
        yield* sql`UPDATE outbox SET finished_at = now() - interval '31 days' WHERE delivery_id LIKE 'old%'`
        yield* Maintenance.runOnce()
        const rows = yield* sql<{ n: number }>`
        SELECT count(*)::int AS n FROM outbox WHERE status = 'dead_letter' AND last_error_kind = 'webhook_disabled'`
        expect(rows[0]?.n).toBe(3)
        // the 3 rows parked since the row was created are still there: the count must say 3 (it says 0)
        expect(yield* parked).toBe(3)
      })),
    60_000
  )
})
