/**
 * Readiness follows the database in every process (DatabaseHealth.ts, the audit of 6 December
 * 2026): an api-only process (`bun src/main.ts`, `FIREHOOK_ROLES=api`) whose database freezes (a TCP
 * proxy that stops forwarding, as a SIGSTOPped server does) answers `/health` 503 within seconds,
 * with `database.reachable` false, and 200 again once the database answers. Before, an api replica
 * stayed ready through the whole outage while every call answered 503 `ServiceUnavailable`.
 */
import * as Net from "node:net"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, startDeployment, waitUntil } from "../support/e2e.js"
import { exitWithin, freePort, waitFor } from "../support/proc.js"

const res = e2eResources()
afterAll(() => res.cleanup())

/** A TCP proxy to `target` whose forwarding can be frozen (sockets paused, new ones held) and thawed. */
const freezableProxy = async (target: { host: string; port: number }) => {
  const pairs = new Set<readonly [Net.Socket, Net.Socket]>()
  let frozen = false
  const server = Net.createServer((client) => {
    const upstream = Net.connect(target)
    const pair = [client, upstream] as const
    pairs.add(pair)
    client.on("data", (d) => upstream.write(d))
    upstream.on("data", (d) => client.write(d))
    const end = () => {
      pairs.delete(pair)
      client.destroy()
      upstream.destroy()
    }
    client.on("close", end).on("error", end)
    upstream.on("close", end).on("error", end)
    if (frozen) { for (const s of pair) s.pause() }
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const address = server.address()
  if (address === null || typeof address === "string") throw new Error("no proxy port")
  return {
    port: address.port,
    freeze: () => {
      frozen = true
      for (const pair of pairs) for (const s of pair) s.pause()
    },
    thaw: () => {
      frozen = false
      for (const pair of pairs) for (const s of pair) s.resume()
    },
    close: () => {
      for (const [a, b] of pairs) {
        a.destroy()
        b.destroy()
      }
      return new Promise<void>((resolve) => server.close(() => resolve()))
    }
  }
}

const healthOf = async (url: string) => {
  const r = await fetch(url, { signal: AbortSignal.timeout(2000) })
  return { status: r.status, body: (await r.json()) as Record<string, unknown> }
}

describe("readiness follows the database", () => {
  it("an api-only process turns 503 while its database is frozen, and 200 once it answers again", async () => {
    const db = new URL(await res.freshDb())
    const proxy = await freezableProxy({ host: db.hostname, port: Number(db.port === "" ? 5432 : db.port) })
    try {
      const viaProxy = new URL(db.href)
      viaProxy.hostname = "127.0.0.1"
      viaProxy.port = String(proxy.port)
      const d = await startDeployment(res.tempDir(), {
        DATABASE_URL: viaProxy.href,
        NODE_ENV: "test",
        FIREHOOK_ROLES: "api",
        API_PORT: String(await freePort())
      })
      try {
        await waitFor(d.health, 200, d.running, 60_000)
        expect((await healthOf(d.health)).body["database"]).toEqual({ reachable: true })
        proxy.freeze()
        const frozenAt = Date.now()
        await waitUntil(async () => (await healthOf(d.health)).status === 503, 30_000, "503 while frozen")
        // the 6 s window plus one ping's bound, on a loaded machine
        expect(Date.now() - frozenAt).toBeLessThan(20_000)
        expect((await healthOf(d.health)).body["database"]).toEqual({ reachable: false })
        proxy.thaw()
        await waitUntil(async () => (await healthOf(d.health)).status === 200, 30_000, "200 once thawed")
        expect((await healthOf(d.health)).body["database"]).toEqual({ reachable: true })
      } finally {
        proxy.thaw()
        d.running.child.kill("SIGTERM")
      }
      expect((await exitWithin(d.running, 30_000)).code).toBe(0)
    } finally {
      await proxy.close()
    }
  }, 180_000)
})
