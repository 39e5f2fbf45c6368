/**
 * The registry's change feed across processes (SPEC §6.4): which owners' registrations another
 * process changed, for the intake leader's in-memory registry to follow (RegistrySync.ts).
 *
 * Written by the database itself (migration 0005): a trigger on `owners` (a reconciliation marked
 * `complete`) and one on `webhooks` (`gone_at` set by a 410, or cleared) upsert the owner's row of
 * `registry_changes` with the writing transaction's id, and `pg_notify('firehook_registry', did)`,
 * in the writer's own transaction: every writer (a reconcile process, a delivery process, the CLI,
 * an operator action of a later version) is covered without calling anything, and the change and
 * its record commit or roll back together.
 *
 * Read by the follower: notifications (a hint, delivered at commit; missed while the LISTEN
 * connection is down) and a catch-up read from a transaction-id horizon. The horizon of a read is
 * the xmin of its snapshot: every transaction below it had ended when the read ran, so its changes
 * were visible to that read; a change the read did not see has a transaction id at or above it and
 * is seen by the next read from that horizon. Only writing transactions hold a horizon back
 * (read-only ones have no transaction id); firehook's are short, but transactions outside firehook
 * can hold it back (RegistrySync then pages through the changes since instead of reloading).
 *
 * The SQL driver only: the feed exists between processes that share PostgreSQL.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { Context, Effect, Layer, Stream } from "effect"
import { codeOf, StoreError, storeOp, Tx } from "../platform/Persistence.js"

/** The channel the triggers notify on (payload: the owner DID). */
export const CHANNEL = "firehook_registry"

/** One owner's latest change: the transaction that wrote it (`xid8`, as text). */
export interface Change {
  readonly did: string
  readonly xid: string
}

export interface ChangesPage {
  /** the horizon of this read: the next read starts there */
  readonly horizon: string
  /** changes of transactions at or above the horizon asked for, oldest transaction first */
  readonly changes: ReadonlyArray<Change>
  /** there were more than the limit (the caller reloads everything instead) */
  readonly more: boolean
}

export interface RegistryChangesShape {
  /** the horizon now (take it before loading the registry, then read changes from it) */
  readonly horizon: Effect.Effect<string, StoreError>
  /** the changes of transactions at or above `horizon`, at most `limit` */
  readonly since: (horizon: string, limit: number) => Effect.Effect<ChangesPage, StoreError>
  /** owner DIDs as their changes commit (a bounded buffer; a hint, the catch-up is the guarantee) */
  readonly notifications: Stream.Stream<string, StoreError>
  /**
   * Run `eff` in a transaction holding the owner's row lock (`FOR UPDATE`): no live write of the
   * owner, no reconciliation step of it, interleaves (the lock every writer of the owner takes).
   */
  readonly withOwnerLock: <A, E, R>(did: string, eff: Effect.Effect<A, E, R>) => Effect.Effect<A, E | StoreError, R>
}

export class RegistryChanges extends Context.Tag("firehook/RegistryChanges")<RegistryChanges, RegistryChangesShape>() {}

export const layerSql: Layer.Layer<RegistryChanges, never, SqlClient.SqlClient | PgClient.PgClient | Tx> = Layer.effect(
  RegistryChanges,
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const pg = yield* PgClient.PgClient
    const tx = yield* Tx
    const shape: RegistryChangesShape = {
      horizon: sql<{ horizon: string }>`SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS horizon`.pipe(
        Effect.flatMap((rows) => {
          const h = rows[0]?.horizon
          return h === undefined
            ? Effect.fail(new StoreError({ op: "registryChanges.horizon", code: "empty" }))
            : Effect.succeed(h)
        }),
        storeOp("registryChanges.horizon")
      ),
      since: (horizon, limit) =>
        sql<{ horizon: string; owner_did: string | null; xid: string | null }>`
          WITH h AS (SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS horizon)
          SELECT h.horizon, c.owner_did, c.xid FROM h
          LEFT JOIN LATERAL (
            SELECT owner_did, xid::text AS xid FROM registry_changes
            WHERE xid >= ${horizon}::xid8 ORDER BY xid, owner_did LIMIT ${limit + 1}
          ) c ON true`.pipe(
          Effect.flatMap((rows) => {
            const h = rows[0]?.horizon
            if (h === undefined) return Effect.fail(new StoreError({ op: "registryChanges.since", code: "empty" }))
            const changes: Array<Change> = []
            for (const r of rows) {
              if (r.owner_did !== null && r.xid !== null) changes.push({ did: r.owner_did, xid: r.xid })
            }
            return Effect.succeed({ horizon: h, changes: changes.slice(0, limit), more: changes.length > limit })
          }),
          storeOp("registryChanges.since")
        ),
      notifications: pg.listen(CHANNEL).pipe(
        Stream.mapError((e) => new StoreError({ op: "registryChanges.listen", code: codeOf(e) }))
      ),
      withOwnerLock: (did, eff) =>
        tx.withTransaction(
          Effect.zipRight(
            sql`SELECT 1 FROM owners WHERE did = ${did} FOR UPDATE`.pipe(storeOp("registryChanges.lock")),
            eff
          )
        )
    }
    return shape
  })
)
