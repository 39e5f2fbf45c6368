/**
 * Reconciliation of one owner (SPEC §5.3): make the stored registry equal to what the owner's PDS
 * holds, fenced so that a snapshot never undoes a newer live change.
 *
 * 1. Begin ({@link ReconcileStore.begin}: advisory lock, refuse when ≥ 8 other owners are scanning,
 *    bump the generation, mark `scanning`; the generation is the token). The in-memory registry
 *    keeps the owner's pre-scan registrations: snapshot pages land in the database only.
 * 2. Resolve the PDS ({@link Identity}; a private or non-https endpoint fails here, before any PDS
 *    call). The snapshot's rev is `getLatestCommit`'s `rev`, or a TID of the scan's start when the PDS
 *    does not answer it. Pages of `listRecords` (limit 100, the cursor URL-encoded) are fetched through
 *    {@link SafeHttp} with every bound: 2xx; ≤ 512 KiB; Schema-valid; ≤ 100 records; each uri exactly
 *    `at://<did>/place.wisp.v2.wh/<rkey>`; cid 1–256 printable characters; no rkey twice within or
 *    across pages; a cursor non-empty, ≤ 2048 characters and never repeated; ≤ 20 pages; ≤ 1,000
 *    records; ≤ 10 MiB. Records that fail `validateWhRecord` are omitted (counted); `400 InvalidRequest
 *    "Could not find repo: <did>"` or `RepoNotFound` on the first page is an empty snapshot (and the
 *    identity is invalidated: the account may have moved). Anything else fails the owner.
 * 3. Each page is applied in its own fenced transaction ({@link ReconcileStore.applyPage}).
 * 4. Completion in small durable transactions: rows the snapshot did not contain are deleted (≤ 100
 *    per transaction) leaving tombstones at the snapshot's rev; tombstones older than the snapshot and
 *    past their retention are pruned; then `complete` is marked and, in the same transaction (holding
 *    the owner row lock, so no live write of the owner interleaves), the owner's in-memory
 *    registrations are swapped for the reconciled set in one step.
 * 5. A failure marks the owner `failed` (count and kind): its registrations stay as they were, and
 *    the RetryScheduler tries again. An interrupted scan is marked failed (`interrupted`), best effort.
 *
 * A `StoreError` is an infrastructure failure: it is returned to the caller (the backfill pass
 * retries from its continuation); the owner may stay `scanning` until a later scan supersedes it.
 * Logs carry the DID at debug level only, and never URLs or record bodies.
 */
import { USER_AGENT } from "../platform/Version.js"
import { Clock, Context, Data, Duration, Effect, Either, Layer, Metric } from "effect"
import { isCanonicalDid, isRkey } from "../../schemas/AtUri.js"
import { isTid, tidFromMicros, tidToMicros } from "../../schemas/Tid.js"
import { validateWhRecord, WH_COLLECTION } from "../../schemas/WhRecord.js"
import { decodeJsonBody, LatestCommit, ListRecordsPage, XrpcError } from "../../schemas/Xrpc.js"
import { FirehookConfig, type FirehookConfigShape } from "../platform/Config.js"
import { IDENTITY_ERROR_KINDS, Identity } from "./Identity.js"
import { ReconcileStore } from "./ReconcileStore.js"
import { Registry, toRow } from "../registry/Registry.js"
import type { WebhookRow } from "../registry/RegistryStore.js"
import { SafeHttp, type SafeHttpError, type SafeResponse } from "../platform/http/SafeHttp.js"
import type { StoreError } from "../platform/Persistence.js"

// ---------------------------------------------------------------------------------------------
// Outcomes

/** Why an owner's reconciliation failed (stored as `last_failure_kind`; never a detail). */
export const OWNER_FAILURE_KINDS = [
  ...IDENTITY_ERROR_KINDS,
  "pds_timeout",
  "pds_network",
  "pds_status",
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
  | { readonly _tag: "failed"; readonly kind: OwnerFailureKind }
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
}

export const defaultLimits: ReconcileLimits = {
  maxPages: 20,
  maxRecords: 1_000,
  maxPageRecords: 100,
  maxPageBytes: 512 * 1024,
  maxTotalBytes: 10 * 1024 * 1024,
  maxCursorLength: 2048,
  maxCidLength: 256,
  maxOtherScanning: 8,
  batchSize: 100,
  maxBatches: 10_000,
  tombstoneRetentionMs: 7 * 24 * 3600 * 1000,
  timeoutMs: 10_000,
  maxCommitBytes: 1024 * 1024,
  interruptMarkTimeoutMs: 2_000,
  maxFutureRevMs: 5 * 60 * 1000
}

