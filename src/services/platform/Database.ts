/**
 * The database: an `@effect/sql-pg` client on `DATABASE_URL`, or on the embedded PostgreSQL when
 * it is unset; migrations run before the layer is built. Its `listen` is firehook's own
 * (PgListen.ts): `@effect/sql-pg`'s never sees its connection drop. Both connect with
 * `DatabaseSsl.driverConfig` (what `sslmode` means for firehook, without pg's warning, the
 * certificate check not left to `NODE_TLS_REJECT_UNAUTHORIZED`), checked once at startup and parsed
 * again for each new connection (`DatabaseSsl.connectingClient`), so that rotated certificate files
 * named in the URL are read by the next connection. Each connection writes dates in ISO form
 * whatever the server's `DateStyle` (`connectingClient` sets it while connecting when the server
 * reports another): `pg` parses timestamps only in that form.
 *
 * The pool is closed at shutdown only when every part stopped cleanly (SPEC §6.3): after an
 * unclean shutdown in-flight work may still hold connections, and the process exits anyway.
 */
import * as Reactivity from "@effect/experimental/Reactivity"
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { SqlError } from "@effect/sql/SqlError"
import { Context, Data, Duration, Effect, Either, Exit, Layer, Option, Redacted, Scope } from "effect"
import Pg from "pg"
import { FirehookConfig } from "./Config.js"
import * as DatabaseSsl from "./DatabaseSsl.js"
import * as EmbeddedPg from "./EmbeddedPg.js"
import * as ErrorCode from "./ErrorCode.js"
import { Lifecycle } from "./Lifecycle.js"
import * as Migrations from "./Migrations.js"
import * as PgListen from "./PgListen.js"
import * as PreparedStatements from "./PreparedStatements.js"

export class DatabaseUnavailable extends Data.TaggedError("DatabaseUnavailable")<{ readonly reason: string }> {
  override get message(): string {
    return `database: ${this.reason}`
  }
}

/** The reason of a {@link DatabaseUnavailable} when no connection could be made (then ` (<code>)`). */
const COULD_NOT_CONNECT = "could not connect"

/**
 * What the codes of a failed connection mean, said for the operator who typed the URL: PostgreSQL's
 * SQLSTATE of the refusal, or the socket's errno. The service's startup line and the CLI's both say
 * it (`could not connect (3D000: no database of that name on the server)`); other codes are printed
 * as they are.
 */
const CONNECT_CODES: ReadonlyMap<string, string> = new Map([
  ["3D000", "no database of that name on the server"],
  ["28P01", "password authentication failed"],
  ["28000", "the server refused this role or client (pg_hba.conf)"],
  ["57P03", "the server is starting up or shutting down"],
  ["55000", "the database does not accept connections (ALLOW_CONNECTIONS false)"],
  ["53300", "the server has no connection slot left"],
  ["ECONNREFUSED", "nothing listens at that host and port"],
  ["ENOTFOUND", "the host name does not resolve"],
  ["EAI_AGAIN", "the host name does not resolve"],
  ["EHOSTUNREACH", "the host is unreachable"],
  ["ETIMEDOUT", "the host did not answer"]
])

/** The error of a connection that could not be made: `could not connect (<code>[: <meaning>])`. */
export const couldNotConnect = (e: unknown): DatabaseUnavailable => {
  const described = describeSqlError(e)
  const meaning = CONNECT_CODES.get(described)
  return new DatabaseUnavailable({
    reason: `${COULD_NOT_CONNECT} (${meaning === undefined ? described : `${described}: ${meaning}`})`
  })
}

/**
 * Whether a startup failure line (`firehook: ` removed) says the database could not be reached:
 * the delivery child's supervisor restarts such a child without spending its restart budget
 * (DeliveryProcess.ts), since the parent reached the same database at its own start.
 */
export const isUnreachableLine = (line: string): boolean =>
  line.startsWith(`${new DatabaseUnavailable({ reason: COULD_NOT_CONNECT }).message} (`)

/**
 * The URL the process's database client connects to: `DATABASE_URL`, or the embedded PostgreSQL's
 * (a supervised delivery child is given it, so that it uses the same database; issue 16 item 2).
 */
export class DatabaseUrl extends Context.Tag("firehook/DatabaseUrl")<DatabaseUrl, Redacted.Redacted<string>>() {}

/**
 * The errors `pg` raises without a code, each with a fixed text of its own (no URL, credential or
 * value in it), said in firehook's words. Only an exact match is used; any other message is never read.
 */
