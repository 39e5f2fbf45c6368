/**
 * The one place where configuration is read (SPEC §6.5).
 *
 * Every value comes from Effect's `ConfigProvider` (the environment in production, `fromMap` in
 * tests) and is parsed strictly: integers must match `^(0|[1-9]\d*)$` and sit in a range,
 * enumerations are closed, URLs are parsed. A bad value is a `ConfigInvalid` naming the variable
 * and the rule it broke — never the value itself, so a secret can never leak through an error.
 * An empty string counts as unset (so `VAR= npm start` falls back to the default).
 */
import { Context, Effect, Either, Layer, LogLevel, Option, Redacted } from "effect"
import * as SecretBox from "../delivery/SecretBox.js"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { parseCidr } from "../../schemas/Net.js"
import { parseRedisUrl } from "../delivery/Publisher.js"
import {
  ConfigInvalid,
  HOST,
  isPostgresUrl,
  isServiceBaseUrl,
  isStreamUrl,
  notBelow,
  raw,
  readEnum,
  readInt,
  readString,
  stripTrailingSlashes
} from "./ConfigRead.js"

export { ConfigInvalid, readEnum, readInt, readString } from "./ConfigRead.js"

export type NodeEnv = "production" | "development" | "test"
export type LogFormat = "json" | "pretty"

