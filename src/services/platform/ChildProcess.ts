/**
 * A child process owned by a Scope (`node:child_process`, which Bun implements), and the child's
 * side of supervision: noticing that its parent died.
 *
 * - {@link spawn} starts the process with its stdin a pipe that stays open for the parent's life (the
 *   child sees it close when the parent dies, however it dies; the parent writes at most a few short
 *   lines on it: {@link ChildHandle.tell}), stdout shared with the parent (the child's
 *   structured logs go where the parent's go) and stderr captured (its last line, bounded, for the
 *   parent's log and give-up message). When the scope closes with the process still running, it is
 *   sent SIGTERM, given `stopGrace` to exit, then SIGKILL.
 * - {@link watchParent} runs `onGone` once when stdin closes or the parent pid changes (the child
 *   was re-parented: polled every second), so an orphan never keeps working; the lines the parent
 *   writes on stdin go to `onLine` (each at most {@link LINE_BYTES} bytes; a longer one is dropped).
 */
import { Data, Deferred, Duration, Effect, Exit, Option, Ref, Runtime, Schedule } from "effect"
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
  /**
   * Write `line` (no newline in it; at most {@link LINE_BYTES} bytes with its newline) and a newline
   * on the process's stdin; returns once it was handed to the pipe (at most {@link TELL_WAIT}), so
   * that a signal sent after it reaches the process after the line. Nothing when it has exited.
   */
  readonly tell?: (line: string) => Effect.Effect<void>
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
/** the longest line (bytes, its newline included) the parent writes on its child's stdin */
export const LINE_BYTES = 64
/** how long {@link ChildHandle.tell} waits for its write to be handed to the pipe */
export const TELL_WAIT = Duration.millis(200)

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
    const tell = (line: string): Effect.Effect<void> =>
      Effect.async<void>((resume) => {
        const stdin = child.stdin
        const text = `${line}\n`
        if (
          stdin === null || !stdin.writable || child.exitCode !== null || child.signalCode !== null ||
          Buffer.byteLength(text) > LINE_BYTES || line.includes("\n")
        ) return resume(Effect.void)
        stdin.write(text, () => resume(Effect.void))
      }).pipe(Effect.timeoutOption(TELL_WAIT), Effect.asVoid)
    const handle: ChildHandle = {
      pid,
      exit,
      kill: (signal) => Effect.sync(() => signalSafely(child, signal)),
      lastError: Effect.map(Ref.get(tail), lastLine),
      tell
    }
    return handle
  })

/**
 * Splits the bytes read from stdin into lines (without their newline): a line longer than `maxBytes`
 * (its newline included) is dropped whole, so at most `maxBytes` are ever held.
 */
export const lineSplitter = (maxBytes: number = LINE_BYTES) => {
  let held: Buffer = Buffer.alloc(0)
  /** dropping the rest of a line that was too long */
  let skipping = false
  return (chunk: Buffer): ReadonlyArray<string> => {
    const lines: Array<string> = []
    let rest = chunk
    // bounded by the chunk: each turn takes at least one byte off `rest`, or ends the loop
    for (let nl = rest.indexOf(0x0a); nl >= 0; nl = rest.indexOf(0x0a)) {
      const part = rest.subarray(0, nl)
      if (!skipping && held.length + part.length < maxBytes) {
        lines.push(Buffer.concat([held, part]).toString("utf8"))
      }
      held = Buffer.alloc(0)
      skipping = false
      rest = rest.subarray(nl + 1)
    }
    if (skipping) return lines
    if (held.length + rest.length >= maxBytes) {
      held = Buffer.alloc(0)
      skipping = true
    } else if (rest.length > 0) held = Buffer.concat([held, rest])
    return lines
  }
}

export interface WatchParentOptions {
  /** run once when the parent is gone */
  readonly onGone: Effect.Effect<void>
  /** each line the parent writes on stdin (at most {@link LINE_BYTES} bytes; longer ones dropped) */
  readonly onLine?: (line: string) => Effect.Effect<void>
  /** the parent's pipe (default `process.stdin`) */
  readonly input?: NodeJS.ReadableStream
  /** between two looks at the parent pid (default 1 s) */
  readonly interval?: Duration.DurationInput
}

/**
 * The child's side: run `onGone` once when stdin closes (the parent's end of the pipe is gone) or
 * the parent pid is no longer the one the process started with (checked every `interval`); a line
 * on stdin is no sign of either: it goes to `onLine`. Returns when the parent is gone; fork it in a
 * scope.
 */
export const watchParent = (options: WatchParentOptions): Effect.Effect<void> =>
  Effect.gen(function*() {
    const parent = process.ppid
    const input = options.input ?? process.stdin
    const onLine = options.onLine ?? (() => Effect.void)
    const runtime = yield* Effect.runtime<never>()
    const stdinClosed = Effect.async<void>((resume) => {
      const split = lineSplitter()
      const data = (chunk: Buffer | string) => {
        for (const line of split(typeof chunk === "string" ? Buffer.from(chunk) : chunk)) {
          Runtime.runFork(runtime)(onLine(line))
        }
      }
      const done = () => resume(Effect.void)
      input.on("data", data)
      input.once("end", done)
      input.once("close", done)
      input.resume()
      return Effect.sync(() => {
        input.off("data", data)
        input.off("end", done)
        input.off("close", done)
      })
    })
    const reparented = Effect.sync(() => process.ppid !== parent).pipe(
      Effect.repeat({ schedule: Schedule.spaced(options.interval ?? Duration.seconds(1)), until: (changed) => changed })
    )
    yield* Effect.raceFirst(stdinClosed, Effect.asVoid(reparented))
    yield* options.onGone
  })
