/**
 * Prior references (SPEC §2.4): for each referencing record, the relevant references it held at
 * its latest rev, so that an update that removes a reference, or a delete, still matches the
 * webhooks the old version matched. Writes are monotonic on the referencing record's rev, compared
 * bytewise (`COLLATE "C"` in every comparison: TIDs sort in time order bytewise only, whatever the
 * database's default collation).
 *
 * The store works a batch at a time (one statement to read, one to write): the processor reads the
 * rows a batch may touch, applies the batch's puts and removes to them in memory (so an event sees
 * what earlier events of its batch wrote), and writes each touched key's final state.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Context, Effect, Layer, Ref } from "effect"
import { type StoreError, storeOp, storeOpWithin } from "../platform/Persistence.js"

export interface PriorRefs {
  readonly rev: string
  readonly refs: ReadonlyArray<string>
}

/** A stored row as read: `live` is false once it has expired (an expired row counts as absent). */
export interface PriorRefsRow extends PriorRefs {
  readonly live: boolean
}

export interface PriorRefsUpsert extends PriorRefs {
  readonly recordUri: string
  /** the JSON size of `refs` (bounded by the caller) */
  readonly bytes: number
  /**
   * write whatever is stored (the caller read the row in this transaction and decided); otherwise
   * only over an older rev, an expired row, or none
   */
  readonly force: boolean
}

export interface PriorRefsDelete {
  readonly recordUri: string
  /** delete only when the stored rev is older than this (or expired); undefined = whatever is stored */
  readonly olderThan: string | undefined
}

export interface PriorRefsWrite {
  readonly upserts: ReadonlyArray<PriorRefsUpsert>
  readonly deletes: ReadonlyArray<PriorRefsDelete>
  readonly ttlSeconds: number
}

/** A stored, unexpired key and the time its row has left to live (milliseconds). */
export interface StoredKey {
  readonly recordUri: string
  readonly ttlMs: number
}

export interface PriorRefsStoreShape {
  /**
   * every stored, unexpired key (bounded by `limit`) with its time left, soonest to expire first,
   * to build the in-memory key index
   */
  readonly keys: (limit: number) => Effect.Effect<ReadonlyArray<StoredKey>, StoreError>
  /** the stored rows of these keys, expired ones included (one statement) */
  readonly read: (recordUris: ReadonlyArray<string>) => Effect.Effect<ReadonlyMap<string, PriorRefsRow>, StoreError>
  /**
   * Delete and upsert (distinct keys, one statement); returns the keys whose upsert was written.
   */
  readonly write: (changes: PriorRefsWrite) => Effect.Effect<ReadonlySet<string>, StoreError>
  /**
   * Of these keys, delete the rows that have expired (one statement); returns the time left of
   * every row still there (0 for an expired row this statement could not take: another
   * transaction holds it). A key absent from the answer has no row now.
   */
  readonly expire: (recordUris: ReadonlyArray<string>) => Effect.Effect<ReadonlyMap<string, number>, StoreError>
  readonly count: Effect.Effect<number, StoreError>
}

export class PriorRefsStore extends Context.Tag("firehook/PriorRefsStore")<PriorRefsStore, PriorRefsStoreShape>() {}

const refsOf = (v: unknown): ReadonlyArray<string> => {
  const parsed: unknown = typeof v === "string" ? JSON.parse(v) : v
  return Array.isArray(parsed) ? parsed.filter((x): x is string => typeof x === "string") : []
}

/**
 * `write` as two data-modifying CTEs, `prior_deleted` and `prior_written` (the keys whose upsert
 * was written), for a statement to embed (`WITH <these>, … SELECT …`). The two sets of keys are
 * disjoint, so the parts never touch the same row.
 */
