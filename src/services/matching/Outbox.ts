/**
 * The outbox, write side (SPEC §3.5): payload bodies stored once per event, one row per matched
 * webhook, `ON CONFLICT DO NOTHING` so replays never duplicate a delivery, chunked inserts, the
 * fan-out/size bounds, corruption detection, quarantine rows, and a `NOTIFY` in the same
 * transaction that wakes the delivery workers on commit.
 */
import { SqlClient, type Statement } from "@effect/sql"
import { Context, Effect, Layer, Metric, Ref } from "effect"
import { deliveryId, sha256Hex, type Payload } from "./Canonical.js"
import type { MatchResult } from "./Match.js"
import type { SigningMode } from "./WebhookIndex.js"
import type { Operation, RecordEvent } from "../../schemas/RecordEvent.js"
import * as CursorStore from "../intake/CursorStore.js"
import * as PriorRefsStore from "./PriorRefsStore.js"
import { type StoreError, storeOp } from "../platform/Persistence.js"

export { NOTIFY_CHANNEL } from "./OutboxNotify.js"
import { NOTIFY_CHANNEL, notifyStatement } from "./OutboxNotify.js"

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
  /** outbox rows inserted (new) */
  readonly inserted: number
}

export class OutboxStore extends Context.Tag("firehook/OutboxStore")<OutboxStore, OutboxStoreShape>() {}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

interface BatchResultRow {
  readonly inserted: number | string | null
  readonly existing: unknown
}

const stringSet = (v: unknown): ReadonlySet<string> => {
  const out = new Set<string>()
  const parsed: unknown = typeof v === "string" ? JSON.parse(v) : v
  if (Array.isArray(parsed)) for (const x of parsed) if (typeof x === "string") out.add(x)
  return out
}

const existingOf = (v: unknown): ReadonlyMap<string, string> => {
  const existing = new Map<string, string>()
  const pairs: unknown = typeof v === "string" ? JSON.parse(v) : v
  if (Array.isArray(pairs)) {
    for (const p of pairs) {
      if (Array.isArray(p) && typeof p[0] === "string" && typeof p[1] === "string") existing.set(p[0], p[1])
    }
  }
  return existing
}

const quarantineInsert = (sql: SqlClient.SqlClient, rows: ReadonlyArray<QuarantineRow>) =>
  sql`INSERT INTO quarantine ${sql.insert(
    rows.map((r) => ({
      stream: r.stream,
      relay: r.relay,
      reason: r.reason,
      event_hash: r.eventHash,
      cursor: r.cursor === undefined ? null : r.cursor.toString()
    }))
  )}`

/**
 * Bodies, rows and NOTIFY as data-modifying CTEs (`outbox_bodies`, `outbox_events`,
 * `outbox_inserted`, `outbox_count`, `outbox_notified`, `outbox_corrupt`): the body insert touches
 * an existing body (see `insertEvents`); rows are inserted only for events whose stored body is the
 * one given; the NOTIFY runs only when a row was inserted; each `corruption` row whose event's
 * stored body differs is inserted into the quarantine.
 */
