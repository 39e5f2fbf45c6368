/**
 * The PostgreSQL statements of the backfill pass state (`backfill_state`, SPEC §5.2, §6.4), the
 * part of the `ReconcileStore` port that Backfill uses to share one sweep between replicas.
 * Reached through ReconcileStoreSql.ts.
 */
import type { SqlClient } from "@effect/sql"
import { Effect } from "effect"
import { storeOp } from "../platform/Persistence.js"
import type { PassState, ReconcileStoreShape } from "./ReconcileStore.js"

interface PassDbRow {
  readonly pass: string
  readonly continuation_did: string | null
  readonly owners_done: number
  readonly pass_started_at: Date | null
  readonly pass_completed_at: Date | null
}

const toDate = (v: unknown): Date | undefined => v instanceof Date ? v : typeof v === "string" ? new Date(v) : undefined

const passFromDb = (r: PassDbRow): PassState => ({
  pass: r.pass,
  continuation: r.continuation_did ?? undefined,
  ownersDone: Number(r.owners_done),
  startedAt: toDate(r.pass_started_at),
  completedAt: toDate(r.pass_completed_at)
})

/** The state of `pass` (undefined: never started); the raw statement, for callers with their own `storeOp`. */
export const passState = (sql: SqlClient.SqlClient, pass: string) =>
  sql<PassDbRow>`
    SELECT pass, continuation_did, owners_done, pass_started_at, pass_completed_at
    FROM backfill_state WHERE pass = ${pass}`.pipe(
    Effect.map((rows) => (rows[0] === undefined ? undefined : passFromDb(rows[0])))
  )

/** The port's pass operations on PostgreSQL. */
export const backfillState = (
  sql: SqlClient.SqlClient
): Pick<ReconcileStoreShape, "passState" | "startPass" | "savePass" | "completePass"> => ({
  passState: (pass) => passState(sql, pass).pipe(storeOp("reconcile.passState")),

  startPass: (pass) =>
    sql`
      INSERT INTO backfill_state (pass, continuation_did, owners_done, pass_started_at, pass_completed_at)
      VALUES (${pass}, NULL, 0, now(), NULL)
      ON CONFLICT (pass) DO UPDATE SET continuation_did = NULL, owners_done = 0, pass_started_at = now(),
        pass_completed_at = NULL, updated_at = now()`.pipe(Effect.asVoid, storeOp("reconcile.startPass")),

  savePass: (pass, continuation, ownersDone) =>
    sql`
      UPDATE backfill_state SET continuation_did = ${continuation}, owners_done = ${ownersDone}, updated_at = now()
      WHERE pass = ${pass} AND pass_completed_at IS NULL
        AND (continuation_did IS NULL OR continuation_did < ${continuation})`.pipe(
      Effect.asVoid,
      storeOp("reconcile.savePass")
    ),

  completePass: (pass, ownersDone) =>
    sql`
      UPDATE backfill_state SET continuation_did = NULL, owners_done = ${ownersDone}, pass_completed_at = now(),
        updated_at = now()
      WHERE pass = ${pass}`.pipe(Effect.asVoid, storeOp("reconcile.completePass"))
})
