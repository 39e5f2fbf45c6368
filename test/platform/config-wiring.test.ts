/**
 * The configuration knobs for the SPEC's other defaults reach their services, through the same
 * construction the App uses: `RETENTION_*` (maintenance, via `App.maintenanceOptions`),
 * `REDIS_PUBLISH_*` (the publisher, via `App.publisherOptions`), `WEBHOOK_INTAKE_*` tuning (read by
 * `Intake.make` from the configuration) and `RETRY_SCHEDULER_TRACKED_MAX` (read by
 * `RetryScheduler.make`), and the SPEC §5 bounds read by `Identity.make` (`IDENTITY_CACHE_*`),
 * `Backfill.make` (`BACKFILL_PAGE_SIZE`, `BACKFILL_PASS_MAX_OWNERS`, `BACKFILL_RETRY_*`) and
 * `Reconciler.make` (`RECONCILE_*`), and the SPEC §2.4 prior-reference bounds read by
 * `Processor.make` (`PRIOR_REFS_TTL_MS`, `PRIOR_REFS_MAX_ROWS`). Each test sets values other than
 * the defaults and observes the behaviour they change.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it, layer } from "@effect/vitest"
import { Deferred, Duration, Effect, Layer, Random, TestClock } from "effect"
import * as App from "../../src/layers/App.js"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Intake from "../../src/services/intake/Intake.js"
import {
  defaultPriorRefLimits,
  priorLimitsFromConfig,
  Processor,
  type ProcessorShape
} from "../../src/services/matching/Processor.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import { SafeHttp, type SafeResponse } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Backfill from "../../src/services/reconciliation/Backfill.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { limitsFromConfig, Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore, type ReconcileStoreShape } from "../../src/services/reconciliation/ReconcileStore.js"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import { auditEvent } from "../support/auditEvent.js"
import * as Db from "../support/db.js"
import { didDoc, listRecordsRequests } from "../support/fakeAtproto.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { fakeReconcileStore, memoryPassState } from "../support/fakeReconcileStore.js"
import { fakeRedis } from "../support/fakeRedis.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { ev, memoryStack, plc, rev, sqlStack, testConfig, WH, whEv, whRecordValue } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// Maintenance: RETENTION_*

const HOUR = 3_600_000

/** Seven distinct retentions (1 h … 7 h), so that a value landing on the wrong rule shows. */
const retentionEnv = {
  RETENTION_DELIVERED_MS: String(1 * HOUR),
  RETENTION_DEAD_LETTER_MS: String(2 * HOUR),
  RETENTION_CANCELLED_MS: String(3 * HOUR),
  RETENTION_AUDIT_MS: String(4 * HOUR),
  RETENTION_TOMBSTONES_MS: String(5 * HOUR),
  RETENTION_QUARANTINE_MS: String(6 * HOUR),
  RETENTION_EVENT_BODIES_MS: String(7 * HOUR),
  RETENTION_AUDIT_MAX_ROWS: "1000",
  RETENTION_TOMBSTONES_MAX_ROWS: "1001",
  RETENTION_QUARANTINE_MAX_ROWS: "1002"
}

const ZERO = Maintenance.ZERO_PRUNE_COUNTS

const sql = SqlClient.SqlClient

const reset = Effect.flatMap(
  sql,
  (s) => s`TRUNCATE outbox, delivery_attempts, delivery_events, audit, tombstones, prior_refs, quarantine, owners`
)

/** A terminal outbox row finished `minutes` ago. */
const outbox = (id: string, status: string, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                          event_rkey, event_operation, target_url, signing_mode, fingerprint, status, created_at,
                          finished_at)
      VALUES (${id}, ${`ev-${id}`}, 'did:plc:owner', 'w1', 'direct', 'did:plc:subject', 'app.bsky.feed.post', 'p1',
              'create', 'https://receiver.invalid/hook', 'none', 'fp', ${status}, now() - interval '40 days',
              now() - make_interval(mins => ${minutes}))`
  )

const eventBody = (id: string, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO delivery_events (event_id, body, body_sha256, created_at)
      VALUES (${id}, '{}', 'sha', now() - make_interval(mins => ${minutes}))`
  )

/** `n` audit rows `minutes` old, delivery ids `<prefix><g>`. */
const audit = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO audit (delivery_id, event_id, owner_did, webhook_rkey, event_did, event_collection, event_rkey,
                         event_operation, status, created_at)
      SELECT ${prefix} || g, 'e' || g, 'did:plc:owner', 'w1', 'did:plc:subject', 'app.bsky.feed.post', 'p' || g,
             'create', 'delivered', now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** `n` quarantine rows `minutes` old, hashes `<prefix><g>`. */
