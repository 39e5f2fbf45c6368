/**
 * The resume gap of a Jetstream connection (observation only: no cursor or event changes).
 *
 * A Jetstream v1 `/subscribe` asked for a `cursor` older than its retained window starts at its
 * oldest event and says nothing (shared/reference/atproto.md §1.2–1.3): the events in between are
 * never read. (A relay says `#info OutdatedCursor`, which intake logs.) So, for each connection that
 * sent a cursor (> 0: cursor 0 asks for the whole window), the first event's `time_us` is compared
 * with the cursor sent (after the rewind) once:
 * - the gap (first event − cursor sent) is the gauge `firehook_intake_resume_gap_seconds{stream}`;
 * - on a stream a live network never leaves {@link RESUME_GAP_WARN_US} without an event
 *   (`StreamSpec.resumeGapWarnUs`: the registry stream, which gets every DID's `#identity` and
 *   `#account` events, and the unfiltered backlink stream; not the direct stream, whose few DIDs
 *   may be quiet for days), a gap over it whose first event is itself older than it when it
 *   arrives (a replayed event, not a live one on a quiet network) is warned about (at most once a
 *   minute per stream, with `suppressed`) and counted (`firehook_intake_resume_gaps_total{stream}`).
 * The warning carries the stream and the gap in seconds: no cursor, no URL.
 */
import { Clock, Effect, Metric } from "effect"
import type { SourceItem, StreamContext } from "./StreamModel.js"

/**
 * 10 minutes of `time_us`. A live registry or backlink connection is never that long without a
 * frame: their idle watchdog closes one silent for 5 to 10 minutes as a dead connection. A clamped
 * cursor gives hours (the window is 24–36 h on public instances), a resume on a live network about
 * the 2 s rewind.
 */
export const RESUME_GAP_WARN_US = 600_000_000n

/**
 * The gap of a resume (µs) and whether it is warned about: a stream with a threshold, a gap over
 * it, and a first event older than it at `nowUs` (its arrival).
 */
export const resumeGap = (
  sentUs: bigint,
  firstUs: bigint,
  nowUs: bigint,
  warnUs: bigint | undefined
): { readonly gapUs: bigint; readonly warn: boolean } => {
  const gapUs = firstUs - sentUs
  return { gapUs, warn: warnUs !== undefined && gapUs > warnUs && nowUs - firstUs > warnUs }
}

/** The cursor of the first frame of `items` that carries one (undefined: none yet). */
export const firstFrameCursor = (items: Iterable<SourceItem>): bigint | undefined => {
  for (const item of items) if (item._tag === "events") return item.cursor
  return undefined
}

/** whether a connection from `cursor` has a resume gap to measure (a time cursor, sent, not 0) */
export const measuresGap = (ctx: StreamContext, cursor: bigint | undefined): cursor is bigint =>
  ctx.spec.cursorIsTime && cursor !== undefined && cursor > 0n

/** Measure the gap of a connection that sent `sentUs` and whose first frame is at `firstUs`. */
export const observeResumeGap = (ctx: StreamContext, sentUs: bigint, firstUs: bigint): Effect.Effect<void> =>
  Effect.gen(function*() {
    const nowMs = yield* Clock.currentTimeMillis
    const { gapUs, warn } = resumeGap(sentUs, firstUs, BigInt(Math.floor(nowMs)) * 1000n, ctx.spec.resumeGapWarnUs)
    const gapSeconds = Number(gapUs) / 1_000_000
    yield* Metric.set(ctx.tagged.resumeGap, gapSeconds)
    if (!warn) return
    yield* Metric.increment(ctx.tagged.resumeGaps)
    yield* ctx.limiter.run("resume_gap", (suppressed) =>
      Effect.logWarning(
        "stream resumed after a gap: events between the cursor and the first event may have been skipped"
      ).pipe(
        Effect.annotateLogs({ stream: ctx.spec.name, gapSeconds: Math.floor(gapSeconds), suppressed })
      ))
  }).pipe(
    // observation only: whatever happens here never ends or stalls the session
    Effect.catchAllDefect(() => Effect.void)
  )
