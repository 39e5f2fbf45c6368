/**
 * Config.load refuses invalid values (SPEC §6.5): a table of bad values, each knob out of range or
 * not a plain decimal, and the cross-field at-least rules; each error names the variable and its rule
 * and never echoes the value.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { knobs, load, SECRET } from "./config-support.js"

describe("Config", () => {
  const invalid: ReadonlyArray<readonly [Record<string, string>, string, string]> = [
    [{ DATABASE_URL: `mysql://root:${SECRET}@h/db` }, "DATABASE_URL", "postgres"],
    [{ DATABASE_URL: `not a url ${SECRET}` }, "DATABASE_URL", "whitespace"],
    [{ DATABASE_URL: `not-a-url-${SECRET}` }, "DATABASE_URL", "postgres"],
    // pg ignores an sslmode it does not know (libpq's `allow`, a typo): refused instead (DatabaseSsl.ts)
    [{ DATABASE_URL: `postgresql://u:${SECRET}@db.example/x?sslmode=allow` }, "DATABASE_URL", "sslmode must be one of"],
    [{ DATABASE_URL: "postgresql://db.example/x?sslmode=requir" }, "DATABASE_URL", "sslmode must be one of"],
    [{ DATABASE_URL: "postgresql://db.example/x?sslmode=REQUIRE" }, "DATABASE_URL", "sslmode must be one of"],
    [{ DATABASE_URL: `postgres://:${SECRET}@/` }, "DATABASE_URL", "postgres"],
    [{ HEALTH_PORT: "65536" }, "HEALTH_PORT", "0..65535"],
    [{ HEALTH_PORT: "-1" }, "HEALTH_PORT", "integer"],
    [{ HEALTH_PORT: "08" }, "HEALTH_PORT", "integer"],
    [{ HEALTH_PORT: "3e3" }, "HEALTH_PORT", "integer"],
    [{ HEALTH_PORT: " 80" }, "HEALTH_PORT", "integer"],
    [{ HEALTH_PORT: "80.0" }, "HEALTH_PORT", "integer"],
    [{ HEALTH_HOST: "bad host!" }, "HEALTH_HOST", "host"],
    [{ SHUTDOWN_TIMEOUT_MS: "999" }, "SHUTDOWN_TIMEOUT_MS", "1000..120000"],
    [{ SHUTDOWN_TIMEOUT_MS: "120001" }, "SHUTDOWN_TIMEOUT_MS", "1000..120000"],
    [{ LOG_LEVEL: "verbose" }, "LOG_LEVEL", "one of"],
    // SPEC §6.5 (strict parsing): an enumeration is closed and exact; a value in another case is
    // a startup error, not the value it resembles (`NODE_ENV=Development` does not open the
    // insecure mode's door, `LOG_LEVEL=INFO` is not `info`)
    [{ NODE_ENV: "Development" }, "NODE_ENV", "must be one of production, development, test"],
    [{ LOG_LEVEL: "INFO" }, "LOG_LEVEL", "must be one of"],
    [{ LOG_FORMAT: "JSON" }, "LOG_FORMAT", "must be one of json, pretty"],
    [{ FIREHOSE_SOURCE: "Relay" }, "FIREHOSE_SOURCE", "must be one of jetstream, relay"],
    [{ DELIVERY_PROCESS: "Inline" }, "DELIVERY_PROCESS", "must be one of auto, inline, child"],
    [{ LOG_FORMAT: "xml" }, "LOG_FORMAT", "json, pretty"],
    [{ NODE_ENV: "staging" }, "NODE_ENV", "production, development, test"],
    [{ WEBHOOK_ALLOW_INSECURE_DEV: "yes" }, "WEBHOOK_ALLOW_INSECURE_DEV", "0, 1"],
    [{ DATABASE_PREPARED_STATEMENTS: "off" }, "DATABASE_PREPARED_STATEMENTS", "0, 1"],
    [{ WEBHOOK_ALLOW_INSECURE_DEV: "1" }, "WEBHOOK_ALLOW_INSECURE_DEV", "NODE_ENV"],
    [{ WEBHOOK_ALLOW_INSECURE_DEV: "1", NODE_ENV: "production" }, "WEBHOOK_ALLOW_INSECURE_DEV", "NODE_ENV"],
    [{ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "0" }, "REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", "1..1000000"],
    [{ REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "10001" }, "REGISTRY_OWNER_ACTIVE_RECORDS_MAX", "1..10000"],
    [{ REGISTRY_DIRECT_SCOPE_DIDS_MAX: "10001" }, "REGISTRY_DIRECT_SCOPE_DIDS_MAX", "1..10000"],
    [{ REGISTRY_BACKLINK_SCOPE_DIDS_MAX: "x" }, "REGISTRY_BACKLINK_SCOPE_DIDS_MAX", "integer"],
    [{ WEBHOOK_INTAKE_QUEUE_MAX: "0" }, "WEBHOOK_INTAKE_QUEUE_MAX", "integer"],
    [{ WEBHOOK_INTAKE_BATCH_MAX: "600" }, "WEBHOOK_INTAKE_BATCH_MAX", "WEBHOOK_INTAKE_QUEUE_MAX"],
    [{ WEBHOOK_INTAKE_EVENT_MAX_BYTES: "100" }, "WEBHOOK_INTAKE_EVENT_MAX_BYTES", "1024..8388608"],
    [{ FIREHOSE_SOURCE: "firehose" }, "FIREHOSE_SOURCE", "jetstream, relay"],
    [{ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "10001" }, "REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", "at most 10000"],
    [{ JETSTREAM_URL: "https://jetstream.example/subscribe" }, "JETSTREAM_URL", "wss://"],
    [{ JETSTREAM_URL: "ws://127.0.0.1:6008/subscribe" }, "JETSTREAM_URL", "WEBHOOK_ALLOW_INSECURE_DEV"],
    [{ RELAY_URL: "ws://relay.example", NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }, "RELAY_URL", "loopback"],
    [{ RELAY_URL: `wss://user:${SECRET}@relay.example` }, "RELAY_URL", "wss://"],
    [{ DELIVERY_CONCURRENCY: "0" }, "DELIVERY_CONCURRENCY", "1..1024"],
    [{ DELIVERY_PER_ORIGIN_CONCURRENCY: "257" }, "DELIVERY_PER_ORIGIN_CONCURRENCY", "1..256"],
    [{ DELIVERY_TIMEOUT_MS: "99" }, "DELIVERY_TIMEOUT_MS", "100..30000"],
    [{ DELIVERY_TIMEOUT_MS: "30001" }, "DELIVERY_TIMEOUT_MS", "100..30000"],
    [{ DELIVERY_MAX_ATTEMPTS: "51" }, "DELIVERY_MAX_ATTEMPTS", "1..50"],
    [
      { DELIVERY_RETRY_BASE_MS: "5000", DELIVERY_RETRY_MAX_MS: "4000" },
      "DELIVERY_RETRY_MAX_MS",
      "DELIVERY_RETRY_BASE_MS"
    ],
    [{ DELIVERY_ALLOW_CIDRS: "10.0.0.0/8,nonsense" }, "DELIVERY_ALLOW_CIDRS", "CIDR"],
    [{ DELIVERY_ALLOW_CIDRS: "10.1.0.0/8" }, "DELIVERY_ALLOW_CIDRS", "CIDR"],
    [{ WEBHOOK_SECRET_ENCRYPTION_KEY: SECRET }, "WEBHOOK_SECRET_ENCRYPTION_KEY", "32-byte"],
    [
      { WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: `${"a".repeat(64)},${SECRET}` },
      "WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS",
      "at most 8"
    ],
    [{ REDIS_URL: `http://:${SECRET}@redis` }, "REDIS_URL", "redis://"],
    // a redis:// URL that breaks one of its rules says which (not "must be a redis:// URL")
    [{ REDIS_URL: `redis://:${SECRET}@127.0.0.1:6379/abc` }, "REDIS_URL", "path must be empty or /<database number>"],
    [{ REDIS_URL: `redis://:${SECRET}@127.0.0.1:6379/70000` }, "REDIS_URL", "database number must be in 0..65535"],
    [{ REDIS_URL: `redis://:${SECRET}@127.0.0.1:6379/?db=2` }, "REDIS_URL", "must not have a query or a fragment"],
    [{ REDIS_URL: `redis://:${SECRET}%zz@127.0.0.1:6379` }, "REDIS_URL", "percent-encoded"],
    // one length bound (RedisUrl's), told as such, not as "must be a redis:// URL"
    [{ REDIS_URL: `redis://:${SECRET}@${"h".repeat(2030)}` }, "REDIS_URL", "must be 1..2048 characters"],
    [{ WEBHOOK_EVENTS_CHANNEL: "has space" }, "WEBHOOK_EVENTS_CHANNEL", "printable"],
    [{ MAINTENANCE_INTERVAL_MS: "999" }, "MAINTENANCE_INTERVAL_MS", "1000..86400000"],
    [{ PLC_DIRECTORY_URL: "http://plc.example" }, "PLC_DIRECTORY_URL", "https://"],
    [{ PLC_DIRECTORY_URL: "http://127.0.0.1:2582" }, "PLC_DIRECTORY_URL", "https://"],
    [
      { PLC_DIRECTORY_URL: "http://plc.example", NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" },
      "PLC_DIRECTORY_URL",
      "loopback"
    ],
    [{ PLC_DIRECTORY_URL: `https://u:${SECRET}@plc.example` }, "PLC_DIRECTORY_URL", "credentials"],
    [{ PLC_DIRECTORY_URL: "https://plc.example/?x=1" }, "PLC_DIRECTORY_URL", "query"],
    [{ OWNER_DISCOVERY_URL: "wss://relay.example" }, "OWNER_DISCOVERY_URL", "https://"],
    [{ OWNER_DISCOVERY_URL: "https://relay.example/#x" }, "OWNER_DISCOVERY_URL", "fragment"],
    [{ BACKFILL_OWNERS: "did:plc:abcdefghijklmnopqrstuvwx,alice.bsky.social" }, "BACKFILL_OWNERS", "canonical DIDs"],
    [{ BACKFILL_OWNERS: "did:plc:ABCDEFGHIJKLMNOPQRSTUVWX" }, "BACKFILL_OWNERS", "canonical DIDs"],
    [{ BACKFILL_CONCURRENCY: "0" }, "BACKFILL_CONCURRENCY", "1..4"],
    [{ BACKFILL_CONCURRENCY: "5" }, "BACKFILL_CONCURRENCY", "1..4"],
    [{ RETRY_SCHEDULER_INTERVAL_MS: "999" }, "RETRY_SCHEDULER_INTERVAL_MS", "1000..3600000"],
    [{ RETRY_SCHEDULER_BASE_MS: "99" }, "RETRY_SCHEDULER_BASE_MS", "100..3600000"],
    [{ RETRY_SCHEDULER_MAX_MS: "86400001" }, "RETRY_SCHEDULER_MAX_MS", "100..86400000"],
    [
      { RETRY_SCHEDULER_BASE_MS: "6000", RETRY_SCHEDULER_MAX_MS: "5000" },
      "RETRY_SCHEDULER_MAX_MS",
      "RETRY_SCHEDULER_BASE_MS"
    ],
    [{ RETRY_SCHEDULER_CONCURRENCY: "3" }, "RETRY_SCHEDULER_CONCURRENCY", "1..2"],
    [{ RETRY_SCHEDULER_STALE_SCAN_MS: "59999" }, "RETRY_SCHEDULER_STALE_SCAN_MS", "60000..86400000"],
    // SPEC §6.5: a query of the stream URL would be dropped silently; a startup error instead
    [
      { JETSTREAM_URL: "wss://jetstream.example/subscribe?wantedDids=did:plc:abcdefghijklmnopqrstuvwx" },
      "JETSTREAM_URL",
      "must not have a query or a fragment"
    ],
    [{ JETSTREAM_URL: "wss://jetstream.example/subscribe?" }, "JETSTREAM_URL", "must not have a query or a fragment"],
    [{ JETSTREAM_URL: "wss://jetstream.example/subscribe#x" }, "JETSTREAM_URL", "must not have a query or a fragment"],
    [
      {
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: "ws://127.0.0.1:6008/subscribe?wantedCollections=app.bsky.feed.post"
      },
      "JETSTREAM_URL",
      "must not have a query or a fragment"
    ],
    [{ RELAY_URL: "wss://relay.example?cursor=5" }, "RELAY_URL", "must not have a query or a fragment"],
    [
      { FIREHOSE_SOURCE: "relay", RELAY_URL: "wss://relay.example/?x=1" },
      "RELAY_URL",
      "must not have a query or a fragment"
    ],
    [{ RELAY_URL: "wss://relay.example/#" }, "RELAY_URL", "must not have a query or a fragment"],
    // SPEC §6.5: HEALTH_HOST is an IP literal or localhost, never another name
    [{ HEALTH_HOST: "eth0" }, "HEALTH_HOST", "must be an IP literal or localhost"],
    [{ HEALTH_HOST: "example.com" }, "HEALTH_HOST", "must be an IP literal or localhost"],
    [{ HEALTH_HOST: "localhost.localdomain" }, "HEALTH_HOST", "must be an IP literal or localhost"],
    [{ HEALTH_HOST: "127.1" }, "HEALTH_HOST", "must be an IP literal or localhost"],
    [{ HEALTH_HOST: "256.0.0.1" }, "HEALTH_HOST", "must be an IP literal or localhost"],
    [{ HEALTH_HOST: "[::1]" }, "HEALTH_HOST", "must be an IP literal or localhost"]
  ]

  // the new knobs: below the range, above it, not a plain decimal (the range is checked before
  // any cross-field rule, so nothing else needs setting)
  const knobInvalid: ReadonlyArray<readonly [Record<string, string>, string, string]> = knobs.flatMap((k) => {
    const range = `${k.min}..${k.max}`
    return [String(k.min - 1), String(k.max + 1), `${k.def}.0`, `+${k.def}`, `0${k.def}`, `${k.def}ms`, `-${k.def}`]
      .map(
        (value) => [{ [k.name]: value }, k.name, range] as const
      )
  })
  const crossField: ReadonlyArray<readonly [Record<string, string>, string, string]> = [
    [
      { WEBHOOK_INTAKE_BACKOFF_BASE_MS: "5000", WEBHOOK_INTAKE_BACKOFF_MAX_MS: "4999" },
      "WEBHOOK_INTAKE_BACKOFF_MAX_MS",
      "must not be below WEBHOOK_INTAKE_BACKOFF_BASE_MS"
    ],
    // against the default base (1 s)
    [
      { WEBHOOK_INTAKE_BACKOFF_MAX_MS: "999" },
      "WEBHOOK_INTAKE_BACKOFF_MAX_MS",
      "must not be below WEBHOOK_INTAKE_BACKOFF_BASE_MS"
    ],
    // against a default max (5 min)
    [
      { WEBHOOK_INTAKE_BACKOFF_BASE_MS: "300001" },
      "WEBHOOK_INTAKE_BACKOFF_MAX_MS",
      "must not be below WEBHOOK_INTAKE_BACKOFF_BASE_MS"
    ],
    // SPEC §5: max age ≥ stale, retry max ≥ base, snapshot bytes ≥ page bytes (each also against
    // the other's default)
    [
      { IDENTITY_CACHE_STALE_MS: "120000", IDENTITY_CACHE_MAX_AGE_MS: "119999" },
      "IDENTITY_CACHE_MAX_AGE_MS",
      "must not be below IDENTITY_CACHE_STALE_MS"
    ],
    [
      { IDENTITY_CACHE_MAX_AGE_MS: "3599999" },
      "IDENTITY_CACHE_MAX_AGE_MS",
      "must not be below IDENTITY_CACHE_STALE_MS"
    ],
    [
      { BACKFILL_RETRY_BASE_MS: "5000", BACKFILL_RETRY_MAX_MS: "4999" },
      "BACKFILL_RETRY_MAX_MS",
      "must not be below BACKFILL_RETRY_BASE_MS"
    ],
    [{ BACKFILL_RETRY_MAX_MS: "999" }, "BACKFILL_RETRY_MAX_MS", "must not be below BACKFILL_RETRY_BASE_MS"],
    [{ BACKFILL_RETRY_BASE_MS: "60001" }, "BACKFILL_RETRY_MAX_MS", "must not be below BACKFILL_RETRY_BASE_MS"],
    [
      { RECONCILE_PAGE_MAX_BYTES: "100000", RECONCILE_MAX_BYTES: "99999" },
      "RECONCILE_MAX_BYTES",
      "must not be below RECONCILE_PAGE_MAX_BYTES"
    ],
    [{ RECONCILE_MAX_BYTES: "524287" }, "RECONCILE_MAX_BYTES", "must not be below RECONCILE_PAGE_MAX_BYTES"],
    [{ RECONCILE_PAGE_MAX_BYTES: "10485761" }, "RECONCILE_MAX_BYTES", "must not be below RECONCILE_PAGE_MAX_BYTES"]
  ]

  for (const [env, variable, ruleFragment] of [...invalid, ...knobInvalid, ...crossField]) {
    it.effect(`rejects ${variable}=${JSON.stringify(Object.values(env).at(-1)).replace(SECRET, "…")}`, () =>
      Effect.gen(function*() {
        const result = yield* Effect.either(load(env))
        expect(Either.isLeft(result)).toBe(true)
        if (Either.isLeft(result)) {
          const err = result.left
          expect(err._tag).toBe("ConfigInvalid")
          expect(err.variable).toBe(variable)
          expect(err.message).toContain(variable)
          expect(err.message).toContain(ruleFragment)
          // never echo the value
          for (const value of Object.values(env)) {
            if (value.length > 2) expect(err.message).not.toContain(value)
          }
          expect(err.message).not.toContain(SECRET)
          expect(err.message).not.toContain("\n")
        }
      }))
  }
})
