/**
 * Durable stream cursors (SPEC §3.3): one per (stream, relay), never moving backwards.
 * The write runs as the last statement of an intake batch's transaction.
 */
import { SqlClient } from "@effect/sql"
import { Context, Effect, Layer, Ref } from "effect"
import { type StoreError, storeOp } from "../platform/Persistence.js"

export interface CursorStoreShape {
  readonly load: (stream: string, relay: string) => Effect.Effect<bigint | undefined, StoreError>
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
    const cursors = yield* Ref.make(new Map<string, bigint>())
    const key = (stream: string, relay: string) => `${stream} ${relay}`
    const store: CursorStoreShape = {
      load: (stream, relay) => Ref.get(cursors).pipe(Effect.map((m) => m.get(key(stream, relay)))),
      save: (stream, relay, cursor) =>
        Ref.update(cursors, (m) => {
          const k = key(stream, relay)
          const prev = m.get(k)
          return new Map(m).set(k, prev === undefined || cursor > prev ? cursor : prev)
        })
    }
    return store
  })
)
