/**
 * The parked-row bound of SPEC §4.3 on PostgreSQL, through the real worker: a disabled or gone
 * webhook's new matches are parked as dead letters (`webhook_disabled`) up to 10,000 rows per
 * webhook; beyond that they are dropped (cancelled, counted), never a request.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { PARK_MAX } from "../../src/services/delivery/WebhookHealthSql.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { type EventRow, eventually, receiver, rowsOfEvent, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const SECRET = "park-bound-secret-0123456789"

const settled = (rs: ReadonlyArray<EventRow>) => rs.every((r) => r.status !== "pending" && r.status !== "leased")

describe("delivery worker: at most 10,000 parked rows per webhook (SPEC §4.3)", () => {
  it.scopedLive(
    "a gone webhook with 9,999 parked rows parks one more match; the next one is dropped (cancelled), no request",
    () =>
      Effect.gen(function*() {
        expect(PARK_MAX).toBe(10_000)
        const sql = yield* SqlClient.SqlClient
        const rx = yield* receiver({ secretFor: () => SECRET, reply: () => ({ status: 200 }) })
        yield* run([
          whEv(OWNER, "gone", whRecordValue(`at://${BOB}`, { url: `${rx.url}/gone`, secret: SECRET }), {
            rev: rev(1)
          })
        ])
        yield* sql`UPDATE webhooks SET gone_at = now(), parked = 9999 WHERE owner_did = ${OWNER} AND rkey = 'gone'`
        yield* startWorker({ options: { pollIntervalMs: 100 } })

        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        const first = yield* eventually("p1 settled", rowsOfEvent("p1"), (rs) => rs.length === 1 && settled(rs), 20_000)
        yield* run([ev(BOB, POST, "p2", { rev: rev(11) })])
        const second = yield* eventually(
          "p2 settled",
          rowsOfEvent("p2"),
          (rs) => rs.length === 1 && settled(rs),
          20_000
        )
        expect([...first, ...second].map((r) => [r.status, r.last_error_kind, r.attempt_count])).toEqual([
          ["dead_letter", "webhook_disabled", 0],
          ["cancelled", "webhook_disabled", 0]
        ])
        expect(rx.received).toHaveLength(0)
        const [w] = yield* sql<{ parked: number }>`
          SELECT parked FROM webhooks WHERE owner_did = ${OWNER} AND rkey = 'gone'`
        expect(w?.parked).toBe(10_000)
      }).pipe(
        Effect.provide(WebhookState.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    120_000
  )
})
