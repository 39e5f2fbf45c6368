/**
 * Operator actions on deliveries (SPEC §4.8): list, show with attempts, redeliver one, replay dead
 * letters, and a status summary. Used by the CLI (`src/cli.ts`) and by embedding programs.
 *
 * - Time filters (`since` inclusive, `until` exclusive) apply to the delivery's `created_at`, the
 *   moment the event was enqueued: "replay what was enqueued while the receiver was down".
 * - `redeliver` and `replay` keep the delivery id (receivers dedupe on `webhook-id` /
 *   `Idempotency-Key`), give the row a fresh attempt budget (`attempt_count = 0`), make it due now,
 *   clear the lease, the last error and `finished_at`, and wake the workers with one NOTIFY.
 * - `redeliver` never touches a row whose lease is still valid (a worker is attempting it right
 *   now). A `leased` row whose lease has EXPIRED was left by a worker that stopped (or stalled): the
 *   reaper would reclaim it anyway, so it is redelivered like any other row (clearing the lease
 *   token also fences the old holder: its renewals and settles no longer match). The result says
 *   what the row was (`pending`, `cancelled`, an expired lease …).
 * - `replay` takes the dead letters as of the moment it starts (rows last updated before then) and
 *   pages through them by `(created_at, delivery_id)`, a key that only moves forward, at most 1,000
 *   rows per statement (each statement its own transaction). A row replayed and dead-lettered again
 *   while the replay runs is therefore never replayed (or counted) twice, and the number of
 *   statements is bounded by the number of dead letters counted at the start.
 * - Replay and redeliver report how many of the rows belong to a subscription that is no longer
 *   active as enqueued (missing, inactive, disabled, gone, auto-disabled, or another URL /
 *   fingerprint): the worker cancels those (SPEC §4.2), or parks them again while the webhook is
 *   auto-disabled or gone (§4.3), without a request. They are replayed all the same.
 * - `show` returns the newest 1,000 attempts (in attempt order) and how many older ones it left out.
 * - Owner-limited variants (the owners' API, SPEC §8.5) are the same statements with
 *   `owner_did = <caller>` added: `show` / `redeliver` with `{owner}` treat another owner's id
 *   exactly as an unknown one; `listPage` pages newest first by `(created_at, delivery_id)`;
 *   `replayDeadLetters` with `{max}` stops after that many rows and says whether more were left.
 * - `status` is counts only (no DIDs, URLs or errors).
 *
 * Rows carry the target URL because operators own the database; the CLI hides it unless asked.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Fragment } from "@effect/sql/Statement"
import { Context, Data, Effect, Layer, Option, Ref } from "effect"
import { PARKED_KIND } from "../delivery/WebhookHealthSql.js"
import type { OutboxRow } from "../matching/Outbox.js"
import { notifyStatement } from "../matching/OutboxNotify.js"
import { type StoreError, storeOp } from "../platform/Persistence.js"
import { KEY_TEXT_FORMAT, normalizeKeyTime } from "./ListKey.js"
import { checkFilter, filterConditions, type TimeRange } from "./OperatorFilter.js"
import { type AttemptDbRow, opt, optDate, type OutboxDbRow, toAttempt, toDelivery } from "./OperatorRows.js"
import { unparkCtes } from "./ParkedRoom.js"

export {
  DELIVERY_STATUSES,
  type DeliveryStatus,
  TERMINAL_STATUSES,
  type TerminalStatus
} from "../matching/OutboxStatus.js"
import { DELIVERY_STATUSES, type DeliveryStatus } from "../matching/OutboxStatus.js"

export const RECONCILE_STATUSES = ["unknown", "scanning", "complete", "failed"] as const
export type ReconcileStatus = (typeof RECONCILE_STATUSES)[number]

export const isDeliveryStatus = (s: string): s is DeliveryStatus =>
  (DELIVERY_STATUSES as ReadonlyArray<string>).includes(s)

/** Default and hard maximum of `listDeliveries`. */
export const DEFAULT_LIST_LIMIT = 100
export const MAX_LIST_LIMIT = 1_000
/** Rows per replay statement. */
export const REPLAY_BATCH = 1_000
/** Attempts shown by `showDelivery` at most (the newest). */
export const MAX_ATTEMPTS_SHOWN = 1_000

