/**
 * The webhook-state update (WebhookHealthSql.makeWriter) runs off the settle flusher of the SQL
 * `DeliveryStore`, and skips the `webhooks` rows another session holds: while one webhook's row is
 * locked (an intake batch writing it, an operator's transaction), another webhook's 200 is settled
 * promptly and its state (`last_success_at`) is written; the held webhook's failure is written once
 * the lock is gone. Before, the state update ran inside the flusher and waited for the lock (up to
 * its 15 s bound), and no settle of the process ran meanwhile.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, receiver, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"

describe("settle: a webhook row held by another session stalls no other settle", () => {
  it.scopedLive(
    "webhook A's row locked: B's 200 is delivered and its last success written within 5 s; A's failure is written after the lock",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const failing = yield* receiver({ reply: () => ({ status: 503 }) })
        // B answers 200 a moment later, so that its settle comes after A's failure was settled
        const ok = yield* receiver({ reply: () => ({ status: 200, body: "ok", delayMs: 1_000 }) })
        yield* run([
          whEv(OWNER, "a", whRecordValue(`at://${BOB}`, { url: `${failing.url}/in` }), { rev: rev(1) }),
          whEv(OWNER, "b", whRecordValue(`at://${CAROL}`, { url: `${ok.url}/in` }), { rev: rev(1) })
        ])
        const holder = yield* sql.reserve
        yield* holder.executeRaw("BEGIN", [])
        yield* Effect.addFinalizer(() => Effect.ignore(holder.executeRaw("ROLLBACK", [])))
        yield* holder.executeRaw(`SELECT 1 FROM webhooks WHERE owner_did = '${OWNER}' AND rkey = 'a' FOR UPDATE`, [])

        yield* run([ev(BOB, POST, "p1", { rev: rev(10) }), ev(CAROL, POST, "p2", { rev: rev(11) })])
        yield* startWorker()
        yield* eventually("A failed once", Effect.sync(() => failing.received.length), (n) => n >= 1, 20_000)
        yield* eventually("B's request answered", Effect.sync(() => ok.received.length), (n) => n >= 1, 20_000)
        // B's receiver answers 1 s after the request; its settle and state get 4 s more (the old
        // code's flusher waited 15 s for A's row)
        const settled = yield* Effect.either(
          eventually("B delivered", countWhere("outbox", "webhook_rkey = 'b' AND status = 'delivered'"), (n) =>
            n === 1, 5_000)
        )
        const bSuccess = yield* Effect.either(
          eventually(
            "B's last success written",
            countWhere("webhooks", "rkey = 'b' AND last_success_at IS NOT NULL"),
            (n) =>
              n === 1,
            1_000
          )
        )
        const aBefore = yield* countWhere("webhooks", "rkey = 'a' AND last_failure_kind IS NOT NULL")
        expect({ settled: settled._tag, bSuccess: bSuccess._tag, aWritten: aBefore }).toEqual({
          settled: "Right",
          bSuccess: "Right",
          aWritten: 0
        })

        // the lock is gone: A's failure (carried, and any later ones) is written
        yield* holder.executeRaw("ROLLBACK", [])
        yield* eventually(
          "A's failure written",
          countWhere("webhooks", "rkey = 'a' AND last_failure_kind = 'http_5xx' AND failed_attempts >= 1"),
          (n) =>
            n === 1,
          10_000
        )
      }).pipe(
        Effect.scoped,
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    120_000
  )
})
