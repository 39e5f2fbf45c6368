/**
 * The configuration knobs for the SPEC's other defaults reach their services, through the same
 * construction the App uses: `RETENTION_*` (maintenance, via `App.maintenanceOptions`),
 * `REDIS_PUBLISH_*` (the publisher, via `App.publisherOptions`), `WEBHOOK_INTAKE_*` tuning (read by
 * `Intake.make` from the configuration) and `RETRY_SCHEDULER_TRACKED_MAX` (read by
 * `RetryScheduler.make`). Each test sets values other than the defaults and observes the behaviour
 * they change.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Layer, Random, TestClock } from "effect"
import * as App from "../src/layers/App.js"
import * as Config from "../src/services/Config.js"
import * as Health from "../src/services/Health.js"
import * as Intake from "../src/services/Intake.js"
import * as Lifecycle from "../src/services/Lifecycle.js"
import * as Maintenance from "../src/services/Maintenance.js"
import { Processor, type ProcessorShape } from "../src/services/Processor.js"
import * as Publisher from "../src/services/Publisher.js"
import { ReconcileStore, type ReconcileStoreShape } from "../src/services/ReconcileStore.js"
import { Reconciler } from "../src/services/Reconciler.js"
import * as RetryScheduler from "../src/services/RetryScheduler.js"
import { StoreError } from "../src/services/Store.js"
import { auditEvent } from "./support/auditEvent.js"
import * as Db from "./support/db.js"
import { commitFrame, startFakeJetstream } from "./support/fakeJetstream.js"
import { fakeReconcileStore } from "./support/fakeReconcileStore.js"
import { fakeRedis } from "./support/fakeRedis.js"
import { memoryStack, plc, testConfig, whRecordValue, WH } from "./support/stack.js"

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
    (s) => s`
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
    (s) => s`
      INSERT INTO delivery_events (event_id, body, body_sha256, created_at)
      VALUES (${id}, '{}', 'sha', now() - make_interval(mins => ${minutes}))`
  )

/** `n` audit rows `minutes` old, delivery ids `<prefix><g>`. */
const audit = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) => s`
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
    (s) => s`
      INSERT INTO quarantine (stream, relay, reason, event_hash, created_at)
      SELECT 'direct', 'wss://relay.invalid', 'payload_invalid', ${prefix} || g, now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** `n` tombstones `minutes` old (an owner not being reconciled), rkeys `<prefix><g>`. */
const tombstones = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) => s`
      INSERT INTO tombstones (owner_did, rkey, rev, generation, deleted_at)
      SELECT 'did:plc:owner', ${prefix} || g, '3kabc', 1, now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** The values of `column` in `table`, sorted (both fixed names written in this file). */
const keys = (table: string, column: string) =>
  Effect.flatMap(sql, (s) =>
    Effect.map(s.unsafe<{ k: string }>(`SELECT ${column}::text AS k FROM ${table} ORDER BY 1`), (rows) => rows.map((r) => r.k))
  )

const count = (table: string) =>
  Effect.flatMap(sql, (s) =>
    Effect.map(s<{ n: number }>`SELECT count(*)::int AS n FROM ${s(table)}`, (rows) => rows[0]?.n ?? 0)
  )

describe("RETENTION_* reach maintenance (App.maintenanceOptions)", () => {
  it.layer(Db.layer())("on PostgreSQL", (it) => {
    it.effect("each retention prunes its own table at its own age", () =>
      Effect.gen(function* () {
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
      Effect.gen(function* () {
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
        expect([yield* count("audit"), yield* count("tombstones"), yield* count("quarantine")]).toEqual([1000, 1001, 1002])
      }))
  })
})

// ---------------------------------------------------------------------------------------------
// Publisher: REDIS_PUBLISH_*

const settle = Effect.gen(function* () {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
})

describe("REDIS_PUBLISH_* reach the publisher (App.publisherOptions)", () => {
  it.scoped("max bytes, max in flight and the reply timeout are the configured ones (TestClock)", () =>
    Effect.gen(function* () {
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

  it.scopedLive("WEBHOOK_INTAKE_BATCH_ATTEMPTS=2: a failing batch is tried twice, then the stream reconnects", () =>
    Effect.gen(function* () {
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
      const processor = Layer.succeed(Processor, {
        processEvents: (batch, options) =>
          Effect.gen(function* () {
            if (batch.length === 0) return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
            seen.push(fake.connections.length)
            if (seen.length <= 2) return yield* Effect.fail(new StoreError({ op: "test", code: "XX000" }))
            if (options.finalize !== undefined) yield* options.finalize
            yield* Deferred.succeed(committed, undefined)
            return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
          }),
        stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
      } satisfies ProcessorShape)
      yield* Effect.gen(function* () {
        const intake = yield* Intake.make()
        yield* Effect.forkScoped(intake.run)
        for (let i = 0; i < 400 && !fake.connections.some((c) => c.options.length > 0); i++) yield* Effect.sleep("25 millis")
        fake.publish([commitFrame(plc(1), 1_800_000_000_000_000, WH, "w1", "create", whRecordValue(`at://${plc(2)}`))])
        yield* Deferred.await(committed).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "never committed" }))
        // two attempts on the first connection (the default, 3, would have committed there), the
        // third on the next one
        expect(seen).toHaveLength(3)
        expect(seen[0]).toBe(seen[1])
        expect(seen[2]).toBeGreaterThan(seen[1] ?? 0)
      }).pipe(Effect.provide(processor), Effect.provide(memoryStack({ config })))
    }), { timeout: 30_000 })
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
    Effect.gen(function* () {
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
    Effect.gen(function* () {
      expect(yield* trackedAfterTick({ RETRY_SCHEDULER_TRACKED_MAX: "3" })).toEqual(owners.slice(0, 3))
      expect(yield* trackedAfterTick({})).toEqual(owners.slice(0, 16))
      // an explicit option still wins over the configuration
      expect(yield* trackedAfterTick({ RETRY_SCHEDULER_TRACKED_MAX: "3" }, { trackedMax: 5 })).toEqual(owners.slice(0, 5))
    }))
})
