/**
 * The owners' delivery and webhook actions (SPEC §8.5) on rows written straight to PostgreSQL (no
 * intake, no worker): what each answers for a row's status, a time range or a webhook's state, and
 * what it leaves untouched.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { insertDelivery, insertWebhook } from "../support/webhookRows.js"
import { apiLayer, callAs, newOwner, type Owner } from "./support.js"

const W = "dev.firehook.webhook"
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

type View = { readonly [k: string]: unknown }

const listed = (owner: Owner, query: string) =>
  Effect.map(callAs(owner, `${W}.listDeliveries`, { query }), (r) => {
    expect(r.status, r.text).toBe(200)
    return r.body as { readonly deliveries: ReadonlyArray<View>; readonly cursor?: string }
  })

const statusOf = (id: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ status: string }>`SELECT status FROM outbox WHERE delivery_id = ${id}`,
      (r) => r[0]?.status
    ))

describe("delivery actions", () => {
  layer(apiLayer(), { excludeTestServices: true, timeout: "60 seconds" })((it) => {
    it.effect("listDeliveries: deliveredAt only on a delivered row, nextAttemptAt only on a pending one", () =>
      Effect.gen(function*() {
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        yield* insertDelivery(alice.did, "w", `${alice.did}-delivered`, { status: "delivered", httpStatus: 200 })
        yield* insertDelivery(alice.did, "w", `${alice.did}-dead`, {
          status: "dead_letter",
          errorKind: "http_5xx",
          httpStatus: 503
        })
        yield* insertDelivery(alice.did, "w", `${alice.did}-cancelled`, {
          status: "cancelled",
          errorKind: "subscription_changed"
        })
        yield* insertDelivery(alice.did, "w", `${alice.did}-pending`, { status: "pending" })
        const byId = new Map((yield* listed(alice, "")).deliveries.map((d) => [String(d["id"]).split("-").pop(), d]))
        expect([...byId.keys()].sort()).toEqual(["cancelled", "dead", "delivered", "pending"])
        const times = (k: string) => {
          const d = byId.get(k) ?? {}
          return [k, "deliveredAt" in d, "nextAttemptAt" in d]
        }
        expect(["delivered", "dead", "cancelled", "pending"].map(times)).toEqual([
          ["delivered", true, false],
          ["dead", false, false],
          ["cancelled", false, false],
          ["pending", false, true]
        ])
        expect(byId.get("delivered")?.["deliveredAt"]).toMatch(ISO)
        expect(byId.get("dead")?.["lastError"]).toEqual({ kind: "http_5xx", httpStatus: 503 })
        expect(byId.get("cancelled")?.["lastError"]).toEqual({ kind: "subscription_changed" })
      }))

    it.effect("listDeliveries: a cursor is exactly [time, id], the id 1–128 printable characters; else InvalidRequest", () =>
      Effect.gen(function*() {
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        yield* insertDelivery(alice.did, "w", `${alice.did}-pending`, { status: "pending" })
        const at = "2099-01-01T00:00:00.000000Z"
        const answer = (key: ReadonlyArray<string>) =>
          Effect.map(
            callAs(alice, `${W}.listDeliveries`, {
              query: `cursor=${Buffer.from(JSON.stringify(key), "utf8").toString("base64url")}`
            }),
            (r) => [r.status, r.body["error"]]
          )
        expect(yield* answer([at, "x".repeat(128)])).toEqual([200, undefined])
        expect(yield* answer([at, "x".repeat(129)])).toEqual([400, "InvalidRequest"])
        expect(yield* answer([at, "x", "x"])).toEqual([400, "InvalidRequest"])
        expect(yield* answer([at])).toEqual([400, "InvalidRequest"])
      }))

    it.effect("getDelivery: a stored body that is not a JSON object is no payload (and no cid)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        for (const [k, body] of [["array", "[{\"cid\":\"bafy\"}]"], ["string", "\"bafy\""], ["broken", "{\"cid\":"]]) {
          const id = `${alice.did}-${k}`
          yield* insertDelivery(alice.did, "w", id, { status: "pending" })
          yield* sql`UPDATE delivery_events SET body = ${body} WHERE event_id = ${`ev-${id}`}`
          const r = yield* callAs(alice, `${W}.getDelivery`, { query: `id=${id}` })
          expect([k, r.status, "payload" in r.body]).toEqual([k, 200, false])
          expect((r.body["delivery"] as { event: View }).event["cid"]).toBeUndefined()
        }
      }))

    it.effect("redeliver: previousStatus is the status the row had; a worker's valid lease is InProgress, the row untouched", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        const id = (k: string) => `${alice.did}-${k}`
        yield* insertDelivery(alice.did, "w", id("dead"), { status: "dead_letter", errorKind: "http_4xx" })
        yield* insertDelivery(alice.did, "w", id("done"), { status: "delivered", httpStatus: 200 })
        yield* insertDelivery(alice.did, "w", id("cancelled"), {
          status: "cancelled",
          errorKind: "subscription_changed"
        })
        yield* insertDelivery(alice.did, "w", id("held"), { status: "leased" })
        yield* insertDelivery(alice.did, "w", id("stale"), { status: "leased" })
        yield* sql`UPDATE outbox SET lease_token = 'worker-1', leased_until = now() + interval '1 hour'
          WHERE delivery_id = ${id("held")}`
        yield* sql`UPDATE outbox SET lease_token = 'worker-2', leased_until = now() - interval '1 minute'
          WHERE delivery_id = ${id("stale")}`

        for (
          const [k, previous] of [["dead", "dead_letter"], ["done", "delivered"], ["cancelled", "cancelled"], [
            "stale",
            "leased"
          ]] as const
        ) {
          const r = yield* callAs(alice, `${W}.redeliver`, { body: { id: id(k) } })
          expect([k, r.status, r.body]).toEqual([k, 200, { id: id(k), previousStatus: previous }])
          expect(yield* statusOf(id(k))).toBe("pending")
        }

        const held = yield* callAs(alice, `${W}.redeliver`, { body: { id: id("held") } })
        expect([held.status, held.body["error"]]).toEqual([400, "InProgress"])
        const lease = yield* sql<{ status: string; lease_token: string | null }>`
          SELECT status, lease_token FROM outbox WHERE delivery_id = ${id("held")}`
        expect(lease[0]).toEqual({ status: "leased", lease_token: "worker-1" })
      }))

    it.effect("replay: since inclusive and until exclusive on the enqueue time; rows outside stay dead letters", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        const times = ["2026-01-01T00:00:00.000Z", "2026-01-02T00:00:00.000Z", "2026-01-03T00:00:00.000Z"]
        for (const [i, t] of times.entries()) {
          const id = `${alice.did}-d${i + 1}`
          yield* insertDelivery(alice.did, "w", id, { status: "dead_letter", errorKind: "http_4xx" })
          yield* sql`UPDATE outbox SET created_at = ${t}::timestamptz, updated_at = now() - interval '1 minute'
            WHERE delivery_id = ${id}`
        }
        const statuses = () =>
          Effect.map(
            sql<{ delivery_id: string; status: string }>`
              SELECT delivery_id, status FROM outbox WHERE owner_did = ${alice.did} ORDER BY created_at`,
            (rows) => rows.map((r) => r.status)
          )

        const from = yield* callAs(alice, `${W}.replay`, { body: { since: times[1] } })
        expect([from.status, from.body]).toEqual([200, { replayed: 2, truncated: false }])
        expect(yield* statuses()).toEqual(["dead_letter", "pending", "pending"])

        yield* sql`UPDATE outbox SET status = 'dead_letter', updated_at = now() - interval '1 minute'
          WHERE owner_did = ${alice.did}`
        const before = yield* callAs(alice, `${W}.replay`, { body: { until: times[1] } })
        expect([before.status, before.body]).toEqual([200, { replayed: 1, truncated: false }])
        expect(yield* statuses()).toEqual(["pending", "dead_letter", "dead_letter"])
      }))

    it.effect("replay: inactive counts only the rows enqueued for an older version of their webhook", () =>
      Effect.gen(function*() {
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        yield* insertDelivery(alice.did, "w", `${alice.did}-current`, { status: "dead_letter", errorKind: "http_4xx" })
        // enqueued for the record as it was before its latest version: the worker cancels it unsent
        yield* insertDelivery(alice.did, "w", `${alice.did}-older`, {
          status: "dead_letter",
          errorKind: "http_4xx",
          fingerprint: "fp-before"
        })
        const r = yield* callAs(alice, `${W}.replay`, { body: { rkey: "w" } })
        expect([r.status, r.body]).toEqual([200, { replayed: 2, truncated: false, inactive: 1 }])
      }))

    it.effect("replay: since not earlier than until is InvalidRequest (never a 500), nothing replayed", () =>
      Effect.gen(function*() {
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        yield* insertDelivery(alice.did, "w", `${alice.did}-dead`, { status: "dead_letter", errorKind: "http_4xx" })
        for (const until of ["2026-01-01T00:00:00.000Z", "2025-12-31T00:00:00.000Z"]) {
          const r = yield* callAs(alice, `${W}.replay`, { body: { since: "2026-01-01T00:00:00.000Z", until } })
          expect([until, r.status, r.body["error"]]).toEqual([until, 400, "InvalidRequest"])
        }
        expect(yield* statusOf(`${alice.did}-dead`)).toBe("dead_letter")
      }))

    it.effect("replay: one that stops at its statement bound (dead letters kept coming) says truncated", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "w")
        const deadLetters = (from: number, count: number, createdAt: string) =>
          sql`
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
            event_rkey, event_operation, target_url, signing_mode, fingerprint, status, attempt_count,
            last_error_kind, finished_at, created_at, updated_at)
          SELECT ${alice.did} || '-' || g, 'ev-' || ${alice.did} || '-' || g, ${alice.did}, 'w', 'direct', ${alice.did},
            'app.bsky.feed.post', 'p', 'create', 'https://receiver.example/hook', 'secret_id', 'fp-w', 'dead_letter', 1,
            'http_4xx', now(), ${createdAt}::timestamptz + g * interval '1 ms', now() - interval '1 hour'
          FROM generate_series(${from}::int, ${from + count - 1}::int) g`
        // 1,000 dead letters: a replay counts them and allows itself 2 statements of 1,000. Each of its
        // statements lets 1,000 more in, as dead letters committed late by transactions older than
        // the replay would be (updated before it started, enqueued after the last row it took).
        yield* deadLetters(1, 1000, "2026-01-01T00:00:00Z")
        yield* sql.unsafe(`
          CREATE FUNCTION test_late_dead_letters() RETURNS trigger LANGUAGE plpgsql AS $$
          DECLARE k int;
          BEGIN
            SELECT count(*) INTO k FROM outbox WHERE owner_did = '${alice.did}';
            IF k < 4000 THEN
              INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did,
                event_collection, event_rkey, event_operation, target_url, signing_mode, fingerprint, status,
                attempt_count, last_error_kind, finished_at, created_at, updated_at)
              SELECT '${alice.did}-' || g, 'ev-${alice.did}-' || g, '${alice.did}', 'w', 'direct', '${alice.did}',
                'app.bsky.feed.post', 'p', 'create', 'https://receiver.example/hook', 'secret_id', 'fp-w',
                'dead_letter', 1, 'http_4xx', now(), '2026-02-01T00:00:00Z'::timestamptz + g * interval '1 ms',
                now() - interval '1 hour'
              FROM generate_series(k + 1, k + 1000) g;
            END IF;
            RETURN NULL;
          END $$`)
        yield* sql.unsafe(`CREATE TRIGGER test_late_dead_letters AFTER UPDATE ON outbox
          FOR EACH STATEMENT EXECUTE FUNCTION test_late_dead_letters()`)
        const r = yield* callAs(alice, `${W}.replay`, { body: {} }).pipe(
          Effect.ensuring(
            sql.unsafe("DROP TRIGGER test_late_dead_letters ON outbox").pipe(
              Effect.zipRight(sql.unsafe("DROP FUNCTION test_late_dead_letters()")),
              Effect.orDie
            )
          )
        )
        expect([r.status, r.body]).toEqual([200, { replayed: 2000, truncated: true }])
        const left = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM outbox WHERE owner_did = ${alice.did} AND status = 'dead_letter'`
        expect(left[0]?.n).toBe(1000)
      }))

    it.effect("test: a webhook marked gone is refused (its row would be parked unsent), nothing queued", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "gone", { state: { gone_at: "now()" } })
        const refused = yield* callAs(alice, `${W}.test`, { body: { rkey: "gone" } })
        expect([refused.status, refused.body["error"]]).toEqual([400, "InvalidRequest"])
        expect(refused.body["message"]).toContain("marked gone")
        const queued = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM outbox WHERE owner_did = ${alice.did}`
        expect(queued[0]?.n).toBe(0)
      }))

    it.effect("resume: without replay the parked rows stay parked; a disabled or refused record resumes as disabled", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "down", { state: { auto_disabled_at: "now()", parked: "1" } })
        yield* insertDelivery(alice.did, "down", `${alice.did}-parked`, {
          status: "dead_letter",
          errorKind: "webhook_disabled"
        })
        const plain = yield* callAs(alice, `${W}.resume`, { body: { rkey: "down" } })
        expect([plain.status, plain.body]).toEqual([200, { state: "active", replayed: 0 }])
        expect(yield* statusOf(`${alice.did}-parked`)).toBe("dead_letter")

        yield* insertWebhook(alice.did, "off", { enabled: false, state: { gone_at: "now()" } })
        yield* insertWebhook(alice.did, "over", { enabled: true, active: false, state: { auto_disabled_at: "now()" } })
        const off = yield* callAs(alice, `${W}.resume`, { body: { rkey: "off" } })
        expect([off.status, off.body]).toEqual([200, { state: "disabled", replayed: 0 }])
        const over = yield* callAs(alice, `${W}.resume`, { body: { rkey: "over" } })
        expect([over.status, over.body]).toEqual([200, { state: "disabled", replayed: 0 }])
        const marks = yield* sql<{ rkey: string; gone: boolean; auto: boolean }>`
          SELECT rkey, gone_at IS NOT NULL AS gone, auto_disabled_at IS NOT NULL AS auto FROM webhooks
          WHERE owner_did = ${alice.did} ORDER BY rkey`
        expect(marks).toEqual([
          { rkey: "down", gone: false, auto: false },
          { rkey: "off", gone: false, auto: false },
          { rkey: "over", gone: false, auto: false }
        ])
      }))

    it.effect("resume with replay: at most 10,000 parked rows per call, truncated beyond; the next call takes the rest", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const alice = yield* newOwner()
        yield* insertWebhook(alice.did, "down", { state: { auto_disabled_at: "now()", parked: "1" } })
        // parked rows of two disable episodes (a resume without replay clears the parked count only)
        const event = `ev-${alice.did}-parked`
        yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES (${event}, '{}', 'x')`
        yield* sql`
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
            event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, status, attempt_count,
            last_error_kind, finished_at, updated_at)
          SELECT ${alice.did} || '-p' || g, ${event}, ${alice.did}, 'down', 'direct', ${alice.did}, 'app.bsky.feed.post',
            'p1', 'create', 'https://receiver.example/hook', 'secret_id', 'main', 'fp-down', 'dead_letter', 0,
            'webhook_disabled', now() - interval '1 minute', now() - interval '1 minute'
          FROM generate_series(1, 10005) g`
        const counts = () =>
          Effect.map(
            sql<{ status: string; n: number }>`
              SELECT status, count(*)::int AS n FROM outbox WHERE owner_did = ${alice.did} GROUP BY status ORDER BY status`,
            (rows) => Object.fromEntries(rows.map((r) => [r.status, r.n]))
          )

        const first = yield* callAs(alice, `${W}.resume`, { body: { rkey: "down", replay: true } })
        expect([first.status, first.body]).toEqual([200, { state: "active", replayed: 10_000, truncated: true }])
        expect(yield* counts()).toEqual({ dead_letter: 5, pending: 10_000 })

        const rest = yield* callAs(alice, `${W}.resume`, { body: { rkey: "down", replay: true } })
        expect([rest.status, rest.body]).toEqual([200, { state: "active", replayed: 5 }])
        expect(yield* counts()).toEqual({ pending: 10_005 })
      }))
  })
})
