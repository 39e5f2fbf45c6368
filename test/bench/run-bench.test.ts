/**
 * bench/lifecycle.ts's runBench (bench/delivery.ts and bench/noisy.ts run through it): SIGINT or
 * SIGTERM interrupts the benchmark, its scope's finalizers run (there: the bench database dropped,
 * the embedded PostgreSQL stopped), and it exits 130 / 143. Before, a signal ended the process at
 * once and left the database and the embedded server behind.
 */
import { spawn } from "node:child_process"
import * as Path from "node:path"
import { describe, expect, it } from "vitest"

const ROOT = Path.resolve(import.meta.dirname, "..", "..")
const BUN = Path.join(ROOT, "node_modules", ".bin", "bun")
const FIXTURE = Path.join(import.meta.dirname, "fixtures", "signal-bench.ts")

const stopWith = (runtime: "bun" | "node", signal: NodeJS.Signals, times: number) =>
  new Promise<{ code: number | null; out: string }>((resolve) => {
    const child = runtime === "bun"
      ? spawn(BUN, [FIXTURE], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] })
      : spawn(process.execPath, ["--import", "tsx", FIXTURE], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] })
    let out = ""
    let sent = false
    const onData = (d: Buffer) => {
      out += d.toString("utf8")
      if (!sent && out.includes("ready")) {
        sent = true
        // a repeated signal (a second Ctrl-C) must not cut the finalizers short
        for (let i = 0; i < times; i++) child.kill(signal)
      }
    }
    child.stdout.on("data", onData)
    child.stderr.on("data", onData)
    child.on("close", (code) => resolve({ code, out }))
  })

describe("a benchmark stopped by a signal", () => {
  it.each(
    [
      ["bun", "SIGINT", 130],
      ["bun", "SIGTERM", 143],
      ["node", "SIGINT", 130]
    ] as const
  )("on %s, %s runs its finalizers and exits %i", async (runtime, signal, code) => {
    const r = await stopWith(runtime, signal, 2)
    expect(r.out).toContain("released")
    expect(r.code).toBe(code)
  }, 60_000)
})