const quarantine = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO quarantine (stream, relay, reason, event_hash, created_at)
      SELECT 'direct', 'wss://relay.invalid', 'payload_invalid', ${prefix} || g, now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** `n` tombstones `minutes` old (an owner not being reconciled), rkeys `<prefix><g>`. */
const tombstones = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO tombstones (owner_did, rkey, rev, generation, deleted_at)
      SELECT 'did:plc:owner', ${prefix} || g, '3kabc', 1, now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** The values of `column` in `table`, sorted (both fixed names written in this file). */
const keys = (table: string, column: string) =>
  Effect.flatMap(
    sql,
    (s) =>
      Effect.map(s.unsafe<{ k: string }>(`SELECT ${column}::text AS k FROM ${table} ORDER BY 1`), (rows) =>
        rows.map((r) => r.k))
  )

const count = (table: string) =>
  Effect.flatMap(
    sql,
    (s) => Effect.map(s<{ n: number }>`SELECT count(*)::int AS n FROM ${s(table)}`, (rows) => rows[0]?.n ?? 0)
  )

describe("RETENTION_* reach maintenance (App.maintenanceOptions)", () => {
  it.layer(Db.layer())("on PostgreSQL", (it) => {
    it.effect("each retention prunes its own table at its own age", () =>
      Effect.gen(function*() {
        const configured = App.maintenanceOptions(testConfig(retentionEnv))
        const defaults = App.maintenanceOptions(testConfig())
        expect(Duration.toMillis(Duration.decode(configured.interval ?? 0))).toBe(60_000)
        yield* reset
        // for the retention of N hours: a row N h − 30 min old stays, one N h + 30 min old goes
        yield* outbox("delivered-kept", "delivered", 30)
        yield* outbox("delivered-gone", "delivered", 90)
        yield* outbox("dead-kept", "dead_letter", 90)
        yield* outbox("dead-gone", "dead_letter", 150)
        yield* outbox("cancelled-kept", "cancelled", 150)
        yield* outbox("cancelled-gone", "cancelled", 210)
        yield* audit("audit-kept-", 1, 210)
        yield* audit("audit-gone-", 1, 270)
        yield* tombstones("tomb-kept-", 1, 270)
        yield* tombstones("tomb-gone-", 1, 330)
        yield* quarantine("quar-kept-", 1, 330)
        yield* quarantine("quar-gone-", 1, 390)
        yield* eventBody("body-kept", 390)
        yield* eventBody("body-gone", 450)
        // the defaults (days) prune none of them
        expect(yield* Maintenance.runOnce(defaults)).toEqual(ZERO)
        expect(yield* Maintenance.runOnce(configured)).toEqual({
          ...ZERO,
          outbox: 3,
          delivery_events: 1,
          audit: 1,
          tombstones: 1,
          quarantine: 1
        })
        expect(yield* keys("outbox", "delivery_id")).toEqual(["cancelled-kept", "dead-kept", "delivered-kept"])
        expect(yield* keys("audit", "delivery_id")).toEqual(["audit-kept-1"])
        expect(yield* keys("tombstones", "rkey")).toEqual(["tomb-kept-1"])
        expect(yield* keys("quarantine", "event_hash")).toEqual(["quar-kept-1"])
        expect(yield* keys("delivery_events", "event_id")).toEqual(["body-kept"])
      }))

    it.effect("each row bound keeps its own number of newest rows", () =>
      Effect.gen(function*() {
        yield* reset
        yield* audit("a", 1003, 10)
        yield* tombstones("t", 1003, 10)
        yield* quarantine("q", 1003, 10)
        expect(yield* Maintenance.runOnce(App.maintenanceOptions(testConfig()))).toEqual(ZERO)
        expect(yield* Maintenance.runOnce(App.maintenanceOptions(testConfig(retentionEnv)))).toEqual({
          ...ZERO,
          audit: 3,
          tombstones: 2,
          quarantine: 1
        })
        expect([yield* count("audit"), yield* count("tombstones"), yield* count("quarantine")]).toEqual([
          1000,
          1001,
          1002
        ])
      }))
  })
})

// ---------------------------------------------------------------------------------------------
// Publisher: REDIS_PUBLISH_*

const settle = Effect.gen(function*() {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
})

