/**
 * The loop of one stream: sessions, one after another, for ever (SPEC §3.3). Each session connects
 * from the durable cursor (see {@link resumeCursor}), reads into its queue (`StreamReader`) and
 * commits batches (`Batcher`); when it ends, the loop reconnects, with full-jitter backoff after a
 * failure, a slower one after a poison frame, at once after a full queue or a restart. A crash of
 * the loop restarts it.
 *
 * A replay point asked for (`restart(cursor)`, `runFrom(from)`; SPEC §3.1: a newly watched DID's
 * stream resumes from before its registration) is kept, the earliest of those asked, until a
 * session that connected from it has committed a batch: a session that was already ending for
 * another reason (closed socket, full queue, failed batch), a failed connection or a crash of the
 * loop does not lose it. A stream with `durableReplay` also follows the obligation the registry
 * stream wrote in a registration's transaction (`cursors.replay_from`, 0017): a crash or a lost
 * intake lock before the replay committed loses the in-memory point, never that one. A session
 * reads it when one may be pending (at the stream's start, after a replay was asked, after a
 * session that left it pending), connects at or below it, and its batches advance it (in their
 * transactions) until they reach the stored cursor, when it is cleared. A live session (no cursor)
 * keeps where it started reading as such a point (see {@link sessionFrom}), so a stream that starts
 * live never reconnects live past frames it read and did not commit; so does a session of a stream
 * with no durable cursor (its initial cursor). A replay point is dropped only once a cursor is
 * committed (a batch inside a frame commits none).
 */
import { Cause, Clock, Deferred, Duration, Effect, Exit, Metric, Ref, Schedule, Stream } from "effect"
import * as Outbox from "../matching/Outbox.js"
import { Processor } from "../matching/Processor.js"
import * as Backoff from "../platform/Backoff.js"
import type { StoreError } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { runBatcher } from "./Batcher.js"
import { CursorStore, type ReplayObligation } from "./CursorStore.js"
import {
  type FailureKind,
  type IdentityHooks,
  initialState,
  type IntakeTuning,
  type SessionEnd,
  type SessionReplay,
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
 * The longest wait after a session that failed on firehook's side (`handler`: its batches could not
 * be committed, a database outage) and between two failed cursor loads. The reconnect backoff (5
 * min cap, SPEC §3.3) spares the relay; a database outage is not the relay's, and with the full cap
 * intake resumed minutes after the database came back (measured: 3 min after a full disk was freed).
 */
export const STORE_BACKOFF_CAP = Duration.seconds(30)

/** The wait before the next session, after one that ended so with backoff `wait`. */
export const reconnectDelay = (
  kind: SessionEnd["kind"],
  wait: Duration.Duration,
  tuning: Pick<IntakeTuning, "poisonBackoff">
): Duration.Duration =>
  kind === "protocol"
    ? Duration.max(wait, tuning.poisonBackoff)
    : kind === "handler"
    ? Duration.min(wait, STORE_BACKOFF_CAP)
    : wait

/**
 * Where a session connects: live after a `FutureCursor`; without a durable cursor, `override` or
 * the stream's initial cursor; else exactly where this process got to (`position`), or the
 * durable cursor rewound (another process may have written it; raised to the spec's
 * `resumeFloor`), or `override` when it is earlier.
 * Rewinding on every reconnect, or resuming at the loaded cursor while replaying below it, could
 * replay more than the queue holds after backpressure and never progress.
 */
export const resumeCursor = (
  spec: Pick<StreamSpec, "initialCursor" | "rewind" | "resumeFloor">,
  live: boolean,
  state: Pick<StreamState, "durableCursor" | "position">,
  override: bigint | undefined
): bigint | undefined => {
  if (live) return undefined
  const durable = state.durableCursor
  if (durable === undefined) return override ?? spec.initialCursor
  const rewound = durable - spec.rewind
  const floor = spec.resumeFloor
  const loaded = floor !== undefined && rewound < floor ? floor : rewound
  const base = state.position ?? (loaded < 0n ? 0n : loaded)
  return override !== undefined && override < base ? override : base
}

