/**
 * One delivery over its life, and the operator's and owner's actions on it (SPEC §4.3, §4.8), on
 * real PostgreSQL through the real worker and a real receiver on 127.0.0.1.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer } from "effect"
import { createHmac } from "node:crypto"
import { Secrets } from "../../src/services/delivery/Secrets.js"
import * as Operator from "../../src/services/operator/Operator.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import {
  countWhere,
  eventually,
  firstAttemptLatency,
  outboxRows,
  receiver,
  run,
  startWorker,
  whsec,
  workerLayer
} from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1" }

describe("replay and redeliver over a delivery's life", () => {
  it.scopedLive(
    "the enqueue → first attempt histogram counts a delivery's first request only: never again after a replay or redeliver",
    () =>
      Effect.gen(function*() {
        let accept = false
        const rx = yield* receiver({ reply: (path) => ({ status: path === "/ok" || accept ? 200 : 400 }) })
        yield* run([
          whEv(OWNER, "ok", whRecordValue(`at://${BOB}`, { url: `${rx.url}/ok` }), { rev: rev(1) }),
          whEv(OWNER, "flaky", whRecordValue(`at://${BOB}`, { url: `${rx.url}/flaky` }), { rev: rev(2) })
        ])
        const sql = yield* SqlClient.SqlClient
        // a row touched without an attempt before its first request (as a deferral or the circuit's
        // mover does): its first request is still its first
        yield* run([ev(BOB, POST, "touched", { rev: rev(10) })])
        yield* sql`UPDATE outbox SET updated_at = now() + interval '1 second'`
        const start = yield* firstAttemptLatency
        yield* startWorker({ options: { pollIntervalMs: 50 } })
        yield* eventually(
          "touched rows settled",
          outboxRows,
          (rs) => rs.length === 2 && rs.every((r) => r.status === "delivered" || r.status === "dead_letter"),
          20_000
        )
        const first = yield* firstAttemptLatency
        expect(first.count - start.count).toBe(2)

        // a delivery dead-lettered at its first request (400), enqueued an hour ago
        yield* run([ev(BOB, POST, "late", { rev: rev(20) })])
        const flaky = yield* eventually(
          "late settled for flaky",
          sql<{ delivery_id: string; status: string }>`
            SELECT delivery_id, status FROM outbox WHERE event_rkey = 'late' AND webhook_rkey = 'flaky'`.pipe(
            Effect.orDie
          ),
          (rs) => rs[0]?.status === "dead_letter",
          20_000
        )
        yield* eventually(
          "late delivered for ok",
          sql<{ status: string }>`SELECT status FROM outbox WHERE event_rkey = 'late' AND webhook_rkey = 'ok'`.pipe(
            Effect.orDie
          ),
          (rs) => rs[0]?.status === "delivered",
          20_000
        )
        const id = flaky[0]?.delivery_id ?? ""
        const second = yield* firstAttemptLatency
        expect(second.count - first.count).toBe(2)
        yield* sql`UPDATE outbox SET created_at = created_at - interval '1 hour'`

        // replayed (both of flaky's dead letters): their requests go out again, but are not first attempts
        accept = true
        const op = yield* Operator.Operator
        expect((yield* op.replayDeadLetters({ owner: OWNER, webhook: "flaky" })).replayed).toBe(2)
        yield* eventually("replayed rows delivered", outboxRows, (rs) =>
          rs.every((r) =>
            r.status === "delivered"
          ), 20_000)
        // and redelivered once more
        expect((yield* op.redeliver(id))._tag).toBe("Redelivered")
        yield* eventually(
          "redelivered row delivered",
          sql<{ n: number }>`SELECT count(*)::int AS n FROM delivery_attempts WHERE delivery_id = ${id}`.pipe(
            Effect.orDie
          ),
          (rs) =>
            rs[0]?.n === 3,
          20_000
        )
        expect(rx.hits.get(id)).toBe(3)
        const third = yield* firstAttemptLatency
        // before: +3, with an hour (3,600,000 ms) each
        expect({ count: third.count - second.count, sum: third.sum - second.sum }).toEqual({ count: 0, sum: 0 })
      }).pipe(Effect.provide(Operator.layer), Effect.provide(sqlStack({ env: ENV }))),
    60_000
  )

  it.scopedLive(
    "mid-retry: a record deleted cancels its row, a webhook marked gone parks it; the row's last error is that, without the HTTP status of an earlier attempt (as its audit row)",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver({ reply: () => ({ status: 503 }) })
        yield* run(
          ["del", "park"].map((rkey) =>
            whEv(OWNER, rkey, whRecordValue(`at://${BOB}`, { url: `${rx.url}/${rkey}` }), { rev: rev(1) })
          )
        )
        yield* startWorker({ options: { pollIntervalMs: 50 } })
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        yield* eventually(
          "both failed once",
          outboxRows,
          (rs) => rs.length === 2 && rs.every((r) => r.attempt_count >= 1 && r.last_http_status === 503),
          20_000
        )
        // the record "del" is deleted, "park" is marked gone (by another delivery's 410, say)
        yield* run([whEv(OWNER, "del", undefined, { rev: rev(2), operation: "delete" })])
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE webhooks SET gone_at = now() WHERE rkey = 'park'`
        const rows = yield* eventually(
          "cancelled and parked",
          outboxRows,
          (rs) => rs.every((r) => r.status === "cancelled" || r.status === "dead_letter"),
          20_000
        )
        const audit = yield* sql<
          { webhook_rkey: string; status: string; error_kind: string; http_status: number | null }
        >`
          SELECT webhook_rkey, status, error_kind, http_status FROM audit ORDER BY webhook_rkey`
        const view = (rkey: string) => {
          const r = rows.find((x) => x.webhook_rkey === rkey)
          return [r?.status, r?.last_error_kind, r?.last_http_status]
        }
        expect(view("del")).toEqual(["cancelled", "subscription_changed", null])
        expect(view("park")).toEqual(["dead_letter", "webhook_disabled", null])
        expect(audit).toEqual([
          { webhook_rkey: "del", status: "cancelled", error_kind: "subscription_changed", http_status: null },
          { webhook_rkey: "park", status: "dead_letter", error_kind: "webhook_disabled", http_status: null }
        ])
        // the attempts made before keep their statuses
        expect(yield* countWhere("delivery_attempts", "http_status = 503 AND outcome = 'retry'")).toBe(
          rows.reduce((n, r) => n + r.attempt_count, 0)
        )
      }).pipe(
        Effect.provide(
          sqlStack({ env: { ...ENV, DELIVERY_RETRY_BASE_MS: "300", DELIVERY_RETRY_MAX_MS: "600" } })
        )
      ),
    60_000
  )

  it.scopedLive(
    "a dead letter replayed after its secret was rotated: the same webhook-id, signed with the current token only; two replays at once send it once",
    () =>
      Effect.gen(function*() {
        let accept = false
        let token = whsec(7)
        const rx = yield* receiver({ reply: () => ({ status: accept ? 200 : 400 }), secretFor: () => token })
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secretId: "s1" }), {
          rev: rev(1)
        })])
        const ctx = yield* Layer.build(
          workerLayer({ options: { pollIntervalMs: 50 }, secrets: [{ ownerDid: OWNER, name: "s1", token }] })
        )
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        const [dead] = yield* eventually("dead letter", outboxRows, (rs) => rs[0]?.status === "dead_letter", 20_000)
        const id = dead?.delivery_id ?? ""
        expect(rx.received[0]?.verified).toEqual({ standard: true, wisp: true })

        const old = token
        token = (yield* Context.get(ctx, Secrets).rotate(OWNER, "s1")).token
        accept = true
        const op = yield* Operator.Operator
        const both = yield* Effect.all(
          [op.replayDeadLetters({ owner: OWNER }), op.replayDeadLetters({ owner: OWNER })],
          {
            concurrency: 2
          }
        )
        expect(both.map((r) => r.replayed).sort()).toEqual([0, 1])
        yield* eventually("delivered", outboxRows, (rs) => rs[0]?.status === "delivered", 20_000)
        expect(rx.received).toHaveLength(2)
        const again = rx.received[1]
        expect(again?.headers["webhook-id"]).toBe(id)
        expect(again?.headers["idempotency-key"]).toBe(id)
        expect(again?.verified).toEqual({ standard: true, wisp: true })
        // not signed with the old token as well
        const sig = String(again?.headers["x-webhook-signature"])
        expect(sig).not.toBe("sha256=" + createHmac("sha256", old).update(again?.body ?? Buffer.alloc(0)).digest("hex"))
        expect(String(again?.headers["webhook-signature"]).split(" ")).toHaveLength(1)
        // a fresh timestamp for the new attempt
        expect(Number(again?.headers["webhook-timestamp"])).toBeGreaterThanOrEqual(
          Number(rx.received[0]?.headers["webhook-timestamp"])
        )
      }).pipe(Effect.provide(Operator.layer), Effect.provide(sqlStack({ env: ENV }))),
    60_000
  )
})
