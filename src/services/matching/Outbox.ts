/**
 * The outbox, write side (SPEC §3.5): payload bodies stored once per event, one row per matched
 * webhook, keyed by delivery id so replays never duplicate a delivery (an untried row of another
 * version of the webhook is moved to the newer one: OutboxSql `onConflict`), chunked inserts, the
 * fan-out/size bounds, corruption detection, quarantine rows, and a `NOTIFY` in the same
 * transaction that wakes the delivery workers on commit.
 */
import { Context, Effect, Layer, Metric } from "effect"
import type { RecordEvent } from "../../schemas/RecordEvent.js"
import type * as CursorStore from "../intake/CursorStore.js"
import type { StoreError } from "../platform/Persistence.js"
import { deliveryId, type Payload, sha256Hex } from "./Canonical.js"
import type { MatchResult } from "./Match.js"
import { layerState, makeMemory } from "./OutboxMemory.js"
import { makeSql } from "./OutboxSql.js"
import type { OutboxOperation } from "./OutboxStatus.js"
import type * as PriorRefsStore from "./PriorRefsStore.js"
import type { SigningMode } from "./WebhookIndex.js"

export { ORIGIN_SQL, originKey } from "./Origin.js"
export { type MemoryOutbox, MemoryOutboxState } from "./OutboxMemory.js"
export { NOTIFY_CHANNEL } from "./OutboxNotify.js"
export { makeSql } from "./OutboxSql.js"

export interface OutboxRow {
  readonly deliveryId: string
  readonly eventId: string
  readonly ownerDid: string
  readonly webhookRkey: string
  readonly matchKind: "direct" | "backlink"
  readonly eventDid: string
  readonly eventCollection: string
  readonly eventRkey: string
  /** `test` only for an owner's test delivery (never from a record event) */
  readonly eventOperation: OutboxOperation
  readonly targetUrl: string
  readonly signingMode: SigningMode
  readonly secretId: string | undefined
  readonly fingerprint: string
}

export interface EventBody {
  readonly eventId: string
  readonly body: string
  readonly sha256: string
}

export type QuarantineReason =
  | "payload_too_large"
  | "payload_invalid"
  | "fanout_limit"
  | "invalid_subscription"
  | "corruption"
  | "protocol"

export interface QuarantineRow {
  readonly stream: string
  readonly relay: string
  readonly reason: QuarantineReason
  /** sha256 of the event's identity; never record bytes or URLs */
  readonly eventHash: string
  readonly cursor: bigint | undefined
}

export interface OutboxStoreShape {
  /** insert bodies; returns the stored sha256 of every given id that already existed */
  readonly insertEvents: (
    bodies: ReadonlyArray<EventBody>
  ) => Effect.Effect<ReadonlyMap<string, string>, StoreError>
  /** insert rows (one chunk); returns how many were new (or an untried row moved to a new version) */
  readonly insertRows: (rows: ReadonlyArray<OutboxRow>) => Effect.Effect<number, StoreError>
  readonly insertQuarantine: (rows: ReadonlyArray<QuarantineRow>) => Effect.Effect<void, StoreError>
  readonly notify: Effect.Effect<void, StoreError>
  /**
   * `insertEvents`, then `insertRows` for the rows whose event's stored body has the given sha256
   * (an existing id with another body is corruption: its rows are not inserted), then `notify`
   * when rows were inserted: one statement, for what fits in one chunk.
   */
  readonly insertBatch: (
    bodies: ReadonlyArray<EventBody>,
    rows: ReadonlyArray<OutboxRow>
  ) => Effect.Effect<BatchInsert, StoreError>
  /** see {@link BatchCommit}; absent when the store cannot (the caller then uses a transaction) */
  readonly commitBatch?: (commit: BatchCommit) => Effect.Effect<BatchCommitResult, StoreError>
}

/** An accepted item's quarantine row, inserted if its event's stored body differs (corruption). */
export interface CorruptionCandidate {
  readonly eventId: string
  readonly row: QuarantineRow
}

/**
 * The whole durable effect of one intake batch that writes no registry rows, for a store that can
 * write it in ONE statement (atomic without a transaction, one round trip): prior-reference
 * changes, event bodies and outbox rows (one chunk) with their NOTIFY, quarantine rows (corruption
 * detected by the statement itself), and the stream cursor.
 */
export interface BatchCommit {
  readonly prior: PriorRefsStore.PriorRefsWrite | undefined
  readonly bodies: ReadonlyArray<EventBody>
  readonly rows: ReadonlyArray<OutboxRow>
  readonly corruption: ReadonlyArray<CorruptionCandidate>
  readonly quarantine: ReadonlyArray<QuarantineRow>
  /** the streams' cursor writes (distinct streams) */
  readonly cursors: ReadonlyArray<CursorStore.CursorWrite>
}