/**
 * The limits of a configuration (`RECONCILE_*`; their defaults are those of {@link defaultLimits},
 * SPEC §5.3); the others are {@link defaultLimits}'.
 */
export const limitsFromConfig = (reconcile: FirehookConfigShape["reconcile"]): ReconcileLimits => ({
  ...defaultLimits,
  maxOtherScanning: reconcile.maxConcurrentScans,
  maxPageBytes: reconcile.pageMaxBytes,
  maxPageRecords: reconcile.pageRecords,
  maxPages: reconcile.maxPages,
  maxRecords: reconcile.maxRecords,
  maxTotalBytes: reconcile.maxBytes
})

// ---------------------------------------------------------------------------------------------
// Metrics

const outcomes = Metric.counter("firehook_reconcile_owners_total", {
  description: "Owner reconciliations, by outcome (complete, failed, busy, superseded)"
})
const failures = Metric.counter("firehook_reconcile_failures_total", {
  description: "Failed owner reconciliations, by failure kind"
})
const invalidRecordsMetric = Metric.counter("firehook_reconcile_invalid_records_total", {
  description: "Records omitted from PDS snapshots because they failed validation"
})
const pagesMetric = Metric.counter("firehook_reconcile_pages_total", {
  description: "listRecords pages fetched"
})

// ---------------------------------------------------------------------------------------------
// Pure helpers

class OwnerFailure extends Data.TaggedError("OwnerFailure")<{ readonly kind: OwnerFailureKind }> {}

const ownerFail = (kind: OwnerFailureKind) => Effect.fail(new OwnerFailure({ kind }))

const CID = /^[\x21-\x7e]+$/

/** The rkey of a listRecords uri if it is exactly `at://<did>/place.wisp.v2.wh/<rkey>`. */
export const rkeyOfUri = (uri: string, did: string): string | undefined => {
  const prefix = `at://${did}/${WH_COLLECTION}/`
  if (!uri.startsWith(prefix)) return undefined
  const rkey = uri.slice(prefix.length)
  return isRkey(rkey) ? rkey : undefined
}

/** `400 InvalidRequest "Could not find repo: <did>"`, or `RepoNotFound` (400/404): the repo is absent. */
export const isRepoNotFound = (response: SafeResponse, did: string): boolean => {
  if (response.status !== 400 && response.status !== 404) return false
  const body = decodeJsonBody(XrpcError, response.body)
  if (body === undefined) return false
  if (body.error === "RepoNotFound") return true
  return response.status === 400 && body.error === "InvalidRequest" && body.message === `Could not find repo: ${did}`
}

/**
 * Whether PostgreSQL can store the row: no NUL and no lone surrogate in any string (JSON.stringify
 * escapes both; `jsonb` and `text` refuse them). Such a record is omitted like an invalid one.
 */
const STORABLE_ESCAPE = /\\u(0000|d[89a-f][0-9a-f]{2})/i
const isStorable = (row: WebhookRow): boolean => !STORABLE_ESCAPE.test(JSON.stringify(row.record))

const httpFailure = (e: SafeHttpError): OwnerFailureKind => {
  switch (e.kind) {
    case "timeout":
      return "pds_timeout"
    case "response_too_large":
      return "page_too_large"
    case "blocked_target":
    case "invalid_target":
      return "pds_unsafe"
    default:
      return "pds_network"
  }
}

const q = encodeURIComponent

// ---------------------------------------------------------------------------------------------
// The service

export interface ReconcilerOptions {
  readonly limits?: Partial<ReconcileLimits>
  /** the in-memory swap run at completion (inside the completing transaction) */
  readonly swap: (did: string) => Effect.Effect<void, StoreError>
}

