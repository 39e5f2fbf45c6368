/**
 * Exponential backoff with jitter: the one home of the formula every retry loop of firehook uses
 * (intake reconnects, the Redis publisher, backfill and the retry scheduler, delivery's retry
 * policy and its claim/LISTEN loops).
 *
 * The ceiling of attempt `n` (n = 0, 1, …) is `min(cap, base · 2ⁿ)`; jitter then spreads it:
 * - full jitter: uniform in `[0, ceiling)`, `floor(r · ceiling)`;
 * - equal jitter: in `[ceiling / 2, ceiling)`, `floor(ceiling · (0.5 + 0.5 · r))` (`round` where a
 *   caller's documented formula says so).
 * `r` comes from Effect's `Random` (one `Random.next` per delay), so `Random.fixed` or a seeded
 * `Random` makes every delay exact, and delays are slept with Effect's `Clock` (`TestClock`).
 *
 * @since 0.1.0
 */
import { Duration, Effect, Random, Schedule } from "effect"

/** `min(capMs, baseMs · 2ⁿ)` (n clamped to 30 so the product stays finite). */
export const ceilingMillis = (baseMs: number, capMs: number, n: number): number =>
  Math.min(capMs, baseMs * 2 ** Math.min(Math.max(0, n), 30))

/** Full jitter of a ceiling: `floor(r · ceilingMs)`. */
export const fullJitterMillis = (ceilingMs: number, r: number): number => Math.floor(r * ceilingMs)

/** Equal jitter of a ceiling: `floor(ceilingMs · (0.5 + 0.5 · r))`, or rounded. */
export const equalJitterMillis = (ceilingMs: number, r: number, rounding: "floor" | "round" = "floor"): number =>
  rounding === "floor" ? Math.floor(ceilingMs * (0.5 + 0.5 * r)) : Math.round(ceilingMs * (0.5 + r / 2))

/** Without jitter: the ceiling itself, `min(cap, base · 2ⁿ)`. */
export const exponential = (base: Duration.DurationInput, cap: Duration.DurationInput, n: number): Duration.Duration =>
  Duration.millis(ceilingMillis(toMillis(base), toMillis(cap), n))

/** Full jitter as a delay: uniform in `[0, min(cap, base · 2ⁿ))`. */
export const fullJitter = (
  base: Duration.DurationInput,
  cap: Duration.DurationInput,
  n: number
): Effect.Effect<Duration.Duration> =>
  Effect.map(Random.next, (r) => Duration.millis(fullJitterMillis(ceilingMillis(toMillis(base), toMillis(cap), n), r)))

/** Equal jitter as a delay: in `[c / 2, c)` for `c = min(cap, base · 2ⁿ)`. */
export const equalJitter = (
  base: Duration.DurationInput,
  cap: Duration.DurationInput,
  n: number
): Effect.Effect<Duration.Duration> =>
  Effect.map(Random.next, (r) => Duration.millis(equalJitterMillis(ceilingMillis(toMillis(base), toMillis(cap), n), r)))

export interface ScheduleOptions {
  readonly base: Duration.DurationInput
  readonly cap: Duration.DurationInput
  /** the smallest delay (default 0) */
  readonly min?: Duration.DurationInput
  /** how equal jitter is made whole (default `floor`) */
  readonly rounding?: "floor" | "round"
}

/**
 * Full jitter as a Schedule: the delay before recurrence n is `max(min, floor(r · min(cap, base · 2ⁿ)))`.
 * Recurs forever: bound it with `Schedule.intersect(Schedule.recurs(k))` where needed.
 */
export const fullJitterSchedule = (options: ScheduleOptions): Schedule.Schedule<Duration.Duration> => {
  const capMs = toMillis(options.cap)
  const minMs = options.min === undefined ? 0 : toMillis(options.min)
  return Schedule.exponential(options.base, 2).pipe(
    Schedule.modifyDelayEffect((_, delay) =>
      Effect.map(
        Random.next,
        (r) => Duration.millis(Math.max(minMs, fullJitterMillis(Math.min(capMs, Duration.toMillis(delay)), r)))
      )
    )
  )
}

/** Equal jitter as a Schedule: the delay before recurrence n is in `[c / 2, c)` for `c = min(cap, base · 2ⁿ)`. */
export const equalJitterSchedule = (options: ScheduleOptions): Schedule.Schedule<Duration.Duration> => {
  const capMs = toMillis(options.cap)
  const minMs = options.min === undefined ? 0 : toMillis(options.min)
  const rounding = options.rounding ?? "floor"
  return Schedule.exponential(options.base, 2).pipe(
    Schedule.modifyDelayEffect((_, delay) =>
      Effect.map(
        Random.next,
        (r) =>
          Duration.millis(Math.max(minMs, equalJitterMillis(Math.min(capMs, Duration.toMillis(delay)), r, rounding)))
      )
    )
  )
}

const toMillis = (d: Duration.DurationInput): number => Duration.toMillis(Duration.decode(d))
