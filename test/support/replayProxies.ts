/**
 * Proxies in front of a real atproto network (the devnet) that let an end-to-end test order what a
 * firehook process sees, without sleeps:
 * - {@link startRelayReplay}: a relay (`subscribeRepos`) that replays the upstream firehose of one
 *   repo from cursor 0 (its history, as a relay after a fresh start may), and forwards its frames
 *   only up to the seq the test releases;
 * - {@link startPdsGate}: a PLC directory and PDS in one (the DID documents it serves name it as the
 *   PDS), forwarding to the devnet, that holds the answers to a path until the test releases them.
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { WebSocket, WebSocketServer } from "ws"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { decodeRelayFrame } from "../../src/schemas/RelayFrame.js"

export interface ReplayFrame {
  readonly seq: bigint
  readonly bytes: Uint8Array
  readonly events: ReadonlyArray<StreamEvent>
}

export interface RelayReplay {
  /** `ws://127.0.0.1:<port>`: firehook's `RELAY_URL` */
  readonly url: string
  /** the upstream frames of the repo, in order, as they arrived */
  readonly frames: ReadonlyArray<ReplayFrame>
  /** forward the frames with a seq ≤ `upTo` (every frame, also later ones, when omitted) */
  readonly release: (upTo?: bigint) => void
  readonly close: () => Promise<void>
}

interface Downstream {
  readonly socket: WebSocket
  next: number
}

const FRAME_CONTEXT = { stream: "test", relay: "wss://relay.test", maxBytes: 5 * 1024 * 1024 }

/** The relay replaying `did`'s frames of the `upstream` firehose (`ws://…`) from cursor 0. */
export const startRelayReplay = (upstream: string, did: string): Promise<RelayReplay> =>
  new Promise((resolve, reject) => {
    const frames: Array<ReplayFrame> = []
    const downstream = new Set<Downstream>()
    let limit = -1n
    let all = false
    const pump = () => {
      for (const d of downstream) {
        for (let f = frames[d.next]; f !== undefined && (all || f.seq <= limit); f = frames[d.next]) {
          if (d.socket.readyState !== WebSocket.OPEN) break
          d.socket.send(f.bytes)
          d.next++
        }
      }
    }
    const source = new WebSocket(`${upstream}/xrpc/com.atproto.sync.subscribeRepos?cursor=0`)
    source.binaryType = "nodebuffer"
    source.on("message", (data: Buffer) => {
      const bytes = new Uint8Array(data)
      const decoded = decodeRelayFrame(bytes, FRAME_CONTEXT)
      if (decoded._tag === "Left" || decoded.right.kind !== "events") return
      const { seq, events } = decoded.right
      if (events.length === 0 || !events.every((e) => e.did === did)) return
      frames.push({ seq, bytes, events })
      pump()
    })
    source.on("error", reject)
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 })
    wss.on("connection", (socket: WebSocket, req: Http.IncomingMessage) => {
      const raw = new URL(req.url ?? "/", "ws://127.0.0.1").searchParams.get("cursor")
      const cursor = raw === null ? undefined : BigInt(raw)
      const next = cursor === undefined ? 0 : frames.findIndex((f) => f.seq > cursor)
      const d: Downstream = { socket, next: next < 0 ? frames.length : next }
      downstream.add(d)
      socket.on("close", () => downstream.delete(d))
      pump()
    })
    const opened = new Promise<void>((r) => source.once("open", () => r()))
    const listening = new Promise<void>((r) => wss.once("listening", () => r()))
    void Promise.all([opened, listening]).then(() => {
      const addr = wss.address() as AddressInfo
      resolve({
        url: `ws://127.0.0.1:${addr.port}`,
        frames,
        release: (upTo) => {
          if (upTo === undefined) all = true
          else limit = upTo
          pump()
        },
        close: () =>
          new Promise<void>((r) => {
            source.terminate()
            for (const d of downstream) d.socket.terminate()
            wss.close(() => r())
          })
      })
    })
  })

export interface PdsGate {
  /** `http://127.0.0.1:<port>`: firehook's `PLC_DIRECTORY_URL`, and the PDS its documents name */
  readonly url: string
  /** the paths of the PDS requests received, in order */
  readonly requests: Array<string>
  /** hold the answers to `path` until the returned function is called */
  readonly hold: (path: string) => () => void
  readonly close: () => Promise<void>
}

/** The PLC directory and PDS of the devnet, behind one gate. */
export const startPdsGate = (devnet: { readonly plc: string; readonly pds: string }): Promise<PdsGate> =>
  new Promise((resolve) => {
    const held = new Map<string, Promise<void>>()
    const requests: Array<string> = []
    let self = ""
    const answer = async (req: Http.IncomingMessage): Promise<{ status: number; type: string; body: Buffer }> => {
      const path = req.url ?? "/"
      if (path.startsWith("/did:")) {
        const res = await fetch(`${devnet.plc}${path}`)
        if (res.status !== 200) return { status: res.status, type: "application/json", body: Buffer.from("{}") }
        const doc = (await res.json()) as { service?: Array<{ id?: string; serviceEndpoint?: string }> }
        for (const s of doc.service ?? []) if (s.id?.endsWith("#atproto_pds") === true) s.serviceEndpoint = self
        return { status: 200, type: "application/json", body: Buffer.from(JSON.stringify(doc)) }
      }
      const pathname = new URL(path, "http://x").pathname
      requests.push(pathname)
      await held.get(pathname)
      const res = await fetch(`${devnet.pds}${path}`)
      return {
        status: res.status,
        type: res.headers.get("content-type") ?? "application/json",
        body: Buffer.from(await res.arrayBuffer())
      }
    }
    const server = Http.createServer((req, res) => {
      answer(req).then(
        (a) => {
          res.writeHead(a.status, { "content-type": a.type, "content-length": a.body.length })
          res.end(a.body)
        },
        () => {
          res.writeHead(502)
          res.end()
        }
      )
    })
    server.listen(0, "127.0.0.1", () => {
      self = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
      resolve({
        url: self,
        requests,
        hold: (path) => {
          let release: () => void = () => undefined
          held.set(path, new Promise<void>((r) => (release = r)))
          return () => {
            held.delete(path)
            release()
          }
        },
        close: () =>
          new Promise<void>((r) => {
            server.closeAllConnections()
            server.close(() => r())
          })
      })
    })
  })