export interface FirehookConfigShape {
  /** `DATABASE_URL`; `None` → embedded PostgreSQL. */
  readonly databaseUrl: Option.Option<Redacted.Redacted<string>>
  /** `FIREHOOK_DATA_DIR` (default `./.firehook`). The embedded database lives in `<dir>/pg`. */
  readonly dataDir: string
  readonly healthHost: string
  readonly healthPort: number
  readonly shutdownTimeoutMs: number
  readonly logLevel: LogLevel.LogLevel
  readonly logFormat: LogFormat
  readonly nodeEnv: NodeEnv
  /** `WEBHOOK_ALLOW_INSECURE_DEV=1` together with NODE_ENV development/test. */
  readonly allowInsecureDev: boolean
  readonly registry: {
    readonly activeMax: number
    readonly ownerActiveMax: number
    readonly directDidsMax: number
    readonly backlinkDidsMax: number
  }
  readonly intake: {
    readonly queueMax: number
    readonly batchMax: number
    readonly eventMaxBytes: number
    /** `FIREHOSE_SOURCE` */
    readonly source: "jetstream" | "relay"
    /** `JETSTREAM_URL` */
    readonly jetstreamUrl: string
    /** `RELAY_URL` */
    readonly relayUrl: string
    /** `WEBHOOK_INTAKE_BATCH_ATTEMPTS`: attempts of a failing batch before the stream fails (SPEC §3.3) */
    readonly batchAttempts: number
    /** `WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS`: the n-th in-place retry of a batch waits n × this */
    readonly batchRetryBaseMs: number
    /** `WEBHOOK_INTAKE_BACKOFF_BASE_MS` / `WEBHOOK_INTAKE_BACKOFF_MAX_MS`: full-jitter reconnect backoff */
    readonly backoffBaseMs: number
    readonly backoffMaxMs: number
    /** `WEBHOOK_INTAKE_POISON_BACKOFF_MS`: the least wait before reconnecting after a poison frame */
    readonly poisonBackoffMs: number
  }
  readonly delivery: {
    readonly concurrency: number
    readonly perOriginConcurrency: number
    readonly timeoutMs: number
    readonly maxAttempts: number
    readonly retryBaseMs: number
    readonly retryMaxMs: number
    /** `DELIVERY_ALLOW_CIDRS`, validated CIDR strings */
    readonly allowCidrs: ReadonlyArray<string>
    readonly circuitThreshold: number
    readonly circuitCooldownMs: number
  }
  readonly secrets: {
    /** `WEBHOOK_SECRET_ENCRYPTION_KEY` (32 bytes: base64, base64url or 64 hex) */
    readonly encryptionKey: Option.Option<Redacted.Redacted<string>>
    /** `WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS` (comma-separated, ≤ 8) */
    readonly previousKeys: Option.Option<Redacted.Redacted<string>>
  }
  readonly redis: {
    readonly url: Option.Option<Redacted.Redacted<string>>
    readonly channel: string
    /** `REDIS_PUBLISH_MAX_BYTES`: larger messages are dropped (SPEC §4.7) */
    readonly publishMaxBytes: number
    /** `REDIS_PUBLISH_MAX_IN_FLIGHT`: more are dropped */
    readonly publishMaxInFlight: number
    /** `REDIS_PUBLISH_TIMEOUT_MS`: a reply slower than this drops the message and resets the connection */
    readonly publishTimeoutMs: number
  }
  readonly maintenanceIntervalMs: number
  /** SPEC §4.9 and §3.4: what maintenance prunes (`RETENTION_*`) */
  readonly retention: {
    /** `RETENTION_DELIVERED_MS`: delivered outbox rows, by `finished_at` */
    readonly deliveredMs: number
    /** `RETENTION_DEAD_LETTER_MS` */
    readonly deadLetterMs: number
    /** `RETENTION_CANCELLED_MS` */
    readonly cancelledMs: number
    /** `RETENTION_AUDIT_MS` / `RETENTION_AUDIT_MAX_ROWS` */
    readonly auditMs: number
    readonly auditMaxRows: number
    /** `RETENTION_TOMBSTONES_MS` / `RETENTION_TOMBSTONES_MAX_ROWS` */
    readonly tombstonesMs: number
    readonly tombstonesMaxRows: number
    /** `RETENTION_QUARANTINE_MS` / `RETENTION_QUARANTINE_MAX_ROWS` */
    readonly quarantineMs: number
    readonly quarantineMaxRows: number
    /** `RETENTION_EVENT_BODIES_MS`: event bodies no outbox row references */
    readonly eventBodiesMs: number
  }
  /** SPEC §5.1–5.2: identity resolution and owner discovery for backfill */
  readonly backfill: {
    /** `PLC_DIRECTORY_URL` (no trailing slash) */
    readonly plcDirectoryUrl: string
    /** `OWNER_DISCOVERY_URL` (no trailing slash): relay answering `listReposByCollection`; None = off */
    readonly ownerDiscoveryUrl: Option.Option<string>
    /** `BACKFILL_OWNERS`: canonical DIDs always reconciled */
    readonly owners: ReadonlyArray<string>
    /** `BACKFILL_CONCURRENCY` (1..4) */
    readonly concurrency: number
    /** `BACKFILL_PAGE_SIZE`: owners per keyset page of a pass (SPEC §5.2) */
    readonly pageSize: number
    /** `BACKFILL_PASS_MAX_OWNERS`: owners per pass; a capped pass is continued by the next */
    readonly passMaxOwners: number
    /** `BACKFILL_RETRY_BASE_MS` / `BACKFILL_RETRY_MAX_MS`: backoff of a pass after an infrastructure failure (SPEC §5.3) */
    readonly retryBaseMs: number
    readonly retryMaxMs: number
  }
  /** SPEC §5.1: the identity cache */
  readonly identity: {
    /** `IDENTITY_CACHE_STALE_MS`: an older entry is served and refreshed in the background */
    readonly cacheStaleMs: number
    /** `IDENTITY_CACHE_MAX_AGE_MS` (≥ stale): an older entry is fetched again before answering */
    readonly cacheMaxAgeMs: number
  }
  /** SPEC §5.3: the bounds of one owner's reconciliation (`RECONCILE_*`) */
  readonly reconcile: {
    /** `RECONCILE_MAX_CONCURRENT_SCANS`: a scan is refused (busy) when this many other owners are scanning */
    readonly maxConcurrentScans: number
    /** `RECONCILE_PAGE_MAX_BYTES`: one listRecords response */
    readonly pageMaxBytes: number
    /** `RECONCILE_PAGE_RECORDS`: the `limit` of listRecords and the most records a page may hold */
    readonly pageRecords: number
    /** `RECONCILE_MAX_PAGES` / `RECONCILE_MAX_RECORDS` / `RECONCILE_MAX_BYTES` (≥ page bytes): one snapshot */
    readonly maxPages: number
    readonly maxRecords: number
    readonly maxBytes: number
  }
  /** SPEC §2.4: the prior-reference table (`PRIOR_REFS_*`; the per-row bounds, 100 refs and 32 KiB, stay constants) */
  readonly priorRefs: {
    /** `PRIOR_REFS_TTL_MS`: a row expires this long after its last write (maintenance deletes it) */
    readonly ttlMs: number
    /** `PRIOR_REFS_MAX_ROWS`: the table's row bound, also the bound of the in-memory key index */
    readonly maxRows: number
  }
  /** SPEC §5.4 */
  readonly retryScheduler: {
    /** `RETRY_SCHEDULER_INTERVAL_MS`: how often failed / stale owners are listed */
    readonly intervalMs: number
    /** `RETRY_SCHEDULER_BASE_MS` / `RETRY_SCHEDULER_MAX_MS`: full-jitter backoff */
    readonly baseMs: number
    readonly maxMs: number
    /** `RETRY_SCHEDULER_CONCURRENCY` (1..2) */
    readonly concurrency: number
    /** `RETRY_SCHEDULER_STALE_SCAN_MS`: a scan older than this is considered crashed */
    readonly staleScanMs: number
    /** `RETRY_SCHEDULER_TRACKED_MAX`: owners tracked at once */
    readonly trackedMax: number
  }
}

