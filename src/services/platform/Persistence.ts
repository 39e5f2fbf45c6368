/**
 * What every store shares: a transaction boundary and one error type.
 *
 * Services never touch SQL: they depend on store Tags (PostgreSQL and in-memory implementations)
 * and on `Tx` for atomicity. The PostgreSQL `Tx` is `SqlClient.withTransaction`; every store call
 * made inside it joins the transaction. The in-memory `Tx` only serializes (tests and embedding).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import { Clock, Context, Data, Duration, Effect, Exit, Layer, Option, Scope } from "effect"
import * as ErrorCode from "./ErrorCode.js"
import { endClient } from "./PooledConnection.js"

/** A persistence failure. `code` is a SQLSTATE/errno-like code; never SQL text or values. */
export class StoreError extends Data.TaggedError("StoreError")<{ readonly op: string; readonly code: string }> {
  override get message(): string {
    return `store ${this.op} failed (${this.code})`
  }
}

/** The driver's code behind a failure, or `unknown` (see `ErrorCode.driverCode`). */
export const codeOf = (e: unknown): string => ErrorCode.codeOr(e)

/**
 * Every store call is bounded (SPEC §7: every network call has a timeout). The default suits one
 * statement or a short transaction; calls that legitimately take long (loading the registry at
 * startup) use `storeOpWithin` with their own bound.
 */
export const STORE_TIMEOUT: Duration.DurationInput = "60 seconds"

/**
 * Map any SQL failure of `op` to a `StoreError`, and bound the call by {@link STORE_TIMEOUT}: past
 * it the call is interrupted (the driver cancels the query) and fails with code `timeout`.
 */
export const storeOp = (op: string) => <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, StoreError, R> =>
  storeOpWithin(op, STORE_TIMEOUT)(eff)

/**
 * `storeOp` with a deadline (SPEC §7: every network call has a timeout): past `within` the call is
 * interrupted (the driver cancels the query) and fails as `StoreError` with code `timeout`.
 */
export const storeOpWithin =
  (op: string, within: Duration.DurationInput) =>
  <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, StoreError, R> =>
    Effect.mapError(eff, (e) => new StoreError({ op, code: codeOf(e) })).pipe(
      Effect.timeoutFail({ duration: within, onTimeout: () => new StoreError({ op, code: "timeout" }) })
    )

/**
 * Bound on one transaction of the PostgreSQL `Tx`, from taking its connection to the answer to its
 * COMMIT/ROLLBACK. At the bound the caller fails with `StoreError(transaction, timeout)` and the
 * transaction's connection is ended (never handed out again), so that a server that stopped
 * answering mid-transaction cannot hold the caller for as long as the socket lives.
 */
export const TX_TIMEOUT: Duration.DurationInput = "2 minutes"

const txTimeout = () => new StoreError({ op: "transaction", code: "timeout" })

export interface TxShape {
  readonly withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) => Effect.Effect<A, E | StoreError, R>
}

/**
 * A top-level transaction on a connection it reserves itself, watched: `@effect/sql` runs BEGIN,
 * COMMIT and ROLLBACK uninterruptibly, so interrupting a transaction whose server stopped answering
 * waits for an answer that may never come. A watchdog fiber, owned by the transaction's scope (it
 * is interrupted before the connection goes back to the pool), ends the connection's client when
 * TX_TIMEOUT has passed since the call began: the pending statement, BEGIN, COMMIT or ROLLBACK then
 * fails at once, and pg-pool drops the ended client on release. The connection is given to
 * `sql.withTransaction` as an enclosing `TransactionConnection` of depth -1, which it takes as a
 * top-level transaction (depth 0: BEGIN/COMMIT/ROLLBACK, no SAVEPOINT) on that connection. Cost
 * per transaction: two clock reads, one fiber fork and its interruption; nothing per statement.
 */
const watchedTransaction =
  (sql: SqlClient.SqlClient) =>
  <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError | StoreError, R> =>
    Effect.scoped(Effect.gen(function*() {
      const start = yield* Clock.currentTimeMillis
      const scope = yield* Effect.scope
      // uninterruptible as in `sql.withTransaction`: a connection handed over after an interruption
      // would never be released (the pool's wait is bounded by its connectionTimeoutMillis)
      const conn = yield* Effect.uninterruptible(Scope.extend(sql.reserve, scope))
      const left = Duration.toMillis(TX_TIMEOUT) - ((yield* Clock.currentTimeMillis) - start)
      let ended = false
      yield* Effect.forkIn(
        Effect.zipRight(
          Effect.sleep(Duration.millis(Math.max(0, left))),
          Effect.suspend(() => {
            ended = true
            return endClient(conn)
          })
        ),
        scope
      )
      const exit = yield* Effect.exit(
        Effect.provideService(sql.withTransaction(eff), SqlClient.TransactionConnection, [conn, -1] as const)
      )
      // ended by the watchdog: whatever failed (the statement, or the COMMIT/ROLLBACK as a defect)
      // failed because the bound passed; a transaction that committed before that stays committed
      return yield* Exit.isFailure(exit) && ended ? Effect.fail(txTimeout()) : exit
    }))

/**
 * A transaction on `sql`: {@link watchedTransaction} at the top level (a server that stops answering
 * cannot hold its uninterruptible ROLLBACK past {@link TX_TIMEOUT}); a nested call joins the
 * enclosing transaction (a SAVEPOINT), which its own bound covers.
 */
export const boundedTransaction = (sql: SqlClient.SqlClient) => {
  const watched = watchedTransaction(sql)
  return <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, E | SqlError | StoreError, R> =>
    Effect.flatMap(
      Effect.serviceOption(SqlClient.TransactionConnection),
      (outer) => (Option.isSome(outer) ? sql.withTransaction(eff) : watched(eff))
    )
}

export class Tx extends Context.Tag("firehook/Tx")<Tx, TxShape>() {
  static readonly layerSql = Layer.effect(
    Tx,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const bounded = boundedTransaction(sql)
      return {
        withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) =>
          bounded(eff).pipe(
            // its statements are bounded one by one; this bounds the whole, BEGIN/COMMIT included
            // (SPEC §7): the watchdog above ends a connection that stopped answering, so the
            // uninterruptible BEGIN/COMMIT/ROLLBACK this waits for returns
            Effect.timeoutFail({ duration: TX_TIMEOUT, onTimeout: txTimeout }),
            Effect.catchIf(
              (e): e is Extract<typeof e, { readonly _tag: "SqlError" }> =>
                typeof e === "object" && e !== null && "_tag" in e && e._tag === "SqlError",
              (e) => Effect.fail(new StoreError({ op: "transaction", code: codeOf(e) }))
            )
          ) as Effect.Effect<A, E | StoreError, R>
      }
    })
  )

  static readonly layerMemory = Layer.effect(
    Tx,
    Effect.gen(function*() {
      const lock = yield* Effect.makeSemaphore(1)
      return { withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) => lock.withPermits(1)(eff) }
    })
  )
}

/** {@link Tx.layerSql} at module level. */
export const layerSql = Tx.layerSql
/** {@link Tx.layerMemory} at module level. */
export const layerMemory = Tx.layerMemory
