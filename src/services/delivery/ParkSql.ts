/**
 * The park statements of the PostgreSQL driver of the `DeliveryStore` port (see DeliveryStore.ts,
 * "Open circuits"): moving an open origin's pending rows to the end of its cool-down in bulk
 * (`park`) and back to now when it recovered early (`unpark`). Each is ONE statement over every
 * origin passed, reading `outbox_origin_due (origin, next_attempt_at) WHERE status = 'pending'`,
 * at most `PARK_CHUNK` rows; rows locked right now (being claimed or settled) are skipped, and
 * the next pass moves them. Used by DeliveryStoreSql.ts.
 *
 * The cool-down ends come from the worker's breaker, on the process's clock; the rows' due times are
 * compared with the database's `now()` by every claim. {@link makeParkClock} carries the ends over
 * to the database's clock: before, a worker whose machine clock was behind the database's by more
 * than the cool-down (60 s by default) parked its open origins' rows at a time already past (they
 * stayed due, and a backlog of 4,000 of them ahead of the others' rows stalled the worker's claims
 * while the circuit was open), and one ahead kept them out for the cool-down plus its lead.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Effect } from "effect"
import { type StoreError, storeOpWithin } from "../platform/Persistence.js"
import { PARK_CHUNK, PARK_ORIGINS_MAX, type ParkedOrigin, STATEMENT_TIMEOUT } from "./DeliveryStore.js"

/** The offset is measured again at most this often (only while origins are parked or unparked). */
export const PARK_CLOCK_REMEASURE_MS = 60_000
/**
 * A new measurement replaces the offset in use only when it differs from it by this much, and a
 * replacing measurement smaller than this is taken as none (so the offset in use is 0 or at least
 * this much): `unpark` finds the rows by the exact time `park` wrote, so the offset must not change
 * between them with the noise of each measurement, whatever the offset in use.
 */
export const PARK_CLOCK_TOLERANCE_MS = 1_000

/**
 * The offset of the database's clock from this process's (ms, database minus process), measured
 * by one statement bracketed by two reads of the process's Clock, and kept stable (see
 * {@link PARK_CLOCK_TOLERANCE_MS}); `shift` carries cool-down ends to the database's clock.
 */
export const makeParkClock = (sql: SqlClient.SqlClient) => {
  let offsetMs = 0
  let measuredAt: number | undefined = undefined
  const measure = Effect.gen(function*() {
    const before = yield* Clock.currentTimeMillis
    const rows = yield* sql<{ readonly ms: number }>`
      SELECT (extract(epoch FROM clock_timestamp()) * 1000)::float8 AS ms`
    const after = yield* Clock.currentTimeMillis
    const db = Number(rows[0]?.ms)
    if (!Number.isFinite(db)) return
    const measured = Math.round(db - (before + after) / 2)
    // the raw measurement is compared with the offset in use, and rounded to none only when it
    // replaces it: rounding first flipped an offset of 1,001 ms to 0 on a measurement of 999 ms
    // (2 ms of noise moved the ends 1 s, and `unpark` no longer found the rows `park` wrote)
    if (Math.abs(measured - offsetMs) >= PARK_CLOCK_TOLERANCE_MS) {
      offsetMs = Math.abs(measured) < PARK_CLOCK_TOLERANCE_MS ? 0 : measured
    }
    measuredAt = after
  }).pipe(storeOpWithin("delivery.parkClock", STATEMENT_TIMEOUT))
  const current: Effect.Effect<number, StoreError> = Effect.flatMap(
    Clock.currentTimeMillis,
    (now) =>
      measuredAt === undefined || Math.abs(now - measuredAt) >= PARK_CLOCK_REMEASURE_MS
        ? Effect.map(measure, () => offsetMs)
        : Effect.succeed(offsetMs)
  )
  return {
    /** `origins` with their ends on the database's clock */
    shift: (origins: ReadonlyArray<ParkedOrigin>): Effect.Effect<ReadonlyArray<ParkedOrigin>, StoreError> =>
      origins.length === 0
        ? Effect.succeed(origins)
        : Effect.map(current, (off) => off === 0 ? origins : origins.map((o) => ({ ...o, untilMs: o.untilMs + off })))
  }
}

/** The origins of one statement: finite times, at most PARK_ORIGINS_MAX. */
const columns = (origins: ReadonlyArray<ParkedOrigin>) => {
  const kept = origins.filter((o) => o.origin !== "" && Number.isFinite(o.untilMs)).slice(0, PARK_ORIGINS_MAX)
  return { names: kept.map((o) => o.origin), untils: kept.map((o) => Math.floor(o.untilMs)) }
}

const count = (rows: ReadonlyArray<{ readonly n: number }>): number => Number(rows[0]?.n ?? 0)

/**
 * One statement over every origin passed: its pending rows that `pick` selects (at most
 * PARK_CHUNK, locked rows skipped) get `next_attempt_at = set`; the number moved.
 */
const move = (
  sql: SqlClient.SqlClient,
  origins: ReadonlyArray<ParkedOrigin>,
  op: "delivery.park" | "delivery.unpark"
): Effect.Effect<number, StoreError> => {
  const { names, untils } = columns(origins)
  if (names.length === 0) return Effect.succeed(0)
  // park: the rows due before the cool-down end go to it; unpark: the rows parked at exactly that
  // time are due now
  const pick = op === "delivery.park" ? sql.literal("<") : sql.literal("=")
  const set = op === "delivery.park" ? sql.literal("picked.until_at") : sql.literal("now()")
  return sql<{ readonly n: number }>`
    WITH u AS (
      SELECT u.origin, to_timestamp(u.until_ms / 1000) AS until_at
      FROM unnest(${names}::text[], ${untils}::float8[]) AS u(origin, until_ms)
    ),
    picked AS (
      SELECT x.delivery_id, u.until_at FROM u
      CROSS JOIN LATERAL (
        SELECT o.delivery_id FROM outbox o
        WHERE o.status = 'pending' AND o.origin = u.origin AND o.next_attempt_at ${pick} u.until_at
        LIMIT ${PARK_CHUNK}
        FOR UPDATE OF o SKIP LOCKED
      ) x
      LIMIT ${PARK_CHUNK}
    ),
    moved AS (
      UPDATE outbox o SET next_attempt_at = ${set}, updated_at = now()
      FROM picked
      WHERE o.delivery_id = picked.delivery_id AND o.status = 'pending'
      RETURNING 1
    )
    SELECT count(*)::int AS n FROM moved`.pipe(Effect.map(count), storeOpWithin(op, STATEMENT_TIMEOUT))
}

/**
 * Every pending row of each origin due before its `untilMs` gets `next_attempt_at = untilMs`
 * (no attempt spent; `attempt_count` and the last error are kept). Idempotent.
 */
export const parkStatement = (
  sql: SqlClient.SqlClient,
  origins: ReadonlyArray<ParkedOrigin>
): Effect.Effect<number, StoreError> => move(sql, origins, "delivery.park")

/** Every pending row of each origin at exactly its `untilMs` (parked there) is due now. */
export const unparkStatement = (
  sql: SqlClient.SqlClient,
  origins: ReadonlyArray<ParkedOrigin>
): Effect.Effect<number, StoreError> => move(sql, origins, "delivery.unpark")
