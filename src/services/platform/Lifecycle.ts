/**
 * The phase machine (SPEC §6.1) and the ordered, idempotent shutdown (SPEC §6.3).
 *
 * Services register a drain for a named stage when they start. `shutdown` sets the phase to
 * `stopping`, then runs the stages in the order of §6.3, each drain `interruptible` and cut at the
 * shared deadline (now + SHUTDOWN_TIMEOUT_MS, or earlier: `capDeadline`), so a hung part can never
 * hold the process: it is interrupted and the shutdown is reported as not clean. Shared clients (Redis, the database) are
 * closed only when every part stopped cleanly; `isClean` is what their finalizers consult.
 */
import { Clock, Context, Deferred, Duration, Effect, Layer, Option, Ref, Scope, SubscriptionRef } from "effect"
import type { Exit } from "effect"

export type Phase = "starting" | "reconciling-live" | "live" | "stopping" | "stopped" | "failed"

/**
 * Shutdown stages, in the order they run (SPEC §6.3). `startup` first: a signal that arrives while
 * the service is still starting stops the startup (within the same deadline), then the parts it
 * started so far stop in the order below (SPEC §6.1).
 */
export const STOP_STAGES = [
  "startup",
  "backfill",
  "scheduler-begin",
  "http",
  "intake-stop",
  "intake-drain",
  "delivery",
  "scheduler-await",
  "shared-clients"
] as const
export type StopStage = (typeof STOP_STAGES)[number]

export interface ShutdownReport {
  readonly clean: boolean
  /** names of the parts that failed or missed the deadline */
  readonly unclean: ReadonlyArray<string>
}

export interface LifecycleShape {
  readonly phase: Effect.Effect<Phase>
  readonly phases: SubscriptionRef.SubscriptionRef<Phase>
  readonly setPhase: (phase: Phase) => Effect.Effect<void>
  /** Register a drain that runs at `stage` during shutdown. */
  readonly registerStop: (stage: StopStage, name: string, drain: Effect.Effect<void, unknown>) => Effect.Effect<void>
  /** Run the shutdown once; later calls wait for the first one and return its report. */
  readonly shutdown: Effect.Effect<ShutdownReport>
  /** false once a shutdown found a part that did not stop cleanly */
  readonly isClean: Effect.Effect<boolean>
  /** the report, once a shutdown has finished */
  readonly report: Effect.Effect<Option.Option<ShutdownReport>>
  /**
   * The shutdown's deadline (the Clock's milliseconds), once the shutdown has started: a part whose
   * drain waits (the delivery worker's grace period) ends its wait before it, so that it stops
   * cleanly instead of being cut off by it.
   */
  readonly deadline: Effect.Effect<Option.Option<number>>
  /**
   * Bring the shutdown's deadline forward to `at` (the Clock's milliseconds) when it is later: at
   * once when the shutdown has started (the stages not yet cut are cut at it), else when it starts.
   * The delivery child's parent gives it its own deadline this way (DeliveryChild.followParent).
   */
  readonly capDeadline: (at: number) => Effect.Effect<void>
}

export class Lifecycle extends Context.Tag("firehook/Lifecycle")<Lifecycle, LifecycleShape>() {}

interface Registered {
  readonly stage: StopStage
  readonly name: string
  readonly drain: Effect.Effect<void, unknown>
}

