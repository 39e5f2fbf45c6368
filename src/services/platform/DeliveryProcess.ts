/**
 * The supervisor of the delivery child (issue 16 item 2; DELIVERY_PROCESS, DeliveryProcessConfig):
 * the parent process runs its other roles itself and the delivery role in one child process, which
 * it starts, watches, restarts and stops.
 *
 * - Start: one child (a {@link Spawner} starts it: `bun src/main.ts` with `FIREHOOK_ROLES=delivery`
 *   in production, DeliveryChild). Its `/health` is polled every second (1 s timeout each).
 * - Crash (the child exits while the parent is not stopping): logged, then restarted after
 *   `min(maxDelay, baseDelay · 2ⁿ)` (n = earlier exits within the window); the exit that would be
 *   restart `maxRestarts + 1` within `window` gives up: `onGiveUp` gets one line (main then stops
 *   the process with exit code 1).
 * - Database outage: a child that exits because it could not reach the database at its start
 *   (its own line `database: could not connect (…)`, Database.isUnreachableLine) is restarted after
 *   `min(maxDelay, baseDelay · 2ⁿ)` (n = such exits in a row) and does not count toward the
 *   give-up: the parent reached that database at its own start and rides the outage out (intake,
 *   LISTEN, leader elections retry), so the child waits for it too. Before, a child that died
 *   during an outage (an OOM kill) used up its restarts within about 35 s of failed starts and the
 *   whole service stopped for good.
 * - Shutdown: the drain of stage `delivery` (SPEC §6.3) sends the child SIGTERM and waits for its
 *   exit (its own ordered shutdown runs the delivery grace); clean when it exits with code 0, or
 *   dies of that signal while still loading its modules (it had started nothing: {@link stoppedCleanly}).
 *   The Lifecycle cuts the wait at the shutdown deadline: the child then gets SIGKILL (unclean).
 *   Before the SIGTERM the child is told that deadline (a line on its stdin), so that its own
 *   shutdown, whose deadline starts at the SIGTERM, ends before it (DeliveryChild.followParent).
 *   A SIGTERM/SIGINT that reaches the parent marks it stopping at once, so a child that got the
 *   same signal (sent to the process group) and exits first is not restarted.
 * - Hung child: a child that was running and then leaves {@link SuperviseOptions.killAfter} looks in a
 *   row without any answer (its event loop stuck, or the process stopped) is sent SIGKILL, so the
 *   restart policy replaces it (its rows are freed with its connections) instead of delivery
 *   stopping for good behind a `/live` that still answers. So is a child that never answered ready
 *   and leaves {@link SuperviseOptions.killStartingAfter} looks in a row without any answer (hung
 *   during its start). A child that answers, even 503, is never killed.
 * - Health: a `deliveryProcess` section `{mode, state, pid, restarts}`, ready only while the child
 *   runs and answers ready; the child's `delivery` and `redis` sections mirrored (marked `stale`
 *   when the last answer is older than 5 s), as a single process would show them.
 * - Metrics: the parent's `/metrics` carries the child's too, read at each scrape (1 s bound), each
 *   series labelled `process="delivery-child"`; while the child does not answer they are left out.
 */
import { Clock, Data, Duration, Effect, Fiber, Option, Ref, Schedule } from "effect"
import type { Scope } from "effect"
import * as Backoff from "./Backoff.js"
import type * as ChildProcess from "./ChildProcess.js"
import * as Database from "./Database.js"
import { Health, type HealthValue } from "./Health.js"
import { Lifecycle } from "./Lifecycle.js"

export const STATES = ["starting", "running", "unresponsive", "backoff", "stopping", "stopped", "failed"] as const
export type State = (typeof STATES)[number]

/** What the child's `/health` answered: its readiness and its sections (`status`, `phase` removed). */
export interface HealthAnswer {
  readonly ready: boolean
  readonly sections: { readonly [k: string]: HealthValue }
}

export interface Spawned {
  readonly handle: ChildProcess.ChildHandle
  /** one bounded look at the child's `/health`; `None` when it did not answer */
  readonly health: Effect.Effect<Option.Option<HealthAnswer>>
  /** one bounded read of the child's `/metrics` (Prometheus text); `None` when it did not answer */
  readonly metrics: Effect.Effect<Option.Option<string>>
}

/** Starts one delivery child, owned by the scope (a running child is stopped when it closes). */
export interface Spawner {
  readonly spawn: Effect.Effect<Spawned, ChildProcess.SpawnFailed, Scope.Scope>
}

