/**
 * Failure classification (SPEC §4.3) through real responses from a real receiver: which answers are
 * retried (and when), which are dead-lettered, 410 marking the subscription gone, timeouts,
 * refused connections, large responses (truncated, classified by status) and Retry-After.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Queue } from "effect"
import { judge } from "../../src/services/delivery/Attempt.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import type { OutgoingRequest } from "../../src/services/delivery/Destinations.js"
import { ev, plc, rev, sqlStack, WH, whEv, whRecordValue } from "../support/stack.js"
import {
  closedPort,
  countWhere,
  eventually,
  outboxRows,
  receiver,
  recordingPublisher,
  routeByPath,
  run,
  startWorker
} from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const SECRET = "classification-secret-0123456789"

/** rkey → path on the receiver, and what must become of the delivery. */
const CASES: ReadonlyArray<{
  readonly rkey: string
  readonly path: string
  readonly status: "pending" | "dead_letter" | "delivered"
  readonly kind: string | null
  readonly http: number | null
}> = [
  { rkey: "s200", path: "/status/200", status: "delivered", kind: null, http: 200 },
  { rkey: "s204", path: "/status/204", status: "delivered", kind: null, http: 204 },
  { rkey: "s408", path: "/status/408", status: "pending", kind: "http_5xx", http: 408 },
  { rkey: "s409", path: "/status/409", status: "pending", kind: "http_5xx", http: 409 },
  { rkey: "s423", path: "/status/423", status: "pending", kind: "http_5xx", http: 423 },
  { rkey: "s425", path: "/status/425", status: "pending", kind: "http_5xx", http: 425 },
  { rkey: "s429", path: "/status/429", status: "pending", kind: "http_429", http: 429 },
  { rkey: "s500", path: "/status/500", status: "pending", kind: "http_5xx", http: 500 },
  { rkey: "s503", path: "/status/503", status: "pending", kind: "http_5xx", http: 503 },
  { rkey: "s400", path: "/status/400", status: "dead_letter", kind: "http_4xx", http: 400 },
  { rkey: "s404", path: "/status/404", status: "dead_letter", kind: "http_4xx", http: 404 },
  { rkey: "s410", path: "/status/410", status: "dead_letter", kind: "gone", http: 410 },
  { rkey: "s302", path: "/redirect", status: "dead_letter", kind: "redirect", http: 302 },
  { rkey: "hang", path: "/hang", status: "pending", kind: "timeout", http: null },
  // a body over 64 KiB is truncated, never a failure by itself (SPEC §4.3)
  { rkey: "big", path: "/big", status: "delivered", kind: null, http: 200 },
  { rkey: "ra120", path: "/retry-after/120", status: "pending", kind: "http_5xx", http: 503 }
]

const ENV = {
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  // long enough for every answering receiver on a loaded machine (300 ms timed out a 204 under
  // load); the hanging one still times out well within the wait below
  DELIVERY_TIMEOUT_MS: "3000",
  // retries must not come back during the test
  DELIVERY_RETRY_BASE_MS: "600000",
  DELIVERY_RETRY_MAX_MS: "3600000"
}

