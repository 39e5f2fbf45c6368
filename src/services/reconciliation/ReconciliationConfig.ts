/**
 * Reconciliation's configuration (SPEC §5.1–5.4): identity resolution and its cache, backfill's
 * owner discovery and passes, the bounds of one owner's reconciliation, and the retry scheduler.
 * Each variable's name, default and range live here once. There is one loader per section:
 * `Config.load` validates `PRIOR_REFS_*` between the reconcile bounds and the retry scheduler, as it
 * always has.
 */
import { Effect, Option } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import type { FirehookConfigShape } from "../platform/Config.js"
import {
  type ConfigInvalid,
  isServiceBaseUrl,
  notBelow,
  parseCommaList,
  readIntVar,
  readIntVars,
  readString,
  readStringAll,
  stripTrailingSlashes,
  URL_MAX_LENGTH,
  urlLength
} from "../platform/ConfigRead.js"

/** At most this many `BACKFILL_OWNERS` entries. */
export const MAX_BACKFILL_OWNERS = 10_000

/** Comma-separated canonical DIDs (empty = none); undefined when any entry is invalid or too many. */
const parseDidList = (s: string): ReadonlyArray<string> | undefined => {
  const parts = parseCommaList(s, MAX_BACKFILL_OWNERS, isCanonicalDid)
  return parts === undefined ? undefined : [...new Set(parts)]
}

// SPEC §5.2: keyset pages of 50 owners, at most 1,000 owners per pass; §5.3: a pass that failed
// for the infrastructure is retried with backoff from 1 s up to 60 s
export const backfill = {
  /** no trailing slash */
  plcDirectoryUrl: { env: "PLC_DIRECTORY_URL", default: "https://plc.directory" },
  /** empty: owner discovery is off */
  ownerDiscoveryUrl: { env: "OWNER_DISCOVERY_URL", default: "" },
  owners: { env: "BACKFILL_OWNERS", default: "", max: MAX_BACKFILL_OWNERS },
  concurrency: { env: "BACKFILL_CONCURRENCY", default: 2, min: 1, max: 4 },
  pageSize: { env: "BACKFILL_PAGE_SIZE", default: 50, min: 1, max: 1000 },
  passMaxOwners: { env: "BACKFILL_PASS_MAX_OWNERS", default: 1000, min: 1, max: 1_000_000 },
  retryBaseMs: { env: "BACKFILL_RETRY_BASE_MS", default: 1000, min: 100, max: 600_000 },
  /** at least `retryBaseMs` */
  retryMaxMs: { env: "BACKFILL_RETRY_MAX_MS", default: 60_000, min: 100, max: 3_600_000 }
} as const

// SPEC §5.1: identity entries are stale after 1 h and expired after 24 h
export const identity = {
  cacheStaleMs: { env: "IDENTITY_CACHE_STALE_MS", default: 3_600_000, min: 60_000, max: 86_400_000 },
  /** at least `cacheStaleMs` */
  cacheMaxAgeMs: { env: "IDENTITY_CACHE_MAX_AGE_MS", default: 86_400_000, min: 60_000, max: 604_800_000 }
} as const

// SPEC §5.3: refused when ≥ 8 other owners are scanning; pages ≤ 512 KiB and ≤ 100 records
// (`limit=100`, listRecords' maximum); ≤ 20 pages, ≤ 1,000 records, ≤ 10 MiB per snapshot
export const reconcile = {
  maxConcurrentScans: { env: "RECONCILE_MAX_CONCURRENT_SCANS", default: 8, min: 1, max: 1000 },
  pageMaxBytes: { env: "RECONCILE_PAGE_MAX_BYTES", default: 524_288, min: 65_536, max: 16_777_216 },
  pageRecords: { env: "RECONCILE_PAGE_RECORDS", default: 100, min: 1, max: 100 },
  maxPages: { env: "RECONCILE_MAX_PAGES", default: 20, min: 1, max: 1000 },
  maxRecords: { env: "RECONCILE_MAX_RECORDS", default: 1000, min: 1, max: 100_000 },
  /** at least `pageMaxBytes` */
  maxBytes: { env: "RECONCILE_MAX_BYTES", default: 10_485_760, min: 65_536, max: 1_073_741_824 }
} as const

