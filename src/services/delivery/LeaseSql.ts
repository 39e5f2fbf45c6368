/**
 * The lease statements of the PostgreSQL driver of the `DeliveryStore` port (see DeliveryStore.ts
 * for the leases and the liveness marks): renewing leases (`heartbeat`, `heartbeatMany`) and
 * freeing the rows of workers known dead (`reclaim`). Used by DeliveryStoreSql.ts.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import { Effect } from "effect"
import { WORKER_ALIVE } from "../platform/LockKeys.js"
import { type StoreError, storeOpWithin } from "../platform/Persistence.js"
import { RECLAIM_MAX, RECLAIM_TIMEOUT, STATEMENT_TIMEOUT } from "./DeliveryStore.js"

const clampInt = (n: number, min: number, max: number): number =>
  Number.isFinite(n) ? Math.min(max, Math.max(min, Math.floor(n))) : min

/** Map a failure to a `StoreError` and bound the statement's time. */
const op = (name: string) => storeOpWithin(name, STATEMENT_TIMEOUT)

// ---------------------------------------------------------------------------------------------
// Reclaim (rows of workers known dead)

/**
 * Expires the valid leases of rows whose worker's liveness mark is not held by any session of this
 * database (SPEC §4.1), so that the next claim takes them. The worker id is the lease token up to
 * its last `:` (a worker id may itself contain `:`; the uuid does not). A hash collision only makes
 * a dead worker look alive (its rows then wait for their lease to expire). The leases of `workerId`
 * itself are never touched. Rows locked right now (being settled or claimed) are skipped.
 *
 * A row is judged dead from the statement's snapshot; one changed since (in READ COMMITTED the lock
 * takes its newest version and re-checks only the conditions written on `o`) is expired only if it
 * still has the lease token judged dead: the row may have been freed by another process's reclaim
 * in the meantime and claimed by a live worker, whose fresh lease must stand.
 */
export const reclaimStatement = (sql: SqlClient.SqlClient, workerId: string) =>
  sql<{ readonly n: number }>`
    WITH live AS MATERIALIZED (
      SELECT l.objid FROM pg_locks l
      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND l.classid = ${WORKER_ALIVE}::oid
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ),
    leased AS (
      SELECT o.delivery_id, o.lease_token,
        left(o.lease_token, length(o.lease_token) - strpos(reverse(o.lease_token), ':')) AS owner
      FROM outbox o
      WHERE o.status = 'leased' AND o.leased_until > now() AND o.lease_token IS NOT NULL
    ),
    dead AS (
      SELECT o.delivery_id FROM outbox o
      WHERE (o.delivery_id, o.lease_token) IN (
          SELECT d.delivery_id, d.lease_token FROM leased d
          WHERE d.owner <> ${workerId}
            AND NOT EXISTS (SELECT 1 FROM live WHERE live.objid = hashtext(d.owner)::oid)
          LIMIT ${RECLAIM_MAX}
        )
        AND o.status = 'leased' AND o.leased_until > now()
      FOR UPDATE OF o SKIP LOCKED
    ),
    upd AS (
      UPDATE outbox o SET leased_until = now(), updated_at = now()
      FROM dead WHERE o.delivery_id = dead.delivery_id
      RETURNING 1
    )
    SELECT count(*)::int AS n FROM upd`.pipe(
    Effect.map((rows) => Number(rows[0]?.n ?? 0)),
    storeOpWithin("delivery.reclaim", RECLAIM_TIMEOUT)
  )

// ---------------------------------------------------------------------------------------------
// Heartbeat

