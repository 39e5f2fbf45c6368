/**
 * Batched settles and the worker's admission (SPEC §4.1, §4.3) on real PostgreSQL:
 * - settles issued at the same time are applied together, yet every row gets exactly its own
 *   outcome (status, attempt count, error, audit and attempt rows), and a stale token in the same
 *   batch changes nothing;
 * - an origin never has more than `perOriginConcurrency` requests in flight, and the rows of another
 *   origin are delivered while the first one has many rows waiting.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, receiver, run, startWorker } from "./worker-support.js"

const BOB = plc(2)
const POST = "app.bsky.feed.post"

interface Row {
  readonly delivery_id: string
  readonly status: string
  readonly attempt_count: number
  readonly last_error_kind: string | null
  readonly last_http_status: number | null
  readonly lease_token: string | null
  readonly finished: boolean
  readonly due_in_s: number
}

const rowsById = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<Row>`
    SELECT delivery_id, status, attempt_count, last_error_kind, last_http_status, lease_token,
      (finished_at IS NOT NULL) AS finished, extract(epoch FROM next_attempt_at - now())::float8 AS due_in_s
    FROM outbox`).pipe(
    Effect.map((rows) => new Map(rows.map((r) => [r.delivery_id, r]))),
    Effect.orDie
  )

describe("delivery: batched settles and admission", () => {
  it.scopedLive(
    "concurrent settles share statements, yet each row gets its own outcome",
    () =>
      Effect.gen(function*() {
        yield* run([
          whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: "https://receiver.example/hook" }), { rev: rev(1) })
        ])
        yield* run(Array.from({ length: 6 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const store = yield* DeliveryStore
        const claimed = yield* store.claim("w", 10, 60_000)
        expect(claimed.rows.length).toBe(6)
        const [a, b, c, d, e, f] = claimed.rows
        if (
          a === undefined || b === undefined || c === undefined || d === undefined || e === undefined || f === undefined
        ) return
        const attempt = (outcome: "delivered" | "retry" | "dead_letter", httpStatus: number) => ({
          startedAtMs: 1_700_000_000_000,
          durationMs: 7,
          outcome,
          errorKind: outcome === "delivered" ? undefined : "x",
          httpStatus,
          responseExcerpt: `r${httpStatus}`
        })
        // all at once: the store applies them in as few statements as its flushers allow
        const results = yield* Effect.all(
          [
            store.markDelivered(a.deliveryId, a.leaseToken, {
              attemptCount: 1,
              httpStatus: 204,
              attempt: attempt("delivered", 204)
            }),
            store.reschedule(b.deliveryId, b.leaseToken, {
              attemptCount: 1,
              delayMs: 3_600_000,
              errorKind: "http_5xx",
              httpStatus: 503,
              attempt: attempt("retry", 503)
            }),
            store.defer(c.deliveryId, c.leaseToken, 7_200_000),
            store.deadLetter(d.deliveryId, d.leaseToken, {
              attemptCount: 1,
              errorKind: "http_4xx",
              httpStatus: 404,
              attempt: attempt("dead_letter", 404)
            }),
            store.cancel(e.deliveryId, e.leaseToken, "subscription_changed"),
            // a stale token for f: refused, f stays leased
            store.markDelivered(f.deliveryId, `${f.leaseToken}-stale`, { attemptCount: 1, httpStatus: 200 })
          ],
          { concurrency: "unbounded" }
        )
        expect(results).toEqual([true, true, true, true, true, false])
        const rows = yield* rowsById
        expect(rows.get(a.deliveryId)).toMatchObject({
          status: "delivered",
          attempt_count: 1,
          last_http_status: 204,
          last_error_kind: null,
          lease_token: null,
          finished: true
        })
        expect(rows.get(b.deliveryId)).toMatchObject({
          status: "pending",
          attempt_count: 1,
          last_http_status: 503,
          last_error_kind: "http_5xx",
          lease_token: null,
          finished: false
        })
        expect(rows.get(b.deliveryId)?.due_in_s).toBeGreaterThan(3_000)
        expect(rows.get(b.deliveryId)?.due_in_s).toBeLessThan(4_000)
        expect(rows.get(c.deliveryId)).toMatchObject({
          status: "pending",
          attempt_count: 0,
          last_http_status: null,
          last_error_kind: null,
          lease_token: null,
          finished: false
        })
        expect(rows.get(c.deliveryId)?.due_in_s).toBeGreaterThan(7_000)
        expect(rows.get(d.deliveryId)).toMatchObject({
          status: "dead_letter",
          attempt_count: 1,
          last_http_status: 404,
          last_error_kind: "http_4xx",
          finished: true
        })
        expect(rows.get(e.deliveryId)).toMatchObject({
          status: "cancelled",
          attempt_count: 0,
          last_error_kind: "subscription_changed",
          finished: true
        })
        expect(rows.get(f.deliveryId)).toMatchObject({
          status: "leased",
          attempt_count: 0,
          lease_token: f.leaseToken,
          finished: false
        })
        // audit rows for the three terminal outcomes only, each with its own status
        const sql = yield* SqlClient.SqlClient
        const audit = yield* sql<
          { delivery_id: string; status: string; http_status: number | null; error_kind: string | null }
        >`
          SELECT delivery_id, status, http_status, error_kind FROM audit ORDER BY status`
        expect(audit.map((r) => [r.delivery_id, r.status, r.http_status, r.error_kind]).sort()).toEqual(
          [
            [a.deliveryId, "delivered", 204, null],
            [d.deliveryId, "dead_letter", 404, "http_4xx"],
            [e.deliveryId, "cancelled", null, "subscription_changed"]
          ].sort()
        )
        // attempt records for the three settles that carried one, each on its own row
        const attempts = yield* sql<
          { delivery_id: string; attempt: number; outcome: string; http_status: number; response_excerpt: string }
        >`
          SELECT delivery_id, attempt, outcome, http_status, response_excerpt FROM delivery_attempts`
        expect(attempts.map((r) => [r.delivery_id, r.attempt, r.outcome, r.http_status, r.response_excerpt]).sort())
          .toEqual(
            [
              [a.deliveryId, 1, "delivered", 204, "r204"],
              [b.deliveryId, 1, "retry", 503, "r503"],
              [d.deliveryId, 1, "dead_letter", 404, "r404"]
            ].sort()
          )
      }).pipe(Effect.scoped, Effect.provide(Layer.provideMerge(deliveryStoreSql, sqlStack()))),
    60_000
  )

  it.scopedLive(
    "a busy origin gets at most its cap of request slots; another origin is delivered meanwhile",
    () =>
      Effect.gen(function*() {
        // the busy receiver never answers: its requests hold their slots until the test ends
        const busy = yield* receiver({ reply: () => "hang" })
        const quiet = yield* receiver()
        yield* run([
          whEv(plc(1), "busy", whRecordValue(`at://${BOB}`, { url: `${busy.url}/in` }), { rev: rev(1) }),
          whEv(plc(1), "quiet", whRecordValue(`at://${plc(3)}`, { url: `${quiet.url}/in` }), { rev: rev(1) })
        ])
        // the busy origin's rows come first in claim order
        yield* run(Array.from({ length: 20 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        yield* run(Array.from({ length: 3 }, (_, i) => ev(plc(3), POST, `q${i}`, { rev: rev(100 + i) })))
        const worker = yield* startWorker()
        yield* eventually("the busy origin holds its cap", Effect.sync(() => busy.received.length), (n) => n === 1)
        // (the claim holds at most 8 × the cap of one origin, so the quiet rows are claimed too)
        // a free slot serves the quiet origin, one row after the other
        yield* eventually("quiet rows delivered", countWhere("outbox", "status = 'delivered'"), (n) => n === 3)
        expect(quiet.received.length).toBe(3)
        // admission is synchronous: had the cap been ignored, a busy row would hold the freed slot now
        const stats = yield* worker.delivery.stats
        expect(stats.inFlight).toBe(1)
        expect(busy.received.length).toBe(1)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              DELIVERY_CONCURRENCY: "3",
              DELIVERY_PER_ORIGIN_CONCURRENCY: "1",
              DELIVERY_TIMEOUT_MS: "30000"
            }
          })
        )
      ),
    60_000
  )
})