/** the earlier of two replay points (undefined: none asked) */
export const earlierReplay = (a: bigint | undefined, b: bigint | undefined): bigint | undefined =>
  a === undefined ? b : b === undefined || a <= b ? a : b

/**
 * Where a live connection (no cursor) is known to start, before its first frame: a time cursor's
 * stream (Jetstream) from the time it connects, less its rewind (the margin of a loaded cursor: the
 * source's clock is not ours); a relay's `seq` is not known before its first frame.
 */
const liveStart = (spec: Pick<StreamSpec, "cursorIsTime" | "rewind">) =>
  spec.cursorIsTime
    ? Effect.map(Clock.currentTimeMillis, (ms) => {
      const at = BigInt(Math.floor(ms)) * 1000n - spec.rewind
      return at < 0n ? 0n : at
    })
    : Effect.succeed(undefined)

/**
 * The reader's context for a live connection: its source also keeps in `from` (the earlier of it
 * and what is there) the point just before its first frame, that frame's cursor − 1 (at least 0: a
 * relay replays the seqs after a cursor, a Jetstream the `time_us` from one on, so either replays
 * the frame). Not when a poison or relay error frame comes first: the session ends there, and a
 * point past it would skip it. Only a live connection is read so: no cost per frame otherwise.
 */
const recordingFirstFrame = (ctx: StreamContext, from: Ref.Ref<bigint | undefined>): StreamContext => ({
  ...ctx,
  spec: {
    ...ctx.spec,
    connect: (cursor) => {
      let looking = true
      return ctx.spec.connect(cursor).pipe(Stream.mapChunksEffect((chunk) => {
        if (!looking) return Effect.succeed(chunk)
        for (const item of chunk) {
          if (item._tag === "events") {
            looking = false
            const at = item.cursor > 0n ? item.cursor - 1n : 0n
            return Effect.as(Ref.update(from, (p) => earlierReplay(p, at)), chunk)
          }
          if (item._tag === "poison" || item._tag === "relay_error") {
            looking = false
            break
          }
        }
        return Effect.succeed(chunk)
      }))
    }
  }
})

/**
 * One connection: read into the queue, commit batches; returns why it ended. A live one (no
 * cursor) keeps where it started reading in `from` (see {@link recordingFirstFrame}).
 */
const session = (
  ctx: StreamContext,
  cursor: bigint | undefined,
  replay: SessionReplay,
  from: Ref.Ref<bigint | undefined> | undefined
) =>
  Effect.scoped(
    Effect.gen(function*() {
      const sq = yield* makeSessionQueue(ctx.tuning.queueMax)
      const signal = yield* Ref.get(ctx.restartSignal)
      // a new session has a new (empty) queue
      yield* Ref.update(ctx.state, (s) => ({ ...s, queued: 0 }))
      const readerCtx = from === undefined ? ctx : recordingFirstFrame(ctx, from)
      yield* Effect.forkScoped(readSession(readerCtx, sq, cursor, signal))
      return yield* runBatcher(ctx, sq, replay)
    })
  )

/** a store read, retried with the reconnect backoff (never taken for "nothing stored") */
const retryStore = <A>(ctx: StreamContext, read: Effect.Effect<A, StoreError>, message: string) =>
  read.pipe(
    Effect.tapError((e) =>
      Effect.zipRight(
        Effect.zipRight(
          Metric.increment(ctx.tagged.cursorLoadFailures),
          Ref.update(ctx.state, (s) => ({ ...s, failureKind: "handler" as const }))
        ),
        ctx.logLimited(message, { code: e.code, op: e.op })
      )
    ),
    Effect.retry(
      Schedule.addDelayEffect(
        Schedule.forever,
        (n) => fullJitter(ctx.tuning.backoffBase, Duration.min(ctx.tuning.backoffCap, STORE_BACKOFF_CAP), n)
      )
    )
  )

/**
 * The stream's durable replay obligation (`StreamSpec.durableReplay`), read only when one may be
 * pending (`replayCheck`): in steady state a session reads nothing more.
 */
