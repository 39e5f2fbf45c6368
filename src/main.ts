/**
 * The Bun entry point: read the configuration, compose the production graph, run it until
 * SIGINT/SIGTERM. Exit code 0 after a clean shutdown, 1 after an unclean one or a startup failure
 * (reported as one line on stderr, never with a secret in it).
 */
// first (evaluated before every other module): a signal while the modules below load ends the
// process with exit 0, since nothing has started yet
import "./services/platform/LifecycleSignals.js"
import * as BunHttpServer from "@effect/platform-bun/BunHttpServer"
import * as BunRuntime from "@effect/platform-bun/BunRuntime"
import {
  Cause,
  Clock,
  Console,
  Deferred,
  Duration,
  Effect,
  ExecutionStrategy,
  Exit,
  Fiber,
  Layer,
  Option,
  Ref,
  Scope
} from "effect"
import * as Os from "node:os"
import { fileURLToPath } from "node:url"
import * as App from "./layers/App.js"
import * as Config from "./services/platform/Config.js"
import * as Database from "./services/platform/Database.js"
import * as DeliveryChild from "./services/platform/DeliveryChild.js"
import * as DeliveryProcess from "./services/platform/DeliveryProcess.js"
import * as DeliveryProcessConfig from "./services/platform/DeliveryProcessConfig.js"
import * as ErrorCode from "./services/platform/ErrorCode.js"
import * as Lifecycle from "./services/platform/Lifecycle.js"
import * as LifecycleSignals from "./services/platform/LifecycleSignals.js"
import * as Listener from "./services/platform/Listener.js"
import * as Logging from "./services/platform/Logging.js"

let uncleanShutdown = false
/** why the running service gave up (the delivery child kept exiting): one line on stderr, exit 1 */
let gaveUp: string | undefined

/**
 * One line describing a startup failure: a typed failure's own message (firehook's errors say what
 * is wrong without values), never a stack or a value dump. A defect (a bug, or a library's error)
 * is named by its error class and code only: its message is uncontrolled text that could carry a
 * URL or a value.
 */
const oneLine = (cause: Cause.Cause<unknown>): string => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) return `firehook: startup failed (unexpected ${describeDefect(Cause.squash(cause))})`
  const err: unknown = failure.value
  const text = typeof err === "object" && err !== null && "message" in err && typeof err.message === "string" &&
      err.message.length > 0
    ? err.message
    : "startup failed"
  return `firehook: ${text.replace(/\s+/g, " ").slice(0, 500)}`
}

/**
 * A defect named without its message: the error class, and a Node error's `code` and `syscall`
 * when they look like ones (`Error EACCES posix_spawn`).
 */
const describeDefect = (defect: unknown): string => {
  const name = ErrorCode.className(defect) ?? "error"
  const code = ErrorCode.ownCode(defect)
  const syscall: unknown = typeof defect === "object" && defect !== null ? Reflect.get(defect, "syscall") : undefined
  return [name, code, typeof syscall === "string" && /^[a-z_]{1,32}$/.test(syscall) ? syscall : undefined]
    .filter((x) => x !== undefined).join(" ")
}

// A library's error thrown outside any fiber (an `error` event nobody listens to, a promise nobody
// awaits) would end the process with a stack trace: one line and exit 1 instead (SPEC §6.1).
const crashed = (e: unknown): void => {
  process.stderr.write(`firehook: stopped by an unexpected ${describeDefect(e)}\n`)
  process.exit(1)
}
process.on("uncaughtException", crashed)
process.on("unhandledRejection", crashed)
// stderr is the one-line failure report's (SPEC §6.1): a library's deprecation notice must not reach
// it (the one that prompted this, from @effect/sql-pg's LISTEN, is gone: docs/decisions.md).
process.noDeprecation = true

/**
 * Start the service (SPEC §6.1) so that SIGINT/SIGTERM at any moment, during startup too, runs the
 * ordered, deadline-bound shutdown of §6.3 over the parts started so far:
 * - the lifecycle is made first, outside the parts;
 * - the parts are built into `parts`, a scope that closes only after the shutdown below;
 * - the startup runs in a fiber of its own scope, which the shutdown's first stage (`startup`)
 *   closes within the deadline (a startup step that cannot be interrupted in time makes the
 *   shutdown unclean: exit 1).
 * A startup failure (not a signal) skips the ordered shutdown: the phase is `failed`, the parts
 * close in reverse order, and main reports the failure.
 *
 * Delivery on its own core (DELIVERY_PROCESS, issue 16 item 2): when the delivery role runs in a
 * child, the parent supervises it (DeliveryProcess); if the child keeps exiting, the supervisor
 * gives up and the parent runs the same ordered shutdown, then reports one line and exits 1. A
 * child (FIREHOOK_DELIVERY_CHILD=1) shuts itself down when its parent is gone.
 */
