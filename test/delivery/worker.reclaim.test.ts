/**
 * Rows of a dead worker (SPEC §4.1): each worker holds a liveness mark in PostgreSQL (a session
 * advisory lock on its claim connection); rows leased by a worker whose mark is gone are claimable
 * within 5 s, not after their whole lease. A live worker that lost its mark connection takes the
 * mark again; one whose claim failed keeps it. A request that kills its worker every time is
 * dead-lettered (`crashed`) after three deaths, without a fourth request (Suspects.ts).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Context, Duration, Effect, Exit, Fiber, FiberId, Layer, type Redacted, Scope } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import { CRASH_LIMIT } from "../../src/services/delivery/Suspects.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../../src/services/matching/PriorRefsStore.js"
import * as ProcessorModule from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import { WORKER_ALIVE } from "../../src/services/platform/LockKeys.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, loopbackServer, receiver, type Reply, run, startWorkerOn } from "./worker-support.js"

const BOB = plc(2)
const POST = "app.bsky.feed.post"
const ROWS = 5

/** The matching pipeline on the database at `url` (the "intake" side of the test). */
const stackOn = (url: Redacted.Redacted<string>, config: Config.FirehookConfigShape) =>
  ProcessorModule.layer().pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(RegistryStore.layerSql, PriorRefsStore.layerSql, Outbox.layerSql, Tx.layerSql, deliveryStoreSql)
    ),
    Layer.provideMerge(Layer.mergeAll(Database.layerUrl(url), Config.layerValue(config)))
  )

const onFreshDatabase = <A, E>(
  config: Config.FirehookConfigShape,
  eff: (
    url: Redacted.Redacted<string>
  ) => Effect.Effect<A, E, Layer.Layer.Success<ReturnType<typeof stackOn>> | Scope.Scope>
) => Effect.flatMap(Db.freshDatabase, ({ url }) => Effect.provide(Effect.scoped(eff(url)), stackOn(url, config)))

/** The first request of each delivery hangs; later ones succeed. */
const firstHangs = () => {
  const seen = new Set<string>()
  return (_: string, req: { readonly headers: Record<string, unknown> }): Reply => {
    const id = String(req.headers["webhook-id"])
    if (seen.has(id)) return { status: 200 }
    seen.add(id)
    return "hang"
  }
}

