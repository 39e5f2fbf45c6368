/**
 * The delivery worker's loops (SPEC §4.1, §6.3): the claim loop, LISTEN, the reclaim loop, stop,
 * and what it reports (stats and the `delivery` health section, whose backlog counts are cached:
 * CountsCache.ts).
 *
 * Claiming. One loop fiber claims rows in batches. It wakes on `LISTEN firehook_outbox`, on a poll
 * timer (fallback), at once again after a full batch, and when an attempt finishes while more rows
 * were left due. It only claims as many rows as it can hold, and while a request slot is idle it
 * always claims (a start-only claim once the hold is used up): see Admission.claimPlan.
 *
 * Open circuits. The mover (Parking.ts) moves an open origin's pending rows past its cool-down in
 * bulk, and the claim skips open origins, so their backlog never stalls the others (SPEC §4.3).
 *
 * Reclaim. Every 2 s the worker confirms its liveness mark and frees the rows of workers whose mark
 * is gone (dead processes), so they are claimed within seconds (see DeliveryStore).
 *
 * Shutdown: stop claiming, hand rows that have not started back at once, wait up to the grace
 * period for running attempts; then (or when the shutdown deadline interrupts it) interrupt them
 * (their rows stay leased until the lease expires, or until this process's liveness mark is gone
 * with its connections, and another worker reclaims them).
 *
 * @since 0.1.0
 */
import { Cause, Clock, Deferred, Duration, Effect, Either, Exit, Fiber, FiberSet, Option, Queue, Stream } from "effect"
import type { Scope } from "effect"
import { exponential } from "../platform/Backoff.js"
import * as ErrorCode from "../platform/ErrorCode.js"
import { type HealthSection, statsSection } from "../platform/Health.js"
import { claimOptions, claimPlan, dispatch, pumpNow, RELEASE_TIMEOUT, releaseWaiting } from "./Admission.js"
import * as CountsCache from "./CountsCache.js"
import { RECLAIM_INTERVAL_MS, STATEMENT_TIMEOUT } from "./DeliveryStore.js"
import { heartbeatLoop, monotonicMs, renewAll } from "./Leases.js"
import { parkLoop } from "./Parking.js"
import { logRecurring, logStoreError } from "./Telemetry.js"
import type { WorkerEnv } from "./WorkerState.js"

/** Poll fallback when no notification arrives. */
export const DEFAULT_POLL_INTERVAL_MS = 1_000
/** Largest claim. */
export const CLAIM_BATCH_MAX = 256
/**
 * Minimum time between two claims when the previous one was not full: a short window in which the
 * notifications of several enqueue transactions share one claim. Claims never overlap (one loop),
 * so the claim rate is bounded by the claims' own duration anyway; 2 ms rather than 10 cut the
 * median enqueue → first attempt at a steady 500/s from 16 to 9–10 ms with no measurable CPU cost
 * (docs/benchmarks.md, "End to end", item 3).
 */
export const MIN_CLAIM_GAP_MS = 2
/** LISTEN is confirmed by notifying ourselves up to this many times, this often. */
export const LISTEN_PROBE_TRIES = 50
export const LISTEN_PROBE_EVERY = Duration.millis(100)

export interface DeliveryStats {
  readonly workerId: string
  /** LISTEN is established (a notification has been received on the current connection) */
  readonly listening: boolean
  readonly stopping: boolean
  /** rows claimed and not yet settled (in flight + waiting for a permit) */
  readonly held: number
  readonly inFlight: number
  readonly openCircuits: number
  /** rows the mover rescheduled in bulk (open circuits) since start */
  readonly parkedRows: number
  /** parked rows made due again early (their origin recovered before the time they were parked to) */
  readonly unparkedRows: number
  readonly claims: number
  /** total time spent in claim statements, ms */
  readonly claimMs: number
  /** requests sent */
  readonly attempts: number
}

// ---------------------------------------------------------------------------------------------
// The claim loop

