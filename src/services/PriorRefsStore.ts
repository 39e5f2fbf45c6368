/**
 * Prior references (SPEC §2.4): for each referencing record, the relevant references it held at
 * its latest rev, so that an update that removes a reference, or a delete, still matches the
 * webhooks the old version matched. Writes are monotonic on the referencing record's rev.
 */
import { SqlClient } from "@effect/sql"
import { Context, Effect, Layer, Ref } from "effect"
import { type StoreError, storeOp } from "./Store.js"

export interface PriorRefs {
  readonly rev: string
  readonly refs: ReadonlyArray<string>
}

export interface PriorRefsStoreShape {
  /** every stored, unexpired key (bounded by `limit`), to build the in-memory key index */
  readonly keys: (limit: number) => Effect.Effect<ReadonlyArray<string>, StoreError>
  readonly get: (recordUri: string) => Effect.Effect<PriorRefs | undefined, StoreError>
  /** write if the stored rev is older (or absent); returns whether a row was written */
  readonly put: (
    recordUri: string,
    value: PriorRefs,
    bytes: number,
    ttlSeconds: number
  ) => Effect.Effect<boolean, StoreError>
  /** delete if the stored rev is older than `rev`; returns whether a row was deleted */
  readonly remove: (recordUri: string, rev: string) => Effect.Effect<boolean, StoreError>
  readonly count: Effect.Effect<number, StoreError>
}

export class PriorRefsStore extends Context.Tag("firehook/PriorRefsStore")<PriorRefsStore, PriorRefsStoreShape>() {}

const refsOf = (v: unknown): ReadonlyArray<string> => {
  const parsed: unknown = typeof v === "string" ? JSON.parse(v) : v
  return Array.isArray(parsed) ? parsed.filter((x): x is string => typeof x === "string") : []
}

export const makeSql = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const store: PriorRefsStoreShape = {
    keys: (limit) =>
      sql<{ record_uri: string }>`SELECT record_uri FROM prior_refs WHERE expires_at > now() LIMIT ${limit}`.pipe(
        Effect.map((rows) => rows.map((r) => r.record_uri)),
        storeOp("priorRefs.keys")
      ),
    get: (recordUri) =>
      sql<{ rev: string; refs: unknown }>`
        SELECT rev, refs FROM prior_refs WHERE record_uri = ${recordUri} AND expires_at > now()`.pipe(
        Effect.map((rows) => {
          const r = rows[0]
          return r === undefined ? undefined : { rev: r.rev, refs: refsOf(r.refs) }
        }),
        storeOp("priorRefs.get")
      ),
    put: (recordUri, value, bytes, ttlSeconds) =>
      sql<{ record_uri: string }>`
        INSERT INTO prior_refs (record_uri, rev, refs, bytes, expires_at)
        VALUES (${recordUri}, ${value.rev}, ${JSON.stringify(value.refs)}::jsonb, ${bytes},
          now() + make_interval(secs => ${ttlSeconds}))
        ON CONFLICT (record_uri) DO UPDATE SET rev = EXCLUDED.rev, refs = EXCLUDED.refs, bytes = EXCLUDED.bytes,
          expires_at = EXCLUDED.expires_at, updated_at = now()
        WHERE prior_refs.rev < EXCLUDED.rev OR prior_refs.expires_at <= now()
        RETURNING record_uri`.pipe(
        Effect.map((rows) => rows.length > 0),
        storeOp("priorRefs.put")
      ),
    remove: (recordUri, rev) =>
      sql<{ record_uri: string }>`
        DELETE FROM prior_refs WHERE record_uri = ${recordUri} AND (rev < ${rev} OR expires_at <= now())
        RETURNING record_uri`.pipe(
        Effect.map((rows) => rows.length > 0),
        storeOp("priorRefs.remove")
      ),
    count: sql<{ n: string | number }>`SELECT count(*) AS n FROM prior_refs`.pipe(
      Effect.map((rows) => Number(rows[0]?.n ?? 0)),
      storeOp("priorRefs.count")
    )
  }
  return store
})

export const layerSql = Layer.effect(PriorRefsStore, makeSql)

/** Call counters of the in-memory store, for tests that assert on store traffic. */
export interface PriorRefsCalls {
  get: number
  put: number
  remove: number
}

export const makeMemory = (calls: PriorRefsCalls = { get: 0, put: 0, remove: 0 }) =>
  Effect.gen(function* () {
    const rows = yield* Ref.make(new Map<string, PriorRefs>())
    const store: PriorRefsStoreShape = {
      keys: (limit) => Ref.get(rows).pipe(Effect.map((m) => [...m.keys()].slice(0, limit))),
      get: (uri) =>
        Effect.sync(() => calls.get++).pipe(Effect.zipRight(Ref.get(rows)), Effect.map((m) => m.get(uri))),
      put: (uri, value) =>
        Effect.sync(() => calls.put++).pipe(
          Effect.zipRight(
            Ref.modify(rows, (m) => {
              const prev = m.get(uri)
              if (prev !== undefined && !(prev.rev < value.rev)) return [false, m]
              m.set(uri, value)
              return [true, m]
            })
          )
        ),
      remove: (uri, rev) =>
        Effect.sync(() => calls.remove++).pipe(
          Effect.zipRight(
            Ref.modify(rows, (m) => {
              const prev = m.get(uri)
              if (prev === undefined || !(prev.rev < rev)) return [false, m]
              m.delete(uri)
              return [true, m]
            })
          )
        ),
      count: Ref.get(rows).pipe(Effect.map((m) => m.size))
    }
    return store
  })

export const layerMemory = (calls?: PriorRefsCalls) => Layer.effect(PriorRefsStore, makeMemory(calls))