/** Backends of this database holding the liveness mark of `workerId`. */
const markHolders = (workerId: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ pid: number }>`
      SELECT l.pid FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ${WORKER_ALIVE}::oid
        AND l.objid = hashtext(${workerId})::oid
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).pipe(
      Effect.map((rows) => rows.map((r) => Number(r.pid))),
      Effect.orDie
    )

const leasedBy = (prefix: string) => countWhere("outbox", `status = 'leased' AND lease_token LIKE '${prefix}:%'`)

describe("rows of a dead worker", () => {
  // lease = max(60 s, timeout + 5 s) = 60 s: without the liveness mark, the rows would wait a minute
  const config = testConfig({
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    DELIVERY_PER_ORIGIN_CONCURRENCY: "8",
    DELIVERY_TIMEOUT_MS: "30000",
    DELIVERY_RETRY_BASE_MS: "100"
  })

  it.scopedLive(
    "a crashed worker's leased rows are delivered by another worker within 5 s (its lease is a minute)",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const rx = yield* receiver({ reply: firstHangs() })
          yield* run([
            whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secret: "s3cr3t-for-reclaim" }), {
              rev: rev(1)
            })
          ])
          yield* run(Array.from({ length: ROWS }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))

          const scopeA = yield* Scope.make()
          yield* startWorkerOn(url, config, { options: { workerId: "host:1:worker-a", pollIntervalMs: 100 } }, scopeA)
          yield* eventually("A's hanging requests", Effect.sync(() => rx.received.length), (n) => n === ROWS)
          expect(yield* leasedBy("host:1:worker-a")).toBe(ROWS)

          // B runs alongside: while A lives (its mark held), A's rows stay A's
          const scopeB = yield* Effect.scope
          yield* startWorkerOn(url, config, { options: { workerId: "host:2:worker-b", pollIntervalMs: 100 } }, scopeB)
          const watchUntil = (yield* Clock.currentTimeMillis) + 2_500
          while ((yield* Clock.currentTimeMillis) < watchUntil) {
            expect(yield* leasedBy("host:1:worker-a")).toBe(ROWS)
            yield* Effect.sleep(Duration.millis(100))
          }
          expect(rx.received.length).toBe(ROWS)

          // A dies (its pool closes with it, nothing is handed back, nothing settled)
          yield* Scope.close(scopeA, Exit.interrupt(FiberId.none))
          expect(yield* leasedBy("host:1:worker-a")).toBe(ROWS)
          const diedAt = yield* Clock.currentTimeMillis
          yield* eventually("delivered by B", countWhere("outbox", "status = 'delivered'"), (n) => n === ROWS, 5_000)
          const took = (yield* Clock.currentTimeMillis) - diedAt
          expect(took).toBeLessThan(5_000)
          expect(rx.received.length).toBe(2 * ROWS)
          // the reclaim spent no attempt: each row was delivered by its first recorded attempt
          expect(yield* countWhere("outbox", "attempt_count = 1 AND last_http_status = 200")).toBe(ROWS)
        })),
    60_000
  )

  it.scopedLive(
    "a request that kills its worker every time is dead-lettered `crashed` after three deaths, never sent a fourth time; a row in flight with it is delivered",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const innocentReply = firstHangs()
          // the poison hook's requests "kill" the worker (the test closes its scope when one arrives)
          const rx = yield* receiver({
            reply: (path, req) => path.startsWith("/poison") ? "hang" : innocentReply(path, req)
          })
          yield* run(
            ["innocent", "poison"].map((rkey) =>
              whEv(
                plc(1),
                rkey,
                whRecordValue(`at://${BOB}`, { url: `${rx.url}/${rkey}`, secret: "s3cr3t-for-crash" }),
                {
                  rev: rev(1)
                }
              )
            )
          )
          yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
          const sql = yield* SqlClient.SqlClient
          const rowsNow = sql<
            {
              webhook_rkey: string
              delivery_id: string
              status: string
              crash_count: number
              last_error_kind: string | null
              attempt_count: number
            }
          >`
            SELECT webhook_rkey, delivery_id, status, crash_count, last_error_kind, attempt_count FROM outbox
            ORDER BY webhook_rkey`.pipe(Effect.orDie)
          const ids = new Map((yield* rowsNow).map((r) => [r.webhook_rkey, r.delivery_id]))
          const poison = ids.get("poison") ?? ""
          const innocent = ids.get("innocent") ?? ""
          const hits = (id: string) => Effect.sync(() => rx.hits.get(id) ?? 0)

          // three workers die while the poison row's request is in flight: first fresh (with the
          // innocent row's first request in flight too), then at its first reclaim (run at full
          // concurrency), then as the worker's only counted suspect in flight
          for (let death = 1; death <= CRASH_LIMIT + 1; death++) {
            const scope = yield* Scope.make()
            yield* startWorkerOn(
              url,
              config,
              { options: { workerId: `host:${death}:worker`, pollIntervalMs: 100 } },
              scope
            )
            yield* eventually(`the poison request ${death}`, hits(poison), (n) => n === death, 15_000)
            if (death === 1) yield* eventually("the innocent request in flight", hits(innocent), (n) => n === 1)
            yield* Scope.close(scope, Exit.interrupt(FiberId.none))
          }
          // the next worker dead-letters it without sending it again, and delivers the innocent row
          yield* startWorkerOn(
            url,
            config,
            { options: { workerId: "host:9:worker", pollIntervalMs: 100 } },
            yield* Effect.scope
          )
          const settled = yield* eventually(
            "poison dead-lettered, innocent delivered",
            rowsNow,
            (rs) => rs.every((r) => r.status === (r.webhook_rkey === "poison" ? "dead_letter" : "delivered")),
            15_000
          )
          expect(settled.find((r) => r.webhook_rkey === "poison")).toMatchObject({
            last_error_kind: "crashed",
            crash_count: CRASH_LIMIT + 1,
            attempt_count: 0
          })
          expect(yield* hits(poison)).toBe(CRASH_LIMIT + 1)
          // the innocent row was counted only when it ran alone, and its success cleared it
          expect(settled.find((r) => r.webhook_rkey === "innocent")?.crash_count).toBeLessThanOrEqual(CRASH_LIMIT)
          expect(yield* countWhere("delivery_attempts", `delivery_id = '${poison}'`)).toBe(0)
          expect(yield* countWhere("audit", "status = 'dead_letter' AND error_kind = 'crashed'")).toBe(1)
        })),
    60_000
  )

  it.scopedLive(
    "a live worker whose mark connection was terminated takes its mark again, and keeps its rows",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const rx = yield* receiver({ reply: () => "hang" })
          yield* run([
            whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secret: "s3cr3t-for-reclaim" }), {
              rev: rev(1)
            })
          ])
          yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
          const scope = yield* Effect.scope
          yield* startWorkerOn(url, config, { options: { workerId: "worker-a", pollIntervalMs: 100 } }, scope)
          yield* eventually("A's hanging request", Effect.sync(() => rx.received.length), (n) => n === 1)
          const [pid] = yield* markHolders("worker-a")
          expect(pid).toBeDefined()
          const sql = yield* SqlClient.SqlClient
          yield* sql`SELECT pg_terminate_backend(${pid ?? 0})`.pipe(Effect.orDie)
          const again = yield* eventually(
            "the mark taken again",
            markHolders("worker-a"),
            (pids) => pids.length === 1 && pids[0] !== pid,
            5_000
          )
          expect(again.length).toBe(1)
          expect(yield* leasedBy("worker-a")).toBe(1)
        })),
    60_000
  )

  it.scopedLive(
    "a live worker whose mark was gone for a moment gives up within seconds a row another worker took meanwhile",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          // a receiver that never answers and counts the requests whose connection its client closed
          let requests = 0
          let aborted = 0
          const { url: rxUrl } = yield* loopbackServer((req) => {
            requests++
            req.socket.on("close", () => aborted++)
          })
          yield* run([
            whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: `${rxUrl}/in`, secret: "s3cr3t-for-reclaim" }), {
              rev: rev(1)
            })
          ])
          yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
          const scope = yield* Effect.scope
          yield* startWorkerOn(url, config, { options: { workerId: "worker-a", pollIntervalMs: 100 } }, scope)
          yield* eventually("A's hanging request", Effect.sync(() => requests), (n) => n === 1)
          const sql = yield* SqlClient.SqlClient
          // worker B is alive (the test holds its mark), and during A's gap it took the row over
          const markB = yield* sql.reserve.pipe(Effect.orDie)
          yield* markB.executeValues("SELECT pg_advisory_lock($1, hashtext($2))", [WORKER_ALIVE, "worker-b"])
            .pipe(Effect.orDie)
          const [pid] = yield* markHolders("worker-a")
          yield* sql`SELECT pg_terminate_backend(${pid ?? 0})`.pipe(Effect.orDie)
          yield* sql`UPDATE outbox SET lease_token = 'worker-b:1', leased_until = now() + interval '60 seconds'
            WHERE status = 'leased' AND lease_token LIKE 'worker-a:%'`.pipe(Effect.orDie)
          // A's next claim fails on the dead connection, its mark is taken again, and its leases are
          // renewed at once: the row is B's, so A's request is interrupted (its connection closed)
          // within seconds, not at A's next heartbeat (a third of the 60 s lease after the claim)
          yield* eventually("A's request given up", Effect.sync(() => aborted), (n) => n >= 1, 14_000)
          expect(requests).toBe(1)
          expect(yield* leasedBy("worker-b")).toBe(1)
        })),
    60_000
  )

  it.scopedLive(
    "a claim that fails on a healthy connection (cancelled) does not let the worker look dead: no row is freed",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          yield* run([
            whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: "http://127.0.0.1:9/in" }), { rev: rev(1) })
          ])
          yield* run([ev(BOB, POST, "p1", { rev: rev(10) }), ev(BOB, POST, "p2", { rev: rev(11) })])
          const scope = yield* Effect.scope
          const storeOn = (name: string) =>
            Effect.map(
              Layer.buildWithScope(
                deliveryStoreSql.pipe(Layer.provide(Database.layerUrl(url, { applicationName: name }))),
                scope
              ),
              (ctx) => Context.get(ctx, DeliveryStore)
            )
          const a = yield* storeOn("fh-store-a")
          const b = yield* storeOn("fh-store-b")
          expect((yield* a.claim("worker-a", 1, 60_000)).rows.length).toBe(1)
          const sql = yield* SqlClient.SqlClient
          // A's next claim waits behind a table lock and is cancelled: it fails, its connection is fine
          const failed = yield* sql.withTransaction(Effect.gen(function*() {
            yield* sql`LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`
            const claim = yield* Effect.fork(Effect.either(a.claim("worker-a", 1, 60_000)))
            // inside a transaction pg_stat_activity is a snapshot taken at its first read: cleared
            // before each read, or a claim not yet waiting at the first one would never be seen
            const waiting = yield* eventually(
              "A's claim waiting",
              Effect.zipRight(
                sql`SELECT pg_stat_clear_snapshot()`,
                sql<{ pid: number }>`SELECT pid FROM pg_stat_activity
                  WHERE datname = current_database() AND application_name = 'fh-store-a'
                    AND wait_event_type = 'Lock'`
              ),
              (rows) => rows.length === 1
            )
            yield* sql`SELECT pg_cancel_backend(${waiting[0]?.pid ?? 0})`
            return yield* Fiber.join(claim)
          })).pipe(Effect.orDie)
          expect(failed._tag).toBe("Left")
          // A is alive: B's reclaim frees none of its rows, and A's mark is held by one session
          expect((yield* b.reclaimAbandoned("worker-b")).freed).toBe(0)
          expect(yield* leasedBy("worker-a")).toBe(1)
          expect((yield* markHolders("worker-a")).length).toBe(1)
          expect((yield* a.claim("worker-a", 1, 60_000)).rows.length).toBe(1)
        })),
    60_000
  )
})
