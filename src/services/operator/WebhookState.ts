/**
 * The state of an owner's registrations as owners and operators see it (SPEC §4.3, §8.5): each
 * webhook row with its delivery state (migration 0009, kept by delivery/WebhookHealthSql.ts) and
 * its delivery counts, and `resume`, which clears `gone` / `autoDisabled` (the owner's
 * `dev.firehook.webhook.resume`, the operator's `firehook webhooks resume`).
 *
 * - `resume` clears the mark, the failure streak and the parked-row count in one statement (the
 *   count restarts at `parked_since`: rows parked before it no longer give room back); a gone
 *   mark cleared is seen by the intake leader's registry through the `registry_changes` trigger
 *   (migration 0005), so the webhook is matched again. With `replay`, the rows parked while it was
 *   disabled (`dead_letter` of kind `webhook_disabled`) are replayed by the operator's replay
 *   (same ids, fresh attempt budget), after the mark is cleared (so they are sent, not parked again).
 * - Counts are bounded: each stops at {@link COUNT_CAP}; `delivered24h` / `failed24h` are rows that
 *   finished in the last 24 h as `delivered` / `dead_letter` (parked rows are not failures: no
 *   request was made).
 *
 * @since 0.1.0
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Context, Effect, Layer, Option } from "effect"
import type { WhRecord } from "../../schemas/WhRecord.js"
import { PARKED_KIND } from "../delivery/WebhookHealthSql.js"
import type { SigningMode } from "../matching/WebhookIndex.js"
import { type StoreError, storeOp } from "../platform/Persistence.js"
import { toSigningMode } from "../registry/RegistryStore.js"
import * as Operator from "./Operator.js"

/** Counts stop here. */
export const COUNT_CAP = 100_000
/** Webhook rows one owner's listing reads at most. */
export const LIST_MAX = 1_000

export interface WebhookCounts {
  readonly pending: number
  readonly deadLetters: number
  readonly delivered24h: number
  readonly failed24h: number
}

/** One registration and its delivery state. */
export interface WebhookState {
  readonly ownerDid: string
  readonly rkey: string
  readonly cid: string | undefined
  readonly record: WhRecord
  readonly url: string
  readonly events: ReadonlyArray<string>
  readonly enabled: boolean
  readonly active: boolean
  readonly signingMode: SigningMode
  readonly goneAt: Date | undefined
  readonly autoDisabledAt: Date | undefined
  readonly failingSince: Date | undefined
  /** failed attempts since the last 2xx */
  readonly failedAttempts: number
  readonly lastSuccessAt: Date | undefined
  readonly lastFailureAt: Date | undefined
  readonly lastFailureKind: string | undefined
  readonly lastFailureHttp: number | undefined
  readonly parked: number
  readonly parkedDropped: number
  readonly updatedAt: Date
  readonly counts: WebhookCounts
}

/** What `resume` did. */
export interface ResumeResult {
  /** it was gone or auto-disabled (and is no longer) */
  readonly cleared: boolean
  readonly enabled: boolean
  readonly active: boolean
  /** parked rows replayed (0 without `replay`) */
  readonly replayed: number
  /** `max` was reached and parked rows of the webhook remain (a later resume with `replay` takes them) */
  readonly truncated: boolean
  /**
   * false only if the replay stopped at its statement bound before it had taken every parked row
   * (rows kept being parked meanwhile): a later resume with `replay` takes the rest
   */
  readonly complete: boolean
}

export interface WebhookStateShape {
  /** The owner's registrations (by rkey, at most {@link LIST_MAX}). */
  readonly list: (ownerDid: string) => Effect.Effect<ReadonlyArray<WebhookState>, StoreError>
  /** Clear `gone` / `autoDisabled`; none when the owner has no webhook `rkey`. */
  readonly resume: (
    ownerDid: string,
    rkey: string,
    options?: {
      readonly replay?: boolean
      readonly by?: "owner" | "operator"
      /** replay at most this many parked rows (default: all of them) */
      readonly max?: number
    }
  ) => Effect.Effect<Option.Option<ResumeResult>, StoreError | Operator.InvalidArgument>
}

export class WebhookStateStore extends Context.Tag("firehook/WebhookState")<WebhookStateStore, WebhookStateShape>() {}

interface DbRow {
  readonly owner_did: string
  readonly rkey: string
  readonly cid: string | null
  readonly record: unknown
  readonly url: string
  readonly events: ReadonlyArray<string>
  readonly enabled: boolean
  readonly active: boolean
  readonly signing_mode: string
  readonly gone_at: Date | null
  readonly auto_disabled_at: Date | null
  readonly failing_since: Date | null
  readonly failed_attempts: number
  readonly last_success_at: Date | null
  readonly last_failure_at: Date | null
  readonly last_failure_kind: string | null
  readonly last_failure_http: number | null
  readonly parked: number
  readonly parked_dropped: number | string
  readonly updated_at: Date
  readonly pending: number
  readonly dead_letters: number
  readonly delivered_24h: number
  readonly failed_24h: number
}

