/**
 * `processEvents(batch)`: the one entry point from intake into matching (SPEC §2, §3.3–3.5).
 *
 * Atomically it applies registry mutations for wh-record events (when the batch comes from the
 * registry writer), matches every event against the in-memory index (direct, backlink with prior
 * references), writes prior references, enqueues outbox rows, records quarantines, and writes the
 * caller's cursor, so a crash at any instant loses nothing: either the whole batch and its cursor
 * commit, or none of it does.
 *
 * - A batch that writes no registry rows is written by ONE statement (`OutboxStore.commitBatch`:
 *   atomic on its own, one round trip) with its cursor given as data (`ProcessOptions.cursor`);
 *   its prior references are read (one statement) before it.
 * - Otherwise (registry writes, a `finalize` without cursor data, more than one chunk of rows):
 *   one transaction of separate statements, the caller's `finalize` last.
 *
 * Batches are committed one unit at a time by one worker fiber, in arrival order across all
 * streams (first come, first served), so registry mutations are serialized and each is visible to
 * the next event processed. One-statement batches that are waiting together (typically one per
 * stream) are planned as if they were one batch and written by one statement; if that fails, they
 * are retried one by one, so each caller sees its own batch's outcome. If a unit fails, the
 * in-memory changes it made are undone; since its outcome may be unknown (the server may have
 * committed before the call failed), the registrations of the owners it touched are reloaded from
 * the database before the next unit (`Registry.transactional`), and the prior-reference keys it may
 * have written are taken into the key index.
 *
 * `reload` (a replica taking the intake role, SPEC §6.4) loads the registry and the prior-reference
 * key index again, between two units of work. Between two units too, the key index forgets the
 * keys whose rows expired (`PriorRefIndex.expiryStep`: the table deletes them and answers), so a
 * full table admits new keys again once rows pass their TTL, whether or not maintenance runs here.
 *
 * The worker never dies of a unit's defect (a bug): a unit's outcome, defects included, goes to its
 * callers; a defect of batches written together (they are retried one by one) or of the expiry
 * check is logged (by kind and class name only, at most once a minute each) and the worker goes
 * on. Should the worker end all the same (interrupted at shutdown, or a defect outside a unit),
 * every request taken or queued is answered with its cause, and every later call fails at once
 * with it: no caller ever waits for ever.
 */
import { Cause, Clock, Context, Deferred, Effect, Exit, Layer, Metric, Option, Queue } from "effect"
import type { StreamEvent } from "../../schemas/RecordEvent.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import type { CursorWrite } from "../intake/CursorStore.js"
import { FirehookConfig } from "../platform/Config.js"
import * as ErrorCode from "../platform/ErrorCode.js"
import { Health, statsSection } from "../platform/Health.js"
import { labelledCounterFamily } from "../platform/Metrics.js"
import { type StoreError, Tx } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { mayHaveCommitted, Registry } from "../registry/Registry.js"
import * as Outbox from "./Outbox.js"
import {
  combine,
  type Done,
  type EventOutcome,
  type Plan,
  plan,
  type PlanContext,
  settleTogether,
  tally
} from "./Plan.js"
import {
  indexUpkeep,
  newShared,
  priorLimitsFromConfig,
  PriorRefIndex,
  type PriorRefLimits,
  priorWriteOf
} from "./PriorRefIndex.js"
import { PriorRefsStore, type PriorRefsWrite } from "./PriorRefsStore.js"

// the plan and the prior-reference index live in their own modules (this one is the queue and
// its worker); their names stay exported from here
export type { EventOutcome } from "./Plan.js"
export type { PriorRefLimits } from "./PriorRefIndex.js"
export { defaultPriorRefLimits, priorLimitsFromConfig } from "./PriorRefIndex.js"

export interface BatchResult {
  readonly outcomes: ReadonlyArray<EventOutcome>
  /** outbox rows inserted (new deliveries) */
  readonly inserted: number
  /** outbox rows that already existed (replays) */
  readonly duplicates: number
  readonly quarantined: number
}

export interface ProcessOptions {
  /** apply registry mutations for wh-record events (the registry stream, or the relay firehose) */
  readonly registryWriter: boolean
  /** runs last inside the transaction (the intake's cursor write) */
  readonly finalize?: Effect.Effect<void, StoreError>
  /**
   * The same cursor write as `finalize`, as data: a batch written by one statement (see
   * `OutboxStore.commitBatch`) writes it in that statement instead of running `finalize`. Without
   * it, a batch with a `finalize` always runs in a transaction.
   */
  readonly cursor?: CursorWrite
  /**
   * Runs inside the transaction of a batch that registered a webhook or a new version of one
   * (`WebhookIndex.registrationsVersion`; `backlink`: one that makes backlink matches), before
   * `finalize`: the registry stream's durable replay obligation for the other streams (SPEC §3.1).
   */
  readonly onRegistered?: (what: { readonly backlink: boolean }) => Effect.Effect<void, StoreError>
}

