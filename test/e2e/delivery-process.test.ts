/**
 * Delivery on its own core (issue 16 item 2, `DELIVERY_PROCESS`) with real `bun src/main.ts`
 * processes, a local Jetstream, receivers on loopback and one PostgreSQL database:
 * - the default start on a machine with two or more cores runs one delivery child: `/health` shows
 *   it, and the rows are leased by the child's pid (lease tokens carry the worker's pid), never the
 *   parent's;
 * - SIGKILL of the child: the parent restarts it, and every row is delivered (the killed child's
 *   leased rows are reclaimed by the new one);
 * - SIGTERM to the parent: exit 0 and the child is gone; the same with SIGTERM to the whole process
 *   group (the child gets the signal directly too);
 * - a child that keeps dying: after 5 restarts the parent exits 1 with one line on stderr;
 * - `DELIVERY_PROCESS=inline`: one process, as before.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, sleep, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, type FakeJetstream, type LogEntry, startFakeJetstream } from "../support/fakeJetstream.js"
import { BUN, exitWithin, freePort, type Running, startFirehook, waitFor } from "../support/proc.js"
import { type Receiver, startReceiver } from "../support/receiver.js"

const OWNER = "did:plc:dlvprocdlvprocdlvprocdlv"
const POST = "app.bsky.feed.post"
const WH = "place.wisp.v2.wh"
const T0 = 1_750_000_000_000_000

const res = e2eResources()
afterAll(() => res.cleanup())

interface DeliveryProcessBody {
  readonly mode: string
  readonly state: string
  readonly pid: string | null
  readonly restarts: number
}

const health = async (url: string): Promise<Record<string, unknown>> =>
  (await (await fetch(url, { signal: AbortSignal.timeout(2000) })).json()) as Record<string, unknown>

const section = async (url: string): Promise<DeliveryProcessBody | undefined> => {
  try {
    return (await health(url))["deliveryProcess"] as DeliveryProcessBody | undefined
  } catch {
    return undefined
  }
}

const count = async (db: string, where: string) =>
  Number((await query<{ n: string }>(db, `SELECT count(*)::text AS n FROM outbox WHERE ${where}`))[0]?.n ?? "0")

/** the parent pid of `pid` (from /proc), or undefined when the process is gone */
const parentOf = (pid: number): number | undefined => {
  try {
    const stat = Fs.readFileSync(`/proc/${pid}/stat`, "utf8")
    return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[1])
  } catch {
    return undefined
  }
}

