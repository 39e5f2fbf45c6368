/**
 * Outcome classification of one delivery attempt (SPEC §4.3); `Retry-After` parsing is re-exported
 * from platform/http/RetryAfter.ts.
 *
 * @since 0.1.0
 */
import { safeHttpErrorKinds } from "../platform/http/Errors.js"

/** All failure kinds, in table order. Stored as `last_error_kind` and used as a metric label. */
export const failureKinds = [
  "http_5xx",
  "http_429",
  "gone",
  "http_4xx",
  "redirect",
  // the transport's own failures (SafeHttp), in their order
  ...safeHttpErrorKinds,
  "subscription_unavailable",
  "secret_unavailable",
  "transform_failed"
] as const

/** Every way an attempt can fail (one of {@link failureKinds}). */
export type FailureKind = (typeof failureKinds)[number]

const RETRYABLE: ReadonlySet<FailureKind> = new Set<FailureKind>([
  "http_5xx",
  "http_429",
  "dns",
  "timeout",
  "network",
  "subscription_unavailable",
  "secret_unavailable"
])

/** Whether a failure kind is transient (retried with backoff) rather than permanent (dead-lettered). */
export const isRetryable = (kind: FailureKind): boolean => RETRYABLE.has(kind)

/** The classification of an HTTP status code. */
export type StatusClass =
  | { readonly outcome: "delivered" }
  | { readonly outcome: "failed"; readonly kind: FailureKind; readonly retryable: boolean }

const failed = (kind: FailureKind): StatusClass => ({ outcome: "failed", kind, retryable: isRetryable(kind) })

/** Statuses outside 5xx that are still "try again later". */
const RETRY_4XX: ReadonlySet<number> = new Set([408, 409, 423, 425])

/**
 * Classifies a response status (SPEC §4.3):
 * 2xx delivered; 5xx, 408, 409, 423, 425 → `http_5xx` (retry); 429 → `http_429` (retry);
 * 410 → `gone` (no retry); other 4xx → `http_4xx` (no retry); 1xx and 3xx → `redirect` (no retry).
 *
 * Decision (spec silent): a status outside 100–599 (or not an integer) is a broken server response and
 * is classified as `http_5xx` (retryable).
 */
export const classifyStatus = (status: number): StatusClass => {
  if (!Number.isInteger(status) || status < 100 || status > 599) return failed("http_5xx")
  if (status >= 200 && status <= 299) return { outcome: "delivered" }
  if (status === 429) return failed("http_429")
  if (status === 410) return failed("gone")
  if (status >= 500 || RETRY_4XX.has(status)) return failed("http_5xx")
  if (status >= 400) return failed("http_4xx")
  return failed("redirect")
}

/** `Retry-After` parsing lives with the HTTP transport (the reconciler reads it too). */
export { parseHttpDate, parseRetryAfter } from "../platform/http/RetryAfter.js"
