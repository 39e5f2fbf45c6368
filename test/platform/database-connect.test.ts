/**
 * Database.layerUrl against a server that accepts the TCP connection and never answers (a frozen
 * database or proxy): the startup line names the cause, `timeout`, within the connect timeout.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Redacted } from "effect"
import * as Net from "node:net"
import type { AddressInfo } from "node:net"
import * as Database from "../../src/services/platform/Database.js"

/** A loopback TCP server that accepts connections and never writes, for the test's scope. */
const frozenServer = Effect.acquireRelease(
  Effect.async<{ readonly server: Net.Server; readonly sockets: Set<Net.Socket>; readonly port: number }>((resume) => {
    const sockets = new Set<Net.Socket>()
    const server = Net.createServer((socket) => {
      sockets.add(socket)
      socket.on("close", () => sockets.delete(socket))
    })
    server.listen(
      0,
      "127.0.0.1",
      () => resume(Effect.succeed({ server, sockets, port: (server.address() as AddressInfo).port }))
    )
  }),
  ({ server, sockets }) =>
    Effect.async<void>((resume) => {
      for (const s of sockets) s.destroy()
      server.close(() => resume(Effect.void))
    })
)

describe("Database connect", () => {
  it.scopedLive(
    "a database that never answers: 'could not connect (timeout)', not '(unknown error)'",
    () =>
      Effect.gen(function*() {
        const { port } = yield* frozenServer
        const url = Redacted.make(`postgresql://firehook:pw@127.0.0.1:${port}/none`)
        const exit = yield* Effect.exit(Layer.build(Database.layerUrl(url)).pipe(Effect.scoped))
        expect(Exit.isFailure(exit)).toBe(true)
        if (Exit.isFailure(exit)) {
          const text = JSON.stringify(exit.cause)
          expect(text).toContain("could not connect (timeout)")
          expect(text).not.toContain("pw")
        }
      }),
    { timeout: 30_000 }
  )
})
