/**
 * The reconciliation knobs reach their services through the same construction the App uses:
 * `RETRY_SCHEDULER_TRACKED_MAX` (read by `RetryScheduler.make`), and the SPEC §5 bounds read by
 * `Identity.make` (`IDENTITY_CACHE_*`), `Backfill.make` (`BACKFILL_PAGE_SIZE`,
 * `BACKFILL_PASS_MAX_OWNERS`, `BACKFILL_RETRY_*`) and `Reconciler.make` (`RECONCILE_*`). Each test
 * sets values other than the defaults and observes the behaviour they change.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Duration, Effect, Layer, Random, TestClock } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp, type SafeResponse } from "../../src/services/platform/http/SafeHttp.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { limitsFromConfig, Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore, type ReconcileStoreShape } from "../../src/services/reconciliation/ReconcileStore.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import { didDoc, listRecordsRequests } from "../support/fakeAtproto.js"
import { fakeReconcileStore, memoryPassState } from "../support/fakeReconcileStore.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { settle } from "../support/settle.js"
import { plc, testConfig, whRecordValue } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// RetryScheduler: RETRY_SCHEDULER_TRACKED_MAX

/** A reconcile store whose only owners are `failed` ones (oldest first), for `tick`. */
const failedOwnersStore = (owners: ReadonlyArray<string>): ReconcileStoreShape =>
  fakeReconcileStore({
    retryCandidates: (options) =>
      Effect.succeed(
        owners
          .filter((did) => !options.exclude.includes(did))
          .slice(0, options.limit)
          .map((did) => ({ did, status: "failed" as const, failureCount: 1 }))
      )
  })

describe("RETRY_SCHEDULER_TRACKED_MAX reaches the retry scheduler", () => {
  const owners = Array.from({ length: 20 }, (_, i) => plc(100 + i))
  /** The owners tracked after one round, with `env` as the configuration. */
  const trackedAfterTick = (env: Record<string, string>, options: RetryScheduler.RetrySchedulerOptions = {}) =>
    Effect.gen(function*() {
      const s = yield* RetryScheduler.make(options)
      yield* s.tick
      return (yield* s.tracked).map((t) => t.did)
    }).pipe(
      Effect.provide(
        Layer.mergeAll(
          Layer.succeed(ReconcileStore, failedOwnersStore(owners)),
          Layer.succeed(Reconciler, {
            reconcile: () => Effect.never,
            stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
          }),
          Config.layerValue(testConfig(env))
        )
      ),
      Effect.withRandom(Random.fixed([0.5]))
    )

  it.scoped("3 configured: a round tracks 3 owners (oldest failure first); the default tracks 16", () =>
    Effect.gen(function*() {
      expect(yield* trackedAfterTick({ RETRY_SCHEDULER_TRACKED_MAX: "3" })).toEqual(owners.slice(0, 3))
      expect(yield* trackedAfterTick({})).toEqual(owners.slice(0, 16))
      // an explicit option still wins over the configuration
      expect(yield* trackedAfterTick({ RETRY_SCHEDULER_TRACKED_MAX: "3" }, { trackedMax: 5 })).toEqual(
        owners.slice(0, 5)
      )
    }))
})

// ---------------------------------------------------------------------------------------------
// Identity: IDENTITY_CACHE_STALE_MS / IDENTITY_CACHE_MAX_AGE_MS

