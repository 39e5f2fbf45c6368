/**
 * Config.load parses valid values (SPEC §6.5): backfill and retry scheduler settings, secrets and
 * URLs kept redacted, at most 8 previous encryption keys, prepared statements, HEALTH_HOST literals,
 * stream URLs, each LOG_LEVEL name, a Unix-socket DATABASE_URL, and the API listener kept off the
 * health listener's address.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, LogLevel, Option, Redacted } from "effect"
import { load, SECRET } from "./config-support.js"

describe("Config", () => {
  it.effect("backfill and retry scheduler values are parsed", () =>
    Effect.gen(function*() {
      const did = "did:plc:abcdefghijklmnopqrstuvwx"
      const c = yield* load({
        PLC_DIRECTORY_URL: "https://plc.example/",
        OWNER_DISCOVERY_URL: "https://relay.example",
        BACKFILL_OWNERS: ` ${did} , did:web:example.com,${did}`,
        BACKFILL_CONCURRENCY: "4",
        RETRY_SCHEDULER_INTERVAL_MS: "1000",
        RETRY_SCHEDULER_BASE_MS: "100",
        RETRY_SCHEDULER_MAX_MS: "100",
        RETRY_SCHEDULER_CONCURRENCY: "2",
        RETRY_SCHEDULER_STALE_SCAN_MS: "60000",
        RETRY_SCHEDULER_TRACKED_MAX: "2"
      })
      expect(c.backfill).toEqual({
        plcDirectoryUrl: "https://plc.example",
        ownerDiscoveryUrl: Option.some("https://relay.example"),
        owners: [did, "did:web:example.com"],
        concurrency: 4,
        pageSize: 50,
        passMaxOwners: 1000,
        retryBaseMs: 1000,
        retryMaxMs: 60000
      })
      expect(c.retryScheduler).toEqual({
        intervalMs: 1000,
        baseMs: 100,
        maxMs: 100,
        concurrency: 2,
        staleScanMs: 60000,
        trackedMax: 2
      })
      const dev = yield* load({
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        PLC_DIRECTORY_URL: "http://127.0.0.1:2582",
        OWNER_DISCOVERY_URL: "http://localhost:2470/"
      })
      expect(dev.backfill.plcDirectoryUrl).toBe("http://127.0.0.1:2582")
      expect(dev.backfill.ownerDiscoveryUrl).toEqual(Option.some("http://localhost:2470"))
    }))

  it.effect("valid values are parsed", () =>
    Effect.gen(function*() {
      const c = yield* load({
        DATABASE_URL: `postgres://u:${SECRET}@db.example:5432/x`,
        HEALTH_PORT: "0",
        SHUTDOWN_TIMEOUT_MS: "120000",
        LOG_LEVEL: "debug",
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: "ws://127.0.0.1:6008/subscribe",
        DELIVERY_ALLOW_CIDRS: " 10.0.0.0/8 , fd00::/8 ",
        WEBHOOK_SECRET_ENCRYPTION_KEY: "a".repeat(64),
        REDIS_URL: `redis://:${SECRET}@127.0.0.1:6379/0`
      })
      expect(c.intake.jetstreamUrl).toBe("ws://127.0.0.1:6008/subscribe")
      expect(c.delivery.allowCidrs).toEqual(["10.0.0.0/8", "fd00::/8"])
      expect(Option.isSome(c.secrets.encryptionKey)).toBe(true)
      expect(String(c.redis.url)).not.toContain(SECRET)
      expect(Option.map(c.databaseUrl, Redacted.value)).toEqual(Option.some(`postgres://u:${SECRET}@db.example:5432/x`))
      expect(String(c.databaseUrl)).not.toContain(SECRET)
      expect(c.healthPort).toBe(0)
      expect(c.shutdownTimeoutMs).toBe(120000)
      expect(c.logLevel).toBe(LogLevel.Debug)
      expect(c.allowInsecureDev).toBe(true)
    }))

  // README: at most 8 previous keys; empty items are ignored (SecretBox.parseKeyList), so the count is
  // of keys: 8 keys with a trailing comma (or an empty item between two) were refused as "more than 8"
  it.effect("WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: at most 8 keys, empty items not counted", () =>
    Effect.gen(function*() {
      const keys = Array.from({ length: 9 }, (_, i) => String(i + 1).repeat(64))
      const eight = keys.slice(0, 8)
      for (
        const value of [
          eight.join(","),
          `${eight.join(",")},`,
          `${eight.slice(0, 4).join(",")},,${eight.slice(4).join(",")}`
        ]
      ) {
        const c = yield* load({ WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: value })
        expect(Option.isSome(c.secrets.previousKeys)).toBe(true)
      }
      const nine = yield* Effect.either(load({ WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: keys.join(",") }))
      if (Either.isRight(nine)) return expect.fail("9 previous keys were accepted")
      expect(nine.left.variable).toBe("WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS")
      expect(nine.left.message).toContain("at most 8 keys")
    }))

  it.effect("DATABASE_PREPARED_STATEMENTS=0 turns named prepared statements off", () =>
    Effect.gen(function*() {
      expect((yield* load({ DATABASE_PREPARED_STATEMENTS: "0" })).databasePreparedStatements).toBe(false)
      expect((yield* load({ DATABASE_PREPARED_STATEMENTS: "1" })).databasePreparedStatements).toBe(true)
    }))

  it.effect("HEALTH_HOST: IP literals (v4, v6) and localhost are accepted (SPEC §6.5)", () =>
    Effect.gen(function*() {
      for (
        const host of ["127.0.0.1", "0.0.0.0", "10.1.2.3", "::", "::1", "fe80::1%eth0", "2001:db8::8", "localhost"]
      ) {
        expect((yield* load({ HEALTH_HOST: host })).healthHost).toBe(host)
      }
    }))

  it.effect("JETSTREAM_URL / RELAY_URL without a query are taken as given", () =>
    Effect.gen(function*() {
      const c = yield* load({
        FIREHOSE_SOURCE: "relay",
        JETSTREAM_URL: "wss://jetstream.example/subscribe",
        RELAY_URL: "wss://relay.example:8443/"
      })
      expect([c.intake.jetstreamUrl, c.intake.relayUrl]).toEqual([
        "wss://jetstream.example/subscribe",
        "wss://relay.example:8443/"
      ])
    }))

  // SPEC §6.5: LOG_LEVEL names the level it sets, each one (`warn` and `warning` alike)
  it.effect("LOG_LEVEL: each accepted name is its level", () =>
    Effect.gen(function*() {
      const levels: ReadonlyArray<readonly [string, LogLevel.LogLevel]> = [
        ["trace", LogLevel.Trace],
        ["debug", LogLevel.Debug],
        ["info", LogLevel.Info],
        ["warn", LogLevel.Warning],
        ["warning", LogLevel.Warning],
        ["error", LogLevel.Error],
        ["fatal", LogLevel.Fatal],
        ["none", LogLevel.None]
      ]
      for (const [name, level] of levels) expect((yield* load({ LOG_LEVEL: name })).logLevel).toBe(level)
    }))

  // SPEC §6.5: DATABASE_URL is a PostgreSQL connection URL, and one that reaches the server over
  // its Unix-domain socket names no host but a `host` parameter (libpq's and pg's form)
  it.effect("DATABASE_URL: a Unix-domain socket URL (no host, a host parameter) is accepted", () =>
    Effect.gen(function*() {
      const socket = "postgresql:///firehook?host=/var/run/postgresql"
      const c = yield* load({ DATABASE_URL: socket })
      expect(Option.map(c.databaseUrl, Redacted.value)).toEqual(Option.some(socket))
    }))

  // SPEC §6.5: HEALTH_PORT = API_PORT on the same address was a bind error after startup
  // (`startup failed (unexpected Error EADDRINUSE listen)`); a configuration error up front instead
  describe("the API listener may not take the health listener's address", () => {
    const collide: ReadonlyArray<Record<string, string>> = [
      { HEALTH_PORT: "4000", API_PORT: "4000" },
      { API_PORT: "3003" },
      { HEALTH_PORT: "3004" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "0.0.0.0", API_HOST: "127.0.0.1" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "10.0.0.1", API_HOST: "::" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "localhost", API_HOST: "127.0.0.1" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "::1", API_HOST: "localhost" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "localhost", API_HOST: "localhost" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "::ffff:127.0.0.1", API_HOST: "localhost" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "::ffff:127.0.0.1", API_HOST: "127.0.0.1" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "0:0::0:1", API_HOST: "::1" },
      { HEALTH_PORT: "4000", API_PORT: "4000", FIREHOOK_ROLES: "api" }
    ]
    for (const env of collide) {
      it.effect(`refuses ${JSON.stringify(env)}`, () =>
        Effect.gen(function*() {
          const result = yield* Effect.either(load(env))
          if (Either.isRight(result)) return expect.fail("the colliding listeners were accepted")
          expect(result.left.variable).toBe("API_PORT")
          expect(result.left.message).toBe(
            "invalid configuration: API_PORT must differ from HEALTH_PORT when both listen on the same address"
          )
        }))
    }
    const apart: ReadonlyArray<Record<string, string>> = [
      { HEALTH_PORT: "0", API_PORT: "0" },
      { HEALTH_PORT: "4000", API_PORT: "4001" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "10.0.0.1", API_HOST: "10.0.0.2" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "localhost", API_HOST: "10.0.0.2" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "127.0.0.1", API_HOST: "::1" },
      // localhost resolves to 127.0.0.1 or ::1, never to another 127/8 address (Bun binds both)
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "127.0.0.2", API_HOST: "localhost" },
      { HEALTH_PORT: "4000", API_PORT: "4000", HEALTH_HOST: "localhost", API_HOST: "127.0.0.53" },
      // the API listener runs only with the api role
      { HEALTH_PORT: "4000", API_PORT: "4000", FIREHOOK_ROLES: "intake,delivery" }
    ]
    for (const env of apart) {
      it.effect(`accepts ${JSON.stringify(env)}`, () =>
        Effect.gen(function*() {
          const c = yield* load(env)
          expect(c.healthPort).toBe(Number(env["HEALTH_PORT"]))
        }))
    }
  })
})
