/**
 * The outbox, write side (SPEC §3.5): payload bodies stored once per event, one row per matched
 * webhook, `ON CONFLICT DO NOTHING` so replays never duplicate a delivery, chunked inserts, the
 * fan-out/size bounds, corruption detection, quarantine rows, and a `NOTIFY` in the same
 * transaction that wakes the delivery workers on commit.
 */
import { SqlClient } from "@effect/sql"
import { Context, Effect, Layer, Metric, Ref } from "effect"
import { deliveryId, sha256Hex, type Payload } from "../matching/Canonical.js"
import type { MatchResult } from "../matching/Match.js"
import type { SigningMode } from "../matching/WebhookIndex.js"
import type { Operation, RecordEvent } from "../schemas/RecordEvent.js"
import { type StoreError, storeOp } from "./Store.js"

export const NOTIFY_CHANNEL = "firehook_outbox"

export interface OutboxRow {
  readonly deliveryId: string
  readonly eventId: string
  readonly ownerDid: string
  readonly webhookRkey: string
  readonly matchKind: "direct" | "backlink"
  readonly eventDid: string
  readonly eventCollection: string
  readonly eventRkey: string
  readonly eventOperation: Operation
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
  /** insert rows (one chunk); returns how many were new */
  readonly insertRows: (rows: ReadonlyArray<OutboxRow>) => Effect.Effect<number, StoreError>
  readonly insertQuarantine: (rows: ReadonlyArray<QuarantineRow>) => Effect.Effect<void, StoreError>
  readonly notify: Effect.Effect<void, StoreError>
}

export class OutboxStore extends Context.Tag("firehook/OutboxStore")<OutboxStore, OutboxStoreShape>() {}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

export const makeSql = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const store: OutboxStoreShape = {
    insertEvents: (bodies) =>
      Effect.gen(function* () {
        if (bodies.length === 0) return new Map<string, string>()
        // an existing body is touched (created_at refreshed, row locked until commit) so that
        // maintenance cannot prune it between this statement and the commit of its outbox rows
        const rows = yield* sql<{ event_id: string; body_sha256: string; inserted: boolean }>`
          INSERT INTO delivery_events ${sql.insert(
            bodies.map((b) => ({ event_id: b.eventId, body: b.body, body_sha256: b.sha256 }))
          )}
          ON CONFLICT (event_id) DO UPDATE SET created_at = now()
          RETURNING event_id, body_sha256, (xmax = 0) AS inserted`
        const out = new Map<string, string>()
        for (const r of rows) if (!r.inserted) out.set(r.event_id, r.body_sha256)
        return out
      }).pipe(storeOp("outbox.insertEvents")),
    insertRows: (rows) =>
      rows.length === 0
        ? Effect.succeed(0)
        : sql<{ delivery_id: string }>`
          INSERT INTO outbox ${sql.insert(
            rows.map((r) => ({
              delivery_id: r.deliveryId,
              event_id: r.eventId,
              owner_did: r.ownerDid,
              webhook_rkey: r.webhookRkey,
              match_kind: r.matchKind,
              event_did: r.eventDid,
              event_collection: r.eventCollection,
              event_rkey: r.eventRkey,
              event_operation: r.eventOperation,
              target_url: r.targetUrl,
              signing_mode: r.signingMode,
              secret_id: r.secretId ?? null,
              fingerprint: r.fingerprint
            }))
          )}
          ON CONFLICT (delivery_id) DO NOTHING RETURNING delivery_id`.pipe(
            Effect.map((r) => r.length),
            storeOp("outbox.insertRows")
          ),
    insertQuarantine: (rows) =>
      rows.length === 0
        ? Effect.void
        : sql`INSERT INTO quarantine ${sql.insert(
            rows.map((r) => ({
              stream: r.stream,
              relay: r.relay,
              reason: r.reason,
              event_hash: r.eventHash,
              cursor: r.cursor === undefined ? null : r.cursor.toString()
            }))
          )}`.pipe(Effect.asVoid, storeOp("outbox.insertQuarantine")),
    // a non-empty payload: @effect/sql-pg's listen() drops notifications whose payload is empty
    notify: sql`SELECT pg_notify(${NOTIFY_CHANNEL}, '1')`.pipe(Effect.asVoid, storeOp("outbox.notify"))
  }
  return store
})

export const layerSql = Layer.effect(OutboxStore, makeSql)

// ---------------------------------------------------------------------------------------------
// In memory

export interface MemoryOutbox {
  readonly events: Map<string, EventBody>
  readonly rows: Map<string, OutboxRow>
  readonly quarantine: Array<QuarantineRow>
  notifications: number
}