export interface RestartPolicy {
  /** restarts allowed within `window`; the exit after them gives up */
  readonly maxRestarts: number
  readonly window: Duration.DurationInput
  readonly baseDelay: Duration.DurationInput
  readonly maxDelay: Duration.DurationInput
}

/** 5 restarts within 10 minutes, after 1, 2, 4, 8, 16 s. */
export const defaultPolicy: RestartPolicy = {
  maxRestarts: 5,
  window: Duration.minutes(10),
  baseDelay: Duration.seconds(1),
  maxDelay: Duration.seconds(30)
}

export type Decision = Data.TaggedEnum<{
  /** restart after `delayMs`; `recent` = the exits within the window, this one included */
  Restart: { readonly delayMs: number; readonly recent: ReadonlyArray<number> }
  GiveUp: { readonly recent: ReadonlyArray<number> }
}>
export const Decision = Data.taggedEnum<Decision>()

const millis = (d: Duration.DurationInput): number => Duration.toMillis(Duration.decode(d))

/** The decision after an exit at `now`, given the earlier exits' times. */
export const decide = (policy: RestartPolicy, earlier: ReadonlyArray<number>, now: number): Decision => {
  const windowMs = millis(policy.window)
  const recent = [...earlier.filter((t) => now - t < windowMs), now]
  if (recent.length > policy.maxRestarts) return Decision.GiveUp({ recent })
  const delayMs = Backoff.ceilingMillis(millis(policy.baseDelay), millis(policy.maxDelay), recent.length - 1)
  return Decision.Restart({ delayMs, recent })
}

/**
 * The decision after an exit of a child that could not reach the database, the `waits`-th such
 * exit in a row before it (0 for the first): a restart after `min(maxDelay, baseDelay · 2^waits)`,
 * never a give-up; `recent` is the earlier exits within the window, this one not among them.
 */
export const decideUnreachable = (
  policy: RestartPolicy,
  earlier: ReadonlyArray<number>,
  now: number,
  waits: number
): Decision =>
  Decision.Restart({
    delayMs: Backoff.ceilingMillis(millis(policy.baseDelay), millis(policy.maxDelay), waits),
    recent: earlier.filter((t) => now - t < millis(policy.window))
  })

/**
 * Whether a child that exited during the shutdown stopped cleanly (left no leased row behind): exit
 * code 0 (its ordered shutdown was clean), or death by SIGTERM/SIGINT. A child that dies of those
 * had not installed its signal listeners (LifecycleSignals: from the first module evaluated on, a
 * signal exits 0 or runs the ordered shutdown, never the default action), so it was still loading
 * its modules: it had started nothing (no connection, no claim). This happens when the shutdown (or
 * a Ctrl-C to the process group) comes right after the child was spawned.
 */
export const stoppedCleanly = (exit: ChildProcess.ChildExit): boolean =>
  exit.code === 0 || exit.signal === "SIGTERM" || exit.signal === "SIGINT"

/**
 * The line the parent writes on its delivery child's stdin before its SIGTERM (ChildHandle.tell):
 * its shutdown deadline (epoch milliseconds: the Clock's, which is `Date.now` in production).
 */
export const deadlineLine = (at: number): string => `deadline ${Math.trunc(at)}`

/** The deadline in a {@link deadlineLine}; `None` for any other line. */
export const parseDeadline = (line: string): Option.Option<number> => {
  const m = /^deadline (\d{1,15})$/.exec(line.trim())
  return m === null ? Option.none() : Option.some(Number(m[1]))
}

/** The child stopped at shutdown without {@link stoppedCleanly}. */
export class ChildUnclean extends Data.TaggedError("ChildUnclean")<{
  readonly code: number | null
  readonly signal: string | null
}> {}

export interface SuperviseOptions {
  readonly spawner: Spawner
  readonly policy?: RestartPolicy
  /** between two looks at the child's `/health` (default 1 s) */
  readonly pollInterval?: Duration.DurationInput
  /** failed looks in a row after which a running child counts as unresponsive (default 3) */
  readonly unresponsiveAfter?: number
  /**
   * looks in a row without any answer after which a child that had answered ready is killed
   * (SIGKILL) and restarted by the policy (default 30: about a minute, each look waiting out its 1 s
   * timeout)
   */
  readonly killAfter?: number
  /**
   * looks in a row without any answer after which a child that has not yet answered ready (still
   * `starting`) is killed (SIGKILL) and restarted by the policy (default 120: about two minutes; a
   * child opens its health listener within seconds of its start, once its database pool is up)
   */
  readonly killStartingAfter?: number
  /** called once with the one-line reason when the restarts are exhausted */
  readonly onGiveUp: (line: string) => Effect.Effect<void>
}

