/**
 * Intake (SPEC §3): consumes the network's event stream durably.
 *
 * Each stream runs sessions: connect from the durable cursor (rewound a little; a failed read of it
 * is retried, never taken for "none stored"), read frames into a queue bounded in events (a relay
 * frame weighs its operations), and commit batches (≤ batch limit) through `Processor.processEvents` with the
 * cursor write as the batch transaction's last statement. Only after a commit does the in-memory
 * cursor move. A failing batch is retried in place (3 attempts, 250 ms × attempt); then the
 * session ends and the stream reconnects from its durable cursor with full-jitter backoff
 * (1 s → 5 min, never giving up). A full queue closes the socket, the queue is drained, and the
 * stream reconnects from the last durable cursor. A poison frame quarantines the stream: the
 * events before it commit, the rest is dropped, and it reconnects with a slower backoff; the cursor
 * never moves past an unprocessed frame.
 *
 * Sources: Jetstream (three streams: `registry` (wh records, from cursor 0 on first start, the
 * only registry writer), `direct` (wantedDids = owners ∪ scope DIDs; reconfigured when that set
 * changes, replaying from min(durable cursor, registration time − 2 s) for added DIDs), and
 * `backlink` (whole network, only while backlink scopes exist)); or the relay firehose (one stream
 * `relay` carrying everything).
 */
import { Cause, Clock, Context, Deferred, Duration, Effect, Either, Fiber, Layer, Metric, MetricBoundaries, Option, Queue, Random, Ref, Schedule, Scheduler, type Scope, Stream } from "effect"
import type { StreamEvent } from "../../schemas/RecordEvent.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { FirehookConfig, type FirehookConfigShape } from "../platform/Config.js"
import { labelledCounter, labelledGauge } from "../platform/Metrics.js"
import { CursorStore } from "./CursorStore.js"
import * as FirehoseSource from "./FirehoseSource.js"
import { Health } from "../platform/Health.js"
import { Identity } from "../reconciliation/Identity.js"
import { runAsLeader } from "../platform/Leader.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import * as Outbox from "../matching/Outbox.js"
import { Processor } from "../matching/Processor.js"
import { Registry } from "../registry/Registry.js"
import { sha256Hex } from "../matching/Canonical.js"
import * as LockKeys from "../platform/LockKeys.js"

// ---------------------------------------------------------------------------------------------
// Source items: what a session reads, whatever the wire format

export type SourceItem =
  /** the socket is open (and the hello sent) */
  | { readonly _tag: "opened" }
  | { readonly _tag: "events"; readonly events: ReadonlyArray<StreamEvent>; readonly cursor: bigint }
  | { readonly _tag: "poison"; readonly reason: string }
  /** a relay error frame (`FutureCursor`, `ConsumerTooSlow`, …) */
  | { readonly _tag: "relay_error"; readonly error: string }

export type FailureKind = "protocol" | "queue" | "handler" | "connect"

export interface StreamSpec {
  readonly name: string
  /** canonical relay URL: the cursor key and part of every event id */
  readonly relay: string
  readonly registryWriter: boolean
  /** cursor to use when none is stored (undefined = live) */
  readonly initialCursor: bigint | undefined
  /** subtracted from a cursor loaded from the database (2 s of time_us, or a few seqs) */
  readonly rewind: bigint
  /** whether cursors are microsecond times (for lag and cursor age) */
  readonly cursorIsTime: boolean
  readonly connect: (cursor: bigint | undefined) => Stream.Stream<SourceItem, FirehoseSource.SourceError>
  /** events of this stream that another stream handles (skipped before processing) */
  readonly skip?: (e: StreamEvent) => boolean
}

export interface StreamState {
  readonly connected: boolean
  readonly quarantined: boolean
  readonly failureKind: FailureKind | undefined
  readonly queued: number
  readonly durableCursor: bigint | undefined
  /** the cursor of the last batch this process committed (may be below a loaded cursor while replaying) */
  readonly position: bigint | undefined
  /** Clock millis of the last durable ack */
  readonly lastAckAt: number | undefined
  /** source time (µs) of the last committed event */
  readonly lastEventTimeUs: number | undefined
  readonly reconnects: number
  readonly batches: number
}

const initialState: StreamState = {
  connected: false,
  quarantined: false,
  failureKind: undefined,
  queued: 0,
  durableCursor: undefined,
  position: undefined,
  lastAckAt: undefined,
  lastEventTimeUs: undefined,
  reconnects: 0,
  batches: 0
}

export interface IntakeTuning {
  readonly queueMax: number
  readonly batchMax: number
  readonly batchAttempts: number
  readonly batchRetryBase: Duration.Duration
  readonly backoffBase: Duration.Duration
  readonly backoffCap: Duration.Duration
  /** minimum wait after a poison frame */
  readonly poisonBackoff: Duration.Duration
}

