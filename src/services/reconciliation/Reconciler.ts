/**
 * Reconciliation of one owner (SPEC §5.3): make the stored registry equal to what the owner's PDS
 * holds, fenced so that a snapshot never undoes a newer live change.
 *
 * 1. Begin ({@link ReconcileStore.begin}: advisory lock, refuse when ≥ 8 other owners are scanning,
 *    bump the generation, mark `scanning`; the generation is the token). The in-memory registry
 *    keeps the owner's pre-scan registrations: snapshot pages land in the database only.
 * 2. Resolve the PDS ({@link Identity}; a private or non-https endpoint fails here, before any PDS
 *    call; a host cooling down after a `Retry-After` fails the owner here as `pds_cooling`,
 *    PdsCooldown.ts, and a PLC directory or did:web host held after its own `Retry-After` as
 *    `identity_cooling`, Identity.ts, each with the time left). The snapshot's rev is
 *    `getLatestCommit`'s `rev`, or a TID of the scan's start when the PDS does not answer it (or
 *    timed out on it within 5 minutes); it is stored with the
 *    owner at once ({@link ReconcileStore.saveSnapshotRev}) and from then on a live write of the
 *    owner applies only if its rev is newer (SPEC §3.4). Pages
 *    of `listRecords` (limit 100, the cursor URL-encoded) are fetched through {@link SafeHttp} with
 *    every bound: 2xx; ≤ 512 KiB; Schema-valid; ≤ 100 records; each uri exactly
 *    `at://<did>/place.wisp.v2.wh/<rkey>`; cid 1–256 printable characters; no rkey twice within or
 *    across pages; a cursor non-empty, ≤ 2048 characters and never repeated; ≤ 20 pages; ≤ 1,000
 *    records; ≤ 10 MiB. Only a page without a cursor ends the snapshot: an empty page with a cursor
 *    is followed (and counts toward the 20). Records that fail `validateWhRecord` are omitted
 *    (counted); `400 InvalidRequest "Could not find repo: <did>"` or `RepoNotFound` on the first
 *    page is an empty snapshot (and the identity is invalidated: the account may have moved).
 *    Anything else fails the owner.
 * 3. Each page is applied in its own fenced transaction ({@link ReconcileStore.applyPage}).
 * 4. Completion in small durable transactions: rows the snapshot did not contain are deleted (≤ 100
 *    per transaction) leaving tombstones at the snapshot's rev; tombstones older than the snapshot and
 *    past their retention are pruned; then `complete` is marked and, in the same transaction (holding
 *    the owner row lock, so no live write of the owner interleaves), the owner's in-memory
 *    registrations are swapped for the reconciled set in one step.
 * 5. A failure marks the owner `failed` (count and kind): its registrations stay as they were, and
 *    the RetryScheduler tries again. An interrupted scan is marked failed (`interrupted`, within
 *    2 s); a scan that dies (a defect) is marked failed (`internal`).
 *
 * The whole scan (steps 2–5, after the begin) has a deadline of half `RETRY_SCHEDULER_STALE_SCAN_MS`
 * ({@link scanDeadlineMs}): past it the scan is cut (as an interruption cuts it: its open
 * transaction rolls back) and the owner fails as `pds_timeout`. A scan still running when the
 * stale-scan check comes (`scanning` longer than the threshold) would be taken for a crashed one,
 * marked `scan_crashed` and fenced off: each of its retries would meet the same slow PDS and end
 * `superseded`, and the owner would never complete nor fail for what it is.
 *
 * A `StoreError` is an infrastructure failure: it is returned to the caller (the backfill pass
 * retries from its continuation). A scan it ended is marked failed (`database_error`) once the
 * database answers again ({@link FailureMarks}), as is an interrupted scan whose mark could not be
 * written in time: the owner does not stay `scanning` (its deliveries deferred) until a rescan.
 * This module logs the DID at debug level only (Reactivations.ts logs a requested scan's DID at
 * info, as docs/operations.md says), and never URLs or record bodies.
 */
