/**
 * Durable stream cursors (SPEC §3.3): one per (stream, relay), never moving backwards.
 * The write runs as the last statement of an intake batch's transaction.
 */
import * as SqlClient from "@effect/sql/SqlClient"
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
  /**
   * The durable replay obligations (0017; SPEC §3.1). A store without them keeps none: the streams'
   * replays for new registrations are then held in memory only.
   */
  readonly replay?: ReplayStore
}

/**
 * A stream's durable replay obligation: it must resume from at most `from` (`replay_from`); `seq`
 * (`replay_seq`) changes with every obligation written, so that a session clears only the ones it
 * knew of when it connected.
 */
export interface ReplayObligation {
  readonly from: bigint
  readonly seq: bigint
}

/** what a replay session's commit did to the obligation it connected for */
export type ReplayAdvance =
  /** it reached the stream's stored cursor: cleared */
  | "cleared"
  /** still below the stored cursor: `replay_from` raised to the batch's cursor */
  | "pending"
  /** another obligation was written since the session read it (or none is left): not touched */
  | "superseded"

export interface ReplayStore {
  /**
   * In a registry batch's transaction that registered a webhook: `replay_from` = LEAST(itself,
   * `from`) on each target's row, `replay_seq` bumped. A target without a row gets none (it starts
   * from its initial cursor, before every registration), unless `createRow`: then a row with its
   * cursor at `from` (a stream that starts live without one).
   */
  readonly mark: (
    relay: string,
    targets: ReadonlyArray<{ readonly stream: string; readonly createRow: boolean }>,
    from: bigint
  ) => Effect.Effect<void, StoreError>
  readonly load: (stream: string, relay: string) => Effect.Effect<ReplayObligation | undefined, StoreError>
  /**
   * In a replay session's batch transaction, after its cursor write: the obligation `seq` was
   * replayed through `through`. Compare-and-set on `seq`.
   */
  readonly advance: (
    stream: string,
    relay: string,
    seq: bigint,
    through: bigint
  ) => Effect.Effect<ReplayAdvance, StoreError>
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

/** The replay obligations in the `cursors` table (0017). */
export const replayStoreSql = (sql: SqlClient.SqlClient): ReplayStore => ({
  mark: (relay, targets, from) =>
    Effect.forEach(targets, (t) =>
      t.createRow
        ? sql`
          INSERT INTO cursors (stream, relay, cursor, replay_from, replay_seq)
          VALUES (${t.stream}, ${relay}, ${from.toString()}::bigint, ${from.toString()}::bigint, 1)
          ON CONFLICT (stream, relay) DO UPDATE
            SET replay_from = LEAST(COALESCE(cursors.replay_from, EXCLUDED.replay_from), EXCLUDED.replay_from),
                replay_seq = cursors.replay_seq + 1`
        : sql`
          UPDATE cursors
            SET replay_from = LEAST(COALESCE(replay_from, ${from.toString()}::bigint), ${from.toString()}::bigint),
                replay_seq = replay_seq + 1
          WHERE stream = ${t.stream} AND relay = ${relay}`, { discard: true }).pipe(storeOp("cursors.replay_mark")),
  load: (stream, relay) =>
    sql<{ replay_from: string; replay_seq: string }>`
      SELECT replay_from::text AS replay_from, replay_seq::text AS replay_seq
      FROM cursors WHERE stream = ${stream} AND relay = ${relay} AND replay_from IS NOT NULL`.pipe(
      Effect.map((rows) => {
        const row = rows[0]
        return row === undefined ? undefined : { from: BigInt(row.replay_from), seq: BigInt(row.replay_seq) }
      }),
      storeOp("cursors.replay_load")
    ),
  advance: (stream, relay, seq, through) =>
    sql<{ replay_from: string | null }>`
      UPDATE cursors
        SET replay_from = CASE WHEN cursor <= ${through.toString()}::bigint THEN NULL
                               ELSE GREATEST(replay_from, ${through.toString()}::bigint) END
      WHERE stream = ${stream} AND relay = ${relay} AND replay_seq = ${seq.toString()}::bigint
        AND replay_from IS NOT NULL
      RETURNING replay_from::text AS replay_from`.pipe(
      Effect.map((rows): ReplayAdvance => {
        const row = rows[0]
        return row === undefined ? "superseded" : row.replay_from === null ? "cleared" : "pending"
      }),
      storeOp("cursors.replay_advance")
    )
})

export const layerSql = Layer.effect(
  CursorStore,
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const store: CursorStoreShape = {
      replay: replayStoreSql(sql),
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