const outboxCtes = (
  sql: SqlClient.SqlClient,
  bodies: ReadonlyArray<EventBody>,
  rows: ReadonlyArray<OutboxRow>,
  corruption: ReadonlyArray<CorruptionCandidate>
) => {
  const c = columns(rows)
  const q = {
    eventId: corruption.map((x) => x.eventId),
    stream: corruption.map((x) => x.row.stream),
    relay: corruption.map((x) => x.row.relay),
    eventHash: corruption.map((x) => x.row.eventHash),
    cursor: corruption.map((x) => (x.row.cursor === undefined ? null : x.row.cursor.toString()))
  }
  return sql`outbox_bodies AS (
      SELECT * FROM unnest(${bodies.map((x) => x.eventId)}::text[], ${bodies.map((x) => x.body)}::text[],
        ${bodies.map((x) => x.sha256)}::text[]) AS b(event_id, body, body_sha256)
    ), outbox_events AS (
      INSERT INTO delivery_events (event_id, body, body_sha256) SELECT event_id, body, body_sha256 FROM outbox_bodies
      ON CONFLICT (event_id) DO UPDATE SET created_at = now()
      RETURNING event_id, body_sha256, (xmax = 0) AS inserted
    ), outbox_mismatch AS (
      SELECT e.event_id FROM outbox_events e JOIN outbox_bodies b USING (event_id) WHERE e.body_sha256 <> b.body_sha256
    ), outbox_inserted AS (
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
        event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
      SELECT r.* FROM unnest(${c.deliveryId}::text[], ${c.eventId}::text[], ${c.ownerDid}::text[],
        ${c.webhookRkey}::text[], ${c.matchKind}::text[], ${c.eventDid}::text[], ${c.eventCollection}::text[],
        ${c.eventRkey}::text[], ${c.eventOperation}::text[], ${c.targetUrl}::text[], ${c.signingMode}::text[],
        ${c.secretId}::text[], ${c.fingerprint}::text[], ${c.origin}::text[])
        AS r(delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection, event_rkey,
          event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
      WHERE r.event_id NOT IN (SELECT event_id FROM outbox_mismatch)
      ON CONFLICT (delivery_id) DO NOTHING
      RETURNING delivery_id
    ), outbox_count AS (
      SELECT count(*)::int AS c FROM outbox_inserted
    ), outbox_notified AS (
      SELECT pg_notify(${NOTIFY_CHANNEL}, '1') FROM outbox_count WHERE c > 0
    ), outbox_corrupt AS (
      INSERT INTO quarantine (stream, relay, reason, event_hash, cursor)
      SELECT q.stream, q.relay, 'corruption', q.event_hash, q.cursor
      FROM unnest(${q.eventId}::text[], ${q.stream}::text[], ${q.relay}::text[], ${q.eventHash}::text[],
        ${q.cursor}::bigint[]) WITH ORDINALITY AS q(event_id, stream, relay, event_hash, cursor, n)
      WHERE q.event_id IN (SELECT event_id FROM outbox_mismatch)
      ORDER BY q.n
      RETURNING 1
    )`
}

/**
 * The origin key of a URL, the unit of the per-origin cap and of the circuit breaker (SPEC §4.1,
 * §4.3): `scheme://host[:port]` as the WHATWG URL parser normalises it (scheme and host lowercased,
 * the scheme's default port dropped, IDN hosts in punycode, IPv6 in brackets), without a trailing
 * dot on the host. So `https://H.example:443/a` and `https://h.example./b` are one origin. A string
 * the parser refuses (never a validated webhook URL) falls back to the SQL rule below. Stored with
 * each outbox row (`outbox.origin`) so the claim shares out per-origin room without parsing URLs.
 */
export const originKey = (url: string): string => {
  const cached = originCache.get(url)
  if (cached !== undefined) return cached
  const key = parseOrigin(url)
  if (originCache.size >= ORIGIN_CACHE_MAX) originCache.clear()
  originCache.set(url, key)
  return key
}

const ORIGIN_CACHE_MAX = 4096
/** target URLs repeat (one per webhook): parsed once each, while the cache holds them */
const originCache = new Map<string, string>()

const parseOrigin = (url: string): string => {
  const u = URL.canParse(url) ? new URL(url) : undefined
  if (u === undefined || u.host === "") {
    const m = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/.exec(url)
    return m === null ? "" : m[0].toLowerCase()
  }
  const host = u.hostname.endsWith(".") ? u.hostname.slice(0, -1) : u.hostname
  return `${u.protocol}//${host}${u.port === "" ? "" : `:${u.port}`}`
}

/**
 * The origin key in SQL, for rows enqueued before `outbox.origin` existed (NULL there): lowercase
 * `scheme://authority` as written (no port or trailing-dot normalisation, so such a legacy row may
 * count against a different origin key than a new row of the same receiver until it is delivered).
 */
export const ORIGIN_SQL = `COALESCE(lower(substring(target_url from '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*')), '')`

