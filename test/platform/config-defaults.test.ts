/**
 * Config.load's defaults (SPEC §6.5, and the SPEC's other numbers: §2.4, §3.3, §3.4, §4.7, §4.9, §5)
 * equal the services' own defaults; pretty logs by default on a TTY; an empty string counts as
 * unset.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, LogLevel, Option } from "effect"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Reconciler from "../../src/services/reconciliation/Reconciler.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import { load } from "./config-support.js"

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

  it.effect("pretty logs by default on a TTY", () =>
    Effect.gen(function*() {
      expect((yield* load({}, true)).logFormat).toBe("pretty")
      expect((yield* load({ LOG_FORMAT: "json" }, true)).logFormat).toBe("json")
    }))

  it.effect("an empty string counts as unset", () =>
    Effect.gen(function*() {
      const c = yield* load({ HEALTH_PORT: "", DATABASE_URL: "" })
      expect(c.healthPort).toBe(3003)
      expect(Option.isNone(c.databaseUrl)).toBe(true)
    }))
})