/** the pids of `pid`'s children (from /proc) */
const childrenOf = (pid: number): Array<number> => {
  try {
    return Fs.readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").trim().split(/\s+/).filter((s) => s.length > 0)
      .map(Number)
  } catch {
    return []
  }
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

const hook = (rx: Receiver): LogEntry =>
  commitFrame(OWNER, T0, WH, "hook", "create", {
    $type: WH,
    scope: { aturi: `at://${OWNER}/${POST}` },
    url: rx.url,
    createdAt: "2026-01-01T00:00:00Z"
  })

const posts = (from: number, n: number): Array<LogEntry> =>
  Array.from({ length: n }, (_, i) => commitFrame(OWNER, T0 + 1000 + (from + i) * 100, POST, `p${from + i}`, "create"))

/** the pids that hold leased rows, sampled every 50 ms until stopped */
const sampleLeaseHolders = (db: string) => {
  const pids = new Set<string>()
  let on = true
  const done = (async () => {
    for (let i = 0; i < 100_000 && on; i++) {
      const rows = await query<{ pid: string }>(
        db,
        "SELECT DISTINCT split_part(lease_token, ':', 2) AS pid FROM outbox WHERE status = 'leased'"
      ).catch(() => [])
      for (const r of rows) pids.add(r.pid)
      await sleep(50)
    }
  })()
  return {
    pids,
    stop: async () => {
      on = false
      await done
    }
  }
}

/** `command args` in a process group of its own (so a test can signal the group) */
const spawnDetached = (command: string, args: Array<string>, port: number, env: Record<string, string>): Running =>
  startFirehook({
    LOG_LEVEL: "warn",
    HEALTH_PORT: String(port),
    FIREHOOK_DATA_DIR: res.tempDir(),
    SHUTDOWN_TIMEOUT_MS: "5000",
    ...env
  }, { command, args, detached: true })

const baseEnv = async (js: FakeJetstream) => ({
  DATABASE_URL: await res.freshDb(),
  NODE_ENV: "test",
  DELIVERY_PROCESS: "auto",
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  JETSTREAM_URL: js.url,
  DELIVERY_RETRY_BASE_MS: "100",
  DELIVERY_RETRY_MAX_MS: "500"
})

/** wait for the child to be running with a pid other than `not`; its pid */
const runningChild = async (url: string, running: Running, not?: string): Promise<DeliveryProcessBody> => {
  let body: DeliveryProcessBody | undefined
  await waitUntil(
    async () => {
      body = await section(url)
      return body?.state === "running" && body.pid !== null && body.pid !== not
    },
    90_000,
    "a running delivery child",
    () => `${JSON.stringify(body)} ${running.stderr().slice(0, 1000)}`
  )
  return body!
}

describe.runIf(Os.availableParallelism() >= 2)("DELIVERY_PROCESS (two or more cores)", () => {
  it(
    "default: a delivery child delivers; SIGKILL of the child → restarted, nothing lost; SIGTERM → exit 0, child gone",
    async () => {
      const rx = await startReceiver(() => ({ status: 200, delayMs: 100 }))
      const js = await startFakeJetstream()
      const env = await baseEnv(js)
      const d = await startDeployment(res.tempDir(), env)
      await waitFor(d.health, 200, d.running, 90_000)
      const parentPid = d.running.child.pid!
      const first = await runningChild(d.health, d.running)
      expect(first).toEqual({ mode: "child", state: "running", pid: first.pid, restarts: 0 })
      const childPid = Number(first.pid)
      expect(childPid).not.toBe(parentPid)
      expect(parentOf(childPid)).toBe(parentPid)
      expect(childrenOf(parentPid)).toEqual([childPid])
      const body = await health(d.health)
      expect(body["roles"]).toMatchObject({ intake: true, delivery: true, api: true })
      expect(body["delivery"]).toMatchObject({ pending: expect.any(Number), openCircuits: 0 })

      // (a) the child claims and delivers, the parent does not
      const holders = sampleLeaseHolders(env.DATABASE_URL)
      js.publish([hook(rx)])
      js.publish(posts(0, 20))
      await waitUntil(
        async () => (await count(env.DATABASE_URL, "status = 'delivered'")) === 20,
        60_000,
        "20 delivered"
      )
      await holders.stop()
      expect([...holders.pids]).toEqual([String(childPid)])
      // the parent's /metrics carries the child's series, labelled (the attempts are counted there)
      const metrics = await (await fetch(d.health.replace(/\/health$/, "/metrics"))).text()
      const attempts = metrics.split("\n").filter((l) => l.startsWith("firehook_delivery_attempts_total{"))
      expect(attempts.length).toBeGreaterThan(0)
      expect(attempts.every((l) => l.startsWith("firehook_delivery_attempts_total{process=\"delivery-child\",")))
        .toBe(true)
      expect(attempts.reduce((n, l) => n + Number(l.slice(l.lastIndexOf(" ") + 1)), 0)).toBe(20)
      expect(metrics).toMatch(/^firehook_process_resident_memory_bytes \d+$/m)
      expect(metrics).toMatch(/^firehook_process_resident_memory_bytes\{process="delivery-child"\} \d+$/m)
      const types = metrics.split("\n").filter((l) => l.startsWith("# TYPE "))
      expect(new Set(types).size).toBe(types.length)

      // (b) SIGKILL of the child mid-load: restarted, and every row is delivered
      rx.answer = () => ({ status: 200, delayMs: 1500 })
      js.publish(posts(20, 20))
      await waitUntil(
        async () => (await count(env.DATABASE_URL, "status = 'leased'")) > 0,
        30_000,
        "rows leased by the child"
      )
      process.kill(childPid, "SIGKILL")
      const second = await runningChild(d.health, d.running, first.pid!)
      expect(second.restarts).toBe(1)
      expect(parentOf(Number(second.pid))).toBe(parentPid)
      expect(alive(childPid)).toBe(false)
      rx.answer = () => ({ status: 200 })
      await waitUntil(
        async () => (await count(env.DATABASE_URL, "status = 'delivered'")) === 40,
        60_000,
        "all 40 delivered after the restart",
        async () =>
          JSON.stringify(await query(env.DATABASE_URL, "SELECT status, count(*)::int AS n FROM outbox GROUP BY status"))
      )
      expect(await count(env.DATABASE_URL, "true")).toBe(40)
      // every delivery reached the receiver under its own id (a retry keeps the id)
      expect(rx.hits.size).toBe(40)
      await waitFor(d.health, 200, d.running, 30_000)
      expect(d.running.stdout()).toContain("the delivery process exited")

      // (c) SIGTERM to the parent: one ordered shutdown, exit 0, the child gone
      d.running.child.kill("SIGTERM")
      expect((await exitWithin(d.running, 45_000)).code).toBe(0)
      expect(alive(Number(second.pid))).toBe(false)
      expect(d.running.stderr()).toBe("")
      await js.close()
      await rx.close()
    },
    300_000
  )

  it(
    "SIGTERM to the whole process group: exit 0, the child gone",
    async () => {
      const js = await startFakeJetstream()
      const env = await baseEnv(js)
      const port = await freePort()
      const running = spawnDetached(BUN, ["src/main.ts"], port, env)
      const child = running.child
      const err = running.stderr
      try {
        const url = `http://127.0.0.1:${port}/health`
        const body = await runningChild(url, running)
        process.kill(-child.pid!, "SIGTERM")
        expect((await exitWithin(running, 45_000)).code).toBe(0)
        await waitUntil(() => !alive(Number(body.pid)), 10_000, "the child gone")
        expect(err()).toBe("")
      } finally {
        try {
          process.kill(-child.pid!, "SIGKILL")
        } catch {
          // already gone
        }
        await js.close()
      }
    },
    180_000
  )

  it(
    "`npm start` (the README's command): SIGTERM to npm alone, as `docker stop` sends it: exit 0, firehook and its child gone",
    async () => {
      const js = await startFakeJetstream()
      const port = await freePort()
      const running = spawnDetached("npm", ["start"], port, { ...(await baseEnv(js)), LOG_LEVEL: "info" })
      try {
        const body = await runningChild(`http://127.0.0.1:${port}/health`, running)
        const childPid = Number(body.pid)
        const firehookPid = parentOf(childPid)!
        expect(firehookPid).not.toBe(running.child.pid)
        // the runtime settings of the script reach firehook and its delivery child (docs/operations.md, Memory)
        for (const pid of [firehookPid, childPid]) {
          const environ = Fs.readFileSync(`/proc/${pid}/environ`, "utf8").split("\0")
          expect(environ).toEqual(
            expect.arrayContaining(["BUN_JSC_heapGrowthMaxIncrease=1", "MIMALLOC_PURGE_DELAY=1000"])
          )
        }
        running.child.kill("SIGTERM")
        expect((await exitWithin(running, 45_000)).code).toBe(0)
        await waitUntil(
          () => !alive(firehookPid) && !alive(childPid),
          10_000,
          "firehook and its child gone",
          () => running.stderr().slice(0, 1000)
        )
        expect(running.stdout()).toContain("\"message\":\"shutdown complete\"")
      } finally {
        try {
          process.kill(-running.child.pid!, "SIGKILL")
        } catch {
          // already gone
        }
        await js.close()
      }
    },
    180_000
  )

  it(
    "a child that keeps dying: 5 restarts, then the parent stops with one line and exit 1",
    async () => {
      const js = await startFakeJetstream()
      const d = await startDeployment(res.tempDir(), await baseEnv(js))
      const killed = new Set<string>()
      // kill each child as soon as it is seen (started or running): backoffs of 1+2+4+8+16 s
      for (let i = 0; i < 600 && killed.size < 6; i++) {
        const body = await section(d.health)
        if (body?.pid != null && !killed.has(body.pid)) {
          killed.add(body.pid)
          process.kill(Number(body.pid), "SIGKILL")
        }
        if (d.running.child.exitCode !== null) break
        await sleep(250)
      }
      expect(killed.size).toBe(6)
      const exit = await exitWithin(d.running, 60_000)
      expect(exit.code).toBe(1)
      const lines = d.running.stderr().trim().split("\n")
      expect(lines).toEqual([
        "firehook: the delivery process exited 6 times within 10 min; giving up (last: signal SIGKILL)"
      ])
      for (const pid of killed) expect(alive(Number(pid))).toBe(false)
      await js.close()
    },
    300_000
  )
})

describe("DELIVERY_PROCESS=inline", () => {
  it(
    "one process: no child, no deliveryProcess section, the process's own pid leases the rows",
    async () => {
      const rx = await startReceiver(() => ({ status: 200, delayMs: 100 }))
      const js = await startFakeJetstream()
      const env = { ...(await baseEnv(js)), DELIVERY_PROCESS: "inline" }
      const d = await startDeployment(res.tempDir(), env)
      await waitFor(d.health, 200, d.running, 90_000)
      const pid = d.running.child.pid!
      const body = await health(d.health)
      expect(body["deliveryProcess"]).toBeUndefined()
      expect(body["delivery"]).toMatchObject({ pending: expect.any(Number) })
      const holders = sampleLeaseHolders(env.DATABASE_URL)
      js.publish([hook(rx)])
      js.publish(posts(0, 10))
      await waitUntil(
        async () => (await count(env.DATABASE_URL, "status = 'delivered'")) === 10,
        60_000,
        "10 delivered"
      )
      await holders.stop()
      expect([...holders.pids]).toEqual([String(pid)])
      expect(childrenOf(pid)).toEqual([])
      d.running.child.kill("SIGTERM")
      expect((await exitWithin(d.running, 30_000)).code).toBe(0)
      await js.close()
      await rx.close()
    },
    180_000
  )

  it("an invalid DELIVERY_PROCESS is one line on stderr and exit 1", async () => {
    const d = await startDeployment(res.tempDir(), { DELIVERY_PROCESS: "thread" })
    const exit = await exitWithin(d.running, 30_000)
    expect(exit.code).toBe(1)
    expect(d.running.stderr().trim().split("\n")).toEqual([
      "firehook: invalid configuration: DELIVERY_PROCESS must be one of auto, inline, child"
    ])
  }, 60_000)
})
