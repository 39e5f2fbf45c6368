/**
 * Auto-disable (SPEC §4.3) on PostgreSQL:
 * - the rule, under the TestClock (it reads the workers' Clock): the settle path of the SQL
 *   `DeliveryStore` is driven directly (claim, then settle each row as the worker would, with the
 *   attempt's Clock time): a receiver failing for 5 days (≥ 20 failed attempts, no 2xx) is
 *   auto-disabled exactly when the period is reached; one answering 2xx once within the period is not;
 * - parking and resume, through the real worker and a real receiver: a new event for the disabled
 *   webhook is parked as a dead letter (`webhook_disabled`) without a request; `resume` with
 *   `replay` delivers it under its original id.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, TestClock } from "effect"
import * as DeliveryStore from "../../src/services/delivery/DeliveryStore.js"
import { makeRecorder } from "../../src/services/delivery/WebhookHealthSql.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import {
  countWhere,
  eventually,
  receiver,
  resumeReplaysParked,
  rowsOfEvent,
  run,
  startWorker
} from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const SECRET = "auto-disable-secret-0123456789"

const stateOf = (rkey: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<{ auto: boolean; failed_attempts: number; parked: number; success: boolean }>`
      SELECT auto_disabled_at IS NOT NULL AS auto, failed_attempts, parked, last_success_at IS NOT NULL AS success
      FROM webhooks WHERE owner_did = ${OWNER} AND rkey = ${rkey}`
  ).pipe(
    Effect.map((r) => r[0]),
    Effect.orDie
  )

const register = (url: (rkey: string) => string) =>
  run(
    ["down", "flaky"].map((rkey) =>
      whEv(OWNER, rkey, whRecordValue(`at://${BOB}`, { url: url(rkey), secret: SECRET }), { rev: rev(1) })
    )
  )

/** The failure kind of a non-2xx answer (SPEC §4.3). */
const kindOf = (status: number) => (status >= 500 ? "http_5xx" : "http_4xx")

/** Claim the due rows and settle each as the worker does after an attempt that took 50 ms. */
const attemptAll = (answer: (rkey: string) => number) =>
  Effect.gen(function*() {
    const store = yield* DeliveryStore.DeliveryStore
    const claimed = yield* store.claim("test-worker", 100, 60_000)
    for (const row of claimed.rows) {
      const startedAtMs = yield* Clock.currentTimeMillis
      const status = answer(row.webhookRkey)
      const attempt = { startedAtMs, durationMs: 50, errorKind: undefined, responseExcerpt: undefined }
      const applied = status < 300
        ? yield* store.markDelivered(row.deliveryId, row.leaseToken, {
          attemptCount: 1,
          httpStatus: status,
          attempt: { ...attempt, outcome: "delivered", httpStatus: status }
        })
        : yield* store.deadLetter(row.deliveryId, row.leaseToken, {
          attemptCount: 1,
          errorKind: kindOf(status),
          httpStatus: status,
          attempt: { ...attempt, outcome: "dead_letter", errorKind: kindOf(status), httpStatus: status }
        })
      expect(applied).toBe(true)
    }
    return claimed.rows.length
  })