import { Clock, Context, Duration, Effect, Layer, Metric, Option } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { parseCidrs } from "../../schemas/Net.js"
import { FirehookConfig, type FirehookConfigShape } from "../platform/Config.js"
import { MAX_SERVICE_URL_LENGTH, SafeHttp } from "../platform/http/SafeHttp.js"
import type { StoreError } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { USER_AGENT } from "../platform/Version.js"
import { Registry } from "../registry/Registry.js"
import * as FailureMarks from "./FailureMarks.js"
import { Identity, IDENTITY_ERROR_KINDS } from "./Identity.js"
import * as PdsCooldown from "./PdsCooldown.js"
import * as Metrics from "./ReconcileMetrics.js"
import { ReconcileStore } from "./ReconcileStore.js"
import * as ReconciliationConfig from "./ReconciliationConfig.js"
import { OwnerFailure, scan, type ScanDeps } from "./Snapshot.js"

// ---------------------------------------------------------------------------------------------
// Outcomes

/** Why an owner's reconciliation failed (stored as `last_failure_kind`; never a detail). */
export const OWNER_FAILURE_KINDS = [
  ...IDENTITY_ERROR_KINDS,
  "pds_timeout",
  "pds_network",
  "pds_status",
  /** not asked: its PDS asked for time (429/503 with Retry-After to another owner's page) and it has not passed */
  "pds_cooling",
  /**
   * not looked up: the DID document's host (the PLC directory, a did:web host) asked for time
   * (429/503 with Retry-After to another DID's lookup) and it has not passed
   */
  "identity_cooling",
  "page_too_large",
  "page_invalid",
  "page_records",
  "record_uri",
  "record_cid",
  "duplicate_rkey",
  "cursor",
  "too_many_pages",
  /** "repo not found" from a PDS that is no longer the owner's (a cached identity); retried */
  "pds_moved",
  /** a scan found `scanning` past the stale threshold (its process died); set by the retry scheduler's listing */
  "scan_crashed",
  "too_many_records",
  "too_many_bytes",
  "too_many_rows",
  "interrupted",
  /** the database failed mid-scan (written once it answers again) */
  "database_error",
  /** an unexpected defect (a bug) while reconciling; logged, never with details */
  "internal"
] as const
export type OwnerFailureKind = (typeof OWNER_FAILURE_KINDS)[number]

export type ReconcileOutcome =
  | {
    readonly _tag: "complete"
    /** records the PDS listed (valid or not) */
    readonly records: number
    /** records omitted because they failed validation */
    readonly invalid: number
    /** rows written from the snapshot */
    readonly written: number
    /** rows deleted because the snapshot did not contain them */
    readonly deleted: number
    readonly pages: number
    /** false: the PDS said the repo does not exist (empty snapshot) */
    readonly repoFound: boolean
  }
  | {
    readonly _tag: "failed"
    readonly kind: OwnerFailureKind
    /**
     * the PDS's `Retry-After` in ms, when it answered a page with 429 or 503 and one, or what was
     * left of it when the scan did not ask the PDS (`pds_cooling`); likewise the DID document
     * host's (`identity_unavailable` with the header, `identity_cooling`): the retry scheduler
     * waits at least this long before trying the owner again (absent otherwise)
     */
    readonly retryAfterMs?: number
  }
  /** not begun: too many other owners are scanning */
  | { readonly _tag: "busy" }
  /** a newer scan (or a mark from elsewhere) fenced this one off; nothing more was written */
  | { readonly _tag: "superseded" }

export interface ReconcilerStats {
  readonly completed: number
  readonly failed: number
  readonly busy: number
  readonly superseded: number
  readonly invalidRecords: number
}

export interface ReconcilerShape {
  readonly reconcile: (did: string) => Effect.Effect<ReconcileOutcome, StoreError>
  readonly stats: Effect.Effect<ReconcilerStats>
}

export class Reconciler extends Context.Tag("firehook/Reconciler")<Reconciler, ReconcilerShape>() {}

// ---------------------------------------------------------------------------------------------
// Limits

