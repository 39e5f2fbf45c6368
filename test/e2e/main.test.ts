/**
 * The service as operators meet it: `bun src/main.ts` as a subprocess.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, describe, expect, inject, it } from "vitest"
import { migrations } from "../../src/services/platform/Migrations.js"
import { commitFrame, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { databaseUrl, runDatabaseName } from "../support/pgAdmin.js"
import { exitWithin, freePort, startFirehook, waitFor } from "../support/proc.js"

const dirs: Array<string> = []
const tmpDir = () => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-e2e-"))
  Fs.chmodSync(d, 0o755)
  dirs.push(d)
  return d
}
let jetstream: FakeJetstream | undefined
const fake = async () => (jetstream ??= await startFakeJetstream())
afterAll(async () => {
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
  await jetstream?.close()
})
/** the environment for a run against the local Jetstream (insecure dev mode for ws://) */
const devEnv = async () => ({
  NODE_ENV: "test",
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  JETSTREAM_URL: (await fake()).url
})

const adminQuery = async <T extends pg.QueryResultRow>(url: string, q: string) => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    return (await c.query<T>(q)).rows
  } finally {
    await c.end()
  }
}

/**
 * `repeatSignal`: a second SIGTERM as soon as the first one's shutdown has started (SPEC §6.3:
 * shutdown is idempotent, so the process still shuts down in order and exits 0).
 */
const runOnce = async (env: Record<string, string>, whileRunning?: () => Promise<void>, repeatSignal = false) => {
  const port = await freePort()
  const running = startFirehook({
    HEALTH_PORT: String(port),
    SHUTDOWN_TIMEOUT_MS: "10000",
    DELIVERY_PROCESS: "auto", // the production default: a delivery child on two or more cores
    ...(await devEnv()),
    ...env
  })
  try {
    let body: Record<string, unknown> = {}
    for (let i = 0; i < 100; i++) {
      const health = await waitFor(`http://127.0.0.1:${port}/health`, 200, running, 120_000)
      expect(health.headers.get("cache-control")).toBe("no-store")
      body = (await health.json()) as Record<string, unknown>
      // a standby is ready too, and so is `reconciling-live`: wait for the intake role and the
      // end of the initial backfill pass
      expect(["reconciling-live", "live"]).toContain(body["phase"])
      if ((body["intake"] as { role?: string } | undefined)?.role === "leader" && body["phase"] === "live") break
      await new Promise((r) => setTimeout(r, 100))
    }
    expect(body["status"]).toBe("ok")
    expect(body["phase"]).toBe("live")
    expect(body["intake"]).toMatchObject({ role: "leader", connected: true, progressing: true })
    await whileRunning?.()
    expect((await fetch(`http://127.0.0.1:${port}/live`)).status).toBe(200)
    expect((await fetch(`http://127.0.0.1:${port}/nope`)).status).toBe(404)
    const metrics = await fetch(`http://127.0.0.1:${port}/metrics`)
    expect(metrics.status).toBe(200)
    expect(await metrics.text()).toContain("firehook_process_resident_memory_bytes")
  } finally {
    running.child.kill("SIGTERM")
  }
  if (repeatSignal) {
    for (let i = 0; i < 500 && !running.stdout().includes("shutdown started"); i++) {
      await new Promise((r) => setTimeout(r, 10))
    }
    expect(running.stdout()).toContain("shutdown started")
    // the process is stopping from that line until it exits, however short its shutdown: the
    // second signal reaches it in between (it has not exited, and the signal was delivered)
    expect({ code: running.child.exitCode, signal: running.child.signalCode }).toEqual({ code: null, signal: null })
    expect(running.child.kill("SIGTERM")).toBe(true)
  }
  const exit = await exitWithin(running, 15_000)
  expect(exit).toEqual({ code: 0, signal: null })
  if (repeatSignal) {
    // the shutdown the first signal started ran to its end after the second one (the delivery
    // child, on the same stdout, logs its own shutdown in between)
    const messages = running.stdout().trim().split("\n").map((l) => (JSON.parse(l) as { message?: unknown }).message)
    expect(messages).toContain("shutdown complete")
    expect(messages.indexOf("shutdown started")).toBeLessThan(messages.lastIndexOf("shutdown complete"))
  }
  return running
}

