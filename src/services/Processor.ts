/**
 * `processEvents(batch)`: the one entry point from intake into matching (SPEC §2, §3.3–3.5).
 *
 * Inside ONE transaction it applies registry mutations for wh-record events (when the batch comes
 * from the registry writer), matches every event against the in-memory index (direct, backlink with
 * prior references), writes prior references, enqueues outbox rows, records quarantines, and finally
 * runs the caller's `finalize` statement (the intake's cursor write), so a crash at any instant
 * loses nothing: either the whole batch and its cursor commit, or none of it does.
 *
 * Batches are serialized (one at a time across all streams), so registry mutations are serialized
 * and each is visible to the next event processed. If the transaction fails, the in-memory changes
 * it made are undone.
 */
import { Context, Effect, Either, Layer, Metric, Option, Queue } from "effect"
import { buildPayload, eventId, type CanonicalError } from "../matching/Canonical.js"
import { matchEvent } from "../matching/Match.js"
import { extractReferences, utf8Length } from "../matching/References.js"
import { parseScopeUri, type ScopeUri } from "../schemas/AtUri.js"
import { isWellFormedRecordEvent, type RecordEvent, type StreamEvent } from "../schemas/RecordEvent.js"
import { sanitizeWhRecordForDelivery, WH_COLLECTION } from "../schemas/WhRecord.js"
import { FirehookConfig } from "./Config.js"
import { Health } from "./Health.js"
import * as Outbox from "./Outbox.js"
import type { CursorWrite } from "./CursorStore.js"
import {
  type PriorRefsDelete,
  type PriorRefsRow,
  PriorRefsStore,
  type PriorRefsUpsert,
  type PriorRefsWrite
} from "./PriorRefsStore.js"
import { Registry, type WhEventOutcome } from "./Registry.js"
import { type StoreError, Tx } from "./Store.js"

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

export const defaultPriorRefLimits: PriorRefLimits = {
  maxRefs: 100,
  maxBytes: 32 * 1024,
  ttlSeconds: 7 * 24 * 3600,
  maxRows: 100_000
}

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

const eventsProcessed = Metric.counter("firehook_events_processed_total", {
  description: "Stream events processed, by outcome"
})
const tooComplexMetric = Metric.counter("firehook_events_too_complex_total", {
  description: "Records whose reference walk hit a bound (backlink matching skipped)"
})
const priorRefsRefusedMetric = Metric.counter("firehook_prior_refs_refused_total", {
  description: "Prior-reference rows not stored because the table is full"
})
const quarantinedMetric = Metric.counter("firehook_events_quarantined_total", {
  description: "Events quarantined, by reason"
})

/** tagged counters, created once (building a tagged key per event is measurable on the hot path) */
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
const processedBy = memo((outcome: string) => Metric.tagged(eventsProcessed, "outcome", outcome))
const quarantinedBy = memo((reason: string) => Metric.tagged(quarantinedMetric, "reason", reason))

/** a key's row as a batch sees it (`bytes` is only known for rows the batch wrote) */
interface BatchRow {
  readonly rev: string
  readonly refs: ReadonlyArray<string>
  readonly bytes: number
  readonly live: boolean
}
const emptyRows: ReadonlyMap<string, PriorRefsRow> = new Map()
const emptyKeys: ReadonlySet<string> = new Set()

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