const PG_FIXED_MESSAGES: ReadonlyMap<string, string> = new Map([
  ["The server does not support SSL connections", "the server does not support SSL; see sslmode in DATABASE_URL"],
  ["Connection terminated unexpectedly", "connection terminated"],
  // pg-pool's, when `connectionTimeoutMillis` passed
  ["Connection terminated due to connection timeout", "timeout"]
])

const fixedMessage = (e: unknown): string | undefined => {
  const cause: unknown = typeof e === "object" && e !== null && "cause" in e ? e.cause : e
  return cause instanceof Error ? PG_FIXED_MESSAGES.get(cause.message) : undefined
}

/** A short, value-free description of a driver error (never the URL, credentials or SQL values). */
export const describeSqlError = (e: unknown): string => fixedMessage(e) ?? ErrorCode.driverCode(e) ?? "unknown error"

export interface DatabaseOptions {
  readonly maxConnections?: number
  readonly applicationName?: string
  /** Named prepared statements (`DATABASE_PREPARED_STATEMENTS`, default on; PreparedStatements.ts). */
  readonly preparedStatements?: boolean
  /**
   * With the embedded PostgreSQL (`DATABASE_URL` unset): called once with a one-line cause when the
   * server this process started exits under it (the service stops, exit 1: `src/main.ts`).
   */
  readonly onEmbeddedExit?: (line: string) => Effect.Effect<unknown>
}

const CONNECT_TIMEOUT = Duration.seconds(10)
const IDLE_TIMEOUT = Duration.seconds(60)
const poolSize = (options: DatabaseOptions): number => options.maxConnections ?? 20
/** How long ending the pool at shutdown may take (the layer's finalizer bounds it too). */
const END_TIMEOUT = Duration.seconds(1)

/**
 * A connection that did not complete within {@link CONNECT_TIMEOUT} (a server that accepts the TCP
 * connection and never answers), with the code `timeout`, so that the startup line says
 * `could not connect (timeout)` (pg-pool's own timeout error is named by {@link describeSqlError}).
 */
const connectTimedOut = (): Error => Object.assign(new Error("Connection timed out"), { code: "timeout" })

/**
 * The `pg` pool (what `PgClient.make` builds, with the same settings), its connections made by
 * {@link PreparedStatements.preparingClient} unless `preparedStatements` is false, each with the URL
 * parsed when it is made (`DatabaseSsl.connectingClient`, which also gives it an ISO `DateStyle`
 * before its first statement), and checked with one `SELECT 1` within the connect timeout; ended
 * when the scope closes.
 */
const openPool = (
  url: Redacted.Redacted<string>,
  pgSslMode: string | undefined,
  options: DatabaseOptions
) =>
  Effect.acquireRelease(
    Effect.suspend(() => {
      const pool = new Pg.Pool({
        connectionTimeoutMillis: Duration.toMillis(CONNECT_TIMEOUT),
        idleTimeoutMillis: Duration.toMillis(IDLE_TIMEOUT),
        max: poolSize(options),
        // idle connections do not keep the process alive: after an unclean shutdown the pool is
        // left open (SPEC §6.3), and an embedding program may then end on its own
        allowExitOnIdle: true,
        Client: DatabaseSsl.connectingClient(url, {
          // the URL's own settings (`application_name` among them) win, as they did when pg parsed it
          defaults: { application_name: options.applicationName ?? "firehook" },
          base: options.preparedStatements === false
            ? Pg.Client
            : PreparedStatements.preparingClient(new PreparedStatements.StatementNames())
        }, pgSslMode)
      })
      pool.on("error", () => {})
      return Effect.tryPromise({
        try: () => pool.query("SELECT 1"),
        catch: (cause) => new SqlError({ cause, message: "PgClient: Failed to connect" })
      }).pipe(
        Effect.timeoutFail({
          duration: CONNECT_TIMEOUT,
          onTimeout: () => new SqlError({ cause: connectTimedOut(), message: "PgClient: Connection timed out" })
        }),
        Effect.tapError(() => Effect.promise(() => pool.end()).pipe(Effect.timeoutOption(END_TIMEOUT))),
        Effect.as(pool)
      )
    }),
    (pool) => Effect.promise(() => pool.end()).pipe(Effect.interruptible, Effect.timeoutOption(END_TIMEOUT))
  )

