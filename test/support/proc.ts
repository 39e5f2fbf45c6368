/**
 * Run firehook (`bun src/main.ts`, as in production) as a child process for end-to-end tests.
 */
import { Effect } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import * as Path from "node:path"
import { inject } from "vitest"
import * as Ports from "../../src/services/platform/Ports.js"

export const ROOT = Path.resolve(import.meta.dirname, "../..")
export const BUN = Path.join(ROOT, "node_modules/.bin/bun")

export interface Running {
  readonly child: ChildProcess
  readonly stdout: () => string
  readonly stderr: () => string
  readonly exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

/** every child still running when the test process exits is killed (a failed test must not leak one) */
const children = new Set<ChildProcess>()
/** SIGKILL every child still running (a test file's cleanup: vitest may end its worker without `exit`) */
export const killAllChildren = (): void => {
  for (const c of children) c.kill("SIGKILL")
}
process.once("exit", killAllChildren)

/**
 * Run `bun src/main.ts` with only `env` (plus PATH/HOME and JSON logs). The owners' API listens on
 * a port of the system's choosing unless `env` names one (`API_PORT`), so that several deployments
 * (and several test runs on one machine) never contend for the default 3004. Delivery runs inline
 * (`DELIVERY_PROCESS=inline`) unless `env` says otherwise.
 */
export const startFirehook = (
  env: Record<string, string>,
  /** another command line that starts it (`npm start`), in a process group of its own (`detached`) */
  how: { readonly command: string; readonly args: ReadonlyArray<string>; readonly detached?: boolean } = {
    command: BUN,
    args: ["src/main.ts"]
  }
): Running => {
  const child = spawn(how.command, how.args, {
    cwd: ROOT,
    detached: how.detached === true,
    env: {
      PATH: process.env["PATH"] ?? "",
      HOME: process.env["HOME"] ?? "/tmp",
      LOG_FORMAT: "json",
      API_PORT: "0",
      // one process unless a test is about the production default (DELIVERY_PROCESS=auto: a
      // delivery child on two or more cores), which it then names: half the processes per test
      DELIVERY_PROCESS: "inline",
      ...env
    },
    stdio: ["ignore", "pipe", "pipe"]
  })
  let out = ""
  let err = ""
  child.stdout?.on("data", (d: Buffer) => (out += d.toString("utf8")))
  child.stderr?.on("data", (d: Buffer) => (err += d.toString("utf8")))
  children.add(child)
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on("exit", (code, signal) => {
      children.delete(child)
      resolve({ code, signal })
    })
  )
  return { child, stdout: () => out, stderr: () => err, exit }
}

/**
 * A port for a child process to listen on: below the kernel's ephemeral range (Ports.ts), since a
 * port chosen by binding port 0 and closing it may be given to another listener before the child
 * binds it (a CI run failed on that: `HEALTH_PORT ... is in use`).
 */
export const freePort = (): Promise<number> => Effect.runPromise(Ports.freeLoopbackPort)

/** Poll `url` until it answers with `status` (or the process exits, or `timeoutMs` passes). */
export const waitFor = async (url: string, status: number, running: Running, timeoutMs = 60_000): Promise<Response> => {
  const until = Date.now() + timeoutMs
  let exited = false
  void running.exit.then(() => (exited = true))
  for (let i = 0; i < 10_000 && Date.now() < until && !exited; i++) {
    try {
      const res = await fetch(url, { signal: AbortSignal.timeout(2000) })
      if (res.status === status) return res
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100))
  }
  throw new Error(
    `${url} did not answer ${status}; stderr: ${running.stderr().slice(0, 2000)}; stdout: ${
      running.stdout().slice(-2000)
    }`
  )
}

/** Wait for exit with a bound; kill -9 and fail if it does not come. */
export const exitWithin = async (running: Running, ms: number) => {
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<"timeout">((r) => (timer = setTimeout(() => r("timeout"), ms)))
  const result = await Promise.race([running.exit, timeout])
  clearTimeout(timer)
  if (result === "timeout") {
    running.child.kill("SIGKILL")
    throw new Error(`process did not exit within ${ms} ms`)
  }
  return result
}

export interface CliResult {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** The CLI's sources, as `npx firehook` (bin/firehook.mjs) runs them. */
export const SOURCE_CLI = "src/cli/main.ts"

/** How long `runCli` waits for the CLI to exit before it kills it (SIGKILL) and fails. */
export const CLI_EXIT_TIMEOUT_MS = 60_000

export interface CliOptions {
  /** kill the CLI (SIGKILL) and reject when it has not exited by then; `CLI_EXIT_TIMEOUT_MS` unless given */
  readonly timeoutMs?: number
  /** kill the CLI (SIGKILL) when this aborts: `Effect.promise((signal) => runCli(..., { signal }))` */
  readonly signal?: AbortSignal
}

/**
 * Run the CLI (`firehook <args>`: the bundle of `src/cli/main.ts` that globalSetup built, see
 * cliBundle.ts) with only `env` (plus PATH/HOME) and collect its output. A CLI that does not exit
 * within `options.timeoutMs` is killed and the promise rejects (a hung command must not outlive
 * its test, nor leave the test waiting for vitest's timeout, which does not stop the child).
 */
export const runCli = (
  args: ReadonlyArray<string>,
  env: Record<string, string>,
  /** the script Bun runs: the bundle, or `SOURCE_CLI` (the sources, as `npx firehook` runs them) */
  entry: string = inject("cliBundle"),
  options: CliOptions = {}
): Promise<CliResult> => {
  const ms = options.timeoutMs ?? CLI_EXIT_TIMEOUT_MS
  const running = spawnCli(args, env, entry)
  const kill = () => running.child.kill("SIGKILL")
  if (options.signal?.aborted === true) kill()
  options.signal?.addEventListener("abort", kill, { once: true })
  let timer: NodeJS.Timeout | undefined
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      kill()
      reject(
        new Error(
          `firehook ${args.join(" ")} did not exit within ${ms} ms (killed); stderr: ${running.stderr().slice(-2000)}`
        )
      )
    }, ms)
  })
  const exited = running.exit.then((code) => ({ code, stdout: running.stdout(), stderr: running.stderr() }))
  return Promise.race([exited, timeout]).finally(() => {
    clearTimeout(timer)
    options.signal?.removeEventListener("abort", kill)
  })
}

/**
 * A running CLI (as `runCli` runs it) whose output can be read while it runs. It is one of
 * `children` until it exits (`killAllChildren` ends it); a test that runs one until it stops it
 * kills it in its `finally`.
 */
export const spawnCli = (
  args: ReadonlyArray<string>,
  env: Record<string, string>,
  entry: string = inject("cliBundle")
) => {
  const child: ChildProcess = spawn(BUN, [entry, ...args], {
    cwd: ROOT,
    env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp", ...env },
    stdio: ["ignore", "pipe", "pipe"]
  })
  children.add(child)
  child.once("exit", () => children.delete(child))
  child.once("error", () => children.delete(child))
  let stdout = ""
  let stderr = ""
  child.stdout?.on("data", (d: Buffer) => (stdout += d.toString("utf8")))
  child.stderr?.on("data", (d: Buffer) => (stderr += d.toString("utf8")))
  const exit = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
  return { child, stdout: () => stdout, stderr: () => stderr, exit }
}

/** SIGKILL `child` unless it has exited (a test's `finally` for a child it runs until it stops it). */
export const killUnlessExited = (child: ChildProcess): void => {
  if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
}