// SPEC §5.4
export const retryScheduler = {
  intervalMs: { env: "RETRY_SCHEDULER_INTERVAL_MS", default: 60000, min: 1000, max: 3_600_000 },
  baseMs: { env: "RETRY_SCHEDULER_BASE_MS", default: 5000, min: 100, max: 3_600_000 },
  /** at least `baseMs` */
  maxMs: { env: "RETRY_SCHEDULER_MAX_MS", default: 3_600_000, min: 100, max: 86_400_000 },
  concurrency: { env: "RETRY_SCHEDULER_CONCURRENCY", default: 1, min: 1, max: 2 },
  staleScanMs: { env: "RETRY_SCHEDULER_STALE_SCAN_MS", default: 900_000, min: 60_000, max: 86_400_000 },
  /** SPEC §5.4: at most 16 owners tracked */
  trackedMax: { env: "RETRY_SCHEDULER_TRACKED_MAX", default: 16, min: 1, max: 1024 }
} as const

/** The service base URL rule: https:// (http:// only to a loopback host in insecure development mode). */
const baseUrlRule = (insecure: boolean) => ({
  test: (s: string) => isServiceBaseUrl(s, insecure),
  text: insecure
    ? "must be an https:// URL without credentials, query or fragment (http:// only to a loopback host)"
    : "must be an https:// URL without credentials, query or fragment"
})

export const loadBackfill = (options: {
  readonly allowInsecureDev: boolean
}): Effect.Effect<FirehookConfigShape["backfill"], ConfigInvalid> =>
  Effect.gen(function*() {
    const urlRule = baseUrlRule(options.allowInsecureDev)
    const urlRules = [urlLength(URL_MAX_LENGTH), urlRule]
    const plcDirectoryUrl = stripTrailingSlashes(
      yield* readStringAll(backfill.plcDirectoryUrl.env, backfill.plcDirectoryUrl.default, urlRules)
    )
    const discoveryText = yield* readStringAll(
      backfill.ownerDiscoveryUrl.env,
      backfill.ownerDiscoveryUrl.default,
      urlRules
    )
    const ownersText = yield* readString(backfill.owners.env, backfill.owners.default, {
      test: (s) => parseDidList(s) !== undefined,
      text: `must be a comma-separated list of at most ${MAX_BACKFILL_OWNERS} canonical DIDs (did:plc:… or did:web:…)`
    })
    const concurrency = yield* readIntVar(backfill.concurrency)
    const pageSize = yield* readIntVar(backfill.pageSize)
    const passMaxOwners = yield* readIntVar(backfill.passMaxOwners)
    const retryBaseMs = yield* readIntVar(backfill.retryBaseMs)
    const retryMaxMs = yield* readIntVar(backfill.retryMaxMs)
    yield* notBelow(backfill.retryMaxMs.env, retryMaxMs, backfill.retryBaseMs.env, retryBaseMs)
    return {
      plcDirectoryUrl,
      ownerDiscoveryUrl: discoveryText === ""
        ? Option.none<string>()
        : Option.some(stripTrailingSlashes(discoveryText)),
      owners: parseDidList(ownersText) ?? [],
      concurrency,
      pageSize,
      passMaxOwners,
      retryBaseMs,
      retryMaxMs
    }
  })

export const loadIdentity: Effect.Effect<FirehookConfigShape["identity"], ConfigInvalid> = readIntVars(identity).pipe(
  Effect.tap((i) => notBelow(identity.cacheMaxAgeMs.env, i.cacheMaxAgeMs, identity.cacheStaleMs.env, i.cacheStaleMs))
)

export const loadReconcile: Effect.Effect<FirehookConfigShape["reconcile"], ConfigInvalid> = readIntVars(reconcile)
  .pipe(
    Effect.tap((r) => notBelow(reconcile.maxBytes.env, r.maxBytes, reconcile.pageMaxBytes.env, r.pageMaxBytes))
  )

export const loadRetryScheduler: Effect.Effect<FirehookConfigShape["retryScheduler"], ConfigInvalid> = Effect.gen(
  function*() {
    const baseMs = yield* readIntVar(retryScheduler.baseMs)
    const maxMs = yield* readIntVar(retryScheduler.maxMs)
    yield* notBelow(retryScheduler.maxMs.env, maxMs, retryScheduler.baseMs.env, baseMs)
    return {
      intervalMs: yield* readIntVar(retryScheduler.intervalMs),
      baseMs,
      maxMs,
      concurrency: yield* readIntVar(retryScheduler.concurrency),
      staleScanMs: yield* readIntVar(retryScheduler.staleScanMs),
      trackedMax: yield* readIntVar(retryScheduler.trackedMax)
    }
  }
)