describe("delivery worker: classification through real responses", () => {
  it.scopedLive(
    "every class settles as SPEC §4.3 says",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver({ secretFor: () => SECRET })
        const refused = yield* closedPort
        const publisher = recordingPublisher()
        const registrations = [
          ...CASES.map((c) =>
            whEv(OWNER, c.rkey, whRecordValue(`at://${BOB}`, { url: `${rx.url}${c.path}`, secret: SECRET }), {
              rev: rev(1)
            })
          ),
          whEv(
            OWNER,
            "refused",
            whRecordValue(`at://${BOB}`, { url: `http://127.0.0.1:${refused}/hook`, secret: SECRET }),
            { rev: rev(1) }
          )
        ]
        yield* run(registrations)
        // the live tail's feed (SPEC §8.5): subscribed before the worker settles anything
        const outcomes = yield* DeliveryOutcomes.make()
        const feed = yield* outcomes.subscribe
        yield* startWorker({
          options: { pollIntervalMs: 100 },
          publisher: publisher.layer,
          outcomes: Layer.succeed(DeliveryOutcomes.DeliveryOutcomes, outcomes)
        })
        const r = yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        expect(r.inserted).toBe(CASES.length + 1)

        const rows = yield* eventually(
          "every delivery attempted once",
          outboxRows,
          (rs) => rs.length === CASES.length + 1 && rs.every((x) => x.lease_token === null && x.attempt_count === 1),
          20_000
        )
        const byRkey = new Map(rows.map((x) => [x.webhook_rkey, x]))
        for (const c of CASES) {
          const row = byRkey.get(c.rkey)
          expect({ rkey: c.rkey, status: row?.status, kind: row?.last_error_kind, http: row?.last_http_status })
            .toEqual({
              rkey: c.rkey,
              status: c.status,
              kind: c.kind,
              http: c.http
            })
          if (c.status === "pending") {
            if (c.rkey === "ra120") {
              // Retry-After: 120 (seconds) overrides the backoff exactly
              expect(row?.delay_s).toBeGreaterThan(119.9)
              expect(row?.delay_s).toBeLessThan(120.1)
            } else {
              // equal jitter on the 600 s base: [300, 600] s
              expect(row?.delay_s).toBeGreaterThanOrEqual(299.9)
              expect(row?.delay_s).toBeLessThanOrEqual(600.1)
            }
            expect(row?.finished_at).toBeNull()
          } else {
            expect(row?.finished_at).not.toBeNull()
          }
        }
        expect(byRkey.get("refused")).toMatchObject({ status: "pending", last_error_kind: "network", attempt_count: 1 })

        // 410: the subscription is marked gone (no more requests until it is resumed or its record changes)
        const sql = yield* SqlClient.SqlClient
        const gone = yield* sql<{ rkey: string }>`SELECT rkey FROM webhooks WHERE gone_at IS NOT NULL`
        expect(gone.map((g) => g.rkey)).toEqual(["s410"])

        // the receiver saw one request per reachable case, every one signed and verified
        expect(rx.received.length).toBe(CASES.length)
        expect(rx.received.every((q) => q.verified?.standard === true && q.verified.wisp === true)).toBe(true)

        // attempts recorded with their class; audit and publishing only for terminal outcomes
        expect(yield* countWhere("delivery_attempts", "attempt = 1")).toBe(CASES.length + 1)
        expect(
          yield* countWhere("delivery_attempts", "outcome = 'retry' AND error_kind = 'timeout' AND http_status IS NULL")
        ).toBe(1)
        expect(
          yield* countWhere(
            "delivery_attempts",
            "response_excerpt IS NOT NULL AND octet_length(response_excerpt) > 1024"
          )
        ).toBe(0)
        const terminal = CASES.filter((c) => c.status !== "pending").length
        expect(yield* countWhere("audit", "true")).toBe(terminal)
        expect(yield* countWhere("audit", "status = 'dead_letter' AND error_kind = 'gone' AND http_status = 410")).toBe(
          1
        )
        yield* eventually("published", Effect.sync(() => publisher.events.length), (n) => n >= terminal)
        expect(publisher.events.filter((e) => e.status === "dead_letter").map((e) => e.errorKind).sort()).toEqual(
          ["gone", "http_4xx", "http_4xx", "redirect"]
        )
        // the same terminal outcomes, once each, reach the live tail's feed: never a retry
        const fed = [...(yield* Queue.takeAll(feed))]
        const byId = new Map(rows.map((x) => [x.delivery_id, x]))
        expect(fed.length).toBe(terminal)
        expect(new Set(fed.map((o) => o.id)).size).toBe(terminal)
        for (const o of fed) {
          const row = byId.get(o.id)
          expect({ owner: o.owner, rkey: o.rkey, status: o.status, kind: o.errorKind, http: o.httpStatus ?? null })
            .toEqual({
              owner: OWNER,
              rkey: row?.webhook_rkey,
              status: row?.status,
              kind: o.status === "delivered" ? undefined : row?.last_error_kind,
              http: row?.last_http_status
            })
          expect(o.event).toBe("create")
        }

        // a later event still matches the gone subscription (SPEC §4.3): its row is enqueued and
        // parked as a dead letter (webhook_disabled) without a request, so a replay recovers it
        const later = yield* run([ev(BOB, POST, "p2", { rev: rev(11) })])
        expect(later.inserted).toBe(CASES.length + 1)
        yield* eventually(
          "the gone subscription's new row parked",
          countWhere(
            "outbox",
            `webhook_rkey = 's410' AND event_rkey = 'p2' AND status = 'dead_letter'
              AND last_error_kind = 'webhook_disabled' AND attempt_count = 0`
          ),
          (n) => n === 1,
          20_000
        )
        // until its record changes: written again, it matches and is delivered to its new path
        yield* run([
          whEv(OWNER, "s410", whRecordValue(`at://${BOB}`, { url: `${rx.url}/status/200`, secret: SECRET }), {
            rev: rev(12)
          })
        ])
        expect(yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM webhooks WHERE gone_at IS NOT NULL`).toEqual([{
          n: 0
        }])
        const again = yield* run([ev(BOB, POST, "p3", { rev: rev(13) })])
        expect(again.inserted).toBe(CASES.length + 1)
        yield* eventually(
          "the re-written subscription delivered",
          countWhere("outbox", `webhook_rkey = 's410' AND status = 'delivered'`),
          (n) => n === 1,
          20_000
        )
        expect(rx.received.filter((q) => q.path === "/status/410").length).toBe(1)
        expect(rx.received.every((q) => String(q.headers["x-firehook-webhook"]).startsWith(`at://${OWNER}/${WH}/`)))
          .toBe(true)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))),
    60_000
  )

  it.scopedLive(
    "a large response body is truncated: the status alone classifies (200 delivered, 503 retried, 410 gone)",
    () =>
      Effect.gen(function*() {
        // 100 KiB: "x", then two-byte characters, so the 1 KiB excerpt ends inside one
        const large = Buffer.from("x" + "é".repeat(50 * 1024), "utf8")
        const rx = yield* receiver({
          secretFor: () => SECRET,
          reply: (path) => {
            const m = /^\/large\/(chunked|declared)\/(\d{3})$/.exec(path)
            if (m === null) return routeByPath(path)
            // chunked: no Content-Length, the body streams; declared: Content-Length 102401
            const headers: Record<string, string> = m[1] === "chunked" ? { "transfer-encoding": "chunked" } : {}
            return { status: Number(m[2]), headers, body: large }
          }
        })
        const cases = [
          { rkey: "d200", path: "/large/declared/200", status: "delivered", kind: null, http: 200 },
          { rkey: "c200", path: "/large/chunked/200", status: "delivered", kind: null, http: 200 },
          { rkey: "d503", path: "/large/declared/503", status: "pending", kind: "http_5xx", http: 503 },
          { rkey: "c503", path: "/large/chunked/503", status: "pending", kind: "http_5xx", http: 503 },
          { rkey: "d410", path: "/large/declared/410", status: "dead_letter", kind: "gone", http: 410 },
          { rkey: "c410", path: "/large/chunked/410", status: "dead_letter", kind: "gone", http: 410 }
        ] as const
        yield* run(
          cases.map((c) =>
            whEv(OWNER, c.rkey, whRecordValue(`at://${BOB}`, { url: `${rx.url}${c.path}`, secret: SECRET }), {
              rev: rev(1)
            })
          )
        )
        yield* startWorker({ options: { pollIntervalMs: 100 } })
        expect((yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])).inserted).toBe(cases.length)
        const rows = yield* eventually(
          "every delivery attempted once",
          outboxRows,
          (rs) => rs.length === cases.length && rs.every((x) => x.lease_token === null && x.attempt_count === 1),
          20_000
        )
        const byRkey = new Map(rows.map((x) => [x.webhook_rkey, x]))
        for (const c of cases) {
          const row = byRkey.get(c.rkey)
          expect({ rkey: c.rkey, status: row?.status, kind: row?.last_error_kind, http: row?.last_http_status })
            .toEqual({ rkey: c.rkey, status: c.status, kind: c.kind, http: c.http })
        }
        const sql = yield* SqlClient.SqlClient
        // the subscription is marked gone right after its row settles
        const gone = yield* eventually(
          "both 410 subscriptions marked gone",
          sql<{ rkey: string }>`SELECT rkey FROM webhooks WHERE gone_at IS NOT NULL ORDER BY rkey`.pipe(Effect.orDie),
          (rs) => rs.length >= 2
        )
        expect(gone.map((g) => g.rkey)).toEqual(["c410", "d410"])
        // every attempt keeps the first 1 KiB as its excerpt (as UTF-8: the cut character is dropped)
        const attempts = yield* sql<{ excerpt: string | null; bytes: number | null }>`
          SELECT response_excerpt AS excerpt, octet_length(response_excerpt) AS bytes FROM delivery_attempts`
        expect(attempts.length).toBe(cases.length)
        for (const a of attempts) {
          expect(a.bytes).toBe(1023)
          expect(a.excerpt).toBe("x" + "é".repeat(511))
        }
        expect(rx.received.length).toBe(cases.length)
        // no hanging receiver here: a generous timeout, so a loaded machine cannot turn a case into a timeout
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: { ...ENV, DELIVERY_TIMEOUT_MS: "5000" } }))),
    60_000
  )

  it.scopedLive(
    "attempts are capped at DELIVERY_MAX_ATTEMPTS, then dead-lettered",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/status/500` }), { rev: rev(1) })])
        yield* startWorker({ options: { pollIntervalMs: 20 } })
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        const rows = yield* eventually("dead letter", outboxRows, (rs) => rs[0]?.status === "dead_letter", 20_000)
        expect(rows[0]).toMatchObject({ attempt_count: 3, last_error_kind: "http_5xx", last_http_status: 500 })
        expect(rx.received.length).toBe(3)
        expect(yield* countWhere("delivery_attempts", "true")).toBe(3)
        expect(yield* countWhere("delivery_attempts", "outcome = 'dead_letter' AND attempt = 3")).toBe(1)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              DELIVERY_MAX_ATTEMPTS: "3",
              DELIVERY_RETRY_BASE_MS: "50",
              DELIVERY_RETRY_MAX_MS: "100"
            }
          })
        )
      ),
    60_000
  )
})

describe("judge (the classification step of SPEC §4.2, as a pure decision)", () => {
  const answer = (status: number, headers: Record<string, string> = {}) =>
    Either.right({ status, headers, body: new Uint8Array(0), truncated: false })
  const onlyNoContent: OutgoingRequest = {
    url: "https://receiver.example/hook",
    method: "POST",
    headers: {},
    body: "{}",
    isSuccess: (s) => s === 204
  }

  it("a 2xx that a custom destination does not accept is a permanent http_4xx (retrying would only duplicate)", () => {
    const settled = judge(answer(200, { "retry-after": "5" }), onlyNoContent, 0, 10)
    expect(settled).toMatchObject({ _tag: "Fail", kind: "http_4xx", httpStatus: 200, retryAfterMs: undefined })
    expect(judge(answer(204), onlyNoContent, 0, 10)).toMatchObject({ _tag: "Deliver", httpStatus: 204 })
  })

  it("without a custom rule every 2xx is delivered, 299 included; 300 is not", () => {
    const plain: OutgoingRequest = { url: "https://receiver.example/hook", method: "POST", headers: {}, body: "{}" }
    expect(judge(answer(200), plain, 0, 10)).toMatchObject({ _tag: "Deliver", httpStatus: 200 })
    expect(judge(answer(299), plain, 0, 10)).toMatchObject({ _tag: "Deliver", httpStatus: 299 })
    expect(judge(answer(300), plain, 0, 10)).toMatchObject({ _tag: "Fail", kind: "redirect" })
  })

  it("a custom isSuccess that throws accepts nothing: the answer is classified by its status", () => {
    const throwing: OutgoingRequest = {
      ...onlyNoContent,
      isSuccess: () => {
        throw new Error("the custom rule broke")
      }
    }
    expect(judge(answer(200), throwing, 0, 10)).toMatchObject({ _tag: "Fail", kind: "http_4xx", httpStatus: 200 })
    expect(judge(answer(503), throwing, 0, 10)).toMatchObject({ _tag: "Fail", kind: "http_5xx", httpStatus: 503 })
  })

  it("a 429 honours Retry-After as a 5xx does; a permanent failure ignores it", () => {
    const plain: OutgoingRequest = { url: "https://receiver.example/hook", method: "POST", headers: {}, body: "{}" }
    const later = { "retry-after": "7" }
    expect(judge(answer(429, later), plain, 0, 10)).toMatchObject({ kind: "http_429", retryAfterMs: 7_000 })
    expect(judge(answer(503, later), plain, 0, 10)).toMatchObject({ kind: "http_5xx", retryAfterMs: 7_000 })
    expect(judge(answer(404, later), plain, 0, 10)).toMatchObject({ kind: "http_4xx", retryAfterMs: undefined })
  })

  // SPEC §4.5: the excerpt is "the first 1 KiB (as UTF-8, invalid bytes replaced)"; only a character
  // split by the 1 KiB cut is dropped, never invalid bytes at the end of a whole body
  it("invalid bytes at the end of a whole body stay in the excerpt as U+FFFD; the cut character goes", () => {
    const plain: OutgoingRequest = { url: "https://receiver.example/hook", method: "POST", headers: {}, body: "{}" }
    const withBody = (status: number, body: Uint8Array) => Either.right({ status, headers: {}, body, truncated: false })
    const tail = Uint8Array.from([...Buffer.from("upstream error "), 0xff, 0xfe])
    expect(judge(withBody(503, tail), plain, 0, 10)).toMatchObject({
      _tag: "Fail",
      kind: "http_5xx",
      responseExcerpt: "upstream error \uFFFD\uFFFD"
    })
    expect(judge(withBody(500, Uint8Array.from([0xff, 0xfe])), plain, 0, 10)).toMatchObject({
      responseExcerpt: "\uFFFD\uFFFD"
    })
    // 1,023 bytes of "x", then "é" (2 bytes) split by the cut: the excerpt is the 1,023 "x"
    const cut = Uint8Array.from([...Buffer.from("x".repeat(1_023)), ...Buffer.from("é".repeat(4))])
    expect(judge(withBody(500, cut), plain, 0, 10)).toMatchObject({ responseExcerpt: "x".repeat(1_023) })
    // an invalid byte just before the cut is the receiver's and is kept
    const invalidAtCut = Uint8Array.from([...Buffer.from("x".repeat(1_023)), 0xff, ...Buffer.from("yz")])
    expect(judge(withBody(500, invalidAtCut), plain, 0, 10)).toMatchObject({
      responseExcerpt: "x".repeat(1_023) + "\uFFFD"
    })
  })
})