describe("bun src/main.ts", () => {
  it("embedded PostgreSQL: starts, serves health, exits 0 on SIGTERM; a second start reuses the data dir", async () => {
    const dataDir = tmpDir()
    const first = await runOnce({ FIREHOOK_DATA_DIR: dataDir })
    expect(first.stdout()).toContain("embedded PostgreSQL initialised and started")
    expect(first.stdout()).toContain("shutdown complete")
    expect(Fs.existsSync(Path.join(dataDir, "pg", "PG_VERSION"))).toBe(true)
    const second = await runOnce({ FIREHOOK_DATA_DIR: dataDir })
    expect(second.stdout()).toContain("embedded PostgreSQL started")
    expect(second.stdout()).not.toContain("initialised")
    // every log line is one JSON object
    for (const line of second.stdout().trim().split("\n")) expect(() => JSON.parse(line)).not.toThrow()
  }, 300_000)

  it("DATABASE_URL: starts on the given database, migrations are a no-op the second time", async () => {
    const admin = inject("pgAdminUrl")
    // named for the run: globalSetup drops it if this worker dies before the `finally` below
    const name = runDatabaseName(inject("pgRunTag"))
    await adminQuery(admin, `CREATE DATABASE ${name}`)
    const url = databaseUrl(admin, name)
    try {
      await runOnce({ DATABASE_URL: url, FIREHOOK_DATA_DIR: tmpDir() }, async () => {
        // a webhook record and a matching post arrive on the stream: registered, then enqueued
        const owner = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
        const t = 1_750_000_000_000_000
        const js = await fake()
        js.publish([
          commitFrame(owner, t, "place.wisp.v2.wh", "hook1", "create", {
            $type: "place.wisp.v2.wh",
            scope: { aturi: `at://${owner}/app.bsky.feed.post` },
            url: "https://receiver.example/hook",
            createdAt: "2026-01-01T00:00:00Z"
          })
        ])
        const until = Date.now() + 30_000
        let rows: Array<{ n: string }> = []
        for (let i = 0; i < 300 && Date.now() < until; i++) {
          rows = await adminQuery<{ n: string }>(url, "SELECT count(*)::text AS n FROM webhooks WHERE active")
          if (rows[0]?.n === "1") break
          await new Promise((r) => setTimeout(r, 100))
        }
        expect(rows).toEqual([{ n: "1" }])
        // the direct stream picks up the owner (reconfiguration) and the post is enqueued
        for (let i = 0; i < 300 && Date.now() < until; i++) {
          js.publish([commitFrame(owner, t + 1000 + i, "app.bsky.feed.post", `p${i}`, "create")])
          rows = await adminQuery<{ n: string }>(url, "SELECT count(*)::text AS n FROM outbox")
          if (rows[0]?.n !== "0") break
          await new Promise((r) => setTimeout(r, 100))
        }
        expect(Number(rows[0]?.n)).toBeGreaterThan(0)
      })
      // the second run also gets a second SIGTERM during its shutdown
      await runOnce({ DATABASE_URL: url, FIREHOOK_DATA_DIR: tmpDir() }, undefined, true)
      // every bundled migration applied exactly once, none again by the second start
      const rows = await adminQuery<{ n: string }>(url, "SELECT count(*)::text AS n FROM firehook_migrations")
      expect(rows).toEqual([{ n: String(Object.keys(migrations).length) }])
    } finally {
      await adminQuery(admin, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    }
  }, 300_000)

  it("invalid configuration: exit 1 with one line naming the variable, no secret", async () => {
    const secret = "hunter2-very-secret"
    const cases: ReadonlyArray<readonly [Record<string, string>, string]> = [
      [{ HEALTH_PORT: "99999" }, "HEALTH_PORT"],
      [{ DATABASE_URL: `mysql://admin:${secret}@db/x` }, "DATABASE_URL"],
      [{ SHUTDOWN_TIMEOUT_MS: "5" }, "SHUTDOWN_TIMEOUT_MS"]
    ]
    for (const [env, variable] of cases) {
      const running = startFirehook(env)
      const exit = await exitWithin(running, 30_000)
      expect(exit.code).toBe(1)
      const lines = running.stderr().trim().split("\n")
      expect(lines).toHaveLength(1)
      expect(lines[0]).toContain(variable)
      expect(running.stderr() + running.stdout()).not.toContain(secret)
    }
  }, 120_000)

  it("SPEC §6.5: a stream URL with a query, or a listen host that is a name, is a startup error", async () => {
    // an unreachable database: a configuration that passed would fail later, on the database
    const port = await freePort()
    const database = `postgres://nobody@127.0.0.1:${port}/db`
    const cases: ReadonlyArray<readonly [Record<string, string>, string]> = [
      [
        { JETSTREAM_URL: "wss://jetstream.example/subscribe?wantedDids=did:plc:abcdefghijklmnopqrstuvwx" },
        "JETSTREAM_URL must not have a query or a fragment"
      ],
      [
        { FIREHOSE_SOURCE: "relay", RELAY_URL: "wss://relay.example/?cursor=1" },
        "RELAY_URL must not have a query or a fragment"
      ],
      [{ HEALTH_HOST: "eth0" }, "HEALTH_HOST must be an IP literal or localhost"]
    ]
    for (const [env, text] of cases) {
      const running = startFirehook({ DATABASE_URL: database, FIREHOOK_DATA_DIR: tmpDir(), ...env })
      const exit = await exitWithin(running, 30_000)
      expect(exit.code).toBe(1)
      const lines = running.stderr().trim().split("\n")
      expect(lines).toHaveLength(1)
      expect(lines[0]).toContain(`invalid configuration: ${text}`)
    }
  }, 120_000)

  it("an unreachable database: exit 1 with one line naming the cause in words, and no password", async () => {
    const secret = "pw-that-must-not-leak"
    const port = await freePort()
    const running = startFirehook({ DATABASE_URL: `postgres://someone:${secret}@127.0.0.1:${port}/db` })
    const exit = await exitWithin(running, 30_000)
    expect(exit.code).toBe(1)
    const lines = running.stderr().trim().split("\n")
    expect(lines).toHaveLength(1)
    expect(lines[0]).toBe("firehook: database: could not connect (ECONNREFUSED: nothing listens at that host and port)")
    expect(running.stderr() + running.stdout()).not.toContain(secret)
  }, 60_000)
})
