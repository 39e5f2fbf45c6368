/**
 * Ports.freeLoopbackPort: a port for a listener another process binds a moment later comes from
 * below the kernel's ephemeral range (where listeners on port 0 and outbound connections never get
 * it), and is free.
 */
import { Effect } from "effect"
import * as Fs from "node:fs"
import * as Net from "node:net"
import { describe, expect, it } from "vitest"
import { freeLoopbackPort } from "../../src/services/platform/Ports.js"

const ephemeralLow = (): number => {
  try {
    return Number(Fs.readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0])
  } catch {
    return 32_768
  }
}

const listen = (port: number) =>
  new Promise<Net.Server>((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(port, "127.0.0.1", () => resolve(server))
  })

describe("freeLoopbackPort", () => {
  it("is below the ephemeral range, above 1024, and can be listened on", async () => {
    const low = ephemeralLow()
    for (let i = 0; i < 20; i++) {
      const port = await Effect.runPromise(freeLoopbackPort)
      expect(port).toBeGreaterThan(1024)
      expect(port).toBeLessThan(low)
      const server = await listen(port)
      await new Promise<void>((r) => server.close(() => r()))
    }
  })

  it("a port taken by a listener is not handed out while it is held", async () => {
    const held: Array<Net.Server> = []
    try {
      const ports = new Set<number>()
      for (let i = 0; i < 20; i++) {
        const port = await Effect.runPromise(freeLoopbackPort)
        expect(ports.has(port)).toBe(false)
        ports.add(port)
        held.push(await listen(port))
      }
    } finally {
      await Promise.all(held.map((s) => new Promise<void>((r) => s.close(() => r()))))
    }
  })
})
