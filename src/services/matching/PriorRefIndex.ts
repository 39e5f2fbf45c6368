/**
 * Prior references in the processor (SPEC §2.4): the limits of a row and of the table, the
 * in-memory index of the stored keys (with the count of keys per DID, and when each may expire:
 * it forgets the keys whose rows expired), and the prior-reference state of batches planned
 * together: the rows they read, the puts and removes applied to them in order (the store's rules),
 * and each touched key's final state as one write.
 */
import { Clock, Effect } from "effect"
import type { FirehookConfigShape } from "../platform/Config.js"
import type * as RateLimitedLog from "../platform/RateLimitedLog.js"
import * as MatchingConfig from "./MatchingConfig.js"
import type {
  PriorRefsDelete,
  PriorRefsRow,
  PriorRefsStoreShape,
  PriorRefsUpsert,
  PriorRefsWrite,
  StoredKey
} from "./PriorRefsStore.js"
import { utf8Length } from "./References.js"

export interface PriorRefLimits {
  readonly maxRefs: number
  readonly maxBytes: number
  readonly ttlSeconds: number
  readonly maxRows: number
}

/**
 * SPEC §2.4: ≤ 100 refs and ≤ 32 KiB per row (constants: the shape of a row), TTL 7 days and a
 * table bound of 100,000 rows (the defaults of `PRIOR_REFS_TTL_MS` / `PRIOR_REFS_MAX_ROWS`). The
 * row bound is also the bound of the in-memory key index (loaded up to it; over it the index is
 * incomplete and every candidate is read from the table), which forgets a key once its row has
 * expired and left the table (see {@link PriorRefIndex}).
 */
export const defaultPriorRefLimits: PriorRefLimits = {
  maxRefs: 100,
  maxBytes: 32 * 1024,
  ttlSeconds: MatchingConfig.priorRefs.ttlMs.default / 1000,
  maxRows: MatchingConfig.priorRefs.maxRows.default
}

/**
 * The limits of a configuration (`PRIOR_REFS_TTL_MS`, `PRIOR_REFS_MAX_ROWS`; their defaults are
 * those of {@link defaultPriorRefLimits}); the per-row bounds are {@link defaultPriorRefLimits}'.
 */
export const priorLimitsFromConfig = (priorRefs: FirehookConfigShape["priorRefs"]): PriorRefLimits => ({
  ...defaultPriorRefLimits,
  ttlSeconds: priorRefs.ttlMs / 1000,
  maxRows: priorRefs.maxRows
})

/** Fit the relevant refs to the row bounds (≤ maxRefs, ≤ maxBytes of JSON). */
export const boundRefs = (
  uris: ReadonlyArray<string>,
  limits: PriorRefLimits
): { refs: Array<string>; bytes: number } => {
  const refs: Array<string> = []
  let bytes = 2
  for (const u of uris) {
    if (refs.length >= limits.maxRefs) break
    const add = utf8Length(u) + 3
    if (bytes + add > limits.maxBytes) break
    refs.push(u)
    bytes += add
  }
  return { refs, bytes }
}

// ---------------------------------------------------------------------------------------------
// The key index

const didOf = (uri: string) => uri.slice(5, uri.indexOf("/", 5))

/**
 * When the key index asks the table about keys past their expiry (SPEC §2.4 TTL): at most once a
 * minute and 1,000 keys at a time (maintenance's cadence and batch, SPEC §4.9); at once, while
 * the index is full or the previous check left due keys unasked.
 */
export const EXPIRY_CHECK = { intervalMs: 60_000, maxKeys: 1_000 } as const

/**
 * The in-memory index of prior-reference keys, with the count of keys per DID (most events are
 * from DIDs with none: their record URI is then never looked up). Loaded up to `maxRows` keys; over
 * it, it is incomplete (`complete` false) and every candidate is read from the table.
 *
 * Each key carries the Clock time from which its row may have expired (its last write + TTL), and
 * the keys are in that order (a write moves its key to the end). Invariant: every live row of the
 * table has its key here, and a key leaves only when its row has left the table: when a commit
 * removed the row, or when the table answered, in the statement that deletes the row if it has
 * expired (`PriorRefsStore.expire`), that it has none. So the index never holds fewer keys than the
 * table holds rows written or loaded by this process, and admitting a new key only while the index
 * holds fewer than `maxRows` keys keeps the table within its bound. The Clock only decides when to
 * ask; the table's `now()` decides what has expired (a skewed clock costs a question, never a row).
 */
export class PriorRefIndex {
  /** key → Clock millis from which its row may have expired, in that order */
  readonly keys = new Map<string, number>()
  readonly keyDids = new Map<string, number>()
  complete = true
  readonly maxRows: number
  readonly ttlMs: number
  /** no periodic check before this (Clock millis) */
  private nextCheckAt = 0
  /** the previous check left due keys unasked */
  private backlog = false