export const claimLoop = (env: WorkerEnv) =>
  Effect.gen(function*() {
    const state = env.state
    const pollIntervalMs = env.pollIntervalMs
    let nextPollAt = 0
    let lastClaimAt = Number.NEGATIVE_INFINITY
    let lastFull = false
    let moreDue = false
    let failures = 0
    while (!state.stopping) {
      const now = yield* Clock.currentTimeMillis
      const due = state.notified || now >= nextPollAt || lastFull || (moreDue && state.freed)
      const plan = claimPlan(env, CLAIM_BATCH_MAX)
      const canClaim = plan !== undefined
      if (due && plan !== undefined) {
        const gap = lastFull ? 0 : lastClaimAt + MIN_CLAIM_GAP_MS - now
        if (gap > 0) {
          yield* Effect.sleep(Duration.millis(gap))
          continue
        }
        state.notified = false
        state.freed = false
        const limit = plan.limit
        state.claiming = true
        const claimStartMonotonic = yield* monotonicMs
        const result = yield* Effect.either(
          env.store.claim(env.workerId, limit, env.leaseMs, claimOptions(env, plan.startOnly))
        )
        state.claiming = false
        const claimedAt = yield* Clock.currentTimeMillis
        state.claimMs += Math.max(0, claimedAt - now)
        state.claims++
        lastClaimAt = claimedAt
        nextPollAt = claimedAt + pollIntervalMs
        if (Either.isLeft(result)) {
          failures++
          lastFull = false
          moreDue = false
          state.markInDoubt = true
          yield* logStoreError(env, result.left)
          yield* Effect.sleep(exponential(100, 5_000, failures))
          continue
        }
        failures = 0
        // the walk failed after the window's rows were leased: those rows go out; the failure is
        // handled as a failed claim's is (logged, the liveness mark in doubt), without the backoff
        if (result.right.failure !== undefined) {
          state.markInDoubt = true
          yield* logStoreError(env, result.right.failure)
        }
        // a row's times count from the claim's start, as the database's do: its lease runs from the
        // claim transaction's now(), its age (ageMs) and the subscription snapshot were read then
        for (const row of result.right.rows) dispatch(env, row, now, claimStartMonotonic)
        yield* Effect.sync(() => pumpNow(env))
        lastFull = result.right.rows.length >= limit
        moreDue = result.right.moreDue
        if (lastFull) continue
      }
      const after = yield* Clock.currentTimeMillis
      const wait = canClaim ? Math.max(1, nextPollAt - after) : pollIntervalMs
      yield* Queue.take(env.wake).pipe(Effect.timeoutOption(Duration.millis(wait)))
    }
  })

// ---------------------------------------------------------------------------------------------
// Liveness and reclaim (SPEC §4.1)

/**
 * At start and every {@link RECLAIM_INTERVAL_MS}: hold this worker's liveness mark (re-taken on a
 * new claim connection after the old one was lost) and free the rows of workers whose mark is gone,
 * so that rows of a dead process are claimed within seconds instead of after their lease.
 *
 * After a statement on the claim connection failed (a claim, or this confirmation), the mark may
 * have been gone for a moment and other workers may have freed and taken this worker's rows: once
 * the mark is confirmed again, every held lease is renewed at once instead of at the next
 * heartbeat (up to a third of a lease later). A row another worker took is then given up (its
 * request interrupted) within seconds; one only freed, not yet taken, is this worker's again.
 */
export const reclaimLoop = (env: WorkerEnv) =>
  Effect.forever(
    Effect.zipRight(
      env.store.reclaimAbandoned(env.workerId).pipe(
        Effect.flatMap(({ held }) =>
          Effect.zipRight(
            held
              ? Effect.void
              : logRecurring(env, "mark_not_held", "delivery liveness mark held elsewhere; leases only", {}),
            Effect.suspend(() => {
              if (!env.state.markInDoubt) return Effect.void
              env.state.markInDoubt = false
              return renewAll(env)
            })
          )
        ),
        Effect.catchAll((e) =>
          Effect.zipRight(Effect.sync(() => (env.state.markInDoubt = true)), logStoreError(env, e))
        )
      ),
      Effect.sleep(Duration.millis(RECLAIM_INTERVAL_MS))
    )
  )

// ---------------------------------------------------------------------------------------------
// LISTEN

const onNotification = (env: WorkerEnv, listened: Deferred.Deferred<void>) =>
  Effect.gen(function*() {
    const state = env.state
    state.notified = true
    if (!state.listening) {
      state.listening = true
      yield* Deferred.succeed(listened, undefined)
    }
    yield* Queue.offer(env.wake, undefined)
  })

/** Notify ourselves until the first notification arrives on this LISTEN session. */
const probe = (env: WorkerEnv) =>
  Effect.gen(function*() {
    for (let i = 0; i < LISTEN_PROBE_TRIES && !env.state.listening; i++) {
      yield* env.store.notify.pipe(Effect.ignore)
      yield* Effect.sleep(LISTEN_PROBE_EVERY)
    }
  })

export const listenLoop = (env: WorkerEnv, listened: Deferred.Deferred<void>) =>
  Effect.gen(function*() {
    const state = env.state
    const notified = onNotification(env, listened)
    let failures = 0
    while (!state.stopping) {
      const session = Effect.scoped(
        Effect.gen(function*() {
          yield* Effect.forkScoped(probe(env))
          yield* env.store.wakeups.pipe(Stream.runForEach(() => notified))
        })
      )
      const result = yield* Effect.either(session)
      // a session that had worked starts the backoff over
      failures = state.listening ? 1 : failures + 1
      state.listening = false
      if (Either.isLeft(result)) yield* logStoreError(env, result.left)
      yield* Effect.sleep(exponential(250, 30_000, failures))
    }
  })

