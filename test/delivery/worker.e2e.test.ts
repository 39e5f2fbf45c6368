/**
 * The delivery worker end to end on real PostgreSQL and a real HTTP receiver: webhooks registered
 * through processEvents, an event enqueued, the worker woken by NOTIFY, requests signed exactly as
 * SPEC §4.5 says and verified by the `standardwebhooks` library and an independent HMAC.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Tracer } from "effect"
import packageJson from "../../package.json" with { type: "json" }
import * as Metrics from "../../src/services/platform/Metrics.js"
import { ev, plc, rev, sqlStack, WH, whEv, whRecordValue } from "../support/stack.js"
import {
  countWhere,
  eventually,
  outboxRows,
  receiver,
  recordingPublisher,
  run,
  startWorker,
  whsec
} from "./worker-support.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const DAVE = plc(4)
const EVE = plc(5)
const FRANK = plc(6)
const POST = "app.bsky.feed.post"

const SECRETS: Record<string, string> = {
  [`at://${ALICE}/${WH}/a`]: whsec(7),
  [`at://${CAROL}/${WH}/c`]: "a plain shared secret, not whsec",
  [`at://${EVE}/${WH}/e`]: whsec(9),
  [`at://${DAVE}/${WH}/d`]: "dave-secret-0123456789"
}

/** Exactly the headers of SPEC §4.5, plus what HTTP/1.1 framing adds (Host, Connection). */
const EXPECTED_HEADERS = [
  "connection",
  "content-length",
  "content-type",
  "host",
  "idempotency-key",
  "user-agent",
  "webhook-id",
  "webhook-signature",
  "webhook-timestamp",
  "x-firehook-match",
  "x-firehook-webhook",
  "x-webhook-signature"
]

