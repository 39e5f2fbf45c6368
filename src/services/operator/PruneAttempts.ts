/**
 * Maintenance's bounds on the attempts of deliveries whose outbox row is kept (SPEC §4.9, §7).
 *
 * An outbox row's attempts go with the row, but a row that an owner keeps redelivering or
 * replaying never ages out (each redelivery clears `finished_at`), and every redelivery adds
 * attempts, numbered on from the delivery's highest (`max(attempt) + 1`). So, whatever becomes of
 * the row:
 *
 * - `delivery_attempts.excess`: a delivery keeps its newest {@link EXCESS_ATTEMPTS_KEPT} attempts
 *   (by number): those numbered `max(attempt) - 100` or lower go. Every new attempt is written with
 *   its start time, so the walk follows the `delivery_attempts_started_at` index from a cursor the
 *   runner keeps, {@link EXCESS_WALK_FACTOR} × `batchSize` attempts a statement, and stays at the
 *   newest one walked: each attempt is read about once. Only a walked attempt numbered above 100
 *   names a delivery that may have more; that delivery's highest number is read from the primary key
 *   and its attempts at or below the bound are deleted by a primary-key range, at most `batchSize` a
 *   statement (a statement that reaches that limit walks the same window again). An attempt written
 *   behind the cursor (its request began before the last statement) is not walked: its delivery's
 *   next walked attempt, or the age bound, prunes what it leaves. The walk stops at the database's
 *   `now()`: an attempt stamped ahead of it (a replica's clock running fast) is walked when its time
 *   comes, and never moves the cursor past attempts still being written.
 * - `delivery_attempts.aged`: attempts older than the longest outbox retention go, except the
 *   newest of their delivery (`getDelivery` and `firehook deliveries show` keep the last outcome).
 *   Walked like the orphan attempts (PruneBatches.ts): from a cursor, `batchSize` attempts older
 *   than the cutoff a statement, each deleted when its delivery has a higher-numbered attempt (one
 *   primary-key probe); at the cutoff the walk starts over from the oldest.
 *
 * A statement reads at most its window of index entries and probes the primary key per walked
 * attempt, whatever the size of the table. Rows locked by another transaction are skipped.
 * Measured on 7 December 2026 on 2,000,000 attempts (a loaded two-core machine): an excess
 * statement walking 10,000 attempts and deleting 1,000 took 35–65 ms, an aged one 15–45 ms; the
 * aged check written as `EXISTS` (a higher-numbered attempt) was planned as a hash semi-join over
 * the whole table, 4.1 s, hence the scalar `max(attempt)` subqueries. Both statements run with
 * the walk's plan settings and delete by `ctid` (PruneBatches.ts, `planned`, `deleteDoomed`):
 * never analysed after a bulk insert, the excess statement had walked by a bitmap scan of every
 * attempt after the cursor (1.9 s on 2,000,000); under statistics taken while the load was
 * uncommitted, both ran past the 30 s statement bound (a full sort of the rest of the table, and
 * the deletion's join scanning the whole primary key for each locked attempt).
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import { Effect, Ref } from "effect"
import type { StoreError } from "../platform/Persistence.js"
import {
  afterAttempt,
  type AttemptCursor,
  type AttemptKey,
  type Batch,
  deleteDoomed,
  lastAttemptColumns,
  lastAttemptKey,
  planned,
  sweepAttemptsBatch,
  walkAttemptsBatch,
  type WalkRow
} from "./PruneBatches.js"

/** Attempts a delivery keeps, its newest by number: lower-numbered ones are pruned. */
export const EXCESS_ATTEMPTS_KEPT = 100

/** Attempts the excess walk reads per statement: this × `batchSize` (it deletes at most `batchSize`). */
export const EXCESS_WALK_FACTOR = 10

/** Where the two walks resume (the runner keeps them between its runs). */
export interface AttemptBoundCursors {
  readonly excess: AttemptCursor
  readonly aged: AttemptCursor
}

/** A cursor at the oldest attempt. */
export const newCursor: Effect.Effect<AttemptCursor> = Ref.make<AttemptKey | undefined>(undefined)

/** The two walks' cursors, at the oldest attempt. */
export const newBoundCursors: Effect.Effect<AttemptBoundCursors> = Effect.all({ excess: newCursor, aged: newCursor })

interface Options<E> {
  readonly batchSize: number
  /** the longest outbox retention */
  readonly olderThanSeconds: number
  readonly cursor: AttemptCursor
  readonly timed: <A>(statement: Effect.Effect<A, SqlError | StoreError>) => Effect.Effect<A, E>
}

type ExcessRow = WalkRow & { readonly doomed: number }

