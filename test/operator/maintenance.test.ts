/**
 * Maintenance (SPEC §4.9) on real PostgreSQL: each rule prunes exactly the rows it should, the
 * row bounds hold, runs are bounded, a statement stuck on a lock times out without stalling the
 * runner, and exactly one runner holds the advisory lock; when it goes (scope closed, or its
 * connection killed) the role is taken again.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import {
  Chunk,
  Clock,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Ref,
  Schedule,
  Scope,
  TestClock,
  TestServices
} from "effect"
import type { SweepKey } from "../../src/services/operator/EventSweep.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import { type AttemptKey, BUDGET_BATCH_FACTOR } from "../../src/services/operator/PruneBatches.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Db from "../support/db.js"
import { seriesValue } from "../support/metricSeries.js"
import { insertWebhook } from "../support/webhookRows.js"

/** A Health of its own per runner, as separate replicas have. */
const newHealth = Health.make.pipe(Effect.provide(Lifecycle.layer({ shutdownTimeout: "5 seconds" })))

const runnerIn = (scope: Scope.Scope, health: Health.HealthShape, options: Maintenance.MaintenanceOptions) =>
  Maintenance.make(options).pipe(Effect.provideService(Health.Health, health), Scope.extend(scope))

const maintenanceBody = (health: Health.HealthShape) => Effect.map(health.report, (r) => r.body["maintenance"])

const reset = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`TRUNCATE outbox, delivery_attempts, delivery_events, audit, tombstones, prior_refs, quarantine, owners`
})

/** The keys of a table, sorted; `key` is a fixed SQL expression written in this file. */
const ids = (table: string, key: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql.unsafe<{ k: string }>(`SELECT (${key})::text AS k FROM ${table} ORDER BY 1`)
    return rows.map((r) => r.k)
  })

const count = (table: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM ${sql(table)}`
    return rows[0]?.n ?? 0
  })

/** An outbox row; `finishedDays` ago for terminal rows (null for pending/leased). */
const outbox = (id: string, eventId: string, status: string, finishedDays: number | null) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                          event_rkey, event_operation, target_url, signing_mode, fingerprint, status, created_at,
                          finished_at)
      VALUES (${id}, ${eventId}, 'did:plc:owner', 'w1', 'direct', 'did:plc:subject', 'app.bsky.feed.post', 'p1',
              'create', 'https://receiver.invalid/hook', 'none', 'fp', ${status}, now() - interval '40 days',
              CASE WHEN ${finishedDays}::int IS NULL THEN NULL
                   ELSE now() - make_interval(days => ${finishedDays}::int) END)`
  )

const attempt = (deliveryId: string, n: number, days: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome)
      VALUES (${deliveryId}, ${n}, now() - make_interval(days => ${days}), 12, 'failed')`
  )

const event = (id: string, days: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO delivery_events (event_id, body, body_sha256, created_at)
      VALUES (${id}, '{}', 'sha', now() - make_interval(days => ${days}))`
  )

const audit = (n: number, days: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO audit (delivery_id, event_id, owner_did, webhook_rkey, event_did, event_collection, event_rkey,
                         event_operation, status, created_at)
      SELECT 'd' || g, 'e' || g, 'did:plc:owner', 'w1', 'did:plc:subject', 'app.bsky.feed.post', 'p' || g,
             'create', 'delivered', now() - make_interval(days => ${days})
      FROM generate_series(1, ${n}) AS g`
  )

const quarantine = (n: number, days: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO quarantine (stream, relay, reason, event_hash, created_at)
      SELECT 'direct', 'wss://relay.invalid', 'payload_invalid', 'h' || g, now() - make_interval(days => ${days})
      FROM generate_series(1, ${n}) AS g`
  )

const owner = (did: string, status: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`INSERT INTO owners (did, reconcile_status) VALUES (${did}, ${status})`
  )

const tombstone = (did: string, rkey: string, days: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO tombstones (owner_did, rkey, rev, generation, deleted_at)
      VALUES (${did}, ${rkey}, '3kabc', 1, now() - make_interval(days => ${days}))`
  )

/** A tombstone deleted `minutes` ago (all tombstones a transaction writes share its `now()`). */
const tombstoneMinutesAgo = (did: string, rkey: string, minutes: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO tombstones (owner_did, rkey, rev, generation, deleted_at)
      VALUES (${did}, ${rkey}, '3kabc', 1, now() - make_interval(mins => ${minutes}))`
  )

