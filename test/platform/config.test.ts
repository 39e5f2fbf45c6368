import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Either, LogLevel, Option, Redacted } from "effect"
import { MAX_ALLOW_CIDRS } from "../../src/services/delivery/DeliveryConfig.js"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Reconciler from "../../src/services/reconciliation/Reconciler.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"

const load = (env: Record<string, string>, isTty = false) =>
  Config.load({ isTty }).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))))

const SECRET = "s3cr3t-pa55word"

describe("Config", () => {
  it.effect("defaults (SPEC §6.5)", () =>
    Effect.gen(function*() {
      const c = yield* load({})
      expect(Option.isNone(c.databaseUrl)).toBe(true)
      expect(c.databasePreparedStatements).toBe(true)
      expect(c.dataDir).toBe("./.firehook")
      expect(c.healthHost).toBe("127.0.0.1")
      expect(c.healthPort).toBe(3003)
      expect(c.shutdownTimeoutMs).toBe(30000)
      expect(c.logLevel).toBe(LogLevel.Info)
      expect(c.logFormat).toBe("json")
      expect(c.nodeEnv).toBe("production")
      expect(c.allowInsecureDev).toBe(false)
      expect(c.registry).toEqual({ activeMax: 10000, ownerActiveMax: 100, directDidsMax: 10000, backlinkDidsMax: 1024 })
      expect(c.intake).toEqual({
        queueMax: 512,
        batchMax: 128,
        eventMaxBytes: 1048576,
        source: "jetstream",
        jetstreamUrl: "wss://jetstream2.us-east.bsky.network/subscribe",
        relayUrl: "wss://bsky.network",
        batchAttempts: 3,
        batchRetryBaseMs: 250,
        backoffBaseMs: 1000,
        backoffMaxMs: 300000,
        poisonBackoffMs: 10000
      })
      expect(c.delivery).toEqual({
        concurrency: 64,
        perOriginConcurrency: 4,
        timeoutMs: 10000,
        maxAttempts: 12,
        retryBaseMs: 1000,
        retryMaxMs: 300000,
        allowCidrs: [],
        circuitThreshold: 20,
        circuitCooldownMs: 60000,
        autoDisableAfterMs: 432000000
      })
      expect(Option.isNone(c.secrets.encryptionKey)).toBe(true)
      expect(Option.isNone(c.redis.url)).toBe(true)
      expect(c.redis.channel).toBe("webhook:events")
      expect(c.maintenanceIntervalMs).toBe(60000)
      expect(c.backfill).toEqual({
        plcDirectoryUrl: "https://plc.directory",
        ownerDiscoveryUrl: Option.none(),
        owners: [],
        concurrency: 2,
        pageSize: 50,
        passMaxOwners: 1000,
        retryBaseMs: 1000,
        retryMaxMs: 60000
      })
      expect(c.identity).toEqual({ cacheStaleMs: 3_600_000, cacheMaxAgeMs: 86_400_000 })
      expect(c.reconcile).toEqual({
        maxConcurrentScans: 8,
        pageMaxBytes: 524_288,
        pageRecords: 100,
        maxPages: 20,
        maxRecords: 1000,
        maxBytes: 10_485_760
      })
      expect(c.retryScheduler).toEqual({
        intervalMs: 60000,
        baseMs: 5000,
        maxMs: 3600000,
        concurrency: 1,
        staleScanMs: 900000,
        trackedMax: 16
      })
    }))

  it.effect("defaults of the SPEC's other numbers (§2.4, §3.3, §3.4, §4.7, §4.9, §5) = the services' own defaults", () =>
    Effect.gen(function*() {
      const c = yield* load({})
      const day = 86_400_000
      // SPEC §4.9 / §3.4
      expect(c.retention).toEqual({
        deliveredMs: 7 * day,
        deadLetterMs: 30 * day,
        cancelledMs: 7 * day,
        auditMs: 30 * day,
        auditMaxRows: 100_000,
        tombstonesMs: 7 * day,
        tombstonesMaxRows: 100_000,
        quarantineMs: 30 * day,
        quarantineMaxRows: 100_000,
        eventBodiesMs: 7 * day
      })
      const r = Maintenance.DEFAULT_RETENTION
      const ms = (d: Duration.DurationInput) => Duration.toMillis(Duration.decode(d))
      expect(c.retention).toEqual({
        deliveredMs: ms(r.delivered),
        deadLetterMs: ms(r.deadLetter),
        cancelledMs: ms(r.cancelled),
        auditMs: ms(r.audit),
        auditMaxRows: r.auditMaxRows,
        tombstonesMs: ms(r.tombstones),
        tombstonesMaxRows: r.tombstonesMaxRows,
        quarantineMs: ms(r.quarantine),
        quarantineMaxRows: r.quarantineMaxRows,
        eventBodiesMs: ms(r.deliveryEvents)
      })
      // SPEC §4.7: ≤ 8 KiB, 4 in flight, 1 s
      expect(c.redis).toMatchObject({ publishMaxBytes: 8192, publishMaxInFlight: 4, publishTimeoutMs: 1000 })
      expect(c.redis.publishMaxBytes).toBe(Publisher.DEFAULTS.maxMessageBytes)
      expect(c.redis.publishMaxInFlight).toBe(Publisher.DEFAULTS.maxInFlight)
      expect(c.redis.publishTimeoutMs).toBe(ms(Publisher.DEFAULTS.replyTimeout))
      // SPEC §3.3: the tuning Intake builds from the configuration is its default tuning
      expect(Intake.tuningFromConfig(c.intake)).toEqual(Intake.defaultTuning(512, 128))
      // SPEC §5.4
      expect(c.retryScheduler.trackedMax).toBe(RetryScheduler.DEFAULT_TRACKED_MAX)
      // SPEC §5.1: stale after 1 h, expired after 24 h
      expect(c.identity.cacheStaleMs).toBe(ms(Identity.DEFAULT_STALE_AFTER))
      expect(c.identity.cacheMaxAgeMs).toBe(ms(Identity.DEFAULT_EXPIRE_AFTER))
      // SPEC §5.2 / §5.3: pages of 50 owners, ≤ 1,000 per pass, backoff 1 s → 60 s
      expect(c.backfill.pageSize).toBe(Backfill.DEFAULT_PAGE_SIZE)
      expect(c.backfill.passMaxOwners).toBe(Backfill.DEFAULT_MAX_OWNERS_PER_PASS)
      expect(c.backfill.retryBaseMs).toBe(ms(Backfill.DEFAULT_INFRA_RETRY_BASE))
      expect(c.backfill.retryMaxMs).toBe(ms(Backfill.DEFAULT_INFRA_RETRY_MAX))
      // SPEC §5.3: the limits the Reconciler builds from the configuration are its default limits
      expect(Reconciler.limitsFromConfig(c.reconcile)).toEqual(Reconciler.defaultLimits)
      // SPEC §2.4: TTL 7 days, 100,000 rows; the limits the Processor builds from the configuration
      // are its default limits
      expect(c.priorRefs).toEqual({ ttlMs: 7 * day, maxRows: 100_000 })
      expect(c.priorRefs.ttlMs).toBe(Processor.defaultPriorRefLimits.ttlSeconds * 1000)
      expect(c.priorRefs.maxRows).toBe(Processor.defaultPriorRefLimits.maxRows)
      expect(Processor.priorLimitsFromConfig(c.priorRefs)).toEqual(Processor.defaultPriorRefLimits)
    }))

  /** The new numeric knobs: name, range, default, where the value lands, and what else must be set. */
  const knobs: ReadonlyArray<{
    readonly name: string
    readonly min: number
    readonly max: number
    readonly def: number
    readonly get: (c: Config.FirehookConfigShape) => number
    readonly env?: Record<string, string>
  }> = [
    {
      name: "RETENTION_DELIVERED_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 604_800_000,
      get: (c) => c.retention.deliveredMs
    },
    {
      name: "RETENTION_DEAD_LETTER_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 2_592_000_000,
      get: (c) => c.retention.deadLetterMs
    },
    {
      name: "RETENTION_CANCELLED_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 604_800_000,
      get: (c) => c.retention.cancelledMs
    },
    {
      name: "RETENTION_AUDIT_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 2_592_000_000,
      get: (c) => c.retention.auditMs
    },
    {
      name: "RETENTION_AUDIT_MAX_ROWS",
      min: 1_000,
      max: 10_000_000,
      def: 100_000,
      get: (c) => c.retention.auditMaxRows
    },
    {
      name: "RETENTION_TOMBSTONES_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 604_800_000,
      get: (c) => c.retention.tombstonesMs
    },
    {
      name: "RETENTION_TOMBSTONES_MAX_ROWS",
      min: 1_000,
      max: 10_000_000,
      def: 100_000,
      get: (c) => c.retention.tombstonesMaxRows
    },
    {
      name: "RETENTION_QUARANTINE_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 2_592_000_000,
      get: (c) => c.retention.quarantineMs
    },
    {
      name: "RETENTION_QUARANTINE_MAX_ROWS",
      min: 1_000,
      max: 10_000_000,
      def: 100_000,
      get: (c) => c.retention.quarantineMaxRows
    },
    {
      name: "RETENTION_EVENT_BODIES_MS",
      min: 3_600_000,
      max: 31_536_000_000,
      def: 604_800_000,
      get: (c) => c.retention.eventBodiesMs
    },
    { name: "REDIS_PUBLISH_MAX_BYTES", min: 1024, max: 1_048_576, def: 8192, get: (c) => c.redis.publishMaxBytes },
    { name: "REDIS_PUBLISH_MAX_IN_FLIGHT", min: 1, max: 1024, def: 4, get: (c) => c.redis.publishMaxInFlight },
    { name: "REDIS_PUBLISH_TIMEOUT_MS", min: 100, max: 60_000, def: 1000, get: (c) => c.redis.publishTimeoutMs },
    { name: "WEBHOOK_INTAKE_BATCH_ATTEMPTS", min: 1, max: 20, def: 3, get: (c) => c.intake.batchAttempts },
    {
      name: "WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS",
      min: 1,
      max: 60_000,
      def: 250,
      get: (c) => c.intake.batchRetryBaseMs
    },
    {
      name: "WEBHOOK_INTAKE_BACKOFF_BASE_MS",
      min: 100,
      max: 600_000,
      def: 1000,
      get: (c) => c.intake.backoffBaseMs,
      env: { WEBHOOK_INTAKE_BACKOFF_MAX_MS: "3600000" }
    },
    {
      name: "WEBHOOK_INTAKE_BACKOFF_MAX_MS",
      min: 100,
      max: 3_600_000,
      def: 300_000,
      get: (c) => c.intake.backoffMaxMs,
      env: { WEBHOOK_INTAKE_BACKOFF_BASE_MS: "100" }
    },
    {
      name: "WEBHOOK_INTAKE_POISON_BACKOFF_MS",
      min: 1000,
      max: 3_600_000,
      def: 10_000,
      get: (c) => c.intake.poisonBackoffMs
    },
    { name: "RETRY_SCHEDULER_TRACKED_MAX", min: 1, max: 1024, def: 16, get: (c) => c.retryScheduler.trackedMax },
    {
      name: "IDENTITY_CACHE_STALE_MS",
      min: 60_000,
      max: 86_400_000,
      def: 3_600_000,
      get: (c) => c.identity.cacheStaleMs,
      env: { IDENTITY_CACHE_MAX_AGE_MS: "604800000" }
    },
    {
      name: "IDENTITY_CACHE_MAX_AGE_MS",
      min: 60_000,
      max: 604_800_000,
      def: 86_400_000,
      get: (c) => c.identity.cacheMaxAgeMs,
      env: { IDENTITY_CACHE_STALE_MS: "60000" }
    },
    { name: "BACKFILL_PAGE_SIZE", min: 1, max: 1000, def: 50, get: (c) => c.backfill.pageSize },
    { name: "BACKFILL_PASS_MAX_OWNERS", min: 1, max: 1_000_000, def: 1000, get: (c) => c.backfill.passMaxOwners },
    {
      name: "BACKFILL_RETRY_BASE_MS",
      min: 100,
      max: 600_000,
      def: 1000,
      get: (c) => c.backfill.retryBaseMs,
      env: { BACKFILL_RETRY_MAX_MS: "3600000" }
    },
    {
      name: "BACKFILL_RETRY_MAX_MS",
      min: 100,
      max: 3_600_000,
      def: 60_000,
      get: (c) => c.backfill.retryMaxMs,
      env: { BACKFILL_RETRY_BASE_MS: "100" }
    },
    { name: "RECONCILE_MAX_CONCURRENT_SCANS", min: 1, max: 1000, def: 8, get: (c) => c.reconcile.maxConcurrentScans },
    {
      name: "RECONCILE_PAGE_MAX_BYTES",
      min: 65_536,
      max: 16_777_216,
      def: 524_288,
      get: (c) => c.reconcile.pageMaxBytes,
      env: { RECONCILE_MAX_BYTES: "1073741824" }
    },
    { name: "RECONCILE_PAGE_RECORDS", min: 1, max: 100, def: 100, get: (c) => c.reconcile.pageRecords },
    { name: "RECONCILE_MAX_PAGES", min: 1, max: 1000, def: 20, get: (c) => c.reconcile.maxPages },
    { name: "RECONCILE_MAX_RECORDS", min: 1, max: 100_000, def: 1000, get: (c) => c.reconcile.maxRecords },
    {
      name: "RECONCILE_MAX_BYTES",
      min: 65_536,
      max: 1_073_741_824,
      def: 10_485_760,
      get: (c) => c.reconcile.maxBytes,
      env: { RECONCILE_PAGE_MAX_BYTES: "65536" }
    },
    { name: "PRIOR_REFS_TTL_MS", min: 3_600_000, max: 31_536_000_000, def: 604_800_000, get: (c) => c.priorRefs.ttlMs },
    { name: "PRIOR_REFS_MAX_ROWS", min: 1_000, max: 10_000_000, def: 100_000, get: (c) => c.priorRefs.maxRows }
  ]

  for (const k of knobs) {
    it.effect(`${k.name}: default ${k.def}, accepts ${k.min} and ${k.max}`, () =>
      Effect.gen(function*() {
        expect(k.get(yield* load({ ...k.env }))).toBe(k.def)
        expect(k.get(yield* load({ ...k.env, [k.name]: "" }))).toBe(k.def)
        expect(k.get(yield* load({ ...k.env, [k.name]: String(k.min) }))).toBe(k.min)
        expect(k.get(yield* load({ ...k.env, [k.name]: String(k.max) }))).toBe(k.max)
      }))
  }

  it.effect("WEBHOOK_INTAKE_BACKOFF_MAX_MS may equal WEBHOOK_INTAKE_BACKOFF_BASE_MS", () =>
    Effect.gen(function*() {
      const c = yield* load({ WEBHOOK_INTAKE_BACKOFF_BASE_MS: "600000", WEBHOOK_INTAKE_BACKOFF_MAX_MS: "600000" })
      expect([c.intake.backoffBaseMs, c.intake.backoffMaxMs]).toEqual([600000, 600000])
    }))

  it.effect("each at-least rule of §5 accepts equality", () =>
    Effect.gen(function*() {
      const c = yield* load({
        IDENTITY_CACHE_STALE_MS: "86400000",
        IDENTITY_CACHE_MAX_AGE_MS: "86400000",
        BACKFILL_RETRY_BASE_MS: "600000",
        BACKFILL_RETRY_MAX_MS: "600000",
        RECONCILE_PAGE_MAX_BYTES: "16777216",
        RECONCILE_MAX_BYTES: "16777216"
      })
      expect(c.identity).toEqual({ cacheStaleMs: 86_400_000, cacheMaxAgeMs: 86_400_000 })
      expect([c.backfill.retryBaseMs, c.backfill.retryMaxMs]).toEqual([600_000, 600_000])
      expect([c.reconcile.pageMaxBytes, c.reconcile.maxBytes]).toEqual([16_777_216, 16_777_216])
    }))

  // The ranges the SPEC states as hard (§2.6's hard max, §3.2's 1 KiB–8 MiB frame, §4.3's 1–50
  // attempts, §4.5's 100 ms–30 s, §6.3's 1–120 s, §5.2's 1–4 and §5.4's 1–2 concurrency): each end
  // is accepted, one past it is refused, so a widened range cannot pass unnoticed.
  const hard: ReadonlyArray<
    readonly [string, number, number, (c: Config.FirehookConfigShape) => number, Record<string, string>]
  > = [
    ["REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", 1, 1_000_000, (c) => c.registry.activeMax, { FIREHOSE_SOURCE: "relay" }],
    ["REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", 1, 10_000, (c) => c.registry.activeMax, { FIREHOSE_SOURCE: "jetstream" }],
    ["REGISTRY_OWNER_ACTIVE_RECORDS_MAX", 1, 10_000, (c) => c.registry.ownerActiveMax, {}],
    ["REGISTRY_DIRECT_SCOPE_DIDS_MAX", 1, 10_000, (c) => c.registry.directDidsMax, {}],
    ["REGISTRY_BACKLINK_SCOPE_DIDS_MAX", 1, 10_000, (c) => c.registry.backlinkDidsMax, {}],
    ["WEBHOOK_INTAKE_EVENT_MAX_BYTES", 1024, 8_388_608, (c) => c.intake.eventMaxBytes, {}],
    ["DELIVERY_MAX_ATTEMPTS", 1, 50, (c) => c.delivery.maxAttempts, {}],
    ["DELIVERY_TIMEOUT_MS", 100, 30_000, (c) => c.delivery.timeoutMs, {}],
    ["SHUTDOWN_TIMEOUT_MS", 1000, 120_000, (c) => c.shutdownTimeoutMs, {}],
    ["BACKFILL_CONCURRENCY", 1, 4, (c) => c.backfill.concurrency, {}],
    ["RETRY_SCHEDULER_CONCURRENCY", 1, 2, (c) => c.retryScheduler.concurrency, {}]
  ]
  for (const [name, min, max, get, base] of hard) {
    it.effect(`${name}${base["FIREHOSE_SOURCE"] === undefined ? "" : ` (${base["FIREHOSE_SOURCE"]})`}: the SPEC's hard range ${min}..${max}, ends accepted, one past refused`, () =>
      Effect.gen(function*() {
        expect(get(yield* load({ ...base, [name]: String(min) }))).toBe(min)
        expect(get(yield* load({ ...base, [name]: String(max) }))).toBe(max)
        for (const past of [min - 1, max + 1]) {
          const r = yield* Effect.either(load({ ...base, [name]: String(past) }))
          expect(Either.isLeft(r) ? r.left.variable : `accepted ${past}`).toBe(name)
        }
      }))
  }

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

  it.effect("pretty logs by default on a TTY", () =>
    Effect.gen(function*() {
      expect((yield* load({}, true)).logFormat).toBe("pretty")
      expect((yield* load({ LOG_FORMAT: "json" }, true)).logFormat).toBe("json")
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
      for (const host of ["127.0.0.1", "0.0.0.0", "10.1.2.3", "::", "::1", "fe80::1", "2001:db8::8", "localhost"]) {
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

  // SPEC §6.5 (strict parsing): a stray space or control character (`FIREHOOK_DATA_DIR=/data ` in a
  // `docker run --env-file`, which keeps trailing spaces, or in a quoted value) was taken as part of
  // the path, so the embedded PostgreSQL started empty in a new directory beside the real one, its
  // data silently left behind
  describe("FIREHOOK_DATA_DIR with surrounding whitespace or a control character is refused at startup", () => {
    const broken: ReadonlyArray<readonly [string, string]> = [
      ["a trailing space", "/var/lib/firehook "],
      ["a leading space", " /var/lib/firehook"],
      ["only a space", " "],
      ["a trailing carriage return", "/var/lib/firehook\r"],
      ["a trailing tab", "/var/lib/firehook\t"],
      ["a newline inside", "/var/lib/fire\nhook"],
      ["a NUL", "/var/lib/firehook\u0000"],
      ["a trailing no-break space", "/var/lib/firehook\u00a0"],
      ["a byte-order mark", "\ufeff/var/lib/firehook"]
    ]
    for (const [what, value] of broken) {
      it.effect(`refuses ${what}`, () =>
        Effect.gen(function*() {
          const result = yield* Effect.either(load({ FIREHOOK_DATA_DIR: value }))
          if (Either.isRight(result)) return expect.fail(`FIREHOOK_DATA_DIR with ${what} was accepted`)
          expect(result.left.variable).toBe("FIREHOOK_DATA_DIR")
          expect(result.left.message).toBe(
            "invalid configuration: FIREHOOK_DATA_DIR must be a path of at most 1024 characters, without control characters or leading or trailing whitespace"
          )
        }))
    }
    it.effect("accepts spaces and other characters inside a path, and 1024 characters", () =>
      Effect.gen(function*() {
        for (const dir of ["/srv/my data/.firehook", "./état/données", "C:/fire hook", `/${"d".repeat(1023)}`]) {
          expect((yield* load({ FIREHOOK_DATA_DIR: dir })).dataDir).toBe(dir)
        }
        const long = yield* Effect.either(load({ FIREHOOK_DATA_DIR: `/${"d".repeat(1024)}` }))
        expect(Either.isLeft(long)).toBe(true)
      }))
  })

  it.effect("an empty string counts as unset", () =>
    Effect.gen(function*() {
      const c = yield* load({ HEALTH_PORT: "", DATABASE_URL: "" })
      expect(c.healthPort).toBe(3003)
      expect(Option.isNone(c.databaseUrl)).toBe(true)
    }))

  // SPEC §6.5 (strict parsing): WHATWG URL ignores leading / trailing spaces and controls and every
  // tab and newline, so these parsed, started, and failed every request later (a stray space after
  // PLC_DIRECTORY_URL broke every did:plc owner; DATABASE_URL said "could not connect (ENOTFOUND)")
  describe("URL variables with whitespace or a control character are refused at startup", () => {
    const DEV = { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }
    const urls: ReadonlyArray<readonly [string, string, string]> = [
      // variable, a valid value, a fragment of the rule the broken value is refused with
      ["DATABASE_URL", `postgresql://postgres:${SECRET}@127.0.0.1:5432/postgres`, "whitespace or control characters"],
      ["PLC_DIRECTORY_URL", "http://127.0.0.1:18091", "https://"],
      ["OWNER_DISCOVERY_URL", "https://relay.example", "https://"],
      ["JETSTREAM_URL", "ws://127.0.0.1:6008/subscribe", "wss://"],
      ["RELAY_URL", "wss://relay.example", "wss://"],
      ["PUBLIC_URL", "https://relay.example", "whitespace or control characters"],
      ["REDIS_URL", `redis://:${SECRET}@127.0.0.1:6379/0`, "whitespace or control characters"]
    ]
    const breaks: ReadonlyArray<readonly [string, (s: string) => string]> = [
      ["a trailing space", (s) => `${s} `],
      ["a leading space", (s) => ` ${s}`],
      ["a trailing newline", (s) => `${s}\n`],
      ["a carriage return", (s) => `${s}\r`],
      ["a tab inside", (s) => s.replace("://", "://\t")],
      ["a newline inside", (s) => s.replace("127.0.0", "127.0\n.0").replace("relay.", "relay\n.")],
      ["a NUL", (s) => `${s}\u0000`],
      ["a no-break space", (s) => `${s}\u00a0`],
      ["a zero-width space", (s) => `${s}\u200b`],
      ["a byte-order mark", (s) => `\ufeff${s}`]
    ]
    for (const [variable, valid, ruleFragment] of urls) {
      it.effect(`${variable}: the valid value loads`, () =>
        Effect.gen(function*() {
          yield* load({ ...DEV, [variable]: valid })
        }))
      for (const [what, broken] of breaks) {
        it.effect(`${variable} with ${what}`, () =>
          Effect.gen(function*() {
            const result = yield* Effect.either(load({ ...DEV, [variable]: broken(valid) }))
            if (Either.isRight(result)) return expect.fail(`${variable} with ${what} was accepted`)
            expect(result.left.variable).toBe(variable)
            expect(result.left.message).toContain(ruleFragment)
            expect(result.left.message).not.toContain(SECRET)
            expect(result.left.message).not.toContain("\n")
          }))
      }
    }
  })

  // SPEC §1.2 / §6.5: insecure development mode allows ws:// and http:// to a loopback host only:
  // exactly `localhost`, an IPv4 literal in 127.0.0.0/8, or [::1]; a DNS name that starts with
  // `127.` resolves wherever its owner points it
  describe("insecure development mode: loopback means 127.0.0.0/8, [::1] or localhost, never a look-alike name", () => {
    const DEV = { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }
    const loopback = ["127.0.0.1:6008", "127.5.6.7", "localhost:2470", "LOCALHOST", "[::1]:2582", "[0:0:0:0:0:0:0:1]"]
    const forged = [
      "127.evil.example",
      "127.0.0.1.evil.example",
      "127.0.0.1.nip.io:6008",
      "127-0-0-1.evil.example",
      "localhost.evil.example",
      "evil.localhost",
      "localhost.",
      "[::ffff:127.0.0.1]",
      "[::2]",
      "128.0.0.1",
      "10.0.0.1"
    ]
    for (const host of loopback) {
      it.effect(`accepts ${host}`, () =>
        Effect.gen(function*() {
          const c = yield* load({
            ...DEV,
            JETSTREAM_URL: `ws://${host}/subscribe`,
            RELAY_URL: `ws://${host}`,
            PLC_DIRECTORY_URL: `http://${host}`,
            OWNER_DISCOVERY_URL: `http://${host}/`
          })
          expect(c.intake.jetstreamUrl).toBe(`ws://${host}/subscribe`)
        }))
    }
    const vars: ReadonlyArray<readonly [string, (host: string) => string]> = [
      ["JETSTREAM_URL", (h) => `ws://${h}/subscribe`],
      ["RELAY_URL", (h) => `ws://${h}/`],
      ["PLC_DIRECTORY_URL", (h) => `http://${h}`],
      ["OWNER_DISCOVERY_URL", (h) => `http://${h}/`]
    ]
    for (const host of forged) {
      for (const [variable, url] of vars) {
        it.effect(`refuses ${variable}=${url(host)}`, () =>
          Effect.gen(function*() {
            const result = yield* Effect.either(load({ ...DEV, [variable]: url(host) }))
            if (Either.isRight(result)) return expect.fail(`${variable}=${url(host)} was accepted as loopback`)
            expect(result.left.variable).toBe(variable)
            expect(result.left.message).toContain("loopback")
          }))
      }
    }
  })

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

  // SPEC §6.5: a list variable holds at most its bound of entries; exactly the bound is accepted,
  // one more is a startup error
  describe("list variables: exactly their bound of entries, not one more", () => {
    const cidrs = (n: number) => Array.from({ length: n }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`).join(",")
    const owners = (n: number) => Array.from({ length: n }, (_, i) => `did:web:o${i}.example.com`).join(",")

    it.effect(`DELIVERY_ALLOW_CIDRS: ${MAX_ALLOW_CIDRS} networks`, () =>
      Effect.gen(function*() {
        const c = yield* load({ DELIVERY_ALLOW_CIDRS: cidrs(MAX_ALLOW_CIDRS) })
        expect(c.delivery.allowCidrs).toHaveLength(MAX_ALLOW_CIDRS)
        const over = yield* Effect.either(load({ DELIVERY_ALLOW_CIDRS: cidrs(MAX_ALLOW_CIDRS + 1) }))
        expect(Either.isLeft(over) && over.left.variable).toBe("DELIVERY_ALLOW_CIDRS")
      }))

    it.effect(`BACKFILL_OWNERS: ${Config.MAX_BACKFILL_OWNERS} DIDs`, () =>
      Effect.gen(function*() {
        const c = yield* load({ BACKFILL_OWNERS: owners(Config.MAX_BACKFILL_OWNERS) })
        expect(c.backfill.owners).toHaveLength(Config.MAX_BACKFILL_OWNERS)
        const over = yield* Effect.either(load({ BACKFILL_OWNERS: owners(Config.MAX_BACKFILL_OWNERS + 1) }))
        expect(Either.isLeft(over) && over.left.variable).toBe("BACKFILL_OWNERS")
      }))
  })

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
