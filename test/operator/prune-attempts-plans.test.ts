/**
 * The attempt walks (orphans: PruneBatches.ts; excess, aged: PruneAttempts.ts) read their window
 * whatever the statistics of `delivery_attempts`: on 200,000 attempts inserted and never analysed,
 * and on statistics taken while the insert was uncommitted (the table "empty"), each statement
 * reads at most a bounded multiple of its window (index and heap tuples, this transaction's
 * counters), not every attempt after its cursor (docs/decisions.md, "Maintenance statements and
 * stale statistics").
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import * as PruneAttempts from "../../src/services/operator/PruneAttempts.js"
import type { Batch } from "../../src/services/operator/PruneBatches.js"
import type { StoreError } from "../../src/services/platform/Persistence.js"
import * as Db from "../support/db.js"
import { withClient } from "../support/pgAdmin.js"

const BATCH = 500
const DELIVERIES = 1_600
const PER_DELIVERY = 125
/** 200,000 attempts over the last 60 days, deliveries interleaved, attempt 1 of each first */
const LOAD = `
  INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, response_excerpt)
  SELECT 'd' || lpad(d::text, 5, '0'), g,
    now() - interval '60 days' + make_interval(secs => (g * ${DELIVERIES} + d) * 60.0 * 86400 / ${
  DELIVERIES * PER_DELIVERY
}),
    12, 'failed', repeat('x', 100)
  FROM generate_series(1, ${PER_DELIVERY}) g, generate_series(1, ${DELIVERIES}) d`

const databaseUrl = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    Effect.map(sql<{ name: string }>`SELECT current_database() AS name`, (rows) => Db.urlFor(rows[0]?.name ?? ""))
)

/** Load the attempts, committed, never analysed. */
const loadNeverAnalysed = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => Effect.zipRight(sql`TRUNCATE delivery_attempts, outbox`, sql.unsafe(LOAD))
)

/** Load the attempts while another session analyses the table: statistics of an "empty" table. */
const loadWithUncommittedStatistics = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`TRUNCATE delivery_attempts, outbox`
  const url = yield* databaseUrl
  yield* Effect.promise(() =>
    withClient(url, async (c) => {
      await c.query("BEGIN")
      await c.query(LOAD)
      await withClient(url, (other) => other.query("ANALYZE delivery_attempts"))
      await c.query("COMMIT")
    })
  )
  const rows = yield* sql<{ n: number }>`
    SELECT reltuples::float8 AS n FROM pg_class WHERE oid = 'delivery_attempts'::regclass`
  expect(rows[0]?.n).toBe(0)
})

class Measured {
  readonly _tag = "Measured"
  constructor(readonly read: number, readonly batch: Batch) {}
}

type Walk = (cursor: PruneAttempts.AttemptBoundCursors["excess"]) => Effect.Effect<Batch, SqlError | StoreError>

const walks = (sql: SqlClient.SqlClient): ReadonlyArray<readonly [string, number, Walk]> => {
  const o = {
    batchSize: BATCH,
    olderThanSeconds: 30 * 86_400,
    timed: <A>(s: Effect.Effect<A, SqlError | StoreError>) => s
  }
  return [
    [
      "excess",
      BATCH * PruneAttempts.EXCESS_WALK_FACTOR,
      (cursor) => PruneAttempts.excessAttemptsBatch(sql, { ...o, cursor })
    ],
    ["aged", BATCH, (cursor) => PruneAttempts.agedAttemptsBatch(sql, { ...o, cursor })],
    [
      "orphans",
      BATCH,
      (cursor) =>
        PruneAttempts.rule(sql, "orphans", { ...o, cursor, loop: (b) => Effect.map(b, (r) => ({ ...r, full: true })) })
    ]
  ]
}

/**
 * Two statements of a walk (from the oldest attempt, then from where the first left off), each in
 * a transaction rolled back: the tuples each read from `delivery_attempts` (index entries returned
 * plus heap rows fetched).
 */
const measure = (sql: SqlClient.SqlClient, walk: Walk) =>
  Effect.gen(function*() {
    const cursor = yield* PruneAttempts.newCursor
    const reads: Array<number> = []
    for (let i = 0; i < 2; i++) {
      const counted = sql<{ n: number }>`
        SELECT (pg_stat_get_xact_tuples_returned('delivery_attempts'::regclass)
          + pg_stat_get_xact_tuples_fetched('delivery_attempts'::regclass))::int AS n`
      const outcome = yield* Effect.either(sql.withTransaction(Effect.gen(function*() {
        yield* sql`SET LOCAL statement_timeout = '10s'`
        const before = (yield* counted)[0]?.n ?? 0
        const batch = yield* walk(cursor)
        const after = (yield* counted)[0]?.n ?? 0
        return yield* Effect.fail(new Measured(after - before, batch))
      })))
      if (Either.isRight(outcome)) return yield* Effect.dieMessage("not rolled back")
      const m = outcome.left
      if (!(m instanceof Measured)) return yield* Effect.dieMessage(`walk failed: ${String(m.message)}`)
      expect(m.batch.full).toBe(true)
      reads.push(m.read)
    }
    return reads
  })

const checkAll = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  for (const [name, window, walk] of walks(sql)) {
    const reads = yield* measure(sql, walk)
    // the window and a primary-key probe or two per walked attempt; before: every attempt after the cursor
    for (const read of reads) expect(read, `${name}: tuples read`).toBeLessThanOrEqual(6 * window)
  }
})

describe("Maintenance: attempt walks whatever the statistics", () => {
  it.layer(Db.layer())("on PostgreSQL", (it) => {
    it.effect(
      "200,000 attempts never analysed: each statement reads its window",
      () => Effect.zipRight(loadNeverAnalysed, checkAll),
      { timeout: 60_000 }
    )

    it.effect(
      "statistics taken while the load was uncommitted: each statement reads its window",
      () => Effect.zipRight(loadWithUncommittedStatistics, checkAll),
      { timeout: 60_000 }
    )
  })
})
