/**
 * The test support leaves nothing behind a test: a CLI run (`runCli`) that does not exit is killed
 * after its bound and the call fails saying so; one whose effect is interrupted is killed; a CLI
 * that a test runs until it stops it (`spawnCli`) is one of the children `killAllChildren` ends;
 * and the end of a devnet file (`closeDevnetFile`) closes the network, the scope, the databases and
 * the directories even when firehook did not exit 0 on SIGTERM (and still fails the file).
 *
 * The "CLI" here is a script that writes its pid and never exits; the "firehook" one that exits 3
 * on SIGTERM; the database is a real one on the test PostgreSQL server.
 */
import { Effect, Fiber, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, inject, it } from "vitest"
import { closeDevnetFile, e2eResources, query, waitUntil } from "./support/e2e.js"
import { BUN, killAllChildren, killUnlessExited, runCli, spawnCli, startFirehook } from "./support/proc.js"

const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-support-leaks-"))
const HANG = Path.join(dir, "hang.ts")
Fs.writeFileSync(
  HANG,
  `import * as Fs from "node:fs"
Fs.writeFileSync(process.env["PID_FILE"] ?? "", String(process.pid))
setInterval(() => {}, 1 << 30)
`
)
const pidFiles: Array<string> = []
const pidFile = () => {
  const f = Path.join(dir, `${pidFiles.length}.pid`)
  pidFiles.push(f)
  return f
}
/** the hanging script's process `pid` is still running (not one that has since taken its pid) */
const hangs = (pid: number): boolean => {
  try {
    return Fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").includes(HANG)
  } catch {
    return false
  }
}
const pidIn = async (file: string): Promise<number> => {
  await waitUntil(() => Fs.existsSync(file) && Fs.readFileSync(file, "utf8") !== "", 20_000, "the CLI started")
  return Number(Fs.readFileSync(file, "utf8"))
}
/** `p`'s outcome, or "still waiting" after `ms` (so that a test of a bound does not wait for vitest's) */
const within = <A>(p: Promise<A>, ms: number): Promise<A | "still waiting"> => {
  let timer: NodeJS.Timeout | undefined
  return Promise.race([p, new Promise<"still waiting">((r) => (timer = setTimeout(() => r("still waiting"), ms)))])
    .finally(() => clearTimeout(timer))
}

afterAll(() => {
  // what a failing run (the old support code) left running: only this file's hanging scripts
  for (const f of pidFiles) {
    const pid = Fs.existsSync(f) ? Number(Fs.readFileSync(f, "utf8")) : 0
    if (pid > 0 && hangs(pid)) process.kill(pid, "SIGKILL")
  }
  Fs.rmSync(dir, { recursive: true, force: true })
})

describe("CLI children", () => {
  it("runCli: a CLI that does not exit within the bound is killed, and the call fails saying so", async () => {
    const file = pidFile()
    const outcome = await within(
      runCli(["hooks", "tail"], { PID_FILE: file }, HANG, { timeoutMs: 3000 }).then(
        (r) => `exited ${r.code}`,
        (e: unknown) => (e instanceof Error ? e.message : String(e))
      ),
      20_000
    )
    expect(outcome).toMatch(/^firehook hooks tail did not exit within 3000 ms \(killed\)/)
    const pid = await pidIn(file)
    await waitUntil(() => !hangs(pid), 10_000, "the hung CLI killed")
  }, 60_000)

  it("runCli: interrupting the effect that awaits it (its AbortSignal) kills the CLI", async () => {
    const file = pidFile()
    const fiber = Effect.runFork(
      Effect.promise((signal) => runCli(["hooks", "tail"], { PID_FILE: file }, HANG, { signal }))
    )
    const pid = await pidIn(file)
    await Effect.runPromise(Fiber.interrupt(fiber))
    await waitUntil(() => !hangs(pid), 10_000, "the interrupted CLI killed")
  }, 60_000)

  it("spawnCli: a CLI still running is one of the children killAllChildren ends", async () => {
    const running = spawnCli(["hooks", "tail"], { PID_FILE: pidFile() }, HANG)
    try {
      killAllChildren()
      expect(await within(running.exit, 10_000)).toBeNull()
      expect(running.child.signalCode).toBe("SIGKILL")
    } finally {
      killUnlessExited(running.child)
    }
  }, 60_000)
})

describe("closeDevnetFile", () => {
  it("a firehook that exits 3 on SIGTERM: the file fails, and everything else is still closed", async () => {
    const res = e2eResources()
    try {
      const db = new URL(await res.freshDb()).pathname.slice(1)
      const tmp = res.tempDir()
      const scope = Effect.runSync(Scope.make())
      let finalized = false
      await Effect.runPromise(Scope.addFinalizer(scope, Effect.sync(() => (finalized = true))))
      let networkClosed = false
      const running = startFirehook({}, {
        command: BUN,
        args: ["-e", `process.on("SIGTERM", () => process.exit(3)); console.log("ready"); setInterval(() => {}, 1e9)`]
      })
      await waitUntil(() => running.stdout().includes("ready"), 20_000, "the stand-in started")
      const closing = closeDevnetFile({
        firehook: { running, port: 0, health: "" },
        devnet: { close: () => Promise.resolve(void (networkClosed = true)) },
        scope,
        res
      })
      await expect(closing).rejects.toThrow(/expected 3 to be \+0/)
      expect(await running.exit).toEqual({ code: 3, signal: null })
      expect({ networkClosed, finalized, dir: Fs.existsSync(tmp) }).toEqual({
        networkClosed: true,
        finalized: true,
        dir: false
      })
      expect(await query(inject("pgAdminUrl"), "SELECT datname FROM pg_database WHERE datname = $1", [db])).toEqual([])
    } finally {
      // what the old code left (its database, its directory): a second clean-up fails harmlessly
      await res.cleanup().catch(() => undefined)
    }
  }, 60_000)
})