export class FirehookConfig extends Context.Tag("firehook/Config")<FirehookConfig, FirehookConfigShape>() {}

/** Bounds of the `RETENTION_*` variables: durations 1 h .. 365 d, row bounds 1,000 .. 10,000,000 (the row-bound cut is an OFFSET scan that must fit the 30 s statement bound). */
export const RETENTION_MS_MIN = 3_600_000
export const RETENTION_MS_MAX = 31_536_000_000
export const RETENTION_ROWS_MIN = 1_000
export const RETENTION_ROWS_MAX = 10_000_000

const DAY_MS = 86_400_000

/** At most this many `BACKFILL_OWNERS` entries. */
export const MAX_BACKFILL_OWNERS = 10_000

/** Comma-separated canonical DIDs (empty = none); undefined when any entry is invalid or too many. */
const parseDidList = (s: string): ReadonlyArray<string> | undefined => {
  const parts = s.split(",").map((p) => p.trim()).filter((p) => p.length > 0)
  if (parts.length > MAX_BACKFILL_OWNERS) return undefined
  for (const p of parts) if (!isCanonicalDid(p)) return undefined
  return [...new Set(parts)]
}

/** Comma-separated CIDRs (empty = none), at most 256; undefined when any entry is invalid. */
const parseCidrList = (s: string): ReadonlyArray<string> | undefined => {
  const parts = s.split(",").map((p) => p.trim()).filter((p) => p.length > 0)
  if (parts.length > 256) return undefined
  for (const p of parts) if (parseCidr(p) === undefined) return undefined
  return parts
}

const LOG_LEVELS: Record<string, LogLevel.LogLevel> = {
  trace: LogLevel.Trace,
  debug: LogLevel.Debug,
  info: LogLevel.Info,
  warn: LogLevel.Warning,
  warning: LogLevel.Warning,
  error: LogLevel.Error,
  fatal: LogLevel.Fatal,
  none: LogLevel.None
}

/**
 * Load and validate the whole configuration. `isTty` picks the default log format
 * (`pretty` on a TTY, `json` otherwise).
 */
