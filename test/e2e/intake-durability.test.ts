/**
 * Intake durability as operators meet it: real `bun src/main.ts` processes on one real PostgreSQL
 * database, a local Jetstream, SIGKILL at random points, and two replicas failing over.
 */
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, sleep, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, type Running, waitFor } from "../support/proc.js"

const OWNER = "did:plc:ownerownerownerownerowne"
const T0 = 1_750_000_000_000_000
const WH = "place.wisp.v2.wh"

const res = e2eResources()
afterAll(() => res.cleanup())
const freshDb = res.freshDb

const start = async (dbUrl: string, js: FakeJetstream) =>
  startDeployment(res.tempDir(), {
    DATABASE_URL: dbUrl,
    NODE_ENV: "test",
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    JETSTREAM_URL: js.url
  })

const role = async (port: number): Promise<string | undefined> => {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2000) })
    const body = (await res.json()) as { intake?: { role?: string } }
    return body.intake?.role
  } catch {
    return undefined
  }
}

const webhook = (rkey: string) =>
  commitFrame(OWNER, T0, WH, rkey, "create", {
    $type: WH,
    scope: { aturi: `at://${OWNER}/app.bsky.feed.post` },
    url: "https://receiver.example/hook",
    createdAt: "2026-01-01T00:00:00Z"
  })

const post = (i: number) => commitFrame(OWNER, T0 + 1000 + i * 10, "app.bsky.feed.post", `p${i}`, "create")

describe("intake durability", () => {
  it(
    "SIGKILL at random points while 20,000 events stream: every outbox row exists exactly once; cursors never go back",
    async () => {
      const js = await startFakeJetstream()
      const db = await freshDb()
      js.publish([webhook("hook")])
      const TOTAL = 20_000
      let current: { running: Running; port: number } = await start(db, js)
      await waitFor(`http://127.0.0.1:${current.port}/health`, 200, current.running, 60_000)
      // cursor sampler: per stream, the cursor must never decrease
      const seen = new Map<string, bigint>()
      let regressions = 0
      let sampling = true
      const sampler = (async () => {
        const c = new pg.Client({ connectionString: db })
        await c.connect()
        while (sampling) {
          const rows =
            (await c.query<{ stream: string; cursor: string }>("SELECT stream, cursor::text FROM cursors")).rows
          for (const r of rows) {
            const v = BigInt(r.cursor)
            const prev = seen.get(r.stream)
            if (prev !== undefined && v < prev) regressions++
            seen.set(r.stream, v)
          }
          await sleep(20)
        }
        await c.end()
      })()
      const kills = new Set([
        2_000 + Math.floor(Math.random() * 4_000),
        8_000 + Math.floor(Math.random() * 4_000),
        14_000 + Math.floor(Math.random() * 4_000)
      ])
      let killed = 0
      for (let i = 0; i < TOTAL; i += 250) {
        js.publish(Array.from({ length: Math.min(250, TOTAL - i) }, (_, k) => post(i + k)))
        await sleep(15)
        if ([...kills].some((k) => k >= i && k < i + 250)) {
          current.running.child.kill("SIGKILL")
          await exitWithin(current.running, 10_000)
          killed++
          current = await start(db, js)
        }
      }
      expect(killed).toBe(3)
      await waitUntil(
        async () => (await query<{ n: string }>(db, "SELECT count(*)::text AS n FROM outbox"))[0]?.n === String(TOTAL),
        120_000,
        "all outbox rows",
        async () =>
          JSON.stringify({
            outbox: await query(db, "SELECT count(*)::text AS n FROM outbox"),
            cursors: await query(db, "SELECT stream, cursor::text FROM cursors"),
            health: await (await fetch(`http://127.0.0.1:${current.port}/health`)).text(),
            conns: js.connections.length
          })
      )
      sampling = false
      await sampler
      const [stats] = await query<{ n: string; distinct_events: string; distinct_ids: string }>(
        db,
        "SELECT count(*)::text AS n, count(DISTINCT event_rkey)::text AS distinct_events, count(DISTINCT delivery_id)::text AS distinct_ids FROM outbox"
      )
      expect(stats).toEqual({ n: String(TOTAL), distinct_events: String(TOTAL), distinct_ids: String(TOTAL) })
      expect(regressions).toBe(0)
      current.running.child.kill("SIGTERM")
      expect((await exitWithin(current.running, 15_000)).code).toBe(0)
      await js.close()
    },
    300_000
  )

  it(
    "two replicas: exactly one intake leader; SIGKILL of the leader → the other takes over within 10 s; no event lost",
    async () => {
      const js = await startFakeJetstream()
      const db = await freshDb()
      js.publish([webhook("hook")])
      const a = await start(db, js)
      const b = await start(db, js)
      await waitFor(`http://127.0.0.1:${a.port}/health`, 200, a.running, 60_000)
      await waitFor(`http://127.0.0.1:${b.port}/health`, 200, b.running, 60_000)
      await waitUntil(
        async () => (await role(a.port)) === "leader" || (await role(b.port)) === "leader",
        20_000,
        "a leader"
      )
      const roles = [await role(a.port), await role(b.port)].sort()
      expect(roles).toEqual(["leader", "standby"])
      const [leader, standby] = (await role(a.port)) === "leader" ? [a, b] : [b, a]
      js.publish(Array.from({ length: 1000 }, (_, i) => post(i)))
      await waitUntil(
        async () => (await query<{ n: string }>(db, "SELECT count(*)::text AS n FROM outbox"))[0]?.n === "1000",
        60_000,
        "first 1000"
      )
      leader.running.child.kill("SIGKILL")
      const killedAt = Date.now()
      // events keep coming while nobody leads
      js.publish(Array.from({ length: 1000 }, (_, i) => post(1000 + i)))
      await waitUntil(async () => (await role(standby.port)) === "leader", 10_000, "takeover")
      expect(Date.now() - killedAt).toBeLessThan(10_000)
      await waitUntil(
        async () => (await query<{ n: string }>(db, "SELECT count(*)::text AS n FROM outbox"))[0]?.n === "2000",
        60_000,
        "all 2000",
        async () =>
          JSON.stringify({
            outbox: await query(db, "SELECT count(*)::text AS n, min(event_rkey), max(event_rkey) FROM outbox"),
            cursors: await query(db, "SELECT stream, cursor::text FROM cursors"),
            health: await (await fetch(`http://127.0.0.1:${standby.port}/health`)).text(),
            conns: js.connections.length,
            logs: standby.running.stdout().split("\n").filter((l) => l.includes("WARN") || l.includes("ERROR")).slice(
              0,
              5
            )
          })
      )
      standby.running.child.kill("SIGTERM")
      expect((await exitWithin(standby.running, 15_000)).code).toBe(0)
      await exitWithin(leader.running, 5_000)
      await js.close()
    },
    180_000
  )
})
