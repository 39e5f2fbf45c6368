/**
 * Maintenance's batches (SPEC §4.9, §7): the loop that repeats a rule's statement within a run's
 * bounds, and the statements of the rules that need more than a locked batch joined back to its
 * table (Maintenance.ts): the orphan-attempt walk and the tombstone batch.
 *
 * Orphan attempts: `delivery_attempts` rows whose outbox row is gone and that are older than the
 * longest outbox retention. The attempts older than that cutoff are walked in
 * `(started_at, delivery_id, attempt)` order (the `delivery_attempts_started_at` index) from a
 * cursor, at most `window` per statement; each statement looks each walked attempt's outbox row up
 * by its primary key, deletes the attempts without one and moves the cursor past the walked ones.
 * When the walk reaches the cutoff the cursor goes back to the oldest attempt. The maintenance
 * runner keeps the cursor between its runs ({@link AttemptCursor}), like the event-body walk's
 * (EventSweep.ts).
 *
 * Why a walk: the rule used to ask for "the first `batchSize` old attempts with no outbox row"
 * (`NOT EXISTS`), which PostgreSQL planned as an anti-join over the whole outbox, a sequential
 * scan per statement: 1,046 ms for a batch of 500 on a 1.4 M-row outbox (the maintenance audit of
 * 6 December 2026), growing with the outbox. A walked window costs at most `window` index entries
 * and `window` primary-key probes of the outbox, whatever the size of either table.
 *
 * Rows locked by another transaction are skipped (`FOR UPDATE SKIP LOCKED`), like every rule.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type { Fragment } from "@effect/sql/Statement"
import { Effect, Ref } from "effect"
import { boundedTransaction, type StoreError } from "../platform/Persistence.js"
import { KEY_TEXT_FORMAT } from "./ListKey.js"

/** Statements a rule may make in one run while the run's budget lasts: this × `maxBatches`. */
export const BUDGET_BATCH_FACTOR = 20

/** One statement's outcome: rows deleted (and from a second table); `full`: the rule has more to do. */
export type Batch = { readonly rows: number; readonly extra: number; readonly full?: boolean }

/**
 * Repeat a batch while it comes back full (`full`, else `batchSize` rows deleted): `maxBatches`
 * times, then on while `withinBudget` says the run's time budget lasts, at most
 * `BUDGET_BATCH_FACTOR` × `maxBatches` times in all.
 */
export const batched = <E, R>(
  o: { readonly batchSize: number; readonly maxBatches: number },
  withinBudget: Effect.Effect<boolean>,
  batch: Effect.Effect<Batch, E, R>
): Effect.Effect<{ readonly rows: number; readonly extra: number }, E, R> =>
  Effect.gen(function*() {
    let rows = 0
    let extra = 0
    const cap = o.maxBatches * BUDGET_BATCH_FACTOR
    for (let i = 0; i < cap; i++) {
      if (i >= o.maxBatches && !(yield* withinBudget)) break
      const r = yield* batch
      rows += r.rows
      extra += r.extra
      if (!(r.full ?? r.rows >= o.batchSize)) break
    }
    return { rows, extra }
  })

/**
 * One batch of tombstones where `where` holds (over `tombstones t`), at most `size`, oldest
 * `deleted_at` first, never those of owners being reconciled (`scanning`, SPEC §3.4).
 *
 * The batch's owners are locked `FOR SHARE` (the lock a scan's begin, a non-key UPDATE of the
 * row, waits for; `FOR KEY SHARE` would not make it wait) and their status re-checked under the
 * lock, on the row's latest version: a scan begun since the statement's snapshot is seen, and
 * none can begin until the statement ends. An owner row a writer holds (a scan beginning, a live
 * write) is skipped, its tombstones kept for a later batch: never waiting on owners, the
 * statement cannot deadlock with a writer that holds its owner and then writes a tombstone this
 * batch holds. A tombstone whose owner has no row (none is written without one) goes as before.
 */
