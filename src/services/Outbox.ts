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
  /**
   * `insertEvents`, then `insertRows` for the rows whose event's stored body has the given sha256
   * (an existing id with another body is corruption: its rows are not inserted), then `notify`
   * when rows were inserted: one statement, for what fits in one chunk.
   */
  readonly insertBatch: (
    bodies: ReadonlyArray<EventBody>,
    rows: ReadonlyArray<OutboxRow>
  ) => Effect.Effect<BatchInsert, StoreError>
}

export interface BatchInsert {
  /** the stored sha256 of every given event id that already existed */
  readonly existing: ReadonlyMap<string, string>
  /** outbox rows inserted (new) */
  readonly inserted: number
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
    notify: sql`SELECT pg_notify(${NOTIFY_CHANNEL}, '1')`.pipe(Effect.asVoid, storeOp("outbox.notify")),
    insertBatch: (bodies, rows) => {
      if (bodies.length === 0) return Effect.succeed({ existing: new Map<string, string>(), inserted: 0 })
      const c = columns(rows)
      // the body insert touches an existing body (see insertEvents); rows are inserted only for
      // events whose stored body is the one given; the NOTIFY runs only when a row was inserted
      return sql<{ inserted: number; notified: number; existing: unknown }>`
        WITH b AS (
          SELECT * FROM unnest(${bodies.map((x) => x.eventId)}::text[], ${bodies.map((x) => x.body)}::text[],
            ${bodies.map((x) => x.sha256)}::text[]) AS b(event_id, body, body_sha256)
        ), ev AS (
          INSERT INTO delivery_events (event_id, body, body_sha256) SELECT event_id, body, body_sha256 FROM b
          ON CONFLICT (event_id) DO UPDATE SET created_at = now()
          RETURNING event_id, body_sha256, (xmax = 0) AS inserted
        ), ins AS (
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
            event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint)
          SELECT r.* FROM unnest(${c.deliveryId}::text[], ${c.eventId}::text[], ${c.ownerDid}::text[],
            ${c.webhookRkey}::text[], ${c.matchKind}::text[], ${c.eventDid}::text[], ${c.eventCollection}::text[],
            ${c.eventRkey}::text[], ${c.eventOperation}::text[], ${c.targetUrl}::text[], ${c.signingMode}::text[],
            ${c.secretId}::text[], ${c.fingerprint}::text[])
            AS r(delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection, event_rkey,
              event_operation, target_url, signing_mode, secret_id, fingerprint)
          WHERE r.event_id IN (SELECT ev.event_id FROM ev JOIN b USING (event_id) WHERE ev.body_sha256 = b.body_sha256)
          ON CONFLICT (delivery_id) DO NOTHING
          RETURNING 1
        ), n AS (
          SELECT count(*)::int AS c FROM ins
        ), notified AS (
          SELECT pg_notify(${NOTIFY_CHANNEL}, '1') FROM n WHERE n.c > 0
        )
        SELECT (SELECT c FROM n) AS inserted, (SELECT count(*)::int FROM notified) AS notified,
          (SELECT coalesce(json_agg(json_build_array(event_id, body_sha256)), '[]'::json) FROM ev WHERE NOT inserted)
            AS existing`.pipe(
        Effect.map((result) => {
          const r = result[0]
          const existing = new Map<string, string>()
          const pairs: unknown = typeof r?.existing === "string" ? JSON.parse(r.existing) : r?.existing
          if (Array.isArray(pairs)) {
            for (const p of pairs) {
              if (Array.isArray(p) && typeof p[0] === "string" && typeof p[1] === "string") existing.set(p[0], p[1])
            }
          }
          return { existing, inserted: Number(r?.inserted ?? 0) }
        }),
        storeOp("outbox.insertBatch")
      )
    }
  }
  return store
})

