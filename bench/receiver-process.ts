/**
 * bench/e2e-receivers.ts started as a process of its own: `count` node:http servers on 127.0.0.1
 * answering 204, whose CPU is not this process's (`process.cpuUsage()` here counts the client side
 * of an exchange only). The child exits when its stdin closes or on SIGTERM.
 */
import { Effect } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import * as Path from "node:path"

export interface ReceiverStats {
  readonly requests: number
  readonly distinct: number
  readonly first: number
  readonly last: number
}

export interface ReceiverProcess {
  readonly child: ChildProcess
  readonly ports: ReadonlyArray<number>
  readonly stats: () => Promise<ReceiverStats>
  readonly reset: () => Promise<void>
  /** end the child (stdin closed, SIGTERM) */
  readonly stop: () => void
}

/** Start the receivers' process (Bun runs the file itself, Node through tsx); resolves once they listen. */
export const startReceiverProcess = (count: number): Promise<ReceiverProcess> =>
  new Promise((resolve, reject) => {
    const file = Path.join(import.meta.dirname, "e2e-receivers.ts")
    const args = process.versions["bun"] !== undefined
      ? [file, String(count)]
      : ["--import", "tsx", file, String(count)]
    const child = spawn(process.execPath, args, { stdio: ["pipe", "pipe", "inherit"] })
    const stop = () => {
      child.stdin?.end()
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGTERM")
    }
    let out = ""
    const timer = setTimeout(() => {
      stop()
      reject(new Error("receivers did not start"))
    }, 30_000)
    child.once("exit", () => {
      clearTimeout(timer)
      reject(new Error("receivers exited before listening"))
    })
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString("utf8")
      const line = out.split("\n")[0]
      if (!out.includes("\n") || line === undefined) return
      clearTimeout(timer)
      const { ports, stats } = JSON.parse(line) as { ports: Array<number>; stats: number }
      const get = (path: string) =>
        fetch(`http://127.0.0.1:${stats}${path}`, { signal: AbortSignal.timeout(5_000) }).then((r) =>
          r.json() as Promise<ReceiverStats>
        )
      resolve({ child, ports, stats: () => get("/"), reset: () => get("/reset").then(() => undefined), stop })
    })
  })

/** {@link startReceiverProcess} as a scoped resource: the child ends with the scope. */
export const scopedReceiverProcess = (count: number) =>
  Effect.acquireRelease(
    Effect.promise(() => startReceiverProcess(count)),
    (r) => Effect.sync(() => r.stop())
  )
