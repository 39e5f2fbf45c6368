/**
 * The owners' delivery log and delivery actions (SPEC §8.5) over the API on a real server, real
 * PostgreSQL and, where something is sent, the real delivery worker and a real HTTP receiver that
 * verifies both signatures (the `standardwebhooks` library and an independent HMAC): listing with
 * filters and cursor paging, a delivery with its attempts (the receiver's status and the first
 * 1 KiB of its answer), redeliver, replay with its 10,000 bound, the test delivery, and isolation
 * between owners (another owner's id answers exactly as an unknown one).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, FastCheck } from "effect"
import { WH_COLLECTION } from "../../src/schemas/WhRecord.js"
import { KEY_TEXT_FORMAT, normalizeKeyTime } from "../../src/services/operator/ListKey.js"
import { eventually, receiver, run, startWorker, whsec } from "../delivery/worker-support.js"
import { ev, plc, rev, sqlServices, whEv, whRecordValue } from "../support/stack.js"
import { apiLayer, apiLayerWith, callAs, newOwner, type Owner } from "./support.js"

const W = "dev.firehook.webhook"
/** each test's webhooks watch an author of their own (no test enqueues for another's webhooks) */
const BOB = plc(2)
const CAROL = plc(3)
const DAN = plc(4)
const ERIN = plc(5)
const POST = "app.bsky.feed.post"
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

const env = {
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  // a failed attempt is retried an hour later at the earliest: the next attempt is the redeliver's
  DELIVERY_RETRY_BASE_MS: "3600000",
  DELIVERY_RETRY_MAX_MS: "3600000"
}

let n = 100
/** Register `owner`'s webhook `rkey` watching `watched` through the intake's processor. */
const register = (owner: Owner, rkey: string, watched: string, options: Parameters<typeof whRecordValue>[1]) =>
  run([whEv(owner.did, rkey, whRecordValue(`at://${watched}`, options), { rev: rev(n++) })])

/** `author` posts `rkeys`: one delivery per post for every webhook watching them. */
const post = (author: string, ...rkeys: ReadonlyArray<string>) =>
  run(rkeys.map((r) => ev(author, POST, r, { rev: rev(n++) })))

const list = (owner: Owner, query: string) =>
  Effect.map(callAs(owner, `${W}.listDeliveries`, { query }), (r) => {
    expect(r.status, r.text).toBe(200)
    return r.body as { deliveries: ReadonlyArray<{ readonly [k: string]: unknown }>; cursor?: string }
  })

/** Every page of a listing, following the cursor (bounded). */
const listAll = (owner: Owner, query: string) =>
  Effect.gen(function*() {
    const ids: Array<string> = []
    let cursor: string | undefined = undefined
    for (let page = 0; page < 50; page++) {
      const c: string | undefined = cursor
      const r: { deliveries: ReadonlyArray<{ readonly [k: string]: unknown }>; cursor?: string } = yield* list(
        owner,
        c === undefined ? query : `${query}&cursor=${encodeURIComponent(c)}`
      )
      for (const d of r.deliveries) ids.push(String(d["id"]))
      if (r.cursor === undefined) return ids
      cursor = r.cursor
    }
    return ids
  })

/** A cursor as a client may send it: base64url of `[createdAt, deliveryId]`. */
const cursorOf = (createdAt: string, deliveryId: string) =>
  Buffer.from(JSON.stringify([createdAt, deliveryId]), "utf8").toString("base64url")

