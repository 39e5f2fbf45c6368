/**
 * Reserved connections of the pool that must not be handed out again: a connection that may still
 * hold a session advisory lock (its unlock failed or timed out) is discarded, so that the lock dies
 * with it (SPEC §6.4).
 *
 * @since 0.1.0
 */
import type { Connection } from "@effect/sql/SqlConnection"
import { Effect } from "effect"

/**
 * Ends the client of a reserved connection, so that the pool drops it on release instead of
 * handing it out again (pg-pool removes a client that is ending). `@effect/sql-pg`'s Connection
 * does not expose its client but keeps it as `pg`; when it is not there, nothing happens.
 */
export const endClient = (conn: Connection): Effect.Effect<void> =>
  Effect.sync(() => {
    const client: unknown = Reflect.get(conn, "pg")
    if (typeof client !== "object" || client === null) return
    const end: unknown = Reflect.get(client, "end")
    if (typeof end !== "function") return
    // a client with a query running is ended by destroying its socket (pg's Client.end)
    const ended: unknown = Reflect.apply(end, client, [])
    if (ended instanceof Promise) ended.catch(() => undefined)
  })
