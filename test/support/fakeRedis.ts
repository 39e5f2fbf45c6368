/**
 * A fake Redis for the publisher's tests: a TCP server on 127.0.0.1 that parses RESP commands,
 * records them, and answers what a test says (or never answers).
 */
import { Effect, Option, Stream, SubscriptionRef } from "effect"
import * as Net from "node:net"
import * as Publisher from "../../src/services/delivery/Publisher.js"

export interface FakeState {
  readonly connections: number
  readonly closed: number
  readonly commands: ReadonlyArray<ReadonlyArray<string>>
}

export const asStrings = (reply: Publisher.RespReply): ReadonlyArray<string> =>
  reply._tag === "Array" && reply.value !== null
    ? reply.value.map((x) => (x._tag === "Bulk" && x.value !== null ? x.value : "?"))
    : []

/**
 * A fake Redis on 127.0.0.1: records every command; `answer` says what to write back (nothing:
 * the command hangs). A PING (the connection's access check when the URL has no password) is
 * answered `options.ping` (default `+PONG`) and not recorded. `stop` closes the listener and every connection; `start` listens again on
 * the same port.
 */
export const fakeRedis = (
  answer: (command: ReadonlyArray<string>) => string | undefined,
  options: { readonly ping?: string } = {}
) =>
  Effect.gen(function*() {
    const state = yield* SubscriptionRef.make<FakeState>({ connections: 0, closed: 0, commands: [] })
    const bump = (f: (s: FakeState) => FakeState) => Effect.runSync(SubscriptionRef.update(state, f))
    const sockets = new Set<Net.Socket>()
    let server: Net.Server | undefined = undefined
    const listen = (port: number) =>
      Effect.async<number>((resume) => {
        const s = Net.createServer((socket) => {
          sockets.add(socket)
          bump((x) => ({ ...x, connections: x.connections + 1 }))
          let buf = Buffer.alloc(0)
          socket.on("error", () => {})
          socket.on("close", () => {
            sockets.delete(socket)
            bump((x) => ({ ...x, closed: x.closed + 1 }))
          })
          socket.on("data", (d: Buffer) => {
            buf = Buffer.concat([buf, d])
            while (true) {
              const parsed = Publisher.parseReply(buf)
              if (parsed._tag !== "Done") break
              buf = buf.subarray(parsed.next)
              const command = asStrings(parsed.reply)
              if (command.length === 1 && command[0] === "PING") {
                socket.write(options.ping ?? "+PONG\r\n")
                continue
              }
              bump((x) => ({ ...x, commands: [...x.commands, command] }))
              const reply = answer(command)
              if (reply !== undefined) socket.write(reply)
            }
          })
        })
        server = s
        s.listen(port, "127.0.0.1", () => {
          const address = s.address()
          resume(Effect.succeed(typeof address === "object" && address !== null ? address.port : 0))
        })
      })
    const stop = Effect.async<void>((resume) => {
      for (const s of sockets) s.destroy()
      if (server === undefined) return resume(Effect.void)
      server.close(() => resume(Effect.void))
    })
    const port = yield* Effect.acquireRelease(listen(0), () => stop)
    const awaitState = (p: (s: FakeState) => boolean) =>
      state.changes.pipe(Stream.filter(p), Stream.runHead, Effect.map(Option.getOrThrow))
    return {
      port,
      url: `redis://127.0.0.1:${port}`,
      state: SubscriptionRef.get(state),
      awaitState,
      stop,
      start: Effect.asVoid(listen(port))
    }
  })
