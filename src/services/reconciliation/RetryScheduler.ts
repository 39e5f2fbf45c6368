/**
 * RetryScheduler (SPEC §5.4): retries owners whose reconciliation failed or crashed.
 *
 * - At start and then every `RETRY_SCHEDULER_INTERVAL_MS` (60 s; 5 s after a round that failed,
 *   {@link FAILED_ROUND_RETRY_MS}, so that it recovers with the database) it lists up to
 *   `trackedMax − tracked` owners that are `failed` or `scanning` for longer than
 *   `RETRY_SCHEDULER_STALE_SCAN_MS` (15 min: a crashed scan), failed first, oldest failure first, and
 *   tracks each one in its own fiber (at most `RETRY_SCHEDULER_TRACKED_MAX` tracked, default 16).
 * - Each tracked owner is retried on a full-jitter exponential backoff, as an Effect `Schedule`
 *   ({@link retryBackoff}): before attempt n it waits `max(100 ms, random × min(cap, base × 2^n))`
 *   (base 5 s, cap 1 h). Attempts run under a semaphore (`RETRY_SCHEDULER_CONCURRENCY`, 1–2).
 *   An attempt whose PDS answered 429 or 503 with `Retry-After`, or that did not ask a PDS still
 *   cooling down from another owner's (`pds_cooling`), carries the wait (the outcome's
 *   `retryAfterMs`); it is waited (at most the cap) before the backoff's delay; a request that comes
 *   meanwhile does not cut it short, only the backoff's delay after it.
 *   Success (the owner completed here or elsewhere) forgets the owner and its attempt count.
 * - Decision: an owner rediscovered later starts at attempt `failure_count − 1` (the database's
 *   consecutive failures), and an owner is released from tracking after a failed attempt at the cap,
 *   so permanently failing owners rotate (oldest failure first) instead of holding the 16 slots
 *   forever, without a burst of short delays when they come back.
 * - Each round first lists owners with a pending reconciliation request (an account's
 *   `#account` or `#sync` event, Reactivations.ts; oldest request first, not scanning) and tracks them like
 *   failed owners, from attempt 0, in a budget of their own (`trackedMax` more): a refused scan
 *   (`busy`) keeps the request and is retried; the scan's begin clears it. An owner with a request
 *   that is already tracked as failed is woken instead (read first, on its own, so that requests the
 *   full budget cannot take do not crowd it out): its next attempt is at once, not at the end of
 *   its failure's backoff (up to 1 h). A tracked owner that is
 *   `complete` or `unknown` with no request pending is skipped (done), and so is an owner tracked
 *   for a request that a scan begun since has taken up (whoever began it: another process's scan
 *   is not superseded by a second one; a failed one is left to the failure retries).
 * - Each round also swaps owners completed by another process (another replica, or
 *   `firehook owners reconcile`) into this process's in-memory registry, under the owner row lock
 *   (when the process has one: it runs intake; the intake leader also follows them at once,
 *   RegistrySync).
 * - `stop(deadline)`: admits nothing new (no more rounds), drops sleeping owners and interrupts
 *   in-flight attempts at once (their PDS reads are cut, never awaited; each interrupted scan marks
 *   its owner failed, `interrupted`, within its own 2 s bound, so it is retried after a restart),
 *   and returns `{ drained }` = whether every attempt had ended, its mark written, by `deadline`
 *   (Clock millis).
 *
 * Time and randomness come from `Clock` and `Random`, so the whole scheduler is deterministic under
 * `TestClock` with `Random.fixed`. Health (`retryScheduler`): ready = running.
 */
import { Clock, Context, Deferred, Duration, Effect, Fiber, FiberMap, Layer, Metric, Option, Schedule } from "effect"
import * as Backoff from "../platform/Backoff.js"
import { FirehookConfig } from "../platform/Config.js"
import { Health, statsSection } from "../platform/Health.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import { StoreError } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { Registry } from "../registry/Registry.js"
import * as Metrics from "./ReconcileMetrics.js"
import { Reconciler } from "./Reconciler.js"
import { ReconcileStore } from "./ReconcileStore.js"
import * as ReconciliationConfig from "./ReconciliationConfig.js"

/** How soon a round follows a failed one (at most the interval). */
export const FAILED_ROUND_RETRY_MS = 5_000

export interface BackoffOptions {
  readonly base: Duration.DurationInput
  readonly cap: Duration.DurationInput
  /** the smallest delay (default 100 ms) */
  readonly min?: Duration.DurationInput
}

const RETRY_MIN_DELAY = Duration.millis(100)

