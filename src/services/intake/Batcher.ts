/**
 * The batcher of a session: takes the session's queue in order and commits its events in batches
 * (≤ batch limit) through `Processor.processEvents`, the cursor write last in the batch's
 * transaction; a failing batch is retried in place. A poison frame commits what came before it and
 * quarantines the stream; a relay error frame ends the session. Only after a commit does the
 * in-memory cursor move.
 */
import { Clock, Duration, Effect, Either, Metric, Queue, Ref } from "effect"
import type { StreamEvent } from "../../schemas/RecordEvent.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { sha256Hex } from "../matching/Canonical.js"
import type { ProcessOptions } from "../matching/Processor.js"
import type { ReplayAdvance } from "./CursorStore.js"
import { metrics, type SessionEnd, type SessionReplay, type StreamContext } from "./StreamModel.js"
import { type SessionQueue, weightOf } from "./StreamReader.js"

/**
 * The registry stream's durable replay obligation for a batch that registered a webhook (see
 * `StreamSpec.registrationReplay`): from the batch's first wh record's time (held to the clock,
 * `nowMs`, + {@link CURSOR_LEAD_US}) − the margin.
 */
const onRegistered = (
  ctx: StreamContext,
  events: ReadonlyArray<StreamEvent>,
  nowMs: number
): ProcessOptions["onRegistered"] => {
  const target = ctx.spec.registrationReplay
  const store = ctx.cursors.replay
  if (target === undefined || store === undefined) return undefined
  return ({ backlink }) => {
    let first: number | undefined
    for (const e of events) {
      if (e.kind === "commit" && e.collection === WH_COLLECTION && (first === undefined || e.timeUs < first)) {
        first = e.timeUs
      }
    }
    if (first === undefined) return Effect.void
    // held like a committed cursor: a mark may create the stream's row with its cursor at `at`
    const at = (heldCursor(ctx.spec, BigInt(first), nowMs) ?? BigInt(first)) - target.margin
    const targets = [{ stream: target.direct, createRow: false }]
    // a backlink stream without a cursor starts live: its row is made, from the registration
    if (backlink) targets.push({ stream: target.backlink, createRow: true })
    return store.mark(ctx.spec.relay, targets, at < 0n ? 0n : at)
  }
}

/**
 * How far ahead of the local clock a time cursor (Jetstream `time_us`) is committed: 5 minutes. A
 * frame stamped later than that (a clock glitch on the source's host, a wrong URL) would otherwise
 * become the stored cursor for good (a cursor is never lowered), and every later resume would
 * skip its downtime. A source legitimately ahead by more re-reads that lead at a resume (at least
 * once); one ahead by less loses nothing.
 */
export const CURSOR_LEAD_US = 300_000_000n

/** `cursor` held to the local clock (`nowMs`) + {@link CURSOR_LEAD_US}; a relay `seq` unchanged. */
export const heldCursor = (
  spec: Pick<StreamContext["spec"], "cursorIsTime">,
  cursor: bigint | undefined,
  nowMs: number
): bigint | undefined => {
  if (cursor === undefined || !spec.cursorIsTime) return cursor
  const ceiling = BigInt(Math.floor(nowMs)) * 1000n + CURSOR_LEAD_US
  return cursor > ceiling ? ceiling : cursor
}

/**
 * commit one batch (with in-place retries); returns false when the stream must fail. With a
 * durable replay obligation pending for the session (`replay`), the batch also advances it (in its
 * transaction, after its cursor write), so such a batch is never written by one statement.
 */
export const commit = (
  ctx: StreamContext,
  events: ReadonlyArray<StreamEvent>,
  frameCursor: bigint | undefined,
  replay?: SessionReplay
) => {
  const { spec, tuning, state, tagged, hooks } = ctx
  const { onIdentity, onReactivated } = hooks
  return Effect.gen(function*() {
    const toProcess = spec.skip === undefined ? events : events.filter((e) => !spec.skip?.(e))
    const start = yield* Clock.currentTimeMillis
    const cursor = heldCursor(spec, frameCursor, start)
    if (cursor !== frameCursor && cursor !== undefined && frameCursor !== undefined) {
      const aheadSeconds = Number((frameCursor - cursor + CURSOR_LEAD_US) / 1_000_000n)
      yield* ctx.limiter.run(
        "cursor_ahead",
        (suppressed) =>
          Effect.logWarning("frame stamped ahead of the local clock: cursor committed at the clock + 5 min").pipe(
            Effect.annotateLogs({ stream: spec.name, aheadSeconds, suppressed })
          )
      )
    }
    const registered = onRegistered(ctx, events, start)
    const base: ProcessOptions = registered === undefined
      ? { registryWriter: spec.registryWriter }
      : { registryWriter: spec.registryWriter, onRegistered: registered }
    const due = replay === undefined ? undefined : yield* Ref.get(replay)
    const replayStore = ctx.cursors.replay
    let advanced: ReplayAdvance | undefined
    const save = cursor === undefined ? undefined : ctx.cursors.save(spec.name, spec.relay, cursor)
    // the cursor write, as an effect and as data (a batch written by one statement includes it)
    const options: ProcessOptions = cursor === undefined || save === undefined
      ? base
      : due !== undefined && replayStore !== undefined
      ? {
        ...base,
        finalize: Effect.zipRight(
          save,
          Effect.map(replayStore.advance(spec.name, spec.relay, due, cursor), (r) => {
            advanced = r
          })
        )
      }
      : { ...base, finalize: save, cursor: { stream: spec.name, relay: spec.relay, cursor } }
    const attempt = ctx.processor.processEvents(toProcess, options)
    let result = yield* Effect.either(attempt)
    for (let n = 1; n < tuning.batchAttempts && Either.isLeft(result); n++) {
      yield* Metric.increment(tagged.batchRetries)
      yield* Effect.sleep(Duration.times(tuning.batchRetryBase, n))
      result = yield* Effect.either(attempt)
    }
    if (Either.isLeft(result)) {
      yield* ctx.logLimited("batch failed after retries; reconnecting from the durable cursor", {
        code: result.left.code,
        op: result.left.op
      })
      return false
    }
    if (replay !== undefined && advanced !== undefined && advanced !== "pending") {
      // replayed up to the stored cursor, or another obligation came since the session read it
      // (the next session reads it again)
      yield* Ref.set(replay, undefined)
      if (advanced === "superseded") yield* Ref.set(ctx.replayCheck, true)
    }
    const now = yield* Clock.currentTimeMillis
    yield* Metric.update(metrics.batchCommit, now - start)
    let lastTime: number | undefined
    for (const e of events) {
      lastTime = e.timeUs
      if (e.kind === "commit") continue
      if (onIdentity !== undefined) yield* onIdentity(e.did)
      if (onReactivated !== undefined && e.kind !== "identity") yield* onReactivated(e.did)
    }
    yield* Ref.update(state, (s) => ({
      ...s,
      durableCursor: cursor === undefined
        ? s.durableCursor
        : s.durableCursor === undefined || cursor > s.durableCursor
        ? cursor
        : s.durableCursor,
      position: cursor ?? s.position,
      lastAckAt: now,
      lastEventTimeUs: lastTime ?? s.lastEventTimeUs,
      batches: s.batches + 1,
      // progress only when the cursor moved: a batch ending inside a session's first frame writes none
      acks: cursor === undefined ? s.acks : s.acks + 1
    }))
    yield* Metric.incrementBy(tagged.events, events.length)
    yield* Metric.increment(tagged.batches)
    if (lastTime !== undefined) {
      yield* Metric.set(tagged.lag, Math.max(0, now / 1000 - lastTime / 1_000_000))
    }
    return true
  })
}