export interface ReconcileLimits {
  readonly maxPages: number
  readonly maxRecords: number
  readonly maxPageRecords: number
  readonly maxPageBytes: number
  readonly maxTotalBytes: number
  readonly maxCursorLength: number
  readonly maxCidLength: number
  /** begin refuses when this many other owners are scanning */
  readonly maxOtherScanning: number
  /** rows deleted / tombstones pruned per completion transaction */
  readonly batchSize: number
  /** completion gives up (owner failed) after this many batches */
  readonly maxBatches: number
  /** tombstones younger than this are kept (replays may still carry their records) */
  readonly tombstoneRetentionMs: number
  readonly timeoutMs: number
  /** getLatestCommit response bound */
  readonly maxCommitBytes: number
  /** bound on the best-effort `interrupted` mark */
  readonly interruptMarkTimeoutMs: number
  /** a getLatestCommit rev further ahead of our clock than this is not trusted */
  readonly maxFutureRevMs: number
  /** a failure mark the database did not take is retried from this delay … */
  readonly failureMarkRetryBaseMs: number
  /** … to this one (jittered, for at most the stale-scan threshold) */
  readonly failureMarkRetryMaxMs: number
  /** owners whose failure mark waits for the database, at most */
  readonly failureMarksMax: number
}

export const defaultLimits: ReconcileLimits = {
  maxPages: ReconciliationConfig.reconcile.maxPages.default,
  maxRecords: ReconciliationConfig.reconcile.maxRecords.default,
  maxPageRecords: ReconciliationConfig.reconcile.pageRecords.default,
  maxPageBytes: ReconciliationConfig.reconcile.pageMaxBytes.default,
  maxTotalBytes: ReconciliationConfig.reconcile.maxBytes.default,
  maxCursorLength: 2048,
  maxCidLength: 256,
  maxOtherScanning: ReconciliationConfig.reconcile.maxConcurrentScans.default,
  batchSize: 100,
  maxBatches: 10_000,
  tombstoneRetentionMs: 7 * 24 * 3600 * 1000,
  timeoutMs: 10_000,
  maxCommitBytes: 1024 * 1024,
  interruptMarkTimeoutMs: 2_000,
  maxFutureRevMs: 5 * 60 * 1000,
  failureMarkRetryBaseMs: 1_000,
  failureMarkRetryMaxMs: 60_000,
  failureMarksMax: 1_024
}

/**
 * A scan's deadline (after its begin): half the stale-scan threshold, so that a scan still running
 * is never taken for a crashed one (`scan_crashed`, RetryScheduler); the other half covers the begin,
 * the failure mark and the database's clock being read at different moments.
 */
export const scanDeadlineMs = (staleScanMs: number): number => Math.max(1, Math.floor(staleScanMs / 2))

/**
 * The limits of a configuration (`RECONCILE_*`, SPEC §5.3, and `RETENTION_TOMBSTONES_MS`, which
 * step 4's prune of the owner's tombstones honours as maintenance does; their defaults are those of
 * {@link defaultLimits}); the others are {@link defaultLimits}'.
 */
export const limitsFromConfig = (
  reconcile: FirehookConfigShape["reconcile"],
  retention?: Pick<FirehookConfigShape["retention"], "tombstonesMs">
): ReconcileLimits => ({
  ...defaultLimits,
  maxOtherScanning: reconcile.maxConcurrentScans,
  maxPageBytes: reconcile.pageMaxBytes,
  maxPageRecords: reconcile.pageRecords,
  maxPages: reconcile.maxPages,
  maxRecords: reconcile.maxRecords,
  maxTotalBytes: reconcile.maxBytes,
  ...(retention === undefined ? {} : { tombstoneRetentionMs: retention.tombstonesMs })
})

// ---------------------------------------------------------------------------------------------
// Pure helpers (in Snapshot.ts; re-exported here)

export { isRepoNotFound, rkeyOfUri } from "./Snapshot.js"

// ---------------------------------------------------------------------------------------------
// The service

