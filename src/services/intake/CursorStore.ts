/**
 * Durable stream cursors (SPEC §3.3): one per (stream, relay), never moving backwards.
 * The write runs as the last statement of an intake batch's transaction.
 */
import { SqlClient } from "@effect/sql"
import { Clock, Context, Effect, Layer, Ref } from "effect"
import { type StoreError, storeOp } from "../platform/Persistence.js"

/** A stored cursor and when it was last written (epoch millis, the store's clock). */
export interface CursorEntry {
  readonly cursor: bigint
  readonly savedAtMs: number
}

export interface CursorStoreShape {
  readonly load: (stream: string, relay: string) => Effect.Effect<bigint | undefined, StoreError>
  /**
   * the cursor and the time of its last write (a relay `seq` is no time: health counts its age from
   * that write until this process commits an event); a store without it gives no time
   */
  readonly loadEntry?: (stream: string, relay: string) => Effect.Effect<CursorEntry | undefined, StoreError>
  /** raise the cursor to `cursor` (GREATEST): a lower value never lowers it */
  readonly save: (stream: string, relay: string, cursor: bigint) => Effect.Effect<void, StoreError>
}

export class CursorStore extends Context.Tag("firehook/CursorStore")<CursorStore, CursorStoreShape>() {}

/** A cursor write as data (so that a store can fold it into another statement). */
export interface CursorWrite {
  readonly stream: string
  readonly relay: string
  readonly cursor: bigint
}

/**
 * The cursor upsert (GREATEST: never lowers it) as a statement. `save` runs it alone; the outbox's
 * one-statement batch commit embeds it as a data-modifying CTE.
 */
export const saveStatement = (sql: SqlClient.SqlClient, w: CursorWrite) =>
  sql`
    INSERT INTO cursors (stream, relay, cursor) VALUES (${w.stream}, ${w.relay}, ${w.cursor.toString()}::bigint)
    ON CONFLICT (stream, relay) DO UPDATE
      SET cursor = GREATEST(cursors.cursor, EXCLUDED.cursor), updated_at = now()`

export const layerSql = Layer.effect(
  CursorStore,
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const store: CursorStoreShape = {
      loadEntry: (stream, relay) =>
        sql<{ cursor: string; saved_at_ms: number | string }>`
          SELECT cursor::text AS cursor, (extract(epoch FROM updated_at) * 1000)::float8 AS saved_at_ms
          FROM cursors WHERE stream = ${stream} AND relay = ${relay}`.pipe(
          Effect.map((rows) => {
            const row = rows[0]
            return row === undefined ? undefined : { cursor: BigInt(row.cursor), savedAtMs: Number(row.saved_at_ms) }
          }),
          storeOp("cursors.load")
        ),
      load: (stream, relay) =>
        sql<
          { cursor: string }
        >`SELECT cursor::text AS cursor FROM cursors WHERE stream = ${stream} AND relay = ${relay}`.pipe(
          Effect.map((rows) => (rows[0] === undefined ? undefined : BigInt(rows[0].cursor))),
          storeOp("cursors.load")
        ),
      save: (stream, relay, cursor) =>
        saveStatement(sql, { stream, relay, cursor }).pipe(Effect.asVoid, storeOp("cursors.save"))
    }
    return store
  })
)

export const layerMemory = Layer.effect(
  CursorStore,
  Effect.gen(function*() {
    const cursors = yield* Ref.make(new Map<string, CursorEntry>())
    const key = (stream: string, relay: string) => `${stream} ${relay}`
    const store: CursorStoreShape = {
      load: (stream, relay) => Ref.get(cursors).pipe(Effect.map((m) => m.get(key(stream, relay))?.cursor)),
      loadEntry: (stream, relay) => Ref.get(cursors).pipe(Effect.map((m) => m.get(key(stream, relay)))),
      save: (stream, relay, cursor) =>
        Effect.flatMap(Clock.currentTimeMillis, (savedAtMs) =>
          Ref.update(cursors, (m) => {
            const k = key(stream, relay)
            const prev = m.get(k)?.cursor
            return new Map(m).set(k, { cursor: prev === undefined || cursor > prev ? cursor : prev, savedAtMs })
          }))
    }
    return store
  })
)
