/**
 * Delivery's configuration (SPEC §4.3, §4.7, §6.5): the workers, per-origin slots, timeouts and
 * retries, the allowed private CIDRs, the circuit breaker, the secret encryption keys and the
 * optional Redis publisher. Each variable's name, default and range live here once; `load` reads
 * them in the order `Config.load` always has.
 */
import { Effect, Either, Option, Redacted } from "effect"
import { parseCidr } from "../../schemas/Net.js"
import type { FirehookConfigShape } from "../platform/Config.js"
import {
  ConfigInvalid,
  notBelow,
  parseCommaList,
  readIntVar,
  readRedacted,
  readRedactedAll,
  readString,
  readStringVar,
  urlText
} from "../platform/ConfigRead.js"
import { MAX_URL_LENGTH, parseRedisUrl } from "./RedisUrl.js"
import * as SecretBox from "./SecretBox.js"

/** At most this many `DELIVERY_ALLOW_CIDRS` entries. */
export const MAX_ALLOW_CIDRS = 256

/** Comma-separated CIDRs (empty = none), at most {@link MAX_ALLOW_CIDRS}; undefined when any entry is invalid. */
const parseCidrList = (s: string): ReadonlyArray<string> | undefined =>
  parseCommaList(s, MAX_ALLOW_CIDRS, (p) => parseCidr(p) !== undefined)

export const delivery = {
  concurrency: { env: "DELIVERY_CONCURRENCY", default: 64, min: 1, max: 1024 },
  perOriginConcurrency: { env: "DELIVERY_PER_ORIGIN_CONCURRENCY", default: 4, min: 1, max: 256 },
  timeoutMs: { env: "DELIVERY_TIMEOUT_MS", default: 10000, min: 100, max: 30000 },
  maxAttempts: { env: "DELIVERY_MAX_ATTEMPTS", default: 12, min: 1, max: 50 },
  retryBaseMs: { env: "DELIVERY_RETRY_BASE_MS", default: 1000, min: 1, max: 3_600_000 },
  /** at least `retryBaseMs` */
  retryMaxMs: { env: "DELIVERY_RETRY_MAX_MS", default: 300000, min: 1, max: 86_400_000 },
  allowCidrs: { env: "DELIVERY_ALLOW_CIDRS", default: "" },
  circuitThreshold: { env: "DELIVERY_CIRCUIT_THRESHOLD", default: 20, min: 1, max: 10000 },
  circuitCooldownMs: { env: "DELIVERY_CIRCUIT_COOLDOWN_MS", default: 60000, min: 1000, max: 1_800_000 },
  /** SPEC §4.3 auto-disable: no 2xx for this long (with ≥ 20 failed attempts) → autoDisabled; 0 = never */
  autoDisableAfterMs: { env: "DELIVERY_AUTO_DISABLE_AFTER_MS", default: 432_000_000, min: 0, max: 31_536_000_000 }
} as const

/** Both unset by default (secrets then cannot be stored). */
export const secrets = {
  encryptionKey: { env: "WEBHOOK_SECRET_ENCRYPTION_KEY" },
  previousKeys: { env: "WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS", max: SecretBox.MAX_PREVIOUS_KEYS }
} as const

// SPEC §4.7: PUBLISH ≤ 8 KiB, at most 4 in flight, 1 s reply timeout
export const redis = {
  /** unset: no publisher */
  url: { env: "REDIS_URL" },
  channel: {
    env: "WEBHOOK_EVENTS_CHANNEL",
    default: "webhook:events",
    rule: {
      test: (s: string) => /^[\x21-\x7e]{1,256}$/.test(s),
      text: "must be 1-256 printable characters without spaces"
    }
  },
  publishMaxBytes: { env: "REDIS_PUBLISH_MAX_BYTES", default: 8192, min: 1024, max: 1_048_576 },
  publishMaxInFlight: { env: "REDIS_PUBLISH_MAX_IN_FLIGHT", default: 4, min: 1, max: 1024 },
  publishTimeoutMs: { env: "REDIS_PUBLISH_TIMEOUT_MS", default: 1000, min: 100, max: 60_000 }
} as const

