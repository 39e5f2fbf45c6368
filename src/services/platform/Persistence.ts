/**
 * What every store shares: a transaction boundary and one error type.
 *
 * Services never touch SQL: they depend on store Tags (PostgreSQL and in-memory implementations)
 * and on `Tx` for atomicity. The PostgreSQL `Tx` is `SqlClient.withTransaction`; every store call
 * made inside it joins the transaction. The in-memory `Tx` only serializes (tests and embedding).
 */
import { SqlClient } from "@effect/sql"
import { Context, Data, type Duration, Effect, Layer } from "effect"
import * as ErrorCode from "./ErrorCode.js"

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

/** Bound on one transaction of the PostgreSQL `Tx`, from BEGIN to COMMIT. */
export const TX_TIMEOUT: Duration.DurationInput = "2 minutes"

export interface TxShape {
  readonly withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) => Effect.Effect<A, E | StoreError, R>
}

export class Tx extends Context.Tag("firehook/Tx")<Tx, TxShape>() {
  static readonly layerSql = Layer.effect(
    Tx,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      return {
        withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) =>
          sql.withTransaction(eff).pipe(
            // its statements are bounded one by one; this also bounds BEGIN/COMMIT (SPEC §7)
            Effect.timeoutFail({
              duration: TX_TIMEOUT,
              onTimeout: () => new StoreError({ op: "transaction", code: "timeout" })
            }),
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
