/**
 * The operator command line (SPEC §4.8): `bun src/cli/main.ts …`, `npm run cli -- …`, `npx firehook …`.
 *
 *   firehook deliveries list [--owner DID] [--webhook RKEY] [--status S] [--error-kind K] [--since T] [--until T] [--limit N] [--json] [--show-urls]
 *   firehook deliveries show <id> [--json] [--show-urls]
 *   firehook deliveries redeliver <id> [--json]
 *   firehook deliveries replay --status dead_letter [--owner DID] [--webhook RKEY] [--error-kind K] [--since T] [--until T] [--json]
 *   firehook secrets create <did> <name> [--token T]
 *   firehook secrets rotate <did> <name> [--token T]
 *   firehook secrets delete <did> <name> [--json]
 *   firehook secrets list <did> [--json]
 *   firehook owners add <did> [--json]
 *   firehook owners reconcile <did> [--json]
 *   firehook owners status [--limit N] [--json]
 *   firehook status [--json]
 *   firehook webhooks resume <did> <rkey> [--replay] [--json]
 *
 * `--since` / `--until` filter on the delivery's enqueue time (`created_at`), as [since, until);
 * `--since` must be earlier than `--until`. `replay` replays the dead letters as of its start, each
 * at most once. `show` prints the newest 1,000 attempts and says how many older ones it left out.
 * `redeliver` refuses a row a worker holds a valid lease on; a row whose lease has expired (its
 * worker stopped) is redelivered. `replay` and `redeliver` say how many rows belong to a
 * subscription that is no longer active as enqueued (the worker cancels those without a request).
 * `status` prints the database counts and, when the service's health endpoint
 * (HEALTH_HOST:HEALTH_PORT) answers within 2 s, its phase, readiness, intake, delivery and redis.
 *
 * Webhook owners (talk only to a PDS; no database, no service configuration):
 *
 *   firehook hooks create (--scope AT-URI | --collection NSID) --url URL [--backlinks]
 *                         [--events create,update,delete] [--secret S | --secret-id NAME | --generate-secret]
 *                         [--disabled] [--rkey RKEY] [--json]
 *   firehook hooks list [--json] [--show-urls]
 *   firehook hooks enable <rkey> | disable <rkey> | delete <rkey> [--json]
 *   firehook hooks status [--json] [--show-urls]
 *   firehook hooks deliveries [rkey] [--status S] [--since T] [--until T] [--limit N] [--cursor C] [--json]
 *   firehook hooks show <id> | redeliver <id> | test <rkey> | resume <rkey> [--replay] [--json]
 *   firehook hooks replay [--rkey RKEY] [--since T] [--until T] [--json]
 *   firehook hooks tail [--json]            (one line per outcome until Ctrl-C / SIGTERM: exit 130)
 *   firehook hooks secrets create <name> | rotate <name> | list | delete <name> [--json]
 *   these call the owners' API of a firehook service: [--service URL] [--service-did DID], defaults
 *   FIREHOOK_SERVICE_URL, FIREHOOK_SERVICE_DID (else read from <service>/.well-known/did.json), with a
 *   service token from the owner's PDS per call (getServiceAuth, 60 s); never printed.
 *   every hooks command: [--pds URL] [--identifier ID] [--password P]; defaults from ATPROTO_PDS
 *   (else https://bsky.social), ATPROTO_IDENTIFIER, ATPROTO_APP_PASSWORD (preferred to --password).
 *   Records are checked with the service's validation (WEBHOOK_ALLOW_INSECURE_DEV and NODE_ENV as
 *   the service reads them) before anything is written. `create --generate-secret` prints the
 *   secret once. The password and secrets are never printed; URLs only with `list --show-urls`.
 *
 * Operator commands use the same configuration as the service (the environment, `Config.load`)
 * and the same database (`DATABASE_URL`, or the embedded PostgreSQL in `FIREHOOK_DATA_DIR`, adopted
 * when the service is running). Output is a human-readable table, or JSON with `--json`. Webhook
 * URLs are shown only with `--show-urls`. `secrets create`/`rotate` print the token, once, as the
 * only line on stdout. A `--token` on the command line is visible to other local users (ps);
 * prefer the generated token.
 *
 * Exit codes: 0 success; 2 invalid arguments (one line on stderr); 1 operational failure (one line
 * on stderr); 141 when stdout's reader went away (`firehook … | head`: EPIPE, quietly, as a command
 * killed by SIGPIPE). Logs: warnings and errors only, on stderr (`--log-level` raises the verbosity).
 */
import { CliConfig, Command, HelpDoc, ValidationError } from "@effect/cli"
import * as BunContext from "@effect/platform-bun/BunContext"
import * as BunRuntime from "@effect/platform-bun/BunRuntime"
import { Cause, Console, Deferred, Effect, Exit, Layer, Logger, LogLevel, Option } from "effect"
import { VERSION } from "../services/platform/Version.js"
import { deliveries } from "./DeliveriesCommand.js"
import { describeFailure, redactArgs, usage, UsageError } from "./Failure.js"
import { commandNames, commandPaths, fixHelp, optionValueLine, unknownCommand } from "./Help.js"
import { hooks } from "./HooksCommand.js"
import { flush, write } from "./Output.js"
import { owners } from "./OwnersCommand.js"
import { secrets } from "./SecretsCommand.js"
import { status } from "./StatusCommand.js"
import { webhooks } from "./WebhooksCommand.js"

// ---------------------------------------------------------------------------------------------
// the app

const firehook = Command.make(
  "firehook",
  {},
  () => usage("missing command: deliveries, webhooks, secrets, owners, status or hooks")
).pipe(
  Command.withDescription("operate a firehook deployment; manage your own webhook records (hooks)"),
  Command.withSubcommands([deliveries, webhooks, secrets, owners, status, hooks])
)