export interface BatchCommitResult extends BatchInsert {
  /** the delivery ids of the outbox rows inserted */
  readonly insertedIds: ReadonlySet<string>
  /** the prior-reference keys whose upsert was written */
  readonly priorWritten: ReadonlySet<string>
}

export interface BatchInsert {
  /** the stored sha256 of every given event id that already existed */
  readonly existing: ReadonlyMap<string, string>
  /** outbox rows inserted (new, or an untried row moved to a new version of its webhook) */
  readonly inserted: number
}

export class OutboxStore extends Context.Tag("firehook/OutboxStore")<OutboxStore, OutboxStoreShape>() {}

// ---------------------------------------------------------------------------------------------
// Drivers

/** PostgreSQL (see OutboxSql.ts). Requires a `SqlClient`. */
export const layerSql = Layer.effect(OutboxStore, makeSql)

/** In memory, with a fresh {@link MemoryOutboxState} (see OutboxMemory.ts). */
export const layerMemory = Layer.effect(OutboxStore, makeMemory).pipe(Layer.provideMerge(layerState))

// ---------------------------------------------------------------------------------------------
// Enqueue

export interface OutboxLimits {
  /** fan-out above this → fanout_limit (the active-webhook limit) */
  readonly maxFanout: number
  /** body + rows above this → fanout_limit (16 MiB) */
  readonly maxEventBytes: number
  readonly chunkRows: number
  readonly chunkBytes: number
}

export const defaultLimits = (maxFanout: number): OutboxLimits => ({
  maxFanout,
  maxEventBytes: 16 * 1024 * 1024,
  chunkRows: 1000,
  chunkBytes: 4 * 1024 * 1024
})

export interface EnqueueItem {
  readonly event: RecordEvent
  readonly payload: Payload
  readonly matches: ReadonlyArray<MatchResult>
}

export type EnqueueOutcome =
  | { readonly _tag: "enqueued"; readonly rows: number }
  | { readonly _tag: "fanout_limit" }
  | { readonly _tag: "corruption" }

export interface EnqueueResult {
  readonly outcomes: ReadonlyArray<EnqueueOutcome>
  readonly inserted: number
  readonly duplicates: number
}

const rowBytes = (r: OutboxRow): number =>
  r.deliveryId.length +
  r.eventId.length +
  r.ownerDid.length +
  r.webhookRkey.length +
  r.eventDid.length +
  r.eventCollection.length +
  r.eventRkey.length +
  r.targetUrl.length * 3 +
  r.fingerprint.length +
  (r.secretId?.length ?? 0) +
  64

export const rowsFor = (item: EnqueueItem): ReadonlyArray<OutboxRow> =>
  item.matches.map(({ webhook, match }) => ({
    deliveryId: deliveryId(item.event, webhook.ownerDid, webhook.rkey),
    eventId: item.payload.eventId,
    ownerDid: webhook.ownerDid,
    webhookRkey: webhook.rkey,
    matchKind: match,
    eventDid: item.event.did,
    eventCollection: item.event.collection,
    eventRkey: item.event.rkey,
    eventOperation: item.event.operation,
    targetUrl: webhook.url,
    signingMode: webhook.signingMode,
    secretId: webhook.secretId,
    fingerprint: webhook.fingerprint
  }))

/** Counters, incremented by the caller after its transaction commits (so retries do not overcount). */
export const metrics = {
  inserted: Metric.counter("firehook_outbox_rows_inserted_total", {
    description: "Outbox rows inserted (new deliveries)"
  }),
  duplicates: Metric.counter("firehook_outbox_rows_duplicate_total", {
    description: "Outbox rows skipped because the delivery id already existed (replays)"
  })
}

/** A batch's outbox writes, bounds applied: what `write` or a one-statement commit sends. */
export interface Prepared {
  readonly items: ReadonlyArray<EnqueueItem>
  /** index into `items`, the item's rows and its body, for items within the bounds */
  readonly accepted: ReadonlyArray<
    { readonly index: number; readonly rows: ReadonlyArray<OutboxRow>; readonly body: EventBody }
  >
  /** the accepted items' bodies, one per event id */
  readonly bodies: ReadonlyArray<EventBody>
  /** every accepted item's rows */
  readonly rows: ReadonlyArray<OutboxRow>
  /** bodies and rows each fit in one chunk (one statement can write them) */
  readonly oneChunk: boolean
  readonly limits: OutboxLimits
}

/** What the database said: stored sha256 of the event ids that existed, outbox rows inserted. */
export interface Written {
  readonly existing: ReadonlyMap<string, string>
  readonly inserted: number
}

/**
 * The end (exclusive) of the chunk of `list` starting at `start`: at most `chunkRows` items whose
 * sizes sum to at most `chunkBytes`, except that the first item always goes in (an item larger than
 * the byte bound is a chunk of its own), so a chunk is never empty while items remain.
 */
