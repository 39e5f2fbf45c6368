/**
 * Leadership on real PostgreSQL (SPEC §6.4): a leader whose ping and then unlock both time out
 * must not give its connection back to the pool still holding the advisory lock (no replica could
 * lead again); it discards the connection, so the lock dies with it and another replica takes it.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Duration, Effect, Fiber, Logger, Redacted, Ref } from "effect"
import pg from "pg"
import * as Database from "../../src/services/platform/Database.js"
import { leaderErrorCode, type Role, runAsLeader } from "../../src/services/platform/Leader.js"
import * as Db from "../support/db.js"

const KEY = 7_239_901

/** The real client, except that `executeValues` hangs on every connection it reserved once `hang` is set. */
const hangingClient = (real: SqlClient.SqlClient, hang: Ref.Ref<boolean>): SqlClient.SqlClient => {
  const wrap = (conn: Connection): Connection =>
    new Proxy(conn, {
      get: (target, p) =>
        p === "executeValues"
          ? (sql: string, params: ReadonlyArray<unknown>) =>
            Effect.flatMap(Ref.get(hang), (h) => (h ? Effect.never : target.executeValues(sql, params)))
          : Reflect.get(target, p)
    })
  const reserve = Effect.map(real.reserve, wrap)
  return new Proxy(real, { get: (target, p) => (p === "reserve" ? reserve : Reflect.get(target, p)) })
}

/** Whether a session of its own (another "replica") can take the lock right now (and gives it back). */
const otherReplicaTakes = (url: string) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 })
    await client.connect()
    try {
      const r = await client.query<{ ok: boolean }>("SELECT pg_try_advisory_lock($1) AS ok", [KEY])
      return r.rows[0]?.ok === true
    } finally {
      await client.end()
    }
  })

