/**
 * Scale-out with roles (SPEC §6.4, §4.1; issue 16 acceptance), as operators run it: one `intake`
 * process, a second `intake` process standing by, and two `delivery` processes on one PostgreSQL
 * database, a local Jetstream and four loopback receivers, under a load of several thousand
 * deliveries (some answered 503 once, so they are retried).
 * - Every delivery is attempted by one process at a time (no receiver ever has two requests of one
 *   `webhook-id` in flight) and delivered once: one `delivered` attempt per row; a receiver sees a
 *   `webhook-id` again only as a retry (its attempts say so) or after its sender was killed
 *   mid-request.
 * - Only the two delivery processes claim rows (lease tokens carry the worker's pid).
 * - A delivery process is SIGKILLed mid-load: within seconds the other has taken over every row it
 *   had leased (its liveness mark died with it; their lease had 60 s to run), and delivers them.
 * - The intake process is SIGKILLed: the standby takes intake over, and what is published next is
 *   delivered.
 */
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, sleep, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, type FakeJetstream, type LogEntry, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, waitFor } from "../support/proc.js"
import { type Receiver, startReceiver } from "../support/receiver.js"

const OWNER = "did:plc:scaleoutscaleoutscaleout"
const T0 = 1_750_000_000_000_000
const WH = "place.wisp.v2.wh"
const POST = "app.bsky.feed.post"
const HOOKS_PER_RECEIVER = 2
const RECEIVERS = 4
const POSTS = 250
const MORE_POSTS = 50
const HOOKS = HOOKS_PER_RECEIVER * RECEIVERS

const res = e2eResources()
afterAll(() => res.cleanup())

/** the first attempt of one delivery in eight is answered 503 (retried), every request takes 20 ms */
const retried = (id: string) => id.charCodeAt(id.length - 1) % 8 === 0
const answer = (id: string, n: number) => ({ status: n === 1 && retried(id) ? 503 : 200, delayMs: 20 })

const role = async (port: number): Promise<string | undefined> => {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2000) })
    return ((await r.json()) as { intake?: { role?: string } }).intake?.role
  } catch {
    return undefined
  }
}

const count = async (db: string, where: string) =>
  Number((await query<{ n: string }>(db, `SELECT count(*)::text AS n FROM outbox WHERE ${where}`))[0]?.n ?? "0")

const posts = (from: number, n: number): Array<LogEntry> =>
  Array.from(
    { length: n },
    (_, i) => commitFrame(OWNER, T0 + 1_000_000 + (from + i) * 100, POST, `p${from + i}`, "create")
  )

const hooks = (rxs: ReadonlyArray<Receiver>): Array<LogEntry> =>
  rxs.flatMap((rx, r) =>
    Array.from(
      { length: HOOKS_PER_RECEIVER },
      (_, h) =>
        commitFrame(OWNER, T0 + r * 10 + h, WH, `h${r}x${h}`, "create", {
          $type: WH,
          scope: { aturi: `at://${OWNER}/${POST}` },
          url: rx.url,
          createdAt: "2026-01-01T00:00:00Z"
        })
    )
  )

