/**
 * The service's shutdown with a tail whose client does not answer the close (frozen, or half
 * open), on Node's HTTP server (embedding): the tail writes its 1001, and after
 * `TailMethods.SHUTDOWN_GRACE` (1 s) ends the socket. Before, nothing ended it: the API listener's
 * close waited for every upgraded socket, so for `ws`'s own close timer, 30 s.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Exit, Layer, Scope } from "effect"
import * as Net from "node:net"
import * as TailMethods from "../../src/services/api/TailMethods.js"
import { apiLayer, mint, newOwner, serverPort } from "./support.js"
import { until } from "./tailClient.js"

const NSID = "dev.firehook.webhook.subscribeDeliveries"
const HIGH = { limit: 1_000_000, perMs: 60_000 }
/** Well under `ws`'s 30 s close timer, and over the grace with the rest of the API's shutdown. */
const BOUND = Duration.seconds(15)

/** A client that completes the handshake, then reads nothing more and never answers (paused). */
const frozenClient = (port: number, token: string) =>
  Effect.async<{
    readonly socket: Net.Socket
    readonly closed: () => boolean
    readonly status: string
    /** what came after the handshake, once the socket is resumed */
    readonly after: () => Buffer
  }>((resume) => {
    const socket = Net.connect(port, "127.0.0.1")
    let text = ""
    let closed = false
    const after: Array<Buffer> = []
    socket.on("close", () => (closed = true))
    const onData = (d: Buffer) => {
      text += d.toString("latin1")
      if (text.includes("\r\n\r\n")) {
        socket.off("data", onData)
        socket.pause()
        socket.on("data", (more: Buffer) => after.push(more))
        resume(Effect.succeed({
          socket,
          closed: () => closed,
          status: text.split("\r\n")[0] ?? "",
          after: () => Buffer.concat(after)
        }))
      }
    }
    socket.on("data", onData)
    socket.on("error", () => {})
    socket.write(
      `GET /xrpc/${NSID} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\n` +
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n" +
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    return Effect.sync(() => socket.destroy())
  })

describe("the live tail at shutdown, with a client that does not answer the close", () => {
  it.live(
    "the socket is ended after the grace and the API listener closes, well before ws's 30 s",
    () =>
      Effect.gen(function*() {
        const scope = yield* Scope.make()
        const context = yield* Layer.buildWithScope(apiLayer({ api: { limits: { callsPerCaller: HIGH } } }), scope)
        const owner = yield* newOwner()
        const token = yield* mint(owner, NSID)
        const client = yield* frozenClient(yield* Effect.provide(serverPort, context), token)
        expect(client.status).toBe("HTTP/1.1 101 Switching Protocols")
        const started = yield* Clock.currentTimeMillis
        const closed = yield* Scope.close(scope, Exit.void).pipe(
          Effect.as(true),
          Effect.timeoutTo({ duration: BOUND, onSuccess: (b) => b, onTimeout: () => false })
        )
        const ms = (yield* Clock.currentTimeMillis) - started
        expect(closed, `listener still open after ${ms} ms`).toBe(true)
        expect(ms).toBeGreaterThanOrEqual(Duration.toMillis(TailMethods.SHUTDOWN_GRACE) - 50)
        // the client reads at last: the service's 1001 close frame, then the end of the socket
        client.socket.resume()
        yield* until("the end of the socket", client.closed)
        const close = client.after()
        expect([close[0], close.readUInt16BE(2), close.subarray(4).toString("utf8")]).toEqual([
          0x88,
          TailMethods.SHUTDOWN_CLOSE.code,
          TailMethods.SHUTDOWN_CLOSE.reason
        ])
      }),
    60_000
  )
})
