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
 *
 * After a batch commits, its `#identity`/`#account`/`#sync` events invalidate identity caches
 * (`onIdentity`), and its `#account` (either `active`) and `#sync` events request the owner's
 * reconciliation (`onReactivated`, named for its first use): neither is waited for.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import {
  Cause,
  Chunk,
  Clock,
  Context,
  Duration,
  Effect,
  Either,
  Exit,
  Fiber,
  Layer,
  Option,
  Ref,
  Schedule,
  Stream
} from "effect"
import * as Outbox from "../matching/Outbox.js"
import { Processor } from "../matching/Processor.js"
import { FirehookConfig } from "../platform/Config.js"
import { Health } from "../platform/Health.js"
import { runAsLeader } from "../platform/Leader.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import * as LockKeys from "../platform/LockKeys.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { Identity } from "../reconciliation/Identity.js"
import * as Reactivations from "../reconciliation/Reactivations.js"
import * as ReconcileStore from "../reconciliation/ReconcileStore.js"
import { admissionSection, Registry } from "../registry/Registry.js"
import { RegistryChanges } from "../registry/RegistryChanges.js"
import * as RegistrySync from "../registry/RegistrySync.js"
import { CursorStore } from "./CursorStore.js"
import * as FirehoseSource from "./FirehoseSource.js"
import { runJetstream as runJetstreamStreams } from "./JetstreamPlan.js"
import { canonicalRelay, relayItem, withOpened } from "./Sources.js"
import type { IntakeTuning, StreamRunner, StreamSpec, StreamState } from "./StreamModel.js"
import { tuningFromConfig } from "./StreamModel.js"
import { makeStreamRunner } from "./StreamRunner.js"

// the stream, its reader, batcher and loop, the sources and the Jetstream plan live in their own
// modules (this one composes them); their names stay exported from here
export { DIRECT_REPLAY_MAX_EXTRA, directReplayFrom } from "./JetstreamPlan.js"
export { canonicalRelay, jetstreamItem, relayItem, withOpened } from "./Sources.js"
export type { FailureKind, IntakeTuning, SourceItem, StreamRunner, StreamSpec, StreamState } from "./StreamModel.js"
export { defaultTuning, FAILURE_KINDS, tuningFromConfig } from "./StreamModel.js"
export { fullJitter, makeStreamRunner } from "./StreamRunner.js"

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
  /**
   * called for every committed `#identity` / `#account` event (identity cache invalidation); the
   * layer adds the invalidation of the context's Identity, when there is one
   */
  readonly onIdentity?: (did: string) => Effect.Effect<void>
  /**
   * called for every committed `#account` event (`active` true or false) and relay `#sync` event
   * (the owner's reconciliation request; the name is from when only reactivations called it); the
   * layer sets it to the reconciliation requester when the context has a database
   */
  readonly onReactivated?: (did: string) => Effect.Effect<void>
  /** how long direct-set changes are coalesced before reconfiguring (default 1 s) */
  readonly reconfigureDelay?: Duration.DurationInput
  readonly tuning?: Partial<IntakeTuning>
}