export const defaultTuning = (queueMax: number, batchMax: number): IntakeTuning => ({
  queueMax,
  batchMax,
  batchAttempts: 3,
  batchRetryBase: Duration.millis(250),
  backoffBase: Duration.seconds(1),
  backoffCap: Duration.minutes(5),
  poisonBackoff: Duration.seconds(10)
})

/**
 * The tuning of a configuration (`WEBHOOK_INTAKE_*`; their defaults are those of
 * {@link defaultTuning}, SPEC §3.3).
 */
export const tuningFromConfig = (intake: FirehookConfigShape["intake"]): IntakeTuning => ({
  queueMax: intake.queueMax,
  batchMax: intake.batchMax,
  batchAttempts: intake.batchAttempts,
  batchRetryBase: Duration.millis(intake.batchRetryBaseMs),
  backoffBase: Duration.millis(intake.backoffBaseMs),
  backoffCap: Duration.millis(intake.backoffMaxMs),
  poisonBackoff: Duration.millis(intake.poisonBackoffMs)
})

const METRIC_OPTIONS = {
  events: { description: "Events committed by intake" },
  batches: { description: "Batches committed by intake" },
  batchRetries: { description: "In-place batch retries" },
  quarantines: { description: "Streams quarantined by a poison frame" },
  reconnects: { description: "Stream reconnects" },
  cursorLoadFailures: { description: "Failed reads of the durable cursor at stream start (retried)" },
  crashes: { description: "Stream runner crashes (defects; the runner restarts)" },
  lag: { description: "Now minus the source time of the last committed event" }
}

const metrics = {
  batchCommit: Metric.histogram(
    "firehook_intake_batch_commit_ms",
    MetricBoundaries.fromIterable([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]),
    "Batch transaction duration in milliseconds"
  )
}

/** How much further back than the registry mark the direct stream may replay for a lagging backlink stream. */
export const DIRECT_REPLAY_MAX_EXTRA = 300_000_000n

/**
 * Where the direct stream replays from after DIDs joined the direct set (Jetstream, `time_us`): the
 * registry stream's position at the previous check (every DID added since was registered by a later
 * registry event) and the backlink stream's committed position then (from there on it skipped the
 * new DIDs' events, as they were in the direct set when it committed), whichever is earlier, less
 * `margin`; but at most `maxExtra` before the registry mark (a backlink stream far behind would
 * otherwise replay hours), and never below 0.
 */
export const directReplayFrom = (
  registryMark: bigint,
  backlinkMark: bigint | undefined,
  margin: bigint,
  maxExtra: bigint
): bigint => {
  const base = registryMark - margin
  const lagging = backlinkMark === undefined ? base : backlinkMark - margin
  const floor = base - maxExtra
  const from = lagging < base ? (lagging < floor ? floor : lagging) : base
  return from < 0n ? 0n : from
}

/** a frame's weight against the queue bound (SPEC §3.3 counts events): its events, at least 1 */
const weightOf = (item: { readonly events: ReadonlyArray<StreamEvent> }): number => Math.max(1, item.events.length)

/** resume after the tasks already queued (socket events): a yield scheduled as a macrotask */
const afterPendingTasks = Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))

/** Full jitter: a uniform random delay in [0, min(cap, base · 2^n)]. */
export const fullJitter = (base: Duration.Duration, cap: Duration.Duration, n: number) =>
  Effect.map(Random.next, (r) => {
    const ceiling = Math.min(Duration.toMillis(cap), Duration.toMillis(base) * 2 ** Math.min(n, 30))
    return Duration.millis(Math.floor(r * ceiling))
  })

// ---------------------------------------------------------------------------------------------
// One stream

interface SessionEnd {
  readonly kind: "closed" | "restart" | FailureKind
  readonly cursorOverride?: bigint | undefined
}

export interface StreamRunner {
  readonly spec: StreamSpec
  readonly state: Ref.Ref<StreamState>
  /** end the current session and reconnect at once, from min(durable, cursor) when given */
  readonly restart: (cursor: bigint | undefined) => Effect.Effect<void>
  /** run forever; the first connection starts at min(durable, `from`) when `from` is given */
  readonly runFrom: (from: bigint | undefined) => Effect.Effect<never>
  readonly run: Effect.Effect<never>
  /** stop reading (close the socket); queued events are still committed */
  readonly stopReading: Effect.Effect<void>
}