export class MemoryOutboxState extends Context.Tag("firehook/MemoryOutboxState")<
  MemoryOutboxState,
  Ref.Ref<MemoryOutbox>
>() {}

export const layerMemory = Layer.effect(
  OutboxStore,
  Effect.gen(function* () {
    const state = yield* MemoryOutboxState
    const store: OutboxStoreShape = {
      insertEvents: (bodies) =>
        Ref.modify(state, (s) => {
          const out = new Map<string, string>()
          for (const b of bodies) {
            const prev = s.events.get(b.eventId)
            if (prev === undefined) s.events.set(b.eventId, b)
            else out.set(b.eventId, prev.sha256)
          }
          return [out, s]
        }),
      insertRows: (rows) =>
        Ref.modify(state, (s) => {
          let n = 0
          for (const r of rows) {
            if (!s.rows.has(r.deliveryId)) {
              s.rows.set(r.deliveryId, r)
              n++
            }
          }
          return [n, s]
        }),
      insertQuarantine: (rows) =>
        Ref.update(state, (s) => {
          s.quarantine.push(...rows)
          return s
        }),
      notify: Ref.update(state, (s) => {
        s.notifications++
        return s
      })
    }
    return store
  })
).pipe(
  Layer.provideMerge(
    Layer.effect(
      MemoryOutboxState,
      Effect.suspend(() => Ref.make<MemoryOutbox>({ events: new Map(), rows: new Map(), quarantine: [], notifications: 0 }))
    )
  )
)

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

/**
 * Enqueue the matched events of one batch. Must run inside the batch's transaction. Events over
 * the fan-out/size bounds and corrupt events write nothing (the caller quarantines them).
 */
export const enqueue = (items: ReadonlyArray<EnqueueItem>, limits: OutboxLimits) =>
  Effect.gen(function* () {
    const store = yield* OutboxStore
    const outcomes: Array<EnqueueOutcome> = new Array(items.length)
    const accepted: Array<{ index: number; rows: ReadonlyArray<OutboxRow>; body: EventBody }> = []
    for (let i = 0; i < items.length; i++) {
      const item = items[i]
      if (item === undefined) continue
      if (item.matches.length > limits.maxFanout) {
        outcomes[i] = { _tag: "fanout_limit" }
        continue
      }
      const rows = rowsFor(item)
      let bytes = Buffer.byteLength(item.payload.body, "utf8")
      for (const r of rows) bytes += rowBytes(r)
      if (bytes > limits.maxEventBytes) {
        outcomes[i] = { _tag: "fanout_limit" }
        continue
      }
      accepted.push({
        index: i,
        rows,
        body: { eventId: item.payload.eventId, body: item.payload.body, sha256: sha256Hex(item.payload.body) }
      })
    }
    // bodies: one insert per chunk; an existing id with another body is corruption
    const bodies = new Map<string, EventBody>()
    for (const a of accepted) bodies.set(a.body.eventId, a.body)
    const existing = new Map<string, string>()
    const bodyList = [...bodies.values()]
    for (let start = 0; start < bodyList.length; ) {
      let end = start
      let size = 0
      while (end < bodyList.length && end - start < limits.chunkRows && size < limits.chunkBytes) {
        size += bodyList[end]?.body.length ?? 0
        end++
      }
      const found = yield* store.insertEvents(bodyList.slice(start, end))
      for (const [id, sha] of found) existing.set(id, sha)
      start = end
    }
    const rows: Array<OutboxRow> = []
    const perEventRows: Array<{ index: number; count: number }> = []
    for (const a of accepted) {
      const storedSha = existing.get(a.body.eventId)
      if (storedSha !== undefined && storedSha !== a.body.sha256) {
        outcomes[a.index] = { _tag: "corruption" }
        continue
      }
      rows.push(...a.rows)
      perEventRows.push({ index: a.index, count: a.rows.length })
    }
    let inserted = 0
    for (let start = 0; start < rows.length; ) {
      let end = start
      let size = 0
      while (end < rows.length && end - start < limits.chunkRows && size < limits.chunkBytes) {
        const r = rows[end]
        size += r === undefined ? 0 : rowBytes(r)
        end++
      }
      inserted += yield* store.insertRows(rows.slice(start, end))
      start = end
    }
    // per-event inserted counts are not tracked individually (one statement covers many events)
    for (const p of perEventRows) outcomes[p.index] = { _tag: "enqueued", rows: p.count }
    if (inserted > 0) yield* store.notify
    const duplicates = rows.length - inserted
    const result: EnqueueResult = { outcomes, inserted, duplicates }
    return result
  }).pipe(Effect.withSpan("Outbox.enqueue"))
