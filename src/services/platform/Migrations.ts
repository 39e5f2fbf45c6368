/**
 * The database schema, bundled in code (never read from disk at run time) and applied with
 * `@effect/sql`'s Migrator. Every table and column is documented in docs/schema.md.
 *
 * Several processes may start at once: the whole run is serialized by a transaction-scoped
 * advisory lock, so the second runner waits and then finds nothing to do.
 */
import * as Migrator from "@effect/sql/Migrator"
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import { Cause, Chunk, Data, Duration, Effect, Schedule } from "effect"
import * as ErrorCode from "./ErrorCode.js"
import * as LockKeys from "./LockKeys.js"
import { migrations } from "./MigrationScripts.js"

export { migrations }

/** The advisory lock key that serializes migration runners (any 64-bit constant). */
export const MIGRATION_LOCK_KEY = LockKeys.MIGRATION

export const MIGRATIONS_TABLE = "firehook_migrations"

/**
 * The database's migrations are not a prefix of this version's: it was migrated by a newer
 * firehook (a migration this one does not know), or by another build whose migrations are
 * numbered otherwise. The Migrator alone compares only the latest id, so such a database was
 * used as it was: a newer schema by older code, or migrations of this version skipped for good
 * (a database of main at 5ee6ffe, `5_backfill_claims`, never got `0004_rejected_records` and
 * `0005_registry_changes`). Startup stops instead, with this one line.
 */
export class SchemaMismatch extends Data.TaggedError("SchemaMismatch")<{ readonly reason: string }> {
  override get message(): string {
    return this.reason
  }
}

/** A migration as `0010_name`, from the bookkeeping table's values (shown safely: digits, word characters). */
const label = (id: number, name: string): string =>
  `${String(id).padStart(4, "0")}_${name.replace(/[^A-Za-z0-9_]/g, "?").slice(0, 64)}`

/**
 * What is wrong with the migrations a database records (`applied`), for this version's
 * {@link migrations}: none (`undefined`) when they are a prefix of this version's list (by id and
 * name), else the first one that is not, in words.
 */