export const make = (options: IntakeOptions = {}) =>
  Effect.gen(function*() {
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
    /** set by `stopAccepting`: from then on no stream starts */
    const stopping = yield* Ref.make(false)
    const ctx = yield* Effect.context<Processor | CursorStore | Outbox.OutboxStore>()

    const makeRunner = (spec: StreamSpec) =>
      makeStreamRunner(spec, tuning, { onIdentity: options.onIdentity, onReactivated: options.onReactivated }).pipe(
        Effect.provide(ctx)
      )
    /**
     * run a stream; it is listed (health, shutdown) only while it runs. Once intake stops accepting,
     * no stream starts (a registration committed while the queues drain may ask the Jetstream plan
     * for the backlink or direct stream; a replica may win the election during its shutdown): it
     * waits, unlisted, to be interrupted. Listed first, then `stopping` read, as `stopAccepting`
     * sets `stopping` first, then reads the list: whatever the order, a starting stream is either
     * refused or stopped.
     */
    const start = (r: StreamRunner, from: bigint | undefined) =>
      Effect.acquireUseRelease(
        Effect.zipRight(
          Ref.update(runners, (xs) => [...xs.filter((x) => x.spec.name !== r.spec.name), r]),
          Ref.get(stopping)
        ),
        (refused): Effect.Effect<never> =>
          refused
            ? Effect.zipRight(
              Effect.zipRight(
                Ref.update(runners, (xs) => xs.filter((x) => x !== r)),
                Effect.logInfo("stream not started: intake is stopping").pipe(
                  Effect.annotateLogs({ stream: r.spec.name })
                )
              ),
              Effect.never
            )
            : r.runFrom(from),
        () => Ref.update(runners, (xs) => xs.filter((x) => x !== r))
      )

    const runRelay = Effect.gen(function*() {
      const relay = canonicalRelay(config.intake.relayUrl)
      // `#info` frames are not sequenced and carry no events, but an operator must hear of them:
      // `OutdatedCursor` says the cursor was older than the relay's window, i.e. the events
      // between the cursor and the window's start were missed. Logged by name (a validated token),
      // at most once a minute per name
      const infoLog = RateLimitedLog.make()
      const logInfo = (name: string) =>
        infoLog.run(name, (suppressed) =>
          Effect.logWarning("relay info frame").pipe(
            Effect.annotateLogs({ stream: "relay", name, suppressed })
          ))
      const toSourceItems = (chunk: Chunk.Chunk<FirehoseSource.RelayItem>) => {
        let info: string | undefined
        const items = Chunk.filterMap(chunk, (item) => {
          if (Either.isRight(item) && item.right.kind === "info") {
            info = item.right.name
          }
          return relayItem(item)
        })
        return info === undefined ? Effect.succeed(items) : Effect.as(logInfo(info), items)
      }
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
              (c) => c.frames.pipe(Stream.mapChunksEffect(toSourceItems))
            )
          )
      })
      return yield* start(r, undefined)
    })

    const runJetstream = runJetstreamStreams({
      url: config.intake.jetstreamUrl,
      common,
      index,
      directDidsMax: config.registry.directDidsMax,
      reconfigureDelay,
      makeRunner,
      start
    })

    const run = Effect.gen(function*() {
      yield* Ref.set(running, true)
      return yield* config.intake.source === "relay" ? runRelay : runJetstream
    }).pipe(Effect.ensuring(Ref.set(running, false).pipe(Effect.zipRight(Ref.set(runners, [])))))

    const stats = Effect.gen(function*() {
      const rs = yield* Ref.get(runners)
      const streams: Array<{ name: string; state: StreamState }> = []
      for (const r of rs) streams.push({ name: r.spec.name, state: yield* Ref.get(r.state) })
      return { running: yield* Ref.get(running), streams }
    })

    const stopAccepting = Effect.zipRight(
      Ref.set(stopping, true),
      Effect.flatMap(Ref.get(runners), (rs) => Effect.forEach(rs, (r) => r.stopReading, { discard: true }))
    )
    const shape: IntakeShape = { run: run as Effect.Effect<never>, stats, stopAccepting }
    return shape
  })

/**
 * Elections in a row that failed (no database connection, or the lock query failed) after which a
 * standby is no longer ready: it could not take over if the leader died.
 */
export const STANDBY_FAILED_ELECTIONS_MAX = 3

/**
 * How often a leader's term looks for the first sign that its intake runs (a stream connected, or a
 * batch acknowledged), which clears the standby's "work ended" mark ({@link healthSection}).
 */
export const PROGRESS_CHECK_INTERVAL = Duration.seconds(1)

/** a stream of this run is connected, or has acknowledged a batch: intake works */
const hasProgressed = (stats: IntakeStats): boolean =>
  stats.streams.some(({ state }) => state.connected || state.acks > 0)

/** the intake section of /health (SPEC §6.2) */
export const healthSection = (
  intake: IntakeShape,
  role: Effect.Effect<"leader" | "standby">,
  registry: Effect.Effect<{ readonly rejected: Readonly<Record<string, number>> }>,
  progressWindowMs = 60_000,
  failedElections: Effect.Effect<number> = Effect.succeed(0),
  /**
   * this replica's last term ended with its work ending (it failed, died or returned) and no term
   * has since seen intake run, nor has another replica been found holding the role
   */
  workEnded: Effect.Effect<boolean> = Effect.succeed(false)
) =>
  Effect.gen(function*() {
    const now = yield* Clock.currentTimeMillis
    const stats = yield* intake.stats
    const r = yield* role
    const reg = yield* registry
    const perStream: Record<
      string,
      { connected: boolean; quarantined: boolean; failureKind: string | null; cursorAgeSeconds: number; queued: number }
    > = {}
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
        cursorAgeSeconds: state.lastEventTimeUs === undefined
          ? 0
          : Math.max(0, Math.floor(now / 1000 - state.lastEventTimeUs / 1_000_000)),
        queued: state.queued
      }
    }
    // a standby is healthy while its elections reach the database and its own last term's work
    // did not end (a work that dies at once, e.g. a failing reload, would otherwise leave the
    // process ready between its terms: every election succeeds, no frame is ever read); a leader
    // must be progressing
    const ended = r === "standby" && (yield* workEnded)
    const healthy = r === "standby"
      ? (yield* failedElections) < STANDBY_FAILED_ELECTIONS_MAX && !ended
      : stats.running && stats.streams.length > 0 && progressing
    return {
      ready: healthy,
      body: {
        role: r,
        connected,
        progressing: r === "standby" ? !ended : progressing,
        queued,
        streams: perStream,
        admission: admissionSection(reg.rejected)
      }
    }
  })