/** An operator argument broke a rule. Names the field and the rule, never the value. */
export class InvalidArgument extends Data.TaggedError("InvalidArgument")<{
  readonly field: string
  readonly rule: string
}> {
  override get message(): string {
    return `invalid ${this.field}: ${this.rule}`
  }
}

export interface ListFilter extends ReplayFilter {
  readonly status?: DeliveryStatus
  /** 1..1,000, default 100 */
  readonly limit?: number
  /** only rows strictly older than this key (the `next` of the previous page) */
  readonly before?: ListKey
}

/**
 * The position of a row in the newest-first order: its `created_at` as UTC text with full
 * microsecond precision (`ListKey.ts`: written with an explicit format, whatever the session's
 * `DateStyle`; read back with `::timestamptz`) and its delivery id.
 */
export interface ListKey {
  readonly createdAt: string
  readonly deliveryId: string
}

/** One page of {@link OperatorShape.listPage}: `next` is set when older rows remain. */
export interface DeliveryPage {
  readonly deliveries: ReadonlyArray<Delivery>
  readonly next: ListKey | undefined
}

/** Limits the read or action to one owner's rows (another owner's id is then unknown). */
export interface OwnerScope {
  readonly owner?: string
}

export interface ShowOptions extends OwnerScope {
  /** attempts shown at most (1..{@link MAX_ATTEMPTS_SHOWN}; default {@link MAX_ATTEMPTS_SHOWN}) */
  readonly maxAttempts?: number
}

export interface ReplayOptions {
  /** dead letters replayed at most by this call (default: all, within the statement bound) */
  readonly max?: number
  /** rows replayed so far, added to as each statement returns (an interrupted call has replayed at least that many) */
  readonly progress?: Ref.Ref<number>
}

/**
 * The rows of `listDeliveries` and `replayDeadLetters` (`since` inclusive, `until` exclusive: the
 * enqueue time, `created_at`, kept to the microsecond). A bound is a Date (millisecond precision)
 * or an RFC 3339 text (a lexicon `datetime`, e.g. `2026-03-01T10:00:00.000500Z`), applied to the
 * microsecond (a finer fraction is rounded up); either in years 0000–9999 (UTC), else
 * `InvalidArgument`. A bound before 0001-01-01 (PostgreSQL has no year 0) is applied as
 * 0001-01-01T00:00:00Z.
 */
export interface ReplayFilter {
  /** owner DID */
  readonly owner?: string
  /** webhook record key (with or without `owner`) */
  readonly webhook?: string
  /** only rows of this `last_error_kind` (resume's replay: `webhook_disabled`) */
  readonly errorKind?: string
  readonly since?: Date | string
  readonly until?: Date | string
}

/** An outbox row as operators see it: the enqueued fields plus its delivery state. */
export interface Delivery extends Omit<OutboxRow, "fingerprint"> {
  readonly status: DeliveryStatus
  readonly attemptCount: number
  readonly nextAttemptAt: Date
  readonly leasedUntil: Date | undefined
  readonly lastErrorKind: string | undefined
  readonly lastHttpStatus: number | undefined
  readonly createdAt: Date
  readonly updatedAt: Date
  readonly finishedAt: Date | undefined
}

export interface Attempt {
  readonly attempt: number
  readonly startedAt: Date
  readonly durationMs: number
  readonly outcome: string
  readonly errorKind: string | undefined
  readonly httpStatus: number | undefined
  readonly responseExcerpt: string | undefined
}

export interface DeliveryDetail {
  readonly delivery: Delivery
  /** the newest {@link MAX_ATTEMPTS_SHOWN} attempts, in attempt order */
  readonly attempts: ReadonlyArray<Attempt>
  /** attempts older than those in `attempts`, left out */
  readonly olderAttemptsNotShown: number
  /** the stored payload body, while it is retained (SPEC §4.9 prunes unreferenced bodies) */
  readonly body: string | undefined
}

