/**
 * The end-to-end benchmark's receivers, in a process of their own (so they do not share the
 * benchmark's or firehook's thread): `count` node:http servers on 127.0.0.1 answering 204 at once,
 * and a stats server (`GET /` → JSON: requests, distinct delivery ids, first and last arrival,
 * epoch ms). Prints `{"ports":[…],"stats":port}` on one line when listening; exits when its
 * parent's stdin closes.
 *
 *   bun bench/e2e-receivers.ts [count=4]
 */
import * as Http from "node:http"

const count = Number(process.argv[2] ?? 4)
let requests = 0
let first = 0
let last = 0
const ids = new Set<string>()

const listen = (server: Http.Server) =>
  new Promise<number>((resolve) => {
    server.keepAliveTimeout = 60_000
    server.listen(0, "127.0.0.1", () => {
      const addr = server.address()
      resolve(typeof addr === "object" && addr !== null ? addr.port : 0)
    })
  })

const receiver = () =>
  Http.createServer((req, res) => {
    req.on("data", () => {})
    req.on("end", () => {
      const now = Date.now()
      if (requests === 0) first = now
      last = now
      requests++
      const id = req.headers["webhook-id"] ?? req.headers["idempotency-key"]
      if (typeof id === "string") ids.add(id)
      res.writeHead(204)
      res.end()
    })
  })

const stats = Http.createServer((req, res) => {
  req.resume()
  if (req.url === "/reset") {
    requests = 0
    first = 0
    last = 0
    ids.clear()
  }
  res.writeHead(200, { "content-type": "application/json" })
  res.end(JSON.stringify({ requests, distinct: ids.size, first, last }))
})

const ports: Array<number> = []
for (let i = 0; i < count; i++) ports.push(await listen(receiver()))
const statsPort = await listen(stats)
process.stdout.write(JSON.stringify({ ports, stats: statsPort }) + "\n")
process.stdin.resume()
process.stdin.on("end", () => process.exit(0))
process.stdin.on("close", () => process.exit(0))