/** The result columns of `outboxCtes` (referencing `outbox_notified` is what runs the NOTIFY). */
const outboxColumns = (sql: SqlClient.SqlClient) =>
  sql`(SELECT c FROM outbox_count) AS inserted, (SELECT count(*)::int FROM outbox_notified) AS notified,
    (SELECT coalesce(json_agg(json_build_array(event_id, body_sha256)), '[]'::json) FROM outbox_events WHERE NOT inserted)
      AS existing`

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
              fingerprint: r.fingerprint,
              origin: originKey(r.targetUrl)
            }))
          )}
          ON CONFLICT (delivery_id) DO NOTHING RETURNING delivery_id`.pipe(
            Effect.map((r) => r.length),
            storeOp("outbox.insertRows")
          ),
    insertQuarantine: (rows) =>
      rows.length === 0
        ? Effect.void
        : quarantineInsert(sql, rows).pipe(Effect.asVoid, storeOp("outbox.insertQuarantine")),
    // a non-empty payload: @effect/sql-pg's listen() drops notifications whose payload is empty
    notify: notifyStatement(sql).pipe(Effect.asVoid, storeOp("outbox.notify")),
    insertBatch: (bodies, rows) =>
      bodies.length === 0
        ? Effect.succeed({ existing: new Map<string, string>(), inserted: 0 })
        : sql<BatchResultRow>`WITH ${outboxCtes(sql, bodies, rows, [])}
            SELECT ${outboxColumns(sql)}`.pipe(
            Effect.map((result) => ({ existing: existingOf(result[0]?.existing), inserted: Number(result[0]?.inserted ?? 0) })),
            storeOp("outbox.insertBatch")
          ),
    commitBatch: (c) => {
      const ctes: Array<Statement.Fragment> = []
      const withPrior = c.prior !== undefined && (c.prior.upserts.length > 0 || c.prior.deletes.length > 0)
      if (c.prior !== undefined && withPrior) ctes.push(PriorRefsStore.writeCtes(sql, c.prior))
      c.cursors.forEach((w, k) => ctes.push(sql`${sql.literal(`cursor_saved_${k}`)} AS (${CursorStore.saveStatement(sql, w)} RETURNING 1)`))
      if (c.quarantine.length > 0) ctes.push(sql`quarantined AS (${quarantineInsert(sql, c.quarantine)} RETURNING 1)`)
      const withOutbox = c.bodies.length > 0
      if (withOutbox) ctes.push(outboxCtes(sql, c.bodies, c.rows, c.corruption))
      if (ctes.length === 0) {
        return Effect.succeed({ existing: new Map<string, string>(), inserted: 0, insertedIds: new Set<string>(), priorWritten: new Set<string>() })
      }
      return sql<BatchResultRow & { inserted_ids: unknown; prior_written: unknown }>`WITH ${sql.csv(ctes)}
        SELECT ${withOutbox ? outboxColumns(sql) : sql`0 AS inserted, '[]'::json AS existing`},
          ${withOutbox ? sql`(SELECT coalesce(json_agg(delivery_id), '[]'::json) FROM outbox_inserted)` : sql`'[]'::json`}
            AS inserted_ids,
          ${withPrior ? sql`(SELECT coalesce(json_agg(record_uri), '[]'::json) FROM prior_written)` : sql`'[]'::json`}
            AS prior_written`.pipe(
        Effect.map((result) => {
          const r = result[0]
          return {
            existing: existingOf(r?.existing),
            inserted: Number(r?.inserted ?? 0),
            insertedIds: stringSet(r?.inserted_ids),
            priorWritten: stringSet(r?.prior_written)
          }
        }),
        storeOp("outbox.commitBatch")
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
    fingerprint: new Array<string>(n),
    origin: new Array<string>(n)
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
    c.origin[i] = originKey(r.targetUrl)
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

/** A batch's outbox writes, bounds applied: what `write` or a one-statement commit sends. */
export interface Prepared {
  readonly items: ReadonlyArray<EnqueueItem>
  /** index into `items`, the item's rows and its body, for items within the bounds */
  readonly accepted: ReadonlyArray<{ readonly index: number; readonly rows: ReadonlyArray<OutboxRow>; readonly body: EventBody }>
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
  Effect.gen(function* () {
    const store = yield* OutboxStore
    if (p.oneChunk) return yield* store.insertBatch(p.bodies, p.rows)
    // bodies: one insert per chunk; an existing id with another body is corruption
    const existing = new Map<string, string>()
    for (let start = 0; start < p.bodies.length; ) {
      const end = chunkEnd(p.bodies, start, p.limits, bodySize)
      for (const [id, sha] of yield* store.insertEvents(p.bodies.slice(start, end))) existing.set(id, sha)
      start = end
    }
    const rows: Array<OutboxRow> = []
    for (const a of p.accepted) if (!isCorrupt(a, existing)) for (const r of a.rows) rows.push(r)
    let inserted = 0
    for (let start = 0; start < rows.length; ) {
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
