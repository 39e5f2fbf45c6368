/**
 * `REDIS_URL` (SPEC §4.7): `redis://[user[:password]@]host[:port][/db]` or `rediss://` for TLS,
 * parsed without any part of the value reaching an error. Read by the configuration
 * (`DeliveryConfig`) and by the publisher when it connects.
 */
import { Data, Either, Redacted } from "effect"

export interface RedisTarget {
  readonly tls: boolean
  /** host name or IP literal (IPv6 without brackets) */
  readonly host: string
  readonly port: number
  readonly username: string | undefined
  readonly password: Redacted.Redacted<string> | undefined
  readonly db: number
}

/** `REDIS_URL` broke a rule. The rule never contains any part of the value. */
export class RedisUrlInvalid extends Data.TaggedError("RedisUrlInvalid")<{ readonly rule: string }> {
  override get message(): string {
    return `invalid REDIS_URL: ${this.rule}`
  }
}

/** The longest `REDIS_URL` accepted, as for the other URL variables (the configuration reads it here). */
export const MAX_URL_LENGTH = 2048
/** Redis' own upper bound for `databases` is far lower; this only rejects nonsense. */
const MAX_DB = 65_535
const DB_PATH = /^(\/(0|[1-9]\d{0,4})?)?$/

const decodePart = (s: string): Either.Either<string, RedisUrlInvalid> =>
  Either.try({
    try: () => decodeURIComponent(s),
    catch: () => new RedisUrlInvalid({ rule: "has badly percent-encoded credentials" })
  })

/**
 * Parse `redis://[user[:password]@]host[:port][/db]` (or `rediss://` for TLS). Query strings and
 * fragments are rejected: nothing here reads them, and silently ignoring an option is worse.
 */
export const parseRedisUrl = (input: string): Either.Either<RedisTarget, RedisUrlInvalid> => {
  const invalid = (rule: string) => Either.left(new RedisUrlInvalid({ rule }))
  if (input.length === 0 || input.length > MAX_URL_LENGTH) return invalid(`must be 1..${MAX_URL_LENGTH} characters`)
  if (!URL.canParse(input)) return invalid("must be a URL")
  const u = new URL(input)
  if (u.protocol !== "redis:" && u.protocol !== "rediss:") return invalid("must be a redis:// or rediss:// URL")
  if (u.hostname.length === 0) return invalid("must name a host")
  if (u.search.length > 0 || u.hash.length > 0) return invalid("must not have a query or a fragment")
  if (!DB_PATH.test(u.pathname)) return invalid("path must be empty or /<database number>")
  const db = u.pathname.length > 1 ? Number(u.pathname.slice(1)) : 0
  if (db > MAX_DB) return invalid(`database number must be in 0..${MAX_DB}`)
  const port = u.port.length > 0 ? Number(u.port) : 6379
  if (!Number.isInteger(port) || port < 1 || port > 65_535) return invalid("port must be in 1..65535")
  const host = u.hostname.startsWith("[") && u.hostname.endsWith("]") ? u.hostname.slice(1, -1) : u.hostname
  return Either.gen(function*() {
    const username = u.username.length > 0 ? yield* decodePart(u.username) : undefined
    const password = u.password.length > 0 ? Redacted.make(yield* decodePart(u.password)) : undefined
    return { tls: u.protocol === "rediss:", host, port, username, password, db }
  })
}
