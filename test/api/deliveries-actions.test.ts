/**
 * The owners' delivery actions (SPEC §8.5) over the API on a real server, real PostgreSQL, the
 * real delivery worker and a real HTTP receiver that verifies both signatures (the `standardwebhooks`
 * library and an independent HMAC): a delivery with its attempts (the receiver's status and the first
 * 1 KiB of its answer), redeliver, replay with its 10,000 bound, the test delivery, and isolation
 * between owners (another owner's id answers exactly as an unknown one). The listing:
 * deliveries-listing.test.ts.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { WH_COLLECTION } from "../../src/schemas/WhRecord.js"
import { eventually, receiver, startWorker, whsec } from "../delivery/worker-support.js"
import { sqlServices } from "../support/stack.js"
import { insertDelivery, insertWebhook } from "../support/webhookRows.js"
import { BOB, CAROL, DAN, env, ISO, list, outboxRows, POST, post, register, W } from "./deliveries-support.js"
import { apiLayerWith, callAs, newOwner } from "./support.js"

describe("delivery methods", () => {
  layer(apiLayerWith(sqlServices(), { env }), { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect(
      "getDelivery: attempts with the receiver's status and response excerpt; redeliver; another owner's id is unknown",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          // the first answer: 503 with invalid UTF-8 and a body over 1 KiB; then 200 "thanks"
          const failing = Buffer.concat([
            Buffer.from("bad gateway: "),
            Buffer.from([0xff, 0xfe]),
            Buffer.from("é".repeat(600))
          ])
          // the first 1 KiB decoded as UTF-8, the 2 invalid bytes replaced by U+FFFD (3 bytes each),
          // then kept within 1 KiB of UTF-8 without cutting a character: 13 + 6 + 502 × 2 = 1023 bytes
          const EXCERPT = "bad gateway: \uFFFD\uFFFD" + "é".repeat(502)
          expect(Buffer.byteLength(EXCERPT)).toBe(1023)
          const SECRET = whsec(21)
          let answered = 0
          const rx = yield* receiver({
            secretFor: () => SECRET,
            reply: () => (++answered === 1 ? { status: 503, body: failing } : { status: 200, body: "thanks" })
          })
          const alice = yield* newOwner()
          const mallory = yield* newOwner()
          yield* register(alice, "hook", CAROL, { url: `${rx.url}/in`, secret: SECRET })
          yield* startWorker()
          yield* post(CAROL, "g1")
          const [row] = yield* sql<{ delivery_id: string }>`
            SELECT delivery_id FROM outbox WHERE owner_did = ${alice.did}`
          const id = row?.delivery_id ?? ""
          yield* eventually(
            "the first attempt",
            sql<{ n: number }>`SELECT count(*)::int AS n FROM delivery_attempts WHERE delivery_id = ${id}`,
            (r) => r[0]?.n === 1
          )
          const once = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${id}` })
          expect(once.status, once.text).toBe(200)
          expect(once.body["delivery"]).toMatchObject({ id, status: "pending", attempts: 1, rkey: "hook" })
          expect(once.body["delivery"]).toMatchObject({ lastError: { kind: "http_5xx", httpStatus: 503 } })
          expect(once.body["attempts"]).toEqual([{
            n: 1,
            startedAt: expect.stringMatching(ISO),
            durationMs: expect.any(Number),
            outcome: "retry",
            httpStatus: 503,
            errorKind: "http_5xx",
            responseExcerpt: EXCERPT
          }])
          expect(once.body["olderAttempts"]).toBe(0)
          const payload = once.body["payload"] as Record<string, unknown>
          expect(payload).toMatchObject({ event: "create", did: CAROL, collection: POST, rkey: "g1" })
          expect(payload["record"]).toEqual({ $type: POST, text: "hi" })
          expect((once.body["delivery"] as { event: { cid?: string } }).event.cid).toBe(payload["cid"])
          expect(once.text).not.toContain(rx.url)

          // another owner: NotFound, exactly as an unknown id
          const unknown = yield* callAs(mallory, `${W}.getDelivery`, { query: `id=whd_v1_${"0".repeat(64)}` })
          const foreign = yield* callAs(mallory, `${W}.getDelivery`, { query: `id=${id}` })
          expect([foreign.status, foreign.body["error"]]).toEqual([400, "NotFound"])
          expect([foreign.status, foreign.text]).toEqual([unknown.status, unknown.text])
          const unknownRedeliver = yield* callAs(mallory, `${W}.redeliver`, {
            body: { id: `whd_v1_${"0".repeat(64)}` }
          })
          const foreignRedeliver = yield* callAs(mallory, `${W}.redeliver`, { body: { id } })
          expect([foreignRedeliver.status, foreignRedeliver.body["error"]]).toEqual([400, "NotFound"])
          expect([foreignRedeliver.status, foreignRedeliver.text]).toEqual([
            unknownRedeliver.status,
            unknownRedeliver.text
          ])
          expect(rx.received).toHaveLength(1) // mallory's redeliver sent nothing

          // the owner redelivers: same id, due now, delivered
          const again = yield* callAs(alice, `${W}.redeliver`, { body: { id } })
          expect([again.status, again.body]).toEqual([200, { id, previousStatus: "pending" }])
          yield* eventually(
            "the redelivery",
            sql<{ status: string }>`SELECT status FROM outbox WHERE delivery_id = ${id}`,
            (r) => r[0]?.status === "delivered"
          )
          expect(rx.received).toHaveLength(2)
          for (const r of rx.received) {
            expect(r.headers["webhook-id"]).toBe(id)
            expect(r.verified).toEqual({ standard: true, wisp: true })
          }
          const twice = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${id}` })
          expect(twice.body["delivery"]).toMatchObject({ status: "delivered", attempts: 1 })
          expect((twice.body["delivery"] as Record<string, unknown>)["deliveredAt"]).toMatch(ISO)
          expect((twice.body["delivery"] as Record<string, unknown>)["lastError"]).toBeUndefined()
          const attempts = twice.body["attempts"] as ReadonlyArray<Record<string, unknown>>
          expect(attempts.map((a) => [a["n"], a["outcome"], a["httpStatus"], a["responseExcerpt"]])).toEqual([
            [1, "retry", 503, EXCERPT],
            [2, "delivered", 200, "thanks"]
          ])
        }).pipe(Effect.scoped)
    )

    // SPEC §8.5 ("its payload while the body is retained"): the body as delivered; intake keeps an
    // integer beyond 2^53 exactly in it, and a re-encoding of the parsed body rounded it
    it.effect("getDelivery: the payload is the stored body's text, a wide integer with its digits", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        const id = `${alice.did}-wide`
        yield* insertDelivery(alice.did, "w", id, { status: "delivered", httpStatus: 200 })
        const body =
          "{\"event\":\"create\",\"record\":{\"$type\":\"x.y.z\",\"n\":9007199254740993,\"m\":-12345678901234567890}}"
        yield* sql`UPDATE delivery_events SET body = ${body} WHERE event_id = ${`ev-${id}`}`
        const r = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${id}` })
        expect(r.status, r.text).toBe(200)
        expect(r.headers["content-type"]).toContain("application/json")
        expect(r.headers["cache-control"]).toBe("no-store")
        expect(r.text).toContain(`"payload":${body}`)
        expect(r.text).not.toContain("9007199254740992")
        // the rest of the answer is as before
        expect(r.body["delivery"]).toMatchObject({ id, status: "delivered" })
        expect(r.body["attempts"]).toEqual(expect.any(Array))
        expect(r.body["payload"]).toMatchObject({ event: "create", record: { $type: "x.y.z" } })
      }))

    it.effect("getDelivery: the newest 100 attempts, and how many older ones were left out (SPEC §8.5)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const owner = yield* newOwner()
        yield* outboxRows(owner.did, "att", ["2026-01-01T00:00:00Z"])
        const id = "whd_t_att_1"
        const attemptsOf = (n: number) =>
          sql`
            INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status)
            SELECT ${id}, a, '2026-01-01T00:00:00Z'::timestamptz + a * interval '1 second', 5, 'retry', 'http_5xx', 503
            FROM generate_series(1, ${n}) a
            ON CONFLICT DO NOTHING`
        const shown = (r: { body: Record<string, unknown> }) =>
          (r.body["attempts"] as ReadonlyArray<Record<string, unknown>>).map((a) => a["n"])
        yield* attemptsOf(100)
        const hundred = yield* callAs(owner, `${W}.getDelivery`, { query: `id=${id}` })
        expect(hundred.status, hundred.text).toBe(200)
        expect([shown(hundred).length, shown(hundred)[0], hundred.body["olderAttempts"]]).toEqual([100, 1, 0])
        yield* attemptsOf(103)
        const more = yield* callAs(owner, `${W}.getDelivery`, { query: `id=${id}` })
        expect(more.status, more.text).toBe(200)
        expect(shown(more)).toEqual(Array.from({ length: 100 }, (_, i) => i + 4))
        expect(more.body["olderAttempts"]).toBe(3)
      }))

    it.effect("test: one signed request through the outbox with X-Firehook-Test: 1; another owner's rkey is NotFound", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const SECRET = whsec(33)
        const rx = yield* receiver({ secretFor: () => SECRET })
        const alice = yield* newOwner()
        const mallory = yield* newOwner()
        // events filtered to deletes only: a test is sent whatever the filter
        yield* register(alice, "t", DAN, { url: `${rx.url}/test`, secret: SECRET, events: ["delete"] })
        yield* register(alice, "off", DAN, { url: `${rx.url}/off`, secret: SECRET, enabled: false })
        yield* startWorker()

        const sent = yield* callAs(alice, `${W}.test`, { body: { rkey: "t" } })
        expect(sent.status, sent.text).toBe(200)
        const id = String(sent.body["id"])
        expect(id).toMatch(/^whd_v1_[0-9a-f]{64}$/)
        yield* eventually("the test delivery", Effect.sync(() => rx.received.length), (k) => k >= 1)
        yield* eventually(
          "its settle",
          sql<{ status: string }>`SELECT status FROM outbox WHERE delivery_id = ${id}`,
          (r) => r[0]?.status === "delivered"
        )
        expect(rx.received).toHaveLength(1)
        const req = rx.received[0]
        expect(req?.headers["x-firehook-test"]).toBe("1")
        expect(req?.headers["webhook-id"]).toBe(id)
        expect(req?.headers["x-firehook-webhook"]).toBe(`at://${alice.did}/${WH_COLLECTION}/t`)
        expect(req?.verified).toEqual({ standard: true, wisp: true })
        const body = JSON.parse(req?.body.toString("utf8") ?? "{}") as Record<string, unknown>
        expect(Object.keys(body).sort()).toEqual(["collection", "did", "event", "id", "record", "rkey", "timestamp"])
        expect(body).toMatchObject({
          event: "test",
          record: null,
          did: alice.did,
          collection: WH_COLLECTION,
          rkey: "t"
        })
        expect(body["timestamp"]).toMatch(ISO)

        // in the log as a test delivery
        const shown = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${id}` })
        expect(shown.body["delivery"]).toMatchObject({
          id,
          eventId: body["id"],
          status: "delivered",
          event: { operation: "test", did: alice.did, collection: WH_COLLECTION, rkey: "t" }
        })
        expect(shown.body["payload"]).toEqual(body)
        const listed = yield* list(alice, "rkey=t")
        expect(listed.deliveries.map((d) => d["id"])).toEqual([id])

        // a second test is a new delivery
        const second = yield* callAs(alice, `${W}.test`, { body: { rkey: "t" } })
        expect(second.status).toBe(200)
        expect(second.body["id"]).not.toBe(id)

        // refusals send nothing: another owner's rkey, an unknown one, a disabled webhook
        const foreign = yield* callAs(mallory, `${W}.test`, { body: { rkey: "t" } })
        const unknown = yield* callAs(alice, `${W}.test`, { body: { rkey: "nope" } })
        expect([foreign.status, foreign.body["error"]]).toEqual([400, "NotFound"])
        expect(foreign.text).toBe(unknown.text)
        const off = yield* callAs(alice, `${W}.test`, { body: { rkey: "off" } })
        expect([off.status, off.body["error"]]).toEqual([400, "InvalidRequest"])
        yield* eventually("the second test", Effect.sync(() => rx.received.length), (k) => k >= 2)
        const rows = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM outbox WHERE event_operation = 'test' AND owner_did <> ${alice.did}`
        expect(rows[0]?.n).toBe(0)
        expect((yield* list(mallory, "")).deliveries).toEqual([])
      }).pipe(Effect.scoped))

    it.effect("replay and redeliver say how many of the rows will not be sent (their webhook changed since)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* register(alice, "kept", DAN, { url: "https://alice-kept.example/hook" })
        yield* register(alice, "moved", DAN, { url: "https://alice-old.example/hook" })
        yield* post(DAN, "m1", "m2")
        yield* sql`UPDATE outbox SET status = 'dead_letter', attempt_count = 12, last_error_kind = 'http_5xx',
          finished_at = now() WHERE owner_did = ${alice.did}`
        // the owner points "moved" at a new URL: its rows, enqueued for the old one, are cancelled
        // by the worker without a request (SPEC §4.2) if they are replayed
        yield* register(alice, "moved", DAN, { url: "https://alice-new.example/hook" })
        const kept = yield* callAs(alice, `${W}.replay`, { body: { rkey: "kept" } })
        expect([kept.status, kept.body]).toEqual([200, { replayed: 2, truncated: false }])
        const moved = yield* callAs(alice, `${W}.replay`, { body: { rkey: "moved" } })
        expect([moved.status, moved.body]).toEqual([200, { replayed: 2, truncated: false, inactive: 2 }])
        const rows = yield* sql<{ delivery_id: string; webhook_rkey: string }>`
          SELECT delivery_id, webhook_rkey FROM outbox WHERE owner_did = ${alice.did} ORDER BY webhook_rkey`
        const keptId = rows.find((r) => r.webhook_rkey === "kept")?.delivery_id ?? ""
        const movedId = rows.find((r) => r.webhook_rkey === "moved")?.delivery_id ?? ""
        const one = yield* callAs(alice, `${W}.redeliver`, { body: { id: keptId } })
        expect([one.status, one.body]).toEqual([200, { id: keptId, previousStatus: "pending" }])
        const other = yield* callAs(alice, `${W}.redeliver`, { body: { id: movedId } })
        expect([other.status, other.body]).toEqual([200, { id: movedId, previousStatus: "pending", inactive: true }])
        yield* sql`DELETE FROM outbox WHERE owner_did = ${alice.did}`
      }))

    it.effect("replay: the caller's dead letters only, at most 10,000 per call, truncated beyond; 2 per minute", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        const bob = yield* newOwner()
        const deadLetters = (owner: string, rkey: string, count: number, tag: string) =>
          sql`
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
            event_rkey, event_operation, target_url, signing_mode, fingerprint, status, attempt_count,
            last_error_kind, finished_at, created_at, updated_at)
          SELECT 'whd_t_' || ${tag} || '_' || g, 'whe_t_' || ${tag} || '_' || g, ${owner}, ${rkey}, 'direct',
            ${BOB}, ${POST}, 'p' || g, 'create', 'http://127.0.0.1:9/hook', 'none', 'fp', 'dead_letter', 12,
            'http_5xx', now(), now() - interval '1 hour' + g * interval '1 ms', now() - interval '1 minute'
          FROM generate_series(1, ${count}::int) g`
        yield* deadLetters(alice.did, "w1", 10_001, "a")
        yield* deadLetters(bob.did, "w1", 2, "b1")
        yield* deadLetters(bob.did, "w2", 3, "b2")
        const pending = (owner: string) =>
          Effect.map(
            sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox WHERE owner_did = ${owner} AND status = 'pending'`,
            (r) => r[0]?.n ?? -1
          )

        // bob: one webhook, then the rest; alice's rows untouched (no webhook row matches these rows:
        // every one is `inactive`, the worker would cancel it)
        const one = yield* callAs(bob, `${W}.replay`, { body: { rkey: "w2" } })
        expect([one.status, one.body]).toEqual([200, { replayed: 3, truncated: false, inactive: 3 }])
        const rest = yield* callAs(bob, `${W}.replay`, { body: {} })
        expect([rest.status, rest.body]).toEqual([200, { replayed: 2, truncated: false, inactive: 2 }])
        expect(yield* pending(bob.did)).toBe(5)
        expect(yield* pending(alice.did)).toBe(0)

        // alice: 10,000, truncated; then the last one
        const big = yield* callAs(alice, `${W}.replay`, { body: {} })
        expect([big.status, big.body]).toEqual([200, { replayed: 10_000, truncated: true, inactive: 10_000 }])
        expect(yield* pending(alice.did)).toBe(10_000)
        const last = yield* callAs(alice, `${W}.replay`, { body: {} })
        expect([last.status, last.body]).toEqual([200, { replayed: 1, truncated: false, inactive: 1 }])
        expect(yield* pending(alice.did)).toBe(10_001)
        // the per-method limit (2/min) applies
        const third = yield* callAs(alice, `${W}.replay`, { body: {} })
        expect([third.status, third.body["error"]]).toEqual([429, "RateLimitExceeded"])
        yield* sql`DELETE FROM outbox WHERE owner_did IN (${alice.did}, ${bob.did})`
      }))
  })
})
