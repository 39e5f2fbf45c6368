/**
 * A listener that cannot bind is one line naming its variable and address (Listener.ts, SPEC §6.1):
 * `HEALTH_PORT 127.0.0.1:3003 is in use (EADDRINUSE)`, not `startup failed (unexpected Error
 * EADDRINUSE listen)`. Under Bun (a child process), where `Bun.serve` throws.
 */
import { Option } from "effect"
import { spawnSync } from "node:child_process"
import * as Net from "node:net"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Listener from "../../src/services/platform/Listener.js"

const ROOT = Path.resolve(import.meta.dirname, "../..")
const BUN = Path.join(ROOT, "node_modules/.bin/bun")
const ENV = { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" }

const HEALTH = { hostVariable: "HEALTH_HOST", portVariable: "HEALTH_PORT" }
const nodeError = (code: string) => Object.assign(new Error(`${code}: some text`), { code, syscall: "listen" })

describe("Listener.describe", () => {
  it.each([
    ["EADDRINUSE", "127.0.0.1", 3003, "HEALTH_PORT 127.0.0.1:3003 is in use (EADDRINUSE)"],
    [
      "EADDRNOTAVAIL",
      "192.0.2.1",
      3003,
      "HEALTH_HOST 192.0.2.1:3003 is not an address of this machine (EADDRNOTAVAIL)"
    ],
    ["EACCES", "::1", 80, "HEALTH_PORT [::1]:80 may not be listened on by this user (EACCES)"]
  ])("%s", (code, host, port, line) => {
    const named = Listener.describe(nodeError(code), { ...HEALTH, host, port })
    expect(Option.map(named, (e) => e.message)).toEqual(Option.some(line))
  })

  it("a bind error wrapped as a failure's cause (NodeHttpServer's ServeError) is named too", () => {
    const wrapped = { _tag: "ServeError", cause: nodeError("EADDRINUSE") }
    expect(Option.map(Listener.describe(wrapped, { ...HEALTH, host: "0.0.0.0", port: 1 }), (e) => e.message))
      .toEqual(Option.some("HEALTH_PORT 0.0.0.0:1 is in use (EADDRINUSE)"))
  })

  it("any other error is not a bind error", () => {
    for (const e of [nodeError("ECONNRESET"), new Error("EADDRINUSE"), { code: "EADDRINUSE x" }, undefined, "EACCES"]) {
      expect(Option.isNone(Listener.describe(e, { ...HEALTH, host: "127.0.0.1", port: 1 }))).toBe(true)
    }
  })
})

describe("Listener.logAddress", () => {
  it("writes a URL's form: an IPv6 host in brackets, IPv4 and names as they are, a socket path", () => {
    expect(Listener.logAddress({ _tag: "TcpAddress", hostname: "::1", port: 3003 })).toBe("http://[::1]:3003")
    expect(Listener.logAddress({ _tag: "TcpAddress", hostname: "fe80::1%eth0", port: 80 })).toBe(
      "http://[fe80::1%eth0]:80"
    )
    expect(Listener.logAddress({ _tag: "TcpAddress", hostname: "127.0.0.1", port: 3003 })).toBe("http://127.0.0.1:3003")
    expect(Listener.logAddress({ _tag: "TcpAddress", hostname: "localhost", port: 1 })).toBe("http://localhost:1")
    expect(Listener.logAddress({ _tag: "UnixAddress", path: "/run/firehook.sock" })).toBe("unix:///run/firehook.sock")
  })
})

describe("Listener.guard under Bun", () => {
  let busy: Net.Server
  let port = 0
  beforeAll(async () => {
    busy = Net.createServer()
    await new Promise<void>((resolve) => busy.listen(0, "127.0.0.1", resolve))
    const address = busy.address()
    if (address === null || typeof address === "string") return expect.fail("no TCP address")
    port = address.port
  })
  afterAll(() => new Promise<void>((resolve) => busy.close(() => resolve())))

  const child = (host: string, p: number) => {
    const r = spawnSync(BUN, ["test/platform/listener-child.ts", host, String(p)], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 60_000,
      env: ENV
    })
    expect(r.stderr).toBe("")
    return r.stdout
  }

  it("a port in use names HEALTH_PORT and the address", () => {
    expect(child("127.0.0.1", port)).toBe(
      `ListenerUnavailable HEALTH_PORT 127.0.0.1:${port} is in use (EADDRINUSE)\n`
    )
  }, 90_000)

  it("an address not on this machine names HEALTH_HOST", () => {
    // TEST-NET-1 (RFC 5737): never assigned to an interface
    expect(child("192.0.2.1", port)).toBe(
      `ListenerUnavailable HEALTH_HOST 192.0.2.1:${port} is not an address of this machine (EADDRNOTAVAIL)\n`
    )
  }, 90_000)

  it("an IPv6 zone that names no interface names HEALTH_HOST", () => {
    expect(child("fe80::1%nosuch0", port)).toBe(
      `ListenerUnavailable HEALTH_HOST [fe80::1%nosuch0]:${port} cannot be listened on (a link-local address without its zone, %eth0, or a zone that names no interface?) (EINVAL)\n`
    )
  }, 90_000)

  // HEALTH_HOST=fe80::1 passes the config (an IPv6 literal), but Linux binds a link-local address
  // only with its zone: the line says so, where it spoke only of a zone the operator never gave
  it("a link-local address without its zone names HEALTH_HOST and the missing zone", () => {
    expect(child("fe80::1", port)).toBe(
      `ListenerUnavailable HEALTH_HOST [fe80::1]:${port} cannot be listened on (a link-local address without its zone, %eth0, or a zone that names no interface?) (EINVAL)\n`
    )
  }, 90_000)

  it("a free port listens", () => {
    expect(child("127.0.0.1", 0)).toBe("listening\n")
  }, 90_000)
})