export const writeCtes = (sql: SqlClient.SqlClient, { deletes, ttlSeconds, upserts }: PriorRefsWrite) => {
  const upUris: Array<string> = []
  const upRevs: Array<string> = []
  const upRefs: Array<string> = []
  const upBytes: Array<number> = []
  const forced: Array<string> = []
  for (const u of upserts) {
    upUris.push(u.recordUri)
    upRevs.push(u.rev)
    upRefs.push(JSON.stringify(u.refs))
    upBytes.push(u.bytes)
    if (u.force) forced.push(u.recordUri)
  }
  const delUris: Array<string> = []
  const delRevs: Array<string | null> = []
  for (const d of deletes) {
    delUris.push(d.recordUri)
    delRevs.push(d.olderThan ?? null)
  }
  return sql`prior_deleted AS (
      DELETE FROM prior_refs p USING unnest(${delUris}::text[], ${delRevs}::text[]) AS d(uri, rev)
      WHERE p.record_uri = d.uri AND (d.rev IS NULL OR p.rev COLLATE "C" < d.rev OR p.expires_at <= now())
      RETURNING p.record_uri
    ), prior_written AS (
      INSERT INTO prior_refs (record_uri, rev, refs, bytes, expires_at)
      SELECT u.uri, u.rev, u.refs::jsonb, u.bytes, now() + make_interval(secs => ${ttlSeconds})
      FROM unnest(${upUris}::text[], ${upRevs}::text[], ${upRefs}::text[], ${upBytes}::int[]) AS u(uri, rev, refs, bytes)
      ON CONFLICT (record_uri) DO UPDATE SET rev = EXCLUDED.rev, refs = EXCLUDED.refs, bytes = EXCLUDED.bytes,
        expires_at = EXCLUDED.expires_at, updated_at = now()
      WHERE prior_refs.rev COLLATE "C" < EXCLUDED.rev OR prior_refs.expires_at <= now()
        OR EXCLUDED.record_uri = ANY(${forced}::text[])
      RETURNING record_uri
    )`
}

export const makeSql = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const store: PriorRefsStoreShape = {
    keys: (limit) =>
      sql<{ record_uri: string; ttl_ms: number }>`
        SELECT record_uri, (extract(epoch FROM expires_at - now()) * 1000)::float8 AS ttl_ms
        FROM prior_refs WHERE expires_at > now() ORDER BY expires_at LIMIT ${limit}`.pipe(
        Effect.map((rows) => rows.map((r): StoredKey => ({ recordUri: r.record_uri, ttlMs: Number(r.ttl_ms) }))),
        // the key index is loaded once at startup (bounded by `limit`)
        storeOpWithin("priorRefs.keys", "10 minutes")
      ),
    read: (recordUris) =>
      recordUris.length === 0
        ? Effect.succeed(new Map<string, PriorRefsRow>())
        : sql<{ record_uri: string; rev: string; refs: unknown; live: boolean }>`
            SELECT record_uri, rev, refs, expires_at > now() AS live
            FROM prior_refs WHERE record_uri = ANY(${recordUris}::text[])`.pipe(
          Effect.map((rows) => {
            const out = new Map<string, PriorRefsRow>()
            for (const r of rows) out.set(r.record_uri, { rev: r.rev, refs: refsOf(r.refs), live: r.live })
            return out
          }),
          storeOp("priorRefs.read")
        ),
    write: (changes) =>
      changes.upserts.length === 0 && changes.deletes.length === 0
        ? Effect.succeed(new Set<string>())
        : sql<{ record_uri: string }>`WITH ${writeCtes(sql, changes)} SELECT record_uri FROM prior_written`.pipe(
          Effect.map((rows) => new Set(rows.map((r) => r.record_uri))),
          storeOp("priorRefs.write")
        ),
    // the rows it deletes are locked first, skipping those another transaction holds (maintenance
    // deleting them): such a row is reported as still there, so its key is asked about again
    expire: (recordUris) =>
      recordUris.length === 0
        ? Effect.succeed(new Map<string, number>())
        : sql<{ record_uri: string; ttl_ms: number }>`
            WITH asked AS (SELECT unnest(${recordUris}::text[]) AS uri),
            doomed AS (
              SELECT p.record_uri FROM prior_refs p JOIN asked a ON p.record_uri = a.uri
              WHERE p.expires_at <= now()
              FOR UPDATE OF p SKIP LOCKED
            ), gone AS (
              DELETE FROM prior_refs p USING doomed d WHERE p.record_uri = d.record_uri
              RETURNING p.record_uri
            )
            SELECT p.record_uri, greatest(0, extract(epoch FROM p.expires_at - now()) * 1000)::float8 AS ttl_ms
            FROM prior_refs p JOIN asked a ON p.record_uri = a.uri
            WHERE NOT EXISTS (SELECT 1 FROM gone g WHERE g.record_uri = p.record_uri)`.pipe(
          Effect.map((rows) => new Map(rows.map((r) => [r.record_uri, Number(r.ttl_ms)]))),
          storeOp("priorRefs.expire")
        ),
    count: sql<{ n: string | number }>`SELECT count(*) AS n FROM prior_refs`.pipe(
      Effect.map((rows) => Number(rows[0]?.n ?? 0)),
      storeOp("priorRefs.count")
    )
  }
  return store
})