/**
 * Full-jitter exponential backoff as a Schedule: the delay before recurrence n (n = 0, 1, …) is
 * `max(min, floor(random × min(cap, base × 2^n)))` milliseconds, `random` from the Effect `Random`.
 *
 * @since 0.1.0
 */
export const retryBackoff = (options: BackoffOptions): Schedule.Schedule<Duration.Duration> =>
  Backoff.fullJitterSchedule({ base: options.base, cap: options.cap, min: options.min ?? RETRY_MIN_DELAY })

export interface RetrySchedulerOptions {
  /**
   * failed or crashed owners tracked at most, and as many owners with a reconciliation request
   * (default: `RETRY_SCHEDULER_TRACKED_MAX` of the configuration, 16)
   */
  readonly trackedMax?: number
  /** the in-memory swap of owners completed elsewhere (undefined: no swap sync) */
  readonly swap?: ((did: string) => Effect.Effect<void, StoreError>) | undefined
  /** completed owners swapped per round at most (default 1,024) */
  readonly swapSyncMax?: number
}

/** The SPEC §5.4 default of `RETRY_SCHEDULER_TRACKED_MAX`. */
export const DEFAULT_TRACKED_MAX = ReconciliationConfig.retryScheduler.trackedMax.default
/** Highest attempt index a rediscovered owner starts at. */
const MAX_SEED_ATTEMPT = 30
const SWAP_SYNC_BATCH = 256
/** The swap sync starts this far before its first round (covers completions around startup). */
const SWAP_SYNC_MARGIN_MS = 10 * 60 * 1000

export interface TrackedOwner {
  readonly did: string
  /** the attempt index of the next attempt (its delay is base × 2^attempt, jittered) */
  readonly attempt: number
  readonly inFlight: boolean
}

export interface RetrySchedulerStats {
  readonly running: boolean
  readonly infrastructureHealthy: boolean
  readonly tracked: number
  readonly inFlight: number
  readonly attempts: number
  readonly recovered: number
}

export interface RetrySchedulerShape {
  /** One round: list candidates, track them, swap owners completed elsewhere. */
  readonly tick: Effect.Effect<void, StoreError>
  /**
   * Stop: admit nothing new, interrupt in-flight attempts at once; `drained` = every attempt ended
   * (interrupted scans marked failed) by `deadline` (Clock millis).
   */
  readonly stop: (deadline: number) => Effect.Effect<{ readonly drained: boolean }>
  readonly tracked: Effect.Effect<ReadonlyArray<TrackedOwner>>
  readonly stats: Effect.Effect<RetrySchedulerStats>
}

export class RetryScheduler extends Context.Tag("firehook/RetryScheduler")<RetryScheduler, RetrySchedulerShape>() {}

interface Entry {
  attempt: number
  inFlight: boolean
  /** tracked for a reconciliation request (Reactivations.ts), not for a failure */
  readonly requested: boolean
  /** completed to cut the current backoff delay short (a request for an owner tracked as failed) */
  wake: Deferred.Deferred<void> | undefined
  /** the last attempt's PDS asked for this long (`Retry-After`, ms): waited before the backoff */
  retryAfterMs: number | undefined
}

/**
 * The wait the owner's PDS asked for (`Retry-After`, at most `capMs`), taken once. A request that
 * comes meanwhile does not cut it short (the PDS would be asked again at once): it completes the
 * entry's `wake`, which then cuts the backoff's delay that follows.
 */
const pdsWait = (entry: Entry, capMs: number): Effect.Effect<void> =>
  Effect.suspend(() => {
    const ms = entry.retryAfterMs
    entry.retryAfterMs = undefined
    return ms === undefined ? Effect.void : Effect.sleep(Duration.millis(Math.min(ms, capMs)))
  })

/** Owners tracked for a request (`true`) or for a failure (`false`). */
const trackedOf = (entries: ReadonlyMap<string, Entry>, requested: boolean) => {
  let n = 0
  for (const e of entries.values()) if (e.requested === requested) n++
  return n
}

/**
 * One round of `tick` as its success: a defect is logged as such; a failure marks the
 * infrastructure unhealthy (`setHealthy(false)`) and is warned about at most once a minute per code
 * (a failed round is followed within 5 s).
 */
