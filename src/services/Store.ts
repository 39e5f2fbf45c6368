/**
 * What every store shares: a transaction boundary and one error type.
 *
 * Services never touch SQL: they depend on store Tags (PostgreSQL and in-memory implementations)
 * and on `Tx` for atomicity. The PostgreSQL `Tx` is `SqlClient.withTransaction`; every store call
 * made inside it joins the transaction. The in-memory `Tx` only serializes (tests and embedding).
 */
import { SqlClient } from "@effect/sql"
import { Context, Data, type Duration, Effect, Layer } from "effect"

/** A persistence failure. `code` is a SQLSTATE/errno-like code; never SQL text or values. */
export class StoreError extends Data.TaggedError("StoreError")<{ readonly op: string; readonly code: string }> {
  override get message(): string {
    return `store ${this.op} failed (${this.code})`
  }
}

export const codeOf = (e: unknown): string => {
  const cause = typeof e === "object" && e !== null && "cause" in e ? e.cause : e
  if (typeof cause === "object" && cause !== null && "code" in cause && typeof cause.code === "string") return cause.code
  return "unknown"
}

/** Map any SQL failure of `op` to a `StoreError`. */
export const storeOp =
  (op: string) =>
  <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, StoreError, R> =>
    Effect.mapError(eff, (e) => new StoreError({ op, code: codeOf(e) }))

/**
 * `storeOp` with a deadline (SPEC §7: every network call has a timeout): past `within` the call is
 * interrupted (the driver cancels the query) and fails as `StoreError` with code `timeout`.
 */
export const storeOpWithin =
  (op: string, within: Duration.DurationInput) =>
  <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, StoreError, R> =>
    storeOp(op)(eff).pipe(
      Effect.timeoutFail({ duration: within, onTimeout: () => new StoreError({ op, code: "timeout" }) })
    )

export interface TxShape {
  readonly withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) => Effect.Effect<A, E | StoreError, R>
}

export class Tx extends Context.Tag("firehook/Tx")<Tx, TxShape>() {
  static readonly layerSql = Layer.effect(
    Tx,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      return {
        withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) =>
          sql.withTransaction(eff).pipe(
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
    Effect.gen(function* () {
      const lock = yield* Effect.makeSemaphore(1)
      return { withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) => lock.withPermits(1)(eff) }
    })
  )
}