/** Outbox rows of `owner` created at `times` (ids `whd_t_<tag>_<n>`, n from 1), as intake would write them. */
const outboxRows = (owner: string, tag: string, times: ReadonlyArray<string>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
    INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
      event_rkey, event_operation, target_url, signing_mode, fingerprint, next_attempt_at, created_at)
    SELECT 'whd_t_' || ${tag} || '_' || n, 'whe_t_' || ${tag} || '_' || n, ${owner}, 'w1', 'direct', ${BOB},
      ${POST}, 'p', 'create', 'http://127.0.0.1:9/hook', 'none', 'fp', now() + interval '1 day',
      t::timestamptz
    FROM unnest(${times}::text[]) WITH ORDINALITY AS x(t, n)`)

describe("delivery methods", () => {
  layer(apiLayerWith(sqlServices(), { env }), { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("listDeliveries: the caller's rows, filters, newest first, cursor paging, no URL", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        const bob = yield* newOwner()
        yield* register(alice, "w1", BOB, { url: "https://alice-one.example/hook" })
        yield* register(alice, "w2", BOB, { url: "https://alice-two.example/hook" })
        yield* post(BOB, "p1", "p2", "p3", "p4", "p5")
        // nothing delivers them during this test; times and statuses set as a worker would have
        yield* sql`UPDATE outbox SET next_attempt_at = now() + interval '1 day' WHERE owner_did = ${alice.did}`
        const times = ["2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"]
        yield* sql`UPDATE outbox SET created_at = ${times[0]}::timestamptz WHERE event_rkey IN ('p1', 'p2')`
        yield* sql`UPDATE outbox SET created_at = ${times[1]}::timestamptz WHERE event_rkey IN ('p3')`
        yield* sql`UPDATE outbox SET created_at = ${times[2]}::timestamptz WHERE event_rkey IN ('p4', 'p5')`
        yield* sql`UPDATE outbox SET status = 'dead_letter', last_error_kind = 'http_5xx', last_http_status = 503,
          finished_at = now() WHERE owner_did = ${alice.did} AND event_rkey = 'p2'`
        const expected = (yield* sql<{ delivery_id: string }>`
          SELECT delivery_id FROM outbox WHERE owner_did = ${alice.did}
          ORDER BY created_at DESC, delivery_id DESC`).map((r) => r.delivery_id)
        expect(expected).toHaveLength(10)

        // one page: newest first, the fields of §8.5, times RFC 3339, no URL anywhere
        const first = yield* callAs(alice, `${W}.listDeliveries`, { query: "limit=3" })
        expect(first.status).toBe(200)
        expect(first.text).not.toContain("alice-one.example")
        expect(first.text).not.toContain("alice-two.example")
        const page = first.body as { deliveries: ReadonlyArray<Record<string, unknown>>; cursor: string }
        expect(page.deliveries.map((d) => d["id"])).toEqual(expected.slice(0, 3))
        expect(typeof page.cursor).toBe("string")
        const d0 = page.deliveries[0] ?? {}
        expect(Object.keys(d0).sort()).toEqual(
          ["attempts", "createdAt", "event", "eventId", "id", "match", "nextAttemptAt", "rkey", "status"]
        )
        expect(d0["createdAt"]).toBe("2026-01-03T00:00:00.000Z")
        expect(d0["nextAttemptAt"]).toMatch(ISO)
        expect(d0["event"]).toMatchObject({ operation: "create", did: BOB, collection: POST })
        expect(["w1", "w2"]).toContain(d0["rkey"])

        // every page, by cursor: each row once, in order
        expect(yield* listAll(alice, "limit=3")).toEqual(expected)
        expect(yield* listAll(alice, "limit=1")).toEqual(expected)
        expect((yield* list(alice, "")).deliveries).toHaveLength(10) // default 50
        expect((yield* list(alice, "")).cursor).toBeUndefined()

        // filters
        const w2 = yield* listAll(alice, "rkey=w2&limit=2")
        expect(w2).toHaveLength(5)
        expect(w2).toEqual(expected.filter((id) => w2.includes(id)))
        const dead = yield* list(alice, "status=dead_letter")
        expect(dead.deliveries.map((d) => d["event"])).toMatchObject([{ rkey: "p2" }, { rkey: "p2" }])
        expect(dead.deliveries[0]?.["lastError"]).toEqual({ kind: "http_5xx", httpStatus: 503 })
        expect(dead.deliveries[0]?.["nextAttemptAt"]).toBeUndefined()
        const middle = yield* list(alice, `since=${times[1]}&until=${times[2]}`)
        expect(middle.deliveries.map((d) => (d["event"] as { rkey: string }).rkey)).toEqual(["p3", "p3"])
        expect((yield* list(alice, `since=${times[2]}&rkey=w1`)).deliveries).toHaveLength(2)

        // bad input
        for (const query of ["cursor=nonsense", `since=${times[2]}&until=${times[1]}`, "limit=0", "limit=101"]) {
          const r = yield* callAs(alice, `${W}.listDeliveries`, { query })
          expect([r.status, r.body["error"]]).toEqual([400, "InvalidRequest"])
        }

        // another owner sees none of them, with any filter or alice's cursor
        expect((yield* list(bob, "")).deliveries).toEqual([])
        expect((yield* list(bob, "rkey=w1")).deliveries).toEqual([])
        expect((yield* list(bob, `cursor=${encodeURIComponent(page.cursor)}`)).deliveries).toEqual([])
        yield* sql`DELETE FROM outbox WHERE owner_did = ${alice.did}`
      }))

    it.effect("listDeliveries: a cursor that is not a real time is InvalidRequest (never a 500); µs keys page exactly", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        // same second, 1 µs apart, and a tie on created_at (broken by the delivery id)
        yield* outboxRows(alice.did, "cur", [
          "2026-03-01 10:00:00.000001+00",
          "2026-03-01 10:00:00.000002+00",
          "2026-03-01 10:00:00.000002+00",
          "2026-03-01 10:00:00.999999+00",
          "2026-02-28 23:59:59+00"
        ])
        const expected = (yield* sql<{ delivery_id: string }>`
          SELECT delivery_id FROM outbox WHERE owner_did = ${alice.did}
          ORDER BY created_at DESC, delivery_id DESC`).map((r) => r.delivery_id)

        // tampered: shaped like a key, but no real time (or no sane offset) → 400, not the cast's 500
        for (
          const createdAt of [
            "2026-13-45 99:00:00+00",
            "0000-01-01 00:00:00+00",
            "2026-01-01 00:00:00+99",
            "2026-01-01 00:00:00+16",
            "2026-01-01 00:00:00+15:60",
            "2025-02-29 00:00:00+00",
            "2026-04-31T00:00:00.000000Z",
            "2026-01-01 24:00:00+00",
            "2026-01-01 23:59:60+00",
            "0001-01-01 00:00:00+01",
            "9999-12-31 23:59:59-01",
            "2026-01-01T00:00:00.0000001Z",
            "2026-01-01T00:00:00",
            "today",
            ""
          ]
        ) {
          const r = yield* callAs(alice, `${W}.listDeliveries`, {
            query: `cursor=${cursorOf(createdAt, expected[0] ?? "")}`
          })
          expect([createdAt, r.status, r.body["error"]]).toEqual([createdAt, 400, "InvalidRequest"])
        }
        for (const c of [cursorOf("2026-03-01T10:00:00.000002Z", "a b"), cursorOf("2026-03-01T10:00:00.000002Z", "")]) {
          const r = yield* callAs(alice, `${W}.listDeliveries`, { query: `cursor=${c}` })
          expect([r.status, r.body["error"]]).toEqual([400, "InvalidRequest"])
        }

        // its own cursors: UTC, every µs, in order
        expect(yield* listAll(alice, "limit=1")).toEqual(expected)
        expect(yield* listAll(alice, "limit=2")).toEqual(expected)
        const first = yield* list(alice, "limit=2")
        expect(JSON.parse(Buffer.from(first.cursor ?? "", "base64url").toString("utf8"))).toEqual([
          "2026-03-01T10:00:00.000002Z",
          expected[1]
        ])

        // the cursor form of earlier versions (created_at::text, ISO DateStyle) still pages
        const old = yield* list(alice, `cursor=${cursorOf("2026-03-01 11:00:00.000002+01", expected[1] ?? "")}`)
        expect(old.deliveries.map((d) => d["id"])).toEqual(expected.slice(2))
        const offset = yield* list(alice, `cursor=${cursorOf("2026-03-01 05:30:00.999999-04:30", "whd_t_cur_9")}`)
        expect(offset.deliveries.map((d) => d["id"])).toEqual(expected)
        yield* sql`DELETE FROM outbox WHERE owner_did = ${alice.did}`
      }))

    it.effect("a key time accepted by normalizeKeyTime always casts, to the instant PostgreSQL reads in it", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const two = (max: number) => FastCheck.integer({ min: 0, max }).map((n) => String(n).padStart(2, "0"))
        const candidate = FastCheck.tuple(
          FastCheck.integer({ min: 0, max: 9999 }).map((n) => String(n).padStart(4, "0")),
          two(13),
          two(32),
          FastCheck.constantFrom("T", " "),
          two(25),
          two(60),
          two(61),
          FastCheck.option(FastCheck.stringMatching(/^\.\d{1,6}$/), { nil: "" }),
          FastCheck.oneof(
            FastCheck.constant("Z"),
            FastCheck.tuple(FastCheck.constantFrom("+", "-"), two(17), FastCheck.option(two(60), { nil: undefined }))
              .map(([sign, h, m]) => `${sign}${h}${m === undefined ? "" : `:${m}`}`)
          )
        ).map(([y, mo, d, sep, h, mi, s, f, z]) => `${y}-${mo}-${d}${sep}${h}:${mi}:${s}${f}${z}`)
        const texts = FastCheck.sample(candidate, { numRuns: 3000, seed: 42 })
        const accepted = texts.flatMap((t) => {
          const n = normalizeKeyTime(t)
          return n === undefined ? [] : [[t, n] as const]
        })
        // a fair share of both
        expect(accepted.length).toBeGreaterThan(300)
        expect(accepted.length).toBeLessThan(texts.length - 300)
        const rows = yield* sql<{ original: string; normalized: string; same: boolean }>`
          SELECT to_char(o::timestamptz AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) AS original,
                 to_char(n::timestamptz AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) AS normalized,
                 o::timestamptz = n::timestamptz AS same
          FROM unnest(${accepted.map(([t]) => t)}::text[], ${accepted.map(([, n]) => n)}::text[]) AS x(o, n)`
        expect(rows).toHaveLength(accepted.length)
        for (const [i, r] of rows.entries()) {
          expect([accepted[i]?.[0], r.same, r.normalized]).toEqual([accepted[i]?.[0], true, accepted[i]?.[1]])
        }
      }))

    it.effect("a key time with the largest zone offset PostgreSQL reads (±15:59:59) is accepted; one second more is not", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        for (const text of ["2026-05-01 10:00:00+15:59:59", "2026-05-01 10:00:00-15:59:59"]) {
          const n = normalizeKeyTime(text)
          expect([text, n === undefined]).toEqual([text, false])
          const same = yield* sql<{ same: boolean }>`SELECT ${text}::timestamptz = ${n ?? ""}::timestamptz AS same`
          expect(same[0]?.same).toBe(true)
        }
        expect(normalizeKeyTime("2026-05-01 10:00:00+16:00:00")).toBeUndefined()
      }))

    it.effect("record keys (%@+) and cids (any 1–512 chars) that intake accepts: listed, shown and taken as input", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        const HOOK = "w@1+x%2F~"
        const POST_RKEY = "a@b"
        // cids as a Jetstream may send them: neither printable ASCII nor ≤ 256 characters
        const HOOK_CID = "é".repeat(300)
        const POST_CID = `bafy\u0000${"x".repeat(505)}`
        expect(POST_CID).toHaveLength(510)
        yield* run([
          ev(alice.did, WH_COLLECTION, HOOK, {
            record: whRecordValue(`at://${ERIN}`, { url: "https://alice-odd.example/hook" }),
            cid: HOOK_CID,
            rev: rev(n++)
          })
        ])
        yield* run([ev(ERIN, POST, POST_RKEY, { cid: POST_CID, rev: rev(n++) })])

        const listed = yield* list(alice, "")
        expect(listed.deliveries).toHaveLength(1)
        const d = listed.deliveries[0] ?? {}
        expect(d["rkey"]).toBe(HOOK)
        expect(d["event"]).toEqual({ operation: "create", did: ERIN, collection: POST, rkey: POST_RKEY })
        const shown = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${String(d["id"])}` })
        expect(shown.status, shown.text).toBe(200)
        expect((shown.body["delivery"] as { event: unknown }).event).toMatchObject({ rkey: POST_RKEY, cid: POST_CID })
        const hooks = yield* callAs(alice, `${W}.list`)
        expect(hooks.status, hooks.text).toBe(200)
        expect(hooks.body["webhooks"]).toMatchObject([{
          rkey: HOOK,
          cid: HOOK_CID,
          uri: `at://${alice.did}/${WH_COLLECTION}/${HOOK}`
        }])

        // and the webhook's rkey is a valid argument of every method that takes one
        expect((yield* list(alice, `rkey=${encodeURIComponent(HOOK)}`)).deliveries).toHaveLength(1)
        const tested = yield* callAs(alice, `${W}.test`, { body: { rkey: HOOK } })
        expect(tested.status, tested.text).toBe(200)
        const replayed = yield* callAs(alice, `${W}.replay`, { body: { rkey: HOOK } })
        expect([replayed.status, replayed.body]).toEqual([200, { replayed: 0, truncated: false }])
        const resumed = yield* callAs(alice, `${W}.resume`, { body: { rkey: HOOK } })
        expect([resumed.status, resumed.body]).toEqual([200, { state: "active", replayed: 0 }])
        yield* sql`DELETE FROM outbox WHERE owner_did = ${alice.did}`
      }))

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