describe("IDENTITY_CACHE_* reach identity (Identity.make reads them from the configuration)", () => {
  const PLC = "https://plc.test"
  const did = plc(1)
  /** A SafeHttp answering every request with `did`'s document, counting requests. */
  const plcHttp = (requests: Array<string>) =>
    Layer.succeed(SafeHttp, {
      request: (req) =>
        Effect.sync((): SafeResponse => {
          requests.push(req.url)
          return {
            status: 200,
            headers: {},
            body: new TextEncoder().encode(JSON.stringify(didDoc(did, "https://pds.example"))),
            truncated: false
          }
        })
    })
  /** Requests made for: a lookup, `wait` later another (and its background refresh, if any). */
  const requestsAfter = (
    env: Record<string, string>,
    wait: Duration.DurationInput,
    options: Identity.IdentityOptions = {}
  ) =>
    Effect.gen(function*() {
      const requests: Array<string> = []
      const identity = yield* Identity.make(options).pipe(
        Effect.provide(
          Layer.merge(plcHttp(requests), Config.layerValue(testConfig({ PLC_DIRECTORY_URL: PLC, ...env })))
        )
      )
      yield* identity.resolvePds(did)
      yield* TestClock.adjust(wait)
      yield* identity.resolvePds(did)
      yield* settle
      const stats = yield* identity.stats
      return { requests: requests.length, misses: stats.misses, refreshes: stats.refreshes }
    })

  it.scoped("stale after 1 min: the second lookup is served and refreshed in the background; the default (1 h) is not", () =>
    Effect.gen(function*() {
      const stale = { IDENTITY_CACHE_STALE_MS: "60000" }
      expect(yield* requestsAfter(stale, "60 seconds")).toEqual({ requests: 2, misses: 1, refreshes: 1 })
      expect(yield* requestsAfter(stale, "59999 millis")).toEqual({ requests: 1, misses: 1, refreshes: 0 })
      expect(yield* requestsAfter({}, "60 seconds")).toEqual({ requests: 1, misses: 1, refreshes: 0 })
      // an explicit option still wins over the configuration
      expect(yield* requestsAfter(stale, "60 seconds", { staleAfter: "1 hour" })).toEqual({
        requests: 1,
        misses: 1,
        refreshes: 0
      })
    }))

  it.scoped("expired after 2 min: the second lookup is fetched again before answering; the default (24 h) serves it", () =>
    Effect.gen(function*() {
      const env = { IDENTITY_CACHE_STALE_MS: "60000", IDENTITY_CACHE_MAX_AGE_MS: "120000" }
      // no background refreshes, so a second fetch can only be a miss
      const noRefresh = { maxBackgroundRefreshes: 0 }
      expect(yield* requestsAfter(env, "120 seconds", noRefresh)).toEqual({ requests: 2, misses: 2, refreshes: 0 })
      expect(yield* requestsAfter(env, "119999 millis", noRefresh)).toEqual({ requests: 1, misses: 1, refreshes: 0 })
      expect(yield* requestsAfter({ IDENTITY_CACHE_STALE_MS: "60000" }, "120 seconds", noRefresh)).toEqual({
        requests: 1,
        misses: 1,
        refreshes: 0
      })
    }))
})

// ---------------------------------------------------------------------------------------------
// Backfill: BACKFILL_PAGE_SIZE, BACKFILL_PASS_MAX_OWNERS, BACKFILL_RETRY_BASE_MS / _MAX_MS

describe("BACKFILL_* reach the backfill (Backfill.make reads them from the configuration)", () => {
  const owners = Array.from({ length: 20 }, (_, i) => plc(200 + i)).sort()
  const completeReconciler = Layer.succeed(Reconciler, {
    reconcile: () =>
      Effect.succeed(
        { _tag: "complete", records: 0, invalid: 0, written: 0, deleted: 0, pages: 1, repoFound: true } as const
      ),
    stats: Effect.succeed({ completed: 0, failed: 0, busy: 0, superseded: 0, invalidRecords: 0 })
  })
  const backfillEnv = (store: ReconcileStoreShape, env: Record<string, string>) =>
    Layer.mergeAll(
      Layer.succeed(ReconcileStore, store),
      completeReconciler,
      Layer.succeed(SafeHttp, { request: () => Effect.die("no discovery in this test") }),
      Config.layerValue(testConfig(env))
    )

  /** One pass over 20 owners (a fresh sweep): the page limits asked for, and the pass's result. */
  const onePass = (env: Record<string, string>) =>
    Effect.gen(function*() {
      const limits: Array<number> = []
      const store = fakeReconcileStore({
        ...memoryPassState(),
        addOwners: () => Effect.void,
        ownersPage: (after, limit) =>
          Effect.sync(() => {
            limits.push(limit)
            return owners.filter((d) => after === undefined || d > after).slice(0, limit)
          })
      })
      const b = yield* Backfill.make({ repassInterval: null }).pipe(Effect.provide(backfillEnv(store, env)))
      const result = yield* b.runPass
      return { limits, result }
    })

  it.scoped("pages of 3 owners, 7 owners per pass: the pass is capped; the defaults (50, 1,000) finish it", () =>
    Effect.gen(function*() {
      expect(yield* onePass({ BACKFILL_PAGE_SIZE: "3", BACKFILL_PASS_MAX_OWNERS: "7" })).toEqual({
        limits: [3, 3, 1],
        result: { owners: 7, failed: 0, completed: false }
      })
      expect(yield* onePass({})).toEqual({ limits: [50], result: { owners: 20, failed: 0, completed: true } })
    }))

  /** Attempts of a pass whose store is down, after each of `steps` (TestClock; jitter fixed at × 0.75). */
  const attemptsAfter = (env: Record<string, string>, steps: ReadonlyArray<number>) =>
    Effect.gen(function*() {
      let attempts = 0
      const store = fakeReconcileStore({
        passState: () =>
          Effect.suspend(() => {
            attempts++
            return Effect.fail(new StoreError({ op: "test", code: "08006" }))
          })
      })
      const b = yield* Backfill.make({ repassInterval: null }).pipe(Effect.provide(backfillEnv(store, env)))
      yield* b.start
      yield* settle
      const seen = [attempts]
      for (const ms of steps) {
        yield* TestClock.adjust(Duration.millis(ms))
        yield* settle
        seen.push(attempts)
      }
      yield* b.stop
      return seen
    }).pipe(Effect.withRandom(Random.fixed([0.5])))

  it.scoped("retry after 100 ms, never more than 100 ms apart; the defaults (1 s → 60 s) wait longer", () =>
    Effect.gen(function*() {
      const env = { BACKFILL_RETRY_BASE_MS: "100", BACKFILL_RETRY_MAX_MS: "100" }
      // each wait is min(max, base × 2^n) × 0.75 = 75 ms
      expect(yield* attemptsAfter(env, [74, 1, 75, 75, 75])).toEqual([1, 1, 2, 3, 4, 5])
      // the default max doubles the waits: 75, 150, 300 ms
      expect(yield* attemptsAfter({ BACKFILL_RETRY_BASE_MS: "100" }, [75, 75, 75, 75])).toEqual([1, 2, 2, 3, 3])
      // the default base waits 750 ms first
      expect(yield* attemptsAfter({}, [75, 674, 1])).toEqual([1, 1, 1, 2])
    }))
})

