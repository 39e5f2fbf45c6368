/**
 * firehook's database connection over TLS, in a process of its own: `bun
 * test/support/database-tls-smoke.ts <cases>` (the production runtime) or `node --import tsx …`,
 * so that test/platform/database-tls.test.ts can set NODE_TLS_REJECT_UNAUTHORIZED and
 * NODE_EXTRA_CA_CERTS (read at start) for it. `<cases>` is a JSON array of `{ name, url, pgsslmode?,
 * listen? }`; each case builds `Database.layerUrl(url)` (the pool's first connection), or with
 * `listen` opens a `PgListen` on `DatabaseSsl.driverConfig(url)` (the LISTEN connection the layer
 * makes) and listens once, with `PGSSLMODE` set to `pgsslmode` meanwhile when given. The servers
 * are the test's (test/support/fakePgTls.ts).
 *
 * Prints one JSON object: the runtime, and for each case what it came to (`connected`, or the
 * typed failure's message). The test asserts on it and on what its servers saw; this script checks
 * nothing itself.
 */
import { Cause, Effect, Either, Exit, Layer, Option, Redacted, Stream } from "effect"
import * as Database from "../../src/services/platform/Database.js"
import * as DatabaseSsl from "../../src/services/platform/DatabaseSsl.js"
import * as ErrorCode from "../../src/services/platform/ErrorCode.js"
import * as PgListen from "../../src/services/platform/PgListen.js"

interface Case {
  readonly name: string
  readonly url: string
  readonly pgsslmode?: string
  readonly listen?: boolean
}

const cases = JSON.parse(process.argv[2] ?? "[]") as ReadonlyArray<Case>

const viaLayer = (url: string) =>
  Effect.scoped(Layer.build(Database.layerUrl(Redacted.make(url)))).pipe(
    Effect.exit,
    Effect.map((exit) => {
      if (Exit.isSuccess(exit)) return "connected"
      const failure = Cause.failureOption(exit.cause)
      return Option.isSome(failure) ? failure.value.message : "defect"
    })
  )

/** LISTEN on a connection of `DatabaseSsl.driverConfig(url)`: `listening`, or the driver's code. */
const viaListen = (url: string) =>
  Effect.scoped(Effect.gen(function*() {
    const config = Either.getOrThrow(DatabaseSsl.driverConfig(url))
    const listen = yield* PgListen.make(config, { queryTimeout: "10 seconds" })
    return yield* listen("smoke").pipe(
      Stream.runHead,
      Effect.timeout("1 second"),
      Effect.as("listening"),
      Effect.catchAll((e) => Effect.succeed(`failed (${ErrorCode.codeOr(e)})`))
    )
  }))

const program = Effect.gen(function*() {
  const outcomes: Record<string, string> = {}
  for (const c of cases) {
    if (c.pgsslmode === undefined) delete process.env["PGSSLMODE"]
    else process.env["PGSSLMODE"] = c.pgsslmode
    outcomes[c.name] = yield* (c.listen === true ? viaListen(c.url) : viaLayer(c.url))
  }
  delete process.env["PGSSLMODE"]
  return { runtime: "Bun" in globalThis ? "bun" : "node", outcomes }
})

Effect.runPromise(program).then(
  (out) => {
    process.stdout.write(`${JSON.stringify(out)}\n`)
    process.exit(0)
  },
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`)
    process.exit(1)
  }
)
