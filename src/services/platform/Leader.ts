/**
 * Singleton roles across replicas (SPEC §6.4): a role is held by the replica that holds a
 * PostgreSQL session advisory lock on a dedicated (reserved) connection. Standbys retry every few
 * seconds; the leader pings its connection and gives the role up when the connection fails (its
 * lock is gone with it), so a standby takes over within seconds of the leader's death.
 */
import { SqlClient } from "@effect/sql"
import { Duration, Effect, Exit, Fiber, Ref, Schedule, Scope } from "effect"
import { codeOf } from "./Persistence.js"

export type Role = "leader" | "standby"

/** How long one election may wait for a connection and for its lock query. */
const ELECTION_TIMEOUT = Duration.seconds(10)
/** Logged as `code: timeout` by the election's error handler (`codeOf`). */
const electionTimeout = () => ({ code: "timeout" }) as const

export interface LeaderOptions {
  readonly key: number
  readonly name: string
  /** how often a standby retries (default 2 s) */
  readonly retryInterval?: Duration.DurationInput
  /** how often the leader pings its lock connection (default 2 s) */
  readonly pingInterval?: Duration.DurationInput
}

/**
 * Run `work` whenever this replica holds the lock `key`; forever (until interrupted). `work` is
 * interrupted when leadership is lost, and started again when it is regained. `role` is updated.
 */
export const runAsLeader = <E, R>(
  options: LeaderOptions,
  role: Ref.Ref<Role>,
  work: Effect.Effect<void, E, R>
): Effect.Effect<never, never, R | SqlClient.SqlClient> =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const retry = Duration.decode(options.retryInterval ?? "2 seconds")
    const ping = Duration.decode(options.pingInterval ?? "2 seconds")
    const term = Effect.gen(function* () {
      const scope = yield* Scope.make()
      const acquired = yield* Effect.gen(function* () {
        // bounded (SPEC §7): a connection that cannot be had, or a lock query that hangs, is a
        // failed election, retried after `retry`, never a standby stuck for good
        const conn = yield* sql.reserve.pipe(Scope.extend(scope), Effect.timeoutFail({ duration: ELECTION_TIMEOUT, onTimeout: electionTimeout }))
        const rows = yield* conn
          .executeValues("SELECT pg_try_advisory_lock($1)", [options.key])
          .pipe(
            Effect.timeoutFail({ duration: ELECTION_TIMEOUT, onTimeout: electionTimeout }),
            // the lock may have been taken on the server after we stopped waiting: release it on
            // this connection (queued behind the lock query) before the connection goes back to
            // the pool, or it would hold the role for nobody
            Effect.tapError(() =>
              conn.executeValues("SELECT pg_advisory_unlock($1)", [options.key]).pipe(
                Effect.timeoutOption("2 seconds"),
                Effect.ignore
              )
            )
          )
        const ok = rows[0]?.[0] === true
        if (!ok) return false
        yield* Scope.addFinalizer(
          scope,
          conn.executeValues("SELECT pg_advisory_unlock($1)", [options.key]).pipe(
            Effect.timeoutOption("2 seconds"),
            Effect.ignore
          )
        )
        yield* Ref.set(role, "leader")
        yield* Effect.logInfo("role acquired").pipe(Effect.annotateLogs({ role: options.name }))
        const worker = yield* Effect.forkIn(work, scope)
        // the watchdog: a failed ping means the lock's connection is gone
        const lost = yield* conn
          .executeValues("SELECT 1", [])
          .pipe(
            Effect.timeoutFail({ duration: ping, onTimeout: () => "timeout" as const }),
            Effect.repeat(Schedule.spaced(ping)),
            Effect.raceFirst(Fiber.await(worker).pipe(Effect.map(() => "worker-ended" as const))),
            Effect.either
          )
        yield* Effect.logWarning("role lost").pipe(
          Effect.annotateLogs({ role: options.name, reason: lost._tag === "Left" ? "connection" : "worker-ended" })
        )
        return true
      }).pipe(
        Effect.catchAll((e) =>
          Effect.logWarning("role election failed").pipe(
            Effect.annotateLogs({ role: options.name, code: codeOf(e) }),
            Effect.as(false)
          )
        ),
        Effect.ensuring(Ref.set(role, "standby")),
        Effect.onExit(() => Scope.close(scope, Exit.void))
      )
      if (!acquired) yield* Effect.sleep(retry)
    })
    return yield* Effect.forever(term)
  })