export const mismatch = (
  applied: ReadonlyArray<{ readonly id: number; readonly name: string }>
): string | undefined => {
  const known = new Map(
    Object.keys(migrations).flatMap((key) => {
      const m = /^(\d+)_(.+)$/.exec(key)
      return m === null ? [] : [[Number(m[1]), m[2] ?? ""] as const]
    })
  )
  const done = new Set(applied.map((a) => a.id))
  const latest = Math.max(0, ...done)
  for (const a of [...applied].sort((x, y) => x.id - y.id)) {
    const ours = known.get(a.id)
    if (ours === a.name) continue
    return `the schema was migrated by another firehook version: it has migration ${
      label(a.id, a.name)
    }, which this version does not know (${
      ours === undefined
        ? "a newer version's); run the version that migrated it, or a newer one"
        : `this version's ${label(a.id, ours)} has its number); this version cannot upgrade it`
    }`
  }
  for (const [id, name] of known) {
    if (id < latest && !done.has(id)) {
      return `the schema lacks migration ${
        label(id, name)
      } of this version, which cannot be applied after later ones; this version cannot upgrade it`
    }
  }
  return undefined
}

/** The longest startup waits for the migrations (its own or another replica's). */
export const MIGRATIONS_TIMEOUT = Duration.minutes(10)

/**
 * How long one migration run waits for a table lock before it gives way: its transaction is rolled
 * back and the run tried again ({@link RunOptions}). A migration's `ALTER TABLE` needs the table
 * alone; while it waits behind another session's lock (a long transaction, a `pg_dump`, an
 * operator's open `psql` transaction), every other statement on that table queues behind it, so the
 * running service (old processes during an upgrade) would stall for as long as the holder keeps it.
 */
export const MIGRATION_LOCK_TIMEOUT = Duration.seconds(2)

/** Between two runs that gave way to a lock: 0.5 s, doubling, at most 10 s (until {@link MIGRATIONS_TIMEOUT}). */
const LOCK_RETRY_FIRST = Duration.millis(500)
const LOCK_RETRY_CAP = Duration.seconds(10)

export interface RunOptions {
  /** how long a run waits for one lock ({@link MIGRATION_LOCK_TIMEOUT}) */
  readonly lockTimeout?: Duration.DurationInput
  /** the first pause after a run that gave way (0.5 s), doubling to at most 10 s */
  readonly lockRetryFirst?: Duration.DurationInput
}

/** A run gave way to a lock held by another session (SQLSTATE 55P03 `lock_not_available`). */
class LockWait extends Data.TaggedError("LockWait")<{}> {}

/** SQLSTATE 55P03 anywhere in the cause: the Migrator turns a migration's failure into a defect wrapping it. */
const lockTimedOut = (cause: Cause.Cause<unknown>): boolean =>
  Chunk.some(Chunk.appendAll(Cause.failures(cause), Cause.defects(cause)), (e) => {
    let current: unknown = e
    for (let depth = 0; depth < 4 && typeof current === "object" && current !== null; depth++) {
      if (ErrorCode.ownCode(current) === "55P03") return true
      current = Reflect.get(current, "cause")
    }
    return false
  })

/**
 * Run pending migrations; safe to run from several processes at once: the bookkeeping table is
 * created, and the Migrator run, each under the transaction-scoped advisory lock
 * {@link MIGRATION_LOCK_KEY} (so concurrent `CREATE TABLE`s cannot race, and a second runner waits
 * for the first's migrations, then finds nothing left to do). The recorded migrations are checked
 * before (so nothing is applied to a database of another version) and after (another runner may
 * have applied a newer version's in between): a mismatch fails with {@link SchemaMismatch}.
 * The wait for the advisory lock is bounded only by {@link MIGRATIONS_TIMEOUT} (logged at info as
 * it begins, once a run, `migrations_wait`); after it, the Migrator's transaction waits at most
 * {@link MIGRATION_LOCK_TIMEOUT} for any lock, and one that gives way (to a session that is not
 * migrating: a long transaction, a `pg_dump`) is rolled back whole and tried again, logged as a
 * warning each time.
 */
export const runWith = (options: RunOptions = {}) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const check = Effect.flatMap(
      sql<{ readonly migration_id: number; readonly name: string }>`SELECT migration_id, name FROM ${
        sql(MIGRATIONS_TABLE)
      }`.withoutTransform,
      (rows) => {
        const wrong = mismatch(rows.map((r) => ({ id: Number(r.migration_id), name: String(r.name) })))
        return wrong === undefined ? Effect.void : Effect.fail(new SchemaMismatch({ reason: wrong }))
      }
    )
    // The advisory lock, in both transactions below: tried first, and waited for after one info line
    // (once a run) when another process holds it, which is another process's migrations: the wait
    // is bounded only by MIGRATIONS_TIMEOUT, and an operator sees why the start waits.
    let told = false
    const serialized = Effect.flatMap(
      sql<{ readonly granted: boolean }>`SELECT pg_try_advisory_xact_lock(${MIGRATION_LOCK_KEY}) AS granted`,
      (rows) =>
        rows[0]?.granted === true
          ? Effect.void
          : Effect.zipRight(
            told ? Effect.void : Effect.logInfo("waiting for another process's migrations").pipe(
              Effect.annotateLogs({ code: "migrations_wait" }),
              Effect.zipRight(Effect.sync(() => void (told = true)))
            ),
            // no lock timeout for this wait, whatever the session's (an operator's `options=-c
            // lock_timeout=…` or `ALTER ROLE … SET`): it would end the wait as a table lock's
            // (a warning) or fail the start; MIGRATIONS_TIMEOUT bounds it. The Migrator's
            // transaction sets its own after it.
            Effect.zipRight(
              sql`SELECT set_config('lock_timeout', '0', true)`,
              sql`SELECT pg_advisory_xact_lock(${MIGRATION_LOCK_KEY})`
            )
          )
    )
    yield* sql.withTransaction(
      Effect.zipRight(
        serialized,
        sql.unsafe(`CREATE TABLE IF NOT EXISTS ${MIGRATIONS_TABLE} (
        migration_id integer PRIMARY KEY,
        created_at timestamptz NOT NULL DEFAULT now(),
        name text NOT NULL
      )`)
      ).pipe(Effect.zipRight(check))
    )
    const lockMs = Math.max(1, Math.round(Duration.toMillis(options.lockTimeout ?? MIGRATION_LOCK_TIMEOUT)))
    // The advisory lock first, before the lock timeout is set: a runner that finds another one
    // migrating waits here (until MIGRATIONS_TIMEOUT), and reaches the Migrator's `LOCK TABLE` only
    // once that one has committed. Without it, a runner past its check waited behind the other's
    // `LOCK TABLE`, gave way every lock timeout and warned of another session's long transaction,
    // which was the other replica's migration.
    // the Migrator's own transaction nests in this one (a savepoint), so the setting covers it
    const once = sql.withTransaction(
      serialized.pipe(
        Effect.zipRight(sql`SELECT set_config('lock_timeout', ${`${lockMs}ms`}, true)`),
        Effect.zipRight(Migrator.make({})({ loader: Migrator.fromRecord(migrations), table: MIGRATIONS_TABLE }))
      )
    ).pipe(
      Effect.catchAllCause((cause): Effect.Effect<never, LockWait | Migrator.MigrationError | SqlError> =>
        lockTimedOut(cause) ? Effect.fail(new LockWait()) : Effect.failCause(cause)
      ),
      Effect.tapError((e) =>
        e instanceof LockWait
          ? Effect.logWarning(
            "migrations gave way to a table lock held by another session (a long transaction?); retrying"
          ).pipe(Effect.annotateLogs({ code: "lock_timeout" }))
          : Effect.void
      )
    )
    const applied = yield* once.pipe(
      Effect.retry({
        while: (e) => e instanceof LockWait,
        schedule: Schedule.exponential(options.lockRetryFirst ?? LOCK_RETRY_FIRST, 2).pipe(
          Schedule.modifyDelay((d) => Duration.min(d, LOCK_RETRY_CAP))
        )
      }),
      // retries run until the outer timeout; this only names what was still in the way
      Effect.catchTag("LockWait", () => Effect.fail({ code: "lock_timeout" } as const))
    )
    yield* check
    return applied
  }).pipe(
    // bounded (SPEC §7): waiting for another replica's migrations, or a migration that hangs, fails
    // startup with "migrations failed (timeout)" instead of waiting for ever
    Effect.timeoutFail({ duration: MIGRATIONS_TIMEOUT, onTimeout: () => ({ code: "timeout" }) as const }),
    Effect.withSpan("Migrations.run")
  )

/** {@link runWith} with the defaults. */
export const run = runWith()
