/**
 * The owners' delivery log (SPEC §8.5) over the API on a real server and real PostgreSQL: listing
 * with filters and cursor paging (cursors that are not real times, microsecond keys, key times and
 * their zone offsets, another session DateStyle and TimeZone), and record keys and cids as intake
 * accepts them, listed, shown and taken as input. The delivery actions: deliveries-actions.test.ts.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, FastCheck } from "effect"
import { WH_COLLECTION } from "../../src/schemas/WhRecord.js"
import { KEY_TEXT_FORMAT, normalizeKeyTime } from "../../src/services/operator/ListKey.js"
import { run } from "../delivery/worker-support.js"
import { ev, sqlServices, whRecordValue } from "../support/stack.js"
import {
  BOB,
  cursorOf,
  env,
  ERIN,
  ISO,
  list,
  listAll,
  nextRev,
  outboxRows,
  POST,
  post,
  register,
  W
} from "./deliveries-support.js"
import { apiLayer, apiLayerWith, callAs, newOwner } from "./support.js"

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
            rev: nextRev()
          })
        ])
        yield* run([ev(ERIN, POST, POST_RKEY, { cid: POST_CID, rev: nextRev() })])

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
  })
})

describe("delivery methods under another DateStyle and TimeZone", () => {
  const settings = { DateStyle: "SQL, DMY", TimeZone: "America/St_Johns" }
  layer(apiLayer({ databaseSettings: settings }), { excludeTestServices: true })((it) => {
    it.effect("listDeliveries pages by its own cursors: the key does not depend on the session's DateStyle", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const style = yield* sql<{ datestyle: string }>`SELECT current_setting('DateStyle') AS datestyle`
        // the database's default is `SQL, DMY`; firehook's own sessions set ISO output (since stop 56),
        // keeping the order: the cursor below must not depend on either
        expect(style[0]?.datestyle).toBe("ISO, DMY")
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
