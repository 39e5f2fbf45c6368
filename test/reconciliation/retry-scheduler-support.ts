/**
 * Shared pieces of the RetryScheduler tests (retry-scheduler.*.test.ts): a world of fake owners, the
 * store and the reconciler as fakes of their Tags over it, the scheduler built on them, and the
 * TestClock advanced with the woken fibers run.
 */
import { Clock, Deferred, Duration, Effect, Layer, TestClock } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { type ReconcileOutcome, Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore, type ReconcileStoreShape } from "../../src/services/reconciliation/ReconcileStore.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import type { ReconcileStatus } from "../../src/services/registry/RegistryStore.js"
import { fakeReconcileStore } from "../support/fakeReconcileStore.js"
import { COMPLETE } from "../support/reconcile.js"
import { settle } from "../support/settle.js"
import { testConfig } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// Fakes

export interface FakeOwner {
  status: ReconcileStatus
  failureCount: number
  /** order of the last failure (oldest first) */
  failedSeq: number
  /** a reconciliation request is pending (an account's reactivation); a begun scan clears it */
  requested?: boolean
}

/**
 * `hang`: the PDS read never answers; `hangSlowMark`: the same, and the interrupted scan's failure
 * mark takes 10 s (a slow database); a Deferred: answers (success) when it is completed.
 */
export type Behaviour = "fail" | "succeed" | "busy" | "superseded" | "hang" | "hangSlowMark" | Deferred.Deferred<void>

export interface World {
  readonly owners: Map<string, FakeOwner>
  readonly calls: Array<{ readonly did: string; readonly at: number }>
  readonly behaviour: Map<string, Behaviour>
  /** the `Retry-After` (ms) a failing owner's PDS sends */
  readonly retryAfter: Map<string, number>
  readonly interrupted: Array<string>
  readonly completed: Array<string>
  readonly swapped: Array<string>
  seq: number
  active: number
  maxActive: number
}

export const newWorld = (): World => ({
  owners: new Map(),
  calls: [],
  behaviour: new Map(),
  retryAfter: new Map(),
  interrupted: [],
  completed: [],
  swapped: [],
  seq: 0,
  active: 0,
  maxActive: 0
})

export const fail = (world: World, did: string, failureCount = 1) =>
  world.owners.set(did, { status: "failed", failureCount, failedSeq: world.seq++ })

export const fakeStore = (world: World): ReconcileStoreShape =>
  fakeReconcileStore({
    ownerState: (did) =>
      Effect.sync(() => {
        const o = world.owners.get(did)
        return o === undefined
          ? undefined
          : {
            did,
            generation: 1,
            status: o.status,
            scanGeneration: 1,
            snapshotRev: undefined,
            failureCount: o.failureCount,
            lastFailureKind: undefined,
            scanStartedAt: undefined,
            completedAt: undefined,
            failedAt: undefined,
            reconcileRequested: o.requested === true
          }
      }),
    retryCandidates: (options) =>
      Effect.sync(() =>
        [...world.owners]
          .filter(([did, o]) => o.status === "failed" && !options.exclude.includes(did))
          .sort(([, a], [, b]) => a.failedSeq - b.failedSeq)
          .slice(0, options.limit)
          .map(([did, o]) => ({ did, status: "failed" as const, failureCount: o.failureCount }))
      ),
    reconcileRequests: (options) =>
      Effect.sync(() =>
        [...world.owners]
          .filter(([did, o]) =>
            o.requested === true && !options.exclude.includes(did) &&
            (options.only === undefined || options.only.includes(did))
          )
          .slice(0, options.limit)
          .map(([did]) => did)
      ),
    completedSince: (cursor, limit) =>
      Effect.sync(() => {
        const from = Number(cursor)
        const dids = world.completed.slice(from, from + limit)
        return { dids, cursor: String(from + dids.length) }
      })
  })

export const fakeReconciler = (world: World) =>
  Layer.succeed(Reconciler, {
    reconcile: (did) =>
      Effect.gen(function*() {
        world.calls.push({ did, at: yield* Clock.currentTimeMillis })
        world.active++
        world.maxActive = Math.max(world.maxActive, world.active)
        yield* Effect.yieldNow()
        const b = world.behaviour.get(did) ?? "fail"
        // refused: not begun, the request stays
        if (b === "busy") return { _tag: "busy" } as ReconcileOutcome
        // fenced off by a newer scan of the owner (begun elsewhere)
        if (b === "superseded") return { _tag: "superseded" } as ReconcileOutcome
        const begun = world.owners.get(did)
        if (begun !== undefined) begun.requested = false
        if (b === "hang") yield* Effect.never
        if (b === "hangSlowMark") yield* Effect.never.pipe(Effect.onInterrupt(() => Effect.sleep("10 seconds")))
        if (typeof b === "object") yield* Deferred.await(b)
        const owner = world.owners.get(did)
        if (b === "succeed" || typeof b === "object") {
          if (owner !== undefined) owner.status = "complete"
          return COMPLETE
        }
        if (owner !== undefined) {
          owner.failureCount++
          owner.failedSeq = world.seq++
        }
        const retryAfterMs = world.retryAfter.get(did)
        return (retryAfterMs === undefined
          ? { _tag: "failed", kind: "pds_status" }
          : { _tag: "failed", kind: "pds_status", retryAfterMs }) as ReconcileOutcome
      }).pipe(
        Effect.ensuring(Effect.sync(() => void world.active--)),
        Effect.onInterrupt(() => Effect.sync(() => void world.interrupted.push(did)))
      ),
    stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
  })

export const deps = (world: World, env: Record<string, string> = {}) =>
  Layer.mergeAll(
    Layer.succeed(ReconcileStore, fakeStore(world)),
    fakeReconciler(world),
    Config.layerValue(testConfig(env))
  )

/**
 * The scheduler (rounds forked into the test's scope), with a swap that records; its first round
 * (at start) has run when this returns.
 */
export const scheduler = (world: World, options: RetryScheduler.RetrySchedulerOptions = {}) =>
  RetryScheduler.make({ swap: (did) => Effect.sync(() => void world.swapped.push(did)), ...options }).pipe(
    Effect.tap(() => settle)
  )

/** Advance the clock by `ms` and let woken fibers run. */
export const advance = (ms: number) => Effect.zipRight(TestClock.adjust(Duration.millis(ms)), settle)

export const callTimes = (world: World, did: string) => world.calls.filter((c) => c.did === did).map((c) => c.at)
