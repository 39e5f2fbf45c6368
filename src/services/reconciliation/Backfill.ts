/**
 * Backfill (SPEC §5.2, §6.1): reconcile every known owner against its PDS, in durable passes.
 *
 * - Known owners = owners with stored records ∪ owners seen on the registry stream
 *   (`owners.from_stream`) ∪ owners the relay lists for `place.wisp.v2.wh`
 *   (`com.atproto.sync.listReposByCollection`, paged, when `OWNER_DISCOVERY_URL` is set;
 *   `from_discovery`) ∪ the operator's list (`BACKFILL_OWNERS` and `firehook owners add`;
 *   `from_operator`). Discovery and the operator list are (re)recorded when a sweep starts.
 * - A sweep visits the owners in ascending DID order in keyset pages of 50; each pass handles at most
 *   1,000 owners, and a capped pass is continued by the next from the sweep's state in
 *   `backfill_state`.
 * - Replicas share the sweep (SPEC §6.4; BackfillPass.ts): a pass claims each page before it scans
 *   it (a compare-and-swap on the frontier, which only moves forward), so two replicas never scan
 *   the same page at once; the page of a pass that stopped or died is taken over and rescanned (a
 *   crash replays at most one page), within `claimAbandonedAfter` (30 s) of its last heartbeat when
 *   its replica died; a sweep completes once all its pages are finished, and every write is fenced by
 *   the sweep's number, so a replica still in an older sweep changes nothing. A pass that finds its
 *   sweep completed or restarted elsewhere ends as completed.
 * - Owners of a page are reconciled with bounded concurrency (`BACKFILL_CONCURRENCY`, 1–4). An
 *   owner failure is counted and the pass goes on. An owner refused for capacity (≥ 8 others
 *   scanning) is retried a few times, then marked failed (`busy`) for the RetryScheduler.
 * - An infrastructure failure (a `StoreError`: the database is down) aborts the pass; it is retried
 *   from the sweep's state (the aborted pass's page first) with jittered exponential backoff
 *   (1 s → 60 s) while intake keeps running; the health section reports
 *   `infrastructureHealthy: false` (not ready) meanwhile.
 * - `start` forks the initial sweep into the layer's scope (once); `awaitInitialPass` completes when
 *   it has visited every owner (the lead switches the phase `reconciling-live` → `live` then).
 *   Afterwards a new sweep runs every `repassInterval` (default 24 h). `stop` interrupts the work
 *   (registered at the Lifecycle stage `backfill`); interrupted scans are marked failed.
 *
 * Health (`backfill`): `{ running, infrastructureHealthy, initialPassDone, ownersDone, ownersFailed,
 * passes, discoveryFailures }` — counts and booleans only; ready = infrastructureHealthy.
 */
import { Context, Deferred, Duration, Effect, Fiber, Layer, Metric, Option, Schedule } from "effect"
import * as Backoff from "../platform/Backoff.js"
import { FirehookConfig } from "../platform/Config.js"
import { Health, statsSection } from "../platform/Health.js"
import { SafeHttp } from "../platform/http/SafeHttp.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import { StoreError } from "../platform/Persistence.js"
import {
  type ClaimTimings,
  DEFAULT_CLAIM_TIMINGS,
  makeReplica,
  type PassResult,
  runPass as runPassWith
} from "./BackfillPass.js"
import { discoverPages } from "./Discovery.js"
import * as Metrics from "./ReconcileMetrics.js"
import { type ReconcileOutcome, Reconciler } from "./Reconciler.js"
import { ReconcileStore } from "./ReconcileStore.js"
import * as ReconciliationConfig from "./ReconciliationConfig.js"

export type { PassResult } from "./BackfillPass.js"