  constructor(maxRows: number, ttlMs: number) {
    this.maxRows = maxRows
    this.ttlMs = ttlMs
  }

  /**
   * Replace the contents with the keys stored now (as read, up to `maxRows + 1`, with their time
   * left): at startup, and when this replica takes the intake role (SPEC §6.4: the old leader
   * wrote keys this index never saw); while the index is incomplete, at each check.
   */
  reload(stored: Iterable<StoredKey>, now: number): void {
    this.keys.clear()
    this.keyDids.clear()
    for (const k of [...stored].sort((a, b) => a.ttlMs - b.ttlMs)) this.add(k.recordUri, now + k.ttlMs)
    this.complete = this.keys.size <= this.maxRows
    this.nextCheckAt = now + EXPIRY_CHECK.intervalMs
    this.backlog = false
  }

  /** (re)written at `at`: moved to the end */
  private add(uri: string, at: number): void {
    if (!this.keys.delete(uri)) {
      const did = didOf(uri)
      this.keyDids.set(did, (this.keyDids.get(did) ?? 0) + 1)
    }
    this.keys.set(uri, at)
  }

  private forget(uri: string): void {
    if (!this.keys.delete(uri)) return
    const did = didOf(uri)
    const n = (this.keyDids.get(did) ?? 1) - 1
    if (n <= 0) this.keyDids.delete(did)
    else this.keyDids.set(did, n)
  }

  /**
   * After a unit of work failed with an outcome unknown to this process (the server may have
   * committed it): the keys it may have written are taken as stored (and as written now). A key
   * in the index that has no row costs one read and is forgotten at its expiry check; a stored
   * key missing from it would hide its references from the record's update or delete.
   */
  mayHaveWritten(keys: Iterable<string>, now: number): void {
    for (const k of keys) this.add(k, now + this.ttlMs)
    if (this.keys.size > this.maxRows) this.complete = false
  }

  /** after commit (at `now`): the index follows the final states (a key removed and written again stays) */
  follow(removedKeys: Iterable<string>, written: Iterable<string>, now: number): void {
    for (const k of removedKeys) this.forget(k)
    for (const k of written) this.add(k, now + this.ttlMs)
    if (this.keys.size > this.maxRows) this.complete = false
  }

  /**
   * What to do about expiry now: `reload` (incomplete: a reload may find the table back within
   * its bound), `check` the keys past their expiry (oldest first, at most `maxKeys`), or nothing.
   * See {@link EXPIRY_CHECK} for when.
   */
  expiryStep(now: number): { readonly _tag: "none" } | { readonly _tag: "reload" } | {
    readonly _tag: "check"
    readonly keys: ReadonlyArray<string>
  } {
    const urgent = this.backlog || this.keys.size >= this.maxRows
    if (!this.complete) {
      if (now < this.nextCheckAt) return { _tag: "none" }
      this.nextCheckAt = now + EXPIRY_CHECK.intervalMs
      return { _tag: "reload" }
    }
    const first = this.keys.values().next()
    if (first.done === true || first.value > now || (now < this.nextCheckAt && !urgent)) return { _tag: "none" }
    const keys: Array<string> = []
    for (const [k, at] of this.keys) {
      if (at > now || keys.length >= EXPIRY_CHECK.maxKeys) break
      keys.push(k)
    }
    this.nextCheckAt = now + EXPIRY_CHECK.intervalMs
    this.backlog = keys.length >= EXPIRY_CHECK.maxKeys
    return { _tag: "check", keys }
  }

  /**
   * The table's answer about `asked` (see `PriorRefsStore.expire`): a key without a row is
   * forgotten; one whose row is still there is asked about again when the table says it expires
   * (it keeps its place: the keys behind it were written later).
   */
  expired(asked: ReadonlyArray<string>, left: ReadonlyMap<string, number>, now: number): void {
    for (const k of asked) {
      const ms = left.get(k)
      if (ms === undefined) this.forget(k)
      else if (this.keys.has(k)) this.keys.set(k, now + ms)
    }
  }
}

/**
 * The index's traffic with the table, for the processor's worker: `load` the stored keys (at
 * startup, on `reload`); `checkExpiry`, between two units of work, carries out the index's
 * {@link PriorRefIndex.expiryStep}: ask the table about the keys past their expiry (it deletes
 * their rows if they have expired; the index forgets the keys whose rows are gone), or, while the
 * index is incomplete, load the keys again. A failed check is logged (`log`, at most once a minute)
 * and changes nothing; the next one asks again.
 */