const loadDelivery: Effect.Effect<FirehookConfigShape["delivery"], ConfigInvalid> = Effect.gen(function*() {
  const retryBaseMs = yield* readIntVar(delivery.retryBaseMs)
  const retryMaxMs = yield* readIntVar(delivery.retryMaxMs)
  yield* notBelow(delivery.retryMaxMs.env, retryMaxMs, delivery.retryBaseMs.env, retryBaseMs)
  const allowCidrText = yield* readString(delivery.allowCidrs.env, delivery.allowCidrs.default, {
    test: (s) => parseCidrList(s) !== undefined,
    text: `must be a comma-separated list of at most ${MAX_ALLOW_CIDRS} CIDRs (e.g. 10.0.0.0/8,fd00::/8)`
  })
  return {
    concurrency: yield* readIntVar(delivery.concurrency),
    perOriginConcurrency: yield* readIntVar(delivery.perOriginConcurrency),
    timeoutMs: yield* readIntVar(delivery.timeoutMs),
    maxAttempts: yield* readIntVar(delivery.maxAttempts),
    retryBaseMs,
    retryMaxMs,
    allowCidrs: parseCidrList(allowCidrText) ?? [],
    circuitThreshold: yield* readIntVar(delivery.circuitThreshold),
    circuitCooldownMs: yield* readIntVar(delivery.circuitCooldownMs),
    autoDisableAfterMs: yield* readIntVar(delivery.autoDisableAfterMs)
  }
})

const loadSecrets: Effect.Effect<FirehookConfigShape["secrets"], ConfigInvalid> = Effect.gen(function*() {
  const encryptionKey = yield* readRedacted(
    secrets.encryptionKey.env,
    (s) => Either.isRight(SecretBox.parseKey(s)),
    "must be a 32-byte key as base64, base64url or 64 hex characters"
  )
  const previousKeys = yield* readRedacted(
    secrets.previousKeys.env,
    // counted as parsed: empty items (a trailing comma) are not keys
    (s) =>
      Either.match(SecretBox.parseKeyList(s), {
        onLeft: () => false,
        onRight: (keys) => keys.length <= secrets.previousKeys.max
      }),
    `must be a comma-separated list of at most ${secrets.previousKeys.max} keys (32 bytes each: base64, base64url or 64 hex)`
  )
  return { encryptionKey, previousKeys }
})

const SCHEME_RULE = "must be a redis:// or rediss:// URL"

const loadRedis: Effect.Effect<FirehookConfigShape["redis"], ConfigInvalid> = Effect.gen(function*() {
  const url = yield* readRedactedAll(redis.url.env, [
    urlText,
    { test: (s) => s.length > MAX_URL_LENGTH || URL.canParse(s), text: SCHEME_RULE }
  ])
  // a redis:// URL that breaks one of its rules (its length included) is told which (the rules
  // never contain the value)
  const broken = Option.flatMap(url, (u) => Either.getLeft(parseRedisUrl(Redacted.value(u))))
  if (Option.isSome(broken)) {
    const rule = broken.value.rule === "must be a URL" ? SCHEME_RULE : broken.value.rule
    return yield* Effect.fail(new ConfigInvalid({ variable: redis.url.env, rule }))
  }
  const channel = yield* readStringVar(redis.channel)
  const publishMaxBytes = yield* readIntVar(redis.publishMaxBytes)
  const publishMaxInFlight = yield* readIntVar(redis.publishMaxInFlight)
  const publishTimeoutMs = yield* readIntVar(redis.publishTimeoutMs)
  return { url, channel, publishMaxBytes, publishMaxInFlight, publishTimeoutMs }
})

export const load: Effect.Effect<Pick<FirehookConfigShape, "delivery" | "secrets" | "redis">, ConfigInvalid> = Effect
  .gen(
    function*() {
      const d = yield* loadDelivery
      const s = yield* loadSecrets
      const r = yield* loadRedis
      return { delivery: d, secrets: s, redis: r }
    }
  )
