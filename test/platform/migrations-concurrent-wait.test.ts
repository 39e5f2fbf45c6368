/**
 * Two replicas start at once on a populated database of an older version (0015), and one's
 * migrations take longer than the other's lock timeout. The one that waits must wait for the
 * migration advisory lock, quietly: before, a runner that had passed its version check before the
 * other took the Migrator's `LOCK TABLE firehook_migrations` waited behind that table lock under
 * the lock timeout, gave way, and logged "migrations gave way to a table lock held by another
 * session (a long transaction?)" again and again, while the only other session was the other
 * replica's migration (docs/operations.md told the operator to end it).
 *
 * Deterministic: the replica that waits (B) is held, by its client, between its version check and
 * its migration transaction; the migrating replica (A) is made slow by a session that has read
 * `owners` (0016's `ALTER TABLE owners` waits for it, and A's lock timeout outlasts the test); B is
 * let go once A holds `LOCK TABLE firehook_migrations`, and that session ends only once B has waited
 * longer than its lock timeout (or B warned).
 */
import * as Reactivity from "@effect/experimental/Reactivity"
import * as PgClient from "@effect/sql-pg/PgClient"
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, HashMap, Logger, Option, Redacted, Schedule } from "effect"
import * as Migrations from "../../src/services/platform/Migrations.js"
import * as Db from "../support/db.js"

const client = (url: Redacted.Redacted<string>, applicationName: string) =>
  PgClient.make({ url, maxConnections: 4, applicationName }).pipe(Effect.provide(Reactivity.layer))

/** Poll `probe` every 20 ms until it holds, at most 30 s. */
const until = <E, R>(what: string, probe: Effect.Effect<boolean, E, R>) =>
  probe.pipe(
    Effect.filterOrFail((yes) => yes, () => `not yet: ${what}`),
    Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 1_500 })
  )

/**
 * `sql`, except that its second transaction (a run's first is the version check, its second the
 * Migrator's run) starts only once `gate` is done; `held` is done when it is reached.
 */
const gatedSecondTransaction = (
  sql: PgClient.PgClient,
  held: Deferred.Deferred<void>,
  gate: Deferred.Deferred<void>
): PgClient.PgClient => {
  let transactions = 0
  const withTransaction: PgClient.PgClient["withTransaction"] = (effect) =>
    Effect.suspend(() => {
      transactions += 1
      return transactions === 2
        ? Deferred.succeed(held, undefined).pipe(
          Effect.zipRight(Deferred.await(gate)),
          Effect.zipRight(sql.withTransaction(effect))
        )
        : sql.withTransaction(effect)
    })
  return new Proxy(sql, {
    get: (target, property, receiver) =>
      property === "withTransaction" ? withTransaction : Reflect.get(target, property, receiver)
  })
}

/**
 * A fresh database migrated to 0015 (the version before 0016's `ALTER TABLE owners`), and the test's
 * clients: `setup`, `holder` (the reader of `owners`), replicas A and B (B's URL through `bUrl`).
 */
const at0015 = (bUrl: (url: Redacted.Redacted<string>) => Redacted.Redacted<string> = (url) => url) =>
  Effect.gen(function*() {
    const { name, url } = yield* Db.freshDatabase
    const setup = yield* client(url, "test-setup")
    const holder = yield* client(url, "test-holder")
    const a = yield* client(url, "replica-a")
    const b = yield* client(bUrl(url), "replica-b")
    const before = Object.fromEntries(
      Object.entries(Migrations.migrations).filter(([id]) => Number(id.slice(0, 4)) <= 15)
    )
    yield* Migrator.make({})({ loader: Migrator.fromRecord(before), table: Migrations.MIGRATIONS_TABLE }).pipe(
      Effect.provideService(SqlClient.SqlClient, setup)
    )
    return { name, setup, holder, a, b }
  })

/**
 * A session (of `holder`) that has read `owners`, so that 0016's ALTER TABLE waits for it, once this
 * returns; `end` lets it commit and waits for that.
 */