const roundOutcome = (
  tick: Effect.Effect<void, StoreError>,
  roundLog: RateLimitedLog.RateLimitedLog,
  setHealthy: (healthy: boolean) => void
): Effect.Effect<boolean> =>
  tick.pipe(
    Effect.as(true),
    Effect.catchAllDefect(() =>
      roundLog.run("died", (suppressed) =>
        Effect.logError("retry scheduler round died unexpectedly").pipe(Effect.annotateLogs({ suppressed }))).pipe(
          Effect.zipRight(Effect.fail(new StoreError({ op: "retryScheduler.tick", code: "defect" })))
        )
    ),
    Effect.catchAll((e) =>
      Effect.sync(() =>
        setHealthy(false)
      ).pipe(
        Effect.zipRight(roundLog.run(e.code, (suppressed) =>
          Effect.logWarning("retry scheduler round failed").pipe(
            Effect.annotateLogs({ op: e.op, code: e.code, suppressed })
          ))),
        Effect.as(false)
      )
    )
  )

/**
 * Builds the scheduler and forks its periodic rounds into the current scope. Requires the
 * configuration, the reconcile store and the reconciler.
 */
export const make = (options: RetrySchedulerOptions = {}) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const store = yield* ReconcileStore
    const reconciler = yield* Reconciler
    const scope = yield* Effect.scope
    const cfg = config.retryScheduler
    const trackedMax = Math.max(1, Math.floor(options.trackedMax ?? cfg.trackedMax))
    const swapSyncMax = Math.max(SWAP_SYNC_BATCH, Math.floor(options.swapSyncMax ?? 4 * SWAP_SYNC_BATCH))
    const permits = yield* Effect.makeSemaphore(cfg.concurrency)
    const owners = yield* FiberMap.make<string, void, never>()
    const entries = new Map<string, Entry>()
    const state = { running: true, stopping: false, infrastructureHealthy: true, attempts: 0, recovered: 0 }
    let swapCursor: string | undefined
    let stopResult: Deferred.Deferred<{ readonly drained: boolean }> | undefined

    /** One attempt; true when the owner no longer needs retrying. */
    const attemptOnce = (did: string, entry: Entry) =>
      Effect.gen(function*() {
        const current = yield* store.ownerState(did)
        // an owner tracked for a request is done once a scan has begun since the request, whoever
        // began it (its begin cleared the stamp): a begin here would supersede a scan running in
        // another process; if that scan fails, the owner is the failure retries' (retryCandidates).
        // An owner tracked as failed likewise once it completed or a scan of it is running (a sweep's,
        // or another replica's): that scan's failure, or its crash (stale after `staleScanMs`),
        // lists it again
        const settled = current === undefined || (entry.requested
          ? !current.reconcileRequested
          : current.status !== "failed" && !current.reconcileRequested)
        if (settled) {
          yield* Metric.increment(Metrics.retrySchedulerAttempts({ result: "skipped" }))
          return true
        }
        state.attempts++
        const outcome = yield* reconciler.reconcile(did)
        entry.retryAfterMs = outcome._tag === "failed" ? outcome.retryAfterMs : undefined
        state.infrastructureHealthy = true
        const done = outcome._tag === "complete" || outcome._tag === "superseded"
        if (done) state.recovered++
        yield* Metric.increment(Metrics.retrySchedulerAttempts({ result: done ? "recovered" : "failed" }))
        return done
      }).pipe(
        Effect.catchAllDefect(() => Effect.logError("retry attempt died unexpectedly").pipe(Effect.as(false))),
        Effect.catchAll((e) =>
          Effect.sync(() => {
            state.infrastructureHealthy = false
          }).pipe(
            Effect.zipRight(
              Effect.logWarning("retry attempt failed").pipe(Effect.annotateLogs({ op: e.op, code: e.code }))
            ),
            Effect.as(false)
          )
        ),
        Effect.ensuring(
          Effect.sync(() => {
            entry.inFlight = false
          })
        )
      )

    const ownerLoop = (did: string, entry: Entry) =>
      Effect.gen(function*() {
        const baseMs = cfg.baseMs * Math.pow(2, entry.attempt)
        const driver = yield* Schedule.driver(
          retryBackoff({ base: Duration.millis(baseMs), cap: Duration.millis(cfg.maxMs) })
        )
        for (;;) {
          if (state.stopping) return
          const wake = yield* Deferred.make<void>()
          entry.wake = wake
          yield* pdsWait(entry, cfg.maxMs)
          // the backoff's delay, unless a round wakes the owner first (a reconciliation request for
          // an owner tracked as failed: it must not wait for its failure's backoff, up to 1 h);
          // the Schedule's state has advanced either way
          yield* Effect.raceFirst(driver.next(undefined).pipe(Effect.ignore), Deferred.await(wake))
          entry.wake = undefined
          if (state.stopping) return
          const atCap = cfg.baseMs * Math.pow(2, entry.attempt) >= cfg.maxMs
          const done = yield* permits.withPermits(1)(
            Effect.suspend(() => {
              if (state.stopping) return Effect.succeed(true)
              entry.inFlight = true
              return attemptOnce(did, entry)
            })
          )
          if (done) return
          entry.attempt = Math.min(entry.attempt + 1, 1_000)
          // released at the cap: rediscovered later (oldest failure first) so others get their turn
          if (atCap) return
        }
      }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            if (entries.get(did) === entry) entries.delete(did)
          })
        )
      )

    const track = (did: string, failureCount: number, requested: boolean) =>
      Effect.suspend(() => {
        if (state.stopping || entries.has(did) || trackedOf(entries, requested) >= trackedMax) return Effect.void
        const entry: Entry = {
          attempt: Math.min(MAX_SEED_ATTEMPT, Math.max(0, failureCount - 1)),
          inFlight: false,
          requested,
          wake: undefined,
          retryAfterMs: undefined
        }
        entries.set(did, entry)
        return FiberMap.run(owners, did, ownerLoop(did, entry)).pipe(Effect.asVoid)
      })

    const swapSync = (swap: (did: string) => Effect.Effect<void, StoreError>) =>
      Effect.gen(function*() {
        let cursor = swapCursor ?? (yield* store.completedCursor(SWAP_SYNC_MARGIN_MS))
        for (let swapped = 0; swapped < swapSyncMax;) {
          const batch = yield* store.completedSince(cursor, SWAP_SYNC_BATCH)
          // under the owner's lock, and only while it is still complete: a scan begun since the
          // completion was read has written pages that must stay in the database only (SPEC §5.3)
          for (const did of batch.dids) {
            yield* store.withOwnerLock(
              did,
              Effect.flatMap(store.ownerState(did), (st) => (st?.status === "complete" ? swap(did) : Effect.void))
            )
          }
          swapped += batch.dids.length
          cursor = batch.cursor
          swapCursor = cursor
          if (batch.dids.length < SWAP_SYNC_BATCH) break
        }
        swapCursor = cursor
      })

    const tick: Effect.Effect<void, StoreError> = Effect.gen(function*() {
      if (state.stopping) return
      // an owner already tracked as failed with a request pending is woken: its next attempt is
      // now, not at the end of its failure's backoff. Read on its own (at most the failed owners
      // tracked, none read when there are none), outside the requests' budget: older requests that
      // the full budget cannot take must not crowd it out
      const trackedFailed = [...entries].filter(([, e]) => !e.requested).map(([did]) => did)
      if (trackedFailed.length > 0) {
        const woken = yield* store.reconcileRequests({
          limit: trackedFailed.length,
          staleScanMs: cfg.staleScanMs,
          exclude: [],
          only: trackedFailed
        })
        for (const did of woken) {
          const wake = entries.get(did)?.wake
          if (wake !== undefined) yield* Deferred.succeed(wake, undefined)
        }
      }
      // then requested owners (an `#account` or `#sync` event) not tracked yet, in their own budget:
      // failing owners holding every slot for hours must not hold a reactivated owner back
      const freeRequests = trackedMax - trackedOf(entries, true)
      if (freeRequests > 0) {
        const requested = yield* store.reconcileRequests({
          limit: freeRequests,
          staleScanMs: cfg.staleScanMs,
          exclude: [...entries.keys()]
        })
        for (const did of requested) yield* track(did, 0, true)
      }
      const free = trackedMax - trackedOf(entries, false)
      if (free > 0) {
        const candidates = yield* store.retryCandidates({
          limit: free,
          staleScanMs: cfg.staleScanMs,
          exclude: [...entries.keys()]
        })
        for (const c of candidates) yield* track(c.did, c.failureCount, false)
      }
      if (options.swap !== undefined) yield* swapSync(options.swap)
      state.infrastructureHealthy = true
    }).pipe(Effect.withSpan("RetryScheduler.tick"))

    const roundLog = RateLimitedLog.make()
    /** the round's success: a failed one is followed by the next after {@link FAILED_ROUND_RETRY_MS} */
    const round: Effect.Effect<boolean> = roundOutcome(tick, roundLog, (healthy) => {
      state.infrastructureHealthy = healthy
    })
    // the first round at start (owners failed or crashed before this process started are not left
    // waiting a whole interval), then one every interval; after a failed round (the database
    // unreachable) the next comes within 5 s, so that the scheduler, and `infrastructureHealthy` in
    // health, recover seconds after the database does rather than a whole interval later
    const pause = (ok: boolean) =>
      Duration.millis(ok ? cfg.intervalMs : Math.min(cfg.intervalMs, FAILED_ROUND_RETRY_MS))
    const rounds = Effect.forever(Effect.flatMap(round, (ok) => Effect.sleep(pause(ok)))).pipe(
      Effect.ensuring(
        Effect.sync(() => {
          state.running = false
        })
      )
    )
    const roundsFiber = yield* Effect.forkIn(rounds, scope)

    const runStop = (deadline: number) =>
      Effect.gen(function*() {
        state.stopping = true
        state.running = false
        yield* Fiber.interrupt(roundsFiber)
        // every owner fiber is interrupted at once, in-flight attempts too (their PDS reads are cut,
        // not awaited); an interrupted scan marks itself failed (`interrupted`, bounded), and that
        // is what the deadline bounds
        const interrupted = [...entries.values()].filter((e) => e.inFlight).length
        yield* Effect.forEach([...owners].map(([, fiber]) => fiber), Fiber.interruptFork, { discard: true })
        const now = yield* Clock.currentTimeMillis
        const drained = yield* FiberMap.awaitEmpty(owners).pipe(
          Effect.as(true),
          Effect.timeoutTo({
            duration: Duration.millis(Math.max(0, deadline - now)),
            onSuccess: (x) => x,
            onTimeout: () => false
          })
        )
        yield* Effect.logInfo("retry scheduler stopped").pipe(Effect.annotateLogs({ drained, interrupted }))
        return { drained }
      })

    const stop = (deadline: number) =>
      Effect.suspend(() => {
        if (stopResult !== undefined) return Deferred.await(stopResult)
        const result = Deferred.unsafeMake<{ readonly drained: boolean }>(roundsFiber.id())
        stopResult = result
        return runStop(deadline).pipe(
          Effect.tap((r) => Deferred.succeed(result, r)),
          Effect.onInterrupt(() => Deferred.succeed(result, { drained: false }))
        )
      })

    const shape: RetrySchedulerShape = {
      tick,
      stop,
      tracked: Effect.sync(() => [...entries].map(([did, e]) => ({ did, attempt: e.attempt, inFlight: e.inFlight }))),
      stats: Effect.sync(() => ({
        running: state.running,
        infrastructureHealthy: state.infrastructureHealthy,
        tracked: entries.size,
        inFlight: [...entries.values()].filter((e) => e.inFlight).length,
        attempts: state.attempts,
        recovered: state.recovered
      }))
    }
    return shape
  })