const clientLayer = (url: Redacted.Redacted<string>, options: DatabaseOptions) =>
  Layer.scopedContext(
    Effect.gen(function*() {
      const lifecycle = yield* Effect.serviceOption(Lifecycle)
      // read once, like the rest of the environment; the URL's TLS settings are checked here, so that
      // a bad one stops the start with one line (each connection parses the URL again: openPool)
      const pgSslMode = process.env["PGSSLMODE"]
      yield* DatabaseSsl.driverConfig(Redacted.value(url), pgSslMode).pipe(Either.mapLeft(couldNotConnect))
      const poolScope = yield* Scope.make()
      const client = yield* PgClient.fromPool({
        acquire: openPool(url, pgSslMode, options),
        applicationName: options.applicationName ?? "firehook"
      }).pipe(
        Scope.extend(poolScope),
        Effect.provide(Reactivity.layer),
        Effect.mapError(couldNotConnect)
      )
      yield* Effect.addFinalizer(() =>
        Option.match(lifecycle, { onNone: () => Effect.succeed(true), onSome: (l) => l.isClean }).pipe(
          Effect.flatMap((clean) =>
            clean
              ? Scope.close(poolScope, Exit.void).pipe(Effect.interruptible, Effect.timeoutOption(Duration.seconds(10)))
              : Effect.logWarning("shutdown was not clean: leaving the database pool open")
          )
        )
      )
      // LISTEN on a connection of firehook's own, which sees a lost connection (PgListen.ts)
      const listen = yield* PgListen.make({}, {
        Client: DatabaseSsl.connectingClient(url, {
          defaults: { application_name: options.applicationName ?? "firehook" }
        }, pgSslMode)
      })
      // `fromPool` describes the pool without its size and timeouts; readers of `config` (the claim
      // connection reserves one only from a pool of two or more) see what `PgClient.make` would give
      Object.assign(client, {
        listen,
        config: {
          ...client.config,
          maxConnections: poolSize(options),
          connectTimeout: CONNECT_TIMEOUT,
          idleTimeout: IDLE_TIMEOUT
        }
      })
      return Context.make(PgClient.PgClient, client).pipe(Context.add(SqlClient.SqlClient, client))
    })
  )

/**
 * Run `effect` with the context's `SqlClient` / `PgClient` without their name transforms: firehook's
 * statements name columns as PostgreSQL does (`owner_did`) and read rows by those names. A program
 * that provides its own client with `transformResultNames` (say `String.snakeToCamel`) otherwise
 * had firehook read `undefined` for every such column, silently (README "Embedding"). A client
 * without transforms (firehook's own) is used as it is.
 */
export const withoutTransforms = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.flatMap(
    Effect.all([Effect.serviceOption(SqlClient.SqlClient), Effect.serviceOption(PgClient.PgClient)]),
    ([sql, pg]) => {
      const plainPg = Option.map(pg, (c) => c.withoutTransforms())
      const plainSql = Option.map(sql, (c) =>
        Option.isSome(pg) && Option.isSome(plainPg) && pg.value === c ? plainPg.value : c.withoutTransforms())
      const withPg = Option.match(plainPg, {
        onNone: () =>
          effect,
        onSome: (c) => Effect.provideService(effect, PgClient.PgClient, c)
      })
      return Option.match(plainSql, {
        onNone: () => withPg,
        onSome: (c) => Effect.provideService(withPg, SqlClient.SqlClient, c)
      })
    }
  )

/** Run the bundled migrations (serialized across processes); a database of another version is refused. */
export const migrate = Migrations.run.pipe(
  withoutTransforms,
  Effect.mapError((e) =>
    new DatabaseUnavailable({
      reason: e instanceof Migrations.SchemaMismatch ? e.reason : `migrations failed (${describeSqlError(e)})`
    })
  )
)

/**
 * The database for a known URL, with migrations applied (and the URL, {@link DatabaseUrl}).
 */
export const layerUrl = (url: Redacted.Redacted<string>, options: DatabaseOptions = {}) =>
  Layer.effectDiscard(migrate).pipe(
    Layer.provideMerge(clientLayer(url, options)),
    Layer.merge(Layer.succeed(DatabaseUrl, url))
  )

/**
 * The production database: `DATABASE_URL`, or the embedded PostgreSQL in `FIREHOOK_DATA_DIR/pg`.
 */
export const layer = (options: DatabaseOptions = {}) =>
  Layer.unwrapScoped(
    Effect.gen(function*() {
      const config = yield* FirehookConfig
      const withConfig = { preparedStatements: config.databasePreparedStatements, ...options }
      if (Option.isSome(config.databaseUrl)) return layerUrl(config.databaseUrl.value, withConfig)
      const embedded = yield* EmbeddedPg.start({
        dataDir: config.dataDir,
        ...(options.onEmbeddedExit === undefined ? {} : { onUnexpectedExit: options.onEmbeddedExit })
      }).pipe(
        Effect.mapError((e) => new DatabaseUnavailable({ reason: e.message }))
      )
      return layerUrl(embedded.url, withConfig)
    })
  )
