/**
 * The database: an `@effect/sql-pg` client on `DATABASE_URL`, or on the embedded PostgreSQL when
 * it is unset; migrations run before the layer is built.
 *
 * The pool is closed at shutdown only when every part stopped cleanly (SPEC §6.3): after an
 * unclean shutdown in-flight work may still hold connections, and the process exits anyway.
 */
import * as Reactivity from "@effect/experimental/Reactivity"
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Context, Data, Duration, Effect, Exit, Layer, Option, Redacted, Scope } from "effect"
import { FirehookConfig } from "./Config.js"
import * as EmbeddedPg from "./EmbeddedPg.js"
import * as ErrorCode from "./ErrorCode.js"
import { Lifecycle } from "./Lifecycle.js"
import * as Migrations from "./Migrations.js"

export class DatabaseUnavailable extends Data.TaggedError("DatabaseUnavailable")<{ readonly reason: string }> {
  override get message(): string {
    return `database: ${this.reason}`
  }
}

/**
 * The URL the process's database client connects to: `DATABASE_URL`, or the embedded PostgreSQL's
 * (a supervised delivery child is given it, so that it uses the same database; issue 16 item 2).
 */
export class DatabaseUrl extends Context.Tag("firehook/DatabaseUrl")<DatabaseUrl, Redacted.Redacted<string>>() {}

/** A short, value-free description of a driver error (never the URL, credentials or SQL values). */
export const describeSqlError = (e: unknown): string => ErrorCode.codeOr(e, "unknown error")

export interface DatabaseOptions {
  readonly maxConnections?: number
  readonly applicationName?: string
}

const clientLayer = (url: Redacted.Redacted<string>, options: DatabaseOptions) =>
  Layer.scopedContext(
    Effect.gen(function*() {
      const lifecycle = yield* Effect.serviceOption(Lifecycle)
      const poolScope = yield* Scope.make()
      const client = yield* PgClient.make({
        url,
        maxConnections: options.maxConnections ?? 20,
        connectTimeout: Duration.seconds(10),
        idleTimeout: Duration.seconds(60),
        applicationName: options.applicationName ?? "firehook"
      }).pipe(
        Scope.extend(poolScope),
        Effect.provide(Reactivity.layer),
        Effect.mapError((e) => new DatabaseUnavailable({ reason: `could not connect (${describeSqlError(e)})` }))
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
      return Context.make(PgClient.PgClient, client).pipe(Context.add(SqlClient.SqlClient, client))
    })
  )

/** Run the bundled migrations (serialized across processes). */
export const migrate = Migrations.run.pipe(
  Effect.mapError((e) => new DatabaseUnavailable({ reason: `migrations failed (${describeSqlError(e)})` }))
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
      if (Option.isSome(config.databaseUrl)) return layerUrl(config.databaseUrl.value, options)
      const embedded = yield* EmbeddedPg.start({ dataDir: config.dataDir }).pipe(
        Effect.mapError((e) => new DatabaseUnavailable({ reason: e.message }))
      )
      return layerUrl(embedded.url, options)
    })
  )