/** The outcome of `redeliver`. */
export type RedeliverResult =
  | {
    readonly _tag: "Redelivered"
    /** the status the row had (`leased` only when its lease had expired) */
    readonly previousStatus: DeliveryStatus
    /** the row was `leased` by a worker whose lease had expired (a stopped or stalled worker) */
    readonly leaseExpired: boolean
    /** its subscription is no longer active as enqueued: the worker will cancel it without a request */
    readonly subscriptionInactive: boolean
  }
  /** a worker holds a valid lease on it right now: untouched */
  | { readonly _tag: "Leased"; readonly leasedUntil: Date | undefined }
  | { readonly _tag: "Missing" }

/** The outcome of `replayDeadLetters`. */
export interface ReplayResult {
  /** distinct dead letters made pending */
  readonly replayed: number
  /** of those, rows whose subscription is no longer active as enqueued (cancelled without a request) */
  readonly inactiveSubscription: number
  /** false only if the statement bound was reached before the key range was exhausted */
  readonly complete: boolean
  /** `max` was reached and dead letters of the filter remain (a later call replays them) */
  readonly truncated: boolean
}

export interface OperatorOptions {
  /** rows per replay statement (1..{@link REPLAY_BATCH}; default {@link REPLAY_BATCH}) */
  readonly replayBatchSize?: number
}

export interface StatusSummary {
  readonly deliveries: { readonly [S in DeliveryStatus]: number } & { readonly due: number }
  readonly webhooks: { readonly active: number; readonly total: number; readonly gone: number }
  /**
   * webhooks auto-disabled by their failure streak (SPEC §4.3): they keep `active` (their record is
   * valid and enabled), so `webhooks.active` counts them, but nothing is sent to them until resumed
   */
  readonly autoDisabledWebhooks: number
  readonly owners: { readonly [S in ReconcileStatus]: number }
  readonly quarantine: number
  readonly secrets: number
}

export interface OperatorShape {
  readonly listDeliveries: (filter: ListFilter) => Effect.Effect<ReadonlyArray<Delivery>, InvalidArgument | StoreError>
  /** {@link listDeliveries} with the key of the next page. */
  readonly listPage: (filter: ListFilter) => Effect.Effect<DeliveryPage, InvalidArgument | StoreError>
  readonly showDelivery: (
    deliveryId: string,
    options?: ShowOptions
  ) => Effect.Effect<Option.Option<DeliveryDetail>, StoreError>
  readonly redeliver: (deliveryId: string, options?: OwnerScope) => Effect.Effect<RedeliverResult, StoreError>
  /** Dead letters made pending (each counted once). */
  readonly replayDeadLetters: (
    filter: ReplayFilter,
    options?: ReplayOptions
  ) => Effect.Effect<ReplayResult, InvalidArgument | StoreError>
  readonly status: Effect.Effect<StatusSummary, StoreError>
}

export class Operator extends Context.Tag("firehook/Operator")<Operator, OperatorShape>() {}

// ---------------------------------------------------------------------------------------------

interface ReplayBatchRow {
  readonly selected: number
  readonly replayed: number
  readonly inactive: number
  readonly last_created: string | null
  readonly last_id: string | null
}

/** `column` as list-key text (`ListKey.ts`), the same under every `DateStyle` and `TimeZone`. */
const keyText = (sql: SqlClient.SqlClient, column: "created_at" | "now()"): Fragment =>
  sql`to_char(${sql.literal(column)} AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT})`

/**
 * The condition of a page after `key` (rows strictly older), none without one. An untrusted key (a
 * client's cursor) never reaches the cast unless its time is a real one (`ListKey.ts`).
 */
const olderThan = (
  sql: SqlClient.SqlClient,
  key: ListKey | undefined
): Effect.Effect<ReadonlyArray<Fragment>, InvalidArgument> => {
  if (key === undefined) return Effect.succeed([])
  const at = normalizeKeyTime(key.createdAt)
  return at === undefined
    ? Effect.fail(new InvalidArgument({ field: "before", rule: "must be a list key" }))
    : Effect.succeed([sql`(created_at, delivery_id) < (${at}::timestamptz, ${key.deliveryId})`])
}

