/**
 * SIGTERM while `bun src/main.ts` is still starting (SPEC §6.1): the ordered, deadline-bound shutdown
 * of §6.3 runs over the parts started so far (phase `stopping`), exit 0 when they stopped cleanly.
 *
 * Startup is held deterministically in its migrations: the test holds the migration runners'
 * advisory lock, so firehook's runner waits for it until the signal comes.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, describe, expect, inject, it } from "vitest"
import { MIGRATION_LOCK_KEY } from "../../src/services/platform/Migrations.js"
import { databaseUrl, runDatabaseName } from "../support/pgAdmin.js"
import { exitWithin, freePort, killUnlessExited, type Running, startFirehook } from "../support/proc.js"

const dirs: Array<string> = []
afterAll(() => {
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
})
const tmpDir = () => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-e2e-"))
  dirs.push(d)
  return d
}

const adminQuery = async (url: string, q: string, values: Array<unknown> = []) => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    return (await c.query<Record<string, unknown>>(q, values)).rows
  } finally {
    await c.end()
  }
}

const WAITING = `SELECT count(*)::int AS n FROM pg_locks l JOIN pg_database d ON d.oid = l.database
  WHERE l.locktype = 'advisory' AND NOT l.granted AND d.datname = $1`

const SHUTDOWN_TIMEOUT_MS = 5000

describe("a signal during startup", () => {
  const signalWhileMigrating = (signal: "SIGTERM" | "SIGHUP") => async () => {
    const admin = inject("pgAdminUrl")
    // named for the run: globalSetup drops it if this worker dies before the `finally` below
    const name = runDatabaseName(inject("pgRunTag"))
    await adminQuery(admin, `CREATE DATABASE ${name}`)
    const url = databaseUrl(admin, name)
    const holder = new pg.Client({ connectionString: url })
    let running: Running | undefined
    try {
      await holder.connect()
      await holder.query("BEGIN")
      await holder.query("SELECT pg_advisory_xact_lock($1)", [MIGRATION_LOCK_KEY])
      running = startFirehook({
        DATABASE_URL: url,
        FIREHOOK_DATA_DIR: tmpDir(),
        HEALTH_PORT: String(await freePort()),
        SHUTDOWN_TIMEOUT_MS: String(SHUTDOWN_TIMEOUT_MS),
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: "ws://127.0.0.1:9/subscribe"
      })
      // firehook's migration runner is waiting for the lock the test holds
      let waiting = 0
      let exited = false
      void running.exit.then(() => (exited = true))
      for (let i = 0; i < 600 && waiting === 0 && !exited; i++) {
        waiting = Number((await adminQuery(admin, WAITING, [name]))[0]?.["n"])
        if (waiting === 0) await new Promise((r) => setTimeout(r, 50))
      }
      expect(waiting, running.stderr()).toBe(1)
      expect(running.stdout()).not.toContain("health server listening")

      running.child.kill(signal)
      const exit = await exitWithin(running, SHUTDOWN_TIMEOUT_MS + 3000)
      expect(exit, running.stderr() + running.stdout().slice(-2000)).toEqual({ code: 0, signal: null })
      expect(running.stderr()).toBe("")
      const logs = running.stdout().split("\n").filter((l) => l.length > 0).map((l) =>
        JSON.parse(l) as { message?: unknown; annotations?: Record<string, unknown> }
      )
      const started = logs.find((l) => l.message === "shutdown started")
      expect(started?.annotations).toMatchObject({ phase: "stopping", timeoutMs: SHUTDOWN_TIMEOUT_MS })
      const complete = logs.find((l) => l.message === "shutdown complete")
      expect(complete?.annotations).toMatchObject({ clean: true })
      // the waiting migration was cancelled, not left behind
      expect(Number((await adminQuery(admin, WAITING, [name]))[0]?.["n"])).toBe(0)
    } finally {
      // a firehook the test did not see exit (a failed expectation) must not outlive it
      if (running !== undefined) killUnlessExited(running.child)
      await holder.query("ROLLBACK").catch(() => undefined)
      await holder.end().catch(() => undefined)
      await adminQuery(admin, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    }
  }

  it(
    "SIGTERM while the migrations wait: phase `stopping`, the ordered shutdown, exit 0 within the deadline",
    signalWhileMigrating("SIGTERM"),
    60_000
  )

  // the terminal or SSH session that ran `npm start` closed: a stop like SIGTERM, not the default
  // action (an immediate exit 129 that left the embedded PostgreSQL running)
  it(
    "SIGHUP the same: the ordered shutdown, exit 0 within the deadline",
    signalWhileMigrating("SIGHUP"),
    60_000
  )
})
