/**
 * The embedded PostgreSQL's processes (EmbeddedPg.ts): `initdb`, the `postgres` server (started,
 * waited for, watched, stopped), the bounded tail of their output that names a failure's cause,
 * and a free port.
 */
import { Data, Duration, Effect, Option } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import * as Net from "node:net"
import * as Path from "node:path"
import type * as Placement from "./EmbeddedPgPlacement.js"
import { ownCode } from "./ErrorCode.js"

export class EmbeddedPgError extends Data.TaggedError("EmbeddedPgError")<{ readonly reason: string }> {
  override get message(): string {
    return `embedded PostgreSQL: ${this.reason}`
  }
}

export const fail = (reason: string) => new EmbeddedPgError({ reason })

/** The last lines a child printed (bounded), for a failure's one line. */
export const makeTail = () => {
  let text = ""
  return {
    push: (chunk: Buffer | string) => {
      text = (text + String(chunk)).slice(-4096)
    },
    includes: (needle: string) => text.includes(needle),
    /** the last FATAL or PANIC line (the cause; the lines after it are the shutdown's), else the last */
    last: () => {
      const lines = text.split("\n").map((l) => l.trim()).filter((l) => l.length > 0)
      // (not `findLast`: consumers' type checks may target a library before ES2023)
      const cause = lines.filter((l) => l.includes("FATAL:") || l.includes("PANIC:")).at(-1)
      return (cause ?? lines.at(-1) ?? "no output").replace(/\s+/g, " ").slice(0, 240)
    }
  }
}

export const childEnv = (): NodeJS.ProcessEnv => ({ ...process.env, LC_MESSAGES: "C" })

/**
 * How long an interrupted `initdb` may take to end after SIGTERM (it removes what it made of the
 * data directory on the way out) before it is killed (SIGKILL); then how long its end is waited for.
 */
export const INITDB_STOP_TIMEOUT = Duration.seconds(10)
export const INITDB_KILL_TIMEOUT = Duration.seconds(5)

/** Waits (interruptibly: cancellers run uninterruptible) for `child` to exit; at most `bound`. */
const exitWithin = (child: ChildProcess, bound: Duration.Duration) =>
  Effect.async<void>((resume) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      resume(Effect.void)
      return
    }
    const onExit = () => resume(Effect.void)
    child.once("exit", onExit)
    return Effect.sync(() => void child.off("exit", onExit))
  }).pipe(Effect.interruptible, Effect.timeoutOption(bound), Effect.map(Option.isSome))

/**
 * `initdb` into `pgDir` (as `user` when set), with the password from `pwFile`. Interrupted (a
 * Ctrl-C during a first start), it is stopped and its end waited for: SIGTERM, then SIGKILL after
 * {@link INITDB_STOP_TIMEOUT}. Not waiting let firehook exit while `initdb` still wrote the data
 * directory, where a start right after could find `PG_VERSION` and run a half-made cluster.
 */
export const runInitdb = (binDir: string, pgDir: string, pwFile: string, user: Placement.PgUser | undefined) =>
  Effect.async<void, EmbeddedPgError>((resume) => {
    const tail = makeTail()
    let done = false
    const finish = (e: Effect.Effect<void, EmbeddedPgError>) => {
      if (!done) {
        done = true
        resume(e)
      }
    }
    const initdb = Path.join(binDir, "bin", "initdb")
    const child = spawn(
      initdb,
      [
        `--pgdata=${pgDir}`,
        "--auth=scram-sha-256",
        "--username=postgres",
        `--pwfile=${pwFile}`,
        "--lc-messages=C",
        "--encoding=UTF8"
      ],
      { ...(user ?? {}), env: childEnv(), stdio: ["ignore", "pipe", "pipe"] }
    )
    child.stdout?.on("data", tail.push)
    child.stderr?.on("data", tail.push)
    child.once("error", (e) => finish(Effect.fail(fail(`could not run ${initdb} (${ownCode(e) ?? "spawn failed"})`))))
    child.once("close", (code, signal) =>
      finish(
        code === 0
          ? Effect.void
          : Effect.fail(fail(`initdb failed in ${pgDir} (exit ${code ?? signal ?? "unknown"}: ${tail.last()})`))
      ))
    return Effect.suspend(() => {
      if (done || child.exitCode !== null || child.signalCode !== null) return Effect.void
      child.kill("SIGTERM")
      return Effect.flatMap(exitWithin(child, INITDB_STOP_TIMEOUT), (ended) =>
        ended
          ? Effect.void
          : Effect.zipRight(
            Effect.sync(() => child.kill("SIGKILL")),
            Effect.asVoid(exitWithin(child, INITDB_KILL_TIMEOUT))
          ))
    })
  })

