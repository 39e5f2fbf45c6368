/**
 * The settle requests of the PostgreSQL delivery store (DeliveryStoreSql.ts): one per settle
 * operation of the `DeliveryStore` port, applied in batches by its settle statement.
 */
import type { TerminalStatus } from "../matching/OutboxStatus.js"
import type { AttemptRecord, DeliveredAttempt, FailedAttempt } from "./DeliveryStore.js"
import { PARKED_KIND } from "./WebhookHealthSql.js"

export const clampInt = (n: number, min: number, max: number): number =>
  Number.isFinite(n) ? Math.min(max, Math.max(min, Math.floor(n))) : min

/** One settle request (every settle operation is one of these, applied in batches). */
export interface Settle {
  readonly deliveryId: string
  readonly token: string
  /**
   * `park`: `dead_letter` (`webhook_disabled`) while the webhook has room, else `cancelled` (SPEC §4.3);
   * `pending` and due now, answered as not applied, when the webhook (same fingerprint) is no longer
   * gone or auto-disabled when the statement runs (resumed since the attempt read it: a `resume
   * --replay` running meanwhile would not find the row among the dead letters)
   */
  readonly status: "pending" | TerminalStatus | "park"
  /** new total; undefined = unchanged */
  readonly attemptCount: number | undefined
  /** next attempt after this many ms; undefined = unchanged */
  readonly delayMs: number | undefined
  /** whether `last_error_kind` is set (to `errorKind`, possibly NULL) */
  readonly setError: boolean
  readonly errorKind: string | undefined
  /** whether `last_http_status` is set (to `httpStatus`, possibly NULL) */
  readonly setHttp: boolean
  readonly httpStatus: number | undefined
  /** terminal: `finished_at` and an audit row */
  readonly terminal: boolean
  readonly attempt: AttemptRecord | undefined
}

const delayMs = (ms: number) => clampInt(ms, 0, 366 * 24 * 3_600_000)

export const delivered = (deliveryId: string, token: string, o: DeliveredAttempt): Settle => ({
  deliveryId,
  token,
  status: "delivered",
  attemptCount: o.attemptCount,
  delayMs: undefined,
  setError: true,
  errorKind: undefined,
  setHttp: true,
  httpStatus: o.httpStatus,
  terminal: true,
  attempt: o.attempt
})

export const rescheduled = (
  deliveryId: string,
  token: string,
  r: FailedAttempt & { readonly delayMs: number }
): Settle => ({
  deliveryId,
  token,
  status: "pending",
  attemptCount: r.attemptCount,
  delayMs: delayMs(r.delayMs),
  setError: true,
  errorKind: r.errorKind,
  setHttp: true,
  httpStatus: r.httpStatus,
  terminal: false,
  attempt: r.attempt
})

export const deferred = (deliveryId: string, token: string, ms: number): Settle => ({
  deliveryId,
  token,
  status: "pending",
  attemptCount: undefined,
  delayMs: delayMs(ms),
  setError: false,
  errorKind: undefined,
  setHttp: false,
  httpStatus: undefined,
  terminal: false,
  attempt: undefined
})

export const deadLettered = (deliveryId: string, token: string, f: FailedAttempt): Settle => ({
  deliveryId,
  token,
  status: "dead_letter",
  attemptCount: f.attemptCount,
  delayMs: undefined,
  setError: true,
  errorKind: f.errorKind,
  setHttp: true,
  httpStatus: f.httpStatus,
  terminal: true,
  attempt: f.attempt
})

export const parked = (deliveryId: string, token: string): Settle => ({
  deliveryId,
  token,
  status: "park",
  attemptCount: undefined,
  delayMs: undefined,
  setError: true,
  errorKind: PARKED_KIND,
  // no request: the HTTP status of an earlier attempt would not belong to this error
  setHttp: true,
  httpStatus: undefined,
  terminal: true,
  attempt: undefined
})

export const cancelled = (deliveryId: string, token: string, reason: string): Settle => ({
  deliveryId,
  token,
  status: "cancelled",
  attemptCount: undefined,
  delayMs: undefined,
  setError: true,
  errorKind: reason,
  // no request: the HTTP status of an earlier attempt would not belong to this error
  setHttp: true,
  httpStatus: undefined,
  terminal: true,
  attempt: undefined
})
