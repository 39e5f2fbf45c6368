/**
 * The Bun entry point: read the configuration, compose the production graph, run it until
 * SIGINT/SIGTERM. Exit code 0 after a clean shutdown, 1 after an unclean one or a startup failure
 * (reported as one line on stderr, never with a secret in it).
 */
import { BunHttpServer, BunRuntime } from "@effect/platform-bun"
import { Cause, Console, Effect, Exit, Layer, Option } from "effect"
import * as App from "./layers/App.js"
import * as Config from "./services/platform/Config.js"
import * as Logging from "./services/platform/Logging.js"

let uncleanShutdown = false

/**
 * One line describing a startup failure: a typed failure's own message (firehook's errors say what
 * is wrong without values), never a stack or a value dump. A defect (a bug, or a library's error)
 * is named by its error class only: its message is uncontrolled text that could carry a URL or a
 * value.
 */
const oneLine = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) {
    const defect: unknown = Cause.squash(cause)
    const name = defect instanceof Error && /^[A-Za-z][A-Za-z0-9_]{0,63}$/.test(defect.name) ? defect.name : "unknown"
    return `firehook: startup failed (unexpected ${name})`
  }
  const err: unknown = failure.value
  const text = typeof err === "object" && err !== null && "message" in err && typeof err.message === "string" &&
      err.message.length > 0
    ? err.message
    : "startup failed"
  return `firehook: ${text.replace(/\s+/g, " ").slice(0, 500)}`
}

const main = Effect.gen(function*() {
  const config = yield* Config.load({ isTty: process.stdout.isTTY === true })
  const server = BunHttpServer.layer({ hostname: config.healthHost, port: config.healthPort })
  const app = App.service(server, {
    onShutdown: (report) =>
      Effect.sync(() => {
        uncleanShutdown = !report.clean
      })
  }).pipe(
    Layer.provide(App.core(config)),
    Layer.provide(Logging.layer({ format: config.logFormat, level: config.logLevel }))
  )
  return yield* Layer.launch(app)
}).pipe(
  Effect.catchAllCause((cause) =>
    Cause.isInterruptedOnly(cause)
      ? Effect.failCause(cause)
      : Console.error(oneLine(cause)).pipe(Effect.zipRight(Effect.failCause(cause)))
  )
)

// SPEC §6.3: shutdown is idempotent. The runtime's own handler removes itself at the first
// SIGINT/SIGTERM (and interrupts the main fiber, which runs the ordered shutdown); with no listener
// left, the runtime would restore the default action and a second signal would kill the process in
// the middle of that shutdown. These listeners stay, so a repeated signal changes nothing.
const alreadyStopping = (): void => {}
process.on("SIGINT", alreadyStopping)
process.on("SIGTERM", alreadyStopping)

BunRuntime.runMain(main, {
  disableErrorReporting: true,
  disablePrettyLogger: true,
  teardown: (exit, onExit) => {
    const failed = Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)
    onExit(failed || uncleanShutdown ? 1 : 0)
  }
})
