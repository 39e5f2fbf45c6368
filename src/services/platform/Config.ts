/**
 * The one place where configuration is composed (SPEC §6.5).
 *
 * Each domain declares its variables once — name, default, range or rule — in its own descriptor
 * module (`PlatformConfig`, `RegistryConfig`, `IntakeConfig`, `DeliveryConfig`, `OperatorConfig`,
 * `ReconciliationConfig`, `MatchingConfig`, `ApiConfig`), read with the strict readers of `ConfigRead`; services
 * take their defaults from there. `load` reads the sections in a fixed order, so the first invalid
 * variable reported is always the same one.
 *
 * Every value comes from Effect's `ConfigProvider` (the environment in production, `fromMap` in
 * tests) and is parsed strictly: integers must match `^(0|[1-9]\d*)$` and sit in a range,
 * enumerations are closed, URLs are parsed. A bad value is a `ConfigInvalid` naming the variable
 * and the rule it broke — never the value itself, so a secret can never leak through an error.
 * An empty string counts as unset (so `VAR= npm start` falls back to the default).
 */
import { Context, Effect, Layer } from "effect"
import type { LogLevel, Option, Redacted } from "effect"
import * as ApiConfig from "../api/ApiConfig.js"
import * as DeliveryConfig from "../delivery/DeliveryConfig.js"
import * as IntakeConfig from "../intake/IntakeConfig.js"
import * as MatchingConfig from "../matching/MatchingConfig.js"
import * as OperatorConfig from "../operator/OperatorConfig.js"
import * as ReconciliationConfig from "../reconciliation/ReconciliationConfig.js"
import * as RegistryConfig from "../registry/RegistryConfig.js"
import { ConfigInvalid, listenersCollide } from "./ConfigRead.js"
import type { DeliveryProcessSection } from "./DeliveryProcessConfig.js"
import * as PlatformConfig from "./PlatformConfig.js"
import type { LogFormat, NodeEnv } from "./PlatformConfig.js"
import * as RolesConfig from "./RolesConfig.js"
import type { Roles } from "./RolesConfig.js"

export {
  RETENTION_MS_MAX,
  RETENTION_MS_MIN,
  RETENTION_ROWS_MAX,
  RETENTION_ROWS_MIN
} from "../operator/OperatorConfig.js"
export { MAX_BACKFILL_OWNERS } from "../reconciliation/ReconciliationConfig.js"
export { ConfigInvalid, readEnum, readInt, readString } from "./ConfigRead.js"
export type { LogFormat, NodeEnv } from "./PlatformConfig.js"

export interface FirehookConfigShape {
  /** `DATABASE_URL`; `None` → embedded PostgreSQL. */
  readonly databaseUrl: Option.Option<Redacted.Redacted<string>>
  /** `DATABASE_PREPARED_STATEMENTS` (default `1`): frequent statements go as named prepared statements */
  readonly databasePreparedStatements: boolean
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
  /** `FIREHOOK_ROLES` (default `all`): the roles this process runs, in `RolesConfig.ROLES` order (SPEC §6.4) */
  readonly roles: Roles
  /** `DELIVERY_PROCESS` (default `auto`) and whether this process is a supervised delivery child (issue 16 item 2) */
  readonly deliveryProcess: DeliveryProcessSection
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
    /** `DELIVERY_AUTO_DISABLE_AFTER_MS` (SPEC §4.3): 0 = never auto-disable */
    readonly autoDisableAfterMs: number
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
  /** SPEC §8.1: the owners' API (`API_HOST`, `API_PORT`, `PUBLIC_URL`, `SERVICE_DID`, `API_TRUST_PROXY`) */
  readonly api: ApiConfig.ApiSection
}

export class FirehookConfig extends Context.Tag("firehook/Config")<FirehookConfig, FirehookConfigShape>() {}

/**
 * Load and validate the whole configuration. `isTty` picks the default log format
 * (`pretty` on a TTY, `json` otherwise).
 */
export const load = (options: { readonly isTty: boolean }): Effect.Effect<FirehookConfigShape, ConfigInvalid> =>
  Effect.gen(function*() {
    const platform = yield* PlatformConfig.load(options)
    const insecure = { allowInsecureDev: platform.allowInsecureDev }
    const registry = yield* RegistryConfig.load
    const intake = yield* IntakeConfig.load({ ...insecure, registry })
    const delivery = yield* DeliveryConfig.load
    const operator = yield* OperatorConfig.load
    const backfill = yield* ReconciliationConfig.loadBackfill(insecure)
    const identity = yield* ReconciliationConfig.loadIdentity
    const reconcile = yield* ReconciliationConfig.loadReconcile
    const priorRefs = yield* MatchingConfig.load
    const retryScheduler = yield* ReconciliationConfig.loadRetryScheduler
    const api = yield* ApiConfig.load(insecure)
    yield* checkListeners(platform, api)
    return {
      databaseUrl: platform.databaseUrl,
      databasePreparedStatements: platform.databasePreparedStatements,
      dataDir: platform.dataDir,
      healthHost: platform.healthHost,
      healthPort: platform.healthPort,
      shutdownTimeoutMs: platform.shutdownTimeoutMs,
      logLevel: platform.logLevel,
      logFormat: platform.logFormat,
      nodeEnv: platform.nodeEnv,
      allowInsecureDev: platform.allowInsecureDev,
      roles: platform.roles,
      deliveryProcess: platform.deliveryProcess,
      registry,
      intake,
      delivery: delivery.delivery,
      secrets: delivery.secrets,
      redis: delivery.redis,
      maintenanceIntervalMs: operator.maintenanceIntervalMs,
      retention: operator.retention,
      backfill,
      identity,
      reconcile,
      priorRefs,
      retryScheduler,
      api
    }
  })

/**
 * SPEC §6.5: the API listener (when this process runs the `api` role) must not take the health
 * listener's address: a startup error naming `API_PORT`, instead of a bind error once the health
 * listener is up.
 */
const checkListeners = (
  platform: PlatformConfig.PlatformSection,
  api: ApiConfig.ApiSection
): Effect.Effect<void, ConfigInvalid> =>
  RolesConfig.runs(platform.roles, "api") &&
    listenersCollide({ host: platform.healthHost, port: platform.healthPort }, { host: api.host, port: api.port })
    ? Effect.fail(
      new ConfigInvalid({
        variable: ApiConfig.apiPort.env,
        rule: `must differ from ${PlatformConfig.healthPort.env} when both listen on the same address`
      })
    )
    : Effect.void

export const layer = (options: { readonly isTty: boolean }): Layer.Layer<FirehookConfig, ConfigInvalid> =>
  Layer.effect(FirehookConfig, load(options))

/** A fixed configuration (tests and embedding programs). */
export const layerValue = (value: FirehookConfigShape): Layer.Layer<FirehookConfig> =>
  Layer.succeed(FirehookConfig, value)
