/**
 * A webhook receiver on 127.0.0.1 for end-to-end tests of several processes: per delivery id
 * (`webhook-id`, or `Idempotency-Key` on unsigned requests) it
 * counts requests and the most requests in flight at once (a request is in flight from its first
 * byte until it is answered or its connection closes, e.g. when the sending process is killed).
 * `answer` decides each response (status, after how long).
 */
import * as Http from "node:http"
import type * as Net from "node:net"

export interface Answer {
  readonly status: number
  readonly delayMs?: number
}

export interface Receiver {
  readonly url: string
  /** requests per delivery id */
  readonly hits: Map<string, number>
  /** the most requests of one delivery id in flight at once */
  readonly maxInFlight: Map<string, number>
  /** requests in total */
  readonly total: () => number
  answer: (id: string, n: number) => Answer
  readonly close: () => Promise<void>
}

export const startReceiver = (answer: (id: string, n: number) => Answer = () => ({ status: 200 })) =>
  new Promise<Receiver>((resolve) => {
    const hits = new Map<string, number>()
    const inFlight = new Map<string, number>()
    const maxInFlight = new Map<string, number>()
    const sockets = new Set<Net.Socket>()
    let total = 0
    const server = Http.createServer((req, res) => {
      // the delivery id: `webhook-id` on signed requests, `Idempotency-Key` on every one (SPEC §4.5)
      const id = String(req.headers["webhook-id"] ?? req.headers["idempotency-key"])
      const n = (hits.get(id) ?? 0) + 1
      hits.set(id, n)
      total++
      const now = (inFlight.get(id) ?? 0) + 1
      inFlight.set(id, now)
      maxInFlight.set(id, Math.max(maxInFlight.get(id) ?? 0, now))
      let open = true
      const done = () => {
        if (!open) return
        open = false
        inFlight.set(id, (inFlight.get(id) ?? 1) - 1)
      }
      res.on("close", done)
      req.resume()
      req.on("end", () => {
        const a = receiver.answer(id, n)
        const reply = () => {
          if (!open) return
          res.writeHead(a.status, { "content-type": "text/plain" })
          res.end("ok", done)
        }
        if (a.delayMs === undefined || a.delayMs <= 0) reply()
        else setTimeout(reply, a.delayMs)
      })
    })
    server.keepAliveTimeout = 5_000
    server.on("connection", (s: Net.Socket) => {
      sockets.add(s)
      s.on("close", () => sockets.delete(s))
    })
    const receiver: Receiver = {
      url: "",
      hits,
      maxInFlight,
      total: () => total,
      answer,
      close: () =>
        new Promise((done) => {
          for (const s of sockets) s.destroy()
          server.close(() => done())
        })
    }
    server.listen(0, "127.0.0.1", () => {
      const addr = server.address()
      const port = typeof addr === "object" && addr !== null ? addr.port : 0
      resolve(Object.assign(receiver, { url: `http://127.0.0.1:${port}/hook` }))
    })
  })
