/**
 * A webhook deleted and created again with the same content (same owner, rkey and fingerprint: the
 * fingerprint is a hash of the subscription) gets a new `webhooks` row whose `parked_since` is its
 * creation (0019's default for new rows): pruning the dead letters parked under the deleted row
 * gives no room to the new row's count. Before, the new row's NULL meant "every row counts", and a
 * webhook could again park 20,000 rows in one period. Real PostgreSQL.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Operator from "../../src/services/operator/Operator.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { sqlStack } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

const OWNER = "did:plc:ownerownerownerownerowne"

const parkDue = Effect.gen(function*() {
  const store = yield* DeliveryStore
  for (let i = 0; i < 20; i++) {
    const claimed = yield* store.claim("worker", 1_000, 60_000, { defaultRoom: 1_000 })
    if (claimed.rows.length === 0) return
    yield* Effect.forEach(claimed.rows, (r) => store.parkDisabled(r.deliveryId, r.leaseToken), { discard: true })
  }
})

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

const provide = <A, E, R>(self: Effect.Effect<A, E, R>) =>
  self.pipe(
    Effect.provide(
      Layer.mergeAll(deliveryStoreSql, WebhookState.layerSql).pipe(
        Layer.provideMerge(Operator.layer),
        Layer.provideMerge(sqlStack())
      )
    )
  )

describe("a recreated webhook's parked count", () => {
  it.effect(
    "pruning rows parked under the deleted row gives no room to the recreated one",
    () =>
      provide(Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* insertWebhook(OWNER, "w", { state: { auto_disabled_at: "now()" } })
        yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES ('ev', '{}', 'x')`
        yield* enqueue("old", 4)
        yield* parkDue
        expect(yield* parked).toBe(4)
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
