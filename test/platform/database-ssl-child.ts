/**
 * Run by test/platform/database-ssl.test.ts under Bun (the production runtime), in a process of its
 * own (pg warns once per process): `bun test/platform/database-ssl-child.ts <mode> <url>`.
 * - `database`: builds `Database.layerUrl(url)` (the pool and the LISTEN connection) and prints
 *   `failed <message>` or `connected`;
 * - `raw`: constructs a `pg` client on `url` directly, as before DatabaseSsl (the control: pg's own
 *   warning reaches stderr), and prints `constructed`.
 */
import { Cause, Effect, Exit, Layer, Option, Redacted } from "effect"
import Pg from "pg"
import * as Database from "../../src/services/platform/Database.js"

const [mode, url] = process.argv.slice(2)
if (url === undefined) {
  process.stdout.write("usage: database-ssl-child.ts database|raw <url>\n")
  process.exit(2)
}
if (mode === "raw") {
  void new Pg.Client({ connectionString: url })
  process.stdout.write("constructed\n")
} else {
  const exit = await Effect.runPromiseExit(Effect.scoped(Layer.build(Database.layerUrl(Redacted.make(url)))))
  const failure = Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none()
  process.stdout.write(
    Exit.isSuccess(exit)
      ? "connected\n"
      : Option.isSome(failure)
      ? `failed ${failure.value.message}\n`
      : "defect\n"
  )
}
