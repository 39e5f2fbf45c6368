/**
 * The outbox and attempt rows as the operator's statements read them, and their mapping to the
 * operator's model (`Operator.ts`).
 */
import type { Attempt, Delivery, DeliveryStatus } from "./Operator.js"

export interface OutboxDbRow {
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

export interface AttemptDbRow {
  readonly attempt: number
  readonly started_at: Date
  readonly duration_ms: number
  readonly outcome: string
  readonly error_kind: string | null
  readonly http_status: number | null
  readonly response_excerpt: string | null
}

export const opt = <A>(a: A | null): A | undefined => (a === null ? undefined : a)
export const date = (d: Date | string): Date => (d instanceof Date ? d : new Date(d))
export const optDate = (d: Date | string | null): Date | undefined => (d === null ? undefined : date(d))

export const toDelivery = (r: OutboxDbRow): Delivery => ({
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

export const toAttempt = (r: AttemptDbRow): Attempt => ({
  attempt: r.attempt,
  startedAt: date(r.started_at),
  durationMs: r.duration_ms,
  outcome: r.outcome,
  errorKind: opt(r.error_kind),
  httpStatus: opt(r.http_status),
  responseExcerpt: opt(r.response_excerpt)
})