export const load = (options: { readonly isTty: boolean }): Effect.Effect<FirehookConfigShape, ConfigInvalid> =>
  Effect.gen(function* () {
    const databaseUrl = yield* raw("DATABASE_URL").pipe(
      Effect.flatMap(
        Option.match({
          onNone: () => Effect.succeed(Option.none<Redacted.Redacted<string>>()),
          onSome: (s) =>
            isPostgresUrl(s)
              ? Effect.succeed(Option.some(Redacted.make(s)))
              : Effect.fail(
                  new ConfigInvalid({ variable: "DATABASE_URL", rule: "must be a postgres:// or postgresql:// URL" })
                )
        })
      )
    )
    const dataDir = yield* readString("FIREHOOK_DATA_DIR", "./.firehook", {
      test: (s) => s.length <= 1024 && !s.includes("\0"),
      text: "must be a path of at most 1024 characters"
    })
    const healthHost = yield* readString("HEALTH_HOST", "127.0.0.1", {
      test: (s) => HOST.test(s),
      text: "must be a host name or IP address"
    })
    const healthPort = yield* readInt("HEALTH_PORT", 3003, 0, 65535)
    const shutdownTimeoutMs = yield* readInt("SHUTDOWN_TIMEOUT_MS", 30000, 1000, 120000)
    const levelName = yield* readEnum("LOG_LEVEL", Object.keys(LOG_LEVELS), "info")
    const logLevel = LOG_LEVELS[levelName] ?? LogLevel.Info
    const logFormat = yield* readEnum<LogFormat>("LOG_FORMAT", ["json", "pretty"], options.isTty ? "pretty" : "json")
    const nodeEnv = yield* readEnum<NodeEnv>("NODE_ENV", ["production", "development", "test"], "production")
    const insecureFlag = yield* readEnum("WEBHOOK_ALLOW_INSECURE_DEV", ["0", "1"], "0")
    if (insecureFlag === "1" && nodeEnv === "production") {
      return yield* Effect.fail(
        new ConfigInvalid({ variable: "WEBHOOK_ALLOW_INSECURE_DEV", rule: "requires NODE_ENV=development or test" })
      )
    }
    const registry = {
      activeMax: yield* readInt("REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", 10000, 1, 1000000),
      ownerActiveMax: yield* readInt("REGISTRY_OWNER_ACTIVE_RECORDS_MAX", 100, 1, 10000),
      directDidsMax: yield* readInt("REGISTRY_DIRECT_SCOPE_DIDS_MAX", 10000, 1, 10000),
      backlinkDidsMax: yield* readInt("REGISTRY_BACKLINK_SCOPE_DIDS_MAX", 1024, 1, 10000)
    }
    const queueMax = yield* readInt("WEBHOOK_INTAKE_QUEUE_MAX", 512, 1, 65536)
    const batchMax = yield* readInt("WEBHOOK_INTAKE_BATCH_MAX", 128, 1, 4096)
    if (batchMax > queueMax) {
      return yield* Effect.fail(
        new ConfigInvalid({ variable: "WEBHOOK_INTAKE_BATCH_MAX", rule: "must not exceed WEBHOOK_INTAKE_QUEUE_MAX" })
      )
    }
    const eventMaxBytes = yield* readInt("WEBHOOK_INTAKE_EVENT_MAX_BYTES", 1048576, 1024, 8388608)
    // SPEC §3.3: a failing batch is tried 3 times, 250 ms × attempt apart; reconnects back off from
    // 1 s up to 5 min (full jitter); a poison frame waits at least 10 s
    const batchAttempts = yield* readInt("WEBHOOK_INTAKE_BATCH_ATTEMPTS", 3, 1, 20)
    const batchRetryBaseMs = yield* readInt("WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS", 250, 1, 60_000)
    const backoffBaseMs = yield* readInt("WEBHOOK_INTAKE_BACKOFF_BASE_MS", 1000, 100, 600_000)
    const backoffMaxMs = yield* readInt("WEBHOOK_INTAKE_BACKOFF_MAX_MS", 300_000, 100, 3_600_000)
    yield* notBelow("WEBHOOK_INTAKE_BACKOFF_MAX_MS", backoffMaxMs, "WEBHOOK_INTAKE_BACKOFF_BASE_MS", backoffBaseMs)
    const poisonBackoffMs = yield* readInt("WEBHOOK_INTAKE_POISON_BACKOFF_MS", 10_000, 1000, 3_600_000)
    const insecure = insecureFlag === "1"
    const source = yield* readEnum<"jetstream" | "relay">("FIREHOSE_SOURCE", ["jetstream", "relay"], "jetstream")
    const wsUrl = (name: string, def: string) =>
      readString(name, def, {
        test: (s) => isStreamUrl(s, insecure),
        text: insecure
          ? "must be a wss:// URL (ws:// only to a loopback host)"
          : "must be a wss:// URL (ws:// needs WEBHOOK_ALLOW_INSECURE_DEV=1 and a loopback host)"
      })
    if (source === "jetstream" && registry.activeMax > 10000) {
      return yield* Effect.fail(
        new ConfigInvalid({ variable: "REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", rule: "must be at most 10000 with FIREHOSE_SOURCE=jetstream" })
      )
    }
    const jetstreamUrl = yield* wsUrl("JETSTREAM_URL", "wss://jetstream2.us-east.bsky.network/subscribe")
    const relayUrl = yield* wsUrl("RELAY_URL", "wss://bsky.network")
    const retryBaseMs = yield* readInt("DELIVERY_RETRY_BASE_MS", 1000, 1, 3_600_000)
    const retryMaxMs = yield* readInt("DELIVERY_RETRY_MAX_MS", 300000, 1, 86_400_000)
    yield* notBelow("DELIVERY_RETRY_MAX_MS", retryMaxMs, "DELIVERY_RETRY_BASE_MS", retryBaseMs)
    const allowCidrText = yield* readString("DELIVERY_ALLOW_CIDRS", "", {
      test: (s) => parseCidrList(s) !== undefined,
      text: "must be a comma-separated list of at most 256 CIDRs (e.g. 10.0.0.0/8,fd00::/8)"
    })
    const delivery = {
      concurrency: yield* readInt("DELIVERY_CONCURRENCY", 64, 1, 1024),
      perOriginConcurrency: yield* readInt("DELIVERY_PER_ORIGIN_CONCURRENCY", 4, 1, 256),
      timeoutMs: yield* readInt("DELIVERY_TIMEOUT_MS", 10000, 100, 30000),
      maxAttempts: yield* readInt("DELIVERY_MAX_ATTEMPTS", 12, 1, 50),
      retryBaseMs,
      retryMaxMs,
      allowCidrs: parseCidrList(allowCidrText) ?? [],
      circuitThreshold: yield* readInt("DELIVERY_CIRCUIT_THRESHOLD", 20, 1, 10000),
      circuitCooldownMs: yield* readInt("DELIVERY_CIRCUIT_COOLDOWN_MS", 60000, 1000, 1_800_000)
    }
    const redacted = (name: string, test: (s: string) => boolean, rule: string) =>
      raw(name).pipe(
        Effect.flatMap(
          Option.match({
            onNone: () => Effect.succeed(Option.none<Redacted.Redacted<string>>()),
            onSome: (s) =>
              test(s)
                ? Effect.succeed(Option.some(Redacted.make(s)))
                : Effect.fail(new ConfigInvalid({ variable: name, rule }))
          })
        )
      )
    const encryptionKey = yield* redacted(
      "WEBHOOK_SECRET_ENCRYPTION_KEY",
      (s) => Either.isRight(SecretBox.parseKey(s)),
      "must be a 32-byte key as base64, base64url or 64 hex characters"
    )
    const previousKeys = yield* redacted(
      "WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS",
      (s) => Either.isRight(SecretBox.parseKeyList(s)) && s.split(",").length <= SecretBox.MAX_PREVIOUS_KEYS,
      "must be a comma-separated list of at most 8 keys (32 bytes each: base64, base64url or 64 hex)"
    )
    const redisUrl = yield* redacted(
      "REDIS_URL",
      (s) => s.length <= 2048 && Either.isRight(parseRedisUrl(s)),
      "must be a redis:// or rediss:// URL"
    )
    const channel = yield* readString("WEBHOOK_EVENTS_CHANNEL", "webhook:events", {
      test: (s) => /^[\x21-\x7e]{1,256}$/.test(s),
      text: "must be 1-256 printable characters without spaces"
    })
    // SPEC §4.7: PUBLISH ≤ 8 KiB, at most 4 in flight, 1 s reply timeout
    const publishMaxBytes = yield* readInt("REDIS_PUBLISH_MAX_BYTES", 8192, 1024, 1_048_576)
    const publishMaxInFlight = yield* readInt("REDIS_PUBLISH_MAX_IN_FLIGHT", 4, 1, 1024)
    const publishTimeoutMs = yield* readInt("REDIS_PUBLISH_TIMEOUT_MS", 1000, 100, 60_000)
    const maintenanceIntervalMs = yield* readInt("MAINTENANCE_INTERVAL_MS", 60000, 1000, 86_400_000)
    // SPEC §4.9 and §3.4
    const retentionMs = (name: string, days: number) => readInt(name, days * DAY_MS, RETENTION_MS_MIN, RETENTION_MS_MAX)
    const retentionRows = (name: string) => readInt(name, 100_000, RETENTION_ROWS_MIN, RETENTION_ROWS_MAX)
    const retention = {
      deliveredMs: yield* retentionMs("RETENTION_DELIVERED_MS", 7),
      deadLetterMs: yield* retentionMs("RETENTION_DEAD_LETTER_MS", 30),
      cancelledMs: yield* retentionMs("RETENTION_CANCELLED_MS", 7),
      auditMs: yield* retentionMs("RETENTION_AUDIT_MS", 30),
      auditMaxRows: yield* retentionRows("RETENTION_AUDIT_MAX_ROWS"),
      tombstonesMs: yield* retentionMs("RETENTION_TOMBSTONES_MS", 7),
      tombstonesMaxRows: yield* retentionRows("RETENTION_TOMBSTONES_MAX_ROWS"),
      quarantineMs: yield* retentionMs("RETENTION_QUARANTINE_MS", 30),
      quarantineMaxRows: yield* retentionRows("RETENTION_QUARANTINE_MAX_ROWS"),
      eventBodiesMs: yield* retentionMs("RETENTION_EVENT_BODIES_MS", 7)
    }
    const baseUrlRule = {
      test: (s: string) => isServiceBaseUrl(s, insecure),
      text: insecure
        ? "must be an https:// URL without credentials, query or fragment (http:// only to a loopback host)"
        : "must be an https:// URL without credentials, query or fragment"
    }
    const plcDirectoryUrl = stripTrailingSlashes(yield* readString("PLC_DIRECTORY_URL", "https://plc.directory", baseUrlRule))
    const discoveryText = yield* readString("OWNER_DISCOVERY_URL", "", {
      test: (s) => baseUrlRule.test(s),
      text: baseUrlRule.text
    })
    const ownersText = yield* readString("BACKFILL_OWNERS", "", {
      test: (s) => parseDidList(s) !== undefined,
      text: `must be a comma-separated list of at most ${MAX_BACKFILL_OWNERS} canonical DIDs (did:plc:… or did:web:…)`
    })
    const backfillConcurrency = yield* readInt("BACKFILL_CONCURRENCY", 2, 1, 4)
    // SPEC §5.2: keyset pages of 50 owners, at most 1,000 owners per pass; §5.3: a pass that failed
    // for the infrastructure is retried with backoff from 1 s up to 60 s
    const backfillPageSize = yield* readInt("BACKFILL_PAGE_SIZE", 50, 1, 1000)
    const backfillPassMaxOwners = yield* readInt("BACKFILL_PASS_MAX_OWNERS", 1000, 1, 1_000_000)
    const backfillRetryBaseMs = yield* readInt("BACKFILL_RETRY_BASE_MS", 1000, 100, 600_000)
    const backfillRetryMaxMs = yield* readInt("BACKFILL_RETRY_MAX_MS", 60_000, 100, 3_600_000)
    yield* notBelow("BACKFILL_RETRY_MAX_MS", backfillRetryMaxMs, "BACKFILL_RETRY_BASE_MS", backfillRetryBaseMs)
    const backfill = {
      plcDirectoryUrl,
      ownerDiscoveryUrl: discoveryText === "" ? Option.none<string>() : Option.some(stripTrailingSlashes(discoveryText)),
      owners: parseDidList(ownersText) ?? [],
      concurrency: backfillConcurrency,
      pageSize: backfillPageSize,
      passMaxOwners: backfillPassMaxOwners,
      retryBaseMs: backfillRetryBaseMs,
      retryMaxMs: backfillRetryMaxMs
    }
    // SPEC §5.1: identity entries are stale after 1 h and expired after 24 h
    const identityStaleMs = yield* readInt("IDENTITY_CACHE_STALE_MS", 3_600_000, 60_000, 86_400_000)
    const identityMaxAgeMs = yield* readInt("IDENTITY_CACHE_MAX_AGE_MS", 86_400_000, 60_000, 604_800_000)
    yield* notBelow("IDENTITY_CACHE_MAX_AGE_MS", identityMaxAgeMs, "IDENTITY_CACHE_STALE_MS", identityStaleMs)
    const identity = { cacheStaleMs: identityStaleMs, cacheMaxAgeMs: identityMaxAgeMs }
    // SPEC §5.3: refused when ≥ 8 other owners are scanning; pages ≤ 512 KiB and ≤ 100 records
    // (`limit=100`, listRecords' maximum); ≤ 20 pages, ≤ 1,000 records, ≤ 10 MiB per snapshot
    const reconcileMaxConcurrentScans = yield* readInt("RECONCILE_MAX_CONCURRENT_SCANS", 8, 1, 1000)
    const reconcilePageMaxBytes = yield* readInt("RECONCILE_PAGE_MAX_BYTES", 524_288, 65_536, 16_777_216)
    const reconcilePageRecords = yield* readInt("RECONCILE_PAGE_RECORDS", 100, 1, 100)
    const reconcileMaxPages = yield* readInt("RECONCILE_MAX_PAGES", 20, 1, 1000)
    const reconcileMaxRecords = yield* readInt("RECONCILE_MAX_RECORDS", 1000, 1, 100_000)
    const reconcileMaxBytes = yield* readInt("RECONCILE_MAX_BYTES", 10_485_760, 65_536, 1_073_741_824)
    yield* notBelow("RECONCILE_MAX_BYTES", reconcileMaxBytes, "RECONCILE_PAGE_MAX_BYTES", reconcilePageMaxBytes)
    const reconcile = {
      maxConcurrentScans: reconcileMaxConcurrentScans,
      pageMaxBytes: reconcilePageMaxBytes,
      pageRecords: reconcilePageRecords,
      maxPages: reconcileMaxPages,
      maxRecords: reconcileMaxRecords,
      maxBytes: reconcileMaxBytes
    }
    // SPEC §2.4: prior references expire after 7 days; the table holds at most 100,000 rows (the same
    // ranges as the RETENTION_* durations and row bounds)
    const priorRefs = {
      ttlMs: yield* readInt("PRIOR_REFS_TTL_MS", 7 * DAY_MS, RETENTION_MS_MIN, RETENTION_MS_MAX),
      maxRows: yield* readInt("PRIOR_REFS_MAX_ROWS", 100_000, RETENTION_ROWS_MIN, RETENTION_ROWS_MAX)
    }
    const schedulerBaseMs = yield* readInt("RETRY_SCHEDULER_BASE_MS", 5000, 100, 3_600_000)
    const schedulerMaxMs = yield* readInt("RETRY_SCHEDULER_MAX_MS", 3_600_000, 100, 86_400_000)
    yield* notBelow("RETRY_SCHEDULER_MAX_MS", schedulerMaxMs, "RETRY_SCHEDULER_BASE_MS", schedulerBaseMs)
    const retryScheduler = {
      intervalMs: yield* readInt("RETRY_SCHEDULER_INTERVAL_MS", 60000, 1000, 3_600_000),
      baseMs: schedulerBaseMs,
      maxMs: schedulerMaxMs,
      concurrency: yield* readInt("RETRY_SCHEDULER_CONCURRENCY", 1, 1, 2),
      staleScanMs: yield* readInt("RETRY_SCHEDULER_STALE_SCAN_MS", 900_000, 60_000, 86_400_000),
      // SPEC §5.4: at most 16 owners tracked
      trackedMax: yield* readInt("RETRY_SCHEDULER_TRACKED_MAX", 16, 1, 1024)
    }
    return {
      databaseUrl,
      dataDir,
      healthHost,
      healthPort,
      shutdownTimeoutMs,
      logLevel,
      logFormat,
      nodeEnv,
      allowInsecureDev: insecureFlag === "1",
      registry,
      intake: {
        queueMax,
        batchMax,
        eventMaxBytes,
        source,
        jetstreamUrl,
        relayUrl,
        batchAttempts,
        batchRetryBaseMs,
        backoffBaseMs,
        backoffMaxMs,
        poisonBackoffMs
      },
      delivery,
      secrets: { encryptionKey, previousKeys },
      redis: { url: redisUrl, channel, publishMaxBytes, publishMaxInFlight, publishTimeoutMs },
      maintenanceIntervalMs,
      retention,
      backfill,
      identity,
      reconcile,
      priorRefs,
      retryScheduler
    }
  })

export const layer = (options: { readonly isTty: boolean }): Layer.Layer<FirehookConfig, ConfigInvalid> =>
  Layer.effect(FirehookConfig, load(options))

/** A fixed configuration (tests and embedding programs). */
export const layerValue = (value: FirehookConfigShape): Layer.Layer<FirehookConfig> => Layer.succeed(FirehookConfig, value)
