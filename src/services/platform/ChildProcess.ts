/**
 * A child process owned by a Scope (`node:child_process`, which Bun implements), and the child's
 * side of supervision: noticing that its parent died.
 *
 * - {@link spawn} starts the process with its stdin a pipe the parent never writes to (the child
 *   sees it close when the parent dies, however it dies), stdout shared with the parent (the child's
 *   structured logs go where the parent's go) and stderr captured (its last line, bounded, for the
 *   parent's log and give-up message). When the scope closes with the process still running, it is
 *   sent SIGTERM, given `stopGrace` to exit, then SIGKILL.
 * - {@link watchParent} runs `onGone` once when stdin closes or the parent pid changes (the child
 *   was re-parented: polled every second), so an orphan never keeps working.
 */
import { Data, Deferred, Duration, Effect, Exit, Option, Ref, Schedule } from "effect"
import type { Scope } from "effect"
import { type ChildProcess as NodeChild, spawn as nodeSpawn } from "node:child_process"
import * as ErrorCode from "./ErrorCode.js"

export interface ChildExit {
  /** the exit code, `null` when a signal ended the process or it never started */
  readonly code: number | null
  readonly signal: string | null
}

export interface ChildHandle {
  readonly pid: number
  /** waits for the process to exit */
  readonly exit: Effect.Effect<ChildExit>
  readonly kill: (signal: "SIGTERM" | "SIGKILL") => Effect.Effect<void>
  /** the last non-empty line the process wrote on stderr (at most 500 characters) */
  readonly lastError: Effect.Effect<Option.Option<string>>
}

export class SpawnFailed extends Data.TaggedError("SpawnFailed")<{ readonly reason: string }> {
  override get message(): string {
    return `could not start a child process (${this.reason})`
  }
}

const STDERR_TAIL = 4096
const LINE_MAX = 500
/** after SIGKILL, how long to wait for the exit before giving up on it */
const KILL_WAIT = Duration.seconds(5)

const lastLine = (tail: string): Option.Option<string> => {
  const lines = tail.split("\n").map((l) => l.trim()).filter((l) => l.length > 0)
  const last = lines[lines.length - 1]
  return last === undefined ? Option.none() : Option.some(last.slice(0, LINE_MAX))
}

const signalSafely = (child: NodeChild, signal: "SIGTERM" | "SIGKILL"): void => {
  if (child.exitCode === null && child.signalCode === null) child.kill(signal)
}

/**
 * Start `command args` with exactly `env`. Fails when the process cannot be started at all (no
 * pid: a missing binary, a permission); an `error` after the start ends the process's `exit`.
 */
export const spawn = (options: {
  readonly command: string
  readonly args: ReadonlyArray<string>
  readonly env: Readonly<Record<string, string>>
  /** when the scope closes with the process running: SIGTERM, this long, then SIGKILL */
  readonly stopGrace: Duration.DurationInput
}): Effect.Effect<ChildHandle, SpawnFailed, Scope.Scope> =>
  Effect.gen(function*() {
    const exited = yield* Deferred.make<ChildExit>()
    const tail = yield* Ref.make("")
    const child = yield* Effect.try({
      try: () =>
        nodeSpawn(options.command, [...options.args], {
          env: { ...options.env },
          stdio: ["pipe", "inherit", "pipe"]
        }),
      catch: (e) => new SpawnFailed({ reason: ErrorCode.codeOr(e, "spawn failed") })
    })
    // both listeners before anything else: an `error` event nobody listens to would crash the parent
    child.on("error", () => Deferred.unsafeDone(exited, Exit.succeed({ code: null, signal: null })))
    child.on("exit", (code, signal) => Deferred.unsafeDone(exited, Exit.succeed({ code, signal })))
    child.stderr?.on("data", (d: Buffer) =>
      Effect.runSync(Ref.update(tail, (t) => (t + d.toString("utf8")).slice(-STDERR_TAIL))))
    // the write end of the child's stdin stays open for the parent's life; a write error (the child
    // gone) is not the parent's problem
    child.stdin?.on("error", () => {})
    const pid = child.pid
    if (pid === undefined) {
      yield* Deferred.await(exited).pipe(Effect.timeoutOption(KILL_WAIT))
      return yield* Effect.fail(new SpawnFailed({ reason: "no process" }))
    }
    const exit = Deferred.await(exited)
    const waitFor = (d: Duration.DurationInput) =>
      Effect.interruptible(exit).pipe(Effect.timeoutOption(d))
    yield* Effect.addFinalizer(() =>
      Effect.gen(function*() {
        if (yield* Deferred.isDone(exited)) return
        signalSafely(child, "SIGTERM")
        if (Option.isSome(yield* waitFor(options.stopGrace))) return
        signalSafely(child, "SIGKILL")
        yield* waitFor(KILL_WAIT)
      })
    )
    const handle: ChildHandle = {
      pid,
      exit,
      kill: (signal) => Effect.sync(() => signalSafely(child, signal)),
      lastError: Effect.map(Ref.get(tail), lastLine)
    }
    return handle
  })

/**
 * The child's side: run `onGone` once when stdin closes (the parent's end of the pipe is gone) or
 * the parent pid is no longer the one the process started with (checked every `interval`).
 * Returns when that happened; fork it in a scope.
 */
export const watchParent = (
  onGone: Effect.Effect<void>,
  interval: Duration.DurationInput = Duration.seconds(1)
): Effect.Effect<void> =>
  Effect.gen(function*() {
    const parent = process.ppid
    const stdinClosed = Effect.async<void>((resume) => {
      const done = () => resume(Effect.void)
      process.stdin.once("end", done)
      process.stdin.once("close", done)
      process.stdin.resume()
      return Effect.sync(() => {
        process.stdin.off("end", done)
        process.stdin.off("close", done)
      })
    })
    const reparented = Effect.sync(() => process.ppid !== parent).pipe(
      Effect.repeat({ schedule: Schedule.spaced(interval), until: (changed) => changed })
    )
    yield* Effect.raceFirst(stdinClosed, Effect.asVoid(reparented))
    yield* onGone
  })
