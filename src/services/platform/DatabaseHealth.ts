/**
 * The `database` section of `/health`, in every process whatever its roles: whether the process's
 * database answered a `SELECT 1` lately. It gates readiness, so that `/health` says 503 a few
 * seconds into an outage in a delivery-only or api-only process too (their other sections do not
 * depend on the database: an api replica behind a load balancer stayed ready while every call
 * answered 503 `ServiceUnavailable`), and when the database is frozen rather than stopped (a
 * stopped server refuses at once, and intake's own section says so within seconds; a frozen one
 * left intake's leader waiting on its election timeouts for about a minute). The audit of
 * 6 December 2026.
 *
 * One ping at a time, from the process's pool, every {@link PING_INTERVAL}, each bounded by
 * {@link PING_TIMEOUT} (its query is cancelled by the driver when the bound passes). The section is
 * ready while a ping answered within the last {@link UNREACHABLE_AFTER}; the body is
 * `{reachable}`. A pool whose every connection is held (a table locked for long) delays the ping
 * like any other statement, so such a process turns not ready too.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Duration, Effect, Ref, Schedule } from "effect"
import type { Scope } from "effect"
import { Health } from "./Health.js"

export const PING_INTERVAL = Duration.seconds(2)
export const PING_TIMEOUT = Duration.seconds(2)
export const UNREACHABLE_AFTER = Duration.seconds(6)

/**
 * Ping with `ping` for as long as the calling scope is open and register the `database` section.
 * The first ping's wait counts from the registration (a process starts reachable: it has just
 * connected and migrated).
 */
export const registerWith = <E>(ping: Effect.Effect<unknown, E>): Effect.Effect<void, never, Health | Scope.Scope> =>
  Effect.gen(function*() {
    const health = yield* Health
    const lastAnswer = yield* Ref.make(yield* Clock.currentTimeMillis)
    const once = ping.pipe(
      Effect.timeoutFail({ duration: PING_TIMEOUT, onTimeout: () => "timeout" as const }),
      Effect.zipRight(Effect.flatMap(Clock.currentTimeMillis, (now) => Ref.set(lastAnswer, now))),
      Effect.ignore
    )
    yield* Effect.forkScoped(once.pipe(Effect.repeat(Schedule.spaced(PING_INTERVAL))))
    yield* health.register(
      "database",
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const reachable = now - (yield* Ref.get(lastAnswer)) <= Duration.toMillis(UNREACHABLE_AFTER)
        return { ready: reachable, body: { reachable } }
      })
    )
  })

/** {@link registerWith} the process's own database client. */
export const register: Effect.Effect<void, never, Health | SqlClient.SqlClient | Scope.Scope> = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => registerWith(sql`SELECT 1`)
)