describe("REDIS_PUBLISH_* reach the publisher (App.publisherOptions)", () => {
  it.scoped("max bytes, max in flight and the reply timeout are the configured ones (TestClock)", () =>
    Effect.gen(function*() {
      const redis = yield* fakeRedis(() => undefined) // never answers
      const config = testConfig({
        REDIS_URL: redis.url,
        REDIS_PUBLISH_MAX_BYTES: "1024",
        REDIS_PUBLISH_MAX_IN_FLIGHT: "2",
        REDIS_PUBLISH_TIMEOUT_MS: "100"
      })
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
      const health = yield* Health.make.pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      const p = yield* Publisher.make(App.publisherOptions(config)).pipe(Effect.provideService(Health.Health, health))
      yield* p.awaitStats((s) => s.connected)
      // ~1.2 KB of JSON: within the default 8 KiB, over the configured 1024 bytes
      const big = auditEvent({ rkey: "x".repeat(1_000) })
      expect(Buffer.byteLength(Publisher.encodeEvent(big))).toBeGreaterThan(1024)
      expect(Buffer.byteLength(Publisher.encodeEvent(big))).toBeLessThan(Publisher.DEFAULTS.maxMessageBytes)
      yield* p.publish(big)
      expect(yield* p.stats).toMatchObject({ dropped: 1, published: 0 })
      // three small ones: two in flight, the third dropped (the default allows four)
      for (const rkey of ["r0", "r1", "r2"]) yield* p.publish(auditEvent({ rkey }))
      expect(yield* p.stats).toMatchObject({ dropped: 2, published: 0 })
      yield* redis.awaitState((x) => x.commands.length >= 2)
      const { commands } = yield* redis.state
      expect(commands.map((c) => [c[0], JSON.parse(c[2] ?? "{}").rkey])).toEqual([
        ["PUBLISH", "r0"],
        ["PUBLISH", "r1"]
      ])
      // the reply timeout is 100 ms (the default is 1 s)
      yield* settle
      yield* TestClock.adjust("99 millis")
      yield* settle
      expect((yield* p.stats).dropped).toBe(2)
      yield* TestClock.adjust("1 millis")
      const after = yield* p.awaitStats((s) => s.dropped === 4)
      expect(after.published).toBe(0)
    }))
})

// ---------------------------------------------------------------------------------------------
// Intake: WEBHOOK_INTAKE_* tuning