describe("auto-disable", () => {
  it.scoped(
    "the count bound: failures 10 h apart pass the 5 days at the 13th, but only the 20th disables (SPEC §4.3: at least 20)",
    () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        yield* register((rkey) => `https://${rkey}.example/hook`)
        for (let i = 0; i < 20; i++) {
          yield* run([ev(BOB, POST, `c${i}`, { rev: rev(10 + i) })])
          expect(yield* attemptAll(() => 503)).toBe(2)
          // failure i + 1 at 10·i h: 120 h have passed from i = 12 on, 20 failures only at i = 19
          expect([i, (yield* stateOf("down"))?.auto]).toEqual([i, i >= 19])
          yield* TestClock.adjust(Duration.hours(10))
        }
        expect(yield* stateOf("down")).toMatchObject({ auto: true, failed_attempts: 20 })
      }).pipe(
        Effect.provide(DeliveryStore.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    240_000
  )

  it.scoped(
    "the rule under the TestClock: 5 days and ≥ 20 failures; a 2xx within the period restarts it",
    () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        yield* register((rkey) => `https://${rkey}.example/hook`)
        // 24 events 6 hours apart: "down" always answers 503; "flaky" answers 200 once, at event 12
        for (let i = 0; i < 24; i++) {
          yield* run([ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })])
          expect(yield* attemptAll((rkey) => (rkey === "flaky" && i === 12 ? 200 : 503))).toBe(2)
          // the 21st failure (i = 20) is 120 h after the first: disabled there, not earlier
          expect((yield* stateOf("down"))?.auto).toBe(i >= 20)
          yield* TestClock.adjust(Duration.hours(6))
        }
        expect(yield* stateOf("down")).toEqual({ auto: true, failed_attempts: 24, parked: 0, success: false })
        // flaky's streak restarted at its 2xx (event 12): 11 failures over 66 h since, not disabled
        expect(yield* stateOf("flaky")).toEqual({ auto: false, failed_attempts: 11, parked: 0, success: true })
        // a new record version (new fingerprint) is a new registration: the state is cleared
        yield* run([
          whEv(OWNER, "down", whRecordValue(`at://${BOB}`, { url: "https://down.example/v2", secret: SECRET }), {
            rev: rev(2)
          })
        ])
        expect(yield* stateOf("down")).toEqual({ auto: false, failed_attempts: 0, parked: 0, success: false })
      }).pipe(
        Effect.provide(DeliveryStore.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    240_000
  )

  it.scoped(
    "a 2xx and later failures in one settle batch: the streak restarts at the 2xx and counts the failures after it",
    () =>
      Effect.gen(function*() {
        yield* register((rkey) => `https://${rkey}.example/hook`)
        const sql = yield* SqlClient.SqlClient
        const [hook] = yield* sql<{ fingerprint: string }>`
          SELECT fingerprint FROM webhooks WHERE owner_did = ${OWNER} AND rkey = 'down'`
        if (hook === undefined) return expect.fail("registered")
        const t0 = Date.now()
        const attempt = (token: string, atMs: number, httpStatus: number) => ({
          token,
          park: false,
          attempt: {
            startedAtMs: atMs,
            durationMs: 10,
            outcome: httpStatus < 300 ? "delivered" as const : "retry" as const,
            errorKind: httpStatus < 300 ? undefined : "http_5xx",
            httpStatus,
            responseExcerpt: undefined
          }
        })
        // in batch order: a failure, the 2xx, then two failures after it
        const items = [
          attempt("t1", t0, 503),
          attempt("t2", t0 + 1_000, 200),
          attempt("t3", t0 + 2_000, 503),
          attempt("t4", t0 + 3_000, 503)
        ]
        const applied = items.map((i) => ({
          lease_token: i.token,
          owner_did: OWNER,
          webhook_rkey: "down",
          fingerprint: hook.fingerprint,
          status: "pending"
        }))
        yield* makeRecorder(sql, 432_000_000)(items, applied)
        expect(yield* stateOf("down")).toEqual({ auto: false, failed_attempts: 2, parked: 0, success: true })
      }).pipe(
        Effect.provide(DeliveryStore.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    240_000
  )

  it.scoped(
    "4xx answers are failed attempts: 20 of them over the period auto-disable the webhook",
    () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        yield* register((rkey) => `https://${rkey}.example/hook`)
        for (let i = 0; i < 21; i++) {
          yield* run([ev(BOB, POST, `q${i}`, { rev: rev(10 + i) })])
          expect(yield* attemptAll(() => 404)).toBe(2)
          yield* TestClock.adjust(Duration.hours(6))
        }
        expect(yield* stateOf("down")).toMatchObject({ auto: true, failed_attempts: 21 })
      }).pipe(
        Effect.provide(DeliveryStore.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    240_000
  )

  it.scoped(
    "DELIVERY_AUTO_DISABLE_AFTER_MS=0 never auto-disables: failures are counted, the webhook stays enabled",
    () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        yield* register((rkey) => `https://${rkey}.example/hook`)
        for (let i = 0; i < 21; i++) {
          yield* run([ev(BOB, POST, `z${i}`, { rev: rev(10 + i) })])
          expect(yield* attemptAll(() => 503)).toBe(2)
          yield* TestClock.adjust(Duration.hours(6))
        }
        expect(yield* stateOf("down")).toMatchObject({ auto: false, failed_attempts: 21 })
      }).pipe(
        Effect.provide(DeliveryStore.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", DELIVERY_AUTO_DISABLE_AFTER_MS: "0" } }))
      ),
    240_000
  )

  it.scopedLive(
    "parked without a request while auto-disabled; resume with replay delivers them under their ids",
    () =>
      Effect.gen(function*() {
        let downOk = false
        const rx = yield* receiver({
          secretFor: () => SECRET,
          reply: (path) => ({ status: path === "/down" && !downOk ? 503 : 200 })
        })
        yield* register((rkey) => `${rx.url}/${rkey}`)
        const sql = yield* SqlClient.SqlClient
        // as the rule left it (see above)
        yield* sql`UPDATE webhooks SET auto_disabled_at = now(), failing_since = now() - interval '5 days',
          failed_attempts = 21, last_failure_kind = 'http_5xx', last_failure_http = 503
          WHERE owner_did = ${OWNER} AND rkey = 'down'`
        yield* startWorker({ options: { pollIntervalMs: 100 } })

        yield* run([ev(BOB, POST, "late", { rev: rev(100) })])
        const late = yield* eventually("settled", rowsOfEvent("late"), (rs) =>
          rs.length === 2 && rs.every((r) =>
            r.status !== "pending" && r.status !== "leased"
          ))
        expect(late.map((r) => [r.webhook_rkey, r.status, r.last_error_kind, r.attempt_count])).toEqual([
          ["down", "dead_letter", "webhook_disabled", 0],
          ["flaky", "delivered", null, 1]
        ])
        const parkedId = late[0]?.delivery_id ?? ""
        expect(rx.received.filter((r) => r.path === "/down")).toHaveLength(0)
        expect(rx.hits.get(parkedId)).toBeUndefined()
        expect(yield* countWhere("delivery_attempts", `delivery_id = '${parkedId}'`)).toBe(0)
        expect(yield* countWhere("audit", `delivery_id = '${parkedId}' AND error_kind = 'webhook_disabled'`)).toBe(1)
        yield* eventually("parked counted", stateOf("down"), (s) => s?.parked === 1)

        // the receiver is fixed; resume with replay: the parked row is delivered under its id
        downOk = true
        yield* resumeReplaysParked(OWNER, "down", "late", parkedId)
        expect(rx.hits.get(parkedId)).toBe(1)
        const sent = rx.received.filter((r) => r.path === "/down")
        expect(sent).toHaveLength(1)
        expect(sent[0]?.headers["webhook-id"]).toBe(parkedId)
        expect(sent[0]?.verified).toEqual({ standard: true, wisp: true })
        expect(yield* stateOf("down")).toMatchObject({ auto: false, failed_attempts: 0, parked: 0 })
      }).pipe(
        Effect.provide(WebhookState.layerSql),
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))
      ),
    120_000
  )
})
