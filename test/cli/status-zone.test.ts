/**
 * `firehook status` with a link-local HEALTH_HOST (`fe80::…%eth0`, the one kind of address that
 * needs an IPv6 zone, docs/decisions.md): the CLI asks /health over a socket given the zoned
 * address as it is. Before, it asked with `fetch`, whose URLs cannot carry a zone, so such a
 * service was always "not reachable". Run under Bun (the CLI as operators run it), against a
 * server on the first link-local address of this machine's interfaces.
 *
 * A machine without any link-local IPv6 address (IPv6 turned off, as in some containers) cannot
 * listen on one: there the test checks only that a zoned address nothing answers at is named as
 * given and said to be not reachable.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Db from "../support/db.js"
import { freePort, runCli } from "../support/proc.js"

/** `fe80::…%<interface>` of this machine, or undefined when it has none. */
const linkLocal = (): string | undefined => {
  for (const [name, addresses] of Object.entries(Os.networkInterfaces())) {
    const a = addresses?.find((x) => x.family === "IPv6" && x.address.toLowerCase().startsWith("fe80:"))
    if (a !== undefined) return `${a.address.split("%")[0]}%${name}`
  }
  return undefined
}

const HEALTH = { status: "ok", phase: "live" }

/** A /health server on `host` (port of the system's choosing), closed with the scope. */
const healthServer = (host: string) =>
  Effect.acquireRelease(
    Effect.async<Http.Server & { readonly port: number }>((resume) => {
      const server = Http.createServer((req, res) => {
        res.writeHead(req.url === "/health" ? 200 : 404, { "content-type": "application/json" })
        res.end(JSON.stringify(HEALTH))
      })
      server.listen(0, host, () =>
        resume(Effect.succeed(Object.assign(server, { port: (server.address() as AddressInfo).port }))))
    }),
    (server) =>
      Effect.async<void>((resume) =>
        void server.close(() => resume(Effect.void))
      )
  )

const status = (env: Record<string, string>) =>
  Effect.promise(() => runCli(["status", "--json"], env)).pipe(
    Effect.map((r) => {
      expect(r.code, r.stderr).toBe(0)
      return (JSON.parse(r.stdout) as { service: unknown }).service
    })
  )

describe("firehook status with a zoned HEALTH_HOST", () => {
  it.scopedLive("asks /health at the link-local address with its zone", () =>
    Effect.gen(function*() {
      const db = yield* Db.freshDatabase
      const url = Redacted.value(db.url)
      const host = linkLocal()
      if (host === undefined) {
        const port = yield* Effect.promise(freePort)
        expect(yield* status({ DATABASE_URL: url, HEALTH_HOST: "fe80::1%lo", HEALTH_PORT: String(port) })).toEqual({
          reachable: false,
          address: `[fe80::1%lo]:${port}`
        })
        return
      }
      const server = yield* healthServer(host)
      expect(yield* status({ DATABASE_URL: url, HEALTH_HOST: host, HEALTH_PORT: String(server.port) })).toEqual({
        reachable: true,
        address: `[${host}]:${server.port}`,
        httpStatus: 200,
        ready: true,
        health: HEALTH
      })
    }), { timeout: 60_000 })
})

describe("firehook status while the database cannot be reached", () => {
  it.scopedLive(
    "prints what the service says first, then fails with the database's one line",
    () =>
      Effect.gen(function*() {
        const server = yield* healthServer("127.0.0.1")
        const closed = yield* Effect.promise(freePort)
        const r = yield* Effect.promise(() =>
          runCli(["status"], {
            DATABASE_URL: `postgresql://postgres@127.0.0.1:${closed}/postgres`,
            HEALTH_HOST: "127.0.0.1",
            HEALTH_PORT: String(server.port)
          })
        )
        expect(r.code).toBe(1)
        expect(r.stdout).toMatch(
          new RegExp(`^service +127\\.0\\.0\\.1:${server.port} +status ok +ready yes +phase live\n$`)
        )
        expect(r.stderr).toMatch(/^firehook: database: could not connect/)
      }),
    { timeout: 60_000 }
  )
})