// ---------------------------------------------------------------------------------------------
// Reconciler: RECONCILE_*

describe("RECONCILE_* reach the reconciler (Reconciler.make reads them from the configuration)", () => {
  it("the limits of a configuration map each variable to its field", () => {
    const c = testConfig({
      RECONCILE_MAX_CONCURRENT_SCANS: "3",
      RECONCILE_PAGE_MAX_BYTES: "70000",
      RECONCILE_PAGE_RECORDS: "7",
      RECONCILE_MAX_PAGES: "11",
      RECONCILE_MAX_RECORDS: "13",
      RECONCILE_MAX_BYTES: "170000"
    })
    expect(limitsFromConfig(c.reconcile)).toMatchObject({
      maxOtherScanning: 3,
      maxPageBytes: 70000,
      maxPageRecords: 7,
      maxPages: 11,
      maxRecords: 13,
      maxTotalBytes: 170000
    })
  })

  const env = { RECONCILE_MAX_PAGES: "1", RECONCILE_PAGE_RECORDS: "1", RECONCILE_MAX_CONCURRENT_SCANS: "1" }
  layer(reconcileStack({ env }), { timeout: "120 seconds", excludeTestServices: true })(
    "against the fake PDS",
    (it) => {
      const reconcile = (did: string) => Effect.flatMap(Reconciler, (r) => r.reconcile(did))
      const value = whRecordValue(`at://${plc(2)}`)

      it.effect("pages of 1 record, at most 1 page: two records fail as too_many_pages (the defaults, 100 and 20, read both in one page)", () =>
        Effect.gen(function*() {
          const did = plc(301)
          const fakes = yield* Fakes
          fakes.docs.set(did, didDoc(did, fakes.pds.url))
          fakes.repos.set(did, { rev: undefined, records: [{ rkey: "a", value }, { rkey: "b", value }] })
          expect(yield* reconcile(did)).toEqual({ _tag: "failed", kind: "too_many_pages" })
          const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === did)
          expect(lists.map((r) => r.query.get("limit"))).toEqual(["1"])
        }))

      it.effect("1 concurrent scan: with another owner scanning, a scan is refused (busy)", () =>
        Effect.gen(function*() {
          const did = plc(303)
          const fakes = yield* Fakes
          fakes.docs.set(did, didDoc(did, fakes.pds.url))
          fakes.repos.set(did, { rev: undefined, records: [] })
          const begun = yield* Effect.flatMap(
            ReconcileStore,
            (s) => s.begin(plc(302), { maxOtherScanning: 8, staleScanMs: 900_000 })
          )
          expect(begun._tag).toBe("begun")
          expect(yield* reconcile(did)).toEqual({ _tag: "busy" })
        }))
    }
  )
})
