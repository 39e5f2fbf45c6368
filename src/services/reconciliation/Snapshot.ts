/**
 * One owner's snapshot scan (SPEC §5.3 steps 2–5, after a successful begin): resolve the PDS, read
 * the snapshot's rev and store it with the owner (it fences live writes from then on), fetch and
 * check `listRecords` pages (every bound of the {@link Reconciler}'s header), apply each page in its
 * own fenced transaction, then complete in small durable transactions. The checks of a page are pure ({@link pageRows}, {@link nextCursor}); the effects
 * are thin loops around them. A failure of the owner is an {@link OwnerFailure}; a fence is the
 * outcome `superseded`.
 */
import { Clock, Data, Effect, Either, Metric } from "effect"
import { isRkey } from "../../schemas/AtUri.js"
import { isTid, tidFromMicros, tidToMicros } from "../../schemas/Tid.js"
import { validateWhRecord, WH_COLLECTION, type WhRecordOptions } from "../../schemas/WhRecord.js"
import { decodeJsonBody, isWellFormedText, LatestCommit, ListRecordsPage, XrpcError } from "../../schemas/Xrpc.js"
import { parseRetryAfter } from "../platform/http/RetryAfter.js"
import type { SafeHttpError, SafeResponse } from "../platform/http/SafeHttp.js"
import type { StoreError } from "../platform/Persistence.js"
import { toRow } from "../registry/Registry.js"
import { isStorableRow, type WebhookRow } from "../registry/RegistryStore.js"
import type { RefusedVersion } from "../registry/RejectedStore.js"
import type { IdentityShape } from "./Identity.js"
import { COMMIT_STALL_HOLD_MS, type PdsCooldown } from "./PdsCooldown.js"
import * as Metrics from "./ReconcileMetrics.js"
import type { OwnerFailureKind, ReconcileLimits, ReconcileOutcome } from "./Reconciler.js"
import type { ReconcileStoreShape } from "./ReconcileStore.js"

// ---------------------------------------------------------------------------------------------
// Pure helpers

export class OwnerFailure extends Data.TaggedError("OwnerFailure")<{
  readonly kind: OwnerFailureKind
  /**
   * the wait (ms) asked for by the PDS (`Retry-After` of a 429 or 503 answer to a page) or by the
   * DID document's host (the PLC directory's), or what is left of it when the host was not asked
   */
  readonly retryAfterMs?: number | undefined
}> {}

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

/** What one scan writes with: its owner, its fencing token and its snapshot's rev. */
export interface ScanTarget {
  readonly did: string
  readonly token: number
  readonly snapshotRev: string
}

/**
 * The rows of one page's records, in order, and the records omitted as invalid (`refused`: rkey,
 * cid and why; `invalid` counts them); or the kind of failure of the first record that fails the
 * owner. `seen` holds the rkeys of the pages before (this page's are added to it).
 */
export const pageRows = (
  records: ListRecordsPage["records"],
  target: ScanTarget,
  seen: Set<string>,
  limits: ReconcileLimits,
  validateOpts: WhRecordOptions
): Either.Either<
  {
    readonly rows: ReadonlyArray<WebhookRow>
    readonly refused: ReadonlyArray<RefusedVersion>
    readonly invalid: number
  },
  OwnerFailureKind
> => {
  const rows: Array<WebhookRow> = []
  const refused: Array<RefusedVersion> = []
  for (const rec of records) {
    const rkey = rkeyOfUri(rec.uri, target.did)
    if (rkey === undefined) return Either.left("record_uri")
    if (rec.cid.length < 1 || rec.cid.length > limits.maxCidLength || !CID.test(rec.cid)) {
      return Either.left("record_cid")
    }
    if (seen.has(rkey)) return Either.left("duplicate_rkey")
    seen.add(rkey)
    const v = validateWhRecord(rec.value, validateOpts)
    if (Either.isLeft(v)) {
      refused.push({ rkey, cid: rec.cid, reason: v.left })
      continue
    }
    const r = v.right
    const row = toRow(
      target.did,
      rkey,
      r.record,
      r.scope,
      target.snapshotRev,
      target.token,
      rec.cid,
      r.record.enabled !== false
    )
    // valid, but PostgreSQL cannot store it (the registry stream's check): omitted like an invalid one
    if (!isStorableRow(row)) {
      refused.push({ rkey, cid: rec.cid, reason: "unstorable" })
      continue
    }
    rows.push(row)
  }
  return Either.right({ rows, refused, invalid: refused.length })
}

/**
 * The cursor of the page after this one (`undefined`: this is the last page), or `cursor` when the
 * page's cursor is unusable (empty, too long, seen before, or not well-formed UTF-16, which no URL
 * can carry; `seen` holds the cursors before and gets this one). Only a page without a cursor is
 * the last: a page with no records but a cursor is followed (SPEC §5.3; it counts toward the page
 * bound like any other).
 */
