/**
 * A relay (`com.atproto.sync.subscribeRepos`) for intake tests: a WebSocket server on loopback,
 * closed with the scope (its clients terminated). The test decides what each connection gets.
 */
import { Effect } from "effect"
import type { IncomingMessage } from "node:http"
import { type WebSocket, WebSocketServer } from "ws"
import { testConfig } from "./stack.js"

/** Start the server; `onConnection` sees every socket and its upgrade request. */
export const relayServer = (onConnection: (socket: WebSocket, req: IncomingMessage) => void) =>
  Effect.map(
    Effect.acquireRelease(
      Effect.async<WebSocketServer>((resume) => {
        const server = new WebSocketServer({ host: "127.0.0.1", port: 0 })
        server.on("connection", onConnection)
        server.once("listening", () => resume(Effect.succeed(server)))
      }),
      (server) =>
        Effect.async<void>((resume) => {
          for (const c of server.clients) c.terminate()
          server.close(() => resume(Effect.void))
        })
    ),
    (server) => {
      const addr = server.address()
      return {
        port: typeof addr === "object" && addr !== null ? addr.port : 0,
        /** the relay drops every connection */
        dropAll: () => {
          for (const c of server.clients) c.terminate()
        }
      }
    }
  )

/** The configuration of a process reading that relay (insecure dev mode, for `ws://` on loopback). */
export const relayConfig = (port: number) =>
  testConfig({
    NODE_ENV: "test",
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    FIREHOSE_SOURCE: "relay",
    RELAY_URL: `ws://127.0.0.1:${port}`
  })
