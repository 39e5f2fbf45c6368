/**
 * The reader of a session: reads the source's frames into the session's queue, bounded in events
 * (a relay frame weighs its operations), and ends the session on a poison or relay error frame, a
 * full queue, a closed or failed connection, a restart or a stop (the end marker is queued last).
 * A connection that sent a time cursor has its first frame's resume gap measured (`ResumeGap`).
 */
import { Deferred, Effect, Metric, Queue, Ref, Scheduler, Stream } from "effect"
import type { StreamEvent } from "../../schemas/RecordEvent.js"
import { firstFrameCursor, measuresGap, observeResumeGap } from "./ResumeGap.js"
import type { SessionEnd, SourceItem, StreamContext } from "./StreamModel.js"

/** a frame's weight against the queue bound (SPEC §3.3 counts events): its events, at least 1 */
export const weightOf = (item: { readonly events: ReadonlyArray<StreamEvent> }): number =>
  Math.max(1, item.events.length)

/** resume after the tasks already queued (socket events): a yield scheduled as a macrotask */
const afterPendingTasks = Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))

/** what a session's queue holds: source items, then the reader's end marker */
export type SessionItem = SourceItem | { readonly _tag: "end"; readonly end: SessionEnd }

/**
 * A session's queue. The bound counts events, not frames (SPEC §3.3: 512 events): a relay commit
 * frame carries any number of operations. A frame weighs its events, at least 1 (a frame without
 * events still takes a queue slot, and a Jetstream frame weighs exactly 1 as before), so the items
 * never outnumber the queue's capacity. `weight` is the weight of the frames the batcher has not
 * yet moved into its batch; both fibers update it between yields.
 */
export interface SessionQueue {
  readonly queue: Queue.Queue<SessionItem>
  weight: number
}

export const makeSessionQueue = (queueMax: number) =>
  Effect.map(
    // one extra slot so the reader's end marker always fits
    Queue.bounded<SessionItem>(queueMax + 1),
    (queue): SessionQueue => ({ queue, weight: 0 })
  )

/** Read one connection from `cursor` into the queue; ends with the end marker queued. */
export const readSession = (
  ctx: StreamContext,
  sq: SessionQueue,
  cursor: bigint | undefined,
  signal: Deferred.Deferred<bigint | undefined>
): Effect.Effect<void> => {
  const { spec, tuning, state } = ctx
  const queue = sq.queue
  let lastSingle = false
  // the cursor sent, until the first frame's resume gap is measured (once per connection)
  let gapFrom = measuresGap(ctx, cursor) ? cursor : undefined
  return Effect.gen(function*() {
    const endOf = yield* spec.connect(cursor).pipe(
      // one step per chunk of frames: one offer and one state update per chunk, not per frame
      Stream.chunks,
      Stream.runFoldWhileEffect(
        undefined as SessionEnd | undefined,
        (end) => end === undefined,
        (_, chunk) =>
          Effect.gen(function*() {
            if (gapFrom !== undefined) {
              const first = firstFrameCursor(chunk)
              if (first !== undefined) {
                yield* observeResumeGap(ctx, gapFrom, first)
                gapFrom = undefined
              }
            }
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
              } else if (sq.weight + added > 0 && sq.weight + added + weightOf(item) > tuning.queueMax) {
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
            sq.weight += added
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
      Effect.raceFirst(Deferred.await(ctx.stopped).pipe(Effect.as<SessionEnd>({ kind: "closed" })))
    )
    yield* Ref.update(state, (s) => ({ ...s, connected: false }))
    yield* queue.offer({ _tag: "end", end: endOf })
  }).pipe(
    // a defect while reading (a bug in the source or a decoder) ends the session as a
    // `handler` failure, so the loop backs off and reconnects from the last ack; without
    // this the reader fiber died alone and the batcher waited for its queue for ever
    Effect.catchAllDefect(() =>
      Effect.gen(function*() {
        yield* Metric.increment(ctx.tagged.crashes)
        yield* ctx.logLimited("stream reader crashed; reconnecting", { kind: "defect" })
        yield* Ref.update(state, (s) => ({ ...s, connected: false }))
        yield* queue.offer({ _tag: "end", end: { kind: "handler" } })
      })
    )
  )
}
