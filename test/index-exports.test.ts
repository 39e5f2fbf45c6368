/**
 * The embedders' contract (src/index.ts): the top-level namespaces, and under each the service
 * Tags, layers and `make…` constructors, stay exactly reachable; the other exported names stay too,
 * unless listed in REMOVED (each one also listed in docs/decisions.md as a 0.x API change).
 * Generated from main at 0fee1b7 before the restructure (issue 13).
 */
import { Context, Layer } from "effect"
import { describe, expect, it } from "vitest"
import * as Index from "../src/index.js"

/** Tags, layers and constructors under each namespace: never removed. */
const CORE: Record<string, ReadonlyArray<string>> = {
  // added with the owners' API (issue 15)
  Api: ["Api", "layer", "layerSql", "make"],
  ApiConfig: [],
  ApiMethods: [],
  SecretLexicon: [],
  ServiceAuth: ["make"],
  ServiceJwt: [],
  WebhookLexicon: [],
  XrpcContract: [],
  XrpcError: [],
  // at 0fee1b7
  App: ["matchingLayer", "sqlStores"],
  AtUri: [],
  Backfill: ["Backfill", "layer", "make"],
  Canonical: [],
  CircuitBreaker: ["makeCircuitBreaker"],
  Classify: [],
  Config: ["FirehookConfig", "layer", "layerValue"],
  CursorStore: ["CursorStore", "layerMemory", "layerSql"],
  Database: ["layer", "layerUrl"],
  Delivery: ["Delivery", "layer", "make"],
  DeliveryOutcomes: ["DeliveryOutcomes", "layerMemory", "layerSql"],
  DeliveryStore: ["DeliveryStore", "layerSql", "makeSql"],
  Destinations: ["Destinations", "makeResolver"],
  DidDocument: [],
  EmbeddedPg: [],
  FirehoseSource: [],
  Health: ["Health", "layer", "make"],
  Hooks: ["Hooks", "layer", "make"],
  Identity: ["Identity", "layer", "make"],
  Intake: ["Intake", "layer", "make", "makeStreamRunner"],
  Jetstream: [],
  Leader: [],
  Lifecycle: ["Lifecycle", "layer", "make"],
  Logging: ["layer"],
  Maintenance: ["Maintenance", "layer", "make", "makeRules"],
  Match: [],
  Metrics: [],
  Migrations: [],
  Net: [],
  Operator: ["Operator", "layer", "layerWith", "make", "makeWith"],
  Outbox: ["MemoryOutboxState", "OutboxStore", "layerMemory", "layerSql", "makeSql"],
  PriorRefsStore: ["PriorRefsStore", "layerMemory", "layerSql", "makeMemory", "makeSql"],
  Processor: ["Processor", "layer", "make"],
  Publisher: ["Publisher", "layer", "layerNoop", "make"],
  ReconcileStore: ["ReconcileStore", "layerSql", "makeSql"],
  Reconciler: ["Reconciler", "layer", "layerWithoutRegistry", "make"],
  Reconciliation: [],
  RecordEvent: [],
  References: [],
  Registry: ["Registry", "layer", "make"],
  RegistryStore: ["RegistryStore", "layerMemory", "layerSql", "makeMemory", "makeSql"],
  RelayFrame: [],
  RetryPolicy: [],
  RetryScheduler: ["RetryScheduler", "layer", "make"],
  SafeHttp: ["Resolver", "SafeHttp"],
  SecretBox: ["makeKeyring"],
  Secrets: ["Secrets", "make", "makeMemoryStore", "makeSqlStore"],
  Signer: [],
  Store: ["Tx"],
  Tid: [],
  Version: [],
  WebhookIndex: ["makeActiveWebhook"],
  WebhookUrl: [],
  WhRecord: [],
  Xrpc: []
}