export const make = (options: ReconcilerOptions) =>
  Effect.gen(function* () {
    const config = yield* FirehookConfig
    const http = yield* SafeHttp
    const identity = yield* Identity
    const store = yield* ReconcileStore
    const limits: ReconcileLimits = { ...limitsFromConfig(config.reconcile), ...options.limits }
    const validateOpts = { allowInsecureDev: config.allowInsecureDev }
    const headers = { accept: "application/json", "user-agent": USER_AGENT }
    const stats = { completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 }

    const get = (url: string, maxResponseBytes: number) =>
      http.request({ url, method: "GET", headers, timeoutMs: limits.timeoutMs, maxResponseBytes })

    /**
     * getLatestCommit's rev, or a TID of the scan's start when the PDS does not answer it (or
     * answers a rev more than `maxFutureRevMs` ahead of our clock, which would fence the owner's
     * live changes until then).
     */
    const snapshotRevOf = (pds: string, did: string, startMicros: number) =>
      get(`${pds}/xrpc/com.atproto.sync.getLatestCommit?did=${q(did)}`, limits.maxCommitBytes).pipe(
        Effect.map((res) => {
          if (res.status < 200 || res.status > 299) return undefined
          const commit = decodeJsonBody(LatestCommit, res.body)
          if (commit === undefined || !isTid(commit.rev)) return undefined
          const micros = tidToMicros(commit.rev)
          return micros !== undefined && micros <= startMicros + limits.maxFutureRevMs * 1000 ? commit.rev : undefined
        }),
        Effect.catchAll(() => Effect.succeed(undefined)),
        Effect.map((rev) => rev ?? tidFromMicros(startMicros))
      )

    const listUrl = (pds: string, did: string, cursor: string | undefined) =>
      `${pds}/xrpc/com.atproto.repo.listRecords?repo=${q(did)}&collection=${q(WH_COLLECTION)}&limit=${limits.maxPageRecords}` +
      (cursor === undefined ? "" : `&cursor=${q(cursor)}`)

    /** Steps 2–5 after a successful begin. */
    const scan = (did: string, token: number, startMicros: number) =>
      Effect.gen(function* () {
        const pds = yield* identity.resolvePds(did).pipe(Effect.mapError((e) => new OwnerFailure({ kind: e.kind })))
        const snapshotRev = yield* snapshotRevOf(pds, did, startMicros)
        const rkeys = new Set<string>()
        const cursors = new Set<string>()
        let cursor: string | undefined = undefined
        let pages = 0
        let records = 0
        let bytes = 0
        let invalid = 0
        let written = 0
        let repoFound = true
        for (;;) {
          if (pages >= limits.maxPages) return yield* ownerFail("too_many_pages")
          const res: SafeResponse = yield* get(listUrl(pds, did, cursor), limits.maxPageBytes).pipe(
            Effect.mapError((e) => new OwnerFailure({ kind: httpFailure(e) }))
          )
          pages++
          yield* Metric.increment(pagesMetric)
          bytes += res.body.length
          if (bytes > limits.maxTotalBytes) return yield* ownerFail("too_many_bytes")
          if (res.status < 200 || res.status > 299) {
            if (pages === 1 && isRepoNotFound(res, did)) {
              // authoritative only from the owner's current PDS: the one used may come from a cache
              // (up to 24 h old) and an account that moved is "not found" on its old PDS. Resolve
              // the DID again; a different PDS fails this scan (retried against the new one)
              // instead of taking the old PDS's answer as an empty repo and deleting every row
              yield* identity.invalidate(did)
              const current = yield* identity.resolvePds(did).pipe(Effect.mapError((e) => new OwnerFailure({ kind: e.kind })))
              if (current !== pds) return yield* ownerFail("pds_moved")
              repoFound = false
              break
            }
            return yield* ownerFail("pds_status")
          }
          const page: ListRecordsPage | undefined = decodeJsonBody(ListRecordsPage, res.body)
          if (page === undefined) return yield* ownerFail("page_invalid")
          if (page.records.length > limits.maxPageRecords) return yield* ownerFail("page_records")
          records += page.records.length
          if (records > limits.maxRecords) return yield* ownerFail("too_many_records")
          const rows: Array<WebhookRow> = []
          for (const rec of page.records) {
            const rkey = rkeyOfUri(rec.uri, did)
            if (rkey === undefined) return yield* ownerFail("record_uri")
            if (rec.cid.length < 1 || rec.cid.length > limits.maxCidLength || !CID.test(rec.cid)) {
              return yield* ownerFail("record_cid")
            }
            if (rkeys.has(rkey)) return yield* ownerFail("duplicate_rkey")
            rkeys.add(rkey)
            const v = validateWhRecord(rec.value, validateOpts)
            if (Either.isLeft(v)) {
              invalid++
              continue
            }
            const row = toRow(did, rkey, v.right.record, v.right.scope, snapshotRev, token, rec.cid, v.right.record.enabled !== false)
            if (!isStorable(row)) {
              invalid++
              continue
            }
            rows.push(row)
          }
          const more = page.records.length > 0 && page.cursor !== undefined
          if (more && page.cursor !== undefined) {
            const next = page.cursor
            if (next.length === 0 || next.length > limits.maxCursorLength || cursors.has(next)) {
              return yield* ownerFail("cursor")
            }
            cursors.add(next)
          }
          const applied = yield* store.applyPage(did, token, snapshotRev, rows)
          if (applied.fenced) return { _tag: "superseded" } as const
          written += applied.written
          if (!more) break
          cursor = page.cursor
        }
        // 4. completion, in small durable transactions
        let deleted = 0
        for (let batch = 0; ; batch++) {
          if (batch >= limits.maxBatches) return yield* ownerFail("too_many_rows")
          const r = yield* store.deleteOlder(did, token, snapshotRev, limits.batchSize)
          if (r.fenced) return { _tag: "superseded" } as const
          deleted += r.deleted
          if (r.deleted < limits.batchSize) break
        }
        for (let batch = 0; ; batch++) {
          if (batch >= limits.maxBatches) return yield* ownerFail("too_many_rows")
          const r = yield* store.pruneTombstones(did, token, snapshotRev, limits.tombstoneRetentionMs, limits.batchSize)
          if (r.fenced) return { _tag: "superseded" } as const
          if (r.pruned < limits.batchSize) break
        }
        // 5. complete + the one-step in-memory swap, under the owner row lock
        const completed = yield* store.complete(did, token, snapshotRev, options.swap(did))
        if (!completed) return { _tag: "superseded" } as const
        return { _tag: "complete", records, invalid, written, deleted, pages, repoFound } as const
      })

    const count = (outcome: ReconcileOutcome) =>
      Effect.gen(function* () {
        yield* Metric.increment(Metric.tagged(outcomes, "outcome", outcome._tag))
        switch (outcome._tag) {
          case "complete":
            stats.completed++
            stats.invalidRecords += outcome.invalid
            if (outcome.invalid > 0) yield* Metric.incrementBy(invalidRecordsMetric, outcome.invalid)
            break
          case "failed":
            stats.failed++
            yield* Metric.increment(Metric.tagged(failures, "kind", outcome.kind))
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
      Effect.gen(function* () {
        if (!isCanonicalDid(did)) return { _tag: "failed", kind: "invalid_did" } as const
        const startMicros = (yield* Clock.currentTimeMillis) * 1000
        const begun = yield* store.begin(did, {
          maxOtherScanning: limits.maxOtherScanning,
          staleScanMs: config.retryScheduler.staleScanMs
        })
        if (begun._tag === "busy") return begun
        const token = begun.token
        const markInterrupted = Effect.interruptible(store.markFailed(did, token, "interrupted")).pipe(
          Effect.timeoutOption(Duration.millis(limits.interruptMarkTimeoutMs)),
          Effect.ignore
        )
        const result: ReconcileOutcome = yield* scan(did, token, startMicros).pipe(
          Effect.catchTag("OwnerFailure", (e) =>
            store.markFailed(did, token, e.kind).pipe(Effect.as({ _tag: "failed", kind: e.kind } as const))
          ),
          Effect.onInterrupt(() => markInterrupted)
        )
        return result
      }).pipe(
        Effect.tap((outcome) =>
          Effect.zipRight(
            count(outcome),
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

/** The reconciler, swapping completed owners into the in-memory {@link Registry}. */
export const layer = (
  limits: Partial<ReconcileLimits> = {}
): Layer.Layer<Reconciler, never, FirehookConfig | SafeHttp | Identity | ReconcileStore | Registry> =>
  Layer.effect(
    Reconciler,
    Effect.flatMap(Registry, (registry) => make({ limits, swap: (did) => registry.swapOwner(did) }))
  )

/**
 * The reconciler without an in-memory registry (the CLI): completion writes the database only; a
 * running service picks the completed owner up within one RetryScheduler interval.
 */
export const layerWithoutRegistry = (
  limits: Partial<ReconcileLimits> = {}
): Layer.Layer<Reconciler, never, FirehookConfig | SafeHttp | Identity | ReconcileStore> =>
  Layer.effect(Reconciler, make({ limits, swap: () => Effect.void }))