// ---------------------------------------------------------------------------------------------
// A loop's defect

/** The worker's loops, as {@link surviving} names them in its log line. */
export type LoopName = "claim" | "heartbeat" | "reclaim" | "park" | "listen"

/** A loop that ran this long before its defect starts its restart backoff over. */
export const LOOP_RESTART_RESET_MS = 60_000

/**
 * Runs one of the worker's loops so that a defect (a bug) in it does not end it for good: each loop
 * handles its own typed errors, but a defect ended its fiber silently, and a worker without its
 * claim loop (or its heartbeat, or its reclaim) stayed ready while it delivered nothing. The
 * defect is logged at error, by loop and class name only (a cause could carry values), at most
 * once per log window for each loop, and the loop starts again after a backoff (1 s doubling to
 * 60 s, from 1 s again after a run of {@link LOOP_RESTART_RESET_MS}). The loop's return, a typed
 * failure and an interruption are passed on. The guard wraps the whole loop: a step of the loop
 * costs what it did.
 */
export const surviving = <E, R>(
  env: Pick<WorkerEnv, "log">,
  loop: LoopName,
  run: Effect.Effect<void, E, R>
): Effect.Effect<void, E, R> =>
  Effect.gen(function*() {
    let defects = 0
    // bounded: each round waits its backoff; the loop ends when `run` returns, fails or is interrupted
    for (;;) {
      const startedAt = yield* Clock.currentTimeMillis
      const exit = yield* Effect.exit(run)
      if (Exit.isSuccess(exit) || Cause.isInterruptedOnly(exit.cause)) return yield* exit
      const defect = Cause.dieOption(exit.cause)
      if (Option.isNone(defect)) return yield* exit
      const ranMs = (yield* Clock.currentTimeMillis) - startedAt
      defects = ranMs >= LOOP_RESTART_RESET_MS ? 1 : defects + 1
      const wait = exponential(1_000, 60_000, defects - 1)
      yield* env.log.run(`defect:${loop}`, (suppressed) =>
        Effect.logError("delivery worker loop survived a defect; restarting it").pipe(
          Effect.annotateLogs({
            loop,
            kind: "defect",
            defect: ErrorCode.className(defect.value) ?? "unknown",
            restartInMs: Duration.toMillis(wait),
            suppressed
          })
        ))
      yield* Effect.sleep(wait)
    }
  })

// ---------------------------------------------------------------------------------------------
// Start, stop, health

/**
 * Starts the loops for the lifetime of the scope and answers the worker's stop: stop claiming,
 * hand back rows not started, wait the grace period, interrupt the rest. Idempotent.
 */
export const start = (
  env: WorkerEnv,
  options: {
    readonly listen: boolean
    readonly listened: Deferred.Deferred<void>
    /** the shutdown's deadline once it has started (Lifecycle); none: the grace period alone */
    readonly shutdownDeadline?: Effect.Effect<Option.Option<number>>
    /** how long before that deadline the grace period ends at the latest ({@link stopReserveMs}) */
    readonly stopReserveMs?: number
  }
): Effect.Effect<Effect.Effect<void>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const state = env.state
    const rows = env.rows
    const stopped = yield* Deferred.make<void>()
    // each loop survives a defect of its own: logged, and started again after a backoff
    const loopFiber = yield* Effect.forkScoped(surviving(env, "claim", claimLoop(env)))
    yield* Effect.forkScoped(surviving(env, "heartbeat", heartbeatLoop(env)))
    yield* Effect.forkScoped(surviving(env, "reclaim", reclaimLoop(env)))
    yield* Effect.forkScoped(surviving(env, "park", parkLoop(env)))
    const listenFiber = options.listen
      ? yield* Effect.forkScoped(surviving(env, "listen", listenLoop(env, options.listened)))
      : undefined
    // runs first when the scope closes (before the fibers above are interrupted): nothing new
    // starts, and rows that have not started are handed back
    yield* Effect.addFinalizer(() =>
      Effect.zipRight(
        Effect.sync(() => {
          state.stopping = true
        }),
        releaseWaiting(env)
      )
    )

    const stop: Effect.Effect<void> = Effect.suspend(() => {
      if (state.stopStarted) return Deferred.await(stopped)
      state.stopStarted = true
      return Effect.gen(function*() {
        state.stopping = true
        // a claim in progress is let finish: its rows are dispatched, see `stopping` and go back
        // (a stopping worker's claim skips its origin walk: one statement's bound is enough)
        if (state.claiming) {
          yield* Queue.offer(env.wake, undefined)
          yield* Fiber.await(loopFiber).pipe(Effect.timeoutOption(Duration.sum(STATEMENT_TIMEOUT, Duration.seconds(1))))
        }
        yield* Fiber.interrupt(loopFiber)
        if (listenFiber !== undefined) yield* Fiber.interrupt(listenFiber)
        // rows waiting for a request slot go back at once
        yield* releaseWaiting(env)
        // the grace period ends before the shutdown's deadline, so that the stop stays clean
        const now = yield* Clock.currentTimeMillis
        const deadline = options.shutdownDeadline === undefined ? Option.none() : yield* options.shutdownDeadline
        const graceMs = Option.match(deadline, {
          onNone: () => env.graceMs,
          onSome: (d) => Math.max(0, Math.min(env.graceMs, d - (options.stopReserveMs ?? 0) - now))
        })
        const drained = yield* FiberSet.awaitEmpty(rows).pipe(Effect.timeoutOption(Duration.millis(graceMs)))
        if (Option.isNone(drained)) {
          yield* Effect.logWarning("delivery grace period over; interrupting running attempts").pipe(
            Effect.annotateLogs({ inFlight: state.inFlight })
          )
          const cut = runningTokens(env)
          yield* FiberSet.clear(rows)
          // their rows stay leased (SPEC §6.3); their reclaim is no crash suspect's death
          yield* env.store.cutShort(cut).pipe(
            Effect.timeout(RELEASE_TIMEOUT),
            Effect.catchAll(() => logRecurring(env, "cut_short", "delivery stop could not mark cut-off attempts", {}))
          )
        }
      }).pipe(
        // the shutdown deadline interrupts the drain: interrupt running attempts too (rows stay leased)
        Effect.onInterrupt(() => FiberSet.clear(rows)),
        Effect.ensuring(Deferred.succeed(stopped, undefined))
      )
    })
    return stop
  })