export const makeStreamRunner = (
  spec: StreamSpec,
  tuning: IntakeTuning,
  onIdentity?: (did: string) => Effect.Effect<void>
) =>
  Effect.gen(function* () {
    const processor = yield* Processor
    const cursors = yield* CursorStore
    const outboxStore = yield* Outbox.OutboxStore
    const state = yield* Ref.make<StreamState>(initialState)
    const restartSignal = yield* Ref.make<Deferred.Deferred<bigint | undefined>>(yield* Deferred.make<bigint | undefined>())
    const stopped = yield* Deferred.make<void>()
    let lastLogAt = Number.NEGATIVE_INFINITY
    // this stream's metrics, labelled once (labels in the key: `Metric.tagged` builds a key per update)
    const streamLabel = { stream: spec.name }
    const tagged = {
      batchRetries: labelledCounter("firehook_intake_batch_retries_total", METRIC_OPTIONS.batchRetries, streamLabel),
      events: labelledCounter("firehook_intake_events_total", METRIC_OPTIONS.events, streamLabel),
      batches: labelledCounter("firehook_intake_batches_total", METRIC_OPTIONS.batches, streamLabel),
      lag: labelledGauge("firehook_intake_lag_seconds", METRIC_OPTIONS.lag, streamLabel),
      quarantines: labelledCounter("firehook_intake_quarantines_total", METRIC_OPTIONS.quarantines, streamLabel),
      reconnects: labelledCounter("firehook_intake_reconnects_total", METRIC_OPTIONS.reconnects, streamLabel),
      cursorLoadFailures: labelledCounter("firehook_intake_cursor_load_failures_total", METRIC_OPTIONS.cursorLoadFailures, streamLabel),
      crashes: labelledCounter("firehook_intake_runner_crashes_total", METRIC_OPTIONS.crashes, streamLabel)
    }

    const logLimited = (message: string, annotations: Record<string, unknown>) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        if (now - lastLogAt < 60_000) return
        lastLogAt = now
        yield* Effect.logWarning(message).pipe(Effect.annotateLogs({ stream: spec.name, ...annotations }))
      })

    /** commit one batch (with in-place retries); returns false when the stream must fail */
    const commit = (events: ReadonlyArray<StreamEvent>, cursor: bigint | undefined) =>
      Effect.gen(function* () {
        const toProcess = spec.skip === undefined ? events : events.filter((e) => !spec.skip?.(e))
        const start = yield* Clock.currentTimeMillis
        // the cursor write, as an effect and as data (a batch written by one statement includes it)
        const attempt = processor.processEvents(
          toProcess,
          cursor === undefined
            ? { registryWriter: spec.registryWriter }
            : {
                registryWriter: spec.registryWriter,
                finalize: cursors.save(spec.name, spec.relay, cursor),
                cursor: { stream: spec.name, relay: spec.relay, cursor }
              }
        )
        let result = yield* Effect.either(attempt)
        for (let n = 1; n < tuning.batchAttempts && Either.isLeft(result); n++) {
          yield* Metric.increment(tagged.batchRetries)
          yield* Effect.sleep(Duration.times(tuning.batchRetryBase, n))
          result = yield* Effect.either(attempt)
        }
        if (Either.isLeft(result)) {
          yield* logLimited("batch failed after retries; reconnecting from the durable cursor", {
            code: result.left.code,
            op: result.left.op
          })
          return false
        }
        const now = yield* Clock.currentTimeMillis
        yield* Metric.update(metrics.batchCommit, now - start)
        let lastTime: number | undefined
        for (const e of events) {
          lastTime = e.timeUs
          if (onIdentity !== undefined && (e.kind === "identity" || e.kind === "account")) yield* onIdentity(e.did)
        }
        yield* Ref.update(state, (s) => ({
          ...s,
          durableCursor: cursor === undefined ? s.durableCursor : s.durableCursor === undefined || cursor > s.durableCursor ? cursor : s.durableCursor,
          position: cursor ?? s.position,
          lastAckAt: now,
          lastEventTimeUs: lastTime ?? s.lastEventTimeUs,
          batches: s.batches + 1
        }))
        yield* Metric.incrementBy(tagged.events, events.length)
        yield* Metric.increment(tagged.batches)
        if (lastTime !== undefined) {
          yield* Metric.set(tagged.lag, Math.max(0, now / 1000 - lastTime / 1_000_000))
        }
        return true
      })

    /** One connection: read into the queue, commit batches; returns why it ended. */
    const session = (cursor: bigint | undefined) =>
      Effect.scoped(
        Effect.gen(function* () {
          // one extra slot so the reader's end marker always fits
          const queue = yield* Queue.bounded<SourceItem | { readonly _tag: "end"; readonly end: SessionEnd }>(
            tuning.queueMax + 1
          )
          const signal = yield* Ref.get(restartSignal)
          // a new session has a new (empty) queue
          yield* Ref.update(state, (s) => ({ ...s, queued: 0 }))
          let lastSingle = false
          // The bound counts events, not frames (SPEC §3.3: 512 events): a relay commit frame carries
          // any number of operations. A frame weighs its events, at least 1 (a frame without events
          // still takes a queue slot, and a Jetstream frame weighs exactly 1 as before), so the items
          // never outnumber the queue's capacity. `queuedWeight` is the weight of the frames the
          // batcher has not yet moved into its batch; both fibers update it between yields.
          let queuedWeight = 0
          const reader = Effect.gen(function* () {
            const endOf = yield* spec.connect(cursor).pipe(
              // one step per chunk of frames: one offer and one state update per chunk, not per frame
              Stream.chunks,
              Stream.runFoldWhileEffect(
                undefined as SessionEnd | undefined,
                (end) => end === undefined,
                (_, chunk) =>
                  Effect.gen(function* () {
                    const toOffer: Array<SourceItem> = []
                    let events = 0
                    let opened = false
                    let end: SessionEnd | undefined
                    let added = 0
                    for (const item of chunk) {
                      if (item._tag === "opened") {
                        opened = true
                      } else if (item._tag === "poison" || item._tag === "relay_error") {
                        toOffer.push(item)
                        end = { kind: "protocol" }
                        break
                      } else if (queuedWeight + added > 0 && queuedWeight + added + weightOf(item) > tuning.queueMax) {
                        // backpressure: close the socket, keep (and drain) what is queued. A frame
                        // heavier than the whole bound is admitted into an empty queue (else the
                        // stream could never pass it)
                        end = { kind: "queue" }
                        break
                      } else {
                        toOffer.push(item)
                        events += item.events.length
                        added += weightOf(item)
                      }
                    }
                    if (opened) yield* Ref.update(state, (s) => ({ ...s, connected: true }))
                    queuedWeight += added
                    if (toOffer.length > 0) yield* queue.offerAll(toOffer)
                    if (events > 0) yield* Ref.update(state, (s) => ({ ...s, queued: s.queued + events }))
                    // a runtime that delivers each frame in a task of its own (Bun) wakes this fiber
                    // per frame: after two one-frame chunks in a row, let the pending socket tasks
                    // run first, so that the next pull takes the frames that arrived meanwhile as
                    // one chunk (Node delivers a socket read's frames together: rarely triggered)
                    const single = chunk.length === 1
                    if (end === undefined && single && lastSingle) yield* afterPendingTasks
                    lastSingle = single
                    return end
                  })
              ),
              Effect.map((end): SessionEnd => end ?? { kind: "closed" }),
              Effect.catchAll((e) =>
                Effect.succeed<SessionEnd>(
                  // a connection closed for silence (`idle`) is not a failure: reconnect at once from
                  // where this process got to, without backoff
                  e.kind === "idle"
                    ? { kind: "restart", cursorOverride: undefined }
                    : { kind: e.kind === "connect" ? "connect" : e.kind === "overflow" ? "queue" : "closed" }
                )
              ),
              Effect.raceFirst(
                Deferred.await(signal).pipe(Effect.map((c): SessionEnd => ({ kind: "restart", cursorOverride: c })))
              ),
              Effect.raceFirst(Deferred.await(stopped).pipe(Effect.as<SessionEnd>({ kind: "closed" })))
            )
            yield* Ref.update(state, (s) => ({ ...s, connected: false }))
            yield* queue.offer({ _tag: "end", end: endOf })
          }).pipe(
            // a defect while reading (a bug in the source or a decoder) ends the session as a
            // `handler` failure, so the loop backs off and reconnects from the last ack; without
            // this the reader fiber died alone and the batcher waited for its queue for ever
            Effect.catchAllDefect(() =>
              Effect.gen(function* () {
                yield* Metric.increment(tagged.crashes)
                yield* logLimited("stream reader crashed; reconnecting", { kind: "defect" })
                yield* Ref.update(state, (s) => ({ ...s, connected: false }))
                yield* queue.offer({ _tag: "end", end: { kind: "handler" } })
              })
            )
          )
          yield* Effect.forkScoped(reader)

          // the batcher: events are committed in order; a frame's events may span batches
          let pending: Array<StreamEvent> = []
          let pendingCursor: bigint | undefined
          let lastFullCursor: bigint | undefined
          const flush = Effect.gen(function* () {
            while (pending.length > 0) {
              const batch = pending.slice(0, tuning.batchMax)
              const rest = pending.slice(tuning.batchMax)
              const cursorForBatch = rest.length === 0 ? pendingCursor : lastFullCursor
              const ok = yield* commit(batch, cursorForBatch)
              if (!ok) return false
              yield* Ref.update(state, (s) => ({ ...s, queued: Math.max(0, s.queued - batch.length) }))
              pending = rest
              if (rest.length === 0) lastFullCursor = pendingCursor
            }
            return true
          })
          for (;;) {
            const items = yield* Queue.takeBetween(queue, 1, tuning.batchMax)
            let end: SessionEnd | undefined
            for (const item of items) {
              if (item._tag === "events") {
                // the frame leaves the queue's bound as it joins the batch
                queuedWeight -= weightOf(item)
                for (const e of item.events) pending.push(e)
                pendingCursor = item.cursor
                if (item.events.length === 0 && pending.length === 0) lastFullCursor = item.cursor
                if (pending.length >= tuning.batchMax) {
                  if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
                }
              } else if (item._tag === "poison") {
                if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
                yield* outboxStore
                  .insertQuarantine([
                    {
                      stream: spec.name,
                      relay: spec.relay,
                      reason: "protocol",
                      eventHash: sha256Hex(`${spec.name}|${spec.relay}|${String(lastFullCursor ?? "")}|${item.reason}`),
                      cursor: lastFullCursor
                    }
                  ])
                  .pipe(Effect.ignore)
                yield* Metric.increment(tagged.quarantines)
                yield* logLimited("poison frame: stream quarantined", { reason: item.reason })
                return { kind: "protocol" } satisfies SessionEnd
              } else if (item._tag === "opened") {
                continue
              } else if (item._tag === "relay_error") {
                if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
                yield* logLimited("relay error frame", { error: item.error })
                return item.error === "FutureCursor"
                  ? ({ kind: "protocol", cursorOverride: -1n } satisfies SessionEnd)
                  : ({ kind: "closed" } satisfies SessionEnd)
              } else {
                end = item.end
              }
            }
            // commit whatever is pending: events that arrived during the last commit form this batch
            if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
            // frames with no events still advance the cursor
            if (pending.length === 0 && lastFullCursor !== undefined) {
              const durable = (yield* Ref.get(state)).durableCursor
              if (durable === undefined || lastFullCursor > durable) {
                if (!(yield* commit([], lastFullCursor))) return { kind: "handler" } satisfies SessionEnd
              }
            }
            if (end !== undefined) return end
          }
        })
      )

    /**
     * The durable cursor. A failed read is never taken for "no cursor stored" (that would start a
     * stream live, or from its initial cursor, and the next commit would raise the stored cursor
     * past everything unread): it is retried with the reconnect backoff (full jitter, capped, never
     * giving up), counted and logged by its code only, and no frame is read before it succeeds.
     */
    const loadCursor = cursors.load(spec.name, spec.relay).pipe(
      Effect.tapError((e) =>
        Effect.zipRight(
          Effect.zipRight(
            Metric.increment(tagged.cursorLoadFailures),
            Ref.update(state, (s) => ({ ...s, failureKind: "handler" as const }))
          ),
          logLimited("cursor load failed; retrying before connecting", { code: e.code, op: e.op })
        )
      ),
      Effect.retry(Schedule.addDelayEffect(Schedule.forever, (n) => fullJitter(tuning.backoffBase, tuning.backoffCap, n)))
    )

    const loopFrom = (from: bigint | undefined) => Effect.gen(function* () {
      const stored = yield* loadCursor
      yield* Ref.update(state, (s) => ({ ...s, durableCursor: stored }))
      let failures = 0
      let override: bigint | undefined = from
      let live = false
      for (;;) {
        const { durableCursor: durable, position } = yield* Ref.get(state)
        let cursor: bigint | undefined
        if (live) cursor = undefined
        else if (durable === undefined) cursor = override ?? spec.initialCursor
        else {
          // resume exactly where this process got to; a cursor loaded from the database (another
          // process may have written it) is rewound. Rewinding on every reconnect, or resuming at
          // the loaded cursor while replaying below it, could replay more than the queue holds
          // after backpressure and never progress.
          const rewound = durable - spec.rewind
          const base = position ?? (rewound < 0n ? 0n : rewound)
          cursor = override !== undefined && override < base ? override : base
        }
        override = undefined
        live = false
        const acksBefore = (yield* Ref.get(state)).batches
        const end = yield* session(cursor).pipe(
          Effect.catchAllCause((cause) =>
            Cause.isInterruptedOnly(cause) ? Effect.failCause(cause) : Effect.succeed<SessionEnd>({ kind: "handler" })
          )
        )
        if (yield* Deferred.isDone(stopped)) return yield* Effect.never
        yield* Ref.set(restartSignal, yield* Deferred.make<bigint | undefined>())
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
          if (end.kind !== "closed") yield* logLimited("stream ended; reconnecting", { kind: end.kind })
          yield* Effect.sleep(delay).pipe(Effect.raceFirst(Deferred.await(stopped)))
        }
        yield* Ref.update(state, (x) => ({ ...x, quarantined: false }))
      }
    })

    /**
     * The session loop, restarted after a crash (a defect: a bug, never an expected failure, which
     * the loop handles itself). It resumes like a reconnect: from this process's position, else the
     * durable cursor (read again); after a full-jitter backoff that grows with consecutive crashes, so
     * a persistent bug cannot spin. The stream never gives up (SPEC §3.3). Logged by kind only: a
     * cause could carry values.
     */
    const runFrom = (from: bigint | undefined, crashes = 0): Effect.Effect<never> =>
      loopFrom(from).pipe(
        Effect.catchAllCause((c) =>
          Cause.isInterruptedOnly(c)
            ? Effect.failCause(c)
            : Effect.gen(function* () {
              yield* Metric.increment(tagged.crashes)
              yield* Ref.update(state, (x) => ({ ...x, connected: false, failureKind: "handler" as const }))
              yield* Effect.logError("stream runner crashed; restarting").pipe(
                Effect.annotateLogs({ kind: Cause.isDie(c) ? "defect" : "failure", crashes: crashes + 1 })
              )
              const wait = yield* fullJitter(tuning.backoffBase, tuning.backoffCap, crashes)
              yield* Effect.sleep(wait).pipe(Effect.raceFirst(Deferred.await(stopped)))
              // resume from this process's position (or the durable cursor), not the first replay point
              return yield* runFrom(undefined, crashes + 1)
            })
        ),
        Effect.orDie
      )

    const runner: StreamRunner = {
      spec,
      state,
      restart: (cursor) => Effect.flatMap(Ref.get(restartSignal), (d) => Deferred.succeed(d, cursor)),
      runFrom: (from) => runFrom(from),
      run: runFrom(undefined),
      stopReading: Deferred.succeed(stopped, undefined).pipe(Effect.asVoid)
    }
    return runner
  })

