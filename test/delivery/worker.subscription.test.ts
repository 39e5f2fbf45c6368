/**
 * The delivery-time checks of SPEC §4.2 and the circuit breaker of §4.3, through the real worker,
 * PostgreSQL and a real receiver: a subscription changed or deleted after enqueue is cancelled
 * without a request; an owner under reconciliation defers without spending an attempt; a missing
 * server-managed secret is retried and nothing unsigned is sent; an origin that keeps failing is
 * left alone while its circuit is open.
 *
 * The subscription checks run twice: with the state the claim statement read (an attempt right
 * after its claim) and with the state read again through RegistryStore (`snapshotMaxAgeMs: 0`).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { admit, CIRCUIT_MIN_DEFER_MS, prepare } from "../../src/services/delivery/Attempt.js"
import type { ClaimedRow, SubscriptionSnapshot } from "../../src/services/delivery/DeliveryStore.js"
import * as Destinations from "../../src/services/delivery/Destinations.js"
import { ev, plc, rev, sqlStack, WH, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, outboxRows, receiver, recordingPublisher, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const SECRET = "subscription-test-secret-0123"

const ENV = {
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  DELIVERY_RETRY_BASE_MS: "600000",
  DELIVERY_RETRY_MAX_MS: "3600000"
}

const MODES = [
  { name: "claim snapshot", snapshotMaxAgeMs: 1_000 },
  { name: "re-read through RegistryStore", snapshotMaxAgeMs: 0 }
] as const

for (const mode of MODES) {
  describe(`delivery-time subscription checks (${mode.name})`, () => {
    const options = { pollIntervalMs: 100, snapshotMaxAgeMs: mode.snapshotMaxAgeMs }

    it.scopedLive("URL changed between enqueue and attempt → cancelled, no request", () =>
      Effect.gen(function*() {
        const rx = yield* receiver({ secretFor: () => SECRET })
        const publisher = recordingPublisher()
        yield* run([
          whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/old`, secret: SECRET }), { rev: rev(1) })
        ])
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        // the record changes (new URL) before any worker runs
        yield* run([
          whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/new`, secret: SECRET }), { rev: rev(2) })
        ])
        yield* startWorker({ options, publisher: publisher.layer })
        const [row] = yield* eventually("cancelled", outboxRows, (rs) => rs[0]?.status === "cancelled")
        expect(row).toMatchObject({ last_error_kind: "subscription_changed", attempt_count: 0, lease_token: null })
        expect(row?.finished_at).not.toBeNull()
        expect(rx.received.length).toBe(0)
        expect(yield* countWhere("delivery_attempts", "true")).toBe(0)
        expect(yield* countWhere("audit", "status = 'cancelled' AND error_kind = 'subscription_changed'")).toBe(1)
        yield* eventually("published", Effect.sync(() => publisher.events.length), (n) => n === 1)
        expect(publisher.events[0]).toMatchObject({
          status: "cancelled",
          errorKind: "subscription_changed",
          url: "[redacted]"
        })

        // a new event for the changed subscription goes to the new URL
        yield* run([ev(BOB, POST, "p2", { rev: rev(11) })])
        yield* eventually("delivered to the new URL", Effect.sync(() => rx.received.length), (n) => n === 1)
        expect(rx.received[0]?.path).toBe("/new")
        expect(rx.received[0]?.verified).toEqual({ standard: true, wisp: true })
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

    it.scopedLive("record deleted → cancelled; record disabled → cancelled", () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([
          whEv(OWNER, "gone", whRecordValue(`at://${BOB}`, { url: `${rx.url}/gone` }), { rev: rev(1) }),
          whEv(OWNER, "off", whRecordValue(`at://${BOB}`, { url: `${rx.url}/off` }), { rev: rev(1) })
        ])
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        yield* run([
          whEv(OWNER, "gone", undefined, { operation: "delete", rev: rev(2) }),
          whEv(OWNER, "off", whRecordValue(`at://${BOB}`, { url: `${rx.url}/off`, enabled: false }), { rev: rev(2) })
        ])
        yield* startWorker({ options })
        const rows = yield* eventually("both cancelled", outboxRows, (rs) =>
          rs.length === 2 && rs.every((r) =>
            r.status === "cancelled"
          ))
        expect(rows.map((r) => r.last_error_kind)).toEqual(["subscription_changed", "subscription_changed"])
        expect(rx.received.length).toBe(0)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

    it.scopedLive("owner under reconciliation → deferred without spending an attempt, delivered after the scan", () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE owners SET reconcile_status = 'scanning' WHERE did = ${OWNER}`
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        yield* startWorker({ options: { ...options, scanningDeferMs: 1_500 } })
        const [deferred] = yield* eventually(
          "deferred",
          outboxRows,
          (rs) => rs[0]?.status === "pending" && rs[0].lease_token === null && rs[0].delay_s >= 1.4
        )
        expect(deferred).toMatchObject({ attempt_count: 0, last_error_kind: null })
        expect(rx.received.length).toBe(0)
        expect(yield* countWhere("delivery_attempts", "true")).toBe(0)
        // the scan completes: the next try delivers
        yield* sql`UPDATE owners SET reconcile_status = 'complete' WHERE did = ${OWNER}`
        const [done] = yield* eventually("delivered", outboxRows, (rs) => rs[0]?.status === "delivered", 15_000)
        expect(done?.attempt_count).toBe(1)
        expect(rx.received.length).toBe(1)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

    it.scopedLive("secretId that cannot be resolved → retried as secret_unavailable, nothing sent unsigned", () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([
          whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secretId: "missing" }), { rev: rev(1) })
        ])
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        yield* startWorker({
          options,
          secrets: [{ ownerDid: BOB, name: "missing", token: "belongs-to-someone-else-000000000" }]
        })
        const [row] = yield* eventually(
          "one failed attempt",
          outboxRows,
          (rs) => rs[0]?.attempt_count === 1 && rs[0].lease_token === null
        )
        expect(row).toMatchObject({ status: "pending", last_error_kind: "secret_unavailable", last_http_status: null })
        expect(row?.delay_s).toBeGreaterThanOrEqual(299.9)
        expect(rx.received.length).toBe(0)
        expect(yield* countWhere("delivery_attempts", "outcome = 'retry' AND error_kind = 'secret_unavailable'")).toBe(
          1
        )
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))
  })
}

describe("circuit breaker", () => {
  // 429 is a transient failure of the origin as much as a 5xx (SPEC §4.3): both open the circuit
  for (const [status, kind] of [[503, "http_5xx"], [429, "http_429"]] as const) {
    it.scopedLive(`after N consecutive failures (${status}) the origin's rows are rescheduled without a request`, () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([
          whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/status/${status}` }), { rev: rev(1) })
        ])
        yield* run(Array.from({ length: 6 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const worker = yield* startWorker({ options: { pollIntervalMs: 100 } })
        const rows = yield* eventually(
          "three failures, three deferred",
          outboxRows,
          (rs) =>
            rs.length === 6 &&
            rs.every((r) => r.lease_token === null) &&
            rs.filter((r) => r.attempt_count === 1).length === 3 &&
            rs.filter((r) => r.attempt_count === 0 && r.due_in_s > 30).length === 3,
          20_000
        )
        // the failed ones are retried with backoff; the deferred ones wait for the cool-down (60 s)
        for (const r of rows) {
          expect(r.status).toBe("pending")
          if (r.attempt_count === 1) expect(r).toMatchObject({ last_error_kind: kind, last_http_status: status })
          else expect(r).toMatchObject({ last_error_kind: null, last_http_status: null })
        }
        expect(rx.received.length).toBe(3)
        expect(yield* countWhere("delivery_attempts", "true")).toBe(3)
        expect((yield* worker.delivery.stats).openCircuits).toBe(1)
        // the health counts are refreshed in the background (CountsCache, every 2 s): a reading taken
        // while the rows were leased says pending 0 until the next refresh
        const report = yield* eventually(
          "health counts refreshed",
          worker.health.report,
          (r) => (r.body["delivery"] as { pending?: number } | undefined)?.pending === 6
        )
        expect(report.body["delivery"]).toMatchObject({ pending: 6, leased: 0, deadLetter: 0, openCircuits: 1 })
        expect(rx.received.every((q) => String(q.headers["x-firehook-webhook"]) === `at://${OWNER}/${WH}/w`)).toBe(true)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: { ...ENV, DELIVERY_CIRCUIT_THRESHOLD: "3", DELIVERY_PER_ORIGIN_CONCURRENCY: "1" }
          })
        )
      ))
  }
})

describe("prepare (the secret and transform step of SPEC §4.2, as a pure decision)", () => {
  const sub: SubscriptionSnapshot = {
    exists: true,
    active: true,
    enabled: true,
    gone: false,
    autoDisabled: false,
    url: "https://receiver.example/hook",
    fingerprint: "fp",
    signingMode: "record_secret",
    secretId: undefined,
    recordSecret: SECRET,
    ownerStatus: "complete"
  }
  const row: ClaimedRow = {
    deliveryId: "whd_v1_test",
    eventId: "whe_v1_test",
    ownerDid: OWNER,
    webhookRkey: "wh1",
    matchKind: "direct",
    eventDid: BOB,
    eventCollection: POST,
    eventRkey: "r1",
    eventOperation: "create",
    targetUrl: sub.url,
    signingMode: "record_secret",
    secretId: undefined,
    fingerprint: "fp",
    attemptCount: 0,
    leaseToken: "w:1",
    origin: "https://receiver.example",
    ageMs: 0,
    firstAttempt: true,
    reclaimed: false,
    crashCount: 0,
    body: "{\"timestamp\":\"2026-01-01T00:00:00.000Z\"}",
    snapshot: sub
  }
  const transformFor = () => Destinations.webhookPreset
  const startedAtMs = 1_700_000_000_999

  it("an inline-secret subscription whose secret is missing fails as secret_unavailable: never sent unsigned", () => {
    const settled = prepare(row, row.body ?? "", { ...sub, recordSecret: undefined }, undefined, transformFor, 0, 0)
    expect(settled).toMatchObject({ _tag: "Fail", kind: "secret_unavailable" })
  })

  it("signs with webhook-timestamp = the attempt's start in whole unix seconds, rounded down", () => {
    const settled = prepare(row, row.body ?? "", sub, SECRET, transformFor, startedAtMs, startedAtMs)
    if (settled._tag !== "Send") throw new Error(`expected Send, got ${settled._tag}`)
    expect(settled.request.headers["webhook-timestamp"]).toBe("1700000000")
    expect(settled.request.headers["X-Webhook-Signature"]).toMatch(/^sha256=[0-9a-f]{64}$/)
  })

  it("signs for the attempt's start however long the secret took; webhook-id and Idempotency-Key are the delivery id", () => {
    const settled = prepare(row, row.body ?? "", sub, SECRET, transformFor, startedAtMs, startedAtMs + 2_500)
    if (settled._tag !== "Send") throw new Error(`expected Send, got ${settled._tag}`)
    expect(settled.request.headers["webhook-timestamp"]).toBe("1700000000")
    expect(settled.request.headers["webhook-id"]).toBe(row.deliveryId)
    expect(settled.request.headers["Idempotency-Key"]).toBe(row.deliveryId)
  })
})

describe("admit (the circuit breaker step of SPEC §4.3, as a pure decision)", () => {
  it("an open origin defers until its cool-down ends, never by less than CIRCUIT_MIN_DEFER_MS", () => {
    const at = 1_700_000_000_000
    expect(admit("open", at + 5_000, at)).toMatchObject({ _tag: "Defer", delayMs: 5_000, reason: "circuit_open" })
    expect(admit("open", at + 10, at)).toMatchObject({ _tag: "Defer", delayMs: CIRCUIT_MIN_DEFER_MS })
    expect(admit("open", at - 10_000, at)).toMatchObject({ _tag: "Defer", delayMs: CIRCUIT_MIN_DEFER_MS })
    expect(admit("closed", 0, at)).toBeUndefined()
    expect(admit("probe", 0, at)).toBeUndefined()
  })
})