const readObligation = (ctx: StreamContext) => {
  const store = ctx.cursors.replay
  if (ctx.spec.durableReplay !== true || store === undefined) return Effect.succeed(undefined)
  return Effect.flatMap(Ref.getAndSet(ctx.replayCheck, false), (check) =>
    check
      ? retryStore(
        ctx,
        store.load(ctx.spec.name, ctx.spec.relay),
        "replay obligation load failed; retrying before connecting"
      ).pipe(Effect.onInterrupt(() => Ref.set(ctx.replayCheck, true)))
      : Effect.succeed(undefined))
}

/** an obligation's replay point, raised to the spec's `resumeFloor` (what came before matched nothing that exists now) */
const obligationFrom = (spec: Pick<StreamSpec, "resumeFloor">, o: ReplayObligation | undefined) =>
  o === undefined ? undefined : spec.resumeFloor !== undefined && o.from < spec.resumeFloor ? spec.resumeFloor : o.from

/**
 * The durable cursor. A failed read is never taken for "no cursor stored" (that would start a
 * stream live, or from its initial cursor, and the next commit would raise the stored cursor
 * past everything unread): it is retried with the reconnect backoff (full jitter, capped, never
 * giving up), counted and logged by its code only, and no frame is read before it succeeds.
 */
const loadCursor = (ctx: StreamContext) => {
  const { loadEntry } = ctx.cursors
  const read: Effect.Effect<{ readonly cursor: bigint; readonly savedAtMs?: number } | undefined, StoreError> =
    loadEntry === undefined
      ? Effect.map(
        ctx.cursors.load(ctx.spec.name, ctx.spec.relay),
        (cursor) => cursor === undefined ? undefined : { cursor }
      )
      : loadEntry(ctx.spec.name, ctx.spec.relay)
  return retryStore(ctx, read, "cursor load failed; retrying before connecting")
}

/**
 * A session from the replay point asked for (taken from `replay`), which goes back to `replay`
 * (the earliest of it and any asked for since) unless the session committed a cursor (`acks`: a
 * batch that ends inside the session's first frame writes none), or the relay
 * said the cursor is in its future (nothing to replay: the stream goes live). It connects at or
 * below the durable replay obligation too (read when one may be pending), and its batches advance
 * it until they reach the stored cursor; one left pending is read again by the next session.
 * A live session (no cursor: a first start without one, the connection after a `FutureCursor`)
 * leaves where it started reading in `replay` the same way (its first frame's cursor − 1; a time
 * cursor's, from when it connected): a session that read frames and could not commit them (a
 * failed batch drops its queue, SPEC §3.3), or stopped at a poison frame, is resumed from there, not
 * live again, which would skip them and everything sent during the backoff for good. A session
 * of a stream with no durable cursor keeps the cursor it connected from (its initial cursor) so:
 * a replay asked for before its first commit reconnects from the earlier of the two, not from the
 * later replay point, past events it never committed.
 */
