/**
 * Shared pieces of the configuration tests (config-*.test.ts): `load` (Config.load over an
 * environment given as a map, optionally on a TTY), a secret that no error may echo, and the table of
 * numeric knobs (name, range, default, where the value lands, what else must be set) that
 * config-ranges.test.ts checks in range and config-invalid.test.ts out of it.
 */
import { ConfigProvider, Effect } from "effect"
import * as Config from "../../src/services/platform/Config.js"

export const load = (env: Record<string, string>, isTty = false) =>
  Config.load({ isTty }).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))))

export const SECRET = "s3cr3t-pa55word"

/** The new numeric knobs: name, range, default, where the value lands, and what else must be set. */
export const knobs: ReadonlyArray<{
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
