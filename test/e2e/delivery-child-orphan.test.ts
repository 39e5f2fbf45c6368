/**
 * SIGKILL of `npm start`'s process: its delivery child (which has a delivery in flight) notices the
 * parent is gone (DeliveryChild's watch of its parent) and runs its own ordered shutdown: no orphan
 * keeps running and delivering beside a restarted service. Real processes, real PostgreSQL.
 */
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, sleep, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, type LogEntry, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, waitFor } from "../support/proc.js"
import { type Receiver, startReceiver } from "../support/receiver.js"

const OWNER = "did:plc:superrevsuperrevsuperrev"
const POST = "app.bsky.feed.post"
const WH = "place.wisp.v2.wh"
const T0 = 1_750_000_000_000_000
const res = e2eResources()
afterAll(() => res.cleanup())

const hook = (rx: Receiver): LogEntry =>
  commitFrame(OWNER, T0, WH, "hook", "create", {
    $type: WH,
    scope: { aturi: `at://${OWNER}/${POST}` },
    url: rx.url,
    createdAt: "2026-01-01T00:00:00Z"
  })
const alive = (pid: number) => {
  try {
    process.kill(pid, 0)
    return true
  } catch {
    return false
  }
}

describe("the delivery child of a killed parent", () => {
  it("SIGKILL of the parent: the child exits within the shutdown deadline", async () => {
    const rx = await startReceiver(() => ({ status: 200, delayMs: 60_000 }))
    const js = await startFakeJetstream()
    const db = await res.freshDb()
    const d = await startDeployment(res.tempDir(), {
      DATABASE_URL: db,
      NODE_ENV: "test",
      DELIVERY_PROCESS: "child",
      WEBHOOK_ALLOW_INSECURE_DEV: "1",
      JETSTREAM_URL: js.url,
      LOG_LEVEL: "info"
    })
    await waitFor(d.health, 200, d.running, 90_000)
    js.publish([hook(rx)])
    js.publish([commitFrame(OWNER, T0 + 1000, POST, "p0", "create")])
    await waitUntil(
      async () =>
        (await query<{ n: number }>(db, "SELECT count(*)::int AS n FROM outbox WHERE status = 'leased'"))[0]?.n === 1,
      60_000,
      "a leased row"
    )
    const body = (await (await fetch(d.health)).json()) as { deliveryProcess: { pid: string } }
    const childPid = Number(body.deliveryProcess.pid)
    expect(Number.isInteger(childPid) && childPid > 0).toBe(true)
    d.running.child.kill("SIGKILL")
    await exitWithin(d.running, 10_000)
    // polled, not timed: the child's own shutdown deadline is 30 s
    for (let i = 0; i < 400 && alive(childPid); i++) await sleep(100)
    const gone = !alive(childPid)
    if (!gone) process.kill(childPid, "SIGKILL")
    expect(gone).toBe(true)
    expect(d.running.stdout()).toContain("the parent process is gone")
    await js.close()
    await rx.close()
  }, 180_000)
})