const sessionFrom = (ctx: StreamContext, replay: Ref.Ref<bigint | undefined>, live: boolean) =>
  Effect.gen(function*() {
    // the durable obligation first: a replay asked for meanwhile stays in `replay` (and has the
    // next session read the obligation again)
    const obligation = yield* readObligation(ctx)
    const requested = yield* Ref.getAndSet(replay, undefined)
    const wanted = earlierReplay(requested, obligationFrom(ctx.spec, obligation))
    const before = yield* Ref.get(ctx.state)
    const cursor = resumeCursor(ctx.spec, live && wanted === undefined, before, wanted)
    const pending: SessionReplay = yield* Ref.make(obligation?.seq)
    // where the session started reading, kept as a replay point until it commits a cursor: a live
    // session's (see `recordingFirstFrame`), and one's without a durable cursor (its initial
    // cursor, or the replay point it connected from): a replay asked for before its first commit
    // (a later point) must not move the stream's start past what it has not committed
    const started = cursor === undefined
      ? yield* Ref.make(yield* liveStart(ctx.spec))
      : before.durableCursor === undefined
      ? yield* Ref.make<bigint | undefined>(cursor)
      : undefined
    return yield* session(ctx, cursor, pending, cursor === undefined ? started : undefined).pipe(
      Effect.catchAllCause((cause) =>
        Cause.isInterruptedOnly(cause) ? Effect.failCause(cause) : Effect.succeed<SessionEnd>({ kind: "handler" })
      ),
      Effect.onExit((exit) =>
        Effect.flatMap(started === undefined ? Effect.succeed(undefined) : Ref.get(started), (from) => {
          // a FutureCursor drops both: nothing to replay (a live connection that got one: a
          // broken relay, which the loop backs off from)
          const keep = earlierReplay(requested, from)
          return keep === undefined || (Exit.isSuccess(exit) && exit.value.cursorOverride === -1n)
            ? Effect.void
            : Effect.flatMap(
              Ref.get(ctx.state),
              (after) =>
                // a cursor committed (a batch inside the first frame commits none: no progress)
                after.acks > before.acks ? Effect.void : Ref.update(replay, (p) => earlierReplay(p, keep))
            )
        })
      ),
      Effect.ensuring(
        Effect.flatMap(Ref.get(pending), (seq) => seq === undefined ? Effect.void : Ref.set(ctx.replayCheck, true))
      )
    )
  })

