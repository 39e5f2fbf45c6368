/**
 * "Log this at most once a minute": the one home of the rate limit on recurring warnings (a store
 * that keeps failing, a Redis that keeps refusing, a stream that keeps reconnecting). A limiter
 * keeps the last time it let each key through and how many it held back since; what is logged, and
 * with which annotations, stays the caller's (kinds and codes only, never values).
 *
 * Time comes from Effect's `Clock`, so `TestClock` drives it.
 *
 * @since 0.1.0
 */
import { Clock, Effect } from "effect"

/** The default interval: once a minute. */
export const EVERY_MS = 60_000

export interface RateLimitedLog {
  /**
   * Run `log(suppressed)` when `key` was not let through in the last interval (`suppressed`: how
   * many calls for the key were held back since it last was); otherwise count one more held back.
   */
  readonly run: <R>(
    key: string,
    log: (suppressed: number) => Effect.Effect<void, never, R>
  ) => Effect.Effect<void, never, R>
}

export interface RateLimitedLogOptions {
  /** the interval, ms (default {@link EVERY_MS}) */
  readonly everyMs?: number
  /** a new key that finds more than this many remembered clears the memory first, so at most `maxKeys + 1` are held (default 64) */
  readonly maxKeys?: number
}

/** A limiter with its own memory (one per service instance). */
export const make = (options: RateLimitedLogOptions = {}): RateLimitedLog => {
  const everyMs = options.everyMs ?? EVERY_MS
  const maxKeys = options.maxKeys ?? 64
  const last = new Map<string, { at: number; suppressed: number }>()
  return {
    run: (key, log) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const seen = last.get(key)
        if (seen !== undefined && now - seen.at < everyMs) {
          seen.suppressed += 1
          return Effect.void
        }
        if (seen === undefined && last.size > maxKeys) last.clear()
        last.set(key, { at: now, suppressed: 0 })
        return log(seen?.suppressed ?? 0)
      })
  }
}
