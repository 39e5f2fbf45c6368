/**
 * Run by test/platform/unclean-exit.test.ts under Bun, in a process of its own, as an embedding
 * program would: `bun test/platform/unclean-exit-child.ts <url>`. Builds `Database.layerUrl(url)`
 * under a Lifecycle, uses the pool, has a part that never stops (so the shutdown is not clean and
 * the pool is left open, SPEC §6.3), closes the scope and returns without `process.exit`. Prints
 * `shutdown clean=<bool>` and `scope closed`.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Context, Effect, Layer, Logger, Redacted } from "effect"
import * as Database from "../../src/services/platform/Database.js"
import { Lifecycle, make } from "../../src/services/platform/Lifecycle.js"

const [url] = process.argv.slice(2)
if (url === undefined) {
  process.stdout.write("usage: unclean-exit-child.ts <url>\n")
  process.exit(2)
}

await Effect.runPromise(
  Effect.gen(function*() {
    const lifecycle = yield* make({ shutdownTimeout: "300 millis" })
    yield* Effect.scoped(Effect.gen(function*() {
      const ctx = yield* Layer.build(
        Database.layerUrl(Redacted.make(url)).pipe(Layer.provide(Layer.succeed(Lifecycle, lifecycle)))
      )
      const sql = Context.get(ctx, SqlClient.SqlClient)
      // several pool connections, idle afterwards
      yield* Effect.all([sql`SELECT pg_sleep(0.05)`, sql`SELECT pg_sleep(0.05)`, sql`SELECT 1`], {
        concurrency: "unbounded"
      })
      yield* lifecycle.registerStop("delivery", "hung", Effect.never)
      const report = yield* lifecycle.shutdown
      process.stdout.write(`shutdown clean=${report.clean}\n`)
    }))
    process.stdout.write("scope closed\n")
  }).pipe(Effect.provide(Logger.remove(Logger.defaultLogger)))
)