export const make = (priorLimits: PriorRefLimits = defaultPriorRefLimits) =>
  Effect.gen(function* () {
    const config = yield* FirehookConfig
    const registry = yield* Registry
    const priorStore = yield* PriorRefsStore
    const tx = yield* Tx
    const outboxStore = yield* Outbox.OutboxStore
    const index = registry.index
    const outboxLimits = Outbox.defaultLimits(config.registry.activeMax)
    // a first-come-first-served lock (one token in a queue: the longest-waiting taker gets it), so
    // a busy stream cannot starve the others between its batches
    const token = yield* Queue.bounded<void>(1)
    yield* Queue.offer(token, undefined)
    const serialized = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
      Effect.acquireUseRelease(Queue.take(token), () => eff, () => Queue.offer(token, undefined))

    // the in-memory index of prior-reference keys (SPEC §2.4)
    const keys = new Set<string>(yield* priorStore.keys(priorLimits.maxRows + 1))
    let keysComplete = keys.size <= priorLimits.maxRows
    let tooComplex = 0
    let refused = 0
    let lastRefusalWarning = Number.NEGATIVE_INFINITY
    const mayHavePrior = (uri: string) => !keysComplete || keys.has(uri)

    /**
     * Match a batch: registry mutations (applied here, in the caller's transaction), prior
     * references (read once, applied in memory), outbox rows prepared. Writes nothing else.
     */
    const plan = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions) =>
      Effect.gen(function* () {
        const outcomes: Array<EventOutcome> = new Array(batch.length)
        const items: Array<Outbox.EnqueueItem> = []
        const itemIndex: Array<number> = []
        const quarantine: Array<Outbox.QuarantineRow> = []
        // new keys this batch wrote (counted against the table's row limit)
        const addedKeys: Array<string> = []
        let batchTooComplex = 0
        let batchRefused = 0
        const registryOutcomes: Array<WhEventOutcome | undefined> = new Array(batch.length)
        // keys written earlier in this batch: not in the key index until commit, but visible to
        // later events of the batch (a record created and deleted in one batch still matches)
        const batchWritten = new Set<string>()
        const mayHave = (uri: string) => batchWritten.has(uri) || mayHavePrior(uri)

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
        const toRead = new Set<string>()
        for (let i = 0; i < batch.length; i++) {
          const e = batch[i]
          if (e === undefined || e.kind !== "commit" || !isWellFormedRecordEvent(e)) continue
          const uri = recordUri(e)
          uris[i] = uri
          if (mayHavePrior(uri)) toRead.add(uri)
        }
        const stored: ReadonlyMap<string, PriorRefsRow> = toRead.size === 0 ? emptyRows : yield* priorStore.read([...toRead])
        // the batch's view: a key's current row (null = absent) once the batch has touched it
        const current = new Map<string, BatchRow | null>()
        const lastRemoveRev = new Map<string, string>()
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
            outcomes[i] = { _tag: "acknowledged" }
            continue
          }
          const uri = uris[i]
          if (uri === undefined) {
            outcomes[i] = { _tag: "malformed" }
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
          if (record !== undefined && index.backlinkDids().size > 0) {
            const extracted = extractReferences(record, (did) => index.isBacklinkDid(did))
            if (extracted.tooComplex) batchTooComplex++
            else newRefs = extracted.refs
          }
          let refs: ReadonlyArray<ScopeUri> = newRefs
          if (e.operation !== "create" && mayHave(uri)) {
            const prior = rowOf(uri)
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
            outcomes[i] = r === undefined ? { _tag: "no_match" } : { _tag: "no_match", registry: r }
          }

          // prior references: monotonic on the record's rev; irrelevant records touch nothing
          if (e.operation === "delete") {
            if (mayHave(uri) && remove(uri, e.rev)) {
              batchWritten.delete(uri)
            }
          } else if (newRefs.length > 0) {
            const isNew = !keys.has(uri) && !batchWritten.has(uri)
            if (isNew && keys.size + addedKeys.length >= priorLimits.maxRows) {
              batchRefused++
            } else {
              const { refs: kept, bytes } = boundRefs(
                newRefs.map((r) => r.uri),
                priorLimits
              )
              if (put(uri, e.rev, kept, bytes)) {
                if (isNew) addedKeys.push(uri)
                batchWritten.add(uri)
              }
            }
          } else if (mayHave(uri)) {
            if (remove(uri, e.rev)) {
              batchWritten.delete(uri)
            }
          }
        }

        // each touched key's final state, written in one statement; the key index follows the
        // final states after commit (a key removed and written again in one batch stays in it)
        const removedKeys: Array<string> = []
        let prior: PriorRefsWrite | undefined
        if (current.size > 0) {
          const upserts: Array<PriorRefsUpsert> = []
          const deletes: Array<PriorRefsDelete> = []
          for (const [uri, row] of current) {
            const exact = toRead.has(uri)
            if (row === null) {
              deletes.push({ recordUri: uri, olderThan: exact ? undefined : lastRemoveRev.get(uri) })
              removedKeys.push(uri)
            } else upserts.push({ recordUri: uri, rev: row.rev, refs: row.refs, bytes: row.bytes, force: exact })
          }
          prior = { upserts, deletes, ttlSeconds: priorLimits.ttlSeconds }
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
        return {
          outcomes,
          quarantine,
          prior,
          removedKeys,
          prepared,
          corruption,
          settle,
          batchTooComplex,
          batchRefused
        }
      })

    type Plan = Effect.Effect.Success<ReturnType<typeof plan>>
    interface Done {
      readonly plan: Plan
      readonly enqueued: Outbox.EnqueueResult
      readonly written: ReadonlySet<string>
    }

    /** a plan's writes as separate statements (inside the caller's transaction), then `finalize` */
    const writeInTransaction = (p: Plan, options: ProcessOptions) =>
      Effect.gen(function* () {
        const written = p.prior === undefined ? emptyKeys : yield* priorStore.write(p.prior)
        const w = yield* Outbox.write(p.prepared).pipe(Effect.provideService(Outbox.OutboxStore, outboxStore))
        const enqueued = p.settle(Outbox.finish(p.prepared, w))
        if (p.quarantine.length > 0) yield* outboxStore.insertQuarantine(p.quarantine)
        if (options.finalize !== undefined) yield* options.finalize
        const done: Done = { plan: p, enqueued, written }
        return done
      })

    const commitBatch = outboxStore.commitBatch
    /**
     * A batch that writes no registry rows and fits one statement is written by ONE statement
     * (atomic on its own: no BEGIN/COMMIT round trips), its prior-reference read done before it
     * (batches are serialized and this process is the only writer of prior references, so what
     * was read is what the statement writes over). Otherwise one transaction, as before.
     */
    const oneStatement = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions) =>
      commitBatch !== undefined &&
      (options.finalize === undefined || options.cursor !== undefined) &&
      !(options.registryWriter && batch.some((e) => e.kind === "commit" && e.collection === WH_COLLECTION))

    const run = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions): Effect.Effect<Done, StoreError> => {
      if (commitBatch === undefined || !oneStatement(batch, options)) {
        return Effect.flatMap(plan(batch, options), (p) => writeInTransaction(p, options)).pipe(tx.withTransaction)
      }
      return Effect.flatMap(plan(batch, options), (p): Effect.Effect<Done, StoreError> => {
        if (!p.prepared.oneChunk) return tx.withTransaction(writeInTransaction(p, options))
        // the quarantine rows known now are inserted with the batch; corrupt items' rows are
        // inserted by the statement, which alone can tell
        const known = p.quarantine.slice()
        return Effect.map(
          commitBatch({
            prior: p.prior,
            bodies: p.prepared.bodies,
            rows: p.prepared.rows,
            corruption: p.corruption,
            quarantine: known,
            cursor: options.cursor
          }),
          (r): Done => ({ plan: p, enqueued: p.settle(Outbox.finish(p.prepared, r)), written: r.priorWritten })
        )
      })
    }

    const processEvents = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions) =>
      run(batch, options).pipe(
        registry.transactional,
        // after commit: key index, counters, metrics
        Effect.tap(({ enqueued, plan: done, written }) =>
          Effect.gen(function* () {
            for (const k of done.removedKeys) keys.delete(k)
            for (const k of written) keys.add(k)
            if (keys.size > priorLimits.maxRows) keysComplete = false
            tooComplex += done.batchTooComplex
            refused += done.batchRefused
            yield* Metric.incrementBy(tooComplexMetric, done.batchTooComplex)
            yield* Metric.incrementBy(Outbox.metrics.inserted, enqueued.inserted)
            yield* Metric.incrementBy(Outbox.metrics.duplicates, enqueued.duplicates)
            const byReason = new Map<string, number>()
            for (const q of done.quarantine) byReason.set(q.reason, (byReason.get(q.reason) ?? 0) + 1)
            for (const [reason, n] of byReason) yield* Metric.incrementBy(quarantinedBy(reason), n)
            const byOutcome = new Map<EventOutcome["_tag"], number>()
            for (const o of done.outcomes) if (o !== undefined) byOutcome.set(o._tag, (byOutcome.get(o._tag) ?? 0) + 1)
            for (const [outcome, n] of byOutcome) yield* Metric.incrementBy(processedBy(outcome), n)
            if (done.batchRefused > 0) {
              yield* Metric.incrementBy(priorRefsRefusedMetric, done.batchRefused)
              const now = yield* Effect.clockWith((c) => c.currentTimeMillis)
              if (now - lastRefusalWarning >= 60_000) {
                lastRefusalWarning = now
                yield* Effect.logWarning("prior-reference table full: new keys refused").pipe(
                  Effect.annotateLogs({ refused })
                )
              }
            }
          })
        ),
        Effect.map(
          ({ enqueued, plan: done }): BatchResult => ({
            outcomes: done.outcomes,
            inserted: enqueued.inserted,
            duplicates: enqueued.duplicates,
            quarantined: done.quarantine.length
          })
        ),
        serialized,
        Effect.withSpan("Processor.processEvents", { attributes: { events: batch.length } })
      )

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

export const layer = (priorLimits?: PriorRefLimits) =>
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