// ---------------------------------------------------------------------------------------------
// Sources

export const jetstreamItem = (item: FirehoseSource.JetstreamItem): SourceItem =>
  Either.isLeft(item)
    ? { _tag: "poison", reason: item.left.reason }
    : { _tag: "events", events: item.right.event === undefined ? [] : [item.right.event], cursor: item.right.cursor }

export const relayItem = (item: FirehoseSource.RelayItem): Option.Option<SourceItem> => {
  if (Either.isLeft(item)) return Option.some({ _tag: "poison", reason: item.left.reason })
  const r = item.right
  switch (r.kind) {
    case "events":
      return Option.some({ _tag: "events", events: r.events, cursor: r.seq })
    case "error":
      return Option.some({ _tag: "relay_error", error: r.error })
    default:
      return Option.none()
  }
}

/** A stream that opens a connection in its scope and emits `opened` before the frames. */
export const withOpened = <R>(
  open: Effect.Effect<Stream.Stream<SourceItem, FirehoseSource.SourceError>, FirehoseSource.SourceError, R | Scope.Scope>
): Stream.Stream<SourceItem, FirehoseSource.SourceError, Exclude<R, Scope.Scope>> =>
  Stream.unwrapScoped(Effect.map(open, (frames) => Stream.concat(Stream.succeed<SourceItem>({ _tag: "opened" }), frames)))

