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

/**
 * Run the CLI (`firehook <args>`: the bundle of `src/cli/main.ts` that globalSetup built, see
 * cliBundle.ts) with only `env` (plus PATH/HOME) and collect its output.
 */
export const runCli = (
  args: ReadonlyArray<string>,
  env: Record<string, string>,
  /** the script Bun runs: the bundle, or `SOURCE_CLI` (the sources, as `npx firehook` runs them) */
  entry: string = inject("cliBundle")
): Promise<CliResult> => {
  const running = spawnCli(args, env, entry)
  return running.exit.then((code) => ({ code, stdout: running.stdout(), stderr: running.stderr() }))
}

/** A running CLI (as `runCli` runs it) whose output can be read while it runs. */
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
  let stdout = ""
  let stderr = ""
  child.stdout?.on("data", (d: Buffer) => (stdout += d.toString("utf8")))
  child.stderr?.on("data", (d: Buffer) => (stderr += d.toString("utf8")))
  const exit = new Promise<number | null>((r) => child.on("close", (code) => r(code)))
  return { child, stdout: () => stdout, stderr: () => stderr, exit }
}