const launch = (config: Config.FirehookConfigShape) =>
  Effect.scoped(Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.make({ shutdownTimeout: Duration.millis(config.shutdownTimeoutMs) })
    const parts = yield* Scope.make(ExecutionStrategy.sequential)
    /** when the shutdown (or, after a startup failure, the teardown) began */
    const stopping = yield* Ref.make(Option.none<number>())
    const stoppingAt = Clock.currentTimeMillis.pipe(
      Effect.flatMap((now) =>
        Ref.modify(stopping, (at) => Option.isSome(at) ? [at.value, at] : [now, Option.some(now)])
      )
    )
    // SPEC §6.3: the parts close within what is left of the deadline plus TEARDOWN_GRACE (after an
    // unclean shutdown UNCLEAN_TEARDOWN_GRACE), whatever the database does; past that the process
    // exits (code 1) and its exit ends the connections
    yield* Effect.addFinalizer((exit) =>
      Effect.gen(function*() {
        const deadline = (yield* stoppingAt) + config.shutdownTimeoutMs
        const left = Math.max(0, deadline - (yield* Clock.currentTimeMillis))
        const grace = uncleanShutdown ? Lifecycle.UNCLEAN_TEARDOWN_GRACE : Lifecycle.TEARDOWN_GRACE
        const bound = Duration.sum(Duration.millis(left), grace)
        if (yield* Lifecycle.closeWithin(parts, exit, bound)) return
        uncleanShutdown = true
        yield* Effect.logError("the parts did not close in time after the shutdown: exiting").pipe(
          Effect.annotateLogs({ boundMs: Duration.toMillis(bound) })
        )
      })
    )
    // added after the parts' close, so it runs before it
    yield* Effect.addFinalizer((exit) =>
      Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)
        ? Effect.void
        : stoppingAt.pipe(
          Effect.zipRight(lifecycle.shutdown),
          Effect.flatMap((report) =>
            Effect.sync(() => {
              uncleanShutdown = !report.clean
            })
          )
        )
    )
    const fatal = yield* Deferred.make<string>()
    if (config.deliveryProcess.isChild) {
      yield* Effect.forkScoped(DeliveryChild.followParent(lifecycle, config.shutdownTimeoutMs))
    }
    const startupScope = yield* Scope.make()
    yield* lifecycle.registerStop("startup", "startup", Scope.close(startupScope, Exit.void))
    const server = Listener.guard(BunHttpServer.layer({ hostname: config.healthHost, port: config.healthPort }), {
      hostVariable: "HEALTH_HOST",
      portVariable: "HEALTH_PORT",
      host: config.healthHost,
      port: config.healthPort
    })
    // the owners' API (SPEC §8.1); Bun's own body bound is a backstop above the API's 64 KiB
    const api = Listener.guard(
      BunHttpServer.layer({ hostname: config.api.host, port: config.api.port, maxRequestBodySize: 1 << 20 }),
      { hostVariable: "API_HOST", portVariable: "API_PORT", host: config.api.host, port: config.api.port }
    )
    const child = DeliveryProcessConfig.runsChild(config.deliveryProcess, config.roles, Os.availableParallelism())
    const deliveryProcess = child ? supervisor(config, (line) => Deferred.succeed(fatal, line)) : undefined
    const app = App.service(server, { api, ...(deliveryProcess === undefined ? {} : { deliveryProcess }) }).pipe(
      // the embedded PostgreSQL dying under the service ends it like a supervisor's give-up
      Layer.provide(App.core(config, lifecycle, { onEmbeddedExit: (line) => Deferred.succeed(fatal, line) }))
    )
    const startup = yield* Layer.buildWithScope(app, parts).pipe(Effect.forkIn(startupScope))
    yield* Fiber.join(startup)
    // runs until a signal interrupts it, the delivery child's supervisor gives up, or the embedded
    // PostgreSQL exits under it
    gaveUp = yield* Deferred.await(fatal)
  }))

/** The delivery child's supervisor: this runtime, this entry point, this environment, this database. */
const supervisor = (config: Config.FirehookConfigShape, onGiveUp: (line: string) => Effect.Effect<unknown>) =>
  Effect.gen(function*() {
    const databaseUrl = yield* Database.DatabaseUrl
    const spawner = DeliveryChild.spawner({
      command: process.execPath,
      args: [...process.execArgv, fileURLToPath(import.meta.url)],
      env: process.env,
      databaseUrl,
      stopGrace: Duration.millis(config.shutdownTimeoutMs)
    })
    yield* DeliveryProcess.supervise({ spawner, onGiveUp: (line) => Effect.asVoid(onGiveUp(line)) })
  })

const main = Effect.gen(function*() {
  const config = yield* Config.load({ isTty: process.stdout.isTTY === true })
  yield* launch(config).pipe(
    // a delivery child's log lines are told apart from its parent's (they share stdout)
    config.deliveryProcess.isChild ? Effect.annotateLogs("process", "delivery-child") : (x) => x,
    Effect.provide(Logging.layer({ format: config.logFormat, level: config.logLevel }))
  )
  if (gaveUp !== undefined) yield* Console.error(`firehook: ${gaveUp}`)
}).pipe(
  Effect.catchAllCause((cause) =>
    Cause.isInterruptedOnly(cause)
      ? Effect.failCause(cause)
      : Console.error(oneLine(cause)).pipe(Effect.zipRight(Effect.failCause(cause)))
  )
)

// until here a signal ended the process at once (nothing had started); from here the runtime's
// handler runs the ordered shutdown, and a repeated signal changes nothing (LifecycleSignals)
LifecycleSignals.handOver()

BunRuntime.runMain(main, {
  disableErrorReporting: true,
  disablePrettyLogger: true,
  teardown: (exit, onExit) => {
    const failed = Exit.isFailure(exit) && !Cause.isInterruptedOnly(exit.cause)
    onExit(failed || uncleanShutdown || gaveUp !== undefined ? 1 : 0)
  }
})
