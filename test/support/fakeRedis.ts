/**
 * A fake Redis for the publisher's tests: a TCP (or TLS) server on 127.0.0.1 that parses RESP
 * commands, records them, and answers what a test says (or never answers).
 */
import { Effect, Option, Stream, SubscriptionRef } from "effect"
import * as Net from "node:net"
import * as Tls from "node:tls"
import * as Publisher from "../../src/services/delivery/Publisher.js"

export interface FakeState {
  /** TCP connections accepted (with TLS: before any handshake) */
  readonly accepted: number
  /** connections that reached RESP (with TLS: handshake completed) */
  readonly connections: number
  readonly closed: number
  readonly commands: ReadonlyArray<ReadonlyArray<string>>
  /** TLS: the server names (SNI) of the ClientHellos received, including refused handshakes */
  readonly servernames: ReadonlyArray<string>
  /** TLS: handshakes that failed on the server's side (the client refused the certificate, …) */
  readonly tlsErrors: number
}

export const asStrings = (reply: Publisher.RespReply): ReadonlyArray<string> =>
  reply._tag === "Array" && reply.value !== null
    ? reply.value.map((x) => (x._tag === "Bulk" && x.value !== null ? x.value : "?"))
    : []

/**
 * A fake Redis on 127.0.0.1: records every command; `answer` says what to write back (nothing:
 * the command hangs). A PING (the connection's access check when the URL has no password) is
 * answered `options.ping` (default `+PONG`) and not recorded. `stop` closes the listener and every connection; `start` listens again on
 * the same port. With `options.tls` (a key and certificate in PEM) it speaks RESP over TLS, and
 * records the SNI of every ClientHello.
 */
export const fakeRedis = (
  answer: (command: ReadonlyArray<string>) => string | undefined,
  options: { readonly ping?: string; readonly tls?: { readonly key: string; readonly cert: string } } = {}
) =>
  Effect.gen(function*() {
    const state = yield* SubscriptionRef.make<FakeState>({
      accepted: 0,
      connections: 0,
      closed: 0,
      commands: [],
      servernames: [],
      tlsErrors: 0
    })
    const bump = (f: (s: FakeState) => FakeState) => Effect.runSync(SubscriptionRef.update(state, f))
    const sockets = new Set<Net.Socket>()
    let server: Net.Server | undefined = undefined
    const listen = (port: number) =>
      Effect.async<number>((resume) => {
        const onSocket = (socket: Net.Socket) => {
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
        }
        const tls = options.tls
        const s = tls === undefined
          ? Net.createServer(onSocket)
          : Tls.createServer({
            key: tls.key,
            cert: tls.cert,
            // called for a ClientHello that names a server; no context given: the default one
            SNICallback: (name, done) => {
              bump((x) => ({ ...x, servernames: [...x.servernames, name] }))
              done(null, undefined)
            }
          }, onSocket)
        s.on("connection", (raw: Net.Socket) => {
          bump((x) => ({ ...x, accepted: x.accepted + 1 }))
          if (tls !== undefined) {
            sockets.add(raw)
            raw.on("close", () => sockets.delete(raw))
          }
        })
        s.on("tlsClientError", () => bump((x) => ({ ...x, tlsErrors: x.tlsErrors + 1 })))
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
      url: `${options.tls === undefined ? "redis" : "rediss"}://127.0.0.1:${port}`,
      state: SubscriptionRef.get(state),
      awaitState,
      stop,
      start: Effect.asVoid(listen(port))
    }
  })