describe("leader on PostgreSQL", () => {
  it.scopedLive(
    "a leader whose ping and unlock time out discards its connection: another replica can lead",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const real = yield* SqlClient.SqlClient
          const hang = yield* Ref.make(false)
          const role = yield* Ref.make<Role>("standby")
          const acquired = yield* Deferred.make<void>()
          const ended = yield* Deferred.make<void>()
          const leader = yield* runAsLeader(
            {
              key: KEY,
              name: "test",
              pingInterval: Duration.millis(100),
              pingTimeout: Duration.millis(200),
              retryInterval: Duration.seconds(60),
              events: {
                acquired: Deferred.succeed(acquired, undefined).pipe(Effect.asVoid),
                ended: Deferred.succeed(ended, undefined).pipe(Effect.asVoid)
              }
            },
            role,
            Effect.never
          ).pipe(Effect.provideService(SqlClient.SqlClient, hangingClient(real, hang)), Effect.forkScoped)
          yield* Deferred.await(acquired)
          expect(yield* otherReplicaTakes(Redacted.value(url))).toBe(false)
          // the lock's connection stops answering: the ping times out, then the unlock does
          yield* Ref.set(hang, true)
          yield* Deferred.await(ended)
          expect(yield* Ref.get(role)).toBe("standby")
          // this replica is a standby now (its retry is a minute away); another replica can lead
          const deadline = (yield* Clock.currentTimeMillis) + 5_000
          let taken = false
          while (!taken && (yield* Clock.currentTimeMillis) < deadline) {
            taken = yield* otherReplicaTakes(Redacted.value(url))
            if (!taken) yield* Effect.sleep(Duration.millis(50))
          }
          expect(taken).toBe(true)
          yield* Fiber.interrupt(leader)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  it.scopedLive(
    "the lock's server session gets TCP keepalives, so a dead or cut-off leader's lock is released within seconds",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const real = yield* SqlClient.SqlClient
          const reserved: Array<Connection> = []
          const recording = new Proxy(real, {
            get: (target, p) =>
              p === "reserve"
                ? Effect.tap(real.reserve, (conn) => Effect.sync(() => reserved.push(conn)))
                : Reflect.get(target, p)
          })
          const role = yield* Ref.make<Role>("standby")
          const acquired = yield* Deferred.make<void>()
          const leader = yield* runAsLeader(
            { key: KEY, name: "test", events: { acquired: Deferred.succeed(acquired, undefined).pipe(Effect.asVoid) } },
            role,
            Effect.never
          ).pipe(Effect.provideService(SqlClient.SqlClient, recording), Effect.forkScoped)
          yield* Deferred.await(acquired)
          const conn = reserved[0]
          if (conn === undefined) return expect.unreachable()
          const show = (name: string) =>
            Effect.map(conn.executeValues(`SELECT current_setting('${name}')`, []), (rows) => String(rows[0]?.[0]))
          const viaTcp = yield* Effect.map(
            conn.executeValues("SELECT inet_server_addr() IS NOT NULL", []),
            (rows) => rows[0]?.[0] === true
          )
          if (viaTcp) {
            expect([
              yield* show("tcp_keepalives_idle"),
              yield* show("tcp_keepalives_interval"),
              yield* show("tcp_keepalives_count"),
              yield* show("tcp_user_timeout")
            ]).toEqual(["10", "5", "3", "20000"])
          }
          expect(yield* Ref.get(role)).toBe("leader")
          yield* Fiber.interrupt(leader)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  it.scopedLive(
    "a leader whose lock session the server ends (pg_terminate_backend, a restart) gives the role up at once, not at its next ping",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const role = yield* Ref.make<Role>("standby")
          const terms: Array<string> = []
          const leader = yield* runAsLeader(
            {
              key: KEY,
              name: "test",
              // the ping alone would notice after a minute
              pingInterval: Duration.minutes(1),
              retryInterval: Duration.minutes(1),
              events: {
                acquired: Effect.sync(() => void terms.push("acquired")),
                lost: (reason, error) =>
                  Effect.sync(() => void terms.push(`lost: ${reason} ${leaderErrorCode(error)}`)),
                ended: Effect.flatMap(Ref.get(role), (r) => Effect.sync(() => void terms.push(`ended: ${r}`)))
              }
            },
            role,
            Effect.never
          ).pipe(Effect.forkScoped)
          yield* waitFor(() => terms.length > 0)
          expect(yield* Ref.get(role)).toBe("leader")
          const ended = yield* Effect.promise(async () => {
            const client = new pg.Client({ connectionString: Redacted.value(url), connectionTimeoutMillis: 10_000 })
            await client.connect()
            try {
              const r = await client.query<{ n: number }>(
                `SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_locks
                 WHERE locktype = 'advisory' AND granted AND objsubid = 1 AND objid = $1::oid`,
                [KEY]
              )
              return r.rows[0]?.n
            } finally {
              await client.end()
            }
          })
          expect(ended).toBe(1)
          // given up at once (a standby), then this replica competes again at once and leads again
          yield* waitFor(() => terms.length >= 4)
          expect(terms).toEqual(["acquired", "lost: connection 57P01", "ended: standby", "acquired"])
          yield* Fiber.interrupt(leader)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  it.scopedLive(
    "each election's outcome is reported: leader, standby (another replica holds the lock), failed (no connection)",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const real = yield* SqlClient.SqlClient
          const down = yield* Ref.make(false)
          const flaky = new Proxy(real, {
            get: (target, p) =>
              p === "reserve"
                ? Effect.flatMap(Ref.get(down), (d) => (d ? Effect.fail(new Error("ECONNREFUSED")) : real.reserve))
                : Reflect.get(target, p)
          })
          const run = (outcomes: Array<string>, client: SqlClient.SqlClient) =>
            runAsLeader(
              {
                key: KEY,
                name: "test",
                retryInterval: Duration.millis(20),
                onElection: (o) => Effect.sync(() => void outcomes.push(o))
              },
              Ref.unsafeMake<Role>("standby"),
              Effect.never
            ).pipe(Effect.provideService(SqlClient.SqlClient, client), Effect.forkScoped)
          const first: Array<string> = []
          const leader = yield* run(first, real)
          yield* waitFor(() => first.includes("leader"))
          const second: Array<string> = []
          const standby = yield* run(second, flaky)
          yield* waitFor(() => second.filter((o) => o === "standby").length >= 2)
          yield* Ref.set(down, true)
          yield* waitFor(() => second.slice(-3).every((o) => o === "failed") && second.length >= 5)
          expect(first).toEqual(["leader"])
          expect(second.slice(0, 2)).toEqual(["standby", "standby"])
          yield* Fiber.interrupt(standby)
          yield* Fiber.interrupt(leader)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  // SPEC §6.4: standbys retry and take over within seconds when the leader dies; with the
  // default intervals (no options), not only with the short ones the tests above pass
  it.scopedLive(
    "with the default retry, a standby takes the role within seconds once the leader's lock is gone",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          // another replica leads: it holds the lock on a session of its own
          const other = new pg.Client({ connectionString: Redacted.value(url), connectionTimeoutMillis: 10_000 })
          yield* Effect.acquireRelease(Effect.promise(() => other.connect()), () => Effect.promise(() => other.end()))
          yield* Effect.promise(() => other.query("SELECT pg_advisory_lock($1)", [KEY]))
          const outcomes: Array<string> = []
          const standby = yield* runAsLeader(
            { key: KEY, name: "test", onElection: (o) => Effect.sync(() => void outcomes.push(o)) },
            Ref.unsafeMake<Role>("standby"),
            Effect.never
          ).pipe(Effect.forkScoped)
          yield* waitFor(() => outcomes.includes("standby"))
          // the leader goes away (its lock with it): the standby's next election, seconds later, leads
          yield* Effect.promise(() => other.query("SELECT pg_advisory_unlock($1)", [KEY]))
          yield* waitFor(() => outcomes.includes("leader"))
          expect(outcomes.filter((o) => o !== "standby")).toEqual(["leader"])
          yield* Fiber.interrupt(standby)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  it.scopedLive(
    "with the default ping, a leader whose lock connection stops answering gives the role up within seconds and is a standby",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const real = yield* SqlClient.SqlClient
          const hang = yield* Ref.make(false)
          const role = yield* Ref.make<Role>("standby")
          const terms: Array<string> = []
          const leader = yield* runAsLeader(
            {
              key: KEY,
              name: "test",
              retryInterval: Duration.minutes(1),
              events: {
                acquired: Effect.sync(() => void terms.push("acquired")),
                lost: (reason) => Effect.sync(() => void terms.push(`lost: ${reason}`))
              }
            },
            role,
            Effect.never
          ).pipe(Effect.provideService(SqlClient.SqlClient, hangingClient(real, hang)), Effect.forkScoped)
          yield* waitFor(() => terms.includes("acquired"))
          yield* Ref.set(hang, true)
          yield* waitFor(() => terms.includes("lost: connection"))
          expect(terms).toEqual(["acquired", "lost: connection"])
          // Health shows the role: a replica that gave it up is a standby again (without an `ended` hook too)
          yield* waitFor(() => Effect.runSync(Ref.get(role)) === "standby")
          expect(yield* Ref.get(role)).toBe("standby")
          yield* Fiber.interrupt(leader)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  it.scopedLive(
    "a database that refuses every election is logged once a minute, not at every retry",
    () =>
      Effect.gen(function*() {
        const refusing = new Proxy({} as SqlClient.SqlClient, {
          get: (_target, p) => (p === "reserve" ? Effect.fail(new Error("ECONNREFUSED")) : undefined)
        })
        const outcomes: Array<string> = []
        const logged: Array<string> = []
        const logger = Logger.make(({ message }) => {
          const text = Array.isArray(message) ? message.join(" ") : String(message)
          if (text.includes("role election failed")) logged.push(text)
        })
        const standby = yield* runAsLeader(
          {
            key: KEY,
            name: "test",
            retryInterval: Duration.millis(5),
            onElection: (o) => Effect.sync(() => void outcomes.push(o))
          },
          Ref.unsafeMake<Role>("standby"),
          Effect.never
        ).pipe(
          Effect.provideService(SqlClient.SqlClient, refusing),
          Effect.provide(Logger.replace(Logger.defaultLogger, logger)),
          Effect.forkScoped
        )
        yield* waitFor(() => outcomes.length >= 10)
        yield* Fiber.interrupt(standby)
        expect(outcomes.every((o) => o === "failed")).toBe(true)
        expect(logged).toHaveLength(1)
      }),
    30_000
  )
})

/** Poll a condition on the live clock (bounded: 10 s); asserts nothing about time. */
const waitFor = (cond: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 500; i++) {
      if (cond()) return
      yield* Effect.sleep("20 millis")
    }
    return yield* Effect.dieMessage("condition not reached")
  })
