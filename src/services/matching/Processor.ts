/**
 * `processEvents(batch)`: the one entry point from intake into matching (SPEC §2, §3.3–3.5).
 *
 * Atomically it applies registry mutations for wh-record events (when the batch comes from the
 * registry writer), matches every event against the in-memory index (direct, backlink with prior
 * references), writes prior references, enqueues outbox rows, records quarantines, and writes the
 * caller's cursor, so a crash at any instant loses nothing: either the whole batch and its cursor
 * commit, or none of it does.
 *
 * - A batch that writes no registry rows is written by ONE statement (`OutboxStore.commitBatch`:
 *   atomic on its own, one round trip) with its cursor given as data (`ProcessOptions.cursor`);
 *   its prior references are read (one statement) before it.
 * - Otherwise (registry writes, a `finalize` without cursor data, more than one chunk of rows):
 *   one transaction of separate statements, the caller's `finalize` last.
 *
 * Batches are committed one unit at a time by one worker fiber, in arrival order across all
 * streams (first come, first served), so registry mutations are serialized and each is visible to
 * the next event processed. One-statement batches that are waiting together (typically one per
 * stream) are planned as if they were one batch and written by one statement; if that fails, they
 * are retried one by one, so each caller sees its own batch's outcome. If a unit fails, the
 * in-memory changes it made are undone.
 */
import { Context, Deferred, Effect, Either, Exit, Layer, Metric, Option, Queue } from "effect"
import { buildPayload, eventId, type CanonicalError } from "./Canonical.js"
import { matchEvent } from "./Match.js"
import { extractReferences, utf8Length } from "./References.js"
import { parseScopeUri, type ScopeUri } from "../../schemas/AtUri.js"
import { isWellFormedRecordEvent, type RecordEvent, type StreamEvent } from "../../schemas/RecordEvent.js"
import { sanitizeWhRecordForDelivery, WH_COLLECTION } from "../../schemas/WhRecord.js"
import { FirehookConfig, type FirehookConfigShape } from "../platform/Config.js"
import { Health } from "../platform/Health.js"
import { labelledCounter } from "../platform/Metrics.js"
import * as Outbox from "./Outbox.js"
import type { CursorWrite } from "../intake/CursorStore.js"
import {
  type PriorRefsDelete,
  type PriorRefsRow,
  PriorRefsStore,
  type PriorRefsUpsert,
  type PriorRefsWrite
} from "./PriorRefsStore.js"
import { Registry, type WhEventOutcome } from "../registry/Registry.js"
import { type StoreError, Tx } from "../platform/Persistence.js"

export type EventOutcome =
  | { readonly _tag: "acknowledged" }
  | { readonly _tag: "malformed" }
  | { readonly _tag: "no_match"; readonly registry?: WhEventOutcome }
  | { readonly _tag: "enqueued"; readonly deliveries: number; readonly registry?: WhEventOutcome }
  | { readonly _tag: "quarantined"; readonly reason: Outbox.QuarantineReason; readonly registry?: WhEventOutcome }

export interface BatchResult {
  readonly outcomes: ReadonlyArray<EventOutcome>
  /** outbox rows inserted (new deliveries) */
  readonly inserted: number
  /** outbox rows that already existed (replays) */
  readonly duplicates: number
  readonly quarantined: number
}

export interface ProcessOptions {
  /** apply registry mutations for wh-record events (the registry stream, or the relay firehose) */
  readonly registryWriter: boolean
  /** runs last inside the transaction (the intake's cursor write) */
  readonly finalize?: Effect.Effect<void, StoreError>
  /**
   * The same cursor write as `finalize`, as data: a batch written by one statement (see
   * `OutboxStore.commitBatch`) writes it in that statement instead of running `finalize`. Without
   * it, a batch with a `finalize` always runs in a transaction.
   */
  readonly cursor?: CursorWrite
}

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
  ttlSeconds: 7 * 24 * 3600,
  maxRows: 100_000
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

export interface ProcessorShape {
  readonly processEvents: (
    batch: ReadonlyArray<StreamEvent>,
    options: ProcessOptions
  ) => Effect.Effect<BatchResult, StoreError>
  readonly stats: Effect.Effect<ProcessorStats>
}

