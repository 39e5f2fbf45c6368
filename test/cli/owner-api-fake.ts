/**
 * A tiny XRPC server on a real HTTP socket that answers `dev.firehook.webhook.*` as the lexicons
 * say, for the owners' CLI tests of methods the service does not serve yet. It checks the service
 * token's claims (`aud` = its DID, `lxm` = the method; the signature is the real service's business,
 * tested in test/api) and records every call. Its answers are decoded with the contracts' Schemas
 * here, so a fixture that drifts from the lexicon fails the test instead of testing nothing.
 * `subscribeDeliveries` is a WebSocket (`ws`): the test decides what frames it sends.
 */
import * as Cbor from "@atcute/cbor"
import { Schema } from "effect"
import * as Http from "node:http"
import type * as Net from "node:net"
import { type WebSocket, WebSocketServer } from "ws"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"
import type { XrpcContract } from "../../src/schemas/XrpcContract.js"

export const FAKE_DID = "did:web:fake-firehook.test"

export interface FakeCall {
  readonly nsid: string
  readonly method: string
  readonly query: Record<string, string>
  readonly body: unknown
  readonly iss: string
  readonly authorization: string
}

export type Answer = { readonly status: number; readonly body: unknown }

export interface FakeXrpc {
  readonly url: string
  readonly calls: Array<FakeCall>
  /** answers by NSID (a function of the call); unset → 501 */
  readonly answers: Map<string, (call: FakeCall) => Answer>
  /** what a subscription connection does once open */
  onSubscribe: (ws: WebSocket, call: FakeCall) => void
  /** refuse the WebSocket upgrade (and the probe) with this answer */
  refuseUpgrade: Answer | undefined
  readonly sockets: Set<WebSocket>
  readonly close: () => Promise<void>
}

/** A fixture checked against the method's output Schema. */
export const checked = <P, I, O>(contract: XrpcContract<P, I, O>, value: unknown): unknown => {
  Schema.decodeUnknownSync(contract.output)(value)
  return value
}

const claims = (authorization: string | undefined): Record<string, unknown> | undefined => {
  const m = /^Bearer ([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)\.([A-Za-z0-9_-]+)$/.exec(authorization ?? "")
  if (m === null) return undefined
  try {
    return JSON.parse(Buffer.from(m[2] ?? "", "base64url").toString("utf8")) as Record<string, unknown>
  } catch {
    return undefined
  }
}

const authorize = (nsid: string, authorization: string | undefined): Answer | { iss: string } => {
  const c = claims(authorization)
  if (c === undefined) return { status: 401, body: { error: "AuthenticationRequired", message: "no token" } }
  if (c["aud"] !== FAKE_DID || c["lxm"] !== nsid || typeof c["iss"] !== "string") {
    return { status: 401, body: { error: "InvalidToken", message: "token not for this call" } }
  }
  const exp = typeof c["exp"] === "number" ? c["exp"] : 0
  const now = Math.floor(Date.now() / 1000)
  if (exp < now || exp > now + 120) return { status: 401, body: { error: "InvalidToken", message: "bad exp" } }
  return { iss: c["iss"] }
}

/** A binary atproto event-stream frame: header `{op, t}` then the body, both DAG-CBOR. */
export const cborFrame = (header: Record<string, unknown>, body: Record<string, unknown>): Buffer =>
  Buffer.concat([Cbor.encode(header), Cbor.encode(body)])

export const startFake = (): Promise<FakeXrpc> =>
  new Promise((resolve) => {
    const calls: Array<FakeCall> = []
    const answers = new Map<string, (call: FakeCall) => Answer>()
    const sockets = new Set<WebSocket>()
    const conns = new Set<Net.Socket>()
    const wss = new WebSocketServer({ noServer: true })
    const callOf = (req: Http.IncomingMessage, body: unknown, iss: string): FakeCall => {
      const u = new URL(req.url ?? "/", "http://fake")
      return {
        nsid: u.pathname.slice("/xrpc/".length),
        method: req.method ?? "",
        query: Object.fromEntries(u.searchParams),
        body,
        iss,
        authorization: req.headers.authorization ?? ""
      }
    }
    const send = (res: Http.ServerResponse, a: Answer) =>
      res.writeHead(a.status, { "content-type": "application/json" }).end(JSON.stringify(a.body))
    const server = Http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        const u = new URL(req.url ?? "/", "http://fake")
        if (!u.pathname.startsWith("/xrpc/")) return send(res, { status: 404, body: { error: "NotFound" } })
        const nsid = u.pathname.slice("/xrpc/".length)
        if (nsid === WebhookLexicon.subscribeDeliveries.nsid && fake.refuseUpgrade !== undefined) {
          return send(res, fake.refuseUpgrade)
        }
        const auth = authorize(nsid, req.headers.authorization)
        if ("status" in auth) return send(res, auth)
        const text = Buffer.concat(chunks).toString("utf8")
        const call = callOf(req, text === "" ? undefined : JSON.parse(text), auth.iss)
        calls.push(call)
        const answer = answers.get(nsid)
        send(res, answer === undefined ? { status: 501, body: { error: "MethodNotImplemented" } } : answer(call))
      })
    })
    server.on("connection", (s: Net.Socket) => {
      conns.add(s)
      s.on("close", () => conns.delete(s))
    })
    server.on("upgrade", (req: Http.IncomingMessage, socket: Net.Socket, head: Buffer) => {
      const nsid = new URL(req.url ?? "/", "http://fake").pathname.slice("/xrpc/".length)
      const auth = fake.refuseUpgrade ?? authorize(nsid, req.headers.authorization)
      if ("status" in auth) {
        const body = JSON.stringify(auth.body)
        socket.end(
          `HTTP/1.1 ${auth.status} Refused\r\ncontent-type: application/json\r\ncontent-length: ${
            Buffer.byteLength(body)
          }\r\nconnection: close\r\n\r\n${body}`
        )
        return
      }
      const call = callOf(req, undefined, auth.iss)
      calls.push(call)
      wss.handleUpgrade(req, socket, head, (ws) => {
        sockets.add(ws)
        ws.on("close", () => sockets.delete(ws))
        fake.onSubscribe(ws, call)
      })
    })
    const fake: FakeXrpc = {
      url: "",
      calls,
      answers,
      onSubscribe: (ws) => ws.close(1000),
      refuseUpgrade: undefined,
      sockets,
      close: () =>
        new Promise<void>((r) => {
          for (const ws of sockets) ws.terminate()
          for (const s of conns) s.destroy()
          wss.close()
          server.close(() => r())
        })
    }
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      ;(fake as { url: string }).url = `http://127.0.0.1:${port}`
      resolve(fake)
    })
  })