export interface ProcessorShape {
  readonly processEvents: (
    batch: ReadonlyArray<StreamEvent>,
    options: ProcessOptions
  ) => Effect.Effect<BatchResult, StoreError>
  /**
   * Load what matching keeps in memory again from the database, between two units of work: the
   * registry and the prior-reference key index (bounded as at startup). A replica taking the
   * intake role runs it before it reads a frame (SPEC §6.4): while it stood by, the leader wrote
   * registrations and prior references that this process never saw.
   */
  readonly reload: Effect.Effect<void, StoreError>
  readonly stats: Effect.Effect<ProcessorStats>
}

export interface ProcessorStats {
  readonly tooComplex: number
  readonly priorRefsRefused: number
  readonly priorRefKeys: number
  readonly priorRefIndexComplete: boolean
}

export class Processor extends Context.Tag("firehook/Processor")<Processor, ProcessorShape>() {}

const EVENTS_PROCESSED = { description: "Stream events processed, by outcome" }
const tooComplexMetric = Metric.counter("firehook_events_too_complex_total", {
  description: "Records whose reference walk hit a bound (backlink matching skipped)"
})
const priorRefsRefusedMetric = Metric.counter("firehook_prior_refs_refused_total", {
  description: "Prior-reference rows not stored because the table is full"
})
const EVENTS_QUARANTINED = { description: "Events quarantined, by reason" }

/** labelled counters, created once (building a tagged key per event is measurable on the hot path) */
const processedBy = labelledCounterFamily("firehook_events_processed_total", EVENTS_PROCESSED)
const quarantinedBy = labelledCounterFamily("firehook_events_quarantined_total", EVENTS_QUARANTINED)

const emptyKeys: ReadonlySet<string> = new Set()

/** A defect named without its message (which could carry a value): its class name, or `unknown`. */
const defectName = (cause: Cause.Cause<unknown>): string => {
  const defect = Cause.dieOption(cause)
  return (Option.isSome(defect) ? ErrorCode.className(defect.value) : undefined) ?? "unknown"
}

interface Request {
  readonly _tag: "batch"
  readonly batch: ReadonlyArray<StreamEvent>
  readonly options: ProcessOptions
  readonly result: Deferred.Deferred<BatchResult, StoreError>
}

/** `reload`, in line with the batches (never in the middle of a unit of work) */
interface Reload {
  readonly _tag: "reload"
  readonly result: Deferred.Deferred<void, StoreError>
}

/** what a unit of work (one transaction, or one statement for a group of batches) wrote */
interface UnitDone {
  readonly done: ReadonlyArray<Done>
  readonly removedKeys: ReadonlyArray<string>
  readonly written: ReadonlySet<string>
}

/**
 * A batch that writes no registry rows can be written by ONE statement (atomic on its own: no
 * BEGIN/COMMIT round trips), with its cursor as data; its prior-reference read is done before
 * (batches are serialized and this process is the only writer of prior references, so what
 * was read is what the statement writes over). `canCommit`: the store has a one-statement commit.
 */
const oneStatementFor = (canCommit: boolean) => (req: Request) =>
  canCommit &&
  (req.options.finalize === undefined || req.options.cursor !== undefined) &&
  !(req.options.registryWriter && req.batch.some((e) => e.kind === "commit" && e.collection === WH_COLLECTION))

/**
 * The matching worker's end (once): every request taken or queued is answered with the cause (a
 * defect as a defect, an interruption as one), and `state.stopped` makes later calls fail at once.
 */
const workerEnd = (requests: Queue.Queue<Request | Reload>, inProgress: Set<Request | Reload>) => {
  /** why the worker ended (set once, before its requests are answered): later calls fail with it */
  const state: { stopped: Cause.Cause<never> | undefined } = { stopped: undefined }
  const answer = (r: Request | Reload, cause: Cause.Cause<never>) =>
    r._tag === "batch" ? Deferred.failCause(r.result, cause) : Deferred.failCause(r.result, cause)
  const stop = (cause: Cause.Cause<never>) =>
    Effect.gen(function*() {
      if (state.stopped !== undefined) return
      state.stopped = cause
      if (!Cause.isInterruptedOnly(cause)) {
        yield* Effect.logError("matching worker stopped; intake batches fail until restart").pipe(
          Effect.annotateLogs({ kind: Cause.isDie(cause) ? "defect" : "failure", defect: defectName(cause) })
        )
      }
      for (const r of inProgress) yield* answer(r, cause)
      inProgress.clear()
      for (const r of yield* Queue.takeAll(requests)) yield* answer(r, cause)
    })
  return { state, stop }
}

