/**
 * Leases on real PostgreSQL (SPEC §4.1): two workers with their own pools share one table and
 * deliver every row exactly once; a worker interrupted mid-attempt leaves its row leased until the
 * lease expires, then another worker reclaims and delivers it; a worker that lost its lease can
 * never overwrite the row; the claim honours per-origin room.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, FiberId, Layer, Option, Queue, type Redacted, Scope, Stream } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { NOTIFY_CHANNEL } from "../../src/services/matching/OutboxNotify.js"
import * as PriorRefsStore from "../../src/services/matching/PriorRefsStore.js"
import * as ProcessorModule from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import { WORKER_ALIVE } from "../../src/services/platform/LockKeys.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, sqlStack, testConfig, whEv, whRecordValue } from "../support/stack.js"
import {
  countWhere,
  eventually,
  outboxRows,
  receiver,
  type Reply,
  run,
  startWorkerOn,
  whsec
} from "./worker-support.js"

const BOB = plc(2)
const POST = "app.bsky.feed.post"

/** The store's counts with this many pending, leased and dead-lettered rows (no disabled or gone webhooks). */
const backlog = (pending: number, leased: number, deadLetter: number) => ({
  pending,
  leased,
  deadLetter,
  autoDisabledWebhooks: 0,
  goneWebhooks: 0
})

/** The matching pipeline on the database at `url` (the "intake" side of the test). */
const stackOn = (url: Redacted.Redacted<string>, config: Config.FirehookConfigShape) =>
  ProcessorModule.layer().pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(RegistryStore.layerSql, PriorRefsStore.layerSql, Outbox.layerSql, Tx.layerSql, deliveryStoreSql)
    ),
    Layer.provideMerge(Layer.mergeAll(Database.layerUrl(url), Config.layerValue(config)))
  )

/**
 * `times` more pending rows per outbox row, with distinct delivery ids (straight into the table;
 * their `origin` is NULL, as for rows enqueued before migration 0002).
 */
const copyRows = (times: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
    INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
      event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint)
    SELECT o.delivery_id || '_' || g, o.event_id, o.owner_did, o.webhook_rkey, o.match_kind, o.event_did,
      o.event_collection, o.event_rkey, o.event_operation, o.target_url, o.signing_mode, o.secret_id, o.fingerprint
    FROM outbox o CROSS JOIN generate_series(1, ${times}) g`)

/** One webhook (owner plc(1), rkey `a`) watching BOB, delivering to https://a.example/hook. */
const webhookOnA = run([
  whEv(plc(1), "a", whRecordValue(`at://${BOB}`, { url: "https://a.example/hook" }), { rev: rev(1) })
])

/** A test of the store itself on a fresh test stack. */
const onStoreStack = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  eff.pipe(Effect.scoped, Effect.provide(Layer.provideMerge(deliveryStoreSql, sqlStack())))

/** Run `eff` against a fresh database whose URL it also gets (to start more "processes" on it). */
const onFreshDatabase = <A, E>(
  config: Config.FirehookConfigShape,
  eff: (
    url: Redacted.Redacted<string>
  ) => Effect.Effect<A, E, Layer.Layer.Success<ReturnType<typeof stackOn>> | Scope.Scope>
) => Effect.flatMap(Db.freshDatabase, ({ url }) => Effect.provide(Effect.scoped(eff(url)), stackOn(url, config)))

