/**
 * One intake stream, as data: what a session reads (source items, whatever the wire format), the
 * stream's specification and state, its tuning, its metrics, and the context its reader, batcher
 * and loop share (see `StreamRunner`).
 */
import { Deferred, Duration, Effect, Metric, MetricBoundaries, Ref, Stream } from "effect"
import type { StreamEvent } from "../../schemas/RecordEvent.js"
import type * as Outbox from "../matching/Outbox.js"
import type { ProcessorShape } from "../matching/Processor.js"
import type { FirehookConfigShape } from "../platform/Config.js"
import { labelledCounter, labelledGauge } from "../platform/Metrics.js"
import type * as RateLimitedLog from "../platform/RateLimitedLog.js"
import type { CursorStoreShape } from "./CursorStore.js"
import type * as FirehoseSource from "./FirehoseSource.js"
import * as IntakeConfig from "./IntakeConfig.js"

// ---------------------------------------------------------------------------------------------
// Source items: what a session reads, whatever the wire format

export type SourceItem =
  /** the socket is open (and the hello sent) */
  | { readonly _tag: "opened" }
  | { readonly _tag: "events"; readonly events: ReadonlyArray<StreamEvent>; readonly cursor: bigint }
  | { readonly _tag: "poison"; readonly reason: string }
  /** a relay error frame (`FutureCursor`, `ConsumerTooSlow`, …) */
  | { readonly _tag: "relay_error"; readonly error: string }

/** why a stream failed, as its health reports it */
export const FAILURE_KINDS = ["protocol", "queue", "handler", "connect"] as const
export type FailureKind = (typeof FAILURE_KINDS)[number]

export interface StreamSpec {
  readonly name: string
  /** canonical relay URL: the cursor key and part of every event id */
  readonly relay: string
  readonly registryWriter: boolean
  /** cursor to use when none is stored (undefined = live) */
  readonly initialCursor: bigint | undefined
  /** subtracted from a cursor loaded from the database (2 s of time_us, or a few seqs) */
  readonly rewind: bigint
  /**
   * a loaded cursor (rewound) below this is raised to it: the stream starts again for
   * subscriptions registered after it, and what came before matched nothing that exists now
   */
  readonly resumeFloor?: bigint | undefined
  /**
   * whether cursors are microsecond times (for lag and cursor age; and the resume gap of a
   * connection that sent one, `ResumeGap`)
   */
  readonly cursorIsTime: boolean
  /**
   * a stream that a live network never leaves this long (µs) without an event: a resume whose
   * first event is later than this after the cursor sent, and older than this when it arrives, is
   * warned about and counted (`ResumeGap`); undefined: the gap is only measured
   */
  readonly resumeGapWarnUs?: bigint | undefined
  readonly connect: (cursor: bigint | undefined) => Stream.Stream<SourceItem, FirehoseSource.SourceError>
  /** events of this stream that another stream handles (skipped before processing) */
  readonly skip?: (e: StreamEvent) => boolean
  /**
   * The registry stream of a plan whose other streams replay for a new registration (SPEC §3.1):
   * its batch that registers a webhook writes, in its transaction, the durable replay obligation
   * (the first wh record's time − `margin`) of the `direct` stream, and of the `backlink` stream
   * for a backlink webhook (`CursorStore.ReplayStore.mark`)
   */
  readonly registrationReplay?: {
    readonly direct: string
    readonly backlink: string
    readonly margin: bigint
  } | undefined
  /**
   * a stream that follows its durable replay obligation: a session reads it (when one may be
   * pending), connects at or below it and clears it once it has replayed up to its stored cursor
   */
  readonly durableReplay?: boolean | undefined
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
  /**
   * source time (µs) of the last committed event; until this process commits one, a loaded time
   * cursor, or (a relay `seq`) the time the loaded cursor was last written
   */
  readonly lastEventTimeUs: number | undefined
  readonly reconnects: number
  /** batches committed by this process (a batch that ends inside a frame writes no cursor) */
  readonly batches: number
  /**
   * the committed batches that wrote a cursor (the stream's progress): a batch that ends inside a
   * session's first frame (a relay commit with more ops than the batch limit) commits events but
   * no cursor, and a reconnect would not resume past them
   */
  readonly acks: number
}

export const initialState: StreamState = {
  connected: false,
  quarantined: false,
  failureKind: undefined,
  queued: 0,
  durableCursor: undefined,
  position: undefined,
  lastAckAt: undefined,
  lastEventTimeUs: undefined,
  reconnects: 0,
  batches: 0,
  acks: 0
}

// ---------------------------------------------------------------------------------------------
// Tuning

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
  batchAttempts: IntakeConfig.intake.batchAttempts.default,
  batchRetryBase: Duration.millis(IntakeConfig.intake.batchRetryBaseMs.default),
  backoffBase: Duration.millis(IntakeConfig.intake.backoffBaseMs.default),
  backoffCap: Duration.millis(IntakeConfig.intake.backoffMaxMs.default),
  poisonBackoff: Duration.millis(IntakeConfig.intake.poisonBackoffMs.default)
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

