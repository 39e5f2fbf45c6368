/**
 * Recovery in seconds after a crash (SPEC §4.1), as operators meet it: a real `bun src/main.ts`
 * is SIGKILLed while its deliveries are in flight (every row leased, a minute of lease left); a
 * restarted process delivers all of them within 10 s of its start, because the dead process's
 * liveness mark died with it.
 */
import * as Http from "node:http"
import type * as Net from "node:net"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, waitFor } from "../support/proc.js"

const OWNER = "did:plc:ownerownerownerownerowne"
const T0 = 1_750_000_000_000_000
const WH = "place.wisp.v2.wh"
const ROWS = 20

const res = e2eResources()
afterAll(() => res.cleanup())

/** A receiver that leaves every request unanswered while `hang` says so, else answers 200. */
const startReceiver = (hang: () => boolean) =>
  new Promise<{ url: string; hits: Map<string, number>; close: () => Promise<void> }>((resolve) => {
    const hits = new Map<string, number>()
    const sockets = new Set<Net.Socket>()
    const server = Http.createServer((req, res) => {
      req.resume()
      req.on("end", () => {
        const id = String(req.headers["webhook-id"])
        hits.set(id, (hits.get(id) ?? 0) + 1)
        if (hang()) return
        res.writeHead(200)
        res.end("ok")
      })
    })
    server.on("connection", (s: Net.Socket) => {
      sockets.add(s)
      s.on("close", () => sockets.delete(s))
    })
    server.listen(0, "127.0.0.1", () => {
      const addr = server.address()
      const port = typeof addr === "object" && addr !== null ? addr.port : 0
      resolve({
        url: `http://127.0.0.1:${port}/hook`,
        hits,
        close: () =>
          new Promise((done) => {
            for (const s of sockets) s.destroy()
            server.close(() => done())
          })
      })
    })
  })

const count = async (db: string, where: string) =>
  Number((await query<{ n: string }>(db, `SELECT count(*)::text AS n FROM outbox WHERE ${where}`))[0]?.n ?? "0")

describe("recovery after a crash", () => {
  it(
    "SIGKILL mid-delivery: a restarted process delivers every leased row within 10 s of its start",
    async () => {
      let hang = true
      const rx = await startReceiver(() => hang)
      const js = await startFakeJetstream()
      const db = await res.freshDb()
      const env = {
        DATABASE_URL: db,
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: js.url,
        FIREHOOK_ROLES: "intake,delivery",
        // one process that dies whole (delivery on its own core would leave the child running
        // after the parent's SIGKILL, to stop itself in order: test/e2e/delivery-process.test.ts)
        DELIVERY_PROCESS: "inline",
        // lease = max(60 s, timeout + 5 s) = 60 s
        DELIVERY_TIMEOUT_MS: "30000"
      }
      const first = await startDeployment(res.tempDir(), env)
      await waitFor(first.health, 200, first.running, 60_000)
      js.publish([
        commitFrame(OWNER, T0, WH, "hook", "create", {
          $type: WH,
          scope: { aturi: `at://${OWNER}/app.bsky.feed.post` },
          url: rx.url,
          createdAt: "2026-01-01T00:00:00Z"
        })
      ])
      js.publish(
        Array.from(
          { length: ROWS },
          (_, i) => commitFrame(OWNER, T0 + 1000 + i * 10, "app.bsky.feed.post", `p${i}`, "create")
        )
      )
      // every row claimed (leased for a minute), the first ones in flight at the receiver
      await waitUntil(async () => (await count(db, "status = 'leased'")) === ROWS, 30_000, "all rows leased")
      await waitUntil(() => rx.hits.size > 0, 30_000, "requests in flight")
      first.running.child.kill("SIGKILL")
      await exitWithin(first.running, 10_000)
      expect(await count(db, "status = 'leased' AND leased_until > now() + interval '30 seconds'")).toBe(ROWS)

      hang = false
      const second = await startDeployment(res.tempDir(), env)
      await waitFor(second.health, 200, second.running, 60_000)
      const startedAt = Date.now()
      await waitUntil(
        async () => (await count(db, "status = 'delivered'")) === ROWS,
        10_000,
        "all rows delivered within 10 s of the restart",
        async () => JSON.stringify(await query(db, "SELECT status, count(*)::int AS n FROM outbox GROUP BY status"))
      )
      expect(Date.now() - startedAt).toBeLessThan(10_000)
      second.running.child.kill("SIGTERM")
      expect((await exitWithin(second.running, 15_000)).code).toBe(0)
      await js.close()
      await rx.close()
    },
    180_000
  )
})