export interface BackfillOptions {
  /** owners per keyset page (default 50) */
  readonly pageSize?: number
  /** owners per pass (default 1,000) */
  readonly maxOwnersPerPass?: number
  /** infrastructure retry backoff (default 1 s → 60 s, jittered) */
  readonly infraRetryBase?: Duration.DurationInput
  readonly infraRetryMax?: Duration.DurationInput
  /** an owner refused for capacity is retried this many times, this far apart (default 10 × 1 s) */
  readonly busyRetries?: number
  readonly busyRetryDelay?: Duration.DurationInput
  /** a new sweep after the previous one finished (default 24 h; `null` = never) */
  readonly repassInterval?: Duration.DurationInput | null
  /** relay discovery: pages per sweep (default 100) and repos per page (default 1,000) */
  readonly discoveryMaxPages?: number
  readonly discoveryPageLimit?: number
  /**
   * Page claims shared with other replicas (SPEC §6.4): the holder's heartbeat (default 5 s), the
   * time without a beat after which another pass takes the page over (default 30 s), and how often a
   * pass waiting for claimed pages looks again (default 5 s).
   */
  readonly claimHeartbeat?: Duration.DurationInput
  readonly claimAbandonedAfter?: Duration.DurationInput
  readonly claimPollInterval?: Duration.DurationInput
}

export interface BackfillStats {
  readonly running: boolean
  readonly infrastructureHealthy: boolean
  readonly initialPassDone: boolean
  readonly ownersDone: number
  readonly ownersFailed: number
  readonly passes: number
  readonly discoveryFailures: number
}

export interface BackfillShape {
  /** Fork the initial sweep (then periodic sweeps) into the layer's scope. Idempotent. */
  readonly start: Effect.Effect<void>
  /** One pass from the stored continuation (≤ 1,000 owners). */
  readonly runPass: Effect.Effect<PassResult, StoreError>
  /** Completes once the initial sweep has visited every owner. */
  readonly awaitInitialPass: Effect.Effect<void>
  /** Interrupt the running work (shutdown). */
  readonly stop: Effect.Effect<void>
  readonly stats: Effect.Effect<BackfillStats>
}

export class Backfill extends Context.Tag("firehook/Backfill")<Backfill, BackfillShape>() {}

/**
 * Exponential backoff from `base`, capped at `max`, with equal jitter (× [0.5, 1.0], rounded), as a
 * Schedule ({@link Backoff.equalJitterSchedule}).
 */
export const infrastructureBackoff = (base: Duration.DurationInput, max: Duration.DurationInput) =>
  Backoff.equalJitterSchedule({ base, cap: max, rounding: "round" })

/** The SPEC §5.2 / §5.3 defaults of `BACKFILL_PAGE_SIZE`, `BACKFILL_PASS_MAX_OWNERS` and `BACKFILL_RETRY_BASE_MS` / `_MAX_MS`. */
export const DEFAULT_PAGE_SIZE = ReconciliationConfig.backfill.pageSize.default
export const DEFAULT_MAX_OWNERS_PER_PASS = ReconciliationConfig.backfill.passMaxOwners.default
export const DEFAULT_INFRA_RETRY_BASE = Duration.millis(ReconciliationConfig.backfill.retryBaseMs.default)
export const DEFAULT_INFRA_RETRY_MAX = Duration.millis(ReconciliationConfig.backfill.retryMaxMs.default)

