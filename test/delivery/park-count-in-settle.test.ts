/**
 * The parked-row bound of SPEC §4.3 counts every park: the settle statement of the SQL
 * `DeliveryStore` raises `webhooks.parked` (and `parked_dropped`) itself, in the statement that
 * parks the row, under the webhook row's lock. Before, the count was raised afterwards by the
 * separate webhook-state statement, whose failure was swallowed: a park it missed was never
 * counted, and the webhook parked more than 10,000 rows.
 *
 * Here another session holds a key-share lock on the webhook's row (what a foreign-key check
 * takes): the settle's row locks do not conflict with it; the old state statement's `FOR UPDATE`
 * did, so the parked count lagged behind the parked row (and was lost when it gave up).
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
const SECRET = "park-count-secret-0123456789"

const settled = (rs: ReadonlyArray<EventRow>) => rs.every((r) => r.status !== "pending" && r.status !== "leased")

describe("settle: parks are counted by the statement that parks", () => {
  it.scopedLive(
    "9,999 parked, the webhook row key-share locked: the next park counts 10,000 with the row; the one after is dropped",
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
        const holder = yield* sql.reserve
        yield* holder.executeRaw("BEGIN", [])
        yield* Effect.addFinalizer(() => Effect.ignore(holder.executeRaw("ROLLBACK", [])))
        yield* holder.executeRaw(
          `SELECT 1 FROM webhooks WHERE owner_did = '${OWNER}' AND rkey = 'gone' FOR KEY SHARE`,
          []
        )
        const counts = sql<{ parked: number; dropped: number }>`
          SELECT parked, parked_dropped::int AS dropped FROM webhooks WHERE owner_did = ${OWNER} AND rkey = 'gone'`
          .pipe(Effect.map((r) => r[0]))
        yield* startWorker({ options: { pollIntervalMs: 100 } })

        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        const first = yield* eventually("p1 settled", rowsOfEvent("p1"), (rs) => rs.length === 1 && settled(rs), 20_000)
        // counted with the park itself, not by a later statement
        expect(yield* counts).toEqual({ parked: 10_000, dropped: 0 })

        yield* run([ev(BOB, POST, "p2", { rev: rev(11) })])
        const second = yield* eventually(
          "p2 settled",
          rowsOfEvent("p2"),
          (rs) => rs.length === 1 && settled(rs),
          20_000
        )
        expect(yield* counts).toEqual({ parked: 10_000, dropped: 1 })
        expect([...first, ...second].map((r) => [r.status, r.last_error_kind, r.attempt_count])).toEqual([
          ["dead_letter", "webhook_disabled", 0],
          ["cancelled", "webhook_disabled", 0]
        ])
        expect(rx.received).toHaveLength(0)
      }).pipe(
        Effect.provide(WebhookState.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    120_000
  )
})
