/**
 * Operator actions on deliveries (SPEC §4.8): list, show with attempts, redeliver one, replay dead
 * letters, and a status summary. Used by the CLI (`src/cli.ts`) and by embedding programs.
 *
 * - Time filters (`since` inclusive, `until` exclusive) apply to the delivery's `created_at`, the
 *   moment the event was enqueued: "replay what was enqueued while the receiver was down".
 * - `redeliver` and `replay` keep the delivery id (receivers dedupe on `webhook-id` /
 *   `Idempotency-Key`), give the row a fresh attempt budget (`attempt_count = 0`), make it due now,
 *   clear the lease, the last error and `finished_at`, and wake the workers with one NOTIFY.
 *   A `leased` row is never touched: a worker is attempting it right now.
 * - `replay` updates at most 1,000 rows per statement (each statement its own transaction), until
 *   no matching dead letter is left.
 * - `status` is counts only (no DIDs, URLs or errors).
 *
 * Rows carry the target URL because operators own the database; the CLI hides it unless asked.
 */
import { SqlClient } from "@effect/sql"
import type { Fragment } from "@effect/sql/Statement"
import { Context, Data, Effect, Layer, Option } from "effect"
import { isCanonicalDid, isRkey } from "../schemas/AtUri.js"
import { NOTIFY_CHANNEL, type OutboxRow } from "./Outbox.js"
import { type StoreError, storeOp } from "./Store.js"

export const DELIVERY_STATUSES = ["pending", "leased", "delivered", "dead_letter", "cancelled"] as const
export type DeliveryStatus = (typeof DELIVERY_STATUSES)[number]

export const RECONCILE_STATUSES = ["unknown", "scanning", "complete", "failed"] as const
export type ReconcileStatus = (typeof RECONCILE_STATUSES)[number]

export const isDeliveryStatus = (s: string): s is DeliveryStatus => (DELIVERY_STATUSES as ReadonlyArray<string>).includes(s)

/** Default and hard maximum of `listDeliveries`. */
export const DEFAULT_LIST_LIMIT = 100
export const MAX_LIST_LIMIT = 1_000
/** Rows per replay statement. */
export const REPLAY_BATCH = 1_000
/** Attempts shown by `showDelivery` at most. */
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

export interface ListFilter {
  /** owner DID */
  readonly owner?: string
  /** webhook record key (with or without `owner`) */
  readonly webhook?: string
  readonly status?: DeliveryStatus
  /** created at or after */
  readonly since?: Date
  /** created before */
  readonly until?: Date
  /** 1..1,000, default 100 */
  readonly limit?: number
}

export interface ReplayFilter {
  readonly owner?: string
  readonly webhook?: string
  readonly since?: Date
  readonly until?: Date
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
  readonly attempts: ReadonlyArray<Attempt>
}

export interface StatusSummary {
  readonly deliveries: { readonly [S in DeliveryStatus]: number } & { readonly due: number }
  readonly webhooks: { readonly active: number; readonly total: number; readonly gone: number }
  readonly owners: { readonly [S in ReconcileStatus]: number }
  readonly quarantine: number
  readonly secrets: number
}

export interface OperatorShape {
  readonly listDeliveries: (filter: ListFilter) => Effect.Effect<ReadonlyArray<Delivery>, InvalidArgument | StoreError>
  readonly showDelivery: (deliveryId: string) => Effect.Effect<Option.Option<DeliveryDetail>, StoreError>
  /** Whether the row changed (false: unknown id, or leased right now). */
  readonly redeliver: (deliveryId: string) => Effect.Effect<boolean, StoreError>
  /** How many dead letters became pending. */
  readonly replayDeadLetters: (filter: ReplayFilter) => Effect.Effect<number, InvalidArgument | StoreError>
  readonly status: Effect.Effect<StatusSummary, StoreError>
}

export class Operator extends Context.Tag("firehook/Operator")<Operator, OperatorShape>() {}

// ---------------------------------------------------------------------------------------------

interface OutboxDbRow {
  readonly delivery_id: string
  readonly event_id: string
  readonly owner_did: string
  readonly webhook_rkey: string
  readonly match_kind: Delivery["matchKind"]
  readonly event_did: string
  readonly event_collection: string
  readonly event_rkey: string
  readonly event_operation: Delivery["eventOperation"]
  readonly target_url: string
  readonly signing_mode: Delivery["signingMode"]
  readonly secret_id: string | null
  readonly status: DeliveryStatus
  readonly attempt_count: number
  readonly next_attempt_at: Date
  readonly leased_until: Date | null
  readonly last_error_kind: string | null
  readonly last_http_status: number | null
  readonly created_at: Date
  readonly updated_at: Date
  readonly finished_at: Date | null
}