export const make = (options: { readonly shutdownTimeout: Duration.DurationInput }) =>
  Effect.gen(function*() {
    const phases = yield* SubscriptionRef.make<Phase>("starting")
    const registered = yield* Ref.make<ReadonlyArray<Registered>>([])
    const started = yield* Ref.make(false)
    const done = yield* Deferred.make<ShutdownReport>()
    const clean = yield* Ref.make(true)
    /** the shutdown's deadline once it started; the earliest cap given (before or after that) */
    const deadlineRef = yield* Ref.make<{ readonly at: Option.Option<number>; readonly cap: Option.Option<number> }>(
      { at: Option.none(), cap: Option.none() }
    )
    const timeoutMs = Duration.toMillis(Duration.decode(options.shutdownTimeout))

    const runStages = Effect.gen(function*() {
      yield* SubscriptionRef.set(phases, "stopping")
      yield* Effect.logInfo("shutdown started").pipe(Effect.annotateLogs({ phase: "stopping", timeoutMs }))
      const own = (yield* Clock.currentTimeMillis) + timeoutMs
      yield* Ref.update(deadlineRef, (d) => ({
        ...d,
        at: Option.some(Option.match(d.cap, { onNone: () => own, onSome: (cap) => Math.min(own, cap) }))
      }))
      // read at each part: a cap given after the start applies to the parts not yet stopped
      const currentDeadline = Effect.map(Ref.get(deadlineRef), (d) => Option.getOrElse(d.at, () => own))
      const parts = yield* Ref.get(registered)
      const unclean: Array<string> = []
      for (const stage of STOP_STAGES) {
        if (stage === "shared-clients" && unclean.length > 0) break
        // within a stage, the most recently registered part stops first (like a Scope)
        const inStage = parts.filter((p) => p.stage === stage).reverse()
        for (const part of inStage) {
          const remaining = Math.max(0, (yield* currentDeadline) - (yield* Clock.currentTimeMillis))
          const result = yield* Effect.interruptible(part.drain).pipe(
            Effect.timeoutOption(Duration.millis(remaining)),
            Effect.either
          )
          const ok = result._tag === "Right" && Option.isSome(result.right)
          if (!ok) {
            unclean.push(part.name)
            yield* Ref.set(clean, false)
            yield* Effect.logWarning("a part did not stop cleanly before the shutdown deadline").pipe(
              Effect.annotateLogs({ part: part.name, stage, timedOut: result._tag === "Right" })
            )
          }
        }
      }
      const report: ShutdownReport = { clean: unclean.length === 0, unclean }
      yield* SubscriptionRef.set(phases, report.clean ? "stopped" : "failed")
      yield* (report.clean ? Effect.logInfo("shutdown complete") : Effect.logError("shutdown was not clean")).pipe(
        Effect.annotateLogs({ clean: report.clean, unclean: report.unclean.length })
      )
      return report
    })

    const shutdown = Effect.gen(function*() {
      const first = yield* Ref.getAndSet(started, true)
      if (!first) {
        const report = yield* runStages
        yield* Deferred.succeed(done, report)
      }
      return yield* Deferred.await(done)
    }).pipe(Effect.uninterruptible, Effect.withSpan("Lifecycle.shutdown"))

    const shape: LifecycleShape = {
      phase: SubscriptionRef.get(phases),
      phases,
      setPhase: (phase) =>
        SubscriptionRef.modify(phases, (current) =>
          // once stopping, only the shutdown itself moves the phase on (and the log says so: a late
          // `setPhase("live")` during a shutdown logged `phase: live`)
          current === "stopping" || current === "stopped" ? [false, current] : [true, phase]).pipe(
            Effect.flatMap((
              applied
            ) => (applied ? Effect.logInfo("phase").pipe(Effect.annotateLogs({ phase })) : Effect.void))
          ),
      registerStop: (stage, name, drain) => Ref.update(registered, (xs) => [...xs, { stage, name, drain }]),
      shutdown,
      isClean: Ref.get(clean),
      report: Deferred.poll(done).pipe(
        Effect.flatMap(Option.match({ onNone: () => Effect.succeedNone, onSome: Effect.asSome }))
      ),
      deadline: Effect.map(Ref.get(deadlineRef), (d) => d.at),
      capDeadline: (at) =>
        Ref.update(deadlineRef, (d) => ({
          at: Option.map(d.at, (x) => Math.min(x, at)),
          cap: Option.some(Option.match(d.cap, { onNone: () => at, onSome: (c) => Math.min(c, at) }))
        }))
    }
    return shape
  })

export const layer = (options: { readonly shutdownTimeout: Duration.DurationInput }) =>
  Layer.effect(Lifecycle, make(options))

/**
 * Whether a finalizer may tidy the database (UNLISTEN, an advisory unlock, a setting reset) before
 * it ends a connection: yes, unless a shutdown of `lifecycle` was not clean. After an unclean
 * shutdown the database may be what hung; ending the connection releases the same (a session's
 * locks and LISTENs die with it), so the finalizer ends it at once instead of waiting on statements.
 * Without a Lifecycle (a library embedding, a test), always.
 */
export const tidyDatabase = (lifecycle: Option.Option<LifecycleShape>): Effect.Effect<boolean> =>
  Option.match(lifecycle, { onNone: () => Effect.succeed(true), onSome: (l) => l.isClean })

/**
 * After the ordered shutdown, the parts' scope closes within what is left of the shutdown deadline
 * plus this (SPEC §6.3: the runtime enforces the deadline). It leaves room for the two finalizers
 * that run outside SHUTDOWN_TIMEOUT_MS: the pool's close after a clean shutdown (≤ 10 s) and the
 * embedded PostgreSQL's stop (≤ 15 s).
 */
export const TEARDOWN_GRACE = Duration.seconds(25)

/**
 * The same after a shutdown that was not clean: the pool is left open (nothing to close), and what
 * else waits then is a statement on a database that may be what hung (an interrupted query's
 * `pg_cancel_backend`, up to 5 s each in @effect/sql-pg), which the process's exit ends anyway.
 * An embedded PostgreSQL whose stop is cut by it keeps running and is adopted by the next start.
 */
export const UNCLEAN_TEARDOWN_GRACE = Duration.seconds(10)

/**
 * Closes `scope` within `bound`, whatever its finalizers do: the close runs disconnected, so a
 * finalizer still waiting at the bound (a statement on a database that stopped answering) is left
 * behind, not waited for (the process is about to exit, which ends its connections). Returns
 * false when the close did not finish in time.
 */
export const closeWithin = (
  scope: Scope.CloseableScope,
  exit: Exit.Exit<unknown, unknown>,
  bound: Duration.DurationInput
): Effect.Effect<boolean> =>
  Scope.close(scope, exit).pipe(
    Effect.disconnect,
    Effect.interruptible,
    Effect.timeoutOption(bound),
    Effect.map(Option.isSome)
  )