describe("delivery worker end to end", () => {
  it.scopedLive(
    "delivers signed requests within tens of milliseconds of the enqueue (NOTIFY, not the 30 s poll)",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver({ secretFor: (uri) => SECRETS[uri] })
        const publisher = recordingPublisher()
        yield* run([
          whEv(ALICE, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/hooks/alice`, secret: whsec(7) }), {
            rev: rev(1)
          }),
          whEv(
            CAROL,
            "c",
            whRecordValue(`at://${BOB}/${POST}`, {
              url: `${rx.url}/hooks/carol`,
              secret: SECRETS[`at://${CAROL}/${WH}/c`] ?? ""
            }),
            { rev: rev(1) }
          ),
          whEv(EVE, "e", whRecordValue(`at://${BOB}`, { url: `${rx.url}/hooks/eve`, secretId: "main" }), {
            rev: rev(1)
          }),
          whEv(
            DAVE,
            "d",
            whRecordValue(`at://${BOB}`, {
              url: `${rx.url}/hooks/dave`,
              backlinks: true,
              secret: "dave-secret-0123456789"
            }),
            { rev: rev(1) }
          )
        ])
        const worker = yield* startWorker({
          options: { pollIntervalMs: 30_000 },
          secrets: [{ ownerDid: EVE, name: "main", token: whsec(9) }],
          publisher: publisher.layer
        })
        yield* worker.delivery.awaitListening.pipe(Effect.timeout(Duration.seconds(10)))

        const t0 = performance.now()
        const result = yield* run([
          ev(BOB, POST, "p1", {
            rev: rev(10),
            record: { $type: POST, text: "hello ✓ \u2028 world", createdAt: "2026-01-01T00:00:00Z" }
          }),
          ev(FRANK, "app.bsky.feed.like", "l1", {
            rev: rev(11),
            record: {
              $type: "app.bsky.feed.like",
              subject: { uri: `at://${BOB}/${POST}/p1`, cid: "bafyreib2rxk3rh6kzwq" }
            }
          })
        ])
        expect(result.inserted).toBe(5)
        yield* eventually("five requests", Effect.sync(() => rx.received.length), (n) => n >= 5, 10_000)
        const first = Math.min(...rx.received.map((r) => r.at))
        // the poll interval is 30 s: only the notification can explain an attempt this early
        expect(first - t0).toBeLessThan(1_000)

        const sql = yield* SqlClient.SqlClient
        const bodies = yield* sql<{ delivery_id: string; body: string; owner_did: string; match_kind: string }>`
          SELECT o.delivery_id, e.body, o.owner_did, o.match_kind FROM outbox o JOIN delivery_events e USING (event_id)`
        expect(bodies.length).toBe(5)
        expect(rx.received.length).toBe(5)
        for (const req of rx.received) {
          const id = req.headers["webhook-id"]
          const row = bodies.find((b) => b.delivery_id === id)
          expect(row).toBeDefined()
          if (row === undefined) continue
          // every signature verifies, both schemes
          expect(req.verified).toEqual({ standard: true, wisp: true })
          // exactly the §4.5 headers
          expect([...req.headerNames].sort()).toEqual(EXPECTED_HEADERS)
          expect(req.method).toBe("POST")
          expect(req.headers["content-type"]).toBe("application/json")
          expect(req.headers["user-agent"]).toBe(`firehook/${packageJson.version}`)
          expect(req.headers["idempotency-key"]).toBe(row.delivery_id)
          expect(req.headers["x-firehook-webhook"]).toMatch(new RegExp(`^at://${row.owner_did}/${WH}/[a-z]$`))
          expect(req.headers["x-firehook-match"]).toBe(row.match_kind)
          const ts = Number(req.headers["webhook-timestamp"])
          expect(Math.abs(ts - Math.floor(Date.now() / 1000))).toBeLessThanOrEqual(5)
          // the body, byte for byte
          expect(req.body.equals(Buffer.from(row.body, "utf8"))).toBe(true)
          expect(req.headers["content-length"]).toBe(String(Buffer.byteLength(row.body, "utf8")))
        }
        expect(bodies.filter((b) => b.match_kind === "backlink").map((b) => b.owner_did)).toEqual([DAVE])

        // settled: delivered, one attempt recorded, lease cleared, audit (URL redacted), published
        yield* eventually(
          "all delivered",
          outboxRows,
          (rows) => rows.every((r) => r.status === "delivered"),
          10_000
        )
        for (const r of yield* outboxRows) {
          expect(r).toMatchObject({ attempt_count: 1, last_http_status: 200, last_error_kind: null, lease_token: null })
          expect(r.finished_at).not.toBeNull()
        }
        expect(yield* countWhere("delivery_attempts", "outcome = 'delivered' AND http_status = 200 AND attempt = 1"))
          .toBe(5)
        expect(yield* countWhere("audit", "status = 'delivered' AND url = '[redacted]'")).toBe(5)
        expect(yield* countWhere("audit", "url <> '[redacted]'")).toBe(0)
        yield* eventually("published", Effect.sync(() => publisher.events.length), (n) => n >= 5)
        expect(publisher.events.every((e) => e.status === "delivered" && e.url === "[redacted]")).toBe(true)

        // health: counts only, never gating readiness (the counts are refreshed in the background,
        // every 2 s: the first report after the deliveries may still show them pending)
        const idle = {
          pending: 0,
          leased: 0,
          deadLetter: 0,
          inFlight: 0,
          openCircuits: 0,
          autoDisabledWebhooks: 0,
          goneWebhooks: 0,
          stale: false
        }
        const report = yield* eventually(
          "health counts refreshed",
          worker.health.report,
          (r) => JSON.stringify(r.body["delivery"]) === JSON.stringify(idle)
        )
        expect(report.body["delivery"]).toEqual(idle)
        const stats = yield* worker.delivery.stats
        expect(stats.listening).toBe(true)
        expect(stats.attempts).toBe(5)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))),
    60_000
  )

  it.scopedLive(
    "a LISTEN connection that PostgreSQL drops is opened again: the next enqueue is delivered by NOTIFY, not the poll",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const rx = yield* receiver()
        yield* run([whEv(ALICE, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/x` }), { rev: rev(1) })])
        const worker = yield* startWorker({ options: { pollIntervalMs: 30_000 } })
        yield* worker.delivery.awaitListening.pipe(Effect.timeout(Duration.seconds(10)))
        const listeners = sql<{ readonly pid: number }>`
          SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()`
        const before = (yield* listeners).map((r) => r.pid)
        expect(before.length).toBe(1)
        yield* sql`SELECT pg_terminate_backend(pid) FROM unnest(${before}::int[]) AS t(pid)`

        // the worker sees the loss, listens on a new connection and hears its own probe again
        yield* eventually(
          "listening again",
          Effect.zip(listeners, worker.delivery.stats),
          ([rows, stats]) => rows.length === 1 && rows[0]?.pid !== before[0] && stats.listening
        )
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        yield* eventually("delivered", Effect.sync(() => rx.received.length), (n) => n >= 1, 10_000)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))),
    60_000
  )

  it.scopedLive(
    "a Lifecycle shutdown stops claiming: a row enqueued afterwards is left to another worker",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([whEv(ALICE, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/x` }), { rev: rev(1) })])
        const first = yield* startWorker({ options: { pollIntervalMs: 50, workerId: "first" } })
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        yield* eventually("delivered", outboxRows, (rows) => rows[0]?.status === "delivered")
        const report = yield* first.lifecycle.shutdown
        expect(report.clean).toBe(true)
        const stopped = yield* first.delivery.stats
        expect(stopped.stopping).toBe(true)
        expect(stopped.attempts).toBe(1)
        yield* run([ev(BOB, POST, "p2", { rev: rev(11) })])
        const second = yield* startWorker({ options: { pollIntervalMs: 50, workerId: "second" } })
        yield* eventually("second row delivered", outboxRows, (rows) => rows.every((r) => r.status === "delivered"))
        // the stopped worker neither claimed nor sent anything after its shutdown
        const after = yield* first.delivery.stats
        expect(after.claims).toBe(stopped.claims)
        expect(after.attempts).toBe(1)
        expect((yield* second.delivery.stats).attempts).toBe(1)
        expect(rx.received.length).toBe(2)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))),
    60_000
  )

  it.scopedLive(
    "shutdown: rows not started go back at once; a running attempt gets the grace period, then is interrupted and its row stays leased",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([whEv(ALICE, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/hang` }), { rev: rev(1) })])
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) }), ev(BOB, POST, "p2", { rev: rev(11) })])
        const worker = yield* startWorker({ options: { pollIntervalMs: 50, graceMs: 300 } })
        // one request hangs; the other row is held, waiting for the origin's only permit
        yield* eventually("one hanging request", Effect.sync(() => rx.received.length), (n) => n === 1)
        yield* eventually("both leased", outboxRows, (rs) => rs.every((r) => r.status === "leased"))
        const t0 = performance.now()
        const report = yield* worker.lifecycle.shutdown
        const took = performance.now() - t0
        expect(report).toEqual({ clean: true, unclean: [] })
        expect(took).toBeGreaterThanOrEqual(250)
        expect(took).toBeLessThan(5_000)
        const rows = yield* outboxRows
        const inFlight = rows.find((r) => r.status === "leased")
        const waiting = rows.find((r) => r.status === "pending")
        expect(inFlight).toMatchObject({ attempt_count: 0 })
        expect(inFlight?.lease_token).not.toBeNull()
        expect(waiting).toMatchObject({ attempt_count: 0, lease_token: null, last_error_kind: null })
        expect(waiting?.due_in_s).toBeLessThanOrEqual(0)
        expect(rx.received.length).toBe(1)
        expect((yield* worker.delivery.stats).inFlight).toBe(0)
        // the metrics of the worker are exposed
        const text = yield* Metrics.exposition
        for (
          const name of [
            "firehook_delivery_attempts_total",
            "firehook_delivery_first_attempt_latency_ms_bucket",
            "firehook_delivery_attempt_duration_ms_bucket",
            "firehook_delivery_in_flight",
            "firehook_delivery_open_circuits"
          ]
        ) {
          expect(text).toContain(name)
        }
      }).pipe(
        Effect.scoped,
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", DELIVERY_PER_ORIGIN_CONCURRENCY: "1" } }))
      ),
    60_000
  )

  it.scopedLive(
    "shutdown: a grace period longer than the shutdown deadline ends before it; the stop is clean and the cut-off row's reclaim is no crash",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([whEv(ALICE, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/hang` }), { rev: rev(1) })])
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        // SHUTDOWN_TIMEOUT_MS 6000 (below): the grace period ends 1.5 s before the deadline, room for a loaded machine
        const worker = yield* startWorker({
          options: { pollIntervalMs: 50, graceMs: 60_000 },
          shutdownTimeoutMs: 6_000
        })
        yield* eventually("one hanging request", Effect.sync(() => rx.received.length), (n) => n === 1)
        const t0 = performance.now()
        const report = yield* worker.lifecycle.shutdown
        const took = performance.now() - t0
        expect(report).toEqual({ clean: true, unclean: [] })
        expect(took).toBeGreaterThanOrEqual(4_000)
        expect(took).toBeLessThan(6_000)
        // the row stays leased (SPEC §6.3); the suspect count its reclaim adds is taken back first
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ status: string; attempt_count: number; crash_count: number }>`
          SELECT status, attempt_count, crash_count FROM outbox`
        expect(rows).toEqual([{ status: "leased", attempt_count: 0, crash_count: -1 }])
      }).pipe(
        Effect.scoped,
        Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", SHUTDOWN_TIMEOUT_MS: "6000" } }))
      ),
    60_000
  )

  it.scopedLive(
    "with a tracer installed (an embedder's OpenTelemetry layer, say) every attempt is one Delivery.attempt span",
    () =>
      Effect.gen(function*() {
        const builtIn = yield* Effect.tracer
        const names: Array<string> = []
        const recording = Tracer.make({
          span: (...args: Parameters<Tracer.Tracer["span"]>) => {
            names.push(args[0])
            return builtIn.span(...args)
          },
          context: builtIn.context
        })
        const rx = yield* receiver()
        yield* run([whEv(ALICE, "a", whRecordValue(`at://${BOB}`, { url: `${rx.url}/x` }), { rev: rev(1) })])
        yield* startWorker({ options: { pollIntervalMs: 50 } }).pipe(Effect.withTracer(recording))
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) }), ev(BOB, POST, "p2", { rev: rev(11) })])
        yield* eventually("delivered", outboxRows, (rows) =>
          rows.length === 2 && rows.every((r) =>
            r.status === "delivered"
          ))
        expect(names.filter((n) => n === "Delivery.attempt").length).toBe(2)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))),
    60_000
  )
})