describe("delivery leases on PostgreSQL", () => {
  const config = testConfig({
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    DELIVERY_CONCURRENCY: "64",
    DELIVERY_PER_ORIGIN_CONCURRENCY: "64",
    // the receiver shares the test process: on a loaded machine a request can take seconds
    DELIVERY_TIMEOUT_MS: "30000",
    DELIVERY_RETRY_BASE_MS: "100"
  })

  it.scopedLive(
    "two workers on one table: 10,000 rows, each delivered exactly once",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const secret = whsec(3)
          const rx = yield* receiver({ secretFor: () => secret })
          const owners = Array.from({ length: 10 }, (_, i) => plc(100 + i))
          yield* run(owners.map((o) =>
            whEv(o, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secret }), { rev: rev(1) })
          ))
          const r = yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
          expect(r.inserted).toBe(10)
          // 9,990 more rows for the same subscriptions (distinct delivery ids), straight into the table
          const sql = yield* SqlClient.SqlClient
          yield* copyRows(999)
          expect(yield* countWhere("outbox", "status = 'pending'")).toBe(10_000)

          const scope = yield* Effect.scope
          const a = yield* startWorkerOn(url, config, { options: { workerId: "worker-a" } }, scope)
          const b = yield* startWorkerOn(url, config, { options: { workerId: "worker-b" } }, scope)
          yield* eventually(
            "10,000 delivered",
            countWhere("outbox", "status = 'delivered'"),
            (n) =>
              n === 10_000,
            240_000
          )
          // Every row was sent once per attempt the database recorded for it, and no row was ever in
          // two workers' hands at once: a second holder's request would show up as a receiver hit
          // without a recorded attempt (its settle is refused), so hits == attempts for every row.
          // (A request that times out under heavy load is legitimately retried: at least once.)
          const perRow = yield* sql<{ delivery_id: string; attempt_count: number; recorded: number }>`
            SELECT o.delivery_id, o.attempt_count, (SELECT count(*)::int FROM delivery_attempts a WHERE a.delivery_id = o.delivery_id) AS recorded
            FROM outbox o`
          expect(perRow.length).toBe(10_000)
          const mismatched = perRow.filter((r) =>
            rx.hits.get(r.delivery_id) !== r.attempt_count || r.recorded !== r.attempt_count
          )
          expect(mismatched).toEqual([])
          const firstTry = perRow.filter((r) => r.attempt_count === 1).length
          // on an idle machine every row is delivered by its first attempt; a loaded CI machine may
          // time a few out (they are then retried, which the checks above account for)
          expect(firstTry).toBeGreaterThan(9_000)
          expect(rx.hits.size).toBe(10_000)
          expect(rx.received.length).toBe(perRow.reduce((n, r) => n + r.attempt_count, 0))
          expect(rx.received.every((q) => q.verified?.standard === true && q.verified.wisp === true)).toBe(true)
          const sa = yield* a.delivery.stats
          const sb = yield* b.delivery.stats
          expect(sa.attempts + sb.attempts).toBe(rx.received.length)
          expect(sa.attempts).toBeGreaterThan(0)
          expect(sb.attempts).toBeGreaterThan(0)
          expect(yield* countWhere("delivery_attempts", "outcome = 'delivered'")).toBe(10_000)
          expect(yield* countWhere("audit", "status = 'delivered'")).toBe(10_000)
          expect(yield* countWhere("outbox", "lease_token IS NOT NULL OR leased_until IS NOT NULL")).toBe(0)
        })),
    // about 20 s on an idle 2-CPU machine; the margin is for a loaded one (CI runs two files at once)
    300_000
  )

  it.scopedLive(
    "an interrupted worker leaves its row leased; another worker reclaims it after the lease and delivers it",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const seen = new Set<string>()
          // the first request of each delivery hangs; later ones succeed
          const reply = (_: string, req: { readonly headers: Record<string, unknown> }): Reply => {
            const id = String(req.headers["webhook-id"])
            if (seen.has(id)) return { status: 200 }
            seen.add(id)
            return "hang"
          }
          const rx = yield* receiver({ reply })
          yield* run([
            whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secret: "s3cr3t-for-lease-test" }), {
              rev: rev(1)
            })
          ])
          yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
          const sql = yield* SqlClient.SqlClient
          const leaseOf = sql<{ lease_token: string | null; status: string; attempt_count: number; until_ms: number }>`
            SELECT lease_token, status, attempt_count,
              (extract(epoch FROM leased_until) * 1000)::float8 AS until_ms FROM outbox`.pipe(
            Effect.map((rows) => rows[0]),
            Effect.orDie
          )

          // A's liveness mark stays held after A is interrupted (as for a process that hangs but lives):
          // the test holds it in A's place, so only the lease expiry frees the row (a worker whose mark
          // is gone has its rows freed sooner: worker.reclaim.test.ts)
          const markConn = yield* sql.reserve.pipe(Effect.orDie)
          yield* markConn.executeValues("SELECT pg_advisory_lock($1, hashtext($2))", [WORKER_ALIVE, "worker-a"]).pipe(
            Effect.orDie
          )
          const scopeA = yield* Scope.make()
          yield* startWorkerOn(
            url,
            config,
            { options: { workerId: "worker-a", leaseMs: 1_500, pollIntervalMs: 100 } },
            scopeA
          )
          yield* eventually("the hanging request", Effect.sync(() => rx.received.length), (n) => n === 1)
          const first = yield* leaseOf
          expect(first?.lease_token?.startsWith("worker-a:")).toBe(true)

          // worker B runs alongside and must not take the row while A keeps renewing its lease
          const scopeB = yield* Effect.scope
          yield* startWorkerOn(
            url,
            config,
            { options: { workerId: "worker-b", leaseMs: 1_500, pollIntervalMs: 100 } },
            scopeB
          )
          const renewed = yield* eventually(
            "two renewals by A",
            leaseOf,
            (l) => l !== undefined && l.until_ms > (first?.until_ms ?? 0) + 900,
            10_000
          )
          expect(renewed?.lease_token).toBe(first?.lease_token)
          expect(rx.received.length).toBe(1)

          // interrupt A (like a crash): nothing is handed back, the row stays leased, no attempt spent
          yield* Scope.close(scopeA, Exit.interrupt(FiberId.none))
          const orphan = yield* leaseOf
          expect(orphan).toMatchObject({ status: "leased", attempt_count: 0, lease_token: first?.lease_token })

          // after the lease expires B reclaims the row and delivers it
          yield* eventually("delivered by B", leaseOf, (l) => l?.status === "delivered", 15_000)
          expect(rx.received.length).toBe(2)
          const audit = yield* sql<{ at_ms: number }>`
            SELECT (extract(epoch FROM created_at) * 1000)::float8 AS at_ms FROM audit`
          expect(audit.length).toBe(1)
          expect(audit[0]?.at_ms ?? 0).toBeGreaterThanOrEqual(orphan?.until_ms ?? Number.POSITIVE_INFINITY)
          expect(yield* countWhere("delivery_attempts", "true")).toBe(1)
          expect((yield* outboxRows)[0]).toMatchObject({ attempt_count: 1, last_http_status: 200 })
        })),
    60_000
  )

  it.scopedLive(
    "a worker that lost its lease cannot settle or renew the row",
    () =>
      Effect.gen(function*() {
        yield* run([
          whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: "https://receiver.example/hook" }), { rev: rev(1) })
        ])
        yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
        const store = yield* DeliveryStore
        const old = yield* store.claim("w1", 10, 200)
        expect(old.rows.length).toBe(1)
        const stale = old.rows[0]
        if (stale === undefined) return
        expect(stale.leaseToken.startsWith("w1:")).toBe(true)
        // the lease has not expired: nobody else can claim it
        expect((yield* store.claim("w2", 10, 60_000)).rows.length).toBe(0)
        yield* eventually("lease expired", countWhere("outbox", "leased_until < now()"), (n) => n === 1)
        const fresh = yield* store.claim("w2", 10, 60_000)
        expect(fresh.rows.map((r) => r.deliveryId)).toEqual([stale.deliveryId])
        const mine = fresh.rows[0]
        if (mine === undefined) return
        expect(mine.leaseToken.startsWith("w2:")).toBe(true)
        expect(mine.leaseToken).not.toBe(stale.leaseToken)

        const id = stale.deliveryId
        const t = stale.leaseToken
        expect(yield* store.heartbeat(id, t, 60_000)).toBe(false)
        expect(yield* store.markDelivered(id, t, { attemptCount: 1, httpStatus: 200 })).toBe(false)
        expect(
          yield* store.reschedule(id, t, { attemptCount: 1, delayMs: 1000, errorKind: "http_5xx", httpStatus: 500 })
        ).toBe(false)
        expect(yield* store.defer(id, t, 1000)).toBe(false)
        expect(yield* store.deadLetter(id, t, { attemptCount: 1, errorKind: "http_4xx", httpStatus: 400 })).toBe(false)
        expect(yield* store.cancel(id, t, "subscription_changed")).toBe(false)
        const [row] = yield* outboxRows
        expect(row).toMatchObject({
          status: "leased",
          lease_token: mine.leaseToken,
          attempt_count: 0,
          last_error_kind: null
        })
        expect(yield* countWhere("audit", "true")).toBe(0)

        // the current holder can
        expect(yield* store.heartbeat(id, mine.leaseToken, 60_000)).toBe(true)
        expect(
          yield* store.markDelivered(id, mine.leaseToken, {
            attemptCount: 1,
            httpStatus: 200,
            attempt: {
              startedAtMs: 1_700_000_000_000,
              durationMs: 5,
              outcome: "delivered",
              errorKind: undefined,
              httpStatus: 200,
              responseExcerpt: "x".repeat(5000)
            }
          })
        ).toBe(true)
        expect(yield* store.markDelivered(id, mine.leaseToken, { attemptCount: 2, httpStatus: 200 })).toBe(false)
        expect(yield* countWhere("audit", "status = 'delivered' AND url = '[redacted]'")).toBe(1)
        expect(yield* countWhere("delivery_attempts", "octet_length(response_excerpt) = 1024")).toBe(1)
        expect((yield* outboxRows)[0]).toMatchObject({ status: "delivered", lease_token: null, attempt_count: 1 })
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "the claim takes at most the given room per origin and skips full origins",
    () =>
      Effect.gen(function*() {
        yield* run([
          whEv(plc(1), "a", whRecordValue(`at://${BOB}`, { url: "https://a.example/hook" }), { rev: rev(1) }),
          whEv(plc(1), "b", whRecordValue(`at://${BOB}`, { url: "https://B.example:8443/x?y" }), { rev: rev(1) })
        ])
        yield* run(Array.from({ length: 5 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const store = yield* DeliveryStore
        const first = yield* store.claim("w", 10, 60_000, { defaultRoom: 2 })
        expect(first.rows.length).toBe(4)
        expect(first.moreDue).toBe(true)
        const origins = first.rows.map((r) => r.origin).sort()
        expect(origins).toEqual([
          "https://a.example",
          "https://a.example",
          "https://b.example:8443",
          "https://b.example:8443"
        ])
        expect(first.rows.every((r) => r.body !== undefined && r.ageMs >= 0 && r.attemptCount === 0)).toBe(true)
        const second = yield* store.claim("w", 10, 60_000, { fullOrigins: ["https://a.example"], defaultRoom: 10 })
        expect(second.rows.map((r) => r.origin)).toEqual([
          "https://b.example:8443",
          "https://b.example:8443",
          "https://b.example:8443"
        ])
        const third = yield* store.claim("w", 10, 60_000, {
          rooms: [{ origin: "https://a.example", room: 1 }],
          defaultRoom: 0
        })
        expect(third.rows.map((r) => r.origin)).toEqual(["https://a.example"])
        const counts = yield* store.counts
        expect(counts).toEqual(backlog(2, 8, 0))
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "the claim takes the rows due longest first, whatever their order of enqueue",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run(Array.from({ length: 5 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const sql = yield* SqlClient.SqlClient
        // due 1, 5, 2, 4 and 3 minutes ago: p1 and p3 have waited longest
        const minutesAgo = [1, 5, 2, 4, 3]
        for (const [i, m] of minutesAgo.entries()) {
          yield* sql`UPDATE outbox SET next_attempt_at = now() - ${m}::int * interval '1 minute'
            WHERE event_rkey = ${`p${i}`}`
        }
        const store = yield* DeliveryStore
        const first = yield* store.claim("w", 2, 60_000)
        expect(first.rows.map((r) => r.eventRkey)).toEqual(["p1", "p3"])
        const second = yield* store.claim("w", 2, 60_000)
        expect(second.rows.map((r) => r.eventRkey)).toEqual(["p4", "p2"])
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "rows freed from a dead worker wake every worker's claim loop at once (NOTIFY), not at its next poll",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run([ev(BOB, POST, "p0", { rev: rev(10) })])
        const sql = yield* SqlClient.SqlClient
        const pg = yield* PgClient.PgClient
        // leased for another minute by a worker whose liveness mark nobody holds (its process died)
        yield* sql`UPDATE outbox SET status = 'leased', lease_token = 'dead-worker:' || gen_random_uuid()::text,
          leased_until = now() + interval '1 minute'`
        const heard = yield* Queue.unbounded<string>()
        yield* Effect.forkScoped(Stream.runForEach(pg.listen(NOTIFY_CHANNEL), (payload) => Queue.offer(heard, payload)))
        // listening once a marker of ours comes back (notifications arrive in the order of their commits)
        let listening = false
        for (let i = 0; i < 100 && !listening; i++) {
          yield* sql`SELECT pg_notify(${NOTIFY_CHANNEL}, 'marker')`
          listening = Option.isSome(yield* Effect.timeoutOption(Queue.take(heard), "100 millis"))
        }
        expect(listening).toBe(true)
        const store = yield* DeliveryStore
        expect((yield* store.reclaimAbandoned("w")).freed).toBe(1)
        // the reclaim's wake-up, after any marker still on its way
        const wake = yield* Effect.gen(function*() {
          for (let i = 0; i < 1_000; i++) {
            const payload = yield* Queue.take(heard)
            if (payload !== "marker") return Option.some(payload)
          }
          return Option.none<string>()
        }).pipe(Effect.timeoutOption("10 seconds"), Effect.map(Option.flatten))
        expect(wake).toEqual(Option.some("1"))
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "a park settled after its webhook was resumed puts the row back to pending, due now and unfinished; a row of an older version of the webhook is parked",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run([ev(BOB, POST, "p0", { rev: rev(10) }), ev(BOB, POST, "p1", { rev: rev(11) })])
        const store = yield* DeliveryStore
        const sql = yield* SqlClient.SqlClient
        const claimed = (yield* store.claim("w", 10, 60_000)).rows
        const resumed = claimed.find((r) => r.eventRkey === "p0")
        const older = claimed.find((r) => r.eventRkey === "p1")
        if (resumed === undefined || older === undefined) return expect.fail("both rows claimed")
        // the attempt read the webhook as disabled; by the settle it is neither gone nor auto-disabled
        expect(yield* store.parkDisabled(resumed.deliveryId, resumed.leaseToken)).toBe(false)
        // a row enqueued for an older version of the webhook (another fingerprint): parked
        yield* sql`UPDATE outbox SET fingerprint = 'an-older-version' WHERE delivery_id = ${older.deliveryId}`
        expect(yield* store.parkDisabled(older.deliveryId, older.leaseToken)).toBe(true)
        const rows = yield* sql<
          { event_rkey: string; status: string; finished: boolean; due: boolean; last_error_kind: string | null }
        >`SELECT event_rkey, status, finished_at IS NOT NULL AS finished, next_attempt_at <= now() AS due,
            last_error_kind FROM outbox ORDER BY event_rkey`
        expect(rows).toEqual([
          { event_rkey: "p0", status: "pending", finished: false, due: true, last_error_kind: null },
          { event_rkey: "p1", status: "dead_letter", finished: true, due: true, last_error_kind: "webhook_disabled" }
        ])
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "a row delivered after a failed attempt keeps no error: its last error is cleared, its status is the 2xx's",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run([ev(BOB, POST, "p0", { rev: rev(10) })])
        const store = yield* DeliveryStore
        const sql = yield* SqlClient.SqlClient
        const attempt = { startedAtMs: Date.now(), durationMs: 5, responseExcerpt: undefined }
        const [first] = (yield* store.claim("w", 1, 60_000)).rows
        if (first === undefined) return expect.fail("claimed")
        expect(
          yield* store.reschedule(first.deliveryId, first.leaseToken, {
            attemptCount: 1,
            delayMs: 0,
            errorKind: "http_5xx",
            httpStatus: 503,
            attempt: { ...attempt, outcome: "retry", errorKind: "http_5xx", httpStatus: 503 }
          })
        ).toBe(true)
        const [second] = (yield* store.claim("w", 1, 60_000)).rows
        if (second === undefined) return expect.fail("claimed again")
        expect(
          yield* store.markDelivered(second.deliveryId, second.leaseToken, {
            attemptCount: 2,
            httpStatus: 200,
            attempt: { ...attempt, outcome: "delivered", errorKind: undefined, httpStatus: 200 }
          })
        ).toBe(true)
        const rows = yield* sql<
          { status: string; attempt_count: number; last_error_kind: string | null; last_http_status: number | null }
        >`SELECT status, attempt_count, last_error_kind, last_http_status FROM outbox`
        expect(rows).toEqual([{ status: "delivered", attempt_count: 2, last_error_kind: null, last_http_status: 200 }])
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "an origin that recovers early gets back the rows parked to its cool-down's end, not the retries due before it (their backoff stands)",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run([ev(BOB, POST, "p0", { rev: rev(10) }), ev(BOB, POST, "p1", { rev: rev(11) })])
        const store = yield* DeliveryStore
        const sql = yield* SqlClient.SqlClient
        const cooling = [{ origin: "https://a.example", untilMs: Date.now() + 120_000 }]
        expect(yield* store.park(cooling)).toBe(2)
        // p1 was attempted meanwhile (an attempt started before the trip): it retries in 30 s
        yield* sql`UPDATE outbox SET next_attempt_at = now() + interval '30 seconds' WHERE event_rkey = 'p1'`
        expect(yield* store.unpark(cooling)).toBe(1)
        const rows = yield* sql<{ event_rkey: string; due: boolean; in_s: number }>`
          SELECT event_rkey, next_attempt_at <= now() AS due,
            round(extract(epoch FROM next_attempt_at - now()))::int AS in_s
          FROM outbox ORDER BY event_rkey`
        expect(rows.map((r) => [r.event_rkey, r.due])).toEqual([["p0", true], ["p1", false]])
        expect(rows[1]?.in_s).toBeGreaterThan(20)
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "claims run on one reserved connection without bitmap scans; a lost claim connection is replaced",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run(Array.from({ length: 3 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const store = yield* DeliveryStore
        const sql = yield* SqlClient.SqlClient
        expect((yield* store.claim("w", 1, 60_000)).rows.length).toBe(1)
        // the claim connection: the backend whose last statement was the claim
        const claimers = yield* sql<{ pid: number }>`
          SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%WITH win AS%'`
        expect(claimers.length).toBe(1)
        // the session setting stays on that connection: the pool's other connections plan as usual
        const settings = yield* Effect.all(
          Array.from({ length: 4 }, () => sql<{ enable_bitmapscan: string }>`SHOW enable_bitmapscan`),
          { concurrency: 4 }
        )
        expect(settings.flat().map((r) => r.enable_bitmapscan)).toEqual(["on", "on", "on", "on"])
        // lose the claim connection: at most one claim fails, then a new connection is reserved
        yield* sql`SELECT pg_terminate_backend(${claimers[0]?.pid ?? 0})`
        const after = yield* Effect.either(store.claim("w", 1, 60_000))
        const rows = after._tag === "Right" ? after.right.rows : (yield* store.claim("w", 1, 60_000)).rows
        expect(rows.length).toBe(1)
        expect((yield* store.claim("w", 5, 60_000)).rows.length).toBe(1)
        expect(yield* store.counts).toEqual(backlog(0, 3, 0))
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "heartbeats over the same rows in opposite orders never deadlock (they do not wait for locks) and both report every row held",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run([ev(BOB, POST, "p", { rev: rev(10) })])
        yield* copyRows(1999)
        const store = yield* DeliveryStore
        const claimed = (yield* store.claim("w", 1000, 60_000, { defaultRoom: 1000 })).rows
        const more = (yield* store.claim("w", 1000, 60_000, { defaultRoom: 1000 })).rows
        const leases = [...claimed, ...more].map((r) => ({ deliveryId: r.deliveryId, token: r.leaseToken }))
        expect(leases.length).toBe(2000)
        const ascending = [...leases].sort((a, b) => (a.deliveryId < b.deliveryId ? -1 : 1))
        const descending = [...ascending].reverse()
        for (let round = 0; round < 5; round++) {
          const [a, b] = yield* Effect.all(
            [
              Effect.either(store.heartbeatMany(ascending, 60_000)),
              Effect.either(store.heartbeatMany(descending, 60_000))
            ],
            { concurrency: 2 }
          )
          expect(a._tag === "Right" ? a.right.size : a.left.code).toBe(2000)
          expect(b._tag === "Right" ? b.right.size : b.left.code).toBe(2000)
        }
      }).pipe(onStoreStack),
    120_000
  )

  it.scopedLive(
    "the heartbeat does not wait for rows another statement holds (a settle in progress): it renews the others and reports those as held",
    () =>
      Effect.gen(function*() {
        yield* webhookOnA
        yield* run([ev(BOB, POST, "p", { rev: rev(10) })])
        yield* copyRows(9)
        const store = yield* DeliveryStore
        const sql = yield* SqlClient.SqlClient
        const rows = (yield* store.claim("w", 10, 60_000, { defaultRoom: 10 })).rows
        expect(rows.length).toBe(10)
        const leases = rows.map((r) => ({ deliveryId: r.deliveryId, token: r.leaseToken }))
        const lockedIds = leases.slice(0, 5).map((l) => l.deliveryId)
        const untilOf = (ids: ReadonlyArray<string>) =>
          sql<{ t: number }>`SELECT extract(epoch FROM leased_until)::float8 AS t FROM outbox
            WHERE delivery_id IN ${sql.in(ids)} ORDER BY delivery_id`.pipe(Effect.map((r) => r.map((x) => x.t)))
        const before = yield* untilOf(leases.map((l) => l.deliveryId))
        // another transaction holds five of the rows (as a settle batch does while it runs)
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const holder = yield* Effect.fork(
          sql.withTransaction(
            Effect.gen(function*() {
              yield* sql`SELECT delivery_id FROM outbox WHERE delivery_id IN ${sql.in(lockedIds)} FOR UPDATE`
              yield* Deferred.succeed(locked, undefined)
              yield* Deferred.await(release)
            })
          )
        )
        yield* Deferred.await(locked)
        // answers while the locks are held (the old statement waited for them)
        const held = yield* store.heartbeatMany(leases, 120_000).pipe(Effect.timeout("10 seconds"))
        expect(held.size).toBe(10)
        const after = yield* untilOf(leases.map((l) => l.deliveryId))
        const lockedSet = new Set(lockedIds)
        const sortedIds = leases.map((l) => l.deliveryId).sort()
        sortedIds.forEach((id, i) => {
          if (lockedSet.has(id)) expect(after[i]).toBe(before[i])
          else expect(after[i]).toBeGreaterThan(before[i] ?? Infinity)
        })
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        // a lease taken over by another worker is not reported as held
        yield* sql`UPDATE outbox SET lease_token = 'other:1' WHERE delivery_id = ${lockedIds[0] ?? ""}`
        expect((yield* store.heartbeatMany(leases, 120_000)).size).toBe(9)
      }).pipe(onStoreStack),
    60_000
  )

  it.scopedLive(
    "with a pool of one connection claims run in their own transactions and settles still get through",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
            event_rkey, event_operation, target_url, signing_mode, fingerprint)
          SELECT 'd' || g, 'e', 'did:plc:o', 'w', 'direct', 'did:plc:e', 'c', 'r', 'create', 'https://a.example/h', 'none', 'f'
          FROM generate_series(1, 6) g`
        const store = yield* DeliveryStore
        const first = yield* store.claim("w", 3, 60_000)
        expect(first.rows.length).toBe(3)
        for (const r of first.rows) {
          expect(
            yield* store.markDelivered(r.deliveryId, r.leaseToken, {
              attemptCount: 1,
              httpStatus: 204,
              attempt: {
                startedAtMs: 0,
                durationMs: 1,
                outcome: "delivered",
                errorKind: undefined,
                httpStatus: 204,
                responseExcerpt: undefined
              }
            })
          ).toBe(true)
        }
        expect((yield* store.claim("w", 10, 60_000)).rows.length).toBe(3)
        expect(yield* store.counts).toEqual(backlog(0, 3, 0))
      }).pipe(
        Effect.timeoutFail({
          duration: "20 seconds",
          onTimeout: () => new Error("the store hung on a one-connection pool")
        }),
        Effect.provide(Layer.provideMerge(deliveryStoreSql, Db.layer({ maxConnections: 1 })))
      ),
    60_000
  )
})