const opt = <A>(a: A | null): A | undefined => (a === null ? undefined : a)
const date = (d: Date | string | null): Date | undefined => (d === null ? undefined : new Date(d))

const fromDb = (r: DbRow): WebhookState => ({
  ownerDid: r.owner_did,
  rkey: r.rkey,
  cid: opt(r.cid),
  record: (typeof r.record === "string" ? JSON.parse(r.record) : r.record) as WhRecord,
  url: r.url,
  events: r.events,
  enabled: r.enabled,
  active: r.active,
  signingMode: toSigningMode(r.signing_mode),
  goneAt: date(r.gone_at),
  autoDisabledAt: date(r.auto_disabled_at),
  failingSince: date(r.failing_since),
  failedAttempts: Number(r.failed_attempts),
  lastSuccessAt: date(r.last_success_at),
  lastFailureAt: date(r.last_failure_at),
  lastFailureKind: opt(r.last_failure_kind),
  lastFailureHttp: r.last_failure_http === null ? undefined : Number(r.last_failure_http),
  parked: Number(r.parked),
  parkedDropped: Number(r.parked_dropped),
  updatedAt: new Date(r.updated_at),
  counts: {
    pending: Number(r.pending),
    deadLetters: Number(r.dead_letters),
    delivered24h: Number(r.delivered_24h),
    failed24h: Number(r.failed_24h)
  }
})

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const operator = yield* Operator.make
  const count = (where: string) =>
    sql.literal(`(SELECT count(*) FROM (SELECT 1 FROM outbox o
      WHERE o.owner_did = w.owner_did AND o.webhook_rkey = w.rkey AND ${where} LIMIT ${COUNT_CAP}) c)::int`)

  const list = (ownerDid: string) =>
    sql<DbRow>`
      SELECT w.owner_did, w.rkey, w.cid, w.record, w.url, w.events, w.enabled, w.active, w.signing_mode, w.gone_at,
        w.auto_disabled_at, w.failing_since, w.failed_attempts, w.last_success_at, w.last_failure_at,
        w.last_failure_kind, w.last_failure_http, w.parked, w.parked_dropped, w.updated_at,
        ${count(`o.status IN ('pending', 'leased')`)} AS pending,
        ${count(`o.status = 'dead_letter'`)} AS dead_letters,
        ${count(`o.status = 'delivered' AND o.finished_at >= now() - interval '24 hours'`)} AS delivered_24h,
        ${
      count(`o.status = 'dead_letter' AND o.finished_at >= now() - interval '24 hours'
          AND o.last_error_kind IS DISTINCT FROM '${PARKED_KIND}'`)
    } AS failed_24h
      FROM webhooks w WHERE w.owner_did = ${ownerDid}
      ORDER BY w.rkey LIMIT ${LIST_MAX}`.pipe(
      Effect.map((rows) => rows.map(fromDb)),
      storeOp("webhookState.list")
    )

  const resume: WebhookStateShape["resume"] = (ownerDid, rkey, options = {}) =>
    Effect.gen(function*() {
      const rows = yield* sql<{ enabled: boolean; active: boolean; cleared: boolean }>`
        WITH prev AS (
          SELECT owner_did, rkey, (gone_at IS NOT NULL OR auto_disabled_at IS NOT NULL) AS cleared
          FROM webhooks WHERE owner_did = ${ownerDid} AND rkey = ${rkey}
          FOR UPDATE
        )
        UPDATE webhooks w SET gone_at = NULL, auto_disabled_at = NULL, failing_since = NULL, failed_attempts = 0,
          parked = 0, parked_dropped = 0, parked_since = clock_timestamp()
        FROM prev WHERE w.owner_did = prev.owner_did AND w.rkey = prev.rkey
        RETURNING w.enabled, w.active, prev.cleared`.pipe(storeOp("webhookState.resume"))
      const row = rows[0]
      if (row === undefined) return Option.none<ResumeResult>()
      const { complete, replayed, truncated } = options.replay === true
        ? yield* operator.replayDeadLetters(
          { owner: ownerDid, webhook: rkey, errorKind: PARKED_KIND },
          options.max === undefined ? undefined : { max: options.max }
        )
        : { replayed: 0, truncated: false, complete: true }
      yield* Effect.logInfo("webhook resumed").pipe(
        Effect.annotateLogs({
          ownerDid,
          rkey,
          cleared: row.cleared,
          replayed,
          truncated,
          complete,
          by: options.by ?? "owner"
        })
      )
      return Option.some<ResumeResult>({
        cleared: row.cleared,
        enabled: row.enabled,
        active: row.active,
        replayed,
        truncated,
        complete
      })
    })

  const shape: WebhookStateShape = { list, resume }
  return shape
})

/** On PostgreSQL. */
export const layerSql: Layer.Layer<WebhookStateStore, never, SqlClient.SqlClient> = Layer.effect(
  WebhookStateStore,
  make
)
