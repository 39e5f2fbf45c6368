/**
 * Shared by the tests of the identity-lookup budget of unverified tokens (ServiceAuth): the method
 * they call, forged tokens (random signature bytes: the lookup comes before any signature check),
 * and the verdicts they count.
 */
import { Effect, Either } from "effect"
import { randomBytes } from "node:crypto"
import type * as ServiceAuth from "../../src/services/api/ServiceAuth.js"

export const LIST = "place.wisp.v2.secret.list"
export const HEADER = { alg: "ES256K", typ: "JWT" }

const nowS = () => Math.floor(Date.now() / 1000)
const b64 = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8").toString("base64url")

/** A token naming `iss`, addressed to `aud`, whose signature is random bytes. */
export const forgedToken = (iss: string, aud: string) =>
  `${b64(HEADER)}.${
    b64({ iss, aud, lxm: LIST, iat: nowS(), exp: nowS() + 60, jti: randomBytes(12).toString("hex") })
  }.${randomBytes(64).toString("base64url")}`

/**
 * `ok`, `401:<error>`, or `503:<reason>` for an `AuthUnavailable` (with `:wait` or `:-` after it
 * when `withWait`: whether it says when to retry).
 */
export const verdict = (auth: ServiceAuth.ServiceAuthShape, token: string, withWait = false) =>
  Effect.map(Effect.either(auth.verify(`Bearer ${token}`, LIST)), (r) =>
    Either.isRight(r)
      ? "ok"
      : r.left._tag === "AuthUnavailable"
      ? `503:${r.left.reason}${withWait ? (r.left.retryAfterMs === undefined ? ":-" : ":wait") : ""}`
      : `401:${r.left.error}`)

/** How many of `verdicts` are each verdict. */
export const tally = (verdicts: ReadonlyArray<string>) => {
  const counts: Record<string, number> = {}
  for (const v of verdicts) counts[v] = (counts[v] ?? 0) + 1
  return counts
}