const ownersReader = (holder: PgClient.PgClient) =>
  Effect.gen(function*() {
    const reading = yield* Deferred.make<void>()
    const release = yield* Deferred.make<void>()
    const hold = yield* holder.withTransaction(
      holder`SELECT count(*) FROM owners`.pipe(
        Effect.zipRight(Deferred.succeed(reading, undefined)),
        Effect.zipRight(Deferred.await(release))
      )
    ).pipe(Effect.fork)
    yield* Deferred.await(reading)
    return { end: Deferred.succeed(release, undefined).pipe(Effect.zipRight(Fiber.join(hold))) }
  })

describe("two replicas migrating a populated 0015 database at once", () => {
  it.scopedLive(
    "the one that waits for the other's migrations waits for the advisory lock, with no lock_timeout warning",
    () =>
      Effect.gen(function*() {
        const { a, b, holder, name, setup } = yield* at0015()
        yield* setup`INSERT INTO owners (did, reconcile_status, snapshot_rev, completed_at)
          SELECT 'did:plc:' || g, 'complete', '3kabcdefghij', now() FROM generate_series(1, 100) g`

        const warnings: Array<string> = []
        const waits: Array<{ readonly message: string; readonly code: unknown }> = []
        const capture = Logger.make(({ annotations, logLevel, message }) => {
          const text = Array.isArray(message) ? message.map(String).join(" ") : String(message)
          if (logLevel._tag === "Warning") warnings.push(text)
          if (logLevel._tag === "Info") {
            waits.push({ message: text, code: Option.getOrUndefined(HashMap.get(annotations, "code")) })
          }
        })
        const logged = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
          effect.pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))

        // a session that has read `owners`: 0016's ALTER TABLE waits for it
        const reader = yield* ownersReader(holder)

        // B: the defaults (a 2 s lock timeout); held after its version check
        const bHeld = yield* Deferred.make<void>()
        const bGo = yield* Deferred.make<void>()
        const runB = yield* logged(
          Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, gatedSecondTransaction(b, bHeld, bGo)))
        ).pipe(Effect.fork)
        yield* Deferred.await(bHeld)

        // A: a lock timeout longer than the test, so that it waits for the reader without giving way
        const runA = yield* logged(
          Migrations.runWith({ lockTimeout: "60 seconds" }).pipe(Effect.provideService(SqlClient.SqlClient, a))
        ).pipe(Effect.fork)
        // A holds the bookkeeping table (it is migrating) and waits for `owners`
        yield* until(
          "replica A holds firehook_migrations and waits for owners",
          setup<{ held: number; waiting: number }>`
            SELECT
              count(*) FILTER (WHERE l.granted AND l.mode = 'AccessExclusiveLock'
                AND l.relation = 'firehook_migrations'::regclass)::int AS held,
              count(*) FILTER (WHERE NOT l.granted AND l.relation = 'owners'::regclass)::int AS waiting
            FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
            WHERE s.datname = ${name} AND s.application_name = 'replica-a'`.pipe(
            Effect.map((rows) => (rows[0]?.held ?? 0) > 0 && (rows[0]?.waiting ?? 0) > 0)
          )
        )

        // B goes on; the reader ends once B has waited for one lock longer than its lock timeout
        // (2 s, plus a margin), or B has given way
        yield* Deferred.succeed(bGo, undefined)
        const beyond = Duration.toMillis(Migrations.MIGRATION_LOCK_TIMEOUT) + 1_000
        yield* until(
          "replica B waited longer than its lock timeout, or warned",
          setup<{ n: number }>`
            SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = ${name} AND application_name = 'replica-b' AND wait_event_type = 'Lock'
              AND clock_timestamp() - query_start > make_interval(secs => ${beyond / 1_000}::double precision)`.pipe(
            Effect.map((rows) => (rows[0]?.n ?? 0) > 0 || warnings.length > 0)
          )
        )
        yield* reader.end
        const appliedA = yield* Fiber.join(runA)
        const appliedB = yield* Fiber.join(runB)

        expect(warnings).toEqual([])
        // logged once, at info
        expect(waits).toEqual([{ message: "waiting for another process's migrations", code: "migrations_wait" }])
        expect(appliedA.map(([id]) => id)).toEqual([16, 17, 18, 19])
        expect(appliedB).toEqual([])
        const ids = yield* setup<{ migration_id: number }>`SELECT migration_id FROM firehook_migrations ORDER BY 1`
        expect(ids.map((r) => r.migration_id)).toEqual(
          Object.keys(Migrations.migrations).map((id) => Number(id.slice(0, 4))).sort((x, y) => x - y)
        )
        const owners = yield* setup<{ n: number }>`
          SELECT count(*)::int AS n FROM owners WHERE completed_snapshot_rev = '3kabcdefghij'`
        expect(owners[0]?.n).toBe(100)
      }),
    { timeout: 60_000 }
  )
})