interface AttemptDbRow {
  readonly attempt: number
  readonly started_at: Date
  readonly duration_ms: number
  readonly outcome: string
  readonly error_kind: string | null
  readonly http_status: number | null
  readonly response_excerpt: string | null
}

const opt = <A>(a: A | null): A | undefined => (a === null ? undefined : a)
const date = (d: Date | string): Date => (d instanceof Date ? d : new Date(d))
const optDate = (d: Date | string | null): Date | undefined => (d === null ? undefined : date(d))

const toDelivery = (r: OutboxDbRow): Delivery => ({
  deliveryId: r.delivery_id,
  eventId: r.event_id,
  ownerDid: r.owner_did,
  webhookRkey: r.webhook_rkey,
  matchKind: r.match_kind,
  eventDid: r.event_did,
  eventCollection: r.event_collection,
  eventRkey: r.event_rkey,
  eventOperation: r.event_operation,
  targetUrl: r.target_url,
  signingMode: r.signing_mode,
  secretId: opt(r.secret_id),
  status: r.status,
  attemptCount: r.attempt_count,
  nextAttemptAt: date(r.next_attempt_at),
  leasedUntil: optDate(r.leased_until),
  lastErrorKind: opt(r.last_error_kind),
  lastHttpStatus: opt(r.last_http_status),
  createdAt: date(r.created_at),
  updatedAt: date(r.updated_at),
  finishedAt: optDate(r.finished_at)
})

const toAttempt = (r: AttemptDbRow): Attempt => ({
  attempt: r.attempt,
  startedAt: date(r.started_at),
  durationMs: r.duration_ms,
  outcome: r.outcome,
  errorKind: opt(r.error_kind),
  httpStatus: opt(r.http_status),
  responseExcerpt: opt(r.response_excerpt)
})

const validDate = (d: Date | undefined): boolean => d === undefined || !Number.isNaN(d.getTime())

const checkFilter = (f: ReplayFilter): Effect.Effect<void, InvalidArgument> => {
  if (f.owner !== undefined && !isCanonicalDid(f.owner)) {
    return Effect.fail(new InvalidArgument({ field: "owner", rule: "must be a canonical DID (did:plc or did:web)" }))
  }
  if (f.webhook !== undefined && !isRkey(f.webhook)) {
    return Effect.fail(new InvalidArgument({ field: "webhook", rule: "must be a record key" }))
  }
  if (!validDate(f.since)) return Effect.fail(new InvalidArgument({ field: "since", rule: "must be a valid time" }))
  if (!validDate(f.until)) return Effect.fail(new InvalidArgument({ field: "until", rule: "must be a valid time" }))
  return Effect.void
}