export const tombstoneBatch = (sql: SqlClient.SqlClient, where: Fragment, size: number) =>
  sql<{ readonly n: number }>`
    WITH doomed AS (
      SELECT t.owner_did, t.rkey, w.did IS NULL AS ownerless FROM tombstones t
      LEFT JOIN owners w ON w.did = t.owner_did
      WHERE ${where} AND (w.did IS NULL OR w.reconcile_status <> 'scanning')
      ORDER BY t.deleted_at
      LIMIT ${size}
      FOR UPDATE OF t SKIP LOCKED
    ), settled AS (
      SELECT w.did FROM owners w
      WHERE w.did = ANY (ARRAY(SELECT DISTINCT d.owner_did FROM doomed d WHERE NOT d.ownerless))
        AND w.reconcile_status <> 'scanning'
      FOR SHARE OF w SKIP LOCKED
    ), gone AS (
      DELETE FROM tombstones t USING doomed d
      WHERE t.owner_did = d.owner_did AND t.rkey = d.rkey
        AND (d.ownerless OR d.owner_did IN (SELECT s.did FROM settled s))
      RETURNING 1
    )
    SELECT count(*)::int AS n FROM gone`

/** A position in the walk: the last attempt walked (`at`: its `started_at` as list-key text, ListKey.ts). */
export interface AttemptKey {
  readonly at: string
  readonly deliveryId: string
  readonly attempt: number
}

/** Where the next statement of the walk starts (`undefined`: at the oldest attempt). */
export type AttemptCursor = Ref.Ref<AttemptKey | undefined>

/** A walk statement's answer: attempts deleted, attempts walked, and the last one walked (its key). */
export interface WalkRow {
  readonly n: number
  readonly walked: number
  readonly last_at: string | null
  readonly last_id: string | null
  readonly last_attempt: number | null
}

/**
 * The attempts (aliased `alias`) after `from` in the walk's `(started_at, delivery_id, attempt)`
 * order (every one with none): the `started_at` bound lets the index range start at the cursor.
 */
export const afterAttempt = (sql: SqlClient.SqlClient, from: AttemptKey | undefined, alias: string): Fragment => {
  const a = sql.literal(alias)
  return from === undefined ? sql`true` : sql`${a}.started_at >= ${from.at}::timestamptz
    AND (${a}.started_at, ${a}.delivery_id, ${a}.attempt) > (${from.at}::timestamptz, ${from.deliveryId}, ${from.attempt}::int)`
}

/** The columns of a walk's last attempt (the CTE `last`), as {@link WalkRow} names them. */
export const lastAttemptColumns = (sql: SqlClient.SqlClient): Fragment =>
  sql`(SELECT to_char(started_at AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) FROM last) AS last_at,
    (SELECT delivery_id FROM last) AS last_id, (SELECT attempt FROM last) AS last_attempt`

/** The key of a walk's last attempt (`undefined`: none was walked). */
export const lastAttemptKey = (r: WalkRow | undefined): AttemptKey | undefined =>
  r === undefined || r.last_at === null || r.last_id === null || r.last_attempt === null
    ? undefined
    : { at: r.last_at, deliveryId: r.last_id, attempt: r.last_attempt }

/**
 * A walk statement run with the plan its window needs whatever the table's statistics: in a
 * transaction of its own whose first statement turns bitmap scans, sequential scans and full sorts
 * off (`SET LOCAL`, ended with the transaction), and JIT compilation, which the penalty of a plan
 * with a turned-off node (a sort of the `last` CTE, a few rows) would start: 300 ms a statement. The walk's only plan left is then the
 * `delivery_attempts_started_at` index scan from the cursor with an incremental sort of each
 * `started_at`'s ties, stopped by the LIMIT: it reads its window, not every attempt after the
 * cursor. Without this, a table never analysed after a bulk insert was walked by a bitmap scan of
 * every attempt after the cursor and a top-N sort, and statistics taken while the load was
 * uncommitted (the table "empty") by a full sort of the same (docs/decisions.md, "Maintenance
 * statements and stale statistics").
 *
 * The transaction is {@link boundedTransaction}'s: its BEGIN and ROLLBACK are uninterruptible, so a
 * plain `sql.withTransaction` let the caller's statement bound (`timed`) wait for a statement the
 * server kept running (its cancel not delivered: a full pool) or for a server that stopped
 * answering; the watched one ends its connection at TX_TIMEOUT (found by the review of the fix).
 * Meant for top-level use: nested in another transaction it is a SAVEPOINT, and `SET LOCAL`
 * settings outlive a released savepoint (the enclosing transaction's later statements would plan
 * with them); maintenance's runner never nests it.
 */
export const planned = <A>(
  sql: SqlClient.SqlClient,
  statement: Effect.Effect<A, SqlError>
): Effect.Effect<A, SqlError | StoreError> =>
  boundedTransaction(sql)(Effect.zipRight(
    sql`SELECT set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true),
      set_config('enable_sort', 'off', true), set_config('jit', 'off', true)`,
    statement
  ))

