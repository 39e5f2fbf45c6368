/**
 * The liveness mark across a failed claim (ClaimConnection.replaceClaimConn, SPEC §4.1): a claim
 * that fails on a healthy claim connection (here: cancelled while it waits for a table lock)
 * replaces the connection, and the worker's mark must be held by some session at every moment of
 * the handover, or another delivery process's reclaim (every 2 s, reading the granted marks of
 * `pg_locks`) takes the live worker for dead and frees the rows it is sending.
 *
 * Deterministic: the test holds a lock on the `pg_locks` view, so the fresh claim connection's
 * mark statement (which reads it) waits, and the test looks at the marks (through
 * `pg_lock_status()`, what the view reads; the same judgment as the reclaim's `live` set) while it
 * waits. Before the fix the old connection had already been given back (its marks released) at
 * that moment; with a fresh connection that cannot take the marks in time, the old one was given
 * back all the same.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, type Redacted, Scope } from "effect"
import {
  DeliveryStore,
  type DeliveryStoreShape,
  layerSql as deliveryStoreSql
} from "../../src/services/delivery/DeliveryStore.js"
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
import { countWhere, eventually, run } from "./worker-support.js"

const BOB = plc(2)
const POST = "app.bsky.feed.post"
const APP_A = "fh-store-a"

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

/** Backends of this database holding the mark of `workerId` (read past the `pg_locks` view). */
const markHolders = (workerId: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ pid: number }>`
      SELECT l.pid FROM pg_lock_status() l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ${WORKER_ALIVE}::oid
        AND l.objid = hashtext(${workerId})::oid
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`).pipe(
      Effect.map((rows) => rows.map((r) => Number(r.pid)).sort()),
      Effect.orDie
    )

/**
 * Sessions of store A waiting for a lock, with what they run (read inside a transaction:
 * `pg_stat_activity` is a snapshot taken at its first read in a transaction, cleared first).
 */
const waitingOfA = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.zipRight(
    sql`SELECT pg_stat_clear_snapshot()`,
    sql<{ pid: number; query: string }>`SELECT pid, query FROM pg_stat_activity
      WHERE datname = current_database() AND application_name = ${APP_A} AND wait_event_type = 'Lock'`
  ).pipe(Effect.orDie))

const isMarkStatement = (query: string) => query.includes("advisory_lock")

/** A setup with two delivery stores (two processes) and one row claimed by worker A. */
const twoStores = (url: Redacted.Redacted<string>) =>
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
    const a = yield* storeOn(APP_A)
    const b = yield* storeOn("fh-store-b")
    expect((yield* a.claim("worker-a", 1, 60_000)).rows.length).toBe(1)
    const before = yield* markHolders("worker-a")
    expect(before.length).toBe(1)
    return { a, b, pidA: before[0] ?? 0 }
  })

/**
 * In one transaction holding `outbox` and the `pg_locks` view: A's next claim waits for `outbox`
 * and is cancelled (it fails, its connection is fine); the fresh connection's mark statement then
 * waits for the view, and `during` runs. Answers A's claim result after the commit.
 */
const failClaimWithMarkHeldUp = <A>(
  a: DeliveryStoreShape,
  during: Effect.Effect<A, unknown, SqlClient.SqlClient>
) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const { claim, seen } = yield* sql.withTransaction(Effect.gen(function*() {
      yield* sql`LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE`
      yield* sql`LOCK TABLE pg_catalog.pg_locks IN ACCESS EXCLUSIVE MODE`
      const claim = yield* Effect.fork(Effect.either(a.claim("worker-a", 1, 60_000)))
      const waiting = yield* eventually("A's claim waiting", waitingOfA, (rows) => rows.length === 1)
      expect(isMarkStatement(waiting[0]?.query ?? "")).toBe(false)
      yield* sql`SELECT pg_cancel_backend(${waiting[0]?.pid ?? 0})`
      yield* eventually(
        "A's fresh claim connection taking the mark",
        waitingOfA,
        (rows) => rows.some((r) => isMarkStatement(r.query))
      )
      const seen = yield* during
      return { claim, seen }
    })).pipe(Effect.orDie)
    return { failed: yield* Fiber.join(claim), seen }
  })

describe("the liveness mark across a failed claim", () => {
  const config = testConfig({ WEBHOOK_ALLOW_INSECURE_DEV: "1" })

  it.scopedLive(
    "is held by the old claim connection until the fresh one has taken it: no reclaim frees the live worker's row",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const { a, b, pidA } = yield* twoStores(url)
          const { failed, seen } = yield* failClaimWithMarkHeldUp(a, markHolders("worker-a"))
          expect(failed._tag).toBe("Left")
          // while the fresh connection was taking the mark, the old one still held it
          expect(seen).toEqual([pidA])
          // handed over: held by the fresh connection alone, and A is alive to every reclaim
          const after = yield* markHolders("worker-a")
          expect(after.length).toBe(1)
          expect(after[0]).not.toBe(pidA)
          expect((yield* b.reclaimAbandoned("worker-b")).freed).toBe(0)
          expect(yield* countWhere("outbox", "status = 'leased' AND lease_token LIKE 'worker-a:%'")).toBe(1)
          expect((yield* a.claim("worker-a", 1, 60_000)).rows.length).toBe(1)
          expect(yield* markHolders("worker-a")).toEqual(after)
        })),
    60_000
  )

  it.scopedLive(
    "stays on the old claim connection when no fresh one takes it in time",
    () =>
      onFreshDatabase(config, (url) =>
        Effect.gen(function*() {
          const { a, b, pidA } = yield* twoStores(url)
          // the fresh connection's mark statement is held up past the handover's bound (5 s)
          const gaveUp = Effect.zipRight(
            eventually("the fresh connection given up", waitingOfA, (rows) => rows.length === 0, 20_000),
            markHolders("worker-a")
          )
          const { failed, seen } = yield* failClaimWithMarkHeldUp(a, gaveUp)
          expect(failed._tag).toBe("Left")
          // the old connection kept its mark all along, and is still the claim connection
          expect(seen).toEqual([pidA])
          expect((yield* b.reclaimAbandoned("worker-b")).freed).toBe(0)
          expect(yield* countWhere("outbox", "status = 'leased' AND lease_token LIKE 'worker-a:%'")).toBe(1)
          expect((yield* a.claim("worker-a", 1, 60_000)).rows.length).toBe(1)
          expect(yield* markHolders("worker-a")).toEqual([pidA])
        })),
    60_000
  )

  it.scopedLive(
    "with a pool of one connection the mark is held by that connection, and released when the store closes",
    () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const store = Context.get(yield* Layer.buildWithScope(deliveryStoreSql, scope), DeliveryStore)
        yield* store.claim("worker-one", 1, 60_000)
        expect((yield* markHolders("worker-one")).length).toBe(1)
        expect((yield* store.reclaimAbandoned("worker-one")).held).toBe(true)
        yield* Scope.close(scope, Exit.void)
        // released in the mode it was taken in (the pool's connection lives on)
        expect(yield* markHolders("worker-one")).toEqual([])
      }).pipe(Effect.provide(Db.layer({ maxConnections: 1 }))),
    60_000
  )
})