// The heartbeat never waits for a row lock: it renews the rows it can lock at once (`SKIP LOCKED`)
// and reports the others by reading them (a row locked right now by this worker's settle, or by a
// claim taking over an expired lease, still shows its committed state: leased with our token, so
// it counts as held this round; a lease really taken over shows another token next round). With
// no statement of a worker waiting on another, a settle batch and the heartbeat cannot deadlock
// (they did, 40P01, when both locked the shared rows in the order their joins produced), and the
// settle needs no separate ordered lock of its rows (a measurable share of PostgreSQL's time per
// delivery; figures in docs/benchmarks.md).
export const heartbeatManyStatement = (
  sql: SqlClient.SqlClient,
  leases: ReadonlyArray<{ readonly deliveryId: string; readonly token: string }>,
  leaseMs: number
): Effect.Effect<ReadonlySet<string>, StoreError> =>
  leases.length === 0
    ? Effect.succeed(new Set<string>())
    : sql<{ lease_token: string }>`
          WITH v AS (
            SELECT * FROM unnest(${leases.map((l) => l.deliveryId)}::text[], ${leases.map((l) => l.token)}::text[])
              AS v(delivery_id, token)
          ),
          lk AS (
            SELECT o.delivery_id FROM outbox o JOIN v ON v.delivery_id = o.delivery_id
            WHERE o.status = 'leased' AND o.lease_token = v.token
            FOR UPDATE OF o SKIP LOCKED
          ),
          upd AS (
            UPDATE outbox o SET leased_until = now() + ${
      clampInt(leaseMs, 1, 24 * 3_600_000)
    }::int * interval '1 millisecond',
              updated_at = now()
            FROM lk WHERE o.delivery_id = lk.delivery_id
            RETURNING o.lease_token
          ),
          busy AS (
            SELECT o.lease_token FROM outbox o JOIN v ON v.delivery_id = o.delivery_id
            WHERE o.status = 'leased' AND o.lease_token = v.token
              AND o.delivery_id NOT IN (SELECT delivery_id FROM lk)
          )
          SELECT lease_token FROM upd UNION ALL SELECT lease_token FROM busy`.pipe(
      Effect.map((rows): ReadonlySet<string> => new Set(rows.map((r) => r.lease_token))),
      op("delivery.heartbeatMany")
    )

export const heartbeatStatement = (sql: SqlClient.SqlClient, deliveryId: string, token: string, leaseMs: number) =>
  sql<{ delivery_id: string }>`
      UPDATE outbox SET leased_until = now() + ${clampInt(leaseMs, 1, 24 * 3_600_000)}::int * interval '1 millisecond',
        updated_at = now()
      WHERE delivery_id = ${deliveryId} AND status = 'leased' AND lease_token = ${token}
      RETURNING delivery_id`.pipe(
    Effect.map((rows) => rows.length > 0),
    op("delivery.heartbeat")
  )

// ---------------------------------------------------------------------------------------------
// Suspects (Suspects.ts)

/**
 * One more attempt of a reclaimed row as a suspect, under my lease: the new `crash_count`, or
 * undefined when the lease is no longer mine. Autocommitted before the request is made, so a crash
 * during the request finds it counted.
 */
export const markSuspectStatement = (sql: SqlClient.SqlClient, deliveryId: string, token: string) =>
  sql<{ crash_count: number }>`
      UPDATE outbox SET crash_count = LEAST(crash_count + 1, 32767)
      WHERE delivery_id = ${deliveryId} AND status = 'leased' AND lease_token = ${token}
      RETURNING crash_count`.pipe(
    Effect.map((rows) => rows[0] === undefined ? undefined : Number(rows[0].crash_count)),
    op("delivery.markSuspect")
  )

/**
 * Attempts cut off by an orderly stop (the grace period over): their rows stay leased (SPEC §6.3)
 * and are reclaimed as suspects, whose mark adds one to `crash_count`; one is taken off here first,
 * so that stops never add up to `crashed` (a death during the request is still counted). Only rows
 * still under these leases; answers how many.
 */
export const cutShortStatement = (sql: SqlClient.SqlClient, tokens: ReadonlyArray<string>) =>
  sql<{ n: number }>`
      WITH cut AS (
        UPDATE outbox SET crash_count = GREATEST(crash_count - 1, -32768)
        WHERE status = 'leased' AND lease_token = ANY(${tokens}::text[])
        RETURNING 1
      )
      SELECT count(*)::int AS n FROM cut`.pipe(
    Effect.map((rows) => Number(rows[0]?.n ?? 0)),
    op("delivery.cutShort")
  )