/** Every other exported name under each namespace at 0fee1b7. */
const OTHER: Record<string, ReadonlyArray<string>> = {
  App: ["core", "deliveryLayer", "maintenanceOptions", "publisherOptions", "service"],
  AtUri: [
    "MAX_COLLECTION_LENGTH",
    "MAX_DID_LENGTH",
    "MAX_RKEY_LENGTH",
    "MAX_SCOPE_URI_LENGTH",
    "compileCollectionGlob",
    "isCanonicalDid",
    "isCollection",
    "isNsidStrict",
    "isRkey",
    "parseScopeUri"
  ],
  Backfill: [
    "DEFAULT_INFRA_RETRY_BASE",
    "DEFAULT_INFRA_RETRY_MAX",
    "DEFAULT_MAX_OWNERS_PER_PASS",
    "DEFAULT_PAGE_SIZE",
    "healthSection",
    "infrastructureBackoff"
  ],
  Canonical: [
    "CanonicalLimits",
    "buildPayload",
    "canonicalJson",
    "deliveryId",
    "eventId",
    "formatTimestamp",
    "sha256Hex",
    "subscriptionFingerprint"
  ],
  CircuitBreaker: ["defaultCircuitBreakerConfig"],
  Classify: ["classifyStatus", "failureKinds", "isRetryable", "parseHttpDate", "parseRetryAfter"],
  Config: [
    "ConfigInvalid",
    "MAX_BACKFILL_OWNERS",
    "RETENTION_MS_MAX",
    "RETENTION_MS_MIN",
    "RETENTION_ROWS_MAX",
    "RETENTION_ROWS_MIN",
    "load",
    "readEnum",
    "readInt",
    "readString"
  ],
  CursorStore: ["saveStatement"],
  Database: ["DatabaseUnavailable", "describeSqlError", "migrate"],
  Delivery: [
    "CIRCUIT_MIN_DEFER_MS",
    "CLAIM_BATCH_MAX",
    "DEFAULT_POLL_INTERVAL_MS",
    "DEFAULT_SCANNING_DEFER_MS",
    "DEFAULT_SNAPSHOT_MAX_AGE_MS",
    "DEFER_JITTER_MS",
    "HEARTBEAT_CHUNK",
    "HOLD_FACTOR",
    "LEASE_MARGIN_MS",
    "LISTEN_PROBE_EVERY",
    "LISTEN_PROBE_TRIES",
    "LOG_EVERY_MS",
    "MAX_RESPONSE_BYTES",
    "MIN_CLAIM_GAP_MS",
    "MIN_LEASE_MS",
    "ORIGIN_HOLD_FACTOR",
    "RELEASE_TIMEOUT",
    "SUBSCRIPTION_READ_MAX",
    "TRANSFORM_CACHE_MAX",
    "eventMeta"
  ],
  DeliveryStore: [
    "CANDIDATE_FACTOR",
    "CANDIDATE_MAX",
    "CLAIM_MAX",
    "COUNTS_TTL_MS",
    "COUNT_CAP",
    "RESPONSE_EXCERPT_BYTES",
    "SCAN_MAX",
    "SETTLE_BATCH_MAX",
    "SETTLE_FLUSHERS",
    "STATEMENT_TIMEOUT",
    "excerpt",
    "originKey"
  ],
  Destinations: [
    "DISCORD_CONTENT_MAX",
    "WEBHOOK_COLLECTION",
    "discordPreset",
    "eventUri",
    "isDiscordUrl",
    "isSlackUrl",
    "presets",
    "selectPreset",
    "slackPreset",
    "summarize",
    "webhookPreset",
    "webhookUri"
  ],
  DidDocument: [
    "DidDocument",
    "MAX_SERVICES",
    "PDS_SERVICE_ID_SUFFIX",
    "PDS_SERVICE_TYPE",
    "ServiceEntry",
    "pdsEndpoint"
  ],
  EmbeddedPg: ["EmbeddedPgError", "ensureDatabase", "freePort", "start"],
  FirehoseSource: [
    "DEFAULT_BUFFER_BYTES",
    "DEFAULT_BUFFER_FRAMES",
    "DEFAULT_IDLE_TIMEOUT_MS",
    "SourceError",
    "binaryAsText",
    "checkSourceUrl",
    "connectJetstream",
    "connectRelay",
    "openJetstream",
    "openRelay",
    "relayUrl"
  ],
  Health: ["CLAMP_MAX", "clamp", "router"],
  Hooks: [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_PDS",
    "HooksFailed",
    "HooksInvalid",
    "LIST_PAGE_SIZE",
    "LOGOUT_TIMEOUT",
    "MAX_IDENTIFIER_LENGTH",
    "MAX_LIST_PAGES",
    "allowInsecureDevFromEnv",
    "checkDraft",
    "checkRkey",
    "connection",
    "parseEvents",
    "parsePdsUrl",
    "summarize"
  ],
  Identity: [
    "DEFAULT_EXPIRE_AFTER",
    "DEFAULT_MAX_BACKGROUND_REFRESHES",
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_STALE_AFTER",
    "IDENTITY_MAX_RESPONSE_BYTES",
    "IDENTITY_TIMEOUT_MS",
    "IdentityError",
    "didDocumentUrl",
    "normalizePdsEndpoint"
  ],
  Intake: [
    "DIRECT_REPLAY_MAX_EXTRA",
    "INTAKE_LOCK_KEY",
    "canonicalRelay",
    "defaultTuning",
    "directReplayFrom",
    "fullJitter",
    "healthSection",
    "jetstreamItem",
    "relayItem",
    "tuningFromConfig",
    "withOpened"
  ],
  Jetstream: ["decodeJetstreamFrame", "frameError", "jetstreamUrl", "optionsUpdate", "utf8LengthExceeds"],
  Leader: ["runAsLeader"],
  Lifecycle: ["STOP_STAGES"],
  Logging: [],
  Maintenance: [
    "DEFAULT_INTERVAL",
    "DEFAULT_RETENTION",
    "MAINTENANCE_LOCK_KEY",
    "PRUNED_TABLES",
    "ZERO_PRUNE_COUNTS",
    "runOnce"
  ],
  Match: ["matchEvent", "referenceMatchesScope"],
  Metrics: ["exposition", "labelledCounter", "labelledGauge", "render"],
  Migrations: ["MIGRATIONS_TABLE", "MIGRATIONS_TIMEOUT", "MIGRATION_LOCK_KEY", "migrations", "run"],
  Net: [
    "GLOBAL_UNICAST_IPV6",
    "NON_PUBLIC_IPV4",
    "NON_PUBLIC_IPV6",
    "cidrContains",
    "classifyHost",
    "isPublicIpv4",
    "isPublicIpv6",
    "parseCidr",
    "parseIpv4",
    "parseIpv6"
  ],
  Operator: [
    "DEFAULT_LIST_LIMIT",
    "DELIVERY_STATUSES",
    "InvalidArgument",
    "MAX_ATTEMPTS_SHOWN",
    "MAX_LIST_LIMIT",
    "RECONCILE_STATUSES",
    "REPLAY_BATCH",
    "isDeliveryStatus"
  ],
  Outbox: [
    "NOTIFY_CHANNEL",
    "ORIGIN_SQL",
    "bodySize",
    "chunkEnd",
    "defaultLimits",
    "enqueue",
    "finish",
    "fitsOneChunk",
    "metrics",
    "originKey",
    "prepare",
    "rowsFor",
    "write"
  ],
  PriorRefsStore: ["writeCtes"],
  Processor: ["defaultPriorRefLimits", "priorLimitsFromConfig"],
  Publisher: [
    "DEFAULTS",
    "RESP_LIMITS",
    "RedisError",
    "RedisUrlInvalid",
    "connect",
    "encodeCommand",
    "encodeEvent",
    "fullJitterBackoff",
    "parseRedisUrl",
    "parseReply"
  ],
  ReconcileStore: ["COMPLETION_SETTLE_MS", "INITIAL_PASS", "RECONCILE_LOCK_KEY"],
  Reconciler: ["defaultLimits", "isRepoNotFound", "limitsFromConfig", "rkeyOfUri"],
  Reconciliation: ["identityLayer", "reconciliationLayer"],
  RecordEvent: ["MAX_CID_LENGTH", "isWellFormedRecordEvent"],
  References: ["MENTION_FACET_TYPE", "ReferenceLimits", "extractReferences", "formatScopeUri", "utf8Length"],
  Registry: ["isWhEvent", "toRow"],
  RegistryStore: [],
  RelayFrame: ["decodeRelayFrame", "parseTimeUs", "toJsonDataModel"],
  RetryPolicy: [
    "MAX_ATTEMPTS",
    "MIN_ATTEMPTS",
    "RETRY_AFTER_CAP_MS",
    "cappedExponentialMs",
    "defaultRetryConfig",
    "equalJitter",
    "nextDelay",
    "retryAfterDelayMs",
    "retrySchedule",
    "validateRetryConfig"
  ],
  RetryScheduler: ["DEFAULT_TRACKED_MAX", "healthSection", "retryBackoff"],
  SafeHttp: [
    "DEADLINE_TICK_MS",
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_SOCKETS_PER_HOST",
    "IDLE_SOCKET_TIMEOUT_MS",
    "MAX_ALLOW_CIDRS",
    "MAX_CONNECT_ADDRESSES",
    "MAX_REQUEST_HEADER_BYTES",
    "MAX_SOCKETS_PER_HOST_LIMIT",
    "MAX_TIMEOUT_MS",
    "PLAN_CACHE_MAX",
    "ResolveError",
    "SafeHttpError",
    "allowedAddress",
    "parseAllowCidrs",
    "planTarget"
  ],
  SecretBox: [
    "ENVELOPE_VERSION",
    "KEY_BYTES",
    "KEY_ID_LENGTH",
    "MAX_PREVIOUS_KEYS",
    "NONCE_BYTES",
    "SecretUnavailable",
    "TAG_BYTES",
    "TOKEN_PREFIX",
    "emptyKeyring",
    "generateToken",
    "keyId",
    "open",
    "parseKey",
    "parseKeyList",
    "seal",
    "sealRandom",
    "tokenFromBytes",
    "validateCallerToken"
  ],
  Secrets: [
    "DEFAULT_CACHE_CAPACITY",
    "DEFAULT_CACHE_TTL",
    "MAX_CACHE_TTL",
    "MAX_SECRETS_PER_OWNER",
    "SECRET_NAME",
    "SecretUnavailable",
    "SecretsError",
    "keyringFromConfig"
  ],
  Signer: ["WHSEC_PREFIX", "signatureHeaders", "standardWebhooksKey", "standardWebhooksSignature", "wispSignature"],
  Store: ["STORE_TIMEOUT", "StoreError", "TX_TIMEOUT", "codeOf", "storeOp", "storeOpWithin"],
  Tid: [
    "MAX_CLOCK_ID",
    "MAX_TID_MICROS",
    "TID_ALPHABET",
    "TID_LENGTH",
    "compareTid",
    "isTid",
    "tidFromMicros",
    "tidToMicros"
  ],
  Version: ["USER_AGENT", "VERSION"],
  WebhookIndex: ["WebhookIndex", "webhookKey"],
  WebhookUrl: ["MAX_WEBHOOK_URL_LENGTH", "validateWebhookUrl"],
  WhRecord: [
    "MAX_CREATED_AT_LENGTH",
    "MAX_EVENTS",
    "MAX_SECRET_ID_LENGTH",
    "MAX_SECRET_LENGTH",
    "WH_COLLECTION",
    "WH_SCOPE_TYPE",
    "isPlainObject",
    "isRfc3339DateTime",
    "sanitizeWhRecordForDelivery",
    "validateWhRecord"
  ],
  Xrpc: ["LatestCommit", "ListRecordsPage", "ReposByCollectionPage", "XrpcError", "decodeJsonBody"]
}

