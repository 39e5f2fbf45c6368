/**
 * Prior references in the processor (SPEC §2.4): the limits of a row and of the table, the
 * in-memory index of the stored keys (with the count of keys per DID), and the prior-reference
 * state of batches planned together: the rows they read, the puts and removes applied to them in
 * order (the store's rules), and each touched key's final state as one write.
 */
import type { FirehookConfigShape } from "../platform/Config.js"
import * as MatchingConfig from "./MatchingConfig.js"
import type { PriorRefsDelete, PriorRefsRow, PriorRefsUpsert, PriorRefsWrite } from "./PriorRefsStore.js"
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
 * incomplete and every candidate is read from the table).
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
 * The in-memory index of prior-reference keys, with the count of keys per DID (most events are
 * from DIDs with none: their record URI is then never looked up). Loaded up to `maxRows` keys; over
 * it, it is incomplete (`complete` false) and every candidate is read from the table.
 */
export class PriorRefIndex {
  readonly keys = new Set<string>()
  readonly keyDids = new Map<string, number>()
  complete: boolean
  readonly maxRows: number

  constructor(stored: Iterable<string>, maxRows: number) {
    this.maxRows = maxRows
    this.complete = true
    this.reload(stored)
  }

  /**
   * Replace the contents with the keys stored now (as read, up to `maxRows + 1`): at startup, and
   * when this replica takes the intake role (SPEC §6.4: the old leader wrote keys this index
   * never saw).
   */
  reload(stored: Iterable<string>): void {
    this.keys.clear()
    this.keyDids.clear()
    for (const k of stored) this.add(k)
    this.complete = this.keys.size <= this.maxRows
  }

  add(uri: string): void {
    if (this.keys.has(uri)) return
    this.keys.add(uri)
    const did = didOf(uri)
    this.keyDids.set(did, (this.keyDids.get(did) ?? 0) + 1)
  }

  delete(uri: string): void {
    if (!this.keys.delete(uri)) return
    const did = didOf(uri)
    const n = (this.keyDids.get(did) ?? 1) - 1
    if (n <= 0) this.keyDids.delete(did)
    else this.keyDids.set(did, n)
  }

  /**
   * After a unit of work failed with an outcome unknown to this process (the server may have
   * committed it): the keys it may have written are taken as stored. A key in the index that
   * has no row costs one read and is otherwise harmless; a stored key missing from it would
   * hide its references from the record's update or delete.
   */
  mayHaveWritten(keys: Iterable<string>): void {
    for (const k of keys) this.add(k)
    if (this.keys.size > this.maxRows) this.complete = false
  }

  /** after commit: the index follows the final states (a key removed and written again stays) */
  follow(removedKeys: Iterable<string>, written: Iterable<string>): void {
    for (const k of removedKeys) this.delete(k)
    for (const k of written) this.add(k)
    if (this.keys.size > this.maxRows) this.complete = false
  }
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
  /** new keys written (counted against the table's row limit) */
  readonly addedKeys: Array<string>
}

export const newShared = (): Shared => ({
  current: new Map(),
  stored: new Map(),
  read: new Set(),
  lastRemoveRev: new Map(),
  batchWritten: new Set(),
  writtenDids: new Set(),
  addedKeys: []
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
