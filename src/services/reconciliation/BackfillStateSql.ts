/**
 * The PostgreSQL statements of the backfill pass state (`backfill_state`, SPEC §5.2, §6.4), the
 * part of the `ReconcileStore` port that Backfill uses to share one sweep between replicas.
 * Reached through ReconcileStoreSql.ts.
 *
 * One row per pass: the sweep's number (`sweep`), its frontier (`continuation_did`, the last DID
 * of the last page claimed), the owners of its finished pages (`owners_done`) and its claimed
 * pages (`claims`, a JSON array of {@link PageClaim}s, a few per replica at most). Every write is a
 * single `UPDATE` of that row fenced by the sweep's number, so a pass still in an older sweep
 * changes nothing; a claim is a compare-and-swap on the frontier, a take-over one on the page's
 * holder and beat.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type { Fragment } from "@effect/sql/Statement"
import { Effect, Either, Schema } from "effect"
import { StoreError, storeOp } from "../platform/Persistence.js"
import {
  doneThrough,
  type PageClaim,
  type PassState,
  type ReconcileStoreShape,
  type SweepRef
} from "./ReconcileStore.js"

interface PassDbRow {
  readonly pass: string
  readonly continuation_did: string | null
  readonly owners_done: number
  readonly pass_started_at: Date | null
  readonly pass_completed_at: Date | null
  readonly sweep: string | number
  readonly claims: unknown
}

/** One element of `claims` as stored. */
const ClaimJson = Schema.Struct({
  last: Schema.String,
  after: Schema.NullOr(Schema.String),
  dids: Schema.Array(Schema.String),
  holder: Schema.NullOr(Schema.String),
  beat: Schema.Number
})
const decodeClaims = Schema.decodeUnknownEither(Schema.Array(ClaimJson))

const toDate = (v: unknown): Date | undefined => v instanceof Date ? v : typeof v === "string" ? new Date(v) : undefined

const passFromDb = (r: PassDbRow): Either.Either<PassState, StoreError> =>
  Either.map(
    Either.mapLeft(decodeClaims(r.claims), () => new StoreError({ op: "reconcile.passState", code: "invalid_claims" })),
    (stored): PassState => {
      const claims = stored.map((c): PageClaim => ({
        last: c.last,
        after: c.after ?? undefined,
        dids: c.dids,
        holder: c.holder ?? undefined,
        beat: c.beat
      }))
      const frontier = r.continuation_did ?? undefined
      return {
        pass: r.pass,
        continuation: doneThrough(frontier, claims),
        frontier,
        ownersDone: Number(r.owners_done),
        startedAt: toDate(r.pass_started_at),
        completedAt: toDate(r.pass_completed_at),
        sweep: Number(r.sweep),
        claims
      }
    }
  )

/** The state of `pass` (undefined: never started); without `storeOp`, for callers with their own. */
export const passState = (sql: SqlClient.SqlClient, pass: string) =>
  sql<PassDbRow>`
    SELECT pass, continuation_did, owners_done, pass_started_at, pass_completed_at, sweep, claims
    FROM backfill_state WHERE pass = ${pass}`.pipe(
    Effect.flatMap((rows) => (rows[0] === undefined ? Effect.succeed(undefined) : passFromDb(rows[0])))
  )

const updated = (rows: ReadonlyArray<unknown>) => rows.length > 0

/** The claim `last` as the caller expects it (JSON containment: only the fields given are compared). */
const expected = (last: string, fields: { readonly holder: string | null; readonly beat?: number }) =>
  JSON.stringify([{ last, ...fields }])

/**
 * Replace the claim `last` of the sweep `ref` with `element` (an expression of its old value `c`),
 * only while the claim is as `fields` expect. True when done.
 */
const updateClaim = (
  sql: SqlClient.SqlClient,
  ref: SweepRef,
  last: string,
  fields: { readonly holder: string | null; readonly beat?: number },
  element: Fragment
) =>
  sql`
    UPDATE backfill_state SET
      claims = (SELECT jsonb_agg(CASE WHEN c->>'last' = ${last} THEN ${element} ELSE c END ORDER BY o)
                FROM jsonb_array_elements(claims) WITH ORDINALITY AS t(c, o)),
      updated_at = now()
    WHERE pass = ${ref.pass} AND sweep = ${ref.sweep} AND pass_completed_at IS NULL
      AND claims @> ${expected(last, fields)}::jsonb
    RETURNING pass`.pipe(Effect.map(updated))