/** Sessions of this database waiting for a lock on `tombstones`. */
const waitingOnTombstones = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ n: number }>`
    SELECT count(*)::int AS n FROM pg_locks
    WHERE relation = 'tombstones'::regclass AND NOT granted
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
  return rows[0]?.n ?? 0
})

/** Poll (on the live clock, at most ~10 s) until `waitingOnTombstones` is `n`; returns the last value. */
const untilWaitingOnTombstones = (n: number) =>
  Effect.repeat(waitingOnTombstones, {
    schedule: Schedule.spaced("10 millis"),
    until: (k) => k === n,
    times: 1_000
  }).pipe(TestServices.provideLive, Effect.zipRight(waitingOnTombstones))

/** The rule-failure counter of `rule` and `kind` (0 before the first failure). */
const ruleFailures = (rule: string, kind: string) =>
  seriesValue("firehook_maintenance_rule_failures_total", { rule, kind })

/**
 * Wait until the runner is asleep for `interval` from now; returns its wake-up instant. The
 * TestClock is shared by every test of the layer and keeps the sleeps of finished timeouts (the
 * statement timeouts of earlier runs, among others), so the wake-up is looked for, not assumed to
 * be the only sleep.
 */
const untilIntervalSleep = (interval: number) =>
  Effect.gen(function*() {
    const at = (yield* Clock.currentTimeMillis) + interval
    yield* Effect.repeat(TestClock.sleeps(), { until: (s) => Chunk.toReadonlyArray(s).includes(at) })
    return at
  })

/** A prior reference expiring `seconds` from now (negative: already expired). */
const priorRef = (uri: string, seconds: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      INSERT INTO prior_refs (record_uri, rev, refs, bytes, expires_at)
      VALUES (${uri}, '3kabc', '[]'::jsonb, 2, now() + make_interval(secs => ${seconds}))`
  )

const ZERO = Maintenance.ZERO_PRUNE_COUNTS

/**
 * A runner for the TestClock loop tests: its lock pings are bounded far beyond their adjusts. The
 * TestClock counts a fiber waiting for I/O as suspended, so an adjust went on past the 10 s bound
 * of a ping whose `SELECT 1` had not answered yet (a loaded machine): the runner gave its role up
 * and took it again, running once more at once ('expected 2 to be 1'), or the test hung.
 */
const ON_TEST_CLOCK = { interval: "60 seconds", pingTimeout: "1 hour" } as const

