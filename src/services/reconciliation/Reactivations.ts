/**
 * An account's status change reconciles its owner promptly (SPEC §5.2–5.4). While an account is
 * deactivated, taken down, suspended or deleted its PDS answers "Could not find repo", so a scan
 * then removes its webhooks (they stop firing within about a minute, not at the next sweep, up to
 * 24 h later); on its reactivation a scan brings them back (without this, only at the owner's next
 * sweep).
 *
 * - {@link requester} (intake): the DIDs of committed `#account` events (`active` true or false)
 *   and relay `#sync` events (a repo state reset) go
 *   into a dropping queue ({@link QUEUE_MAX}; beyond it they are dropped, counted `queue`), drained
 *   by one fiber that stamps the known owners among them, ≤ {@link BATCH_MAX} DIDs per statement,
 *   through {@link ReconcileStoreShape.requestReconcile}: `owners.reconcile_requested_at` is set
 *   where no request is pending (one pending request per owner: repeats coalesce), while fewer than
 *   {@link PENDING_MAX} are pending (beyond: counted `cap`). Unknown DIDs change nothing. Intake never
 *   waits for it.
 * - The RetryScheduler (every process with the `reconcile` role, whichever process runs intake)
 *   lists the stamped owners each round (every 60 s) and reconciles them like its retries: under
 *   its concurrency and the limit of concurrent scans (a refused scan keeps the stamp and is tried
 *   again). The next scan's begin, whoever runs it (the scheduler, a sweep, the CLI), clears it.
 *
 * Decision: a durable stamp on the owner row rather than a notification: it survives the intake and
 * reconcile roles running in different processes, a reconcile process that is down or restarting,
 * and a refused scan, with one indexed statement per batch of account events. Best effort at the
 * edge: an event whose stamp is not written (queue full, database down, a crash between the batch's
 * commit and the stamp) is only delayed to the owner's next sweep. A deactivation (`active:
 * false`) requests a scan too (before the seventh audit round of 3 December 2026 it requested
 * nothing, and a taken-down owner's webhooks kept firing until its next sweep). A "not found" is
 * authoritative only after the DID is resolved afresh (Snapshot.ts, `pds_moved`), so an account
 * that moved to another PDS (its old PDS then says `deactivated`) keeps its webhooks.
 */
import { Chunk, Effect, Metric, Queue } from "effect"
import type { Scope } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import * as Metrics from "./ReconcileMetrics.js"
import type { ReconcileStoreShape } from "./ReconcileStore.js"

/** Reactivated DIDs waiting to be stamped at most (a dropping queue: the newest are dropped). */
export const QUEUE_MAX = 4_096
/** DIDs per statement at most. */
export const BATCH_MAX = 256
/** Pending requests (stamped owners not yet scanned) at most, across the database. */
export const PENDING_MAX = 10_000

export interface RequesterOptions {
  readonly queueMax?: number
  readonly pendingMax?: number
}

/**
 * The requesting side, for the lifetime of the scope: `request(did)` never waits (intake calls it
 * after each committed batch, for its `#account` events).
 */
export const requester = (
  store: Pick<ReconcileStoreShape, "requestReconcile">,
  options: RequesterOptions = {}
): Effect.Effect<(did: string) => Effect.Effect<void>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const pendingMax = options.pendingMax ?? PENDING_MAX
    const queue = yield* Queue.dropping<string>(options.queueMax ?? QUEUE_MAX)
    const log = RateLimitedLog.make()
    const stamp = (dids: ReadonlyArray<string>) =>
      store.requestReconcile(dids, pendingMax).pipe(
        Effect.flatMap(({ overCap, requested }) =>
          Effect.gen(function*() {
            yield* Metric.incrementBy(Metrics.reactivationRequests, requested.length)
            for (const did of requested) {
              yield* Effect.logInfo("owner reconciliation requested (account status or repo sync)").pipe(
                Effect.annotateLogs({ did })
              )
            }
            if (overCap > 0) {
              yield* Metric.incrementBy(Metrics.reactivationDropped({ reason: "cap" }), overCap)
              yield* log.run("cap", (suppressed) =>
                Effect.logWarning("reactivation requests dropped: too many pending").pipe(
                  Effect.annotateLogs({ dropped: overCap, suppressed })
                ))
            }
          })
        ),
        Effect.catchAll((e) =>
          Effect.zipRight(
            Metric.incrementBy(Metrics.reactivationDropped({ reason: "store" }), dids.length),
            log.run("store", (suppressed) =>
              Effect.logWarning("reactivation requests not written").pipe(
                Effect.annotateLogs({ op: e.op, code: e.code, suppressed })
              ))
          )
        )
      )
    const drain = Effect.forever(
      Effect.gen(function*() {
        const dids = new Set(Chunk.toReadonlyArray(yield* Queue.takeBetween(queue, 1, BATCH_MAX)))
        yield* stamp([...dids])
      })
    )
    yield* Effect.forkScoped(drain)
    return (did: string) =>
      isCanonicalDid(did)
        ? Effect.flatMap(
          Queue.offer(queue, did),
          (taken) => taken ? Effect.void : Metric.increment(Metrics.reactivationDropped({ reason: "queue" }))
        )
        : Effect.void
  })
