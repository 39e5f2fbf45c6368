/**
 * SafeHttp smoke test for the production runtime: `bun test/support/safehttp-bun-smoke.ts`.
 * Prints `ok` (and exits 0) when Bun's node:http/node:https honour what the transport relies on:
 * `host: <address>` with a name in `Host`, TLS `servername` (SNI + certificate check), a custom CA,
 * no redirect following, next-address fallback, destroying the request on timeout, truncated
 * reads (deliveries), and the system resolver (`Bun.dns.lookup`, c-ares backend).
 *
 * HTTPS checks run when SMOKE_CERT / SMOKE_KEY name a certificate for `receiver.test`
 * (test/platform/http/safehttp.https.test.ts passes them).
 */
import { Effect, Either, Layer } from "effect"
import { readFileSync } from "node:fs"
import * as Http from "node:http"
import * as Https from "node:https"
import type * as Net from "node:net"
import { bunLookup } from "../../src/services/platform/http/Resolver.js"
import { parseAllowCidrs, Resolver, SafeHttp, type SafeRequest } from "../../src/services/platform/http/SafeHttp.js"

interface Seen {
  readonly host: string | undefined
  readonly remote: string | undefined
  readonly sni: unknown
  readonly body: string
}

const listen = (server: Http.Server): Promise<number> =>
  new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => {
      const a = server.address()
      resolve(typeof a === "object" && a !== null ? a.port : 0)
    })
  )

const check = (cond: boolean, what: string): void => {
  if (!cond) throw new Error(`smoke check failed: ${what}`)
}