/** Commit the session's queue in batches until its end; returns why the session ended. */
export const runBatcher = (
  ctx: StreamContext,
  sq: SessionQueue,
  replay?: SessionReplay
): Effect.Effect<SessionEnd> => {
  const { spec, tuning, state } = ctx
  // events are committed in order; a frame's events may span batches
  let pending: Array<StreamEvent> = []
  let pendingCursor: bigint | undefined
  let lastFullCursor: bigint | undefined
  // the frame cursor of the last commit (as the frame gave it, before `heldCursor`): a frame held
  // to the clock is not committed again by the empty-frame path below
  let committedFrame: bigint | undefined
  const flush = Effect.gen(function*() {
    while (pending.length > 0) {
      const batch = pending.slice(0, tuning.batchMax)
      const rest = pending.slice(tuning.batchMax)
      const cursorForBatch = rest.length === 0 ? pendingCursor : lastFullCursor
      const ok = yield* commit(ctx, batch, cursorForBatch, replay)
      if (!ok) return false
      if (cursorForBatch !== undefined) committedFrame = cursorForBatch
      yield* Ref.update(state, (s) => ({ ...s, queued: Math.max(0, s.queued - batch.length) }))
      pending = rest
      if (rest.length === 0) lastFullCursor = pendingCursor
    }
    return true
  })
  return Effect.gen(function*() {
    for (;;) {
      const items = yield* Queue.takeBetween(sq.queue, 1, tuning.batchMax)
      let end: SessionEnd | undefined
      for (const item of items) {
        if (item._tag === "events") {
          // the frame leaves the queue's bound as it joins the batch
          sq.weight -= weightOf(item)
          for (const e of item.events) pending.push(e)
          pendingCursor = item.cursor
          if (item.events.length === 0 && pending.length === 0) lastFullCursor = item.cursor
          if (pending.length >= tuning.batchMax) {
            if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
          }
        } else if (item._tag === "poison") {
          if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
          // where the stream is stalled: the last frame committed before the poison one, or (a
          // poison frame first in its session) the cursor the stream had committed through
          let at = lastFullCursor
          if (at === undefined) {
            const st = yield* Ref.get(state)
            at = st.position ?? st.durableCursor
          }
          yield* ctx.outboxStore
            .insertQuarantine([
              {
                stream: spec.name,
                relay: spec.relay,
                reason: "protocol",
                eventHash: sha256Hex(`${spec.name}|${spec.relay}|${String(at ?? "")}|${item.reason}`),
                cursor: at
              }
            ])
            .pipe(Effect.ignore)
          yield* Metric.increment(ctx.tagged.quarantines)
          yield* ctx.logLimited("poison frame: stream quarantined", { reason: item.reason })
          return { kind: "protocol" } satisfies SessionEnd
        } else if (item._tag === "opened") {
          continue
        } else if (item._tag === "relay_error") {
          if (!(yield* flush)) return { kind: "handler" } satisfies SessionEnd
          yield* ctx.logLimited("relay error frame", { error: item.error })
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
      if (pending.length === 0 && lastFullCursor !== undefined && lastFullCursor !== committedFrame) {
        const durable = (yield* Ref.get(state)).durableCursor
        const held = heldCursor(spec, lastFullCursor, yield* Clock.currentTimeMillis)
        if (durable === undefined || (held !== undefined && held > durable)) {
          if (!(yield* commit(ctx, [], lastFullCursor, replay))) return { kind: "handler" } satisfies SessionEnd
          committedFrame = lastFullCursor
        }
      }
      if (end !== undefined) return end
    }
  })
}
