/**
 * Operator actions (SPEC §4.8) on real PostgreSQL: parked rows replayed or redelivered while their
 * webhook is still disabled.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Operator from "../../src/services/operator/Operator.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { sqlStack } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

/**
 * Parked rows (SPEC §4.3: an auto-disabled or gone webhook's rows are parked as dead letters, at
 * most 10,000 per webhook, beyond that dropped) replayed or redelivered while the webhook is still
 * disabled are parked again: the replay gives their parking room back, so none is dropped.
 */
describe("Operator: parked rows replayed while their webhook is still disabled", () => {
  const OWNER = "did:plc:ownerownerownerownerowne"
  const ROWS = 6_000
  /** Claim every due row and park it, as the worker does for a disabled webhook. */
  const parkDue = Effect.gen(function*() {
    const store = yield* DeliveryStore
    for (let i = 0; i < 20; i++) {
      const claimed = yield* store.claim("worker", 1_000, 60_000, { defaultRoom: 1_000 })
      if (claimed.rows.length === 0) return
      yield* Effect.forEach(claimed.rows, (r) => store.parkDisabled(r.deliveryId, r.leaseToken), {
        concurrency: 64,
        discard: true
      })
    }
  })
  /** The auto-disabled webhook `w` and `n` pending rows `d1`…`dn` (records `p1`…`pn`) of one event. */
  const seed = (n: number) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* insertWebhook(OWNER, "w", { state: { auto_disabled_at: "now()" } })
      yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES ('ev', '{}', 'x')`
      yield* sql`
        INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
          event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
        SELECT 'd' || g, 'ev', ${OWNER}, 'w', 'direct', ${OWNER}, 'app.bsky.feed.post', 'p' || g, 'create',
          'https://receiver.example/hook', 'secret_id', 'main', 'fp-w', 'https://receiver.example'
        FROM generate_series(1, ${n}) g`
    })
  const state = Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.all({
      statuses: sql<{ status: string; n: number }>`SELECT status, count(*)::int AS n FROM outbox GROUP BY status
        ORDER BY status`,
      parked: Effect.map(sql<{ parked: number }>`SELECT parked FROM webhooks`, (r) => r[0]?.parked)
    }))

  it.effect(
    "replay of 6,000 parked rows parks them again; none is dropped; redeliver gives its room back too",
    () =>
      Effect.gen(function*() {
        yield* seed(ROWS)
        yield* parkDue
        expect(yield* state).toEqual({ statuses: [{ status: "dead_letter", n: ROWS }], parked: ROWS })

        const op = yield* Operator.Operator
        const replayed = yield* op.replayDeadLetters({ owner: OWNER, webhook: "w" })
        expect([replayed.replayed, replayed.inactiveSubscription]).toEqual([ROWS, ROWS])
        expect((yield* state).parked).toBe(0)
        yield* parkDue
        // old code: 4,000 dead letters and 2,000 cancelled (10,000 counted)
        expect(yield* state).toEqual({ statuses: [{ status: "dead_letter", n: ROWS }], parked: ROWS })

        const one = yield* op.redeliver("d1")
        expect(one._tag).toBe("Redelivered")
        expect((yield* state).parked).toBe(ROWS - 1)
        yield* parkDue
        expect(yield* state).toEqual({ statuses: [{ status: "dead_letter", n: ROWS }], parked: ROWS })
      }).pipe(Effect.provide(Layer.mergeAll(deliveryStoreSql, Operator.layer).pipe(Layer.provideMerge(sqlStack())))),
    120_000
  )

  it.effect(
    "a row whose attempt saw the webhook disabled, settled after a resume --replay, is pending again (not parked behind the replay)",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* seed(1)
        const store = yield* DeliveryStore
        // the attempt has claimed the row and read the webhook as auto-disabled (it is in flight)
        const [row] = (yield* store.claim("worker", 1, 60_000)).rows
        expect(row).toBeDefined()
        // the owner resumes it with replay meanwhile: nothing parked yet, nothing to replay
        const resumed = yield* (yield* WebhookState.WebhookStateStore).resume(OWNER, "w", { replay: true })
        expect(Option.map(resumed, (r) => [r.cleared, r.replayed])).toEqual(Option.some([true, 0]))
        // then the attempt settles its decision: the row is due again, not a dead letter of an active webhook
        expect(yield* store.parkDisabled("d1", row?.leaseToken ?? "")).toBe(false)
        const after = yield* sql<
          { status: string; kind: string | null; finished: boolean; due: boolean; audits: number }
        >`
        SELECT status, last_error_kind AS kind, finished_at IS NOT NULL AS finished, next_attempt_at <= now() AS due,
          (SELECT count(*)::int FROM audit) AS audits
        FROM outbox`
        // old code: [{ status: 'dead_letter', kind: 'webhook_disabled', finished: true, … audits: 1 }]
        expect(after).toEqual([{ status: "pending", kind: null, finished: false, due: true, audits: 0 }])
        expect((yield* state).parked).toBe(0)
      }).pipe(
        Effect.provide(
          Layer.mergeAll(deliveryStoreSql, WebhookState.layerSql).pipe(
            Layer.provideMerge(Operator.layer),
            Layer.provideMerge(sqlStack())
          )
        )
      ),
    60_000
  )
})