export const make = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient

  const conditions = (f: ReplayFilter & { readonly status?: DeliveryStatus }): ReadonlyArray<Fragment> => {
    const out: Array<Fragment> = []
    if (f.owner !== undefined) out.push(sql`owner_did = ${f.owner}`)
    if (f.webhook !== undefined) out.push(sql`webhook_rkey = ${f.webhook}`)
    if (f.status !== undefined) out.push(sql`status = ${f.status}`)
    if (f.since !== undefined) out.push(sql`created_at >= ${f.since}`)
    if (f.until !== undefined) out.push(sql`created_at < ${f.until}`)
    return out
  }

  const notify = sql`SELECT pg_notify(${NOTIFY_CHANNEL}, '1')`

  const listDeliveries = Effect.fn("Operator.listDeliveries")(function* (filter: ListFilter) {
    yield* checkFilter(filter)
    const limit = filter.limit ?? DEFAULT_LIST_LIMIT
    if (!Number.isSafeInteger(limit) || limit < 1 || limit > MAX_LIST_LIMIT) {
      return yield* Effect.fail(new InvalidArgument({ field: "limit", rule: `must be an integer in 1..${MAX_LIST_LIMIT}` }))
    }
    const rows = yield* sql<OutboxDbRow>`
      SELECT * FROM outbox WHERE ${sql.and(conditions(filter))}
      ORDER BY created_at DESC, delivery_id
      LIMIT ${limit}`.pipe(storeOp("operator.listDeliveries"))
    return rows.map(toDelivery)
  })

  const showDelivery = Effect.fn("Operator.showDelivery")(function* (deliveryId: string) {
    const rows = yield* sql<OutboxDbRow>`SELECT * FROM outbox WHERE delivery_id = ${deliveryId}`.pipe(
      storeOp("operator.showDelivery")
    )
    const row = rows[0]
    if (row === undefined) return Option.none<DeliveryDetail>()
    const attempts = yield* sql<AttemptDbRow>`
      SELECT attempt, started_at, duration_ms, outcome, error_kind, http_status, response_excerpt
      FROM delivery_attempts WHERE delivery_id = ${deliveryId}
      ORDER BY attempt, started_at
      LIMIT ${MAX_ATTEMPTS_SHOWN}`.pipe(storeOp("operator.showDelivery"))
    return Option.some<DeliveryDetail>({ delivery: toDelivery(row), attempts: attempts.map(toAttempt) })
  })

  const RESET = sql`
    status = 'pending', attempt_count = 0, next_attempt_at = now(), lease_token = NULL, leased_until = NULL,
    last_error_kind = NULL, last_http_status = NULL, finished_at = NULL, updated_at = now()`

  const redeliver = Effect.fn("Operator.redeliver")(function* (deliveryId: string) {
    return yield* sql
      .withTransaction(
        Effect.gen(function* () {
          const changed = yield* sql<{ delivery_id: string }>`
            UPDATE outbox SET ${RESET}
            WHERE delivery_id = ${deliveryId} AND status <> 'leased'
            RETURNING delivery_id`
          if (changed.length === 0) return false
          yield* notify
          return true
        })
      )
      .pipe(storeOp("operator.redeliver"))
  })

  const replayDeadLetters = Effect.fn("Operator.replayDeadLetters")(function* (filter: ReplayFilter) {
    yield* checkFilter(filter)
    const where = sql.and([sql`status = 'dead_letter'`, ...conditions(filter)])
    let total = 0
    for (;;) {
      // FOR UPDATE (not SKIP LOCKED): a row that maintenance is pruning right now is waited for
      // and then re-checked, so no matching dead letter is skipped and the loop ends only when
      // none is left.
      const batch = yield* sql<{ delivery_id: string }>`
        WITH batch AS (
          SELECT delivery_id FROM outbox WHERE ${where}
          ORDER BY created_at, delivery_id
          LIMIT ${REPLAY_BATCH}
          FOR UPDATE
        )
        UPDATE outbox o SET ${RESET}
        FROM batch WHERE o.delivery_id = batch.delivery_id AND o.status = 'dead_letter'
        RETURNING o.delivery_id`.pipe(storeOp("operator.replayDeadLetters"))
      total += batch.length
      if (batch.length < REPLAY_BATCH) break
    }
    if (total > 0) yield* notify.pipe(storeOp("operator.notify"))
    if (total > 0) yield* Effect.logInfo("dead letters replayed").pipe(Effect.annotateLogs({ count: total }))
    return total
  })

  const status = Effect.gen(function* () {
    const byStatus = yield* sql<{ status: DeliveryStatus; n: number }>`
      SELECT status, count(*)::float8 AS n FROM outbox GROUP BY status`
    const due = yield* sql<{ n: number }>`
      SELECT count(*)::float8 AS n FROM outbox WHERE status = 'pending' AND next_attempt_at <= now()`
    const webhooks = yield* sql<{ active: number; total: number; gone: number }>`
      SELECT count(*) FILTER (WHERE active)::float8 AS active, count(*)::float8 AS total,
             count(*) FILTER (WHERE gone_at IS NOT NULL)::float8 AS gone
      FROM webhooks`
    const owners = yield* sql<{ reconcile_status: ReconcileStatus; n: number }>`
      SELECT reconcile_status, count(*)::float8 AS n FROM owners GROUP BY reconcile_status`
    const quarantine = yield* sql<{ n: number }>`SELECT count(*)::float8 AS n FROM quarantine`
    const secrets = yield* sql<{ n: number }>`SELECT count(*)::float8 AS n FROM secrets`
    const deliveries = { pending: 0, leased: 0, delivered: 0, dead_letter: 0, cancelled: 0, due: due[0]?.n ?? 0 }
    for (const r of byStatus) if (isDeliveryStatus(r.status)) deliveries[r.status] = r.n
    const ownerCounts = { unknown: 0, scanning: 0, complete: 0, failed: 0 }
    for (const r of owners) {
      if ((RECONCILE_STATUSES as ReadonlyArray<string>).includes(r.reconcile_status)) ownerCounts[r.reconcile_status] = r.n
    }
    const summary: StatusSummary = {
      deliveries,
      webhooks: { active: webhooks[0]?.active ?? 0, total: webhooks[0]?.total ?? 0, gone: webhooks[0]?.gone ?? 0 },
      owners: ownerCounts,
      quarantine: quarantine[0]?.n ?? 0,
      secrets: secrets[0]?.n ?? 0
    }
    return summary
  }).pipe(storeOp("operator.status"), Effect.withSpan("Operator.status"))

  const shape: OperatorShape = { listDeliveries, showDelivery, redeliver, replayDeadLetters, status }
  return shape
})

export const layer: Layer.Layer<Operator, never, SqlClient.SqlClient> = Layer.effect(Operator, make)
