/**
 * The loop of one stream: sessions, one after another, for ever (SPEC §3.3). Each session connects
 * from the durable cursor (see {@link resumeCursor}), reads into its queue (`StreamReader`) and
 * commits batches (`Batcher`); when it ends, the loop reconnects, with full-jitter backoff after a
 * failure, a slower one after a poison frame, at once after a full queue or a restart. A crash of
 * the loop restarts it.
 */
import { Cause, Deferred, Duration, Effect, Metric, Ref, Schedule } from "effect"
import * as Outbox from "../matching/Outbox.js"
import { Processor } from "../matching/Processor.js"
import * as Backoff from "../platform/Backoff.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { runBatcher } from "./Batcher.js"
import { CursorStore } from "./CursorStore.js"
import {
  type FailureKind,
  initialState,
  type IntakeTuning,
  type SessionEnd,
  type StreamContext,
  streamMetrics,
  type StreamRunner,
  type StreamSpec,
  type StreamState
} from "./StreamModel.js"
import { makeSessionQueue, readSession } from "./StreamReader.js"

/** Full jitter: a uniform random delay in [0, min(cap, base · 2^n)] (the one of `Backoff`). */
export const fullJitter = Backoff.fullJitter

/**
 * Where a session connects: live after a `FutureCursor`; without a durable cursor, `override` or
 * the stream's initial cursor; else exactly where this process got to (`position`), or the
 * durable cursor rewound (another process may have written it), or `override` when it is earlier.
 * Rewinding on every reconnect, or resuming at the loaded cursor while replaying below it, could
 * replay more than the queue holds after backpressure and never progress.
 */
export const resumeCursor = (
  spec: Pick<StreamSpec, "initialCursor" | "rewind">,
  live: boolean,
  state: Pick<StreamState, "durableCursor" | "position">,
  override: bigint | undefined
): bigint | undefined => {
  if (live) return undefined
  const durable = state.durableCursor
  if (durable === undefined) return override ?? spec.initialCursor
  const rewound = durable - spec.rewind
  const base = state.position ?? (rewound < 0n ? 0n : rewound)
  return override !== undefined && override < base ? override : base
}

/** One connection: read into the queue, commit batches; returns why it ended. */
const session = (ctx: StreamContext, cursor: bigint | undefined) =>
  Effect.scoped(
    Effect.gen(function*() {
      const sq = yield* makeSessionQueue(ctx.tuning.queueMax)
      const signal = yield* Ref.get(ctx.restartSignal)
      // a new session has a new (empty) queue
      yield* Ref.update(ctx.state, (s) => ({ ...s, queued: 0 }))
      yield* Effect.forkScoped(readSession(ctx, sq, cursor, signal))
      return yield* runBatcher(ctx, sq)
    })
  )

/**
 * The durable cursor. A failed read is never taken for "no cursor stored" (that would start a
 * stream live, or from its initial cursor, and the next commit would raise the stored cursor
 * past everything unread): it is retried with the reconnect backoff (full jitter, capped, never
 * giving up), counted and logged by its code only, and no frame is read before it succeeds.
 */
const loadCursor = (ctx: StreamContext) =>
  ctx.cursors.load(ctx.spec.name, ctx.spec.relay).pipe(
    Effect.tapError((e) =>
      Effect.zipRight(
        Effect.zipRight(
          Metric.increment(ctx.tagged.cursorLoadFailures),
          Ref.update(ctx.state, (s) => ({ ...s, failureKind: "handler" as const }))
        ),
        ctx.logLimited("cursor load failed; retrying before connecting", { code: e.code, op: e.op })
      )
    ),
    Effect.retry(
      Schedule.addDelayEffect(Schedule.forever, (n) => fullJitter(ctx.tuning.backoffBase, ctx.tuning.backoffCap, n))
    )
  )

