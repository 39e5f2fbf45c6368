/**
 * The claim connection of the delivery store's SQL driver. Plan guard: right after a burst (an
 * event fan-out, a replay of dead letters) the planner's statistics still describe a small outbox,
 * and it picks a bitmap scan of EVERY due row plus a sort over the ordered `outbox_due` index scan
 * that the LIMIT needs (far slower per claim, growing with the backlog; figures in
 * docs/benchmarks.md).
 * Claims therefore run on one connection reserved from the pool with `enable_bitmapscan = off`
 * for its session (one round trip per claim; a transaction with `SET LOCAL` costs three more).
 * Claims of this store take turns on it. After a failed claim the connection is given back
 * (setting reset first) and the next claim reserves a fresh one; the layer's scope gives it back
 * at shutdown.
 *
 * Part of the SQL driver of the `DeliveryStore` port (DeliveryStoreSql.ts).
 */
import { SqlClient } from "@effect/sql"
import type { PgClient } from "@effect/sql-pg"
import type { Connection } from "@effect/sql/SqlConnection"
import type { SqlError } from "@effect/sql/SqlError"
import { Duration, Effect, Exit, Scope } from "effect"

/** Runs a claim statement on the claim connection (or, with a pool of one, in a transaction). */
export type OnClaimConnection = <A>(statement: Effect.Effect<A, SqlError, never>) => Effect.Effect<A, SqlError, never>

/** The claim connection of one store; given back when the store's scope closes. */
export const makeClaimConnection = (
  sql: SqlClient.SqlClient,
  pg: PgClient.PgClient
): Effect.Effect<OnClaimConnection, never, Scope.Scope> =>
  Effect.gen(function*() {
    const claimLock = yield* Effect.makeSemaphore(1)
    let claimConn: { readonly conn: Connection; readonly scope: Scope.CloseableScope } | undefined
    const releaseClaimConn = Effect.suspend(() => {
      const held = claimConn
      claimConn = undefined
      return held === undefined ? Effect.void : Scope.close(held.scope, Exit.void)
    })
    yield* Effect.addFinalizer(() => releaseClaimConn)
    const claimConnection = Effect.suspend(() => {
      const held = claimConn
      if (held !== undefined) return Effect.succeed(held.conn)
      return Effect.flatMap(Scope.make(), (scope) =>
        Scope.extend(sql.reserve, scope).pipe(
          Effect.tap((conn) =>
            Effect.zipRight(
              conn.executeUnprepared("SET enable_bitmapscan = off", [], undefined),
              // runs before the pool release added by `reserve` (finalizers run in reverse order)
              Scope.addFinalizer(
                scope,
                conn.executeUnprepared("RESET enable_bitmapscan", [], undefined).pipe(
                  Effect.timeout(Duration.seconds(2)),
                  Effect.ignore
                )
              )
            )
          ),
          Effect.tap((conn) => Effect.sync(() => (claimConn = { conn, scope }))),
          Effect.onError((cause) => Scope.close(scope, Exit.failCause(cause)))
        ))
    })
    // A pool of one connection cannot give one away for good: there the claim runs in a transaction
    // of its own with `SET LOCAL` (three more round trips per claim, as before the reserved connection).
    const reserveForClaims = (pg.config.maxConnections ?? 10) >= 2
    const onClaimConnection: OnClaimConnection = <A>(statement: Effect.Effect<A, SqlError, never>) =>
      !reserveForClaims
        ? sql.withTransaction(Effect.zipRight(sql`SET LOCAL enable_bitmapscan = off`, statement))
        : claimLock.withPermits(1)(
          Effect.flatMap(
            claimConnection,
            (conn) => Effect.provideService(statement, SqlClient.TransactionConnection, [conn, 0] as const)
          ).pipe(Effect.onError(() => releaseClaimConn))
        )
    return onClaimConnection
  })