interface Status {
  readonly state: State
  readonly pid: Option.Option<number>
  readonly restarts: number
  readonly misses: number
  /** looks in a row without any answer (a 503 is an answer) */
  readonly silent: number
  readonly answer: Option.Option<HealthAnswer>
  readonly answeredAt: number
}

/** how old the mirrored sections may be before they are marked stale (as the delivery counts are) */
const STALE_AFTER_MS = 5000
const MIRRORED = ["delivery", "redis"] as const
/** the label the child's series carry on the parent's `/metrics` (its log lines carry the same value) */
export const CHILD_METRIC_LABELS = { process: "delivery-child" } as const

const describeExit = (exit: ChildProcess.ChildExit): string =>
  exit.signal !== null ? `signal ${exit.signal}` : exit.code !== null ? `exit code ${exit.code}` : "not started"

/** the child's own one-line failure, only when it is one of firehook's (`firehook: …`) */
const ownLine = (line: Option.Option<string>): Option.Option<string> =>
  Option.flatMap(
    line,
    (l) =>
      l.startsWith("firehook: ")
        ? Option.some(l.slice("firehook: ".length).replace(/\s+/g, " ").slice(0, 200))
        : Option.none()
  )

/** the next state after a look at the child's `/health` (only starting/running/unresponsive move) */
const afterLook = (s: Status, answer: Option.Option<HealthAnswer>, now: number, limit: number): Status => {
  if (s.state !== "starting" && s.state !== "running" && s.state !== "unresponsive") return s
  const ok = Option.isSome(answer) && answer.value.ready
  const misses = ok ? 0 : s.misses + 1
  const silent = Option.isSome(answer) ? 0 : s.silent + 1
  const state: State = ok ? "running" : s.state === "starting" ? "starting" : misses >= limit ? "unresponsive" : s.state
  return Option.isSome(answer)
    ? { ...s, state, misses, silent, answer, answeredAt: now }
    : { ...s, state, misses, silent }
}

const mirrored = (s: Status, name: string, now: number): { readonly [k: string]: HealthValue } => {
  const section = Option.flatMap(s.answer, (a) => Option.fromNullable(a.sections[name]))
  const body = Option.getOrUndefined(section)
  const stale = Option.isNone(section) || now - s.answeredAt > STALE_AFTER_MS
  if (body === undefined || body === null || typeof body !== "object") return { stale: true }
  return stale ? { ...body, stale: true } : body
}

/**
 * Supervise the delivery child for the life of the scope: start it, watch it, restart it, register
 * its health sections and its drain (stage `delivery`). Returns once the first child is started.
 */