const cli = Command.run(firehook, { name: "firehook", version: VERSION })

const rootHelp = (): string => HelpDoc.toAnsiText(Command.getHelp(firehook, CliConfig.defaultConfig))

/** The command names of `firehook --help` (the words of a command line that name a command). */
const names = (): ReadonlySet<string> => commandNames(rootHelp())

/** Every command's path, from `firehook --help`. */
const paths = () => commandPaths(rootHelp())

/** A command name that names no command (reported by @effect/cli as a mismatch at the top level). */
const isCommandMismatch = (exit: Exit.Exit<unknown, unknown>): boolean =>
  Exit.isFailure(exit) &&
  Option.exists(
    Cause.failureOption(exit.cause),
    (e) => ValidationError.isValidationError(e) && ValidationError.isCommandMismatch(e)
  )

/**
 * @effect/cli prints parse errors as multi-line help on Console.error; we print one line instead.
 * What it prints on Console.log (help, version, completions) goes through {@link fixHelp}.
 */
const cliConsole = (argv: ReadonlyArray<string>) =>
  Effect.map(Console.consoleWith(Effect.succeed), (c): Console.Console => {
    const ctx = {
      args: argv.slice(2),
      program: "firehook",
      names,
      color: process.stdout.isTTY === true && (process.env["NO_COLOR"] ?? "") === ""
    }
    const fix = (args: ReadonlyArray<unknown>) => args.map((a) => (typeof a === "string" ? fixHelp(a, ctx) : a))
    return {
      ...c,
      log: (...args) => c.log(...fix(args)),
      error: () => Effect.void,
      unsafe: { ...c.unsafe, log: (...args) => c.unsafe.log(...fix(args)), error: () => {} }
    }
  })

/** Warnings and errors only, as logfmt on stderr. */
const stderrLogger = Logger.map(Logger.logfmtLogger, (line) => {
  process.stderr.write(`${line}\n`)
})

/**
 * `--wizard` (@effect/cli's built-in) prompts on the terminal; with stdin a pipe, a file or
 * /dev/null (a script, cron) it would wait for an answer forever.
 */
const wizardWithoutTerminal = (args: ReadonlyArray<string>): boolean =>
  args.includes("--wizard") && process.stdin.isTTY !== true

/** The exit code of a command whose stdout's reader went away, as a shell reports SIGPIPE. */
const SIGPIPE_EXIT = 141

/**
 * Completed with the error code of stdout's first failed write. The runtime reports such a failure
 * (EPIPE: the reader of a pipe went away) as an `error` event, which would otherwise end the
 * process with an uncaught error and its stack; one on stderr is ignored (nothing is left to tell).
 */
const stdoutClosed = Effect.flatMap(Deferred.make<string>(), (closed) =>
  Effect.sync(() => {
    process.stdout.on("error", (e: NodeJS.ErrnoException) => Deferred.unsafeDone(closed, Exit.succeed(e.code ?? "EIO")))
    process.stderr.on("error", () => {})
    return closed
  }))

const program = (argv: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const console = yield* cliConsole(argv)
    const args = argv.slice(2)
    const closed = yield* stdoutClosed
    const run = wizardWithoutTerminal(args)
      ? Effect.succeed(
        Exit.fail(new UsageError({ text: "--wizard asks its questions on a terminal: stdin is not one" }))
      )
      : cli(argv).pipe(Effect.withConsole(console), Effect.exit)
    // stdout's reader gone (`… | head`): the command is interrupted (its clean-up runs: the PDS
    // session is deleted) and the process ends as a command killed by SIGPIPE does, quietly, 141
    const ran = yield* Effect.raceFirst(Effect.map(run, Option.some), Effect.as(Deferred.await(closed), Option.none()))
    const writeFailure = yield* Deferred.poll(closed)
    if (Option.isSome(writeFailure) || Option.isNone(ran)) {
      const code = yield* Deferred.await(closed)
      if (code === "EPIPE") return SIGPIPE_EXIT
      yield* write(process.stderr, `firehook: cannot write to stdout (${code})\n`)
      yield* flush(process.stderr)
      return 1
    }
    const exit = ran.value
    const described = Exit.isSuccess(exit) ? { code: 0, line: "" } : describeFailure(exit.cause)
    const result = isCommandMismatch(exit)
      ? { ...described, line: unknownCommand(args, paths()) ?? described.line }
      : described.code === 2
      ? { ...described, line: optionValueLine(described.line, args, rootHelp()) ?? described.line }
      : described
    if (result.code !== 0) yield* write(process.stderr, `firehook: ${redactArgs(result.line, argv)}\n`)
    // a stdout whose reader goes away now may never call back
    yield* Effect.raceFirst(flush(process.stdout), Deferred.await(closed))
    yield* flush(process.stderr)
    return result.code
  }).pipe(
    Effect.provide(
      Layer.mergeAll(
        BunContext.layer,
        Logger.replace(Logger.defaultLogger, stderrLogger),
        Logger.minimumLogLevel(LogLevel.Warning)
      )
    )
  )

BunRuntime.runMain(program(process.argv), {
  disableErrorReporting: true,
  disablePrettyLogger: true,
  // Ctrl-C / SIGTERM interrupt the program (how `hooks tail` ends): 130, as a shell reports SIGINT
  teardown: (exit, onExit) =>
    onExit(
      Exit.isSuccess(exit) && typeof exit.value === "number"
        ? exit.value
        : Exit.isFailure(exit) && Cause.isInterruptedOnly(exit.cause)
        ? 130
        : 1
    )
})