const loopFrom = (ctx: StreamContext, replay: Ref.Ref<bigint | undefined>) => {
  const { state, stopped, tagged, tuning } = ctx
  return Effect.gen(function*() {
    const entry = yield* loadCursor(ctx)
    const stored = entry?.cursor
    // a time cursor (Jetstream `time_us`) is the source time of the last event committed before
    // this process: the stream's cursor age (health) counts from it until this process commits
    // one, so a stream that never gets past its stored cursor (a poison frame right after it)
    // does not report a fresh cursor. A relay `seq` is no time: its age counts from the cursor's
    // last write (before, a relay stream stalled since startup reported 0 for ever)
    const loadedTimeUs = stored === undefined
      ? undefined
      : ctx.spec.cursorIsTime
      ? (stored <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(stored) : undefined)
      : entry?.savedAtMs === undefined || !Number.isFinite(entry.savedAtMs)
      ? undefined
      : Math.floor(entry.savedAtMs * 1000)
    yield* Ref.update(state, (s) => ({
      ...s,
      durableCursor: stored,
      lastEventTimeUs: s.lastEventTimeUs ?? loadedTimeUs
    }))
    yield* Deferred.succeed(ctx.loaded, undefined)
    let failures = 0
    let live = false
    for (;;) {
      const acksBefore = (yield* Ref.get(state)).acks
      const wasLive = live
      const end = yield* sessionFrom(ctx, replay, live)
      live = false
      // the session's scope is closed, so is its connection: its reader may have been
      // interrupted (the batcher ended the session on a poison or relay error frame) before it
      // marked the stream disconnected, which left health reporting a waiting stream connected.
      // Its queue is gone too (a failed batch drops it, SPEC §3.3): nothing is queued any more, or
      // the shutdown's drain, which waits for empty queues, would wait for it until its deadline
      yield* Ref.update(state, (x) => (x.connected || x.queued !== 0 ? { ...x, connected: false, queued: 0 } : x))
      if (yield* Deferred.isDone(stopped)) return yield* Effect.never
      yield* Ref.set(ctx.restartSignal, yield* Deferred.make<bigint | undefined>())
      const s = yield* Ref.get(state)
      // progress resets the backoff: a cursor committed (not a batch that wrote none)
      if (s.acks > acksBefore) failures = 0
      yield* Metric.increment(tagged.reconnects)
      if (end.kind === "restart") {
        // the replay point it asked for (if any) is in `replay`
        yield* Ref.update(state, (x) => ({ ...x, reconnects: x.reconnects + 1 }))
        continue
      }
      // the relay's FutureCursor: its seq space is behind our cursor. Go live, at once (a live
      // connection starts at the relay's present, so each second waited is a second never read);
      // a relay error frame, not a poison frame: nothing is quarantined. Only a relay that says
      // so to a live connection (no cursor: a broken relay) waits with the backoff
      const futureCursor = end.cursorOverride === -1n
      if (futureCursor) live = true
      const failureKind: FailureKind | undefined = end.kind === "closed" ? undefined : end.kind
      yield* Ref.update(state, (x) => ({
        ...x,
        reconnects: x.reconnects + 1,
        quarantined: end.kind === "protocol" && !futureCursor,
        failureKind: failureKind ?? x.failureKind
      }))
      if (end.kind !== "queue" && !(futureCursor && !wasLive)) {
        const wait = yield* fullJitter(tuning.backoffBase, tuning.backoffCap, failures)
        const delay = futureCursor ? wait : reconnectDelay(end.kind, wait, tuning)
        failures++
        if (end.kind !== "closed") {
          yield* ctx.logLimited("stream ended; reconnecting", { kind: end.kind })
        } else if (s.acks === acksBefore) {
          // the source closed the connection (or it broke) before anything committed: a source
          // that does so in a loop is otherwise invisible (no failure kind, SPEC §6.2). A close
          // after progress (a relay's deploy) is routine and stays quiet
          yield* ctx.logLimited("stream closed by the source before a commit; reconnecting", { kind: "closed" })
        }
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
const runFrom = (ctx: StreamContext, replay: Ref.Ref<bigint | undefined>, crashes = 0): Effect.Effect<never> =>
  loopFrom(ctx, replay).pipe(
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
          // resume from this process's position (or the durable cursor), or a replay point asked
          // for and not yet replayed
          return yield* runFrom(ctx, replay, crashes + 1)
        })
    ),
    Effect.orDie
  )

export const makeStreamRunner = (
  spec: StreamSpec,
  tuning: IntakeTuning,
  hooks: IdentityHooks = {}
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
    // the replay point asked for and not yet replayed (see `sessionFrom`)
    const replay = yield* Ref.make<bigint | undefined>(undefined)
    // the next session reads the durable replay obligation (the first one does)
    const replayCheck = yield* Ref.make(true)
    const loaded = yield* Deferred.make<void>()
    /**
     * ask for a replay from `cursor` (the earliest asked wins), kept until replayed; the next
     * session reads the durable obligation too (a registration asks for both)
     */
    const askReplay = (cursor: bigint | undefined) =>
      cursor === undefined
        ? Effect.void
        : Effect.zipRight(Ref.set(replayCheck, true), Ref.update(replay, (p) => earlierReplay(p, cursor)))
    // one limit for all of this stream's warnings: at most one a minute, whichever it is
    const limiter = RateLimitedLog.make()
    const logLimited = (message: string, annotations: Record<string, unknown>) =>
      limiter.run("stream", () =>
        Effect.logWarning(message).pipe(Effect.annotateLogs({ stream: spec.name, ...annotations })))
    const ctx: StreamContext = {
      spec,
      tuning,
      hooks,
      processor,
      cursors,
      outboxStore,
      state,
      restartSignal,
      stopped,
      tagged: streamMetrics(spec.name),
      logLimited,
      limiter,
      replayCheck,
      loaded
    }

    const runner: StreamRunner = {
      spec,
      state,
      // the replay point first: a session that ends (for whatever reason) before the signal
      // reaches it still finds the point at its reconnect
      restart: (cursor) =>
        Effect.zipRight(
          askReplay(cursor),
          Effect.flatMap(Ref.get(restartSignal), (d) =>
            Deferred.succeed(d, cursor))
        ),
      runFrom: (from) =>
        Effect.zipRight(Effect.zipRight(Ref.set(replayCheck, true), askReplay(from)), runFrom(ctx, replay)),
      run: Effect.zipRight(Ref.set(replayCheck, true), runFrom(ctx, replay)),
      stopReading: Deferred.succeed(stopped, undefined).pipe(Effect.asVoid),
      cursorLoaded: Deferred.await(loaded)
    }
    return runner
  })