/**
 * Defects the worker survives (batches written together, the expiry check): logged by kind and
 * class name only (a cause could carry values), at most once a minute for each.
 */
const survivedLogger = () => {
  const survivedLog = RateLimitedLog.make()
  return (where: "batches together" | "expiry check", cause: Cause.Cause<unknown>) =>
    Cause.isDie(cause)
      ? survivedLog.run(where, (suppressed) =>
        Effect.logError("matching worker survived a defect").pipe(
          Effect.annotateLogs({ where, kind: "defect", defect: defectName(cause), suppressed })
        ))
      : Effect.void
}

/** For a step the worker survives: a defect is logged, an interruption passed on (the worker stops). */
const survivedUnlessInterrupted =
  (survived: ReturnType<typeof survivedLogger>) => <E>(cause: Cause.Cause<E>): Effect.Effect<void, E> =>
    Cause.isInterruptedOnly(cause) ? Effect.failCause(cause) : survived("expiry check", cause)

/** `options` win over the configuration's limits ({@link priorLimitsFromConfig}). */
export const make = (options: Partial<PriorRefLimits> = {}) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const priorLimits: PriorRefLimits = { ...priorLimitsFromConfig(config.priorRefs), ...options }
    const registry = yield* Registry
    const priorStore = yield* PriorRefsStore
    const tx = yield* Tx
    const outboxStore = yield* Outbox.OutboxStore
    const index = registry.index
    const outboxLimits = Outbox.defaultLimits(config.registry.activeMax)
    // the in-memory index of prior-reference keys (SPEC §2.4)
    const priorIndex = new PriorRefIndex(priorLimits.maxRows, priorLimits.ttlSeconds * 1000)
    // the prior-reference warnings (table full, expiry check failed), each at most once a minute
    const priorLog = RateLimitedLog.make()
    const { checkExpiry, load: loadPriorKeys } = indexUpkeep(priorIndex, priorStore, priorLog)
    yield* loadPriorKeys
    let tooComplex = 0
    let refused = 0
    const planContext: PlanContext = {
      registry,
      index,
      isBacklinkDid: (did: string) => index.isBacklinkDid(did),
      priorStore,
      priorIndex,
      priorLimits,
      outboxLimits
    }

    /**
     * A unit that failed may have been committed all the same (the connection dropped after the
     * server committed): the keys it may have written go into the key index (see
     * `PriorRefIndex.mayHaveWritten`), or a later update or delete of such a record would not
     * look its stored references up.
     */
    const unknownOutcome = (prior: PriorRefsWrite | undefined, cause: Cause.Cause<StoreError>) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        if (prior !== undefined && mayHaveCommitted(cause)) {
          priorIndex.mayHaveWritten(prior.upserts.map((u) => u.recordUri), now)
        }
      })

    /** one batch in one transaction: separate statements, then `finalize` */
    const inTransaction = (req: Request): Effect.Effect<UnitDone, StoreError> => {
      const shared = newShared()
      let attempted: PriorRefsWrite | undefined
      return Effect.gen(function*() {
        const [registrations, backlinkRegistrations] = [index.registrationsVersion, index.backlinkRegistrationsVersion]
        const p = yield* plan(planContext, req.batch, req.options.registryWriter, shared)
        const registered = req.options.onRegistered
        if (registered !== undefined && index.registrationsVersion !== registrations) {
          yield* registered({ backlink: index.backlinkRegistrationsVersion !== backlinkRegistrations })
        }
        const { prior, removedKeys } = priorWriteOf(shared, priorLimits.ttlSeconds)
        attempted = prior
        const written = prior === undefined ? emptyKeys : yield* priorStore.write(prior)
        const w = yield* Outbox.write(p.prepared).pipe(Effect.provideService(Outbox.OutboxStore, outboxStore))
        const enqueued = p.settle(Outbox.finish(p.prepared, w))
        if (p.quarantine.length > 0) yield* outboxStore.insertQuarantine(p.quarantine)
        if (req.options.finalize !== undefined) yield* req.options.finalize
        const unit: UnitDone = { done: [{ plan: p, enqueued }], removedKeys, written }
        return unit
      }).pipe(tx.withTransaction, Effect.onError((cause) => Effect.suspend(() => unknownOutcome(attempted, cause))))
    }

    const commitBatch = outboxStore.commitBatch
    const oneStatement = oneStatementFor(commitBatch !== undefined)

    /**
     * Consecutive one-statement batches (typically one per stream that was waiting) in ONE
     * statement, planned as if they were one batch: each sees what the ones before it changed.
     * All of them commit, or none (the caller then retries them one by one). `undefined` when the
     * group does not fit one statement.
     */
    const inOneStatement = (reqs: ReadonlyArray<Request>): Effect.Effect<UnitDone | undefined, StoreError> =>
      Effect.gen(function*() {
        if (commitBatch === undefined) return undefined
        const shared = newShared()
        const plans: Array<Plan> = []
        for (const req of reqs) plans.push(yield* plan(planContext, req.batch, req.options.registryWriter, shared))
        const { prior, removedKeys } = priorWriteOf(shared, priorLimits.ttlSeconds)
        const { bodies, rows, corruption, quarantine, cursors } = combine(plans, (k) => reqs[k]?.options.cursor)
        if (!Outbox.fitsOneChunk(bodies, rows, outboxLimits)) return undefined
        const r = yield* commitBatch({ prior, bodies, rows, corruption, quarantine, cursors }).pipe(
          Effect.onError((cause) => unknownOutcome(prior, cause))
        )
        // rows inserted, by batch in order (a row two batches share counts for the first)
        const done = settleTogether(plans, r)
        const unit: UnitDone = { done, removedKeys, written: r.priorWritten }
        return unit
      })

    /** after commit: key index, counters, metrics */
    const account = (unit: UnitDone) =>
      Effect.gen(function*() {
        priorIndex.follow(unit.removedKeys, unit.written, yield* Clock.currentTimeMillis)
        const { batchRefused, inserted, duplicates, batchTooComplex, byReason, byOutcome } = tally(unit.done)
        tooComplex += batchTooComplex
        refused += batchRefused
        yield* Metric.incrementBy(tooComplexMetric, batchTooComplex)
        yield* Metric.incrementBy(Outbox.metrics.inserted, inserted)
        yield* Metric.incrementBy(Outbox.metrics.duplicates, duplicates)
        for (const [reason, n] of byReason) yield* Metric.incrementBy(quarantinedBy({ reason }), n)
        for (const [outcome, n] of byOutcome) yield* Metric.incrementBy(processedBy({ outcome }), n)
        if (batchRefused > 0) {
          yield* Metric.incrementBy(priorRefsRefusedMetric, batchRefused)
          yield* priorLog.run(
            "refused",
            () =>
              Effect.logWarning("prior-reference table full: new keys refused").pipe(Effect.annotateLogs({ refused }))
          )
        }
      })

    const resultOf = ({ enqueued, plan: p }: Done): BatchResult => ({
      outcomes: p.outcomes,
      inserted: enqueued.inserted,
      duplicates: enqueued.duplicates,
      quarantined: p.quarantine.length
    })

    /** run a unit of work (registry changes undone if it fails), account for it, answer its batches */
    const settleUnit = (reqs: ReadonlyArray<Request>, unit: Effect.Effect<UnitDone, StoreError>) =>
      Effect.gen(function*() {
        const exit = yield* Effect.exit(
          unit.pipe(
            registry.transactional,
            Effect.tap(account),
            Effect.withSpan("Processor.processEvents", {
              attributes: { events: reqs.reduce((n, r) => n + r.batch.length, 0), batches: reqs.length }
            })
          )
        )
        for (let k = 0; k < reqs.length; k++) {
          const req = reqs[k]
          if (req === undefined) continue
          if (Exit.isSuccess(exit)) {
            const done = exit.value.done[k]
            yield* Deferred.done(req.result, done === undefined ? Exit.die("no result") : Exit.succeed(resultOf(done)))
          } else yield* Deferred.failCause(req.result, exit.cause)
        }
        return Exit.isSuccess(exit)
      })

    /** one batch on its own: one statement when it can, else one transaction */
    const alone = (req: Request) =>
      settleUnit(
        [req],
        oneStatement(req)
          ? Effect.flatMap(inOneStatement([req]), (u) => (u === undefined ? inTransaction(req) : Effect.succeed(u)))
          : inTransaction(req)
      )

    // Batches are committed by one worker, in arrival order (first come, first served: a busy
    // stream cannot starve the others). Batches that arrived together and can each be written by
    // one statement are written together by one statement; if that fails, one by one.
    /** `reload`'s work (in the worker) */
    const reloadNow = Effect.gen(function*() {
      yield* registry.reload
      yield* loadPriorKeys
      yield* Effect.logInfo("prior-reference keys loaded").pipe(
        Effect.annotateLogs({ keys: priorIndex.keys.size, complete: priorIndex.complete })
      )
    }).pipe(Effect.withSpan("Processor.reload"))

    const requests = yield* Queue.bounded<Request | Reload>(64)
    const inProgress = new Set<Request | Reload>()
    const end = workerEnd(requests, inProgress)
    const survived = survivedLogger()
    /** between two units: the key index forgets the keys whose rows expired (a defect is logged) */
    const expiryGuarded = checkExpiry.pipe(Effect.catchAllCause(survivedUnlessInterrupted(survived)))
    const worker = Effect.gen(function*() {
      // taken, not yet committed (in arrival order)
      const pending: Array<Request | Reload> = []
      for (;;) {
        if (pending.length === 0) {
          pending.push(yield* Queue.take(requests))
          // let a stream whose batch just committed queue its next one, so they are written together
          yield* Effect.yieldNow()
        }
        for (const r of yield* Queue.takeAll(requests)) pending.push(r)
        for (const r of pending) inProgress.add(r)
        const head = pending.shift()
        if (head === undefined) continue
        if (head._tag === "reload") {
          yield* Effect.exit(reloadNow).pipe(Effect.flatMap((exit) => Deferred.done(head.result, exit)))
          inProgress.delete(head)
          continue
        }
        yield* expiryGuarded
        // the head of the line, alone or with the one-statement batches right behind it
        const group: Array<Request> = [head]
        for (let next = pending[0]; next !== undefined && next._tag === "batch"; next = pending[0]) {
          if (!oneStatement(head) || !oneStatement(next)) break
          group.push(next)
          pending.shift()
        }
        if (group.length === 1) {
          yield* alone(head)
        } else {
          // a failure or a defect: one by one, so each caller sees its own batch's outcome
          const together = yield* Effect.exit(inOneStatement(group).pipe(registry.transactional))
          if (Exit.isSuccess(together) && together.value !== undefined) {
            yield* settleUnit(group, Effect.succeed(together.value))
          } else {
            if (Exit.isFailure(together)) yield* survived("batches together", together.cause)
            for (const r of group) yield* alone(r)
          }
        }
        for (const r of group) inProgress.delete(r)
      }
    }).pipe(
      Effect.onExit((exit) => end.stop(Exit.isFailure(exit) ? exit.cause : Cause.die("matching worker ended")))
    )
    // the worker may be interrupted before it runs (its `onExit` then never does): this finalizer,
    // run after the worker's, ends the processor all the same
    yield* Effect.addFinalizer(() => Effect.flatMap(Effect.fiberId, (id) => end.stop(Cause.interrupt(id))))
    yield* Effect.forkScoped(worker)

    const processEvents = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions) =>
      Effect.gen(function*() {
        if (end.state.stopped !== undefined) return yield* Effect.failCause(end.state.stopped)
        const result = yield* Deferred.make<BatchResult, StoreError>()
        yield* Queue.offer(requests, { _tag: "batch", batch, options, result })
        // the worker ended while this was offered: answered here if its cleanup did not
        if (end.state.stopped !== undefined) yield* Deferred.failCause(result, end.state.stopped)
        return yield* Deferred.await(result)
      })

    const reload = Effect.gen(function*() {
      if (end.state.stopped !== undefined) return yield* Effect.failCause(end.state.stopped)
      const result = yield* Deferred.make<void, StoreError>()
      yield* Queue.offer(requests, { _tag: "reload", result })
      if (end.state.stopped !== undefined) yield* Deferred.failCause(result, end.state.stopped)
      return yield* Deferred.await(result)
    })

    const stats = Effect.sync(
      (): ProcessorStats => ({
        tooComplex,
        priorRefsRefused: refused,
        priorRefKeys: priorIndex.keys.size,
        priorRefIndexComplete: priorIndex.complete
      })
    )
    const shape: ProcessorShape = { processEvents, reload, stats }
    return shape
  })

export const layer = (priorLimits?: Partial<PriorRefLimits>) =>
  Layer.scoped(
    Processor,
    Effect.gen(function*() {
      const processor = yield* make(priorLimits)
      const health = yield* Effect.serviceOption(Health)
      if (Option.isSome(health)) {
        yield* health.value.register(
          "matching",
          statsSection(processor.stats, ["tooComplex", "priorRefsRefused", "priorRefKeys", "priorRefIndexComplete"])
        )
      }
      return processor
    })
  )
