/**
 * Reserved connections of the pool that must not be handed out again: a connection that may still
 * hold a session advisory lock (its unlock failed or timed out) is discarded, so that the lock dies
 * with it (SPEC §6.4); and the moment a reserved connection is lost ({@link whenLost}).
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

/**
 * Completes as soon as the client of a reserved connection reports its connection gone, with what
 * it reported: an `error` event (the server ended the session, `pg_terminate_backend` or a
 * restart, or the socket failed; a failed statement is not one) or an `end`. Its listeners are
 * removed however it ends. Never completes when the client is not there (then only the caller's
 * own checks see the loss).
 */
export const whenLost = (conn: Connection): Effect.Effect<{ readonly error: unknown }> =>
  Effect.suspend(() => {
    const client: unknown = Reflect.get(conn, "pg")
    if (typeof client !== "object" || client === null) return Effect.never
    const on: unknown = Reflect.get(client, "on")
    const off: unknown = Reflect.get(client, "off")
    if (typeof on !== "function" || typeof off !== "function") return Effect.never
    const listeners: Array<readonly [string, (e?: unknown) => void]> = []
    const unsubscribe = Effect.sync(() => {
      for (const [event, listener] of listeners.splice(0)) Reflect.apply(off, client, [event, listener])
    })
    return Effect.async<{ readonly error: unknown }>((resume) => {
      let reported = false
      const done = (error: unknown) => {
        if (reported) return
        reported = true
        resume(Effect.succeed({ error }))
      }
      listeners.push(["error", (e) => done(e)], ["end", () => done({ code: "ended" })])
      for (const [event, listener] of listeners) Reflect.apply(on, client, [event, listener])
    }).pipe(Effect.ensuring(unsubscribe))
  })