export const layerSql = Layer.effect(PriorRefsStore, makeSql)

/**
 * Traffic counters of the in-memory store, for tests that assert on store traffic: keys read,
 * rows upserted, rows deleted (what was sent to the store, written or not).
 */
export interface PriorRefsCalls {
  get: number
  put: number
  remove: number
}

export const makeMemory = (calls: PriorRefsCalls = { get: 0, put: 0, remove: 0 }) =>
  Effect.gen(function*() {
    // rows expire by the Effect Clock (the TestClock in tests), as by `now()` in PostgreSQL
    const rows = yield* Ref.make(new Map<string, PriorRefs & { readonly expiresAt: number }>())
    const withNow = <A>(f: (now: number, m: Map<string, PriorRefs & { readonly expiresAt: number }>) => A) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.map(Ref.get(rows), (m) => f(now, m)))
    const store: PriorRefsStoreShape = {
      keys: (limit) =>
        withNow((now, m) =>
          [...m]
            .filter(([, r]) => r.expiresAt > now)
            .sort(([, a], [, b]) => a.expiresAt - b.expiresAt)
            .slice(0, limit)
            .map(([recordUri, r]): StoredKey => ({ recordUri, ttlMs: r.expiresAt - now }))
        ),
      read: (uris) =>
        withNow((now, m) => {
          calls.get += uris.length
          const out = new Map<string, PriorRefsRow>()
          for (const uri of uris) {
            const r = m.get(uri)
            if (r !== undefined) out.set(uri, { rev: r.rev, refs: r.refs, live: r.expiresAt > now })
          }
          return out
        }),
      write: ({ deletes, ttlSeconds, upserts }) =>
        withNow((now, m) => {
          calls.put += upserts.length
          calls.remove += deletes.length
          for (const d of deletes) {
            const prev = m.get(d.recordUri)
            if (
              prev !== undefined && (d.olderThan === undefined || prev.rev < d.olderThan || prev.expiresAt <= now)
            ) m.delete(d.recordUri)
          }
          const written = new Set<string>()
          for (const u of upserts) {
            const prev = m.get(u.recordUri)
            if (!u.force && prev !== undefined && prev.expiresAt > now && !(prev.rev < u.rev)) continue
            m.set(u.recordUri, { rev: u.rev, refs: u.refs, expiresAt: now + ttlSeconds * 1000 })
            written.add(u.recordUri)
          }
          return written
        }),
      expire: (uris) =>
        withNow((now, m) => {
          const left = new Map<string, number>()
          for (const uri of uris) {
            const r = m.get(uri)
            if (r === undefined) continue
            if (r.expiresAt <= now) m.delete(uri)
            else left.set(uri, r.expiresAt - now)
          }
          return left
        }),
      count: Ref.get(rows).pipe(Effect.map((m) => m.size))
    }
    return store
  })

export const layerMemory = (calls?: PriorRefsCalls) => Layer.effect(PriorRefsStore, makeMemory(calls))