/** the pids that hold leased rows, sampled every 50 ms until stopped */
const sampleLeaseHolders = (db: string) => {
  const pids = new Set<string>()
  let on = true
  const done = (async () => {
    const c = new pg.Client({ connectionString: db })
    await c.connect()
    c.on("error", () => (on = false))
    try {
      while (on) {
        const rows = await c.query<{ pid: string }>(
          "SELECT DISTINCT split_part(lease_token, ':', 2) AS pid FROM outbox WHERE status = 'leased'"
        )
        for (const r of rows.rows) pids.add(r.pid)
        await sleep(50)
      }
    } finally {
      await c.end().catch(() => undefined)
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

describe("scale-out: one intake (+ standby), two delivery processes", () => {
  it(
    "every delivery attempted by one process at a time and delivered once; SIGKILL of a delivery process and of the intake leader loses nothing",
    async () => {
      const rxs = await Promise.all(Array.from({ length: RECEIVERS }, () => startReceiver(answer)))
      const js: FakeJetstream = await startFakeJetstream()
      const db = await res.freshDb()
      const base = {
        DATABASE_URL: db,
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: js.url,
        DELIVERY_CONCURRENCY: "16",
        DELIVERY_RETRY_BASE_MS: "100",
        DELIVERY_RETRY_MAX_MS: "500"
      }
      const intake = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "intake" })
      await waitFor(intake.health, 200, intake.running, 60_000)
      await waitUntil(async () => (await role(intake.port)) === "leader", 20_000, "the intake leader")
      const standby = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "intake" })
      const d1 = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "delivery" })
      const d2 = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "delivery" })
      for (const d of [standby, d1, d2]) await waitFor(d.health, 200, d.running, 60_000)
      expect(await role(standby.port)).toBe("standby")
      const d1Pid = String(d1.running.child.pid)
      const d2Pid = String(d2.running.child.pid)

      const holders = sampleLeaseHolders(db)
      js.publish(hooks(rxs))
      js.publish(posts(0, POSTS))
      const first = HOOKS * POSTS
      await waitUntil(async () => (await count(db, "true")) === first, 60_000, "every delivery enqueued")

      // mid-load: SIGKILL the first delivery process while it holds leased rows
      const leasedBy = async (pid: string) =>
        (await query<{ delivery_id: string }>(
          db,
          "SELECT delivery_id FROM outbox WHERE status = 'leased' AND split_part(lease_token, ':', 2) = $1",
          [pid]
        )).map((r) => r.delivery_id)
      let killed: Array<string> = []
      await waitUntil(
        async () => {
          if ((await count(db, "status = 'delivered'")) < first / 5) return false
          const held = await leasedBy(d1Pid)
          if (held.length === 0) return false
          d1.running.child.kill("SIGKILL")
          // and what it claimed in between (its rows stay leased until another worker frees them)
          killed = [...new Set([...held, ...(await leasedBy(d1Pid))])]
          return true
        },
        60_000,
        "the first delivery process holding rows mid-load"
      )
      const killedAt = Date.now()
      await exitWithin(d1.running, 10_000)
      // its rows were leased for 60 s: within seconds none is held by it any more (the other
      // process freed them when its liveness mark died, and claims them), and in the end every
      // one is delivered (checked below)
      const stillHeld = async () =>
        Number(
          (await query<{ n: string }>(
            db,
            `SELECT count(*)::text AS n FROM outbox
             WHERE delivery_id = ANY($1) AND status = 'leased' AND split_part(lease_token, ':', 2) = $2`,
            [killed, d1Pid]
          ))[0]?.n
        )
      await waitUntil(
        async () => (await stillHeld()) === 0,
        10_000,
        "the killed process's rows taken over by the other",
        async () =>
          JSON.stringify({
            killed: await query(
              db,
              `SELECT status, split_part(lease_token, ':', 2) AS pid, leased_until > now() AS live, count(*)::int AS n
               FROM outbox WHERE delivery_id = ANY($1) GROUP BY 1, 2, 3`,
              [killed]
            ),
            all: await query(db, "SELECT status, count(*)::int AS n FROM outbox GROUP BY status")
          })
      )
      expect(Date.now() - killedAt).toBeLessThan(10_000)
      await waitUntil(async () => (await count(db, "status = 'delivered'")) === first, 120_000, "first load delivered")

      // SIGKILL the intake leader: the standby takes over and what comes next is delivered
      intake.running.child.kill("SIGKILL")
      await exitWithin(intake.running, 10_000)
      await waitUntil(async () => (await role(standby.port)) === "leader", 20_000, "the standby takes intake over")
      js.publish(posts(POSTS, MORE_POSTS))
      const total = HOOKS * (POSTS + MORE_POSTS)
      await waitUntil(
        async () => (await count(db, "status = 'delivered'")) === total,
        120_000,
        "everything delivered after the takeover",
        async () => JSON.stringify(await query(db, "SELECT status, count(*)::int AS n FROM outbox GROUP BY status"))
      )
      await holders.stop()

      // only the delivery processes claimed rows
      expect([...holders.pids].sort()).toEqual([d1Pid, d2Pid].sort())
      // every row delivered once, each webhook-id attempted by one process at a time
      const rows = await query<{ delivery_id: string; attempts: number; delivered: number }>(
        db,
        `SELECT o.delivery_id, count(a.*)::int AS attempts,
           count(*) FILTER (WHERE a.outcome = 'delivered')::int AS delivered
         FROM outbox o LEFT JOIN delivery_attempts a USING (delivery_id) GROUP BY o.delivery_id`
      )
      expect(rows.length).toBe(total)
      const hits = new Map<string, number>()
      const maxInFlight = new Map<string, number>()
      for (const rx of rxs) {
        for (const [id, n] of rx.hits) hits.set(id, (hits.get(id) ?? 0) + n)
        for (const [id, n] of rx.maxInFlight) maxInFlight.set(id, Math.max(maxInFlight.get(id) ?? 0, n))
      }
      expect(hits.size).toBe(total)
      expect([...maxInFlight.values()].every((n) => n === 1)).toBe(true)
      const killedSet = new Set(killed)
      const wrong: Array<unknown> = []
      for (const r of rows) {
        const h = hits.get(r.delivery_id) ?? 0
        // a killed sender's request may have reached the receiver without an attempt being recorded
        const ok = r.delivered === 1 &&
          (h === r.attempts || (killedSet.has(r.delivery_id) && h === r.attempts + 1)) &&
          (h === 1 || retried(r.delivery_id) || killedSet.has(r.delivery_id))
        if (!ok) wrong.push({ ...r, hits: h, killed: killedSet.has(r.delivery_id) })
      }
      expect(wrong).toEqual([])
      expect(rows.filter((r) => retried(r.delivery_id) && !killedSet.has(r.delivery_id)).every((r) => r.attempts >= 2))
        .toBe(true)

      for (const d of [d2, standby]) {
        d.running.child.kill("SIGTERM")
        expect((await exitWithin(d.running, 20_000)).code).toBe(0)
      }
      await js.close()
      for (const rx of rxs) await rx.close()
    },
    420_000
  )
})
