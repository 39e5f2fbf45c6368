/**
 * The parking room of parked rows (SPEC §4.3: a gone or auto-disabled webhook's rows are parked as
 * dead letters of kind `webhook_disabled`, at most 10,000 per webhook, beyond that dropped):
 * `webhooks.parked` counts the rows parked since the webhook was last resumed (or changed), and the
 * settle statement parks a row only while that count is under the bound. A statement that takes
 * parked rows out of that state (a replay, a redeliver, maintenance pruning them) gives their room
 * back with {@link unparkCtes}.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { Fragment } from "@effect/sql/Statement"

/**
 * Data-modifying CTEs that give back the parking room (SPEC §4.3: 10,000 parked rows per webhook)
 * of the parked dead letters (`webhook_disabled`) that `source` made pending again or deleted. A
 * replayed row that is parked again (its webhook is still gone or auto-disabled) is counted again;
 * without this, replaying 6,000 parked rows of a still-disabled webhook parked 4,000 of them again
 * and dropped the other 2,000 (`cancelled`, no longer a dead letter any replay would find). Only rows of the webhook's current
 * fingerprint count (a new fingerprint starts its count afresh), and only rows parked since the
 * count last restarted (`finished_at`, the park time, at or after `webhooks.parked_since`; NULL:
 * since ever): a resume sets `parked` to 0 and keeps the rows parked before it, and giving their
 * room back again made the count understate the rows parked since (pruning 10,000 rows of a
 * period before the resume let 20,000 be parked in the next one). The count is computed in the
 * update itself, from the webhook row as locked (a resume committed meanwhile is seen). The
 * webhook rows are locked in key order first (as the settle path's state update does), so two
 * writers cannot deadlock on them. `source` has `owner_did`, `webhook_rkey`, `fingerprint`,
 * `was_parked` and `finished_at` (the row's value before the statement changed it).
 */
export const unparkCtes = (sql: SqlClient.SqlClient, source: string): Fragment =>
  sql.literal(`unparked AS (
    SELECT DISTINCT owner_did, webhook_rkey, fingerprint FROM ${source} WHERE was_parked
  ),
  unparked_lock AS (
    SELECT w.owner_did, w.rkey FROM webhooks w
    JOIN unparked u ON w.owner_did = u.owner_did AND w.rkey = u.webhook_rkey AND w.fingerprint = u.fingerprint
    ORDER BY w.owner_did, w.rkey
    FOR UPDATE OF w
  ),
  unparked_room AS (
    UPDATE webhooks w SET parked = GREATEST(0, w.parked - (
      SELECT count(*)::int FROM ${source} s
      WHERE s.was_parked AND s.owner_did = w.owner_did AND s.webhook_rkey = w.rkey AND s.fingerprint = w.fingerprint
        AND (w.parked_since IS NULL OR s.finished_at >= w.parked_since)
    ))
    FROM unparked_lock l
    WHERE l.owner_did = w.owner_did AND l.rkey = w.rkey
    RETURNING 1
  )`)