// The lock hand-over tests run on the live clock with a 100 ms interval: they wait for states
// (never for time), and a live clock keeps the 10 s lock-statement timeouts out of the way.
describe("Maintenance", () => {
  it.layer(Db.layer())("on PostgreSQL", (it) => {
    it.effect("prunes exactly the rows each rule names, and nothing else", () =>
      Effect.gen(function*() {
        yield* reset
        // outbox, by status and finished_at
        yield* outbox("d-old", "ev-shared-old", "delivered", 8)
        yield* outbox("d-new", "ev-new-ref", "delivered", 6)
        yield* outbox("dl-old", "ev-x", "dead_letter", 31)
        yield* outbox("dl-mid", "ev-dl-mid", "dead_letter", 8)
        yield* outbox("c-old", "ev-y", "cancelled", 8)
        yield* outbox("c-new", "ev-z", "cancelled", 1)
        yield* outbox("p-old", "ev-pending-old", "pending", null)
        yield* outbox("l-old", "ev-leased-old", "leased", null)
        // attempts: of pruned rows go with them; of kept rows stay; old orphans go, young ones stay
        yield* attempt("d-old", 1, 8)
        yield* attempt("d-old", 2, 8)
        yield* attempt("dl-old", 1, 31)
        yield* attempt("d-new", 1, 6)
        yield* attempt("p-old", 1, 40)
        yield* attempt("ghost-old", 1, 31)
        yield* attempt("ghost-new", 1, 1)
        // bodies: old and unreferenced go; referenced (by a kept row) or young stay; a body whose
        // only reference is pruned in the same run goes too
        yield* event("ev-unref-old", 8)
        yield* event("ev-unref-new", 6)
        yield* event("ev-pending-old", 40)
        yield* event("ev-leased-old", 40)
        yield* event("ev-dl-mid", 9)
        yield* event("ev-shared-old", 9)
        // audit and quarantine by age
        yield* audit(3, 31)
        yield* audit(2, 29)
        yield* quarantine(4, 31)
        yield* quarantine(1, 29)
        // tombstones: old ones go, except for an owner being reconciled
        yield* owner("did:plc:complete", "complete")
        yield* owner("did:plc:scanning", "scanning")
        yield* owner("did:plc:failed", "failed")
        yield* tombstone("did:plc:complete", "old", 8)
        yield* tombstone("did:plc:complete", "new", 6)
        yield* tombstone("did:plc:scanning", "old", 30)
        yield* tombstone("did:plc:failed", "old", 8)
        yield* tombstone("did:plc:unknown-owner", "old", 8)
        // prior references by expires_at
        yield* priorRef("at://did:plc:a/app.bsky.feed.like/1", -1)
        yield* priorRef("at://did:plc:a/app.bsky.feed.like/2", -86_400)
        yield* priorRef("at://did:plc:a/app.bsky.feed.like/3", 3_600)

        const counts = yield* Maintenance.runOnce()
        expect(counts).toEqual({
          outbox: 3,
          delivery_attempts: 4,
          delivery_events: 2,
          audit: 3,
          tombstones: 3,
          prior_refs: 2,
          quarantine: 4,
          rejected_records: 0
        })
        expect(yield* ids("outbox", "delivery_id")).toEqual(["c-new", "d-new", "dl-mid", "l-old", "p-old"])
        expect(yield* ids("delivery_attempts", "delivery_id")).toEqual(["d-new", "ghost-new", "p-old"])
        expect(yield* ids("delivery_events", "event_id")).toEqual([
          "ev-dl-mid",
          "ev-leased-old",
          "ev-pending-old",
          "ev-unref-new"
        ])
        expect(yield* count("audit")).toBe(2)
        expect(yield* count("quarantine")).toBe(1)
        expect(yield* ids("tombstones", "owner_did || '/' || rkey")).toEqual([
          "did:plc:complete/new",
          "did:plc:scanning/old"
        ])
        expect(yield* ids("prior_refs", "record_uri")).toEqual(["at://did:plc:a/app.bsky.feed.like/3"])
        // a second run finds nothing left
        expect(yield* Maintenance.runOnce()).toEqual(ZERO)
      }))

    it.effect("an orphan attempt stays until it is older than the longest outbox retention (dead letters' 30 days), not the shortest", () =>
      Effect.gen(function*() {
        yield* reset
        yield* attempt("ghost-8d", 1, 8) // older than the delivered and cancelled retentions (7 days)
        yield* attempt("ghost-29d", 1, 29)
        yield* attempt("ghost-31d", 1, 31)
        expect((yield* Maintenance.runOnce()).delivery_attempts).toBe(1)
        expect(yield* ids("delivery_attempts", "delivery_id")).toEqual(["ghost-29d", "ghost-8d"])
      }))

    it.effect("audit and quarantine keep at most the newest 100,000 rows", () =>
      Effect.gen(function*() {
        yield* reset
        yield* audit(100_050, 1)
        yield* quarantine(100_020, 1)
        const sql = yield* SqlClient.SqlClient
        const minAudit = yield* sql<{ id: string }>`SELECT min(id)::text AS id FROM audit`
        const counts = yield* Maintenance.runOnce()
        expect(counts.audit).toBe(50)
        expect(counts.quarantine).toBe(20)
        expect(yield* count("audit")).toBe(100_000)
        expect(yield* count("quarantine")).toBe(100_000)
        // the oldest 50 went
        const after = yield* sql<{ id: string }>`SELECT min(id)::text AS id FROM audit`
        expect(BigInt(after[0]?.id ?? "0") - BigInt(minAudit[0]?.id ?? "0")).toBe(50n)
        expect((yield* Maintenance.runOnce()).audit).toBe(0)
        yield* reset
      }))

    it.effect(
      "one run brings audit back to its 100,000-row bound after a minute at the documented peak throughput",
      () =>
        Effect.gen(function*() {
          yield* reset
          // the README's peak is 6,345 deliveries/s: 380,700 audit rows a minute (one maintenance
          // interval), all younger than the 30-day retention
          yield* audit(100_000 + 400_000, 1)
          const counts = yield* Maintenance.runOnce()
          expect(yield* count("audit")).toBe(100_000)
          expect(counts.audit).toBe(400_000)
          yield* reset
        }),
      120_000
    )

    it.scoped("the audit rules stay one pass over the table when its statistics say it is empty (ANALYZE during a bulk insert)", () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* SqlClient.SqlClient
        // no autovacuum may refresh the statistics between the ANALYZE below and the run
        yield* sql`ALTER TABLE audit SET (autovacuum_enabled = false)`
        yield* Effect.addFinalizer(() => Effect.orDie(sql`ALTER TABLE audit RESET (autovacuum_enabled)`))
        const inserted = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const writer = yield* sql
          .withTransaction(
            audit(60_000, 1).pipe(
              Effect.zipRight(Deferred.succeed(inserted, undefined)),
              Effect.zipRight(Deferred.await(release))
            )
          )
          .pipe(Effect.forkScoped)
        yield* Deferred.await(inserted)
        // the rows are not yet committed: ANALYZE counts none of them, over the pages they fill
        yield* sql`ANALYZE audit`
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(writer)
        const stats = yield* sql<{ tuples: number; pages: number }>`
          SELECT reltuples::float8 AS tuples, relpages AS pages FROM pg_class WHERE relname = 'audit'`
        expect(stats[0]?.tuples).toBe(0)
        expect(stats[0]?.pages).toBeGreaterThan(100)
        // a join of the table with a subquery of its own ids, planned for an empty table, is a nested
        // loop that rescans the subquery for each of the 60,000 rows; the range deletes are one pass
        const counts = yield* Maintenance.runOnce({ auditMaxRows: 10_000 })
        expect(counts.audit).toBe(50_000)
        expect(yield* count("audit")).toBe(10_000)
        yield* reset
      }))

    it.effect("a run without time budget is bounded: batchSize rows per statement, maxBatches statements per rule", () =>
      Effect.gen(function*() {
        yield* reset
        yield* audit(75, 31)
        for (let i = 0; i < 25; i++) yield* outbox(`d-${i}`, `ev-${i}`, "delivered", 8)
        const options = { batchSize: 10, maxBatches: 3, runBudget: 0 }
        const first = yield* Maintenance.runOnce(options)
        expect(first.audit).toBe(30)
        expect(first.outbox).toBe(25)
        expect((yield* Maintenance.runOnce(options)).audit).toBe(30)
        expect((yield* Maintenance.runOnce(options)).audit).toBe(15)
        expect((yield* Maintenance.runOnce(options)).audit).toBe(0)
        expect(yield* count("audit")).toBe(0)
        const small = { batchSize: 10, maxBatches: 1, runBudget: 0 }
        yield* audit(25, 31)
        expect((yield* Maintenance.runOnce(small)).audit).toBe(10)
        expect(yield* count("audit")).toBe(15)
      }))

    it.effect("the age rules take full batches of old rows where ids do not follow created_at (young rows first)", () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* SqlClient.SqlClient
        // the lowest ids are young: each batch is still `batchSize` rows past retention, so one run
        // with room for three batches prunes all 25 old rows and keeps the 5 young ones
        yield* audit(5, 1)
        yield* audit(25, 31)
        yield* quarantine(5, 1)
        yield* quarantine(25, 31)
        const counts = yield* Maintenance.runOnce({ batchSize: 10, maxBatches: 3 })
        expect([counts.audit, counts.quarantine]).toEqual([25, 25])
        const left = yield* sql<{ t: string; n: number }>`
          SELECT 'audit' AS t, count(*)::int AS n FROM audit WHERE created_at > now() - interval '2 days'
          UNION ALL
          SELECT 'quarantine', count(*)::int FROM quarantine WHERE created_at > now() - interval '2 days'
          ORDER BY 1`
        expect(left.map((r) => [r.t, r.n])).toEqual([["audit", 5], ["quarantine", 5]])
        expect([yield* count("audit"), yield* count("quarantine")]).toEqual([5, 5])
      }))

    it.effect("tombstones keep at most tombstonesMaxRows: the oldest deleted_at go first, ties by key", () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* SqlClient.SqlClient
        yield* owner("did:plc:scanning", "scanning")
        yield* tombstoneMinutesAgo("did:plc:a", "t60", 60)
        // an owner being reconciled keeps its tombstones (SPEC §3.4), under the row bound too
        yield* tombstoneMinutesAgo("did:plc:scanning", "t50", 50)
        // one transaction: three tombstones with the same deleted_at, across the cut
        yield* sql.withTransaction(
          Effect.all([
            tombstoneMinutesAgo("did:plc:b", "x", 40),
            tombstoneMinutesAgo("did:plc:c", "x", 40),
            tombstoneMinutesAgo("did:plc:c", "y", 40)
          ])
        )
        yield* tombstoneMinutesAgo("did:plc:a", "t30", 30)
        yield* tombstoneMinutesAgo("did:plc:a", "t20", 20)
        yield* tombstoneMinutesAgo("did:plc:a", "t10", 10)
        const counts = yield* Maintenance.runOnce({ tombstonesMaxRows: 4 })
        expect(counts).toEqual({ ...ZERO, tombstones: 3 })
        expect(yield* ids("tombstones", "owner_did || '/' || rkey")).toEqual([
          "did:plc:a/t10",
          "did:plc:a/t20",
          "did:plc:a/t30",
          "did:plc:c/y",
          "did:plc:scanning/t50"
        ])
        expect(yield* Maintenance.runOnce({ tombstonesMaxRows: 4 })).toEqual(ZERO)
        // under the default bound (SPEC §3.4) nothing goes
        expect(yield* Maintenance.runOnce()).toEqual(ZERO)
        expect(Maintenance.DEFAULT_RETENTION.tombstonesMaxRows).toBe(100_000)
      }))

    it.effect("the tombstone row bound is bounded per run (batchSize, maxBatches) and skips locked rows", () =>
      Effect.gen(function*() {
        yield* reset
        for (let i = 1; i <= 10; i++) yield* tombstoneMinutesAgo("did:plc:a", `t${String(i).padStart(2, "0")}`, 100 - i)
        const options = { tombstonesMaxRows: 3, batchSize: 2, maxBatches: 2, runBudget: 0 }
        expect((yield* Maintenance.runOnce(options)).tombstones).toBe(4)
        expect(yield* count("tombstones")).toBe(6)
        // the oldest left is locked by a writer: skipped, not waited for
        const sql = yield* SqlClient.SqlClient
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const writer = yield* sql
          .withTransaction(
            sql`SELECT 1 FROM tombstones WHERE owner_did = 'did:plc:a' AND rkey = 't05' FOR UPDATE`.pipe(
              Effect.zipRight(Deferred.succeed(locked, undefined)),
              Effect.zipRight(Deferred.await(release))
            )
          )
          .pipe(Effect.fork)
        yield* Deferred.await(locked)
        expect((yield* Maintenance.runOnce(options)).tombstones).toBe(2)
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(writer)
        expect(yield* ids("tombstones", "rkey")).toEqual(["t05", "t08", "t09", "t10"])
        expect((yield* Maintenance.runOnce(options)).tombstones).toBe(1)
        expect(yield* ids("tombstones", "rkey")).toEqual(["t08", "t09", "t10"])
        expect((yield* Maintenance.runOnce(options)).tombstones).toBe(0)
      }))

    it.effect("a backlog beyond maxBatches batches is pruned in one run while the run's time budget lasts, up to BUDGET_BATCH_FACTOR × maxBatches statements", () =>
      Effect.gen(function*() {
        yield* reset
        // 75 delivered rows past retention (each with an attempt) and 75 old audit rows: more than
        // the 3 batches of 10 the count cap alone allows (the old bound: 30 a run)
        for (let i = 0; i < 75; i++) {
          yield* outbox(`d-${i}`, `ev-${i}`, "delivered", 8)
          yield* attempt(`d-${i}`, 1, 8)
        }
        yield* audit(75, 31)
        // the TestClock stands still: the 30 s budget lasts for the whole run
        const counts = yield* Maintenance.runOnce({ batchSize: 10, maxBatches: 3 })
        expect([counts.outbox, counts.delivery_attempts, counts.audit]).toEqual([75, 75, 75])
        expect([yield* count("outbox"), yield* count("delivery_attempts"), yield* count("audit")]).toEqual([0, 0, 0])
        // still bounded: at most BUDGET_BATCH_FACTOR × maxBatches statements a rule
        expect(BUDGET_BATCH_FACTOR).toBe(20)
        for (let i = 0; i < 50; i++) yield* outbox(`e-${i}`, `ev-${i}`, "delivered", 8)
        expect((yield* Maintenance.runOnce({ batchSize: 2, maxBatches: 1 })).outbox).toBe(40)
        expect((yield* Maintenance.runOnce({ batchSize: 2, maxBatches: 1 })).outbox).toBe(10)
        expect(Duration.toMillis(Maintenance.DEFAULT_RETENTION.runBudget)).toBe(30_000)
      }))

    it.effect("orphan attempts are walked from a cursor, batchSize attempts a statement (retained ones are not walked again)", () =>
      Effect.gen(function*() {
        yield* reset
        // 30 old attempts whose outbox rows are kept (pending), then 5 old orphans: each statement
        // walks 10 attempts in started_at order and deletes the orphans among them
        for (let i = 0; i < 30; i++) {
          yield* outbox(`p-${String(i).padStart(2, "0")}`, `ev-${i}`, "pending", null)
          yield* attempt(`p-${String(i).padStart(2, "0")}`, 1, 40)
        }
        for (let i = 0; i < 5; i++) yield* attempt(`ghost-${i}`, 1, 31)
        yield* attempt("ghost-young", 1, 29)
        const cursor = yield* Ref.make<AttemptKey | undefined>(undefined)
        const options = { batchSize: 10, maxBatches: 2, runBudget: 0 }
        // run 1 walks the 20 oldest (all kept): nothing deleted, the cursor after them
        expect((yield* Maintenance.runOnce(options, undefined, cursor)).delivery_attempts).toBe(0)
        expect((yield* Ref.get(cursor))?.deliveryId).toBe("p-19")
        // run 2 walks on from there, reaches the cutoff and deletes the 5; the next walk starts over
        expect((yield* Maintenance.runOnce(options, undefined, cursor)).delivery_attempts).toBe(5)
        expect(yield* Ref.get(cursor)).toBeUndefined()
        expect(yield* count("delivery_attempts")).toBe(31)
        expect(yield* ids("delivery_attempts", "delivery_id")).not.toContain("ghost-0")
        expect((yield* Maintenance.runOnce(options, undefined, cursor)).delivery_attempts).toBe(0)
        expect((yield* Ref.get(cursor))?.deliveryId).toBe("p-19")
      }))

    it.scoped("a tombstone is kept while its owner's scan begins (the begin's UPDATE holds the owner row), and after", () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* SqlClient.SqlClient
        yield* owner("did:plc:begin", "complete")
        yield* owner("did:plc:idle", "complete")
        yield* tombstone("did:plc:begin", "old", 8)
        yield* tombstone("did:plc:idle", "old", 8)
        // a second connection begins the owner's scan (ReconcileStoreSql's begin: a non-key UPDATE
        // of the owner row) and has not committed yet when the prune runs
        const begun = yield* Deferred.make<void>()
        const commit = yield* Deferred.make<void>()
        const scan = yield* sql
          .withTransaction(
            sql`UPDATE owners SET reconcile_status = 'scanning', scan_started_at = now() WHERE did = 'did:plc:begin'`
              .pipe(
                Effect.zipRight(Deferred.succeed(begun, undefined)),
                Effect.zipRight(Deferred.await(commit))
              )
          )
          .pipe(Effect.forkScoped)
        yield* Deferred.await(begun)
        // old code: 2 (the statement's snapshot still said `complete`, and the owner row was not
        // locked: the tombstone went while the scan was beginning)
        expect((yield* Maintenance.runOnce()).tombstones).toBe(1)
        yield* Deferred.succeed(commit, undefined)
        yield* Fiber.join(scan)
        expect(yield* ids("tombstones", "owner_did || '/' || rkey")).toEqual(["did:plc:begin/old"])
        // scanning: kept
        expect((yield* Maintenance.runOnce()).tombstones).toBe(0)
        // once the scan is over it goes
        yield* sql`UPDATE owners SET reconcile_status = 'complete' WHERE did = 'did:plc:begin'`
        expect((yield* Maintenance.runOnce()).tombstones).toBe(1)
        expect(yield* count("tombstones")).toBe(0)
      }))

    it.scoped("a statement stuck on a lock times out, cancelled; the other rules run; the next run proceeds (TestClock)", () =>
      Effect.gen(function*() {
        yield* reset
        yield* tombstone("did:plc:complete", "old", 8)
        yield* quarantine(2, 31)
        const sql = yield* SqlClient.SqlClient
        // another session holds the tombstones table: every statement on it waits
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const holder = yield* sql
          .withTransaction(
            sql`LOCK TABLE tombstones IN ACCESS EXCLUSIVE MODE`.pipe(
              Effect.zipRight(Deferred.succeed(locked, undefined)),
              Effect.zipRight(Deferred.await(release))
            )
          )
          .pipe(Effect.forkScoped)
        yield* Deferred.await(locked)
        const timeoutsBefore = yield* ruleFailures("tombstones", "timeout")

        const run = yield* Effect.forkScoped(Effect.either(Maintenance.runOnce({ statementTimeout: "5 seconds" })))
        // the tombstones statement is waiting for the lock on the server
        expect(yield* untilWaitingOnTombstones(1)).toBe(1)
        yield* TestClock.adjust("5 seconds")
        // (a live bound on the wait, so that a missing timeout fails here instead of hanging)
        const result = yield* Fiber.join(run).pipe(Effect.timeout("10 seconds"), TestServices.provideLive)
        expect(result._tag === "Left" && result.left.op).toBe("maintenance.tombstones")
        expect(result._tag === "Left" && result.left.message).toBe("store maintenance.tombstones failed (timeout)")
        expect((yield* ruleFailures("tombstones", "timeout")) - timeoutsBefore).toBe(1)
        // the statement was cancelled on the server, while the lock is still held
        expect(yield* untilWaitingOnTombstones(0)).toBe(0)
        // the rules after it ran
        expect(yield* count("quarantine")).toBe(0)

        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        expect(yield* Maintenance.runOnce()).toEqual({ ...ZERO, tombstones: 1 })
        expect(Duration.toMillis(Maintenance.DEFAULT_RETENTION.statementTimeout)).toBe(30_000)
      }))

    it.effect("pruned parked dead letters give their webhook's parking room back (SPEC §4.3: 10,000 parked)", () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM webhooks`
        yield* insertWebhook("did:plc:owner", "w1", {
          fingerprint: "fp",
          // its count started (created or resumed) before the rows below were parked
          state: { auto_disabled_at: "now()", parked: "3", parked_since: "now() - interval '60 days'" }
        })
        yield* outbox("parked-old-1", "ev-1", "dead_letter", 31)
        yield* outbox("parked-old-2", "ev-2", "dead_letter", 31)
        yield* outbox("parked-new", "ev-3", "dead_letter", 5)
        yield* outbox("failed-old", "ev-4", "dead_letter", 31)
        yield* sql`UPDATE outbox SET last_error_kind = CASE WHEN delivery_id LIKE 'parked%'
          THEN 'webhook_disabled' ELSE 'http_5xx' END`
        const counts = yield* Maintenance.runOnce()
        expect(counts.outbox).toBe(3)
        expect(yield* ids("outbox", "delivery_id")).toEqual(["parked-new"])
        // old code: 3 (the pruned rows kept their room, so a webhook gone for longer than the
        // dead-letter retention parked nothing any more while none of its parked rows was left)
        const parked = yield* sql<{ parked: number }>`SELECT parked FROM webhooks`
        expect(parked[0]?.parked).toBe(1)
        yield* sql`DELETE FROM webhooks`
      }))

    it.effect("event bodies are walked from a cursor, a bounded window per statement (retained bodies are not walked again)", () =>
      Effect.gen(function*() {
        yield* reset
        // 30 old bodies still referenced (pending rows), then 5 old unreferenced ones
        for (let i = 0; i < 30; i++) {
          const id = `ev-ref-${String(i).padStart(2, "0")}`
          yield* event(id, 40)
          yield* outbox(`p-${i}`, id, "pending", null)
        }
        for (let i = 0; i < 5; i++) yield* event(`ev-unref-${i}`, 8)
        const cursor = yield* Ref.make<SweepKey | undefined>(undefined)
        const options = { eventSweepWindow: 10, maxBatches: 2 }
        // run 1 walks the 20 oldest bodies (all referenced): nothing deleted, the cursor after them
        expect((yield* Maintenance.runOnce(options, cursor)).delivery_events).toBe(0)
        expect((yield* Ref.get(cursor))?.eventId).toBe("ev-ref-19")
        // run 2 walks on from there, reaches the cutoff and deletes the 5; the next walk starts over
        expect((yield* Maintenance.runOnce(options, cursor)).delivery_events).toBe(5)
        expect(yield* Ref.get(cursor)).toBeUndefined()
        expect(yield* count("delivery_events")).toBe(30)
        expect((yield* Maintenance.runOnce(options, cursor)).delivery_events).toBe(0)
        expect((yield* Ref.get(cursor))?.eventId).toBe("ev-ref-19")
        // without a cursor (a one-off run, e.g. the CLI's) the walk starts from the oldest body
        yield* event("ev-unref-late", 8)
        expect((yield* Maintenance.runOnce({ eventSweepWindow: 10, maxBatches: 4 })).delivery_events).toBe(1)
      }))

    it.effect("audit and quarantine each keep their own row bound (auditMaxRows, quarantineMaxRows)", () =>
      Effect.gen(function*() {
        yield* reset
        yield* audit(5, 1)
        yield* quarantine(5, 1)
        const counts = yield* Maintenance.runOnce({ auditMaxRows: 4, quarantineMaxRows: 2 })
        expect([counts.audit, counts.quarantine]).toEqual([1, 3])
        expect([yield* count("audit"), yield* count("quarantine")]).toEqual([4, 2])
        expect(Maintenance.DEFAULT_RETENTION.quarantineMaxRows).toBe(100_000)
      }))

    it.effect("retention values come from the options", () =>
      Effect.gen(function*() {
        yield* reset
        yield* outbox("d-2d", "e1", "delivered", 2)
        yield* audit(2, 2)
        const counts = yield* Maintenance.runOnce({ delivered: "1 day", audit: "1 day" })
        expect(counts.outbox).toBe(1)
        expect(counts.audit).toBe(2)
      }))

    it.scoped("the loop runs as soon as it holds the lock, then every interval (TestClock)", () =>
      Effect.gen(function*() {
        yield* reset
        yield* audit(5, 31)
        const health = yield* newHealth
        const scope = yield* Effect.scope
        const m = yield* runnerIn(scope, health, ON_TEST_CLOCK)
        yield* m.awaitStatus((s) => s.runner && s.runs === 1)
        expect(yield* count("audit")).toBe(0)
        expect(yield* maintenanceBody(health)).toEqual({ runner: true, lastRunOk: true })
        // the runner is now asleep until the next interval: nothing happens before it
        yield* audit(5, 31)
        const wake = yield* untilIntervalSleep(60_000)
        yield* TestClock.adjust("59 seconds")
        // still asleep: its wake-up is pending 60 s after the run
        expect(Chunk.toReadonlyArray(yield* TestClock.sleeps())).toContain(wake)
        expect((yield* m.status).runs).toBe(1)
        yield* TestClock.adjust("1 second")
        yield* m.awaitStatus((s) => s.runs === 2)
        expect(yield* count("audit")).toBe(0)
        expect(yield* m.runOnce).toEqual(ZERO)
      }))

    it.scoped("two runners on one database: one holds the lock; when its scope closes the other takes over", () =>
      Effect.gen(function*() {
        yield* reset
        const options = { interval: "100 millis" } as const
        const healthA = yield* newHealth
        const healthB = yield* newHealth
        const scopeA = yield* Scope.make()
        const a = yield* runnerIn(scopeA, healthA, options)
        yield* a.awaitStatus((s) => s.runner)
        const scopeB = yield* Scope.make()
        yield* Effect.addFinalizer(() => Scope.close(scopeB, Exit.void))
        const b = yield* runnerIn(scopeB, healthB, options)
        // B tries (several times), never gets it while A holds it
        yield* b.awaitStatus((s) => s.lockAttempts >= 3)
        expect((yield* b.status).runner).toBe(false)
        expect((yield* b.status).acquisitions).toBe(0)
        expect(yield* maintenanceBody(healthA)).toEqual({ runner: true, lastRunOk: true })
        expect(yield* maintenanceBody(healthB)).toEqual({ runner: false, lastRunOk: true })
        expect((yield* a.status).runner).toBe(true)

        yield* Scope.close(scopeA, Exit.void)
        const sb = yield* b.awaitStatus((s) => s.runner && s.runs >= 1)
        expect(sb.acquisitions).toBe(1)
        expect(yield* maintenanceBody(healthB)).toEqual({ runner: true, lastRunOk: true })
        // A's section went with its scope
        expect((yield* healthA.report).body["maintenance"]).toBeUndefined()
        // exactly one session holds the lock
        const sql = yield* SqlClient.SqlClient
        const holders = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_locks
          WHERE locktype = 'advisory' AND objid = ${Maintenance.MAINTENANCE_LOCK_KEY} AND granted
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
        expect(holders[0]?.n).toBe(1)
      }).pipe(TestServices.provideLive))

    it.scoped("when the runner's connection dies, its lock is gone and the role is taken again", () =>
      Effect.gen(function*() {
        yield* reset
        const health = yield* newHealth
        const scope = yield* Effect.scope
        const m = yield* runnerIn(scope, health, { interval: "100 millis" })
        yield* m.awaitStatus((s) => s.runner)
        const sql = yield* SqlClient.SqlClient
        const killed = yield* sql<{ ok: boolean }>`
          SELECT pg_terminate_backend(pid) AS ok FROM pg_locks
          WHERE locktype = 'advisory' AND objid = ${Maintenance.MAINTENANCE_LOCK_KEY} AND granted
            AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
        expect(killed.map((r) => r.ok)).toEqual([true])
        const s = yield* m.awaitStatus((s) => s.acquisitions >= 2 && s.runner)
        expect(s.runner).toBe(true)
        expect(yield* maintenanceBody(health)).toEqual({ runner: true, lastRunOk: true })
      }).pipe(TestServices.provideLive))

    it.scoped("a failing run is reported in health (lastRunOk: false) and the loop goes on", () =>
      Effect.gen(function*() {
        yield* reset
        const sql = yield* SqlClient.SqlClient
        // make one rule fail: a table it needs is briefly renamed
        yield* sql`ALTER TABLE prior_refs RENAME TO prior_refs_hidden`
        yield* Effect.addFinalizer(() =>
          sql`ALTER TABLE IF EXISTS prior_refs_hidden RENAME TO prior_refs`.pipe(Effect.orDie)
        )
        yield* audit(3, 31)
        const health = yield* newHealth
        const scope = yield* Effect.scope
        const m = yield* runnerIn(scope, health, ON_TEST_CLOCK)
        yield* m.awaitStatus((s) => s.runs === 1)
        expect(yield* maintenanceBody(health)).toEqual({ runner: true, lastRunOk: false })
        // the other rules still ran
        expect(yield* count("audit")).toBe(0)
        const failed = yield* Effect.either(m.runOnce)
        expect(failed._tag === "Left" && failed.left._tag === "StoreError" && failed.left.op).toBe(
          "maintenance.prior_refs"
        )
        // the error carries a code, never SQL text
        expect(failed._tag === "Left" && failed.left.message).toBe("store maintenance.prior_refs failed (42P01)")
        yield* sql`ALTER TABLE prior_refs_hidden RENAME TO prior_refs`
        yield* untilIntervalSleep(60_000)
        yield* TestClock.adjust("60 seconds")
        yield* m.awaitStatus((s) => s.runs === 2)
        expect(yield* maintenanceBody(health)).toEqual({ runner: true, lastRunOk: true })
      }))
  })
})