/**
 * One statement of the excess walk: the next `EXCESS_WALK_FACTOR × batchSize` attempts after the
 * cursor; the attempts at or below `max(attempt) - 100` of the deliveries they name, at most
 * `batchSize`, deleted. The cursor moves past the window unless the deletions reached their limit.
 */
export const excessAttemptsBatch = <E>(sql: SqlClient.SqlClient, o: Options<E>): Effect.Effect<Batch, E> =>
  Effect.gen(function*() {
    const limit = Math.max(1, Math.floor(o.batchSize))
    const window = limit * EXCESS_WALK_FACTOR
    const from = yield* Ref.get(o.cursor)
    const rows = yield* o.timed(planned(
      sql,
      sql<ExcessRow>`
      WITH walked AS (
        SELECT w.delivery_id, w.attempt, w.started_at FROM delivery_attempts w
        WHERE w.started_at <= now() AND ${afterAttempt(sql, from, "w")}
        ORDER BY w.started_at, w.delivery_id, w.attempt
        LIMIT ${window}
      ), last AS (
        SELECT started_at, delivery_id, attempt FROM walked
        ORDER BY started_at DESC, delivery_id DESC, attempt DESC LIMIT 1
      ), bound AS (
        SELECT c.delivery_id,
          (SELECT max(m.attempt) FROM delivery_attempts m WHERE m.delivery_id = c.delivery_id) - ${EXCESS_ATTEMPTS_KEPT}
            AS upto
        FROM (SELECT DISTINCT w.delivery_id FROM walked w WHERE w.attempt > ${EXCESS_ATTEMPTS_KEPT}) c
      ), doomed AS (
        SELECT a.ctid FROM bound b
        JOIN delivery_attempts a ON a.delivery_id = b.delivery_id AND a.attempt <= b.upto
        LIMIT ${limit}
        FOR UPDATE OF a SKIP LOCKED
      ), gone AS (${deleteDoomed(sql)})
      SELECT (SELECT count(*) FROM gone)::int AS n, (SELECT count(*) FROM doomed)::int AS doomed,
        (SELECT count(*) FROM walked)::int AS walked, ${lastAttemptColumns(sql)}`
    ))
    const r = rows[0]
    const last = lastAttemptKey(r)
    const again = r !== undefined && r.doomed >= limit
    // past the window (at the newest attempt: the next run starts after it), unless it has more to delete
    if (!again && last !== undefined) yield* Ref.set(o.cursor, last)
    return { rows: r?.n ?? 0, extra: 0, full: again || (r !== undefined && r.walked >= window) }
  })

/**
 * One statement of the aged walk: at most `batchSize` attempts older than the cutoff after the
 * cursor, those with a higher-numbered attempt of their delivery deleted. Moves the cursor (back to
 * the oldest at the cutoff).
 */
export const agedAttemptsBatch = <E>(sql: SqlClient.SqlClient, o: Options<E>): Effect.Effect<Batch, E> =>
  walkAttemptsBatch(sql, {
    olderThanSeconds: o.olderThanSeconds,
    window: o.batchSize,
    cursor: o.cursor,
    timed: o.timed
  }, {
    // below their delivery's newest (a primary-key probe each, a scalar subquery: an EXISTS was
    // planned as a semi-join over the whole table), checked again under the lock
    doomed: (alias) => {
      const x = sql.literal(alias)
      return sql`${x}.attempt < (SELECT max(n.attempt) FROM delivery_attempts n WHERE n.delivery_id = ${x}.delivery_id)`
    },
    recheck: true
  })

/** The attempt rules: orphans (PruneBatches.ts), and the two bounds above. */
export type AttemptRule = "orphans" | keyof AttemptBoundCursors

/**
 * An attempt rule: its statement repeated by `loop` (the maintenance run's `batched` loop), from
 * `cursor` (none: from the oldest attempt).
 */
export const rule = <E>(
  sql: SqlClient.SqlClient,
  which: AttemptRule,
  o: Omit<Options<E>, "cursor"> & {
    readonly cursor: AttemptCursor | undefined
    readonly loop: (
      batch: Effect.Effect<Batch, E>
    ) => Effect.Effect<{ readonly rows: number; readonly extra: number }, E>
  }
): Effect.Effect<{ readonly rows: number; readonly extra: number }, E> =>
  Effect.flatMap(o.cursor === undefined ? newCursor : Effect.succeed(o.cursor), (cursor) =>
    o.loop(
      which === "orphans"
        ? sweepAttemptsBatch(sql, { olderThanSeconds: o.olderThanSeconds, window: o.batchSize, cursor, timed: o.timed })
        : (which === "excess" ? excessAttemptsBatch : agedAttemptsBatch)(sql, { ...o, cursor })
    ))