describe("WEBHOOK_INTAKE_* reach intake (Intake.make reads them from the configuration)", () => {
  it("the tuning of a configuration maps each variable to its field", () => {
    const c = testConfig({
      WEBHOOK_INTAKE_BATCH_ATTEMPTS: "7",
      WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS: "11",
      WEBHOOK_INTAKE_BACKOFF_BASE_MS: "1300",
      WEBHOOK_INTAKE_BACKOFF_MAX_MS: "1700",
      WEBHOOK_INTAKE_POISON_BACKOFF_MS: "1900",
      WEBHOOK_INTAKE_QUEUE_MAX: "64",
      WEBHOOK_INTAKE_BATCH_MAX: "8"
    })
    expect(Intake.tuningFromConfig(c.intake)).toEqual({
      queueMax: 64,
      batchMax: 8,
      batchAttempts: 7,
      batchRetryBase: Duration.millis(11),
      backoffBase: Duration.millis(1300),
      backoffCap: Duration.millis(1700),
      poisonBackoff: Duration.millis(1900)
    })
  })

  it.scopedLive(
    "WEBHOOK_INTAKE_BATCH_ATTEMPTS=2: a failing batch is tried twice, then the stream reconnects",
    () =>
      Effect.gen(function*() {
        const fake = yield* Effect.acquireRelease(
          Effect.promise(() => startFakeJetstream()),
          (f) => Effect.promise(() => f.close())
        )
        const config = testConfig({
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          JETSTREAM_URL: fake.url,
          WEBHOOK_INTAKE_BATCH_ATTEMPTS: "2",
          WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS: "1",
          WEBHOOK_INTAKE_BACKOFF_BASE_MS: "100",
          WEBHOOK_INTAKE_BACKOFF_MAX_MS: "100"
        })
        // the processor fails its first two calls; each call notes how many connections there were
        const seen: Array<number> = []
        const committed = yield* Deferred.make<void>()
        const processor = Layer.succeed(
          Processor,
          {
            processEvents: (batch, options) =>
              Effect.gen(function*() {
                if (batch.length === 0) return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
                seen.push(fake.connections.length)
                if (seen.length <= 2) return yield* Effect.fail(new StoreError({ op: "test", code: "XX000" }))
                if (options.finalize !== undefined) yield* options.finalize
                yield* Deferred.succeed(committed, undefined)
                return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
              }),
            reload: Effect.void,
            stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
          } satisfies ProcessorShape
        )
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make()
          yield* Effect.forkScoped(intake.run)
          for (let i = 0; i < 400 && !fake.connections.some((c) => c.options.length > 0); i++) {
            yield* Effect.sleep("25 millis")
          }
          fake.publish([
            commitFrame(plc(1), 1_800_000_000_000_000, WH, "w1", "create", whRecordValue(`at://${plc(2)}`))
          ])
          yield* Deferred.await(committed).pipe(
            Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "never committed" })
          )
          // two attempts on the first connection (the default, 3, would have committed there), the
          // third on the next one
          expect(seen).toHaveLength(3)
          expect(seen[0]).toBe(seen[1])
          expect(seen[2]).toBeGreaterThan(seen[1] ?? 0)
        }).pipe(Effect.provide(processor), Effect.provide(memoryStack({ config })))
      }),
    { timeout: 30_000 }
  )
})

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
  const settleFibers = Effect.gen(function*() {
    for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
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
      yield* settleFibers
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

// ---------------------------------------------------------------------------------------------
// Processor: PRIOR_REFS_TTL_MS / PRIOR_REFS_MAX_ROWS

describe("PRIOR_REFS_* reach the processor (Processor.make reads them from the configuration)", () => {
  const owner = plc(401)
  const subject = plc(402)
  const post = `at://${subject}/app.bsky.feed.post/p1`
  /** A backlink webhook on `subject`, then `n` posts of another DID referencing `subject`'s post (batches of 100). */
  const referencingPosts = (n: number) =>
    Effect.gen(function*() {
      const p = yield* Processor
      yield* p.processEvents([
        whEv(owner, "bl", whRecordValue(`at://${subject}`, { backlinks: true }), { rev: rev(1) })
      ], {
        registryWriter: true
      })
      const author = plc(403)
      for (let start = 0; start < n; start += 100) {
        const batch = Array.from({ length: Math.min(100, n - start) }, (_, i) =>
          ev(author, "app.bsky.feed.post", `r${start + i}`, { rev: rev(10 + start + i), record: { ref: post } }))
        yield* p.processEvents(batch, { registryWriter: true })
      }
      const stats = yield* p.stats
      return { keys: stats.priorRefKeys, refused: stats.priorRefsRefused, complete: stats.priorRefIndexComplete }
    })

  it("the limits of a configuration map each variable to its field; the defaults are the processor's", () => {
    expect(priorLimitsFromConfig(testConfig({}).priorRefs)).toEqual(defaultPriorRefLimits)
    expect(priorLimitsFromConfig(testConfig({ PRIOR_REFS_TTL_MS: "7200500", PRIOR_REFS_MAX_ROWS: "1234" }).priorRefs))
      .toEqual({
        ...defaultPriorRefLimits,
        ttlSeconds: 7200.5,
        maxRows: 1234
      })
  })

  // the webhook record references `subject` too, so it is a key as well: 1,001 keys in all
  it.effect(
    "1,000 rows: of 1,001 new keys the last one is refused; the default (100,000) stores them all",
    () =>
      Effect.gen(function*() {
        const configured = yield* referencingPosts(1000).pipe(
          Effect.provide(memoryStack({ env: { PRIOR_REFS_MAX_ROWS: "1000" } }))
        )
        expect(configured).toEqual({ keys: 1000, refused: 1, complete: true })
        const byDefault = yield* referencingPosts(1000).pipe(Effect.provide(memoryStack()))
        expect(byDefault).toEqual({ keys: 1001, refused: 0, complete: true })
        // an explicit option still wins over the configuration
        const explicit = yield* referencingPosts(1000).pipe(
          Effect.provide(
            memoryStack({
              env: { PRIOR_REFS_MAX_ROWS: "1000" },
              priorLimits: { ...defaultPriorRefLimits, maxRows: 1001 }
            })
          )
        )
        expect(explicit).toEqual({ keys: 1001, refused: 0, complete: true })
      }),
    { timeout: 60_000 }
  )

  /** Seconds from now to the stored row's expiry, after one referencing post. */
  const expiresInSeconds = (env: Record<string, string>) =>
    Effect.gen(function*() {
      yield* referencingPosts(1)
      const s = yield* sql
      const rows = yield* s<{ secs: number }>`
        SELECT extract(epoch FROM expires_at - now())::float8 AS secs FROM prior_refs WHERE record_uri LIKE ${`at://${
        plc(403)
      }/%`}`
      return rows.map((r) => Number(r.secs))
    }).pipe(Effect.provide(sqlStack({ env })))

  it.effect(
    "a TTL of 2 h (and half a second) sets the stored row's expiry (what maintenance prunes by); the default is 7 days",
    () =>
      Effect.gen(function*() {
        const configured = yield* expiresInSeconds({ PRIOR_REFS_TTL_MS: "7200500" })
        expect(configured).toHaveLength(1)
        expect(configured[0]).toBeGreaterThan(7200.5 - 60)
        expect(configured[0]).toBeLessThanOrEqual(7200.5)
        const byDefault = yield* expiresInSeconds({})
        expect(byDefault).toHaveLength(1)
        expect(byDefault[0]).toBeGreaterThan(604_800 - 60)
        expect(byDefault[0]).toBeLessThanOrEqual(604_800)
      }),
    { timeout: 120_000 }
  )
})