export const nextCursor = (
  page: ListRecordsPage,
  seen: Set<string>,
  limits: ReconcileLimits
): Either.Either<string | undefined, OwnerFailureKind> => {
  const next = page.cursor
  if (next === undefined) return Either.right(undefined)
  if (
    next.length === 0 || next.length > limits.maxCursorLength || seen.has(next) || !isWellFormedText(next)
  ) return Either.left("cursor")
  seen.add(next)
  return Either.right(next)
}

// ---------------------------------------------------------------------------------------------
// The scan

/** What a scan uses: the reconciler's services, limits and swap. */
export interface ScanDeps {
  readonly identity: IdentityShape
  readonly store: ReconcileStoreShape
  readonly limits: ReconcileLimits
  readonly validateOpts: WhRecordOptions
  /** a bounded GET through the SSRF-safe transport */
  readonly get: (url: string, maxResponseBytes: number) => Effect.Effect<SafeResponse, SafeHttpError>
  /** the in-memory swap run at completion (inside the completing transaction) */
  readonly swap: (did: string) => Effect.Effect<void, StoreError>
  /** the PDS hosts that asked for time (PdsCooldown.ts): not asked again until it has passed */
  readonly cooldown: PdsCooldown
  /** the PDS hosts whose getLatestCommit timed out lately: their scans take the fallback rev at once */
  readonly commitStalls: PdsCooldown
}

const SUPERSEDED = { _tag: "superseded" } as const

/**
 * The owner's PDS. A DID document host that asked for time (429/503 with `Retry-After`, Identity.ts)
 * passes its wait on: the owner whose lookup met it fails as `identity_unavailable`, one that was
 * not looked up because the host is still held as `identity_cooling`, each with the wait.
 */
const resolvePds = (deps: ScanDeps, did: string) =>
  deps.identity.resolvePds(did).pipe(
    Effect.mapError((e) =>
      new OwnerFailure({
        kind: e.held === true ? "identity_cooling" : e.kind,
        ...(e.retryAfterMs === undefined ? {} : { retryAfterMs: e.retryAfterMs })
      })
    )
  )

/**
 * getLatestCommit's rev, or a TID of the scan's start when the PDS does not answer it (or
 * answers a rev more than `maxFutureRevMs` ahead of our clock, which would fence the owner's
 * live changes until then). A host whose getLatestCommit timed out within
 * `COMMIT_STALL_HOLD_MS` is not asked (the fallback at once: a stalling PDS costs each of its
 * owners one timeout, its page's, instead of two).
 */
const snapshotRevOf = (deps: ScanDeps, pds: string, did: string, startMicros: number) =>
  Effect.gen(function*() {
    const fallback = tidFromMicros(startMicros)
    if (deps.commitStalls.remaining(pds, yield* Clock.currentTimeMillis) !== undefined) return fallback
    const url = `${pds}/xrpc/com.atproto.sync.getLatestCommit?did=${q(did)}`
    const answer = yield* Effect.either(deps.get(url, deps.limits.maxCommitBytes))
    if (Either.isLeft(answer)) {
      if (answer.left.kind === "timeout") {
        deps.commitStalls.note(pds, yield* Clock.currentTimeMillis, COMMIT_STALL_HOLD_MS)
      }
      return fallback
    }
    const res = answer.right
    if (res.status < 200 || res.status > 299) {
      return fallback
    }
    const commit = decodeJsonBody(LatestCommit, res.body)
    if (commit === undefined || !isTid(commit.rev)) return fallback
    const micros = tidToMicros(commit.rev)
    return micros !== undefined && micros <= startMicros + deps.limits.maxFutureRevMs * 1000 ? commit.rev : fallback
  })

const listUrl = (limits: ReconcileLimits, pds: string, did: string, cursor: string | undefined) =>
  `${pds}/xrpc/com.atproto.repo.listRecords?repo=${q(did)}&collection=${
    q(WH_COLLECTION)
  }&limit=${limits.maxPageRecords}` +
  (cursor === undefined ? "" : `&cursor=${q(cursor)}`)

