/**
 * A frozen leader (SIGSTOP, a paused VM) on real PostgreSQL (SPEC §6.4: standbys take over within
 * seconds when the leader dies). Its kernel still answers the server's TCP keepalives, so its lock
 * session lives for as long as the freeze lasts; it only stops pinging. A standby ends the session
 * of a holder idle for longer than `staleAfter`, and leads at its next election; a holder that
 * pings is left alone. The frozen holder here is a plain session that took the lock and went quiet.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Redacted, Ref } from "effect"
import pg from "pg"
import * as Database from "../../src/services/platform/Database.js"
import { type Role, runAsLeader } from "../../src/services/platform/Leader.js"
import * as Db from "../support/db.js"

const KEY = 7_239_917

/** A session of its own (another "replica") that takes the lock and then does nothing. */
const quietHolder = (url: string) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 })
      const ended = { error: false }
      client.on("error", () => void (ended.error = true))
      await client.connect()
      const r = await client.query<{ ok: boolean; pid: number }>(
        "SELECT pg_try_advisory_lock($1) AS ok, pg_backend_pid() AS pid",
        [KEY]
      )
      return { client, ended, took: r.rows[0]?.ok === true, pid: Number(r.rows[0]?.pid) }
    }),
    ({ client }) => Effect.promise(() => client.end().catch(() => undefined))
  )

/** Whether the session `pid` is alive and holds the lock. */
const holds = (url: string, pid: number) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 })
    await client.connect()
    try {
      const r = await client.query<{ n: number }>(
        `SELECT count(*)::int AS n FROM pg_locks
         WHERE locktype = 'advisory' AND granted AND pid = $1 AND objid = ($2::bigint & 4294967295)::oid`,
        [pid, KEY]
      )
      return (r.rows[0]?.n ?? 0) > 0
    } finally {
      await client.end()
    }
  })

describe("a frozen leader (its lock session idle: no ping)", () => {
  it.scopedLive(
    "a standby ends the session of a holder idle past staleAfter, and leads",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const holder = yield* quietHolder(Redacted.value(url))
          expect(holder.took).toBe(true)
          const role = yield* Ref.make<Role>("standby")
          const acquired = yield* Deferred.make<void>()
          const standby = yield* runAsLeader(
            {
              key: KEY,
              name: "test",
              retryInterval: Duration.millis(200),
              staleAfter: Duration.millis(1_000),
              events: { acquired: Deferred.succeed(acquired, undefined).pipe(Effect.asVoid) }
            },
            role,
            Effect.never
          ).pipe(Effect.forkScoped)
          yield* Deferred.await(acquired).pipe(
            Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "not led" })
          )
          expect(yield* Ref.get(role)).toBe("leader")
          // the quiet holder's session was ended: it holds nothing, and its client saw the end
          expect(yield* holds(Redacted.value(url), holder.pid)).toBe(false)
          yield* Fiber.interrupt(standby)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )

  it.scopedLive(
    "a holder idle for less than staleAfter keeps the lock: the standby stays a standby",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.gen(function*() {
          const holder = yield* quietHolder(Redacted.value(url))
          expect(holder.took).toBe(true)
          const role = yield* Ref.make<Role>("standby")
          const elected = yield* Deferred.make<"leader" | "standby" | "failed">()
          const standby = yield* runAsLeader(
            {
              key: KEY,
              name: "test",
              retryInterval: Duration.minutes(10),
              staleAfter: Duration.hours(1),
              onElection: (outcome) => Deferred.succeed(elected, outcome).pipe(Effect.asVoid)
            },
            role,
            Effect.never
          ).pipe(Effect.forkScoped)
          // one election, then its retry is minutes away
          expect(yield* Deferred.await(elected)).toBe("standby")
          expect(yield* holds(Redacted.value(url), holder.pid)).toBe(true)
          expect(holder.ended.error).toBe(false)
          expect(yield* Ref.get(role)).toBe("standby")
          yield* Fiber.interrupt(standby)
        }).pipe(Effect.provide(Database.layerUrl(url, { maxConnections: 4 })))),
    30_000
  )
})
