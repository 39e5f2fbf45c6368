import * as Reactivity from "@effect/experimental/Reactivity"
import * as PgClient from "@effect/sql-pg/PgClient"
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Logger, Schedule, TestClock, TestServices } from "effect"
import * as Database from "../../src/services/platform/Database.js"
import * as Migrations from "../../src/services/platform/Migrations.js"
import * as Db from "../support/db.js"

const EXPECTED_TABLES = [
  "api_jti",
  "audit",
  "backfill_state",
  "cursors",
  "delivery_attempts",
  "delivery_events",
  "firehook_migrations",
  "outbox",
  "owners",
  "prior_refs",
  "quarantine",
  "registry_changes",
  "rejected_records",
  "secrets",
  "tombstones",
  "webhooks"
]

const MIGRATION_IDS = Object.keys(Migrations.migrations).map((name) => Number(name.slice(0, 4)))
/** Numeric order (the default sort is by text: 10 before 2). */
const byNumber = (x: number, y: number) => x - y

/** An independent client (its own pool) on the same database. */
const client = (url: Parameters<typeof PgClient.make>[0]["url"]) =>
  PgClient.make({ url, maxConnections: 4 }).pipe(Effect.provide(Reactivity.layer))

describe("Migrations", () => {
  it.scoped("run twice, and concurrently from two clients, without error", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const a = yield* client(url)
      const b = yield* client(url)
      const run = (c: PgClient.PgClient) => Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      // concurrently, on an empty database
      const [ra, rb] = yield* Effect.all([run(a), run(b)], { concurrency: 2 })
      const applied = [...ra, ...rb]
      expect(applied.map(([id]) => id).sort(byNumber)).toEqual(MIGRATION_IDS)
      // again: a no-op
      expect(yield* run(a)).toEqual([])
      expect(yield* run(b)).toEqual([])
      const tables = yield* a<{ table_name: string }>`
        SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name`
      expect(tables.map((t) => t.table_name)).toEqual(EXPECTED_TABLES)
      const ids = yield* a<{ migration_id: number }>`SELECT migration_id FROM firehook_migrations`
      expect(ids.map((r) => r.migration_id).sort(byNumber)).toEqual(MIGRATION_IDS)
    }))

  it.scoped("five concurrent runners on a fresh database: exactly one applies", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const clients = yield* Effect.all(Array.from({ length: 5 }, () => client(url)))
      const results = yield* Effect.all(
        clients.map((c) => Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))),
        { concurrency: "unbounded" }
      )
      // one runner applied every migration, the others found nothing to do
      expect(results.filter((r) => r.length > 0).length).toBe(1)
      expect(results.flat().map(([id]) => id).sort(byNumber)).toEqual(MIGRATION_IDS)
    }))

  it.scoped("0002 adds outbox.origin to a database created by 0001, keeping its rows (origin NULL)", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const c = yield* client(url)
      const first = Migrator.make({})({
        loader: Migrator.fromRecord({ "0001_init": Migrations.migrations["0001_init"] ?? Effect.void }),
        table: Migrations.MIGRATIONS_TABLE
      })
      yield* first.pipe(Effect.provideService(SqlClient.SqlClient, c))
      yield* c`INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did,
        event_collection, event_rkey, event_operation, target_url, signing_mode, fingerprint)
        VALUES ('d1', 'e1', 'did:plc:o', 'w', 'direct', 'did:plc:e', 'c', 'r', 'create', 'https://x.test/h', 'none', 'f')`
      const applied = yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      // 0002 and every later migration (0005 added registry_changes)
      expect(applied.map(([id]) => id)).toEqual(MIGRATION_IDS.filter((id) => id > 1))
      const rows = yield* c<{ delivery_id: string; origin: string | null }>`SELECT delivery_id, origin FROM outbox`
      expect(rows).toEqual([{ delivery_id: "d1", origin: null }])
    }))

  it.scoped("0003 gives a pass row of an older version sweep 0 and no claimed pages, keeping its continuation", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const c = yield* client(url)
      const first = Migrator.make({})({
        loader: Migrator.fromRecord({ "0001_init": Migrations.migrations["0001_init"] ?? Effect.void }),
        table: Migrations.MIGRATIONS_TABLE
      })
      yield* first.pipe(Effect.provideService(SqlClient.SqlClient, c))
      yield* c`INSERT INTO backfill_state (pass, continuation_did, owners_done, pass_started_at)
        VALUES ('initial', 'did:plc:m', 50, now())`
      yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      const rows = yield* c<{ continuation_did: string; owners_done: number; sweep: string; claims: unknown }>`
        SELECT continuation_did, owners_done, sweep, claims FROM backfill_state`
      expect(rows).toEqual([{ continuation_did: "did:plc:m", owners_done: 50, sweep: "0", claims: [] }])
    }))

  it.scoped("a database migrated by a newer version (a migration this one does not know) is refused in one line", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const c = yield* client(url)
      yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      yield* c`INSERT INTO firehook_migrations (migration_id, name) VALUES (${
        MIGRATION_IDS.length + 1
      }, 'future_thing')`
      const error = yield* Database.migrate.pipe(Effect.provideService(SqlClient.SqlClient, c), Effect.flip)
      expect(error.message).toBe(
        `database: the schema was migrated by another firehook version: it has migration ${
          String(MIGRATION_IDS.length + 1).padStart(4, "0")
        }_future_thing, which this version does not know (a newer version's); run the version that migrated it, or a newer one`
      )
    }))

  it.scoped("a database whose migration numbers mean other migrations (main at 5ee6ffe) is refused, nothing applied", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const c = yield* client(url)
      // main at 5ee6ffe numbered backfill_claims 5; 0003 and 0004 came later, renumbered below it
      const old = Migrator.make({})({
        loader: Migrator.fromRecord({
          "0001_init": Migrations.migrations["0001_init"] ?? Effect.void,
          "0002_outbox_origin": Migrations.migrations["0002_outbox_origin"] ?? Effect.void,
          "0005_backfill_claims": Migrations.migrations["0003_backfill_claims"] ?? Effect.void
        }),
        table: Migrations.MIGRATIONS_TABLE
      })
      yield* old.pipe(Effect.provideService(SqlClient.SqlClient, c))
      const error = yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c), Effect.flip)
      expect(error).toEqual(
        new Migrations.SchemaMismatch({
          reason:
            "the schema was migrated by another firehook version: it has migration 0005_backfill_claims, which this version does not know (this version's 0005_registry_changes has its number); this version cannot upgrade it"
        })
      )
      // before, 0006 to 0009 were applied and 0004 and 0005 skipped for good (no rejected_records)
      const ids = yield* c<{ migration_id: number }>`SELECT migration_id FROM firehook_migrations ORDER BY 1`
      expect(ids.map((r) => r.migration_id)).toEqual([1, 2, 5])
    }))

  it.scoped("a database that lacks a migration of this version below its latest is refused", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabase
      const c = yield* client(url)
      yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      yield* c`DELETE FROM firehook_migrations WHERE migration_id = 4`
      const error = yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c), Effect.flip)
      expect(error).toEqual(
        new Migrations.SchemaMismatch({
          reason:
            "the schema lacks migration 0004_rejected_records of this version, which cannot be applied after later ones; this version cannot upgrade it"
        })
      )
    }))

  it.scoped("a run that waits for another runner gives up at MIGRATIONS_TIMEOUT (10 minutes), not before", () =>
    Effect.gen(function*() {
      const { name, url } = yield* Db.freshDatabase
      const c = yield* client(url)
      const holder = yield* client(url)
      const reader = yield* client(url)
      // another runner holds the migrations' lock for as long as this test wants
      const held = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      const hold = yield* holder.withTransaction(
        holder`SELECT pg_advisory_xact_lock(${Migrations.MIGRATION_LOCK_KEY})`.pipe(
          Effect.zipRight(Deferred.succeed(held, undefined)),
          Effect.zipRight(Deferred.await(release))
        )
      ).pipe(Effect.fork)
      yield* Deferred.await(held)
      const migrating = yield* Migrations.run.pipe(
        Effect.provideService(SqlClient.SqlClient, c),
        Effect.flip,
        Effect.fork
      )
      yield* reader<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = ${name} AND wait_event_type = 'Lock' AND query ILIKE '%pg_advisory_xact_lock%'`.pipe(
        Effect.filterOrFail((rows) => (rows[0]?.n ?? 0) > 0, () => "the run is not waiting for the lock"),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 1_500 }),
        TestServices.provideLive
      )
      yield* TestClock.adjust(Duration.toMillis(Migrations.MIGRATIONS_TIMEOUT) - 1_000)
      expect((yield* Fiber.poll(migrating))._tag).toBe("None")
      yield* TestClock.adjust("1 second")
      const error = yield* TestServices.provideLive(
        Fiber.join(migrating).pipe(Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "not given up" }))
      )
      expect(error).toEqual({ code: "timeout" })
      expect(Duration.toMillis(Migrations.MIGRATIONS_TIMEOUT)).toBe(600_000)
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(hold)
    }))

  it.scopedLive("a newer version's migration committed while this run waited for the table is refused after the run", () =>
    Effect.gen(function*() {
      const { name, url } = yield* Db.freshDatabase
      const c = yield* client(url)
      const other = yield* client(url)
      const reader = yield* client(url)
      yield* Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      // another runner's transaction has recorded a newer version's migration, not yet committed:
      // this run's check before the Migrator does not see it
      const recorded = yield* Deferred.make<void>()
      const commit = yield* Deferred.make<void>()
      const writer = yield* other.withTransaction(
        other`INSERT INTO firehook_migrations (migration_id, name) VALUES (${MIGRATION_IDS.length + 1}, 'future_thing')`
          .pipe(
            Effect.zipRight(Deferred.succeed(recorded, undefined)),
            Effect.zipRight(Deferred.await(commit))
          )
      ).pipe(Effect.fork)
      yield* Deferred.await(recorded)
      const migrating = yield* Migrations.runWith({ lockTimeout: "30 seconds" }).pipe(
        Effect.provideService(SqlClient.SqlClient, c),
        Effect.flip,
        Effect.fork
      )
      // the Migrator waits for the bookkeeping table behind that transaction; then it commits
      yield* reader<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = ${name} AND wait_event_type = 'Lock' AND query ILIKE '%LOCK TABLE%'`.pipe(
        Effect.filterOrFail((rows) => (rows[0]?.n ?? 0) > 0, () => "the run is not waiting for the table"),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 1_500 })
      )
      yield* Deferred.succeed(commit, undefined)
      yield* Fiber.join(writer)
      const error = yield* Fiber.join(migrating).pipe(
        Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "the run did not end" })
      )
      expect(error instanceof Migrations.SchemaMismatch ? error.reason : error).toContain(
        "_future_thing, which this version does not know"
      )
    }))

  it.scopedLive("a migration waiting behind another session's lock gives way and retries, never stalling the table", () =>
    Effect.gen(function*() {
      const { name, url } = yield* Db.freshDatabase
      const c = yield* client(url)
      const holder = yield* client(url)
      const reader = yield* client(url)
      // the schema of the version before 0009, which alters `webhooks`
      const before = Object.fromEntries(
        Object.entries(Migrations.migrations).filter(([id]) => Number(id.slice(0, 4)) < 9)
      )
      yield* Migrator.make({})({ loader: Migrator.fromRecord(before), table: Migrations.MIGRATIONS_TABLE }).pipe(
        Effect.provideService(SqlClient.SqlClient, c)
      )
      // a long transaction that has read `webhooks` (ACCESS SHARE, held until it ends)
      const locked = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      const hold = yield* holder.withTransaction(
        holder`SELECT count(*) FROM webhooks`.pipe(
          Effect.zipRight(Deferred.succeed(locked, undefined)),
          Effect.zipRight(Deferred.await(release))
        )
      ).pipe(Effect.fork)
      yield* Deferred.await(locked)
      const warnings: Array<string> = []
      const capture = Logger.make(({ logLevel, message }) => {
        if (logLevel._tag === "Warning") warnings.push(String(message))
      })
      const migrating = yield* Migrations.runWith({ lockTimeout: "200 millis", lockRetryFirst: "50 millis" }).pipe(
        Effect.provideService(SqlClient.SqlClient, c),
        Effect.provide(Logger.replace(Logger.defaultLogger, capture)),
        Effect.fork
      )
      // the migration is waiting for the lock (an ALTER queued behind the reader's transaction)
      const waiting = yield* reader<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = ${name} AND wait_event_type = 'Lock' AND query ILIKE '%ALTER TABLE webhooks%'`.pipe(
        Effect.filterOrFail((rows) => (rows[0]?.n ?? 0) > 0, () => "no ALTER waiting for its lock"),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 1_500 })
      )
      expect(waiting[0]?.n).toBe(1)
      // meanwhile the running service can still read and write the table: each of its statements
      // waits at most one lock timeout (before, they queued behind the ALTER until the holder ended)
      for (let i = 0; i < 3; i++) {
        const n = yield* reader<{ n: number }>`SELECT count(*)::int AS n FROM webhooks`.pipe(
          Effect.timeoutFail({ duration: "10 seconds", onTimeout: () => "stalled behind the migration" })
        )
        expect(n[0]?.n).toBe(0)
      }
      // the warning follows the rollback (a read may be answered first): wait for it, bounded
      yield* Effect.sync(() => warnings.length).pipe(
        Effect.filterOrFail((n) => n > 0, () => "no warning"),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 500 }),
        Effect.ignore
      )
      expect(warnings.length).toBeGreaterThan(0)
      expect(warnings[0]).toContain("gave way to a table lock")
      yield* Deferred.succeed(release, undefined)
      yield* Fiber.join(hold)
      const applied = yield* Fiber.join(migrating)
      expect(applied.map(([id]) => id)).toEqual(MIGRATION_IDS.filter((id) => id >= 9))
      const ids = yield* c<{ migration_id: number }>`SELECT migration_id FROM firehook_migrations ORDER BY 1`
      expect(ids.map((r) => r.migration_id)).toEqual(MIGRATION_IDS)
    }))

  it.layer(Db.layer())("the schema", (it) => {
    it.effect("has the due-row index the delivery worker needs", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const idx = yield* sql<{ indexname: string }>`
          SELECT indexname FROM pg_indexes WHERE tablename = 'outbox' ORDER BY indexname`
        expect(idx.map((i) => i.indexname)).toEqual(
          expect.arrayContaining(["outbox_due", "outbox_lease_expiry", "outbox_webhook", "outbox_finished"])
        )
      }))

    it.effect("the read of completed owners (ReconcileStoreSql completedSince) can be an index range scan", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        // the statement as the store sends it; seq scans off, so the plan shows whether an index fits it
        const plan = yield* sql.withTransaction(Effect.zipRight(
          sql`SET LOCAL enable_seqscan = off`,
          sql<{ "QUERY PLAN": unknown }>`EXPLAIN (FORMAT JSON)
            SELECT did, completed_at::text AS at FROM owners
            WHERE reconcile_status = 'complete' AND completed_at IS NOT NULL
              AND (completed_at, did) > (${"-infinity"}::timestamptz, ${""})
              AND completed_at <= now() - make_interval(secs => ${30}::double precision)
            ORDER BY completed_at, did
            LIMIT ${256}`
        ))
        const text = JSON.stringify(plan)
        expect(text).toContain("owners_completed")
        expect(text).not.toContain("\"Sort\"")
      }))

    it.effect("an owner's dead letters are read in replay order without walking the owner's other rows", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        // an owner with 2,000 delivered rows and 20 dead letters, another with 2,000 dead letters
        yield* sql`
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
            event_rkey, event_operation, target_url, signing_mode, fingerprint, status, created_at, finished_at)
          SELECT 'd' || g, 'e' || g, CASE WHEN g > 2000 THEN 'did:plc:failing' ELSE 'did:plc:busy' END,
            'w' || (g % 2), 'direct', 'did:plc:s', 'app.bsky.feed.post', 'p' || g, 'create', 'https://r.invalid/h',
            'none', 'fp', CASE WHEN g % 100 = 0 OR g > 2000 THEN 'dead_letter' ELSE 'delivered' END,
            now() - g * interval '1 second', now() - g * interval '1 second'
          FROM generate_series(1, 4000) g`
        yield* sql`ANALYZE outbox`
        // the replay's page (Operator.ts), the owner's only
        const plan = yield* sql<{ "QUERY PLAN": unknown }>`EXPLAIN (FORMAT JSON)
          SELECT delivery_id, created_at, last_error_kind FROM outbox
          WHERE status = 'dead_letter' AND updated_at <= now() AND owner_did = ${"did:plc:busy"}
          ORDER BY created_at, delivery_id
          LIMIT ${1000}
          FOR UPDATE`
        expect(JSON.stringify(plan)).toContain("outbox_owner_dead_letters")
        yield* sql`DELETE FROM outbox`
      }))
  })
})