/**
 * The deletion of a walk's locked attempts (the CTE `doomed`, its `ctid`s): a TID scan under
 * {@link planned}'s settings (with sequential scans allowed it can be a sequential scan filtered by
 * `ctid`: use it only there), which no statistics can turn into a join; a join back to the table by key was planned, under statistics
 * that call the table empty, as a scan of the whole primary key rescanning `doomed` for each entry
 * (quadratic). Attempts are never updated: the version a `doomed` row locked is the one deleted.
 */
export const deleteDoomed = (sql: SqlClient.SqlClient): Fragment =>
  sql`DELETE FROM delivery_attempts a WHERE a.ctid = ANY (ARRAY(SELECT d.ctid FROM doomed d)) RETURNING 1`

/** What a walk statement deletes among its walked attempts (a predicate over the attempt `alias`). */
export interface WalkDoom {
  /** the walked attempts to delete (over the walked attempt `alias`) */
  readonly doomed: (alias: string) => Fragment
  /** whether the locked attempts are checked again (over `a`), under the lock */
  readonly recheck: boolean
}

/**
 * One statement of a cutoff walk: at most `window` attempts older than `olderThanSeconds` after the
 * cursor, those `doom` names deleted. Moves the cursor (back to the oldest at the cutoff) and
 * returns the attempts deleted and whether the window was full (the walk goes on).
 */
export const walkAttemptsBatch = <E>(
  sql: SqlClient.SqlClient,
  options: {
    readonly olderThanSeconds: number
    readonly window: number
    readonly cursor: AttemptCursor
    readonly timed: <A>(statement: Effect.Effect<A, SqlError | StoreError>) => Effect.Effect<A, E>
  },
  doom: WalkDoom
): Effect.Effect<{ readonly rows: number; readonly extra: number; readonly full: boolean }, E> =>
  Effect.gen(function*() {
    const { cursor, timed } = options
    const window = Math.max(1, Math.floor(options.window))
    const cutoff = sql`now() - make_interval(secs => ${options.olderThanSeconds}::double precision)`
    const from = yield* Ref.get(cursor)
    const after = (alias: string) => afterAttempt(sql, from, alias)
    const rows = yield* timed(planned(
      sql,
      sql<WalkRow>`
      WITH walked AS (
        SELECT w.delivery_id, w.attempt, w.started_at FROM delivery_attempts w
        WHERE w.started_at < ${cutoff} AND ${after("w")}
        ORDER BY w.started_at, w.delivery_id, w.attempt
        LIMIT ${window}
      ), last AS (
        SELECT started_at, delivery_id, attempt FROM walked
        ORDER BY started_at DESC, delivery_id DESC, attempt DESC LIMIT 1
      ), doomed AS (
        -- the doomed walked attempts, locked by key: their delivery ids, within the walked range
        SELECT a.ctid FROM delivery_attempts a
        WHERE a.delivery_id = ANY (ARRAY(SELECT w.delivery_id FROM walked w WHERE ${doom.doomed("w")}))
          AND a.started_at < ${cutoff} AND ${after("a")}
          AND (a.started_at, a.delivery_id, a.attempt) <= (SELECT l.started_at, l.delivery_id, l.attempt FROM last l)
          AND ${doom.recheck ? doom.doomed("a") : sql`true`}
        FOR UPDATE OF a SKIP LOCKED
      ), gone AS (${deleteDoomed(sql)})
      SELECT (SELECT count(*) FROM gone)::int AS n, (SELECT count(*) FROM walked)::int AS walked,
        ${lastAttemptColumns(sql)}`
    ))
    const r = rows[0]
    const last = lastAttemptKey(r)
    const end = r === undefined || r.walked < window || last === undefined
    // at the cutoff: the next statement (of this run or the next) starts from the oldest attempt
    yield* Ref.set(cursor, end ? undefined : last)
    return { rows: r?.n ?? 0, extra: 0, full: !end }
  })

/**
 * One statement of the orphan walk: the walked attempts whose outbox row is gone (one primary-key
 * probe each) deleted (see {@link walkAttemptsBatch}).
 */
export const sweepAttemptsBatch = <E>(
  sql: SqlClient.SqlClient,
  options: Parameters<typeof walkAttemptsBatch<E>>[1]
): Effect.Effect<{ readonly rows: number; readonly extra: number; readonly full: boolean }, E> =>
  walkAttemptsBatch(sql, options, {
    doomed: (alias) => sql`NOT EXISTS (SELECT 1 FROM outbox o WHERE o.delivery_id = ${sql.literal(alias)}.delivery_id)`,
    recheck: false
  })