/** Step 2–3: fetch, check and apply every page. */
const applyPages = (deps: ScanDeps, pds: string, target: ScanTarget) =>
  Effect.gen(function*() {
    const { limits, store } = deps
    const { did, token, snapshotRev } = target
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
      const res: SafeResponse = yield* deps.get(listUrl(limits, pds, did, cursor), limits.maxPageBytes).pipe(
        Effect.mapError((e) => new OwnerFailure({ kind: httpFailure(e) }))
      )
      pages++
      yield* Metric.increment(Metrics.reconcilePages)
      bytes += res.body.length
      if (bytes > limits.maxTotalBytes) return yield* ownerFail("too_many_bytes")
      if (res.status < 200 || res.status > 299) {
        if (pages === 1 && isRepoNotFound(res, did)) {
          // authoritative only from the owner's current PDS: the one used may come from a cache
          // (up to 24 h old) and an account that moved is "not found" on its old PDS. Resolve
          // the DID again; a different PDS fails this scan (retried against the new one)
          // instead of taking the old PDS's answer as an empty repo and deleting every row
          yield* deps.identity.invalidate(did)
          const current = yield* resolvePds(deps, did)
          if (current !== pds) return yield* ownerFail("pds_moved")
          repoFound = false
          break
        }
        // a PDS that asks for time (429, 503 with Retry-After) gets it: the retry waits for it, and
        // no owner's scan asks the PDS anything until it has passed
        const now = yield* Clock.currentTimeMillis
        const retryAfterMs = res.status === 429 || res.status === 503
          ? parseRetryAfter(res.headers["retry-after"], now)
          : undefined
        if (retryAfterMs !== undefined) deps.cooldown.note(pds, now, retryAfterMs)
        return yield* Effect.fail(new OwnerFailure({ kind: "pds_status", retryAfterMs }))
      }
      const page: ListRecordsPage | undefined = decodeJsonBody(ListRecordsPage, res.body)
      if (page === undefined) return yield* ownerFail("page_invalid")
      if (page.records.length > limits.maxPageRecords) return yield* ownerFail("page_records")
      records += page.records.length
      if (records > limits.maxRecords) return yield* ownerFail("too_many_records")
      const checked = pageRows(page.records, target, rkeys, limits, deps.validateOpts)
      if (Either.isLeft(checked)) return yield* ownerFail(checked.left)
      invalid += checked.right.invalid
      const next = nextCursor(page, cursors, limits)
      if (Either.isLeft(next)) return yield* ownerFail(next.left)
      const applied = yield* store.applyPage(did, token, snapshotRev, checked.right.rows, checked.right.refused)
      if (applied.fenced) return SUPERSEDED
      written += applied.written
      if (next.right === undefined) break
      cursor = next.right
    }
    return { _tag: "applied", records, invalid, written, pages, repoFound } as const
  })

/** Step 4: rows the snapshot did not contain are deleted and old tombstones pruned, in small durable transactions. */
const deleteOutside = (deps: ScanDeps, target: ScanTarget) =>
  Effect.gen(function*() {
    const { limits, store } = deps
    const { did, token, snapshotRev } = target
    let deleted = 0
    for (let batch = 0;; batch++) {
      if (batch >= limits.maxBatches) return yield* ownerFail("too_many_rows")
      const r = yield* store.deleteOlder(did, token, snapshotRev, limits.batchSize)
      if (r.fenced) return SUPERSEDED
      deleted += r.deleted
      if (r.deleted < limits.batchSize) break
    }
    for (let batch = 0;; batch++) {
      if (batch >= limits.maxBatches) return yield* ownerFail("too_many_rows")
      const r = yield* store.pruneTombstones(did, token, snapshotRev, limits.tombstoneRetentionMs, limits.batchSize)
      if (r.fenced) return SUPERSEDED
      if (r.pruned < limits.batchSize) break
    }
    return { _tag: "deleted", deleted } as const
  })

/** Steps 2–5 after a successful begin. */
export const scan = (
  deps: ScanDeps,
  did: string,
  token: number,
  startMicros: number
): Effect.Effect<ReconcileOutcome, OwnerFailure | StoreError> =>
  Effect.gen(function*() {
    const pds = yield* resolvePds(deps, did)
    // the PDS asked for time (another owner's page, within its Retry-After): it is not asked now
    const cooling = deps.cooldown.remaining(pds, yield* Clock.currentTimeMillis)
    if (cooling !== undefined) {
      return yield* Effect.fail(new OwnerFailure({ kind: "pds_cooling", retryAfterMs: cooling }))
    }
    const snapshotRev = yield* snapshotRevOf(deps, pds, did, startMicros)
    // stored at once: from now on it fences the owner's live writes (SPEC §3.4)
    if (!(yield* deps.store.saveSnapshotRev(did, token, snapshotRev))) return SUPERSEDED
    const target: ScanTarget = { did, token, snapshotRev }
    const applied = yield* applyPages(deps, pds, target)
    if (applied._tag === "superseded") return applied
    // 4. completion, in small durable transactions
    const removed = yield* deleteOutside(deps, target)
    if (removed._tag === "superseded") return removed
    // 5. complete + the one-step in-memory swap, under the owner row lock
    const completed = yield* deps.store.complete(did, token, snapshotRev, deps.swap(did))
    if (!completed) return SUPERSEDED
    const { records, invalid, written, pages, repoFound } = applied
    return { _tag: "complete", records, invalid, written, deleted: removed.deleted, pages, repoFound } as const
  })
