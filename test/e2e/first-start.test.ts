/**
 * A newcomer's first start (SPEC §6.1), as root with the data directory inside a home of mode 0700
 * (as `/root` is): `bun src/main.ts` serves /health, a second start reuses the embedded database,
 * SIGTERM exits 0. The `postgres` OS user cannot enter the home, so the cluster lives under
 * `/var/lib/firehook/data/<id>` (removed afterwards); the binaries run from the root-owned copy
 * under `/var/lib/firehook/postgresql/` (kept: it is the cache every later start reuses).
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Placement from "../../src/services/platform/EmbeddedPgPlacement.js"
import { type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, freePort, startFirehook, waitFor } from "../support/proc.js"

const isRoot = typeof process.getuid === "function" && process.getuid() === 0
const cleanup: Array<string> = []
let jetstream: FakeJetstream | undefined
afterAll(async () => {
  for (const d of cleanup) Fs.rmSync(d, { recursive: true, force: true })
  await jetstream?.close()
})

const runOnce = async (dataDir: string) => {
  jetstream ??= await startFakeJetstream()
  const port = await freePort()
  const running = startFirehook({
    FIREHOOK_DATA_DIR: dataDir,
    HEALTH_PORT: String(port),
    SHUTDOWN_TIMEOUT_MS: "10000",
    NODE_ENV: "test",
    DELIVERY_PROCESS: "auto", // the production default, as a newcomer's `npm start` runs
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    JETSTREAM_URL: jetstream.url
  })
  try {
    const health = await waitFor(`http://127.0.0.1:${port}/health`, 200, running, 120_000)
    expect(((await health.json()) as { status?: unknown }).status).toBe("ok")
  } finally {
    running.child.kill("SIGTERM")
  }
  expect(await exitWithin(running, 30_000)).toEqual({ code: 0, signal: null })
  expect(running.stderr()).toBe("")
  return running
}

describe.skipIf(!isRoot)("bun src/main.ts as root, the data directory inside a 0700 home", () => {
  it("serves /health; a second start reuses the database; SIGTERM exits 0", async () => {
    const home = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-home-"))
    Fs.chmodSync(home, 0o700)
    cleanup.push(home)
    const dataDir = Path.join(home, ".firehook")
    Fs.mkdirSync(dataDir)
    const relocated = Placement.relocatedStateDir(Placement.DEFAULT_SHARED_DIR, dataDir)
    cleanup.unshift(relocated)

    const first = await runOnce(dataDir)
    expect(first.stdout()).toContain("embedded PostgreSQL initialised and started")
    expect(Fs.existsSync(Path.join(relocated, "pg", "PG_VERSION"))).toBe(true)
    const second = await runOnce(dataDir)
    expect(second.stdout()).toContain("embedded PostgreSQL started")
    expect(second.stdout()).not.toContain("initialised")
  }, 300_000)
})