/** `url` with `-c lock_timeout=<ms>` in its `options`: a session lock timeout the operator set */
const withSessionLockTimeout = (url: Redacted.Redacted<string>, ms: number) => {
  const u = new URL(Redacted.value(url))
  u.searchParams.set("options", `-c lock_timeout=${ms}`)
  return Redacted.make(u.toString())
}

// the ordinary case (no gate): the second runner meets the advisory lock in its first transaction
// (the bookkeeping table and the version check); before stop 59 that wait logged nothing, while
// docs/operations.md told operators to expect `migrations_wait`; and a session lock timeout (the
// operator's, in the URL's options) ended that wait: the start failed with 55P03
const waitsForTheOther = (bUrl: (url: Redacted.Redacted<string>) => Redacted.Redacted<string>) =>
  Effect.gen(function*() {
    const { a, b, holder, name, setup } = yield* at0015(bUrl)
    const codes: Array<unknown> = []
    const warnings: Array<unknown> = []
    const capture = Logger.make(({ annotations, logLevel, message }) => {
      if (logLevel._tag === "Info") codes.push(Option.getOrUndefined(HashMap.get(annotations, "code")))
      if (logLevel._tag === "Warning") warnings.push(message)
    })
    const logged = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
      effect.pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))

    // a session that has read `owners`: A's 0016 waits for it
    const reader = yield* ownersReader(holder)

    const runA = yield* Migrations.runWith({ lockTimeout: "60 seconds" }).pipe(
      Effect.provideService(SqlClient.SqlClient, a),
      Effect.fork
    )
    yield* until(
      "replica A migrating (waiting for owners)",
      setup<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid
          WHERE s.datname = ${name} AND s.application_name = 'replica-a' AND NOT l.granted
            AND l.relation = 'owners'::regclass`.pipe(Effect.map((r) => (r[0]?.n ?? 0) > 0))
    )
    const runB = yield* logged(Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, b))).pipe(Effect.fork)
    yield* until(
      "replica B waiting for a lock for a second",
      setup<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = ${name} AND application_name = 'replica-b' AND wait_event_type = 'Lock'
            AND clock_timestamp() - query_start > interval '1 second'`.pipe(Effect.map((r) => (r[0]?.n ?? 0) > 0))
    )
    yield* reader.end
    yield* Fiber.join(runA)
    expect(yield* Fiber.join(runB)).toEqual([])
    expect(codes.filter((c) => c === "migrations_wait")).toEqual(["migrations_wait"])
    expect(warnings).toEqual([])
  })

describe("a replica started while another migrates", () => {
  it.scopedLive(
    "says it waits for the other's migrations (info migrations_wait, once), then applies nothing",
    () => waitsForTheOther((url) => url),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "with a session lock timeout of 300 ms it still waits for them (no lock_timeout failure or warning)",
    () => waitsForTheOther((url) => withSessionLockTimeout(url, 300)),
    { timeout: 60_000 }
  )
})