export interface ProcessorStats {
  readonly tooComplex: number
  readonly priorRefsRefused: number
  readonly priorRefKeys: number
  readonly priorRefIndexComplete: boolean
}

export class Processor extends Context.Tag("firehook/Processor")<Processor, ProcessorShape>() {}

const EVENTS_PROCESSED = { description: "Stream events processed, by outcome" }
const tooComplexMetric = Metric.counter("firehook_events_too_complex_total", {
  description: "Records whose reference walk hit a bound (backlink matching skipped)"
})
const priorRefsRefusedMetric = Metric.counter("firehook_prior_refs_refused_total", {
  description: "Prior-reference rows not stored because the table is full"
})
const EVENTS_QUARANTINED = { description: "Events quarantined, by reason" }

/** labelled counters, created once (building a tagged key per event is measurable on the hot path) */
const memo = <K extends string, A>(make: (k: K) => A) => {
  const cache = new Map<K, A>()
  return (k: K): A => {
    let v = cache.get(k)
    if (v === undefined) {
      v = make(k)
      cache.set(k, v)
    }
    return v
  }
}
const processedBy = memo((outcome: string) => labelledCounter("firehook_events_processed_total", EVENTS_PROCESSED, { outcome }))
const quarantinedBy = memo((reason: string) =>
  labelledCounter("firehook_events_quarantined_total", EVENTS_QUARANTINED, { reason })
)

/** a key's row as a batch sees it (`bytes` is only known for rows the batch wrote) */
interface BatchRow {
  readonly rev: string
  readonly refs: ReadonlyArray<string>
  readonly bytes: number
  readonly live: boolean
}
const emptyKeys: ReadonlySet<string> = new Set()
// the outcomes without data, shared (one allocation per event less)
const ACKNOWLEDGED: EventOutcome = { _tag: "acknowledged" }
const MALFORMED: EventOutcome = { _tag: "malformed" }
const NO_MATCH: EventOutcome = { _tag: "no_match" }

const recordUri = (e: RecordEvent) => `at://${e.did}/${e.collection}/${e.rkey}`