export const indexUpkeep = (index: PriorRefIndex, store: PriorRefsStoreShape, log: RateLimitedLog.RateLimitedLog) => {
  const load = Effect.flatMap(
    store.keys(index.maxRows + 1),
    (stored) => Effect.map(Clock.currentTimeMillis, (now) => index.reload(stored, now))
  )
  const checkExpiry = Effect.gen(function*() {
    const step = index.expiryStep(yield* Clock.currentTimeMillis)
    if (step._tag === "reload") yield* load
    else if (step._tag === "check") {
      const left = yield* store.expire(step.keys)
      index.expired(step.keys, left, yield* Clock.currentTimeMillis)
    }
  }).pipe(
    Effect.catchAll((e) =>
      log.run(
        "expiry",
        () =>
          Effect.logWarning("prior-reference expiry check failed").pipe(Effect.annotateLogs({ code: e.code, op: e.op }))
      )
    ),
    Effect.withSpan("Processor.checkExpiry")
  )
  return { load, checkExpiry }
}

// ---------------------------------------------------------------------------------------------
// Batches planned together

/** a key's row as a batch sees it (`bytes` is only known for rows the batch wrote) */
export interface BatchRow {
  readonly rev: string
  readonly refs: ReadonlyArray<string>
  readonly bytes: number
  readonly live: boolean
}

/** prior-reference state of batches planned together (as if they were one batch) */
export interface Shared {
  /** a key's current row (null = absent) once the batches touched it */
  readonly current: Map<string, BatchRow | null>
  /** rows read from the store, and every key read (absent ones included) */
  readonly stored: Map<string, PriorRefsRow>
  readonly read: Set<string>
  readonly lastRemoveRev: Map<string, string>
  /** keys written and not removed since: not in the key index until commit, but visible */
  readonly batchWritten: Set<string>
  /** the DIDs of the keys ever written (a superset: tested before the key) */
  readonly writtenDids: Set<string>
  /** new keys (not in the key index) written and not removed since: counted against the table's row limit */
  readonly addedKeys: Set<string>
  /**
   * keys of the key index whose row was read and removed, not written since: their rows are deleted
   * by the batches' statement (unconditionally: they were read), so they no longer count against the limit
   */
  readonly removedIndexed: Set<string>
}

export const newShared = (): Shared => ({
  current: new Map(),
  stored: new Map(),
  read: new Set(),
  lastRemoveRev: new Map(),
  batchWritten: new Set(),
  writtenDids: new Set(),
  addedKeys: new Set(),
  removedIndexed: new Set()
})

/** a key's row as the batches see it (null = absent) */
export const rowOf = (shared: Shared, uri: string): BatchRow | null => {
  const c = shared.current.get(uri)
  if (c !== undefined) return c
  const r = shared.stored.get(uri)
  return r === undefined ? null : { rev: r.rev, refs: r.refs, bytes: 0, live: r.live }
}

/** the store's put: write over an older rev, an expired row, or none */
export const putRow = (
  shared: Shared,
  uri: string,
  rev: string,
  refs: ReadonlyArray<string>,
  bytes: number,
  live: boolean
): boolean => {
  const r = rowOf(shared, uri)
  if (r !== null && r.live && !(r.rev < rev)) return false
  shared.current.set(uri, { rev, refs, bytes, live })
  return true
}

/** the store's remove: delete an older rev or an expired row */
export const removeRow = (shared: Shared, uri: string, rev: string): boolean => {
  const r = rowOf(shared, uri)
  if (r === null || (r.live && !(r.rev < rev))) return false
  shared.current.set(uri, null)
  shared.lastRemoveRev.set(uri, rev)
  return true
}

/**
 * Each touched key's final state, written in one statement; the key index follows the final
 * states after commit (a key removed and written again in one batch stays in it). A key read
 * from the store is written over whatever is stored (the plan decided); one the index said was
 * absent keeps the store's own rev condition.
 */
export const priorWriteOf = (shared: Shared, ttlSeconds: number) => {
  const removedKeys: Array<string> = []
  if (shared.current.size === 0) return { prior: undefined, removedKeys }
  const upserts: Array<PriorRefsUpsert> = []
  const deletes: Array<PriorRefsDelete> = []
  for (const [uri, row] of shared.current) {
    const exact = shared.read.has(uri)
    if (row === null) {
      deletes.push({ recordUri: uri, olderThan: exact ? undefined : shared.lastRemoveRev.get(uri) })
      removedKeys.push(uri)
    } else upserts.push({ recordUri: uri, rev: row.rev, refs: row.refs, bytes: row.bytes, force: exact })
  }
  const prior: PriorRefsWrite = { upserts, deletes, ttlSeconds }
  return { prior, removedKeys }
}