describe("delivery methods under another DateStyle and TimeZone", () => {
  const settings = { DateStyle: "SQL, DMY", TimeZone: "America/St_Johns" }
  layer(apiLayer({ databaseSettings: settings }), { excludeTestServices: true })((it) => {
    it.effect("listDeliveries pages by its own cursors: the key does not depend on the session's DateStyle", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const style = yield* sql<{ datestyle: string }>`SELECT current_setting('DateStyle') AS datestyle`
        expect(style[0]?.datestyle).toBe("SQL, DMY")
        const alice = yield* newOwner()
        yield* outboxRows(alice.did, "ds", [
          "2026-01-02 03:04:05.000001+00",
          "2026-01-02 03:04:05.000002+00",
          "2026-02-01 03:04:05.5+00",
          "2026-02-01 03:04:05.5+00",
          "2026-12-31 23:59:59.999999+00"
        ])
        const expected = (yield* sql<{ delivery_id: string }>`
          SELECT delivery_id FROM outbox WHERE owner_did = ${alice.did}
          ORDER BY created_at DESC, delivery_id DESC`).map((r) => r.delivery_id)
        expect(yield* listAll(alice, "limit=1")).toEqual(expected)
        expect(yield* listAll(alice, "limit=2")).toEqual(expected)
        const first = yield* list(alice, "limit=1")
        expect(JSON.parse(Buffer.from(first.cursor ?? "", "base64url").toString("utf8"))[0]).toBe(
          "2026-12-31T23:59:59.999999Z"
        )
      }))
  })
})