/** The canonical form of a relay URL (used in cursor keys and event ids). */
export const canonicalRelay = (url: string): string => {
  if (!URL.canParse(url)) return url
  const u = new URL(url)
  return `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, "")}`
}

// ---------------------------------------------------------------------------------------------
// The service

export interface IntakeStats {
  readonly running: boolean
  readonly streams: ReadonlyArray<{ readonly name: string; readonly state: StreamState }>
}

export interface IntakeShape {
  /** run intake until interrupted (the leader calls this) */
  readonly run: Effect.Effect<never>
  readonly stats: Effect.Effect<IntakeStats>
  /** stop accepting frames: close sockets; queued events are still committed */
  readonly stopAccepting: Effect.Effect<void>
}

export class Intake extends Context.Tag("firehook/Intake")<Intake, IntakeShape>() {}

export interface IntakeOptions {
  /** called for every committed `#identity` / `#account` event (identity cache invalidation) */
  readonly onIdentity?: (did: string) => Effect.Effect<void>
  /** how long direct-set changes are coalesced before reconfiguring (default 1 s) */
  readonly reconfigureDelay?: Duration.DurationInput
  readonly tuning?: Partial<IntakeTuning>
}

export const make = (options: IntakeOptions = {}) =>
  Effect.gen(function* () {
    const config = yield* FirehookConfig
    const registry = yield* Registry
    const index = registry.index
    const tuning: IntakeTuning = { ...tuningFromConfig(config.intake), ...options.tuning }
    const reconfigureDelay = Duration.decode(options.reconfigureDelay ?? "1 second")
    const common = {
      maxBytes: config.intake.eventMaxBytes,
      connectTimeoutMs: 10_000,
      allowInsecure: config.allowInsecureDev
    }
    const runners = yield* Ref.make<ReadonlyArray<StreamRunner>>([])
    const running = yield* Ref.make(false)
    const ctx = yield* Effect.context<Processor | CursorStore | Outbox.OutboxStore>()

    const makeRunner = (spec: StreamSpec) => makeStreamRunner(spec, tuning, options.onIdentity).pipe(Effect.provide(ctx))
    /** run a stream; it is listed (health, shutdown) only while it runs */
    const start = (r: StreamRunner, from: bigint | undefined) =>
      Effect.acquireUseRelease(
        Ref.update(runners, (xs) => [...xs.filter((x) => x.spec.name !== r.spec.name), r]),
        () => r.runFrom(from),
        () => Ref.update(runners, (xs) => xs.filter((x) => x !== r))
      )

    const runRelay = Effect.gen(function* () {
      const relay = canonicalRelay(config.intake.relayUrl)
      const r = yield* makeRunner({
        name: "relay",
        relay,
        registryWriter: true,
        initialCursor: undefined,
        rewind: 10n,
        cursorIsTime: false,
        connect: (cursor) =>
          withOpened(
            Effect.map(
              FirehoseSource.openRelay({ ...common, url: config.intake.relayUrl, cursor, stream: "relay", relay }),
              (c) => c.frames.pipe(Stream.filterMap(relayItem))
            )
          )
      })
      return yield* start(r, undefined)
    })

    const runJetstream = Effect.gen(function* () {
      const relay = canonicalRelay(config.intake.jetstreamUrl)
      const url = config.intake.jetstreamUrl
      const jet = (name: string, filters: { wantedCollections?: ReadonlyArray<string>; wantedDids?: () => ReadonlyArray<string> }) =>
        (cursor: bigint | undefined) =>
          withOpened(
            Effect.suspend(() =>
              FirehoseSource.openJetstream({
                ...common,
                url,
                cursor,
                stream: name,
                relay,
                // a filtered stream (registry: wh records only; direct: a few DIDs) can be quiet for
                // hours, and each idle reconnect would replay from its last event: only the
                // unfiltered backlink stream has the idle watchdog
                ...(filters.wantedCollections === undefined && filters.wantedDids === undefined ? {} : { idleTimeoutMs: 0 }),
                ...(filters.wantedCollections === undefined ? {} : { wantedCollections: filters.wantedCollections }),
                ...(filters.wantedDids === undefined ? {} : { wantedDids: filters.wantedDids() })
              })
            ).pipe(Effect.map((c) => c.frames.pipe(Stream.map(jetstreamItem))))
          )
      const TWO_SECONDS = 2_000_000n
      const registryRunner = yield* makeRunner({
        name: "registry",
        relay,
        registryWriter: true,
        initialCursor: 0n,
        rewind: TWO_SECONDS,
        cursorIsTime: true,
        connect: jet("registry", { wantedCollections: [WH_COLLECTION] })
      })
      const sortedWanted = () => [...index.wantedDids()].sort()
      const directRunner = yield* makeRunner({
        name: "direct",
        relay,
        registryWriter: false,
        // never run before: every registered DID may have events since its registration, which
        // lies somewhere in the retained window (its exact source time is not stored)
        initialCursor: 0n,
        rewind: TWO_SECONDS,
        cursorIsTime: true,
        connect: jet("direct", { wantedDids: sortedWanted }),
        skip: (e) => e.kind === "commit" && e.collection === WH_COLLECTION
      })
      const backlinkSpec: StreamSpec = {
        name: "backlink",
        relay,
        registryWriter: false,
        initialCursor: undefined,
        rewind: TWO_SECONDS,
        cursorIsTime: true,
        connect: jet("backlink", {}),
        // events from the direct set and wh records are handled by the other streams
        skip: (e) => e.kind !== "commit" || e.collection === WH_COLLECTION || index.wantedDids().has(e.did)
      }

      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* Effect.forkScoped(start(registryRunner, undefined))
          // the direct stream runs only while the direct set is non-empty; the backlink stream only
          // while backlink scopes exist; both follow registry changes (coalesced)
          let directFiber: Fiber.RuntimeFiber<never> | undefined
          let backlinkFiber: Fiber.RuntimeFiber<never> | undefined
          let wantedVersion = -1
          let known = new Set<string>()
          let first = true
          // the registry stream's position at the previous check: every DID added since was
          // registered by a later registry event, so replaying from it (− 2 s) misses nothing
          const registryMark = Effect.map(Ref.get(registryRunner.state), (st) =>
            st.lastEventTimeUs !== undefined ? BigInt(st.lastEventTimeUs) : (st.durableCursor ?? 0n)
          )
          let prevMark = 0n
          // the backlink stream's committed position at the previous check: it skips the events of
          // DIDs in the direct set as the set is when it commits, so a DID added since was skipped
          // from about there on, and the direct stream must replay from there too
          let backlinkRunner: StreamRunner | undefined
          let prevBacklinkMark: bigint | undefined
          for (;;) {
            const markNow = yield* registryMark
            const backlinkNow = backlinkRunner === undefined
              ? undefined
              : yield* Effect.map(Ref.get(backlinkRunner.state), (st) => st.position ?? st.durableCursor)
            const replayFrom = first ? undefined : directReplayFrom(prevMark, prevBacklinkMark, TWO_SECONDS, DIRECT_REPLAY_MAX_EXTRA)
            const wanted = index.wantedDids()
            if (index.wantedDidsVersion !== wantedVersion) {
              wantedVersion = index.wantedDidsVersion
              const next = new Set(wanted)
              const added = [...next].filter((d) => !known.has(d))
              const valid = next.size <= config.registry.directDidsMax
              if (!valid) {
                yield* Effect.logWarning("direct set over its limit; keeping the previous plan")
              } else {
                if (next.size === 0 && directFiber !== undefined) {
                  yield* Fiber.interrupt(directFiber)
                  directFiber = undefined
                } else if (next.size > 0 && directFiber === undefined) {
                  directFiber = yield* Effect.forkScoped(start(directRunner, replayFrom))
                } else if (added.length > 0) {
                  yield* directRunner.restart(replayFrom)
                } else if (known.size !== next.size) {
                  yield* directRunner.restart(undefined)
                }
                known = next
              }
            }
            first = false
            prevMark = markNow
            prevBacklinkMark = backlinkNow
            const wantBacklink = index.backlinkDids().size > 0
            if (wantBacklink && backlinkFiber === undefined) {
              const r = yield* makeRunner(backlinkSpec)
              backlinkRunner = r
              backlinkFiber = yield* Effect.forkScoped(start(r, undefined))
            } else if (!wantBacklink && backlinkFiber !== undefined) {
              yield* Fiber.interrupt(backlinkFiber)
              backlinkFiber = undefined
              backlinkRunner = undefined
            }
            yield* Effect.sleep(reconfigureDelay)
          }
        })
      )
      return yield* Effect.never
    })

    const run = Effect.gen(function* () {
      yield* Ref.set(running, true)
      return yield* config.intake.source === "relay" ? runRelay : runJetstream
    }).pipe(Effect.ensuring(Ref.set(running, false).pipe(Effect.zipRight(Ref.set(runners, [])))))

    const stats = Effect.gen(function* () {
      const rs = yield* Ref.get(runners)
      const streams: Array<{ name: string; state: StreamState }> = []
      for (const r of rs) streams.push({ name: r.spec.name, state: yield* Ref.get(r.state) })
      return { running: yield* Ref.get(running), streams }
    })

    const stopAccepting = Effect.flatMap(Ref.get(runners), (rs) => Effect.forEach(rs, (r) => r.stopReading, { discard: true }))
    const shape: IntakeShape = { run: run as Effect.Effect<never>, stats, stopAccepting }
    return shape
  })

