/**
 * Shared pieces of the owners' API client tests (owner-api-client.*.test.ts): the owner's DID, a
 * time, and an Effect run to its Either.
 */
import { Effect, Either } from "effect"

export const OWNER = "did:plc:abcdefghijklmnopqrstuvwx"
export const T0 = "2026-11-20T10:00:00.000Z"

export const run = <A, E>(eff: Effect.Effect<A, E>) => Effect.runPromise(Effect.either(eff))

export const left = <A, E>(r: Either.Either<A, E>): E => {
  if (Either.isRight(r)) throw new Error("expected a failure")
  return r.left
}
