/**
 * A fresh database per test file on the run's PostgreSQL server (globalSetup.ts), cloned from a
 * template with firehook's migrations applied, and dropped when the file's scope closes. Its name
 * starts with the run's tag, so that globalSetup can drop what a killed test file left behind.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Effect, Layer, Redacted, TestServices } from "effect"
import type pg from "pg"
import { inject } from "vitest"
import * as Database from "../../src/services/platform/Database.js"
import { databaseUrl, runDatabaseName, withClient } from "./pgAdmin.js"

const adminUrl = (): string => inject("pgAdminUrl")

const withAdmin = <A>(f: (c: pg.Client) => Promise<A>) => Effect.promise(() => withClient(adminUrl(), f))

export const urlFor = (database: string): string => databaseUrl(adminUrl(), database)

/**
 * Create an empty database (`createOptions`: more of `CREATE DATABASE`, e.g. another default
 * collation), named for this run; dropped (with FORCE) when the scope closes.
 */
export const freshDatabaseWith = (createOptions: string) =>
  Effect.acquireRelease(
    Effect.gen(function*() {
      const name = runDatabaseName(inject("pgRunTag"))
      yield* withAdmin((c) => c.query(`CREATE DATABASE ${name} ${createOptions}`))
      return { name, url: Redacted.make(urlFor(name)) }
    }),
    ({ name }) => withAdmin((c) => c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`))
  )

/** Create an empty database; dropped (with FORCE) when the scope closes. */
export const freshDatabase = freshDatabaseWith("")

/**
 * A fresh database cloned from the run's migrated template (globalSetup.ts): the migrations that
 * `Database.layerUrl` runs on it find nothing left to do.
 */
const migratedDatabase = Effect.suspend(() => freshDatabaseWith(`TEMPLATE ${inject("pgTemplate")}`))

/** A migrated fresh database as a layer (PgClient + SqlClient). */
export const layer = (options: Database.DatabaseOptions = {}) =>
  Layer.unwrapScoped(Effect.map(migratedDatabase, ({ url }) => Database.layerUrl(url, options)))

/** {@link layer} on a database created with `createOptions` ({@link freshDatabaseWith}). */
export const layerWith = (createOptions: string, options: Database.DatabaseOptions = {}) =>
  Layer.unwrapScoped(Effect.map(freshDatabaseWith(createOptions), ({ url }) => Database.layerUrl(url, options)))

/**
 * Until a session of this database has the `LISTEN` on `channel` as its last statement, finished:
 * from then on a `NOTIFY` on it reaches its listener (PgListen subscribes before it sends the
 * `LISTEN`). Polled every 20 ms of live time (also under the TestClock); dies after `polls` polls
 * (30 s by default).
 */
export const listening = (channel: string, polls = 1_500) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND state = 'idle' AND query = ${`LISTEN "${channel}"`}`.pipe(
      Effect.map((rows) => (rows[0]?.n ?? 0) > 0),
      // no `schedule` option: with one, `repeat` returns the schedule's count (0 when the first poll
      // already saw the LISTEN, which then died here), not the last poll's answer
      Effect.tap((yes) => (yes ? Effect.void : Effect.sleep("20 millis"))),
      Effect.repeat({ until: (yes) => yes, times: polls - 1 }),
      TestServices.provideLive,
      Effect.orDie,
      Effect.flatMap((
        yes
      ) => (yes ? Effect.void : Effect.dieMessage(`no LISTEN on ${channel} after ${polls} polls 20 ms apart`)))
    ))