/** The lease tokens of the rows whose attempt has started and not been settled yet. */
const runningTokens = (env: WorkerEnv): ReadonlyArray<string> => {
  const tokens: Array<string> = []
  for (const [token, entry] of env.state.entries) if (entry.started) tokens.push(token)
  return tokens
}

/**
 * How long before the shutdown's deadline the delivery worker's grace period ends at the latest: a
 * quarter of `SHUTDOWN_TIMEOUT_MS`, at most 2.5 s. It leaves room for marking the attempts cut off,
 * for the stages after `delivery`, and, in a delivery child, for the parent's earlier start of the
 * same deadline (its stages before `delivery` ran before the child's SIGTERM).
 */
export const stopReserveMs = (shutdownTimeoutMs: number): number =>
  Math.min(STOP_RESERVE_MAX_MS, Math.floor(shutdownTimeoutMs / 4))

/** The largest {@link stopReserveMs}. */
export const STOP_RESERVE_MAX_MS = 2_500

export const stats = (env: WorkerEnv): Effect.Effect<DeliveryStats> =>
  Effect.map(Clock.currentTimeMillis, (now): DeliveryStats => {
    const state = env.state
    return {
      workerId: env.workerId,
      listening: state.listening,
      stopping: state.stopping,
      held: state.held,
      inFlight: state.inFlight,
      openCircuits: env.breaker.openCount(now),
      parkedRows: state.parkedRows,
      unparkedRows: state.unparkedRows,
      claims: state.claims,
      claimMs: state.claimMs,
      attempts: state.attempts
    }
  })

const HEALTH_KEYS = [
  "pending",
  "leased",
  "deadLetter",
  "inFlight",
  "openCircuits",
  "autoDisabledWebhooks",
  "goneWebhooks",
  "stale"
] as const

/** What the `delivery` health section reads of a worker. */
export type HealthEnv = Pick<WorkerEnv, "state" | "breaker" | "log"> & {
  readonly store: Pick<WorkerEnv["store"], "counts">
}

/**
 * The `delivery` health section, for the lifetime of the scope: the backlog counts from a cache
 * refreshed in the background (CountsCache: a health request never waits on the database; `stale`
 * when the counts are older than 5 s) and the worker's load (in memory).
 */
export const healthSection = (env: HealthEnv): Effect.Effect<Effect.Effect<HealthSection>, never, Scope.Scope> =>
  Effect.map(
    CountsCache.make({
      counts: env.store.counts,
      stopped: () => env.state.stopping,
      onError: (e) => logStoreError(env, e)
    }),
    (cache) =>
      statsSection(
        Effect.gen(function*() {
          const { counts, stale } = yield* cache.read
          const now = yield* Clock.currentTimeMillis
          return {
            pending: counts.pending,
            leased: counts.leased,
            deadLetter: counts.deadLetter,
            inFlight: env.state.inFlight,
            openCircuits: env.breaker.openCount(now),
            autoDisabledWebhooks: counts.autoDisabledWebhooks,
            goneWebhooks: counts.goneWebhooks,
            stale
          }
        }),
        HEALTH_KEYS
      )
  )
