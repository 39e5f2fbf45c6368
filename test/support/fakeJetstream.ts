/**
 * A local Jetstream: a WebSocket server on 127.0.0.1 that honours `requireHello`, `cursor` and the
 * `options_update` filters (wantedCollections, wantedDids), streaming a scripted, growing log of
 * frames in time order. Used by intake tests, end-to-end tests and the intake benchmark.
 */
import type { IncomingMessage } from "node:http"
import { type WebSocket, WebSocketServer } from "ws"

export interface LogEntry {
  readonly timeUs: number
  readonly did: string
  readonly collection: string | undefined
  /**
   * an `identity` or `account` frame: delivered whatever the `wantedCollections` (still gated by
   * `wantedDids`), as Jetstream does (shared/reference/atproto.md)
   */
  readonly kind?: "identity" | "account"
  /** the exact frame text (may be malformed on purpose) */
  readonly text: string
}

export interface Connection {
  readonly url: URL
  readonly cursor: bigint | undefined
  readonly options: Array<Record<string, unknown>>
  readonly socket: WebSocket
}

export interface FakeJetstream {
  readonly url: string
  readonly connections: Array<Connection>
  /** append frames to the log and push them to matching live connections */
  readonly publish: (entries: ReadonlyArray<LogEntry>) => void
  /** close every live connection */
  readonly dropAll: () => void
  readonly close: () => Promise<void>
  /** stop sending live frames (they stay in the log for replays) */
  paused: boolean
}

const B32 = "234567abcdefghijklmnopqrstuvwxyz"
/** A TID for a time in µs (clock id 0). */
export const tidAt = (timeUs: number): string => {
  let v = BigInt(timeUs) << 10n
  let s = ""
  for (let i = 0; i < 13; i++) {
    s = B32[Number(v & 31n)] + s
    v >>= 5n
  }
  return s
}

export const commitFrame = (
  did: string,
  timeUs: number,
  collection: string,
  rkey: string,
  operation: "create" | "update" | "delete",
  record?: unknown
): LogEntry => {
  const commit: Record<string, unknown> = { rev: tidAt(timeUs), operation, collection, rkey }
  if (operation !== "delete") {
    commit["record"] = record ?? { $type: collection, text: "hello", createdAt: "2026-01-01T00:00:00Z" }
    commit["cid"] = "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
  }
  return { timeUs, did, collection, text: JSON.stringify({ did, time_us: timeUs, kind: "commit", commit }) }
}

/** A Jetstream `account` frame: `{kind: "account", account: {active, status?, did, seq, time}}`. */
export const accountFrame = (did: string, timeUs: number, active: boolean, status?: string): LogEntry => ({
  timeUs,
  did,
  collection: undefined,
  kind: "account",
  text: JSON.stringify({
    did,
    time_us: timeUs,
    kind: "account",
    account: {
      active,
      ...(status === undefined ? {} : { status }),
      did,
      seq: Math.floor(timeUs / 1000),
      time: new Date(Math.floor(timeUs / 1000)).toISOString()
    }
  })
})

const wants = (c: Connection, e: LogEntry): boolean => {
  const opts = c.options.at(-1)
  if (opts === undefined) return false
  const cols = opts["wantedCollections"]
  const dids = opts["wantedDids"]
  if (
    e.kind === undefined && Array.isArray(cols) && cols.length > 0 &&
    (e.collection === undefined || !cols.includes(e.collection))
  ) {
    return false
  }
  if (Array.isArray(dids) && dids.length > 0 && !dids.includes(e.did)) return false
  return true
}

export const startFakeJetstream = (): Promise<FakeJetstream> =>
  new Promise((resolve) => {
    const log: Array<LogEntry> = []
    const connections: Array<Connection> = []
    const live = new Set<Connection>()
    const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 })
    const fake: FakeJetstream = {
      url: "",
      connections,
      paused: false,
      publish: (entries) => {
        for (const e of entries) log.push(e)
        if (fake.paused) return
        for (const c of live) {
          if (c.options.length === 0) continue
          for (const e of entries) if (wants(c, e) && c.socket.readyState === 1) c.socket.send(e.text)
        }
      },
      dropAll: () => {
        for (const c of live) c.socket.terminate()
      },
      close: () =>
        new Promise<void>((r) => {
          for (const c of live) c.socket.terminate()
          wss.close(() => r())
        })
    }
    wss.on("connection", (socket: WebSocket, req: IncomingMessage) => {
      const url = new URL(req.url ?? "/", "ws://127.0.0.1")
      const raw = url.searchParams.get("cursor")
      const conn: Connection = { url, cursor: raw === null ? undefined : BigInt(raw), options: [], socket }
      connections.push(conn)
      live.add(conn)
      socket.on("close", () => live.delete(conn))
      socket.on("message", (data) => {
        const msg: unknown = JSON.parse(String(data))
        if (typeof msg !== "object" || msg === null || !("type" in msg) || msg.type !== "options_update") return
        const first = conn.options.length === 0
        conn.options.push(("payload" in msg ? msg.payload : {}) as Record<string, unknown>)
        if (first && conn.cursor !== undefined) {
          // replay the retained log from the cursor (inclusive), then go live
          for (const e of log) if (BigInt(e.timeUs) >= (conn.cursor ?? 0n) && wants(conn, e)) socket.send(e.text)
        }
      })
    })
    wss.once("listening", () => {
      const addr = wss.address()
      const port = typeof addr === "object" && addr !== null ? addr.port : 0
      Object.assign(fake, { url: `ws://127.0.0.1:${port}/subscribe` })
      resolve(fake)
    })
  })
