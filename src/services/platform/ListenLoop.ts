/**
 * A PostgreSQL `LISTEN` followed for as long as its fiber lives: every payload goes to
 * `onPayload`; when the stream fails or ends (a dropped connection), the failure is counted, logged
 * (rate-limited, the error's code only: never a payload) and the `LISTEN` is opened again with
 * full-jitter backoff, 1 s → 30 s ({@link reopen}: a session that stayed up at least the cap starts
 * the backoff over). Never fails and never ends: interrupt it (its Scope) to stop.
 */
import type { Metric } from "effect"
import { Clock, Duration, Effect, Metric as M, Stream } from "effect"
import * as Backoff from "./Backoff.js"
import { codeOf } from "./Persistence.js"
import type * as RateLimitedLog from "./RateLimitedLog.js"

export interface ListenLoopOptions {
  /** counted once per failure or end of the stream */
  readonly failures: Metric.Metric.Counter<number>
  /** the rate-limited log the warnings go through */
  readonly log: RateLimitedLog.RateLimitedLog
  /** the warning (a constant text: it names the channel's purpose, nothing else) */
  readonly message: string
}

const REOPEN_BASE = Duration.seconds(1)
const REOPEN_CAP = Duration.seconds(30)

/**
 * Run `session` (a LISTEN followed until it fails or ends) again and again, waiting full jitter
 * 1 s → 30 s between runs; a session that lasted at least the cap (30 s) starts the backoff over, as
 * the delivery worker's own LISTEN loop does. Before 7 December 2026 the followers kept one
 * schedule for the life of the process: after about five drops in all (failovers, restarts), every
 * later drop, even after days of a working LISTEN, waited up to 30 s before it was opened again.
 * Each run ends in a failure or an end and waits before the next, so the loop never spins.
 */
export const reopen = <E, R>(session: Effect.Effect<unknown, E, R>): Effect.Effect<never, never, R> =>
  Effect.gen(function*() {
    const capMs = Duration.toMillis(REOPEN_CAP)
    let failures = 0
    for (;;) {
      const started = yield* Clock.currentTimeMillis
      yield* Effect.either(session)
      if ((yield* Clock.currentTimeMillis) - started >= capMs) failures = 0
      yield* Effect.sleep(yield* Backoff.fullJitter(REOPEN_BASE, REOPEN_CAP, failures))
      failures = Math.min(failures + 1, 30)
    }
  })

export const follow = <E, R1, R2>(
  listen: Stream.Stream<string, E, R1>,
  onPayload: (payload: string) => Effect.Effect<void, never, R2>,
  options: ListenLoopOptions
): Effect.Effect<never, never, R1 | R2> =>
  listen.pipe(
    Stream.runForEach(onPayload),
    Effect.zipRight(Effect.fail({ code: "ended" })),
    Effect.tapError((e) =>
      Effect.zipRight(
        M.increment(options.failures),
        options.log.run(
          "listen",
          (suppressed) => Effect.logWarning(options.message).pipe(Effect.annotateLogs({ code: codeOf(e), suppressed }))
        )
      )
    ),
    reopen
  )

/** The bound on one best-effort notification: its sender never waits longer. */
export const NOTIFY_TIMEOUT = Duration.seconds(5)

/**
 * The sending side's counterpart: one best-effort `send` (a `pg_notify`), bounded by
 * {@link NOTIFY_TIMEOUT}; a failure or timeout is counted, logged under `key` (rate-limited, the
 * error's code only) and swallowed.
 */
export const notifyBestEffort = <A, E, R>(
  send: Effect.Effect<A, E, R>,
  options: ListenLoopOptions & { readonly key: string }
): Effect.Effect<void, never, R> =>
  send.pipe(
    Effect.timeoutFail({ duration: NOTIFY_TIMEOUT, onTimeout: () => ({ code: "timeout" }) }),
    Effect.asVoid,
    Effect.catchAll((e) =>
      Effect.zipRight(
        M.increment(options.failures),
        options.log.run(
          options.key,
          (suppressed) => Effect.logWarning(options.message).pipe(Effect.annotateLogs({ code: codeOf(e), suppressed }))
        )
      )
    )
  )