/** Fit the relevant refs to the row bounds (≤ maxRefs, ≤ maxBytes of JSON). */
const boundRefs = (uris: ReadonlyArray<string>, limits: PriorRefLimits): { refs: Array<string>; bytes: number } => {
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

interface Request {
  readonly batch: ReadonlyArray<StreamEvent>
  readonly options: ProcessOptions
  readonly result: Deferred.Deferred<BatchResult, StoreError>
}

/** prior-reference state of batches planned together (as if they were one batch) */
interface Shared {
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
const newShared = (): Shared => ({
  current: new Map(),
  stored: new Map(),
  read: new Set(),
  lastRemoveRev: new Map(),
  batchWritten: new Set(),
  writtenDids: new Set(),
  addedKeys: []
})

/** `options` win over the configuration's limits ({@link priorLimitsFromConfig}). */
export const make = (options: Partial<PriorRefLimits> = {}) =>
  Effect.gen(function* () {
    const config = yield* FirehookConfig
    const priorLimits: PriorRefLimits = { ...priorLimitsFromConfig(config.priorRefs), ...options }
    const registry = yield* Registry
    const priorStore = yield* PriorRefsStore
    const tx = yield* Tx
    const outboxStore = yield* Outbox.OutboxStore
    const index = registry.index
    const outboxLimits = Outbox.defaultLimits(config.registry.activeMax)
    // the in-memory index of prior-reference keys (SPEC §2.4), with the count of keys per DID
    // (most events are from DIDs with none: their record URI is then never looked up)
    const keys = new Set<string>()
    const keyDids = new Map<string, number>()
    const didOf = (uri: string) => uri.slice(5, uri.indexOf("/", 5))
    const addKey = (uri: string) => {
      if (keys.has(uri)) return
      keys.add(uri)
      const did = didOf(uri)
      keyDids.set(did, (keyDids.get(did) ?? 0) + 1)
    }
    const deleteKey = (uri: string) => {
      if (!keys.delete(uri)) return
      const did = didOf(uri)
      const n = (keyDids.get(did) ?? 1) - 1
      if (n <= 0) keyDids.delete(did)
      else keyDids.set(did, n)
    }
    for (const k of yield* priorStore.keys(priorLimits.maxRows + 1)) addKey(k)
    let keysComplete = keys.size <= priorLimits.maxRows
    let tooComplex = 0
    let refused = 0
    let lastRefusalWarning = Number.NEGATIVE_INFINITY
    const isBacklinkDid = (did: string) => index.isBacklinkDid(did)

    /**
     * Match a batch: registry mutations (applied here, in the caller's transaction), prior
     * references (read once, applied in memory to `shared`: batches planned together see each
     * other's changes as if they were one batch), outbox rows prepared. Writes nothing else.
     */
    const plan = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions, shared: Shared) =>
      Effect.gen(function* () {
        const outcomes: Array<EventOutcome> = new Array(batch.length)
        const items: Array<Outbox.EnqueueItem> = []
        const itemIndex: Array<number> = []
        const quarantine: Array<Outbox.QuarantineRow> = []
        let batchTooComplex = 0
        let batchRefused = 0
        const registryOutcomes: Array<WhEventOutcome | undefined> = new Array(batch.length)
        const { batchWritten, writtenDids, addedKeys, current, stored, read, lastRemoveRev } = shared
        // (DID tests first: most events are from DIDs with no stored key, whose record URI is then
        // neither built nor hashed)

        const quarantineEvent = (i: number, e: RecordEvent, reason: Outbox.QuarantineReason) => {
          quarantine.push({
            stream: e.stream,
            relay: e.relay,
            reason,
            eventHash: eventId(e),
            cursor: toBigInt(e.cursor)
          })
          const registryOutcome = registryOutcomes[i]
          outcomes[i] =
            registryOutcome === undefined
              ? { _tag: "quarantined", reason }
              : { _tag: "quarantined", reason, registry: registryOutcome }
        }

        // prior references, a batch at a time: one read of every stored row this batch may touch
        // (the key index says which may exist), then the batch's puts and removes are applied to
        // those rows here, in order (the store's rules: monotonic on rev, an expired row counts as
        // absent), and each touched key's final state is written in one statement at the end.
        // A key the index says is absent is written with the store's own rev condition instead.
        const uris: Array<string | undefined> = new Array(batch.length)
        const valid: Array<boolean> = new Array(batch.length)
        /** event i's record URI, built once and only when needed */
        const uriAt = (i: number, e: RecordEvent) => {
          const u = uris[i]
          if (u !== undefined) return u
          const v = recordUri(e)
          uris[i] = v
          return v
        }
        // (DID tests first: most events are from DIDs with no stored key, whose record URI is then
        // neither built nor hashed)
        const mayHavePrior = (i: number, e: RecordEvent) => !keysComplete || (keyDids.has(e.did) && keys.has(uriAt(i, e)))
        const mayHave = (i: number, e: RecordEvent) =>
          (writtenDids.has(e.did) && batchWritten.has(uriAt(i, e))) || mayHavePrior(i, e)
        const toRead: Array<string> = []
        for (let i = 0; i < batch.length; i++) {
          const e = batch[i]
          if (e === undefined || e.kind !== "commit" || !isWellFormedRecordEvent(e)) continue
          valid[i] = true
          if (mayHavePrior(i, e)) {
            const uri = uriAt(i, e)
            if (!read.has(uri) && !current.has(uri)) {
              read.add(uri)
              toRead.push(uri)
            }
          }
        }
        if (toRead.length > 0) for (const [k, v] of yield* priorStore.read(toRead)) stored.set(k, v)
        const rowOf = (uri: string): BatchRow | null => {
          const c = current.get(uri)
          if (c !== undefined) return c
          const r = stored.get(uri)
          return r === undefined ? null : { rev: r.rev, refs: r.refs, bytes: 0, live: r.live }
        }
        /** the store's put: write over an older rev, an expired row, or none */
        const put = (uri: string, rev: string, refs: ReadonlyArray<string>, bytes: number): boolean => {
          const r = rowOf(uri)
          if (r !== null && r.live && !(r.rev < rev)) return false
          current.set(uri, { rev, refs, bytes, live: priorLimits.ttlSeconds > 0 })
          return true
        }
        /** the store's remove: delete an older rev or an expired row */
        const remove = (uri: string, rev: string): boolean => {
          const r = rowOf(uri)
          if (r === null || (r.live && !(r.rev < rev))) return false
          current.set(uri, null)
          lastRemoveRev.set(uri, rev)
          return true
        }

        for (let i = 0; i < batch.length; i++) {
          const e = batch[i]
          if (e === undefined) continue
          if (e.kind !== "commit") {
            outcomes[i] = ACKNOWLEDGED
            continue
          }
          if (valid[i] !== true) {
            outcomes[i] = MALFORMED
            continue
          }
          const isWh = e.collection === WH_COLLECTION
          if (isWh && options.registryWriter) {
            const r = yield* registry.applyWhEvent(e)
            registryOutcomes[i] = r
            if (r._tag === "rejected") {
              quarantineEvent(i, e, "invalid_subscription")
              // the record is still an event other webhooks may watch: fall through to matching
            }
          }
          const record = e.operation === "delete" ? undefined : isWh ? sanitizeWhRecordForDelivery(e.record) : e.record

          // references: only worth walking when some backlink scope exists
          let newRefs: ReadonlyArray<{ readonly uri: string } & ScopeUri> = []
          let eventTooComplex = false
          if (record !== undefined && index.backlinkDids().size > 0) {
            const extracted = extractReferences(record, isBacklinkDid)
            if (extracted.tooComplex) {
              batchTooComplex++
              eventTooComplex = true
            } else newRefs = extracted.refs
          }
          // a too-complex event is matched with no references at all, not even its stored prior
          // ones (SPEC §2.3: backlink matching is skipped); its row is still cleared below (its
          // new references are the empty set, SPEC §2.4), so a later update or delete does not
          // match on references the record may no longer hold
          let refs: ReadonlyArray<ScopeUri> = newRefs
          if (!eventTooComplex && e.operation !== "create" && mayHave(i, e)) {
            const prior = rowOf(uriAt(i, e))
            if (prior !== null && prior.live && prior.refs.length > 0) {
              const merged: Array<ScopeUri> = [...newRefs]
              const seen = new Set(newRefs.map((r) => r.uri))
              for (const p of prior.refs) {
                if (seen.has(p)) continue
                const parsed = parseScopeUri(p)
                if (parsed !== undefined) merged.push(parsed)
              }
              refs = merged
            }
          }

          const matches = matchEvent(index, e, refs)
          if (matches.length > 0) {
            const payload = buildPayload(e, record)
            if (Either.isLeft(payload)) {
              quarantineEvent(i, e, payload.left satisfies CanonicalError)
            } else {
              items.push({ event: e, payload: payload.right, matches })
              itemIndex.push(i)
            }
          } else if (outcomes[i] === undefined) {
            const r = registryOutcomes[i]
            outcomes[i] = r === undefined ? NO_MATCH : { _tag: "no_match", registry: r }
          }

          // prior references: monotonic on the record's rev; irrelevant records touch nothing
          if (e.operation === "delete") {
            if (mayHave(i, e) && remove(uriAt(i, e), e.rev)) {
              batchWritten.delete(uriAt(i, e))
            }
          } else if (newRefs.length > 0) {
            const isNew = !keys.has(uriAt(i, e)) && !batchWritten.has(uriAt(i, e))
            if (isNew && keys.size + addedKeys.length >= priorLimits.maxRows) {
              batchRefused++
            } else {
              const { refs: kept, bytes } = boundRefs(
                newRefs.map((r) => r.uri),
                priorLimits
              )
              if (put(uriAt(i, e), e.rev, kept, bytes)) {
                if (isNew) addedKeys.push(uriAt(i, e))
                batchWritten.add(uriAt(i, e))
                writtenDids.add(e.did)
              }
            }
          } else if (mayHave(i, e)) {
            if (remove(uriAt(i, e), e.rev)) {
              batchWritten.delete(uriAt(i, e))
            }
          }
        }

        // outbox rows within the bounds; an item over them is quarantined (known before writing)
        const prepared = Outbox.prepare(items, outboxLimits)
        const accepted = new Set<number>()
        for (const x of prepared.accepted) accepted.add(x.index)
        for (let j = 0; j < items.length; j++) {
          const i = itemIndex[j]
          const item = items[j]
          if (i !== undefined && item !== undefined && !accepted.has(j)) quarantineEvent(i, item.event, "fanout_limit")
        }
        /** the outcomes once written: a corrupt item is quarantined (by the caller's write) */
        const settle = (enqueued: Outbox.EnqueueResult) => {
          for (const x of prepared.accepted) {
            const i = itemIndex[x.index]
            const item = items[x.index]
            const o = enqueued.outcomes[x.index]
            if (i === undefined || item === undefined || o === undefined) continue
            if (o._tag === "enqueued") {
              if (outcomes[i] === undefined) {
                const r = registryOutcomes[i]
                outcomes[i] =
                  r === undefined
                    ? { _tag: "enqueued", deliveries: o.rows }
                    : { _tag: "enqueued", deliveries: o.rows, registry: r }
              }
            } else {
              quarantineEvent(i, item.event, o._tag)
            }
          }
          return enqueued
        }
        const corruption: Array<Outbox.CorruptionCandidate> = []
        for (const x of prepared.accepted) {
          const e = items[x.index]?.event
          if (e === undefined) continue
          corruption.push({
            eventId: x.body.eventId,
            row: { stream: e.stream, relay: e.relay, reason: "corruption", eventHash: eventId(e), cursor: toBigInt(e.cursor) }
          })
        }
        return { outcomes, quarantine, prepared, corruption, settle, batchTooComplex, batchRefused }
      })

    type Plan = Effect.Effect.Success<ReturnType<typeof plan>>
    interface Done {
      readonly plan: Plan
      readonly enqueued: Outbox.EnqueueResult
    }
    /** what a unit of work (one transaction, or one statement for a group of batches) wrote */
    interface UnitDone {
      readonly done: ReadonlyArray<Done>
      readonly removedKeys: ReadonlyArray<string>
      readonly written: ReadonlySet<string>
    }

    /**
     * Each touched key's final state, written in one statement; the key index follows the final
     * states after commit (a key removed and written again in one batch stays in it). A key read
     * from the store is written over whatever is stored (the plan decided); one the index said was
     * absent keeps the store's own rev condition.
     */
    const priorWriteOf = (shared: Shared) => {
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
      const prior: PriorRefsWrite = { upserts, deletes, ttlSeconds: priorLimits.ttlSeconds }
      return { prior, removedKeys }
    }

    /** one batch in one transaction: separate statements, then `finalize` */
    const inTransaction = (req: Request): Effect.Effect<UnitDone, StoreError> => {
      const shared = newShared()
      return Effect.gen(function* () {
        const p = yield* plan(req.batch, req.options, shared)
        const { prior, removedKeys } = priorWriteOf(shared)
        const written = prior === undefined ? emptyKeys : yield* priorStore.write(prior)
        const w = yield* Outbox.write(p.prepared).pipe(Effect.provideService(Outbox.OutboxStore, outboxStore))
        const enqueued = p.settle(Outbox.finish(p.prepared, w))
        if (p.quarantine.length > 0) yield* outboxStore.insertQuarantine(p.quarantine)
        if (req.options.finalize !== undefined) yield* req.options.finalize
        const unit: UnitDone = { done: [{ plan: p, enqueued }], removedKeys, written }
        return unit
      }).pipe(tx.withTransaction)
    }

    const commitBatch = outboxStore.commitBatch
    /**
     * A batch that writes no registry rows can be written by ONE statement (atomic on its own: no
     * BEGIN/COMMIT round trips), with its cursor as data; its prior-reference read is done before
     * (batches are serialized and this process is the only writer of prior references, so what
     * was read is what the statement writes over).
     */
    const oneStatement = (req: Request) =>
      commitBatch !== undefined &&
      (req.options.finalize === undefined || req.options.cursor !== undefined) &&
      !(req.options.registryWriter && req.batch.some((e) => e.kind === "commit" && e.collection === WH_COLLECTION))

    /**
     * Consecutive one-statement batches (typically one per stream that was waiting) in ONE
     * statement, planned as if they were one batch: each sees what the ones before it changed.
     * All of them commit, or none (the caller then retries them one by one). `undefined` when the
     * group does not fit one statement.
     */
    const inOneStatement = (reqs: ReadonlyArray<Request>): Effect.Effect<UnitDone | undefined, StoreError> =>
      Effect.gen(function* () {
        if (commitBatch === undefined) return undefined
        const shared = newShared()
        const plans: Array<Plan> = []
        for (const req of reqs) plans.push(yield* plan(req.batch, req.options, shared))
        const { prior, removedKeys } = priorWriteOf(shared)
        const bodies = new Map<string, Outbox.EventBody>()
        const rows: Array<Outbox.OutboxRow> = []
        const corruption: Array<Outbox.CorruptionCandidate> = []
        const quarantine: Array<Outbox.QuarantineRow> = []
        const cursors: Array<CursorWrite> = []
        for (let k = 0; k < plans.length; k++) {
          const p = plans[k]
          const cursor = reqs[k]?.options.cursor
          if (p === undefined) continue
          for (const b of p.prepared.bodies) if (!bodies.has(b.eventId)) bodies.set(b.eventId, b)
          for (const r of p.prepared.rows) rows.push(r)
          for (const c of p.corruption) corruption.push(c)
          // the quarantine rows known now; corrupt items' rows are inserted by the statement
          for (const q of p.quarantine) quarantine.push(q)
          if (cursor !== undefined) cursors.push(cursor)
        }
        const bodyList = [...bodies.values()]
        if (!Outbox.fitsOneChunk(bodyList, rows, outboxLimits)) return undefined
        const r = yield* commitBatch({ prior, bodies: bodyList, rows, corruption, quarantine, cursors })
        // rows inserted, by batch in order (a row two batches share counts for the first)
        const counted = new Set<string>()
        const done: Array<Done> = []
        for (const p of plans) {
          let inserted = 0
          for (const row of p.prepared.rows) {
            if (r.insertedIds.has(row.deliveryId) && !counted.has(row.deliveryId)) {
              counted.add(row.deliveryId)
              inserted++
            }
          }
          done.push({ plan: p, enqueued: p.settle(Outbox.finish(p.prepared, { existing: r.existing, inserted })) })
        }
        const unit: UnitDone = { done, removedKeys, written: r.priorWritten }
        return unit
      })

    /** after commit: key index, counters, metrics */
    const account = (unit: UnitDone) =>
      Effect.gen(function* () {
        for (const k of unit.removedKeys) deleteKey(k)
        for (const k of unit.written) addKey(k)
        if (keys.size > priorLimits.maxRows) keysComplete = false
        let batchRefused = 0
        let inserted = 0
        let duplicates = 0
        let batchTooComplex = 0
        const byReason = new Map<string, number>()
        const byOutcome = new Map<EventOutcome["_tag"], number>()
        for (const { enqueued, plan: p } of unit.done) {
          batchTooComplex += p.batchTooComplex
          batchRefused += p.batchRefused
          inserted += enqueued.inserted
          duplicates += enqueued.duplicates
          for (const q of p.quarantine) byReason.set(q.reason, (byReason.get(q.reason) ?? 0) + 1)
          for (const o of p.outcomes) if (o !== undefined) byOutcome.set(o._tag, (byOutcome.get(o._tag) ?? 0) + 1)
        }
        tooComplex += batchTooComplex
        refused += batchRefused
        yield* Metric.incrementBy(tooComplexMetric, batchTooComplex)
        yield* Metric.incrementBy(Outbox.metrics.inserted, inserted)
        yield* Metric.incrementBy(Outbox.metrics.duplicates, duplicates)
        for (const [reason, n] of byReason) yield* Metric.incrementBy(quarantinedBy(reason), n)
        for (const [outcome, n] of byOutcome) yield* Metric.incrementBy(processedBy(outcome), n)
        if (batchRefused > 0) {
          yield* Metric.incrementBy(priorRefsRefusedMetric, batchRefused)
          const now = yield* Effect.clockWith((c) => c.currentTimeMillis)
          if (now - lastRefusalWarning >= 60_000) {
            lastRefusalWarning = now
            yield* Effect.logWarning("prior-reference table full: new keys refused").pipe(Effect.annotateLogs({ refused }))
          }
        }
      })

    const resultOf = ({ enqueued, plan: p }: Done): BatchResult => ({
      outcomes: p.outcomes,
      inserted: enqueued.inserted,
      duplicates: enqueued.duplicates,
      quarantined: p.quarantine.length
    })

    /** run a unit of work (registry changes undone if it fails), account for it, answer its batches */
    const settleUnit = (reqs: ReadonlyArray<Request>, unit: Effect.Effect<UnitDone, StoreError>) =>
      Effect.gen(function* () {
        const exit = yield* Effect.exit(
          unit.pipe(
            registry.transactional,
            Effect.tap(account),
            Effect.withSpan("Processor.processEvents", {
              attributes: { events: reqs.reduce((n, r) => n + r.batch.length, 0), batches: reqs.length }
            })
          )
        )
        for (let k = 0; k < reqs.length; k++) {
          const req = reqs[k]
          if (req === undefined) continue
          if (Exit.isSuccess(exit)) {
            const done = exit.value.done[k]
            yield* Deferred.done(req.result, done === undefined ? Exit.die("no result") : Exit.succeed(resultOf(done)))
          } else yield* Deferred.failCause(req.result, exit.cause)
        }
        return Exit.isSuccess(exit)
      })

    /** one batch on its own: one statement when it can, else one transaction */
    const alone = (req: Request) =>
      settleUnit(
        [req],
        oneStatement(req)
          ? Effect.flatMap(inOneStatement([req]), (u) => (u === undefined ? inTransaction(req) : Effect.succeed(u)))
          : inTransaction(req)
      )

    // Batches are committed by one worker, in arrival order (first come, first served: a busy
    // stream cannot starve the others). Batches that arrived together and can each be written by
    // one statement are written together by one statement; if that fails, one by one.
    const requests = yield* Queue.bounded<Request>(64)
    const inProgress = new Set<Request>()
    const worker = Effect.gen(function* () {
      // taken, not yet committed (in arrival order)
      const pending: Array<Request> = []
      for (;;) {
        if (pending.length === 0) {
          pending.push(yield* Queue.take(requests))
          // let a stream whose batch just committed queue its next one, so they are written together
          yield* Effect.yieldNow()
        }
        for (const r of yield* Queue.takeAll(requests)) pending.push(r)
        for (const r of pending) inProgress.add(r)
        // the head of the line, alone or with the one-statement batches right behind it
        let n = 0
        while (n < pending.length && oneStatement(pending[n] as Request)) n++
        const group = pending.splice(0, Math.max(1, n))
        const head = group[0]
        if (head === undefined) continue
        if (group.length === 1) {
          yield* alone(head)
        } else {
          const together = yield* Effect.either(inOneStatement(group).pipe(registry.transactional))
          if (Either.isRight(together) && together.right !== undefined) {
            yield* settleUnit(group, Effect.succeed(together.right))
          } else {
            for (const r of group) yield* alone(r)
          }
        }
        for (const r of group) inProgress.delete(r)
      }
    }).pipe(
      Effect.onInterrupt(() =>
        Effect.gen(function* () {
          for (const r of inProgress) yield* Deferred.interrupt(r.result)
          for (const r of yield* Queue.takeAll(requests)) yield* Deferred.interrupt(r.result)
        })
      )
    )
    yield* Effect.forkScoped(worker)

    const processEvents = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions) =>
      Effect.gen(function* () {
        const result = yield* Deferred.make<BatchResult, StoreError>()
        yield* Queue.offer(requests, { batch, options, result })
        return yield* Deferred.await(result)
      })

    const stats = Effect.sync(
      (): ProcessorStats => ({
        tooComplex,
        priorRefsRefused: refused,
        priorRefKeys: keys.size,
        priorRefIndexComplete: keysComplete
      })
    )
    const shape: ProcessorShape = { processEvents, stats }
    return shape
  })

const toBigInt = (s: string): bigint | undefined => (/^(0|[1-9]\d{0,18})$/.test(s) ? BigInt(s) : undefined)

export const layer = (priorLimits?: Partial<PriorRefLimits>) =>
  Layer.scoped(
    Processor,
    Effect.gen(function* () {
      const processor = yield* make(priorLimits)
      const health = yield* Effect.serviceOption(Health)
      if (Option.isSome(health)) {
        yield* health.value.register(
          "matching",
          Effect.map(processor.stats, (s) => ({
            ready: true,
            body: {
              tooComplex: s.tooComplex,
              priorRefsRefused: s.priorRefsRefused,
              priorRefKeys: s.priorRefKeys,
              priorRefIndexComplete: s.priorRefIndexComplete
            }
          }))
        )
      }
      return processor
    })
  )
