/**
 * Failure marks written late (SPEC §5.3 step 5): a scan that ends because the database failed (a
 * `StoreError` mid-scan), or an interrupted scan whose `interrupted` mark could not be written
 * (the database down, or slower than the mark's bound), would leave its owner `scanning`, and the
 * owner's deliveries deferred, until a rescan or until the RetryScheduler finds the scan stale (15
 * min). Instead the mark is kept and retried in the background until the database answers again:
 * then the owner is `failed` (its deliveries go on with its last known-good registrations) and the
 * RetryScheduler retries it.
 *
 * - One fiber per owner, owned by the reconciler's scope; at most `maxPending` owners (beyond: left
 *   to the stale-scan check). Of two marks of one owner the one of the newer scan (higher token)
 *   waits: a mark replaces the owner's waiting one unless that one's token is higher. (Two scans'
 *   marks can arrive in either order: a scan superseded by a newer one may end after it. The older
 *   scan's mark would be fenced, a no-op, and the owner would stay `scanning` until the stale-scan
 *   check.)
 * - Each mark is fenced by its scan's token (`ReconcileStore.markFailed`), so it never touches a
 *   scan begun since, nor an owner completed meanwhile.
 * - Retried with equal-jitter exponential backoff (`baseMs` → `capMs`) for at most `giveUpAfterMs`
 *   (the stale-scan threshold: after that the RetryScheduler marks the scan crashed anyway).
 *
 * Logs carry no DID (kinds and counts only).
 */
import { Duration, Effect, FiberMap, Metric, Schedule } from "effect"
import * as Backoff from "../platform/Backoff.js"
import * as Metrics from "./ReconcileMetrics.js"
import type { ReconcileStoreShape } from "./ReconcileStore.js"

export interface FailureMarksOptions {
  readonly baseMs: number
  readonly capMs: number
  readonly giveUpAfterMs: number
  readonly maxPending: number
}

export interface FailureMarksShape {
  /** Mark the scan `token` of `did` failed (`kind`) as soon as the database answers; never fails. */
  readonly defer: (did: string, token: number, kind: string) => Effect.Effect<void>
  /** Owners whose mark is still waiting for the database. */
  readonly pending: Effect.Effect<number>
}

/** The late marks; their fibers belong to the current scope. */
export const make = (store: ReconcileStoreShape, options: FailureMarksOptions) =>
  Effect.gen(function*() {
    const fibers = yield* FiberMap.make<string, void, never>()
    const schedule = Backoff.equalJitterSchedule({
      base: Duration.millis(options.baseMs),
      cap: Duration.millis(options.capMs)
    }).pipe(Schedule.upTo(Duration.millis(options.giveUpAfterMs)))

    const mark = (did: string, token: number, kind: string) =>
      store.markFailed(did, token, kind).pipe(
        Effect.retry(schedule),
        Effect.flatMap((marked) => (marked ? Metric.increment(Metrics.reconcileFailures({ kind })) : Effect.void)),
        Effect.catchAll((e) =>
          Effect.logWarning("a scan's failure mark could not be written; left to the stale-scan check").pipe(
            Effect.annotateLogs({ kind, op: e.op, code: e.code })
          )
        )
      )

    // the token of each owner's waiting mark (an entry per fiber, removed when it ends)
    const waiting = new Map<string, { readonly token: number }>()

    const defer = (did: string, token: number, kind: string): Effect.Effect<void> =>
      Effect.gen(function*() {
        const current = waiting.get(did)
        // a newer scan's mark is waiting: this older scan's would be fenced (a no-op) anyway
        if (current !== undefined && current.token > token) return
        if (!(yield* FiberMap.has(fibers, did)) && (yield* FiberMap.size(fibers)) >= options.maxPending) {
          return yield* Effect.logWarning("too many scans waiting for their failure mark; left to the stale-scan check")
            .pipe(Effect.annotateLogs({ kind }))
        }
        const entry = { token }
        waiting.set(did, entry)
        yield* FiberMap.run(
          fibers,
          did,
          mark(did, token, kind).pipe(
            Effect.ensuring(Effect.sync(() => {
              if (waiting.get(did) === entry) waiting.delete(did)
            }))
          )
        )
      })

    const shape: FailureMarksShape = { defer, pending: FiberMap.size(fibers) }
    return shape
  })