export const READY = "database system is ready to accept connections"

/** postgres's log line when its port was taken between our choice of it and its bind */
export const PORT_TAKEN = "Address already in use"
/** the chosen port was taken before the server bound it (by another process or an outbound connection) */
export class PortTaken extends Data.TaggedError("PortTaken")<{ readonly port: number }> {}
export const isPortTaken = (e: unknown): boolean => e instanceof PortTaken
/** how many ports a start tries before it gives up (each one chosen afresh) */
export const PORT_ATTEMPTS = 5

/** A running server: its process and the last line of its output that says why it stopped. */
export interface Server {
  readonly child: ChildProcess
  readonly lastLine: () => string
}

/** Start `postgres` on `pgDir` and wait until it accepts connections; interrupted → the server is stopped. */
export const runServer = (binDir: string, pgDir: string, port: number, user: Placement.PgUser | undefined) =>
  Effect.async<Server, EmbeddedPgError | PortTaken>((resume) => {
    const tail = makeTail()
    let done = false
    const finish = (e: Effect.Effect<Server, EmbeddedPgError | PortTaken>) => {
      if (!done) {
        done = true
        resume(e)
      }
    }
    const postgres = Path.join(binDir, "bin", "postgres")
    const child = spawn(postgres, [
      "-D",
      pgDir,
      "-p",
      String(port),
      "-c",
      "listen_addresses=127.0.0.1",
      "-c",
      "unix_socket_directories=",
      "-c",
      "max_connections=300"
    ], { ...(user ?? {}), env: childEnv(), stdio: ["ignore", "pipe", "pipe"], detached: true })
    // the server logs to stderr for as long as it runs: keep reading (bounded tail), or it blocks
    child.stdout?.on("data", tail.push)
    child.stderr?.on("data", (chunk: Buffer) => {
      tail.push(chunk)
      if (tail.includes(READY)) finish(Effect.succeed({ child, lastLine: tail.last }))
    })
    child.once("error", (e) => finish(Effect.fail(fail(`could not run ${postgres} (${ownCode(e) ?? "spawn failed"})`))))
    child.once(
      "exit",
      (code, signal) =>
        finish(Effect.fail(
          tail.includes(PORT_TAKEN)
            ? new PortTaken({ port })
            : fail(`the server exited while starting (${code ?? signal ?? "unknown"}: ${tail.last()})`)
        ))
    )
    return Effect.sync(() => {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGINT")
    })
  })

/** Waits for the server's exit: its code or signal. */
export const serverExit = (child: ChildProcess) =>
  Effect.async<string>((resume) => {
    const how = () => String(child.exitCode ?? child.signalCode ?? "unknown")
    if (child.exitCode !== null || child.signalCode !== null) {
      resume(Effect.succeed(how()))
      return
    }
    const onExit = () => resume(Effect.succeed(how()))
    child.once("exit", onExit)
    return Effect.sync(() => void child.off("exit", onExit))
  })

/** Stop the server (fast shutdown) and wait for it to exit. */
export const stopServer = (child: ChildProcess) =>
  Effect.async<void>((resume) => {
    if (child.exitCode !== null || child.signalCode !== null) {
      resume(Effect.void)
      return
    }
    child.once("exit", () => resume(Effect.void))
    child.kill("SIGINT")
  })

export const freePort = Effect.async<number, EmbeddedPgError>((resume) => {
  const server = Net.createServer()
  server.once("error", () => resume(Effect.fail(new EmbeddedPgError({ reason: "no free TCP port" }))))
  server.listen(0, "127.0.0.1", () => {
    const addr = server.address()
    const port = typeof addr === "object" && addr !== null ? addr.port : 0
    server.close(() =>
      resume(port > 0 ? Effect.succeed(port) : Effect.fail(new EmbeddedPgError({ reason: "no free TCP port" })))
    )
  })
})