/** rows as column arrays (for `unnest`) */
const columns = (rows: ReadonlyArray<OutboxRow>) => {
  const n = rows.length
  const c = {
    deliveryId: new Array<string>(n),
    eventId: new Array<string>(n),
    ownerDid: new Array<string>(n),
    webhookRkey: new Array<string>(n),
    matchKind: new Array<string>(n),
    eventDid: new Array<string>(n),
    eventCollection: new Array<string>(n),
    eventRkey: new Array<string>(n),
    eventOperation: new Array<string>(n),
    targetUrl: new Array<string>(n),
    signingMode: new Array<string>(n),
    secretId: new Array<string | null>(n),
    fingerprint: new Array<string>(n)
  }
  for (let i = 0; i < n; i++) {
    const r = rows[i]
    if (r === undefined) continue
    c.deliveryId[i] = r.deliveryId
    c.eventId[i] = r.eventId
    c.ownerDid[i] = r.ownerDid
    c.webhookRkey[i] = r.webhookRkey
    c.matchKind[i] = r.matchKind
    c.eventDid[i] = r.eventDid
    c.eventCollection[i] = r.eventCollection
    c.eventRkey[i] = r.eventRkey
    c.eventOperation[i] = r.eventOperation
    c.targetUrl[i] = r.targetUrl
    c.signingMode[i] = r.signingMode
    c.secretId[i] = r.secretId ?? null
    c.fingerprint[i] = r.fingerprint
  }
  return c
}

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
      }),
      insertBatch: (bodies, rows) =>
        Ref.modify(state, (s) => {
          const existing = new Map<string, string>()
          const sha = new Map<string, string>()
          for (const b of bodies) {
            sha.set(b.eventId, b.sha256)
            const prev = s.events.get(b.eventId)
            if (prev === undefined) s.events.set(b.eventId, b)
            else existing.set(b.eventId, prev.sha256)
          }
          let inserted = 0
          for (const r of rows) {
            const stored = existing.get(r.eventId) ?? sha.get(r.eventId)
            if (stored === undefined || stored !== sha.get(r.eventId) || s.rows.has(r.deliveryId)) continue
            s.rows.set(r.deliveryId, r)
            inserted++
          }
          if (inserted > 0) s.notifications++
          return [{ existing, inserted }, s]
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
    const bodies = new Map<string, EventBody>()
    for (const a of accepted) bodies.set(a.body.eventId, a.body)
    const bodyList = [...bodies.values()]
    const bodyChunkEnd = (start: number) => {
      let end = start
      let size = 0
      while (end < bodyList.length && end - start < limits.chunkRows && size < limits.chunkBytes) {
        size += bodyList[end]?.body.length ?? 0
        end++
      }
      return end
    }
    const rowChunkEnd = (rows: ReadonlyArray<OutboxRow>, start: number) => {
      let end = start
      let size = 0
      while (end < rows.length && end - start < limits.chunkRows && size < limits.chunkBytes) {
        const r = rows[end]
        size += r === undefined ? 0 : rowBytes(r)
        end++
      }
      return end
    }
    const allRows: Array<OutboxRow> = []
    for (const a of accepted) for (const r of a.rows) allRows.push(r)

    let existing: ReadonlyMap<string, string>
    let rows: Array<OutboxRow>
    let inserted = 0
    const perEventRows: Array<{ index: number; count: number }> = []
    const keepUncorrupted = () => {
      const kept: Array<OutboxRow> = []
      for (const a of accepted) {
        const storedSha = existing.get(a.body.eventId)
        if (storedSha !== undefined && storedSha !== a.body.sha256) {
          outcomes[a.index] = { _tag: "corruption" }
          continue
        }
        for (const r of a.rows) kept.push(r)
        perEventRows.push({ index: a.index, count: a.rows.length })
      }
      return kept
    }
    if (bodyChunkEnd(0) === bodyList.length && rowChunkEnd(allRows, 0) === allRows.length) {
      // everything fits in one chunk: bodies, rows and the NOTIFY in one statement
      const done = yield* store.insertBatch(bodyList, allRows)
      existing = done.existing
      inserted = done.inserted
      rows = keepUncorrupted()
    } else {
      // bodies: one insert per chunk; an existing id with another body is corruption
      const found = new Map<string, string>()
      for (let start = 0; start < bodyList.length; ) {
        const end = bodyChunkEnd(start)
        for (const [id, sha] of yield* store.insertEvents(bodyList.slice(start, end))) found.set(id, sha)
        start = end
      }
      existing = found
      rows = keepUncorrupted()
      for (let start = 0; start < rows.length; ) {
        const end = rowChunkEnd(rows, start)
        inserted += yield* store.insertRows(rows.slice(start, end))
        start = end
      }
      if (inserted > 0) yield* store.notify
    }
    // per-event inserted counts are not tracked individually (one statement covers many events)
    for (const p of perEventRows) outcomes[p.index] = { _tag: "enqueued", rows: p.count }
    const duplicates = rows.length - inserted
    const result: EnqueueResult = { outcomes, inserted, duplicates }
    return result
  }).pipe(Effect.withSpan("Outbox.enqueue"))