/** the intake section of /health (SPEC §6.2) */
export const healthSection = (
  intake: IntakeShape,
  role: Effect.Effect<"leader" | "standby">,
  registry: Effect.Effect<{ readonly rejected: Readonly<Record<string, number>> }>,
  progressWindowMs = 60_000
) =>
  Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    const stats = yield* intake.stats
    const r = yield* role
    const reg = yield* registry
    const perStream: Record<string, { connected: boolean; quarantined: boolean; failureKind: string | null; cursorAgeSeconds: number; queued: number }> = {}
    let progressing = true
    let connected = stats.streams.length > 0
    let queued = 0
    for (const { name, state } of stats.streams) {
      const acked = state.lastAckAt !== undefined && now - state.lastAckAt <= progressWindowMs
      if (!(state.connected || acked)) progressing = false
      if (!state.connected) connected = false
      queued += state.queued
      perStream[name] = {
        connected: state.connected,
        quarantined: state.quarantined,
        failureKind: state.failureKind ?? null,
        cursorAgeSeconds: state.lastEventTimeUs === undefined ? 0 : Math.max(0, Math.floor(now / 1000 - state.lastEventTimeUs / 1_000_000)),
        queued: state.queued
      }
    }
    // a standby is healthy by definition; a leader must be progressing
    const healthy = r === "standby" || (stats.running && stats.streams.length > 0 && progressing)
    return {
      ready: healthy,
      body: {
        role: r,
        connected,
        progressing: r === "standby" ? true : progressing,
        queued,
        streams: perStream,
        admission: {
          rejectedTotal: reg.rejected["total"] ?? 0,
          rejectedOwner: reg.rejected["owner"] ?? 0,
          rejectedDirectDids: reg.rejected["direct_dids"] ?? 0,
          rejectedBacklinkDids: reg.rejected["backlink_dids"] ?? 0
        }
      }
    }
  })

