/**
 * The outbox's wake-up channel: every writer of claimable outbox rows (enqueue, replay, redeliver,
 * a released lease) sends one `NOTIFY` on it after its rows are visible, and every delivery worker
 * `LISTEN`s on it (SPEC §4.1). One channel name, one statement.
 *
 * @since 0.1.0
 */
import type * as SqlClient from "@effect/sql/SqlClient"

export const NOTIFY_CHANNEL = "firehook_outbox"

/** `SELECT pg_notify(channel, '1')`: wakes every listening worker (a fragment or a statement). */
export const notifyStatement = (sql: SqlClient.SqlClient) => sql`SELECT pg_notify(${NOTIFY_CHANNEL}, '1')`