const main = async (): Promise<void> => {
  const seen: Array<Seen> = []
  const open = new Set<Net.Socket>()
  const handler = (req: Http.IncomingMessage, res: Http.ServerResponse): void => {
    let body = ""
    req.setEncoding("utf8")
    req.on("data", (c: string) => (body += c))
    req.on("end", () => {
      seen.push({
        host: req.headers.host,
        remote: req.socket.remoteAddress,
        sni: Reflect.get(req.socket, "servername"),
        body
      })
      if (req.url === "/redirect") {
        res.writeHead(302, { location: "http://elsewhere.test/" })
        res.end()
      } else if (req.url === "/switch") {
        req.socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
      } else if (req.url === "/bighead") {
        res.writeHead(200, { "x-padding": "a".repeat(20_000) })
        res.end("thanks")
      } else if (req.url === "/hang") {
        // never answer
      } else if (req.url === "/large") {
        res.writeHead(503)
        res.end(Buffer.alloc(100 * 1024, 0x61))
      } else if (req.url === "/stall") {
        res.writeHead(200, { "content-length": "100" })
        res.write("partial")
      } else {
        res.writeHead(200, { "X-Reply": "yes" })
        res.end("thanks")
      }
    })
  }
  const server = Http.createServer(handler)
  server.on("connection", (s: Net.Socket) => {
    open.add(s)
    s.on("close", () => open.delete(s))
  })
  const port = await listen(server)

  const certPath = process.env["SMOKE_CERT"]
  const keyPath = process.env["SMOKE_KEY"]
  const cert = certPath !== undefined ? readFileSync(certPath, "utf8") : undefined
  const tlsServer = cert !== undefined && keyPath !== undefined
    ? Https.createServer({ cert, key: readFileSync(keyPath, "utf8") }, handler)
    : undefined
  const tlsPort = tlsServer !== undefined ? await listen(tlsServer) : 0

  let lookups = 0
  const resolver = Layer.succeed(Resolver, {
    lookup: (host: string) =>
      Effect.sync(() => {
        lookups++
        return host === "fallback.test"
          ? [{ address: "127.0.0.2", family: 4 as const }, { address: "127.0.0.1", family: 4 as const }]
          : [{ address: "127.0.0.1", family: 4 as const }]
      })
  })
  const allowCidrs = Either.getOrThrow(parseAllowCidrs("127.0.0.0/8"))
  const req = (url: string, extra?: Partial<SafeRequest>): SafeRequest => ({
    url,
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: "{\"n\":1}",
    timeoutMs: 5_000,
    maxResponseBytes: 65_536,
    ...extra
  })

  const program = Effect.gen(function*() {
    const http = yield* SafeHttp
    const a = yield* http.request(req(`http://receiver.test:${port}/hook`))
    check(a.status === 200 && Buffer.from(a.body).toString() === "thanks", "http status/body")
    check(a.headers["x-reply"] === "yes", "lowercased response headers")
    check(seen[0]?.host === `receiver.test:${port}`, "Host header is the name")
    check(seen[0]?.remote === "127.0.0.1", "connected to the validated address")
    check(seen[0]?.body === "{\"n\":1}", "body")
    check(lookups === 1, "one lookup")

    const r = yield* http.request(req(`http://receiver.test:${port}/redirect`))
    check(r.status === 302, "302 returned, not followed")

    const sw = yield* http.request(req(`http://receiver.test:${port}/switch`))
    check(sw.status === 101, "101 Switching Protocols is the response")

    const big = yield* http.request(req(`http://receiver.test:${port}/bighead`))
    check(big.status === 200, "a 20 KB response head is the response (over node:http's default 16 KiB)")

    const f = yield* http.request(req(`http://fallback.test:${port}/hook`))
    check(f.status === 200 && seen.at(-1)?.host === `fallback.test:${port}`, "next address after ECONNREFUSED")

    const t = yield* Effect.flip(http.request(req(`http://receiver.test:${port}/hang`, { timeoutMs: 300 })))
    check(t.kind === "timeout", "timeout kind")

    // deliveries' reads (onResponseOverflow: truncate): a body within the cap ends cleanly; a larger
    // one gives its status and first bytes; a body that stalls after the head ends at the deadline
    const truncating = { onResponseOverflow: "truncate", keepResponseBytes: 1024 } as const
    const small = yield* http.request(req(`http://receiver.test:${port}/hook`, truncating))
    check(small.status === 200 && Buffer.from(small.body).toString() === "thanks", "truncate: small body")
    check(!small.truncated, "truncate: a small body is whole")
    const large = yield* http.request(req(`http://receiver.test:${port}/large`, truncating))
    check(large.status === 503 && large.truncated && large.body.length === 1024, "truncate: large body")
    const large2 = yield* Effect.flip(http.request(req(`http://receiver.test:${port}/large`)))
    check(large2.kind === "response_too_large", "without truncate: response_too_large")
    const stalled = yield* http.request(req(`http://receiver.test:${port}/stall`, { ...truncating, timeoutMs: 300 }))
    check(stalled.status === 200 && stalled.truncated, "truncate: a stalled body ends at the deadline")

    if (tlsServer !== undefined) {
      const s = yield* http.request(req(`https://receiver.test:${tlsPort}/hook`))
      check(s.status === 200, "https status")
      const last = seen.at(-1)
      check(last?.sni === "receiver.test", "SNI is the name")
      check(last?.host === `receiver.test:${tlsPort}`, "https Host header is the name")
      const wrong = yield* Effect.flip(http.request(req(`https://other.test:${tlsPort}/hook`)))
      check(wrong.kind === "network", "certificate checked against the name")
    }
  })

  await Effect.runPromise(
    program.pipe(
      Effect.provide(
        SafeHttp.layer({ allowInsecureDev: true, allowCidrs, tls: cert !== undefined ? { ca: cert } : undefined }).pipe(
          Layer.provide(resolver)
        )
      )
    )
  )

  // the system resolver: Bun.dns.lookup with the c-ares backend (hosts file, then DNS)
  check(bunLookup(Reflect.get(globalThis, "Bun")) !== undefined, "Bun.dns.lookup is the system resolver")
  const sys = await Effect.runPromise(
    Effect.flatMap(SafeHttp, (http) => http.request(req(`http://localhost:${port}/hook`))).pipe(
      Effect.provide(SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }))
    )
  )
  check(sys.status === 200 && seen.at(-1)?.host === `localhost:${port}`, "system resolver")

  // the timed-out request's socket, and the pooled keep-alive sockets (layer closed), are gone
  for (let i = 0; i < 100 && open.size > 0; i++) await new Promise((r) => setTimeout(r, 50))
  check(open.size === 0, "sockets closed after timeout and layer shutdown")

  server.closeAllConnections()
  server.close()
  tlsServer?.closeAllConnections()
  tlsServer?.close()
}

main().then(
  () => {
    process.stdout.write("ok\n")
    process.exit(0)
  },
  (e: unknown) => {
    process.stderr.write(`${e instanceof Error ? e.message : String(e)}\n`)
    process.exit(1)
  }
)