export const supervise = (options: SuperviseOptions): Effect.Effect<void, never, Lifecycle | Health | Scope.Scope> =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle
    const health = yield* Health
    const policy = options.policy ?? defaultPolicy
    const limit = options.unresponsiveAfter ?? 3
    const killAfter = options.killAfter ?? 30
    const killStartingAfter = options.killStartingAfter ?? 120
    const status = yield* Ref.make<Status>({
      state: "starting",
      pid: Option.none(),
      restarts: 0,
      misses: 0,
      silent: 0,
      answer: Option.none(),
      answeredAt: 0
    })
    /** the running child (its handle for the stop, its `/metrics` for the parent's) */
    const current = yield* Ref.make<Option.Option<Spawned>>(Option.none())
    /** set by the drain, or at once by a SIGTERM/SIGINT reaching this process */
    const stopping = yield* Ref.make(false)
    /**
     * the exit of the last child, recorded (under `lock`) as `current` is cleared; the loop forgets
     * it (under `lock`) once it has taken it for a crash, and keeps it when the parent was stopping:
     * the drain, which reads `current` and this under `lock`, never misses an exit the loop has not
     * handled as a crash
     */
    const finalExit = yield* Ref.make<Option.Option<ChildProcess.ChildExit>>(Option.none())
    const lock = yield* Effect.makeSemaphore(1)
    const setState = (state: State) => Ref.update(status, (s) => ({ ...s, state }))

    yield* Effect.acquireRelease(
      Effect.sync(() => {
        const onSignal = () => Effect.runSync(Ref.set(stopping, true))
        process.on("SIGTERM", onSignal)
        process.on("SIGINT", onSignal)
        return onSignal
      }),
      (onSignal) =>
        Effect.sync(() => {
          process.off("SIGTERM", onSignal)
          process.off("SIGINT", onSignal)
        })
    )

    const isStopping = Effect.zipWith(
      Ref.get(stopping),
      lifecycle.phase,
      (flag, phase) => flag || phase === "stopping" || phase === "stopped" || phase === "failed"
    )

    /** one child's life: started (unless stopping), looked at every poll interval, until it exits */
    const runOnce: Effect.Effect<
      Option.Option<{ exit: ChildProcess.ChildExit; pid: number; error: Option.Option<string> }>
    > = Effect.scoped(Effect.gen(function*() {
      const started = yield* lock.withPermits(1)(Effect.gen(function*() {
        if (yield* isStopping) return Option.none()
        const spawned = yield* options.spawner.spawn
        yield* Ref.set(current, Option.some(spawned))
        yield* Ref.update(
          status,
          (s) => ({ ...s, state: "starting" as const, pid: Option.some(spawned.handle.pid), misses: 0, silent: 0 })
        )
        yield* Effect.logInfo("delivery process started").pipe(Effect.annotateLogs({ pid: spawned.handle.pid }))
        return Option.some(spawned)
      }))
      if (Option.isNone(started)) return Option.none()
      const { handle } = started.value
      const killed = yield* Ref.make(false)
      const look = Effect.gen(function*() {
        const answer = yield* started.value.health
        const now = yield* Clock.currentTimeMillis
        const after = yield* Ref.updateAndGet(status, (s) => afterLook(s, answer, now, limit))
        // a hung child is replaced: it had answered ready, then nothing for killAfter looks; or it
        // never answered ready and gave no answer at all for killStartingAfter looks
        const hung = (after.state === "unresponsive" && after.silent >= killAfter) ||
          (after.state === "starting" && after.silent >= killStartingAfter)
        if (!hung || (yield* isStopping)) return
        if (yield* Ref.getAndSet(killed, true)) return
        yield* Effect.logWarning("the delivery process does not answer: killing it").pipe(
          Effect.annotateLogs({ pid: handle.pid, looks: after.silent, state: after.state })
        )
        yield* handle.kill("SIGKILL")
      })
      yield* Effect.forkScoped(look.pipe(Effect.repeat(Schedule.spaced(options.pollInterval ?? Duration.seconds(1)))))
      const exit = yield* handle.exit
      // recorded with `current` cleared, atomically for the drain: a drain between the two (while
      // this scope closes, interrupting the look) saw neither the child nor its exit, and took
      // the shutdown of a child that had exited 1 for clean
      yield* lock.withPermits(1)(
        Effect.zipRight(Ref.set(finalExit, Option.some(exit)), Ref.set(current, Option.none()))
      )
      return Option.some({ exit, pid: handle.pid, error: yield* handle.lastError })
    })).pipe(
      Effect.catchTag("SpawnFailed", (e) =>
        Effect.logWarning("the delivery process could not be started").pipe(
          Effect.annotateLogs({ reason: e.reason }),
          Effect.as(Option.some({ exit: { code: null, signal: null }, pid: 0, error: Option.none<string>() }))
        ))
    )

    /**
     * one turn: run a child; after a crash decide and wait; `done` once stopping or given up;
     * `waits` = the exits in a row of a child that could not reach the database
     */
    const turn = (earlier: ReadonlyArray<number>, waits: number) =>
      Effect.gen(function*() {
        const ended = yield* runOnce
        if (Option.isNone(ended)) return { earlier, waits, done: true }
        const { error, exit, pid } = ended.value
        // decided under the lock: either the drain finds the exit, or it is handled as a crash
        const stopped = yield* lock.withPermits(1)(
          Effect.flatMap(
            isStopping,
            (yes) => Effect.as(Ref.set(finalExit, yes ? Option.some(exit) : Option.none()), yes)
          )
        )
        if (stopped) return { earlier, waits, done: true }
        const reason = ownLine(error)
        const unreachable = exit.code !== 0 && Option.isSome(reason) && Database.isUnreachableLine(reason.value)
        const now = yield* Clock.currentTimeMillis
        const decision = unreachable ? decideUnreachable(policy, earlier, now, waits) : decide(policy, earlier, now)
        const nextWaits = unreachable ? waits + 1 : 0
        yield* Effect.logWarning("the delivery process exited").pipe(
          Effect.annotateLogs({
            pid,
            code: exit.code ?? "none",
            signal: exit.signal ?? "none",
            exitsInWindow: decision.recent.length,
            ...(Option.isSome(reason) ? { childError: reason.value } : {}),
            ...(decision._tag === "Restart" ? { restartInMs: decision.delayMs } : {})
          })
        )
        if (decision._tag === "GiveUp") {
          // the child is gone: no pid is shown for it
          yield* Ref.update(status, (s) => ({ ...s, state: "failed" as const, pid: Option.none() }))
          const line = `the delivery process exited ${decision.recent.length} times within ${
            Math.round(millis(policy.window) / 60_000)
          } min; giving up (last: ${describeExit(exit)}${Option.isSome(reason) ? `: ${reason.value}` : ""})`
          yield* Effect.logError("the delivery process keeps exiting: giving up").pipe(
            Effect.annotateLogs({ exitsInWindow: decision.recent.length })
          )
          yield* options.onGiveUp(line)
          return { earlier: decision.recent, waits: nextWaits, done: true }
        }
        yield* Ref.update(
          status,
          (s) => ({ ...s, state: "backoff" as const, pid: Option.none(), misses: 0, silent: 0 })
        )
        yield* Effect.sleep(Duration.millis(decision.delayMs))
        yield* Ref.update(status, (s) => ({ ...s, restarts: s.restarts + 1 }))
        return { earlier: decision.recent, waits: nextWaits, done: false }
      })

    // a turn is bounded: each either ends the loop or follows a crash, and crashes are rate-limited
    // by the policy (at most maxRestarts + 1 within the window; starts that found the database
    // unreachable, at most one per maxDelay once backed off, for as long as the outage lasts)
    const loop = yield* Effect.iterate({ earlier: [] as ReadonlyArray<number>, waits: 0, done: false }, {
      while: (s) => !s.done,
      body: (s) => turn(s.earlier, s.waits)
    }).pipe(Effect.forkScoped)

    const stop = Effect.gen(function*() {
      // the running child, else the exit of one the loop has not handled as a crash (read together)
      const [handle, exited] = yield* lock.withPermits(1)(
        Ref.set(stopping, true).pipe(
          Effect.zipRight(Effect.all([Effect.map(Ref.get(current), Option.map((s) => s.handle)), Ref.get(finalExit)]))
        )
      )
      const before = (yield* Ref.get(status)).state
      if (before !== "failed") yield* setState("stopping")
      // the child's shutdown must end before this one's deadline (its own starts at the SIGTERM): the
      // deadline first, then the signal (DeliveryChild.followParent)
      const deadline = yield* lifecycle.deadline
      if (Option.isSome(handle) && Option.isSome(deadline) && handle.value.tell !== undefined) {
        yield* handle.value.tell(deadlineLine(deadline.value))
      }
      const exit = Option.isSome(handle)
        ? Option.some(
          yield* handle.value.kill("SIGTERM").pipe(
            Effect.zipRight(handle.value.exit),
            Effect.onInterrupt(() => handle.value.kill("SIGKILL"))
          )
        )
        : exited
      yield* Fiber.interrupt(loop)
      const clean = Option.match(exit, { onNone: () => true, onSome: stoppedCleanly })
      // the child has exited (or never ran): no pid is shown for it
      yield* Ref.update(status, (s) => ({
        ...s,
        state: before === "failed" ? s.state : clean ? "stopped" as const : "failed" as const,
        pid: Option.isSome(exit) ? Option.none() : s.pid
      }))
      yield* Effect.logInfo("delivery process stopped").pipe(
        Effect.annotateLogs({ clean, ...(Option.isSome(exit) ? { exit: describeExit(exit.value) } : {}) })
      )
      if (!clean && Option.isSome(exit)) {
        return yield* Effect.fail(new ChildUnclean({ code: exit.value.code, signal: exit.value.signal }))
      }
    })
    yield* lifecycle.registerStop("delivery", "delivery-process", stop)

    yield* health.register(
      "deliveryProcess",
      Effect.map(Ref.get(status), (s) => ({
        ready: s.state === "running",
        body: {
          mode: "child",
          state: s.state,
          // a string: health clamps numbers to 1,000,000 and pids go higher
          pid: Option.match(s.pid, { onNone: () => null, onSome: String }),
          restarts: s.restarts
        }
      }))
    )
    // the child's metrics on this process's `/metrics`, each series labelled process="delivery-child"
    yield* health.registerMetrics(
      Effect.flatMap(Ref.get(current), (running) =>
        Option.match(running, {
          onNone: () => Effect.succeed(Option.none()),
          onSome: (s) => Effect.map(s.metrics, Option.map((text) => ({ text, labels: CHILD_METRIC_LABELS })))
        }))
    )
    for (const name of MIRRORED) {
      yield* health.register(
        name,
        Effect.zipWith(
          Ref.get(status),
          Clock.currentTimeMillis,
          (s, now) => ({ ready: true, body: mirrored(s, name, now) })
        )
      )
    }
  })
