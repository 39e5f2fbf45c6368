/**
 * The backlog counts of the `delivery` health section, cached (SPEC §6.2: `/health` answers within
 * 1 s whatever the database does).
 *
 * One fiber, owned by the scope it is made in (the worker's), reads the counts at once and then
 * {@link COUNTS_REFRESH_MS} after each read ends, every read bounded by `COUNTS_TIMEOUT`, until
 * `stopped()` holds (the worker stopped: no more database work). A health request only reads the
 * last answer: it never waits on the database. The answer's age is counted from the moment its
 * query started; older than `COUNTS_TTL_MS` (5 s: the database is slow or failing) it is marked
 * `stale` and kept. Before the first answer the counts are 0 and stale.
 *
 * @since 0.1.0
 */
import { Clock, Duration, Effect, Either } from "effect"
import type { Scope } from "effect"
import { StoreError } from "../platform/Persistence.js"
import { COUNTS_TIMEOUT, COUNTS_TTL_MS, type DeliveryCounts } from "./DeliveryStore.js"

/**
 * Pause between the end of one read and the start of the next: with reads bounded by
 * `COUNTS_TIMEOUT` (2.5 s), a database that answers in time keeps the answer younger than
 * `COUNTS_TTL_MS` (2 s + 2.5 s < 5 s).
 */
export const COUNTS_REFRESH_MS = 2_000

export interface CountsReading {
  readonly counts: DeliveryCounts
  /** older than `COUNTS_TTL_MS`, or never read */
  readonly stale: boolean
}

export interface CountsCache {
  /** The last answer: never touches the database. */
  readonly read: Effect.Effect<CountsReading>
}

const UNKNOWN: DeliveryCounts = { pending: 0, leased: 0, deadLetter: 0, autoDisabledWebhooks: 0, goneWebhooks: 0 }

export const make = (options: {
  /** the counts query (bounded here by `COUNTS_TIMEOUT` too, whatever its own bound) */
  readonly counts: Effect.Effect<DeliveryCounts, StoreError>
  /** the refresh ends once this holds */
  readonly stopped: () => boolean
  /** a failed or timed-out read (the last answer is kept) */
  readonly onError: (e: StoreError) => Effect.Effect<void>
}): Effect.Effect<CountsCache, never, Scope.Scope> =>
  Effect.gen(function*() {
    let last: { readonly at: number; readonly value: DeliveryCounts } | undefined
    const bounded = options.counts.pipe(
      Effect.timeoutFail({
        duration: COUNTS_TIMEOUT,
        onTimeout: () => new StoreError({ op: "delivery.counts", code: "timeout" })
      })
    )
    const refresh = Effect.gen(function*() {
      const startedAt = yield* Clock.currentTimeMillis
      const result = yield* Effect.either(bounded)
      if (Either.isRight(result)) last = { at: startedAt, value: result.right }
      else yield* options.onError(result.left)
    })
    yield* Effect.forkScoped(
      Effect.gen(function*() {
        while (!options.stopped()) {
          yield* refresh
          yield* Effect.sleep(Duration.millis(COUNTS_REFRESH_MS))
        }
      })
    )
    const read: Effect.Effect<CountsReading> = Effect.map(
      Clock.currentTimeMillis,
      (now): CountsReading =>
        last === undefined
          ? { counts: UNKNOWN, stale: true }
          : { counts: last.value, stale: now - last.at > COUNTS_TTL_MS }
    )
    return { read }
  })
