/**
 * Maintenance's pruning of event bodies (SPEC §4.9): bodies older than the retention that no outbox
 * row references.
 *
 * The bodies are walked in `(created_at, event_id)` order from a cursor, at most `window` per
 * statement; each statement deletes the unreferenced ones among those it walked and moves the
 * cursor past them. A run makes at most `maxBatches` statements and stops early when the walk
 * reaches the retention cutoff, where the next walk starts from the oldest body again. The
 * maintenance runner keeps the cursor between its runs ({@link SweepCursor}), so successive runs
 * cover every old body in turn.
 *
 * Why a cursor: the old bodies that are still referenced stay, for as long as their rows do (a
 * dead letter for 30 days, a pending row for as long as it retries), and a statement that looked
 * for "the first `batchSize` unreferenced old bodies" walked all of them again each time it came
 * up short, that is at the end of every run: measured on 2,000,000 outbox rows, 1.2 s for 230,000
 * retained bodies and 3.8 s for 690,000, growing with the retained dead letters until the statement
 * hit its timeout and the rule failed every run. Walking a bounded window from a cursor costs at
 * most `window` index probes per statement, whatever is retained (75–110 ms per 10,000 bodies on
 * that database).
 *
 * Rows locked by a writer are skipped (`FOR UPDATE SKIP LOCKED`, like every rule): an intake
 * statement that reuses a body refreshes its `created_at` and holds its lock until commit, so a
 * body about to be referenced again is never deleted.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import { Effect, Ref } from "effect"
import { KEY_TEXT_FORMAT } from "./ListKey.js"

/** A position in the walk: the `created_at` (list-key text, `ListKey.ts`) and id of the last body walked. */
export interface SweepKey {
  readonly at: string
  readonly eventId: string
}

/** Where the next statement of the walk starts (`undefined`: at the oldest body). */
export type SweepCursor = Ref.Ref<SweepKey | undefined>

/** Bodies walked per statement by default. */
export const DEFAULT_EVENT_SWEEP_WINDOW = 10_000

interface SweepRow {
  readonly n: number
  readonly walked: number
  readonly last_at: string | null
  readonly last_id: string | null
}

/**
 * One run of the sweep: at most `maxBatches` statements, each walking at most `window` bodies
 * older than `retentionSeconds` after the cursor and deleting the unreferenced ones. Returns the
 * bodies deleted. `timed` bounds each statement.
 */
export const sweepEvents = <E>(
  sql: SqlClient.SqlClient,
  options: {
    readonly retentionSeconds: number
    readonly window: number
    readonly maxBatches: number
    readonly cursor: SweepCursor
    readonly timed: <A>(statement: Effect.Effect<A, SqlError>) => Effect.Effect<A, E>
  }
): Effect.Effect<number, E> =>
  Effect.gen(function*() {
    const { cursor, timed } = options
    const window = Math.max(1, Math.floor(options.window))
    const cutoff = sql`now() - make_interval(secs => ${options.retentionSeconds}::double precision)`
    let deleted = 0
    for (let i = 0; i < options.maxBatches; i++) {
      const from = yield* Ref.get(cursor)
      const after = from === undefined
        ? sql`true`
        : sql`created_at >= ${from.at}::timestamptz AND (created_at, event_id) > (${from.at}::timestamptz, ${from.eventId})`
      const rows = yield* timed(sql<SweepRow>`
        WITH walked AS (
          SELECT event_id, created_at FROM delivery_events
          WHERE created_at < ${cutoff} AND ${after}
          ORDER BY created_at, event_id
          LIMIT ${window}
        ), doomed AS (
          -- the walked ids without a row, locked by key (a join back to the table was planned as a
          -- hash join over every old body)
          SELECT e.event_id FROM delivery_events e
          WHERE e.event_id = ANY (ARRAY(
              SELECT w.event_id FROM walked w WHERE NOT EXISTS (SELECT 1 FROM outbox o WHERE o.event_id = w.event_id)))
            AND e.created_at < ${cutoff}
          FOR UPDATE OF e SKIP LOCKED
        ), gone AS (
          DELETE FROM delivery_events e USING doomed d
          WHERE e.event_id = d.event_id
          RETURNING 1
        ), last AS (
          SELECT to_char(created_at AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) AS at, event_id FROM walked
          ORDER BY created_at DESC, event_id DESC LIMIT 1
        )
        SELECT (SELECT count(*) FROM gone)::int AS n, (SELECT count(*) FROM walked)::int AS walked,
          (SELECT at FROM last) AS last_at, (SELECT event_id FROM last) AS last_id`)
      const r = rows[0]
      deleted += r?.n ?? 0
      const end = r === undefined || r.walked < window || r.last_at === null || r.last_id === null
      // at the cutoff: the next statement (of this run or the next) starts from the oldest body
      yield* Ref.set(cursor, end ? undefined : { at: r.last_at ?? "", eventId: r.last_id ?? "" })
      if (end) break
    }
    return deleted
  })