/** Inner names removed as duplicates since 0fee1b7, `Namespace.name` (see docs/decisions.md). */
const REMOVED: ReadonlyArray<string> = []

const namespaces = Index as unknown as Record<string, Record<string, unknown>>

describe("src/index.ts (the embedders' API)", () => {
  it("has exactly the top-level namespaces it had", () => {
    expect(Object.keys(namespaces).sort()).toEqual(Object.keys(CORE).sort())
  })

  it("keeps every service Tag, layer and make… under its namespace", () => {
    const missing: Array<string> = []
    for (const [ns, names] of Object.entries(CORE)) {
      for (const name of names) {
        const v = namespaces[ns]?.[name]
        const ok = /^(layer|make)/.test(name) ? v !== undefined : Context.isTag(v) || Layer.isLayer(v)
        if (!ok) missing.push(`${ns}.${name}`)
      }
    }
    expect(missing).toEqual([])
  })

  it("keeps every other exported name, except those listed as removed", () => {
    const missing: Array<string> = []
    for (const [ns, names] of Object.entries(OTHER)) {
      for (const name of names) {
        if (!(name in (namespaces[ns] ?? {})) && !REMOVED.includes(`${ns}.${name}`)) missing.push(`${ns}.${name}`)
      }
    }
    expect(missing).toEqual([])
  })

  it("lists as removed only names that are really gone", () => {
    const present = REMOVED.filter((q) => {
      const [ns, name] = q.split(".")
      return ns !== undefined && name !== undefined && name in (namespaces[ns] ?? {})
    })
    expect(present).toEqual([])
  })
})
