/**
 * Retry backoff for deliveries (SPEC §4.3).
 *
 * Exponential, factor 2, from `baseMs` (default 1 s), capped at `maxMs` (default 5 min), with
 * "equal jitter": the capped delay `d` becomes `floor(d × (0.5 + 0.5·r))` with `r` from Effect's
 * `Random.next`, so `Random.fixed` / a seeded `Random` make it exact. At most `maxAttempts` attempts
 * (default 12, 1–50), then dead letter.
 *
 * The same rule is exposed twice and the two always agree (a test checks it):
 * - {@link retrySchedule}: an Effect `Schedule` for in-process retrying;
 * - {@link nextDelay}: the delay after attempt N computed directly, for the stateless worker that only
 *   knows the stored `attempt_count`.
 *
 * `Retry-After` (when the receiver sent one with a retryable status) overrides the computed delay:
 * `min(min(retryAfter, 1 h), maxMs)`, without jitter.
 *
 * @since 0.1.0
 */
import { Duration, Effect, Either, Option, Random, Schedule } from "effect"
import * as Backoff from "../platform/Backoff.js"
import * as DeliveryConfig from "./DeliveryConfig.js"

/** Backoff settings. */
export interface RetryConfig {
  /** First retry delay before jitter, ms (> 0). */
  readonly baseMs: number
  /** Cap of every delay (computed or Retry-After), ms (≥ baseMs). */
  readonly maxMs: number
  /** Attempts per delivery including the first, 1–50. */
  readonly maxAttempts: number
}

/** The defaults of SPEC §4.3 / §6.5. */
export const defaultRetryConfig: RetryConfig = {
  baseMs: DeliveryConfig.delivery.retryBaseMs.default,
  maxMs: DeliveryConfig.delivery.retryMaxMs.default,
  maxAttempts: DeliveryConfig.delivery.maxAttempts.default
}

/** Hard bounds on `maxAttempts`. */
export const MIN_ATTEMPTS = DeliveryConfig.delivery.maxAttempts.min
export const MAX_ATTEMPTS = DeliveryConfig.delivery.maxAttempts.max
/** A Retry-After is never honoured beyond this, before the configured cap applies. */
export const RETRY_AFTER_CAP_MS = 3_600_000

/**
 * Validates a config. Decision (spec silent on these two ranges): `baseMs` is an integer 1 ms–1 h and
 * `maxMs` an integer in [baseMs, 24 h].
 */
export const validateRetryConfig = (cfg: RetryConfig): Either.Either<RetryConfig, "invalid_retry_config"> =>
  Number.isInteger(cfg.baseMs) && cfg.baseMs >= 1 && cfg.baseMs <= 3_600_000 &&
    Number.isInteger(cfg.maxMs) && cfg.maxMs >= cfg.baseMs && cfg.maxMs <= 86_400_000 &&
    Number.isInteger(cfg.maxAttempts) && cfg.maxAttempts >= MIN_ATTEMPTS && cfg.maxAttempts <= MAX_ATTEMPTS
    ? Either.right(cfg)
    : Either.left("invalid_retry_config")

/**
 * `min(maxMs, baseMs · 2^(attempt − 1))` for attempt ≥ 1, before jitter ({@link Backoff.ceilingMillis};
 * its exponent bound of 30 never binds a valid config: `baseMs · 2³⁰` exceeds every allowed `maxMs`).
 */
export const cappedExponentialMs = (cfg: RetryConfig, attempt: number): number =>
  Backoff.ceilingMillis(cfg.baseMs, cfg.maxMs, Math.floor(attempt) - 1)

/** Equal jitter: `floor(ms × (0.5 + 0.5·r))`, one `Random.next` per call ({@link Backoff.equalJitterMillis}). */
export const equalJitter = (ms: number): Effect.Effect<number> =>
  Effect.map(Random.next, (r) => Backoff.equalJitterMillis(ms, r))

/** The Retry-After override: capped at 1 h, then at `maxMs`; never negative. */
export const retryAfterDelayMs = (cfg: RetryConfig, retryAfterMs: number): number =>
  Math.min(Math.min(Math.max(0, retryAfterMs), RETRY_AFTER_CAP_MS), cfg.maxMs)

/**
 * The delay before the next attempt, given the number of attempts already made (≥ 1), or
 * `Option.none()` when the attempt budget is spent (dead letter). `retryAfterMs` (from
 * `parseRetryAfter`) overrides the computed, jittered delay; pass it only for statuses that honour it.
 */
export const nextDelay = (
  cfg: RetryConfig,
  attemptCount: number,
  retryAfterMs: number | undefined
): Effect.Effect<Option.Option<Duration.Duration>> => {
  if (attemptCount >= cfg.maxAttempts) return Effect.succeed(Option.none())
  if (retryAfterMs !== undefined && !Number.isNaN(retryAfterMs)) {
    return Effect.succeed(Option.some(Duration.millis(retryAfterDelayMs(cfg, retryAfterMs))))
  }
  return Effect.map(equalJitter(cappedExponentialMs(cfg, attemptCount)), (ms) => Option.some(Duration.millis(ms)))
}

/**
 * The same policy as an Effect `Schedule`: built on `Schedule.exponential(baseMs, 2)`, capped, equally
 * jittered, and limited to `maxAttempts − 1` recurrences (so `Effect.retry(effect, retrySchedule(cfg))`
 * makes at most `maxAttempts` attempts). The output is the delay before the next attempt, and the N-th
 * recurrence's delay equals `nextDelay(cfg, N, undefined)` for the same random values.
 */
export const retrySchedule = (cfg: RetryConfig): Schedule.Schedule<Duration.Duration, unknown> =>
  Backoff.equalJitterSchedule({ base: Duration.millis(cfg.baseMs), cap: Duration.millis(cfg.maxMs) }).pipe(
    Schedule.intersect(Schedule.recurs(Math.max(0, cfg.maxAttempts - 1))),
    Schedule.delays
  )