export const chunkEnd = <A>(list: ReadonlyArray<A>, start: number, limits: OutboxLimits, size: (a: A) => number) => {
  let end = start
  let bytes = 0
  while (end < list.length && (end === start || end - start < limits.chunkRows)) {
    const a = list[end]
    const itemBytes = a === undefined ? 0 : size(a)
    if (end > start && bytes + itemBytes > limits.chunkBytes) break
    bytes += itemBytes
    end++
  }
  return end
}
/** A body's size in UTF-8 bytes (what PostgreSQL receives), not UTF-16 code units. */
export const bodySize = (b: EventBody) => Buffer.byteLength(b.body, "utf8")

/** Whether bodies and rows each fit in one chunk (one statement can write them). */
export const fitsOneChunk = (bodies: ReadonlyArray<EventBody>, rows: ReadonlyArray<OutboxRow>, limits: OutboxLimits) =>
  chunkEnd(bodies, 0, limits, bodySize) === bodies.length && chunkEnd(rows, 0, limits, rowBytes) === rows.length

/** Apply the fan-out/size bounds (pure). */
export const prepare = (items: ReadonlyArray<EnqueueItem>, limits: OutboxLimits): Prepared => {
  const accepted: Array<{ index: number; rows: ReadonlyArray<OutboxRow>; body: EventBody }> = []
  for (let i = 0; i < items.length; i++) {
    const item = items[i]
    if (item === undefined || item.matches.length > limits.maxFanout) continue
    const rows = rowsFor(item)
    let bytes = Buffer.byteLength(item.payload.body, "utf8")
    for (const r of rows) bytes += rowBytes(r)
    if (bytes > limits.maxEventBytes) continue
    accepted.push({
      index: i,
      rows,
      body: { eventId: item.payload.eventId, body: item.payload.body, sha256: sha256Hex(item.payload.body) }
    })
  }
  const byId = new Map<string, EventBody>()
  for (const a of accepted) byId.set(a.body.eventId, a.body)
  const bodies = [...byId.values()]
  const rows: Array<OutboxRow> = []
  for (const a of accepted) for (const r of a.rows) rows.push(r)
  const oneChunk = fitsOneChunk(bodies, rows, limits)
  return { items, accepted, bodies, rows, oneChunk, limits }
}

/** Whether an accepted item's event already existed with another body (corruption). */
const isCorrupt = (a: Prepared["accepted"][number], existing: ReadonlyMap<string, string>) => {
  const stored = existing.get(a.body.eventId)
  return stored !== undefined && stored !== a.body.sha256
}

/**
 * Write a prepared batch through the store: bodies, then the rows of events whose stored body is
 * theirs, then a NOTIFY when rows were inserted (one statement when it fits one chunk, else one
 * statement per chunk). Must run inside the batch's transaction.
 */
export const write = (p: Prepared) =>
  Effect.gen(function*() {
    const store = yield* OutboxStore
    if (p.oneChunk) return yield* store.insertBatch(p.bodies, p.rows)
    // bodies: one insert per chunk; an existing id with another body is corruption
    const existing = new Map<string, string>()
    for (let start = 0; start < p.bodies.length;) {
      const end = chunkEnd(p.bodies, start, p.limits, bodySize)
      for (const [id, sha] of yield* store.insertEvents(p.bodies.slice(start, end))) existing.set(id, sha)
      start = end
    }
    const rows: Array<OutboxRow> = []
    for (const a of p.accepted) if (!isCorrupt(a, existing)) { for (const r of a.rows) rows.push(r) }
    let inserted = 0
    for (let start = 0; start < rows.length;) {
      const end = chunkEnd(rows, start, p.limits, rowBytes)
      inserted += yield* store.insertRows(rows.slice(start, end))
      start = end
    }
    if (inserted > 0) yield* store.notify
    const written: Written = { existing, inserted }
    return written
  })

/** The per-item outcomes once written. */
export const finish = (p: Prepared, written: Written): EnqueueResult => {
  const outcomes: Array<EnqueueOutcome> = new Array(p.items.length)
  for (let i = 0; i < p.items.length; i++) outcomes[i] = { _tag: "fanout_limit" }
  let rows = 0
  for (const a of p.accepted) {
    if (isCorrupt(a, written.existing)) {
      outcomes[a.index] = { _tag: "corruption" }
    } else {
      // per-event inserted counts are not tracked individually (one statement covers many events)
      outcomes[a.index] = { _tag: "enqueued", rows: a.rows.length }
      rows += a.rows.length
    }
  }
  return { outcomes, inserted: written.inserted, duplicates: rows - written.inserted }
}

/**
 * Enqueue the matched events of one batch. Must run inside the batch's transaction. Events over
 * the fan-out/size bounds and corrupt events write nothing (the caller quarantines them).
 */
export const enqueue = (items: ReadonlyArray<EnqueueItem>, limits: OutboxLimits) =>
  Effect.suspend(() => {
    const p = prepare(items, limits)
    return Effect.map(write(p), (w) => finish(p, w))
  }).pipe(Effect.withSpan("Outbox.enqueue"))
