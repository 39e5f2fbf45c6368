/**
 * The header and claims of an atproto service token (SPEC §8.2), read with a Schema so that
 * firehook can apply the rules its verifier library does not (see `services/api/ServiceAuth`).
 * This reads; it never decides that a token is genuine: the library parses the token again, checks
 * its signature against the issuer's key and its audience, method, expiry and replay, and only a
 * token it accepts is ever trusted. Bounded: a token longer than {@link MAX_TOKEN_LENGTH} is not
 * read.
 *
 * @since 0.1.0
 */
import { Either, Encoding, Schema } from "effect"

/** Service tokens are a few hundred bytes; anything longer is refused unread. */
export const MAX_TOKEN_LENGTH = 8192

const Seconds = Schema.Int.pipe(Schema.between(0, Number.MAX_SAFE_INTEGER))

export const JwtHeader = Schema.Struct({
  alg: Schema.String.pipe(Schema.maxLength(32)),
  typ: Schema.optional(Schema.String.pipe(Schema.maxLength(64))),
  kid: Schema.optional(Schema.String.pipe(Schema.maxLength(256)))
})
export type JwtHeader = typeof JwtHeader.Type

export const JwtClaims = Schema.Struct({
  iss: Schema.String.pipe(Schema.maxLength(2048)),
  aud: Schema.String.pipe(Schema.maxLength(2048)),
  exp: Seconds,
  iat: Schema.optional(Seconds),
  nbf: Schema.optional(Seconds),
  lxm: Schema.optional(Schema.String.pipe(Schema.maxLength(512))),
  jti: Schema.optional(Schema.String.pipe(Schema.maxLength(1024)))
})
export type JwtClaims = typeof JwtClaims.Type

export interface ServiceJwtParts {
  readonly header: JwtHeader
  readonly claims: JwtClaims
}

const segment = <A, I>(schema: Schema.Schema<A, I>, text: string): A | undefined => {
  const json = Encoding.decodeBase64UrlString(text)
  if (Either.isLeft(json)) return undefined
  const decoded = Schema.decodeUnknownEither(Schema.parseJson(schema))(json.right)
  return Either.isRight(decoded) ? decoded.right : undefined
}

/** The header and claims of a compact JWS `header.payload.signature`, or undefined. */
export const readServiceJwt = (token: string): ServiceJwtParts | undefined => {
  if (token.length > MAX_TOKEN_LENGTH) return undefined
  const parts = token.split(".")
  if (parts.length !== 3 || (parts[2] ?? "").length === 0) return undefined
  const header = segment(JwtHeader, parts[0] ?? "")
  const claims = header === undefined ? undefined : segment(JwtClaims, parts[1] ?? "")
  return header === undefined || claims === undefined ? undefined : { header, claims }
}