/** Statements per replay at most, given the dead letters counted at its start. */
const replayStatementBound = (counted: number, batch: number): number => Math.ceil(counted / batch) + 1

/**
 * One replay statement: the next `take` rows matching `where` in key order, locked (FOR UPDATE, not
 * SKIP LOCKED: a row that maintenance is pruning right now is waited for and then re-checked),
 * reset with `reset`, counted, and the key of the last one. Parked rows give their parking room
 * back ({@link unparkCtes}).
 */
const replayBatchStatement = (
  sql: SqlClient.SqlClient,
  where: ReadonlyArray<Fragment>,
  take: number,
  reset: Fragment,
  inactive: Fragment
) =>
  sql<ReplayBatchRow>`
  WITH batch AS (
    SELECT delivery_id, created_at, last_error_kind, finished_at FROM outbox WHERE ${sql.and(where)}
    ORDER BY created_at, delivery_id
    LIMIT ${take}
    FOR UPDATE
  ),
  upd AS (
    UPDATE outbox o SET ${reset}
    FROM batch WHERE o.delivery_id = batch.delivery_id AND o.status = 'dead_letter'
    RETURNING ${inactive} AS inactive, o.owner_did, o.webhook_rkey, o.fingerprint, batch.finished_at,
      (batch.last_error_kind IS NOT DISTINCT FROM ${PARKED_KIND}) AS was_parked
  ),
  ${unparkCtes(sql, "upd")},
  tail AS (
    SELECT ${keyText(sql, "created_at")} AS last_created, delivery_id AS last_id FROM batch
    ORDER BY created_at DESC, delivery_id DESC LIMIT 1
  )
  SELECT (SELECT count(*) FROM batch)::int AS selected,
         (SELECT count(*) FROM upd)::int AS replayed,
         (SELECT count(*) FROM upd WHERE inactive)::int AS inactive,
         (SELECT last_created FROM tail) AS last_created,
         (SELECT last_id FROM tail) AS last_id`

/** The counts of `status` (counts only: no DIDs, URLs or errors). */
const statusOf = (sql: SqlClient.SqlClient): Effect.Effect<StatusSummary, StoreError> =>
  Effect.gen(function*() {
    const byStatus = yield* sql<{ status: DeliveryStatus; n: number }>`
    SELECT status, count(*)::float8 AS n FROM outbox GROUP BY status`
    const due = yield* sql<{ n: number }>`
    SELECT count(*)::float8 AS n FROM outbox WHERE status = 'pending' AND next_attempt_at <= now()`
    const webhooks = yield* sql<{ active: number; total: number; gone: number; auto_disabled: number }>`
    SELECT count(*) FILTER (WHERE active)::float8 AS active, count(*)::float8 AS total,
           count(*) FILTER (WHERE gone_at IS NOT NULL)::float8 AS gone,
           count(*) FILTER (WHERE auto_disabled_at IS NOT NULL)::float8 AS auto_disabled
    FROM webhooks`
    const owners = yield* sql<{ reconcile_status: ReconcileStatus; n: number }>`
    SELECT reconcile_status, count(*)::float8 AS n FROM owners GROUP BY reconcile_status`
    const quarantine = yield* sql<{ n: number }>`SELECT count(*)::float8 AS n FROM quarantine`
    const secrets = yield* sql<{ n: number }>`SELECT count(*)::float8 AS n FROM secrets`
    const deliveries = { pending: 0, leased: 0, delivered: 0, dead_letter: 0, cancelled: 0, due: due[0]?.n ?? 0 }
    for (const r of byStatus) if (isDeliveryStatus(r.status)) deliveries[r.status] = r.n
    const ownerCounts = { unknown: 0, scanning: 0, complete: 0, failed: 0 }
    for (const r of owners) {
      if ((RECONCILE_STATUSES as ReadonlyArray<string>).includes(r.reconcile_status)) {
        ownerCounts[r.reconcile_status] = r.n
      }
    }
    const summary: StatusSummary = {
      deliveries,
      webhooks: { active: webhooks[0]?.active ?? 0, total: webhooks[0]?.total ?? 0, gone: webhooks[0]?.gone ?? 0 },
      autoDisabledWebhooks: webhooks[0]?.auto_disabled ?? 0,
      owners: ownerCounts,
      quarantine: quarantine[0]?.n ?? 0,
      secrets: secrets[0]?.n ?? 0
    }
    return summary
  }).pipe(storeOp("operator.status"), Effect.withSpan("Operator.status"))