export const make = (options: BackfillOptions = {}) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const store = yield* ReconcileStore
    const reconciler = yield* Reconciler
    const http = yield* SafeHttp
    const scope = yield* Effect.scope
    // `BACKFILL_PAGE_SIZE` / `BACKFILL_PASS_MAX_OWNERS` / `BACKFILL_RETRY_*_MS` (defaults: the
    // DEFAULT_* above); an explicit option wins
    const pageSize = Math.max(1, Math.floor(options.pageSize ?? config.backfill.pageSize))
    const maxOwnersPerPass = Math.max(1, Math.floor(options.maxOwnersPerPass ?? config.backfill.passMaxOwners))
    const busyRetries = Math.max(0, Math.floor(options.busyRetries ?? 10))
    const busyRetryDelay = Duration.decode(options.busyRetryDelay ?? "1 second")
    const repass = options.repassInterval === null ? undefined : Duration.decode(options.repassInterval ?? "24 hours")
    const discoveryMaxPages = Math.max(1, Math.floor(options.discoveryMaxPages ?? 100))
    const discoveryPageLimit = Math.min(2000, Math.max(1, Math.floor(options.discoveryPageLimit ?? 1_000)))
    const backoff = infrastructureBackoff(
      options.infraRetryBase ?? Duration.millis(config.backfill.retryBaseMs),
      options.infraRetryMax ?? Duration.millis(config.backfill.retryMaxMs)
    )
    const timings: ClaimTimings = {
      heartbeat: Duration.decode(options.claimHeartbeat ?? DEFAULT_CLAIM_TIMINGS.heartbeat),
      abandonedAfter: Duration.decode(options.claimAbandonedAfter ?? DEFAULT_CLAIM_TIMINGS.abandonedAfter),
      pollInterval: Duration.decode(options.claimPollInterval ?? DEFAULT_CLAIM_TIMINGS.pollInterval)
    }
    const initialDone = yield* Deferred.make<void>()

    const state = {
      running: false,
      infrastructureHealthy: true,
      ownersDone: 0,
      ownersFailed: 0,
      passes: 0,
      discoveryFailures: 0
    }
    let fiber: Fiber.RuntimeFiber<void> | undefined

    // -------------------------------------------------------------------------------------------
    // Relay discovery (SPEC §5.2)

    const discover: Effect.Effect<void, StoreError> = Option.match(config.backfill.ownerDiscoveryUrl, {
      onNone: () => Effect.void,
      onSome: (base) =>
        discoverPages(http, store, base, { maxPages: discoveryMaxPages, pageLimit: discoveryPageLimit }).pipe(
          Effect.flatMap((found) =>
            found.truncated
              ? Effect.logWarning(
                "owner discovery stopped at its page bound: owners the relay lists past it are not discovered"
              ).pipe(Effect.annotateLogs({ pages: found.pages, pageLimit: discoveryPageLimit }))
              : Effect.void
          ),
          Effect.catchTag("DiscoveryFailure", (e) =>
            Effect.sync(() => void state.discoveryFailures++).pipe(
              Effect.zipRight(
                Effect.logWarning("owner discovery failed").pipe(Effect.annotateLogs({ reason: e.reason }))
              )
            ))
        )
    })

    // -------------------------------------------------------------------------------------------
    // One owner

    /** One reconciliation; a defect (a bug) counts as this owner's failure, not the pass's. */
    const reconcileOnce = (did: string) =>
      reconciler.reconcile(did).pipe(
        Effect.catchAllDefect(() =>
          Effect.logError("owner reconciliation died unexpectedly").pipe(
            Effect.as<ReconcileOutcome>({ _tag: "failed", kind: "internal" })
          )
        )
      )

    const reconcileOwner = (did: string) =>
      Effect.gen(function*() {
        let outcome = yield* reconcileOnce(did)
        for (let i = 0; i < busyRetries && outcome._tag === "busy"; i++) {
          yield* Effect.sleep(busyRetryDelay)
          outcome = yield* reconcileOnce(did)
        }
        let failed = outcome._tag === "failed"
        if (outcome._tag === "busy") {
          // leave it to the RetryScheduler
          yield* store.markFailedIdle(did, "busy")
          failed = true
        }
        state.ownersDone++
        if (failed) state.ownersFailed++
        yield* Metric.increment(Metrics.backfillOwners({ result: failed ? "failed" : "ok" }))
        return failed
      })

    // -------------------------------------------------------------------------------------------
    // One pass (BackfillPass: claimed pages shared with other replicas)

    const replica = yield* makeReplica
    const runPass = runPassWith({
      store,
      reconcileOwner,
      concurrency: config.backfill.concurrency,
      pageSize,
      maxOwnersPerPass,
      timings,
      beforeSweep: store.addOwners(config.backfill.owners, "operator").pipe(Effect.zipRight(discover))
    }, replica)

    // -------------------------------------------------------------------------------------------
    // Sweeps

    /** Passes until one reaches the last owner; infrastructure failures retried from the continuation. */
    const sweep = Effect.gen(function*() {
      const driver = yield* Schedule.driver(backoff)
      for (;;) {
        const result = yield* Effect.either(
          // a defect (a bug) is treated like an infrastructure failure: reported, retried, never fatal
          runPass.pipe(
            Effect.catchAllDefect(() =>
              Effect.logError("backfill pass died unexpectedly").pipe(
                Effect.zipRight(Effect.fail(new StoreError({ op: "backfill.pass", code: "defect" })))
              )
            )
          )
        )
        if (result._tag === "Left") {
          state.infrastructureHealthy = false
          yield* Metric.increment(Metrics.backfillPasses({ result: "infrastructure_failure" }))
          yield* Effect.logWarning("backfill pass failed; retrying from its continuation").pipe(
            Effect.annotateLogs({ op: result.left.op, code: result.left.code })
          )
          yield* driver.next(undefined).pipe(Effect.ignore)
          continue
        }
        state.infrastructureHealthy = true
        state.passes++
        yield* driver.reset
        yield* Effect.logInfo("backfill pass finished").pipe(
          Effect.annotateLogs({
            owners: result.right.owners,
            failed: result.right.failed,
            completed: result.right.completed
          })
        )
        if (result.right.completed) return
      }
    })

    const withRunning = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
      Effect.sync(() => {
        state.running = true
      }).pipe(
        Effect.zipRight(eff),
        Effect.ensuring(
          Effect.sync(() => {
            state.running = false
          })
        )
      )

    const main = Effect.gen(function*() {
      yield* withRunning(sweep)
      yield* Deferred.succeed(initialDone, undefined)
      yield* Effect.logInfo("initial backfill complete")
      if (repass === undefined) return
      for (;;) {
        yield* Effect.sleep(repass)
        yield* withRunning(sweep)
      }
    })

    const start = Effect.suspend(() => {
      if (fiber !== undefined) return Effect.void
      return Effect.forkIn(main, scope).pipe(
        Effect.tap((f) =>
          Effect.sync(() => {
            fiber = f
          })
        ),
        Effect.asVoid
      )
    })

    const shape: BackfillShape = {
      start,
      runPass,
      awaitInitialPass: Deferred.await(initialDone),
      stop: Effect.suspend(() => (fiber === undefined ? Effect.void : Fiber.interrupt(fiber).pipe(Effect.asVoid))),
      stats: Effect.gen(function*() {
        const initialPassDone = yield* Deferred.isDone(initialDone)
        return { ...state, initialPassDone }
      })
    }
    return shape
  })

/** The health section of a backfill (ready = infrastructure healthy). */
export const healthSection = (backfill: BackfillShape) =>
  statsSection(
    backfill.stats,
    [
      "running",
      "infrastructureHealthy",
      "initialPassDone",
      "ownersDone",
      "ownersFailed",
      "passes",
      "discoveryFailures"
    ],
    (s) => s.infrastructureHealthy
  )

/**
 * The backfill service with its health section (`backfill`) and its shutdown stage (`backfill`).
 * Nothing runs until `start` is called (the lead calls it after intake has started).
 */
export const layer = (
  options: BackfillOptions = {}
): Layer.Layer<Backfill, never, FirehookConfig | ReconcileStore | Reconciler | SafeHttp | Health | Lifecycle> =>
  Layer.scoped(
    Backfill,
    Effect.gen(function*() {
      const backfill = yield* make(options)
      const health = yield* Health
      const lifecycle = yield* Lifecycle
      yield* health.register("backfill", healthSection(backfill))
      yield* lifecycle.registerStop("backfill", "backfill", backfill.stop)
      return backfill
    })
  )