export const INTAKE_LOCK_KEY = LockKeys.INTAKE

/**
 * Intake under leader election, with health and shutdown registration. With a database in the
 * context, a known owner's `#account` or `#sync` requests its reconciliation
 * (reconciliation/Reactivations.ts), unless the caller gives its own `onReactivated`.
 */
export const layer = (options: IntakeOptions = {}) =>
  Layer.scopedDiscard(
    Effect.gen(function*() {
      // `#identity`/`#account` events: this process's identity cache (when it has one), and the
      // caller's hook (the service forwards them to the other processes' caches)
      const identity = yield* Effect.serviceOption(Identity)
      const hooks = [
        ...(Option.isSome(identity) ? [(did: string) => identity.value.invalidate(did)] : []),
        ...(options.onIdentity === undefined ? [] : [options.onIdentity])
      ]
      // `#account` (either `active`) and `#sync` events: a durable reconciliation request for a known owner,
      // taken up by whichever process runs the reconcile role (Reactivations)
      const sql = yield* Effect.serviceOption(SqlClient.SqlClient)
      const onReactivated = options.onReactivated ?? (Option.isSome(sql)
        ? yield* Effect.flatMap(
          Effect.provideService(ReconcileStore.makeSql, SqlClient.SqlClient, sql.value),
          (store) => Reactivations.requester(store)
        )
        : undefined)
      const intake = yield* make({
        ...options,
        ...(hooks.length === 0
          ? {}
          : { onIdentity: (did: string) => Effect.forEach(hooks, (hook) => hook(did), { discard: true }) }),
        ...(onReactivated === undefined ? {} : { onReactivated })
      })
      const role = yield* Ref.make<"leader" | "standby">("standby")
      const registry = yield* Registry
      const processor = yield* Processor
      const health = yield* Health
      const lifecycle = yield* Lifecycle
      // a replica taking the role reloads what intake keeps in memory first (SPEC §6.4), the
      // registry and the prior-reference key index: while it stood by, the leader's intake changed
      // the database but not this process's memory. With the change feed (RegistryChanges), the
      // leader then follows what other processes change in the registry (RegistrySync), from a
      // horizon taken before the reload.
      const changes = yield* Effect.serviceOption(RegistryChanges)
      const reload = Effect.orDie(processor.reload)
      const work = Option.match(changes, {
        onNone: () => Effect.zipRight(reload, intake.run),
        onSome: (feed) =>
          Effect.gen(function*() {
            const from = yield* Effect.orDie(feed.horizon)
            yield* reload
            const sync = RegistrySync.follow({ from, registry, reloadAll: processor.reload })
            return yield* Effect.raceFirst(intake.run, Effect.provideService(sync, RegistryChanges, feed))
          })
      })
      const failedElections = yield* Ref.make(0)
      // set when a term's work ends by itself (failed, died or returned; not when the term
      // interrupted it); cleared once a term sees intake run (a stream connected or a batch
      // acknowledged), or when an election finds another replica holding the role (intake runs
      // there; this replica's own work is tried again when it next leads)
      const workEnded = yield* Ref.make(false)
      const clearOnProgress: Effect.Effect<never> = intake.stats.pipe(
        Effect.repeat({ schedule: Schedule.spaced(PROGRESS_CHECK_INTERVAL), until: hasProgressed }),
        Effect.zipRight(Ref.set(workEnded, false)),
        Effect.zipRight(Effect.never)
      )
      const termWork = Effect.raceFirst(work, clearOnProgress).pipe(
        Effect.onExit((exit) =>
          Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause) ? Effect.void : Ref.set(workEnded, true)
        )
      )
      const onElection = (outcome: "leader" | "standby" | "failed") =>
        outcome === "failed"
          ? Ref.update(failedElections, (n) => n + 1)
          : outcome === "standby"
          ? Effect.zipRight(Ref.set(failedElections, 0), Ref.set(workEnded, false))
          : Ref.set(failedElections, 0)
      const fiber = yield* Effect.forkScoped(
        runAsLeader({ key: INTAKE_LOCK_KEY, name: "intake", onElection }, role, termWork)
      )
      yield* health.register(
        "intake",
        healthSection(intake, Ref.get(role), registry.stats, undefined, Ref.get(failedElections), Ref.get(workEnded))
      )
      yield* lifecycle.registerStop("intake-stop", "intake-stop", intake.stopAccepting)
      yield* lifecycle.registerStop(
        "intake-drain",
        "intake-drain",
        // queued events are committed by the sessions after the sockets close; then stop the runners
        Effect.gen(function*() {
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
