/**
 * The parking room of parked rows (SPEC §4.3: a gone or auto-disabled webhook's rows are parked as
 * dead letters of kind `webhook_disabled`, at most 10,000 per webhook, beyond that dropped):
 * `webhooks.parked` counts the rows parked since the webhook was last resumed (or changed), and the
 * settle statement parks a row only while that count is under the bound. A statement that takes
 * parked rows out of that state (a replay, a redeliver, maintenance pruning them) gives their room
 * back with {@link unparkCtes}.
 */
import type { SqlClient } from "@effect/sql"
import type { Fragment } from "@effect/sql/Statement"

/**
 * Data-modifying CTEs that give back the parking room (SPEC §4.3: 10,000 parked rows per webhook)
 * of the parked dead letters (`webhook_disabled`) that `source` made pending again or deleted. A
 * replayed row that is parked again (its webhook is still gone or auto-disabled) is counted again;
 * without this, replaying 6,000 parked rows of a still-disabled webhook parked 4,000 of them again
 * and dropped the other 2,000 (`cancelled`, no longer a dead letter any replay would find). Only rows of the webhook's current
 * fingerprint count (a new fingerprint starts its count afresh). The webhook rows are locked in key
 * order first (as the settle path's state update does), so two writers cannot deadlock on them.
 * `source` has `owner_did`, `webhook_rkey`, `fingerprint` and `was_parked`.
 */
export const unparkCtes = (sql: SqlClient.SqlClient, source: string): Fragment =>
  sql.literal(`unparked AS (
    SELECT owner_did, webhook_rkey, fingerprint, count(*)::int AS n FROM ${source}
    WHERE was_parked GROUP BY owner_did, webhook_rkey, fingerprint
  ),
  unparked_lock AS (
    SELECT w.owner_did, w.rkey FROM webhooks w
    JOIN unparked u ON w.owner_did = u.owner_did AND w.rkey = u.webhook_rkey AND w.fingerprint = u.fingerprint
    ORDER BY w.owner_did, w.rkey
    FOR UPDATE OF w
  ),
  unparked_room AS (
    UPDATE webhooks w SET parked = GREATEST(0, w.parked - u.n)
    FROM unparked u, unparked_lock l
    WHERE w.owner_did = u.owner_did AND w.rkey = u.webhook_rkey AND w.fingerprint = u.fingerprint
      AND l.owner_did = w.owner_did AND l.rkey = w.rkey
    RETURNING 1
  )`)