export interface ReconcilerOptions {
  readonly limits?: Partial<ReconcileLimits>
  /** the in-memory swap run at completion (inside the completing transaction) */
  readonly swap: (did: string) => Effect.Effect<void, StoreError>
  /**
   * log an owner's failure as a warning (once a minute per kind; default true); the CLI, which
   * prints each outcome itself, turns it off
   */
  readonly warnFailures?: boolean
}

export const make = (options: ReconcilerOptions) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const http = yield* SafeHttp
    const identity = yield* Identity
    const store = yield* ReconcileStore
    const limits: ReconcileLimits = { ...limitsFromConfig(config.reconcile, config.retention), ...options.limits }
    const validateOpts = {
      allowInsecureDev: config.allowInsecureDev,
      allowCidrs: parseCidrs(config.delivery.allowCidrs)
    }
    const headers = { accept: "application/json", "user-agent": USER_AGENT }
    const stats = { completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 }
    // an owner's failure is logged at debug with its DID; at warn, once a minute per kind, without
    // (many owners of one dead PDS fail together): an operator at `info` sees that owners fail
    const failedLog = RateLimitedLog.make()

    const get = (url: string, maxResponseBytes: number) =>
      http.request({
        url,
        method: "GET",
        headers,
        timeoutMs: limits.timeoutMs,
        maxResponseBytes,
        // the query carries the DID and a cursor of up to 2,048 characters each (SPEC §5.3)
        maxUrlLength: MAX_SERVICE_URL_LENGTH
      })
    const deps: ScanDeps = {
      identity,
      store,
      limits,
      validateOpts,
      get,
      swap: options.swap,
      cooldown: PdsCooldown.make(),
      commitStalls: PdsCooldown.make()
    }
    const deadlineMs = scanDeadlineMs(config.retryScheduler.staleScanMs)
    const lateMarks = yield* FailureMarks.make(store, {
      baseMs: limits.failureMarkRetryBaseMs,
      capMs: limits.failureMarkRetryMaxMs,
      giveUpAfterMs: config.retryScheduler.staleScanMs,
      maxPending: limits.failureMarksMax
    })

    const count = (outcome: ReconcileOutcome) =>
      Effect.gen(function*() {
        yield* Metric.increment(Metrics.reconcileOwners({ outcome: outcome._tag }))
        switch (outcome._tag) {
          case "complete":
            stats.completed++
            stats.invalidRecords += outcome.invalid
            if (outcome.invalid > 0) yield* Metric.incrementBy(Metrics.reconcileInvalidRecords, outcome.invalid)
            break
          case "failed":
            stats.failed++
            yield* Metric.increment(Metrics.reconcileFailures({ kind: outcome.kind }))
            break
          case "busy":
            stats.busy++
            break
          case "superseded":
            stats.superseded++
            break
        }
      })

    const reconcile = (did: string): Effect.Effect<ReconcileOutcome, StoreError> =>
      Effect.gen(function*() {
        if (!isCanonicalDid(did)) return { _tag: "failed", kind: "invalid_did" } as const
        const begun = yield* store.begin(did, {
          maxOtherScanning: limits.maxOtherScanning,
          staleScanMs: config.retryScheduler.staleScanMs
        })
        if (begun._tag === "busy") return begun
        const token = begun.token
        // the scan's start by the database's clock (the fallback snapshot rev is a TID of it, and
        // every live write not newer than that rev is fenced off): a process whose clock is ahead
        // would fence off the owner's changes made after the scan, for as long as its lead
        const startMicros = Math.floor((begun.startedAtMs ?? (yield* Clock.currentTimeMillis)) * 1000)
        // bounded; when the database does not take it in time, written once it answers again
        const markInterrupted = Effect.interruptible(store.markFailed(did, token, "interrupted")).pipe(
          Effect.timeoutFail({ duration: Duration.millis(limits.interruptMarkTimeoutMs), onTimeout: () => "timeout" }),
          Effect.catchAll(() => lateMarks.defer(did, token, "interrupted"))
        )
        const result: ReconcileOutcome = yield* scan(deps, did, token, startMicros).pipe(
          // bounded as a whole (a slow PDS answering each request within its own timeout, up to 20
          // pages): it ends before the stale-scan check could take it for a crashed scan
          Effect.timeoutFail({
            duration: Duration.millis(deadlineMs),
            onTimeout: () => new OwnerFailure({ kind: "pds_timeout" })
          }),
          // the database failed mid-scan: the owner must not stay `scanning`; the error still goes
          // to the caller (an infrastructure failure)
          Effect.tapErrorTag("StoreError", () => lateMarks.defer(did, token, "database_error")),
          Effect.catchTag("OwnerFailure", (e) =>
            store.markFailed(did, token, e.kind).pipe(
              Effect.tapError(() => lateMarks.defer(did, token, e.kind)),
              Effect.as(
                e.retryAfterMs === undefined
                  ? ({ _tag: "failed", kind: e.kind } as const)
                  : ({ _tag: "failed", kind: e.kind, retryAfterMs: e.retryAfterMs } as const)
              )
            )),
          // a defect (a bug, or input nothing checked) fails the owner like any failure (SPEC §5.3
          // step 5) instead of leaving it `scanning` (its deliveries deferred, a scan slot taken)
          // until the stale-scan check
          Effect.catchAllDefect(() =>
            Effect.logError("owner reconciliation died unexpectedly").pipe(
              Effect.zipRight(store.markFailed(did, token, "internal")),
              Effect.tapError(() => lateMarks.defer(did, token, "internal")),
              Effect.as({ _tag: "failed", kind: "internal" } as const)
            )
          ),
          Effect.onInterrupt(() => markInterrupted)
        )
        return result
      }).pipe(
        Effect.tap((outcome) =>
          Effect.zipRight(
            Effect.zipRight(
              count(outcome),
              outcome._tag === "failed" && options.warnFailures !== false
                ? failedLog.run(outcome.kind, (suppressed) =>
                  Effect.logWarning("owner reconciliation failed").pipe(
                    Effect.annotateLogs({ kind: outcome.kind, suppressed })
                  ))
                : Effect.void
            ),
            Effect.logDebug("owner reconciliation").pipe(
              Effect.annotateLogs({
                did,
                outcome: outcome._tag,
                ...(outcome._tag === "failed" ? { kind: outcome.kind } : {}),
                ...(outcome._tag === "complete"
                  ? { records: outcome.records, invalid: outcome.invalid, deleted: outcome.deleted }
                  : {})
              })
            )
          )
        ),
        Effect.withSpan("Reconciler.reconcile")
      )

    const shape: ReconcilerShape = { reconcile, stats: Effect.sync(() => ({ ...stats })) }
    return shape
  })

/**
 * The reconciler, swapping completed owners into the in-memory {@link Registry} when the process
 * has one (it runs intake). Without one (a `reconcile` process, SPEC §6.4) completion writes the
 * store only, and the intake leader follows it (RegistrySync).
 */
export const layer = (
  limits: Partial<ReconcileLimits> = {}
): Layer.Layer<Reconciler, never, FirehookConfig | SafeHttp | Identity | ReconcileStore> =>
  Layer.scoped(
    Reconciler,
    Effect.flatMap(Effect.serviceOption(Registry), (registry) =>
      make({
        limits,
        swap: Option.isSome(registry) ? (did) => registry.value.swapOwner(did) : () => Effect.void
      }))
  )

/**
 * The reconciler without an in-memory registry (the CLI): completion writes the database only; a
 * running service picks the completed owner up within one RetryScheduler interval. Its caller
 * reports each outcome itself: failures are not logged as warnings.
 */
export const layerWithoutRegistry = (
  limits: Partial<ReconcileLimits> = {}
): Layer.Layer<Reconciler, never, FirehookConfig | SafeHttp | Identity | ReconcileStore> =>
  Layer.scoped(Reconciler, make({ limits, swap: () => Effect.void, warnFailures: false }))