// ---------------------------------------------------------------------------------------------
// Metrics

const METRIC_OPTIONS = {
  events: { description: "Events committed by intake" },
  batches: { description: "Batches committed by intake" },
  batchRetries: { description: "In-place batch retries" },
  quarantines: { description: "Streams quarantined by a poison frame" },
  reconnects: { description: "Stream reconnects" },
  cursorLoadFailures: { description: "Failed reads of the durable cursor at stream start (retried)" },
  crashes: { description: "Stream runner crashes (defects; the runner restarts)" },
  lag: { description: "Now minus the source time of the last committed event" },
  resumeGap: { description: "First event's source time minus the cursor sent, at the last resume" },
  resumeGaps: { description: "Resumes whose first event came after a gap a live network cannot have" }
}

export const metrics = {
  batchCommit: Metric.histogram(
    "firehook_intake_batch_commit_ms",
    MetricBoundaries.fromIterable([1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000]),
    "Batch transaction duration in milliseconds"
  )
}

/** a stream's metrics, labelled once (labels in the key: `Metric.tagged` builds a key per update) */
export const streamMetrics = (stream: string) => {
  const streamLabel = { stream }
  return {
    batchRetries: labelledCounter("firehook_intake_batch_retries_total", METRIC_OPTIONS.batchRetries, streamLabel),
    events: labelledCounter("firehook_intake_events_total", METRIC_OPTIONS.events, streamLabel),
    batches: labelledCounter("firehook_intake_batches_total", METRIC_OPTIONS.batches, streamLabel),
    lag: labelledGauge("firehook_intake_lag_seconds", METRIC_OPTIONS.lag, streamLabel),
    quarantines: labelledCounter("firehook_intake_quarantines_total", METRIC_OPTIONS.quarantines, streamLabel),
    reconnects: labelledCounter("firehook_intake_reconnects_total", METRIC_OPTIONS.reconnects, streamLabel),
    cursorLoadFailures: labelledCounter(
      "firehook_intake_cursor_load_failures_total",
      METRIC_OPTIONS.cursorLoadFailures,
      streamLabel
    ),
    crashes: labelledCounter("firehook_intake_runner_crashes_total", METRIC_OPTIONS.crashes, streamLabel),
    resumeGap: labelledGauge("firehook_intake_resume_gap_seconds", METRIC_OPTIONS.resumeGap, streamLabel),
    resumeGaps: labelledCounter("firehook_intake_resume_gaps_total", METRIC_OPTIONS.resumeGaps, streamLabel)
  }
}

// ---------------------------------------------------------------------------------------------
// A running stream

/** why a session ended */
export interface SessionEnd {
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
  /**
   * completes once the stream has read its durable cursor (its state's `durableCursor` and
   * `lastEventTimeUs` are the stored ones from then on); never while it does not run. Absent: the
   * state is known from the start
   */
  readonly cursorLoaded?: Effect.Effect<void> | undefined
}

/** What intake calls, after a batch commits, for its `#identity` / `#account` events. */
export interface IdentityHooks {
  /** every `#identity` / `#account` event (identity cache invalidation) */
  readonly onIdentity?: ((did: string) => Effect.Effect<void>) | undefined
  /** every `#account` event (either `active`) and `#sync` event (the owner's reconciliation request) */
  readonly onReactivated?: ((did: string) => Effect.Effect<void>) | undefined
}

/** What a stream's reader, batcher and loop share: its spec, services, state and signals. */
export interface StreamContext {
  readonly spec: StreamSpec
  readonly tuning: IntakeTuning
  readonly hooks: IdentityHooks
  readonly processor: ProcessorShape
  readonly cursors: CursorStoreShape
  readonly outboxStore: Outbox.OutboxStoreShape
  readonly state: Ref.Ref<StreamState>
  /** completed to end the current session (with the cursor to restart from) */
  readonly restartSignal: Ref.Ref<Deferred.Deferred<bigint | undefined>>
  /** completed when the stream stops reading */
  readonly stopped: Deferred.Deferred<void>
  readonly tagged: ReturnType<typeof streamMetrics>
  /** a warning, at most once a minute per stream */
  readonly logLimited: (message: string, annotations: Record<string, unknown>) => Effect.Effect<void>
  /** the stream's limiter, for a warning limited by a key of its own (`logLimited` uses `stream`) */
  readonly limiter: RateLimitedLog.RateLimitedLog
  /**
   * whether the next session reads the durable replay obligation (`StreamSpec.durableReplay`): at
   * the runner's start, after a replay was asked, after a session that left one pending
   */
  readonly replayCheck: Ref.Ref<boolean>
  /** completed once the durable cursor was first read into `state` (`StreamRunner.cursorLoaded`) */
  readonly loaded: Deferred.Deferred<void>
}

/**
 * The durable replay obligation a session connected for (its `replay_seq`), until its commits
 * have replayed it up to the stored cursor (undefined: none, or done).
 */
export type SessionReplay = Ref.Ref<bigint | undefined>