const startPass = (sql: SqlClient.SqlClient, pass: string, seen: number) =>
  Effect.gen(function*() {
    const rows = yield* sql`
      INSERT INTO backfill_state (pass, continuation_did, owners_done, pass_started_at, pass_completed_at, sweep, claims)
      VALUES (${pass}, NULL, 0, now(), NULL, ${seen + 1}, '[]'::jsonb)
      ON CONFLICT (pass) DO UPDATE SET continuation_did = NULL, owners_done = 0, pass_started_at = now(),
        pass_completed_at = NULL, sweep = backfill_state.sweep + 1, claims = '[]'::jsonb, updated_at = now()
      WHERE backfill_state.sweep = ${seen}
        AND (backfill_state.pass_completed_at IS NOT NULL OR backfill_state.pass_started_at IS NULL)
      RETURNING pass`
    const state = yield* passState(sql, pass)
    if (state === undefined) return yield* new StoreError({ op: "reconcile.startPass", code: "no_row" })
    return { started: updated(rows), state }
  })

/** The port's pass operations on PostgreSQL. */
export const backfillState = (
  sql: SqlClient.SqlClient
): Pick<
  ReconcileStoreShape,
  | "passState"
  | "startPass"
  | "claimPage"
  | "beatClaim"
  | "takeClaim"
  | "finishPage"
  | "releaseClaim"
  | "completePass"
> => ({
  passState: (pass) => passState(sql, pass).pipe(storeOp("reconcile.passState")),

  startPass: (pass, seen) => startPass(sql, pass, seen).pipe(storeOp("reconcile.startPass")),

  claimPage: (ref, after, dids, holder) => {
    const last = dids[dids.length - 1]
    if (last === undefined) return Effect.succeed(false)
    const claim = { last, after: after ?? null, dids, holder, beat: 0 }
    // forward only, in the database's order (that of `ownersPage`), not JavaScript's: under a
    // default collation that is not bytewise (ICU, en_US) the two disagree on some did:web DIDs
    return sql`
      UPDATE backfill_state SET continuation_did = ${last}, claims = claims || ${JSON.stringify([claim])}::jsonb,
        updated_at = now()
      WHERE pass = ${ref.pass} AND sweep = ${ref.sweep} AND pass_completed_at IS NULL
        AND continuation_did IS NOT DISTINCT FROM ${after ?? null}::text
        AND (${after ?? null}::text IS NULL OR ${last}::text > ${after ?? null}::text)
      RETURNING pass`.pipe(Effect.map(updated), storeOp("reconcile.claimPage"))
  },

  beatClaim: (ref, last, holder) =>
    updateClaim(sql, ref, last, { holder }, sql`jsonb_set(c, '{beat}', to_jsonb((c->>'beat')::bigint + 1))`).pipe(
      storeOp("reconcile.beatClaim")
    ),

  takeClaim: (ref, seen, holder) =>
    updateClaim(
      sql,
      ref,
      seen.last,
      { holder: seen.holder ?? null, beat: seen.beat },
      sql`c || jsonb_build_object('holder', ${holder}::text, 'beat', (c->>'beat')::bigint + 1)`
    ).pipe(storeOp("reconcile.takeClaim")),

  releaseClaim: (ref, last, holder) =>
    updateClaim(sql, ref, last, { holder }, sql`c || jsonb_build_object('holder', NULL)`).pipe(
      storeOp("reconcile.releaseClaim")
    ),

  finishPage: (ref, last, holder) =>
    sql`
      UPDATE backfill_state SET
        owners_done = owners_done + COALESCE(
          (SELECT jsonb_array_length(c->'dids') FROM jsonb_array_elements(claims) AS c
           WHERE c->>'last' = ${last} LIMIT 1), 0),
        claims = COALESCE(
          (SELECT jsonb_agg(c ORDER BY o) FROM jsonb_array_elements(claims) WITH ORDINALITY AS t(c, o)
           WHERE c->>'last' <> ${last}), '[]'::jsonb),
        updated_at = now()
      WHERE pass = ${ref.pass} AND sweep = ${ref.sweep} AND pass_completed_at IS NULL
        AND claims @> ${expected(last, { holder })}::jsonb
      RETURNING pass`.pipe(Effect.map(updated), storeOp("reconcile.finishPage")),

  completePass: (ref, frontier) =>
    sql`
      UPDATE backfill_state SET continuation_did = NULL, pass_completed_at = now(), updated_at = now()
      WHERE pass = ${ref.pass} AND sweep = ${ref.sweep} AND pass_completed_at IS NULL
        AND claims = '[]'::jsonb AND continuation_did IS NOT DISTINCT FROM ${frontier ?? null}::text
      RETURNING pass`.pipe(Effect.map(updated), storeOp("reconcile.completePass"))
})