/** The health section (ready = running). */
export const healthSection = (scheduler: RetrySchedulerShape) =>
  statsSection(
    scheduler.stats,
    ["running", "infrastructureHealthy", "tracked", "inFlight", "attempts", "recovered"],
    (s) => s.running
  )

/**
 * The running scheduler (rounds start when the layer is built), with its health section
 * (`retryScheduler`) and its shutdown stages: `scheduler-begin` starts `stop` with a deadline of
 * half the shutdown timeout, `scheduler-await` waits for its result (an undrained stop is logged,
 * not an unclean shutdown: a scan whose `interrupted` mark is still unwritten at exit stays
 * `scanning` until a restarted scheduler lists it as crashed).
 */
export const layer = (
  options: Omit<RetrySchedulerOptions, "swap"> = {}
): Layer.Layer<RetryScheduler, never, FirehookConfig | ReconcileStore | Reconciler | Health | Lifecycle> =>
  Layer.scoped(
    RetryScheduler,
    Effect.gen(function*() {
      // the swap sync needs an in-memory registry: without one (no intake here) there is none to
      // keep in step (the intake leader follows completions itself, RegistrySync)
      const registry = yield* Effect.serviceOption(Registry)
      const config = yield* FirehookConfig
      const scheduler = yield* make({
        ...options,
        swap: Option.isSome(registry) ? (did) => registry.value.swapOwner(did) : undefined
      })
      const health = yield* Health
      const lifecycle = yield* Lifecycle
      const scope = yield* Effect.scope
      const stopped = yield* Deferred.make<{ readonly drained: boolean }>()
      yield* health.register("retryScheduler", healthSection(scheduler))
      yield* lifecycle.registerStop(
        "scheduler-begin",
        "scheduler-begin",
        Effect.gen(function*() {
          const deadline = (yield* Clock.currentTimeMillis) + Math.floor(config.shutdownTimeoutMs / 2)
          yield* Effect.forkIn(Deferred.complete(stopped, scheduler.stop(deadline)), scope)
        })
      )
      yield* lifecycle.registerStop(
        "scheduler-await",
        "scheduler-await",
        Effect.flatMap(
          Deferred.await(stopped),
          ({ drained }) =>
            drained
              ? Effect.void
              : Effect.logWarning("retry scheduler interrupted reconciliations still unfinished at its deadline")
        )
      )
      return scheduler
    })
  )
