/**
 * SPEC §6.1: SIGTERM at any moment of startup runs the ordered shutdown, exit 0 when the parts
 * stopped cleanly. With the delivery child (DELIVERY_PROCESS=child), a SIGTERM that comes right
 * after the child was spawned reaches the child while it is still loading its modules, before it
 * installed any signal handling. Before LifecycleSignals and DeliveryProcess.stoppedCleanly the
 * child died of the forwarded SIGTERM and the parent counted that unclean: exit 1
 * (`{"clean":false,"exit":"signal SIGTERM"}`). The signal is sent as soon as the parent logs
 * `delivery process started` (no sleep).
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, describe, expect, inject, it } from "vitest"
import { exitWithin, freePort, startFirehook } from "../support/proc.js"

const dirs: Array<string> = []
afterAll(() => {
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
})
const tmpDir = () => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-e2e-"))
  dirs.push(d)
  return d
}

const adminQuery = async (url: string, q: string) => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    await c.query(q)
  } finally {
    await c.end()
  }
}

interface LogLine {
  readonly message?: unknown
  readonly annotations?: Record<string, unknown>
}
const logLines = (stdout: string): Array<LogLine> =>
  stdout.split("\n").filter((l) => l.startsWith("{")).map((l) => JSON.parse(l) as LogLine)

const SHUTDOWN_TIMEOUT_MS = 10_000

describe("a signal right after the delivery child was spawned", () => {
  it(
    "SIGTERM as soon as the parent logs `delivery process started`: exit 0, the child's stop counted clean",
    async () => {
      const admin = inject("pgAdminUrl")
      const name = `fh_e2e_early_${Date.now().toString(36)}`
      await adminQuery(admin, `CREATE DATABASE ${name}`)
      const u = new URL(admin)
      u.pathname = `/${name}`
      try {
        const running = startFirehook({
          DATABASE_URL: u.toString(),
          FIREHOOK_DATA_DIR: tmpDir(),
          HEALTH_PORT: String(await freePort()),
          SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS),
          DELIVERY_PROCESS: "child",
          NODE_ENV: "test",
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          JETSTREAM_URL: "ws://127.0.0.1:9/subscribe"
        })
        const spawned = await new Promise<boolean>((resolve) => {
          const look = () => {
            if (running.stdout().includes("\"delivery process started\"")) {
              running.child.stdout?.off("data", look)
              resolve(true)
            }
          }
          running.child.stdout?.on("data", look)
          void running.exit.then(() => resolve(false))
        })
        expect(spawned, running.stderr() + running.stdout().slice(-2000)).toBe(true)
        running.child.kill("SIGTERM")
        const exit = await exitWithin(running, SHUTDOWN_TIMEOUT_MS + 10_000)
        const stopped = logLines(running.stdout()).find((l) => l.message === "delivery process stopped")
        expect(exit, running.stdout().slice(-3000)).toEqual({ code: 0, signal: null })
        expect(stopped?.annotations?.["clean"]).toBe(true)
        expect(running.stderr()).toBe("")
      } finally {
        await adminQuery(admin, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      }
    },
    60_000
  )
})