const loopFrom = (ctx: StreamContext, from: bigint | undefined) => {
  const { spec, tuning, state, stopped, tagged } = ctx
  return Effect.gen(function*() {
    const stored = yield* loadCursor(ctx)
    yield* Ref.update(state, (s) => ({ ...s, durableCursor: stored }))
    let failures = 0
    let override: bigint | undefined = from
    let live = false
    for (;;) {
      const cursor = resumeCursor(spec, live, yield* Ref.get(state), override)
      override = undefined
      live = false
      const acksBefore = (yield* Ref.get(state)).batches
      const end = yield* session(ctx, cursor).pipe(
        Effect.catchAllCause((cause) =>
          Cause.isInterruptedOnly(cause) ? Effect.failCause(cause) : Effect.succeed<SessionEnd>({ kind: "handler" })
        )
      )
      if (yield* Deferred.isDone(stopped)) return yield* Effect.never
      yield* Ref.set(ctx.restartSignal, yield* Deferred.make<bigint | undefined>())
      const s = yield* Ref.get(state)
      if (s.batches > acksBefore) failures = 0
      yield* Metric.increment(tagged.reconnects)
      if (end.kind === "restart") {
        override = end.cursorOverride
        yield* Ref.update(state, (x) => ({ ...x, reconnects: x.reconnects + 1 }))
        continue
      }
      if (end.cursorOverride === -1n) live = true
      const failureKind: FailureKind | undefined = end.kind === "closed" ? undefined : end.kind
      yield* Ref.update(state, (x) => ({
        ...x,
        reconnects: x.reconnects + 1,
        quarantined: end.kind === "protocol",
        failureKind: failureKind ?? x.failureKind
      }))
      if (end.kind !== "queue") {
        const wait = yield* fullJitter(tuning.backoffBase, tuning.backoffCap, failures)
        const delay = end.kind === "protocol" ? Duration.max(wait, tuning.poisonBackoff) : wait
        failures++
        if (end.kind !== "closed") yield* ctx.logLimited("stream ended; reconnecting", { kind: end.kind })
        yield* Effect.sleep(delay).pipe(Effect.raceFirst(Deferred.await(stopped)))
      }
      yield* Ref.update(state, (x) => ({ ...x, quarantined: false }))
    }
  })
}

/**
 * The session loop, restarted after a crash (a defect: a bug, never an expected failure, which
 * the loop handles itself). It resumes like a reconnect: from this process's position, else the
 * durable cursor (read again); after a full-jitter backoff that grows with consecutive crashes, so
 * a persistent bug cannot spin. The stream never gives up (SPEC §3.3). Logged by kind only: a
 * cause could carry values.
 */
const runFrom = (ctx: StreamContext, from: bigint | undefined, crashes = 0): Effect.Effect<never> =>
  loopFrom(ctx, from).pipe(
    Effect.catchAllCause((c) =>
      Cause.isInterruptedOnly(c)
        ? Effect.failCause(c)
        : Effect.gen(function*() {
          yield* Metric.increment(ctx.tagged.crashes)
          yield* Ref.update(ctx.state, (x) => ({ ...x, connected: false, failureKind: "handler" as const }))
          yield* Effect.logError("stream runner crashed; restarting").pipe(
            Effect.annotateLogs({ kind: Cause.isDie(c) ? "defect" : "failure", crashes: crashes + 1 })
          )
          const wait = yield* fullJitter(ctx.tuning.backoffBase, ctx.tuning.backoffCap, crashes)
          yield* Effect.sleep(wait).pipe(Effect.raceFirst(Deferred.await(ctx.stopped)))
          // resume from this process's position (or the durable cursor), not the first replay point
          return yield* runFrom(ctx, undefined, crashes + 1)
        })
    ),
    Effect.orDie
  )

export const makeStreamRunner = (
  spec: StreamSpec,
  tuning: IntakeTuning,
  onIdentity?: (did: string) => Effect.Effect<void>
) =>
  Effect.gen(function*() {
    const processor = yield* Processor
    const cursors = yield* CursorStore
    const outboxStore = yield* Outbox.OutboxStore
    const state = yield* Ref.make<StreamState>(initialState)
    const restartSignal = yield* Ref.make<Deferred.Deferred<bigint | undefined>>(
      yield* Deferred.make<bigint | undefined>()
    )
    const stopped = yield* Deferred.make<void>()
    // one limit for all of this stream's warnings: at most one a minute, whichever it is
    const limiter = RateLimitedLog.make()
    const logLimited = (message: string, annotations: Record<string, unknown>) =>
      limiter.run("stream", () =>
        Effect.logWarning(message).pipe(Effect.annotateLogs({ stream: spec.name, ...annotations })))
    const ctx: StreamContext = {
      spec,
      tuning,
      onIdentity,
      processor,
      cursors,
      outboxStore,
      state,
      restartSignal,
      stopped,
      tagged: streamMetrics(spec.name),
      logLimited
    }

    const runner: StreamRunner = {
      spec,
      state,
      restart: (cursor) =>
        Effect.flatMap(Ref.get(restartSignal), (d) => Deferred.succeed(d, cursor)),
      runFrom: (from) => runFrom(ctx, from),
      run: runFrom(ctx, undefined),
      stopReading: Deferred.succeed(stopped, undefined).pipe(Effect.asVoid)
    }
    return runner
  })