export const makeWith = (options: OperatorOptions = {}) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const replayBatch = Math.min(REPLAY_BATCH, Math.max(1, Math.floor(options.replayBatchSize ?? REPLAY_BATCH)))

    const conditions = (f: ReplayFilter & { readonly status?: DeliveryStatus }, range: TimeRange) =>
      filterConditions(sql, f, range)

    const notify = notifyStatement(sql)

    /**
     * True when the outbox row `o` no longer matches its subscription as enqueued, or its webhook is
     * gone or auto-disabled: the worker cancels it (`subscription_changed`) or parks it again
     * (`webhook_disabled`) without a request. The same tests as the worker's (SPEC §4.2, §4.3).
     */
    const inactiveSubscription = sql`NOT EXISTS (
    SELECT 1 FROM webhooks w
    WHERE w.owner_did = o.owner_did AND w.rkey = o.webhook_rkey
      AND w.active AND w.enabled AND w.gone_at IS NULL AND w.auto_disabled_at IS NULL
      AND w.url = o.target_url AND w.fingerprint = o.fingerprint)`

    const listPage = Effect.fn("Operator.listPage")(function*(filter: ListFilter) {
      const range = yield* checkFilter(filter)
      const limit = filter.limit ?? DEFAULT_LIST_LIMIT
      if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_LIST_LIMIT) {
        return yield* Effect.fail(
          new InvalidArgument({ field: "limit", rule: `must be an integer in 1..${MAX_LIST_LIMIT}` })
        )
      }
      const where = sql.and([...conditions(filter, range), ...yield* olderThan(sql, filter.before)])
      // one row more than asked: whether an older page exists
      const rows = yield* sql<OutboxDbRow & { readonly created_key: string }>`
      SELECT *, ${keyText(sql, "created_at")} AS created_key FROM outbox WHERE ${where}
      ORDER BY created_at DESC, delivery_id DESC
      LIMIT ${limit + 1}`.pipe(storeOp("operator.listDeliveries"))
      const page = rows.slice(0, limit)
      const last = page[page.length - 1]
      const out: DeliveryPage = {
        deliveries: page.map(toDelivery),
        next: rows.length > limit && last !== undefined
          ? { createdAt: last.created_key, deliveryId: last.delivery_id }
          : undefined
      }
      return out
    })

    const listDeliveries = (filter: ListFilter) =>
      Effect.map(listPage(filter), (page) => page.deliveries).pipe(Effect.withSpan("Operator.listDeliveries"))

    const ownedBy = (scope: OwnerScope | undefined): Fragment =>
      scope?.owner === undefined ? sql`TRUE` : sql`owner_did = ${scope.owner}`

    const showDelivery = Effect.fn("Operator.showDelivery")(function*(deliveryId: string, options?: ShowOptions) {
      const shown = Math.min(MAX_ATTEMPTS_SHOWN, Math.max(1, Math.floor(options?.maxAttempts ?? MAX_ATTEMPTS_SHOWN)))
      const rows = yield* sql<OutboxDbRow & { readonly event_body: string | null }>`
      SELECT o.*, e.body AS event_body FROM outbox o LEFT JOIN delivery_events e ON e.event_id = o.event_id
      WHERE o.delivery_id = ${deliveryId} AND ${ownedBy(options)}`.pipe(
        storeOp("operator.showDelivery")
      )
      const row = rows[0]
      if (row === undefined) return Option.none<DeliveryDetail>()
      // the newest attempts (the ones an operator is looking for), shown in attempt order
      const attempts = yield* sql<AttemptDbRow>`
      SELECT * FROM (
        SELECT attempt, started_at, duration_ms, outcome, error_kind, http_status, response_excerpt
        FROM delivery_attempts WHERE delivery_id = ${deliveryId}
        ORDER BY attempt DESC, started_at DESC
        LIMIT ${shown}
      ) newest
      ORDER BY attempt, started_at`.pipe(storeOp("operator.showDelivery"))
      let older = 0
      if (attempts.length >= shown) {
        const total = yield* sql<{ n: number }>`
        SELECT count(*)::float8 AS n FROM delivery_attempts WHERE delivery_id = ${deliveryId}`.pipe(
          storeOp("operator.showDelivery")
        )
        older = Math.max(0, (total[0]?.n ?? 0) - attempts.length)
      }
      return Option.some<DeliveryDetail>({
        delivery: toDelivery(row),
        attempts: attempts.map(toAttempt),
        olderAttemptsNotShown: older,
        body: opt(row.event_body)
      })
    })

    const RESET = sql`
    status = 'pending', attempt_count = 0, next_attempt_at = now(), lease_token = NULL, leased_until = NULL,
    last_error_kind = NULL, last_http_status = NULL, finished_at = NULL, updated_at = now()`

    /** One try: the row reset (unless a worker holds a valid lease), with what it was. */
    const redeliverOnce = (deliveryId: string, scope: OwnerScope | undefined) =>
      sql
        .withTransaction(
          Effect.gen(function*() {
            // FOR UPDATE waits for a worker that is claiming or settling the row, then re-checks it
            const changed = yield* sql<{ previous_status: DeliveryStatus; inactive: boolean }>`
            WITH prev AS (
              SELECT delivery_id, status, last_error_kind, finished_at FROM outbox
              WHERE delivery_id = ${deliveryId} AND ${ownedBy(scope)}
                AND (status <> 'leased' OR leased_until IS NULL OR leased_until < now())
              FOR UPDATE
            ),
            upd AS (
              UPDATE outbox o SET ${RESET}
              FROM prev WHERE o.delivery_id = prev.delivery_id
              RETURNING prev.status AS previous_status, ${inactiveSubscription} AS inactive,
                o.owner_did, o.webhook_rkey, o.fingerprint, prev.finished_at,
                (prev.status = 'dead_letter' AND prev.last_error_kind IS NOT DISTINCT FROM ${PARKED_KIND}) AS was_parked
            ),
            ${unparkCtes(sql, "upd")}
            SELECT previous_status, inactive FROM upd`
            const row = changed[0]
            if (row === undefined) {
              const current = yield* sql<{ status: DeliveryStatus; leased_until: Date | null }>`
              SELECT status, leased_until FROM outbox WHERE delivery_id = ${deliveryId} AND ${ownedBy(scope)}`
              const c = current[0]
              if (c === undefined) return Option.some<RedeliverResult>({ _tag: "Missing" })
              if (c.status === "leased") {
                return Option.some<RedeliverResult>({ _tag: "Leased", leasedUntil: optDate(c.leased_until) })
              }
              return Option.none<RedeliverResult>() // settled meanwhile: try again
            }
            yield* notify
            return Option.some<RedeliverResult>({
              _tag: "Redelivered",
              previousStatus: row.previous_status,
              leaseExpired: row.previous_status === "leased",
              subscriptionInactive: row.inactive
            })
          })
        )
        .pipe(storeOp("operator.redeliver"))

    const redeliver = Effect.fn("Operator.redeliver")(function*(deliveryId: string, scope?: OwnerScope) {
      // a row that stopped being validly leased between the update and the read is tried again, 3 times at most
      for (let i = 0; i < 3; i++) {
        const result = yield* redeliverOnce(deliveryId, scope)
        if (Option.isSome(result)) return result.value
      }
      return { _tag: "Leased", leasedUntil: undefined } satisfies RedeliverResult as RedeliverResult
    })

    const replayDeadLetters = Effect.fn("Operator.replayDeadLetters")(function*(
      filter: ReplayFilter,
      options?: ReplayOptions
    ) {
      const range = yield* checkFilter(filter)
      const max = options?.max === undefined ? Infinity : Math.max(1, Math.floor(options.max))
      // the snapshot: dead letters as of now (a row dead-lettered, or replayed and dead-lettered again,
      // after this moment has updated_at > started and is left alone)
      const start = yield* sql<{ started: string; n: number }>`
      SELECT ${keyText(sql, "now()")} AS started, count(*)::float8 AS n FROM outbox
      WHERE ${sql.and([sql`status = 'dead_letter'`, sql`updated_at <= now()`, ...conditions(filter, range)])}`.pipe(
        storeOp("operator.replayDeadLetters")
      )
      const started = start[0]?.started
      const counted = start[0]?.n ?? 0
      if (started === undefined || counted === 0) {
        return { replayed: 0, inactiveSubscription: 0, complete: true, truncated: false }
      }
      const base = [
        sql`status = 'dead_letter'`,
        sql`updated_at <= ${started}::timestamptz`,
        ...conditions(filter, range)
      ]
      const bound = replayStatementBound(counted, replayBatch)
      let replayed = 0
      let inactive = 0
      let complete = false
      let truncated = false
      let selected = 0
      let last: { readonly createdAt: string; readonly deliveryId: string } | undefined = undefined
      const afterKey = (key: typeof last): ReadonlyArray<Fragment> =>
        key === undefined ? [] : [sql`(created_at, delivery_id) > (${key.createdAt}::timestamptz, ${key.deliveryId})`]
      for (let i = 0; i < bound; i++) {
        const after = afterKey(last)
        const take = Math.min(replayBatch, max - selected)
        // the key (created_at, delivery_id) only moves forward
        const result: ReadonlyArray<ReplayBatchRow> = yield* replayBatchStatement(
          sql,
          [...base, ...after],
          take,
          RESET,
          inactiveSubscription
        ).pipe(
          storeOp("operator.replayDeadLetters"),
          Effect.tap((rows) =>
            options?.progress ? Ref.update(options.progress, (n) => n + (rows[0]?.replayed ?? 0)) : Effect.void
          )
        )
        const r: ReplayBatchRow | undefined = result[0]
        if (r === undefined) break
        replayed += r.replayed
        inactive += r.inactive
        selected += r.selected
        if (r.selected < take || r.last_created === null || r.last_id === null) {
          complete = true
          break
        }
        last = { createdAt: r.last_created, deliveryId: r.last_id }
        if (selected >= max) {
          // the call's bound: whether dead letters of the filter remain after the last one taken
          const more = yield* sql<{ more: boolean }>`
          SELECT EXISTS (SELECT 1 FROM outbox WHERE ${sql.and([...base, ...afterKey(last)])}) AS more`.pipe(
            storeOp("operator.replayDeadLetters")
          )
          truncated = more[0]?.more === true
          complete = !truncated
          break
        }
      }
      if (replayed > 0) yield* notify.pipe(storeOp("operator.notify"))
      if (replayed > 0) {
        yield* Effect.logInfo("dead letters replayed").pipe(
          Effect.annotateLogs({ count: replayed, inactiveSubscription: inactive })
        )
      }
      if (!complete && !truncated) {
        yield* Effect.logWarning("replay stopped at its statement bound; run it again for the rest")
      }
      return { replayed, inactiveSubscription: inactive, complete, truncated } satisfies ReplayResult
    })

    const status = statusOf(sql)

    const shape: OperatorShape = { listDeliveries, listPage, showDelivery, redeliver, replayDeadLetters, status }
    return shape
  })

export const make = makeWith()

export const layerWith = (options: OperatorOptions): Layer.Layer<Operator, never, SqlClient.SqlClient> =>
  Layer.effect(Operator, makeWith(options))

export const layer: Layer.Layer<Operator, never, SqlClient.SqlClient> = Layer.effect(Operator, make)