export const INTAKE_LOCK_KEY = LockKeys.INTAKE

/** Intake under leader election, with health and shutdown registration. */
export const layer = (options: IntakeOptions = {}) =>
  Layer.scopedDiscard(
    Effect.gen(function* () {
      const identity = yield* Effect.serviceOption(Identity)
      const intake = yield* make({
        ...options,
        ...(Option.isSome(identity) ? { onIdentity: (did: string) => identity.value.invalidate(did) } : {})
      })
      const role = yield* Ref.make<"leader" | "standby">("standby")
      const registry = yield* Registry
      const health = yield* Health
      const lifecycle = yield* Lifecycle
      // a replica taking the role reloads the registry first: while it stood by, the leader's
      // intake changed the database but not this process's in-memory index
      const work = Effect.zipRight(Effect.orDie(registry.reload), intake.run)
      const fiber = yield* Effect.forkScoped(runAsLeader({ key: INTAKE_LOCK_KEY, name: "intake" }, role, work))
      yield* health.register("intake", healthSection(intake, Ref.get(role), registry.stats))
      yield* lifecycle.registerStop("intake-stop", "intake-stop", intake.stopAccepting)
      yield* lifecycle.registerStop(
        "intake-drain",
        "intake-drain",
        // queued events are committed by the sessions after the sockets close; then stop the runners
        Effect.gen(function* () {
          for (let i = 0; i < 600; i++) {
            const s = yield* intake.stats
            if (s.streams.every((x) => x.state.queued === 0)) break
            yield* Effect.sleep("50 millis")
          }
          yield* Fiber.interrupt(fiber)
        })
      )
    })
  )
