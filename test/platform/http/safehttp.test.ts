/**
 * SafeHttp (SPEC §4.6): real HTTP/HTTPS servers on 127.0.0.1, a fake Resolver.
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Cause, type Context, Duration, Effect, Either, Exit, Fiber, Layer, Option, TestClock } from "effect"
import { execFile, execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import * as Http from "node:http"
import * as Https from "node:https"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import * as Path from "node:path"
import { parseCidr } from "../../../src/schemas/Net.js"
import { buildHeaders } from "../../../src/services/platform/http/Headers.js"
import { bunLookup, makeLookup } from "../../../src/services/platform/http/Resolver.js"
import {
  allowedAddress,
  DEFAULT_MAX_REQUEST_BYTES,
  MAX_CONNECT_ADDRESSES,
  MAX_REQUEST_HEADER_BYTES,
  MAX_SERVICE_URL_LENGTH,
  MAX_TIMEOUT_MS,
  parseAllowCidrs,
  planTarget,
  type ResolvedAddress,
  ResolveError,
  Resolver,
  SafeHttp,
  SafeHttpError,
  type SafeHttpErrorKind,
  type SafeHttpOptions,
  type SafeRequest
} from "../../../src/services/platform/http/SafeHttp.js"
import { BUN, freePort, ROOT } from "../../support/proc.js"

// ---------------------------------------------------------------------------------------------
// A self-signed certificate for receiver.test and 127.0.0.1 (openssl is required for these tests)

const certDir = mkdtempSync(Path.join(tmpdir(), "firehook-safehttp-"))
const KEY_PATH = Path.join(certDir, "key.pem")
const CERT_PATH = Path.join(certDir, "cert.pem")
execFileSync(
  "openssl",
  [
    "req",
    "-x509",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
    "-keyout",
    KEY_PATH,
    "-out",
    CERT_PATH,
    "-days",
    "2",
    "-subj",
    "/CN=receiver.test",
    "-addext",
    "subjectAltName=DNS:receiver.test,IP:127.0.0.1"
  ],
  { stdio: "ignore" }
)
const KEY = readFileSync(KEY_PATH, "utf8")
const CERT = readFileSync(CERT_PATH, "utf8")
afterAll(() => rmSync(certDir, { recursive: true, force: true }))

// ---------------------------------------------------------------------------------------------
// Test servers

interface Seen {
  readonly method: string
  readonly url: string
  readonly headers: Http.IncomingHttpHeaders
  readonly rawHeaders: ReadonlyArray<string>
  readonly body: string
  readonly remoteAddress: string | undefined
  /** TLS server name indication received (HTTPS servers); `false` when none was sent. */
  readonly sni: unknown
}

interface TestServer {
  readonly port: number
  readonly seen: Array<Seen>
  /** TCP connections accepted so far. */
  readonly connections: () => number
  /** TCP connections currently open. */
  readonly open: () => number
}

type Handler = (req: Http.IncomingMessage, res: Http.ServerResponse, body: string) => void

const ok: Handler = (_req, res) => {
  res.writeHead(200, { "content-type": "text/plain", "X-Reply": "yes" })
  res.end("thanks")
}

const startServer = (
  handler: Handler,
  options?: { readonly tls?: boolean; readonly host?: string; readonly port?: number }
) =>
  Effect.acquireRelease(
    Effect.async<{ readonly server: Http.Server; readonly api: TestServer }>((resume) => {
      const seen: Array<Seen> = []
      let connections = 0
      const sockets = new Set<Net.Socket>()
      const onRequest = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8")
          seen.push({
            method: req.method ?? "",
            url: req.url ?? "",
            headers: req.headers,
            rawHeaders: req.rawHeaders,
            body,
            remoteAddress: req.socket.remoteAddress,
            sni: Reflect.get(req.socket, "servername")
          })
          handler(req, res, body)
        })
      }
      const server: Http.Server = options?.tls === true
        ? Https.createServer({ key: KEY, cert: CERT }, onRequest)
        : Http.createServer(onRequest)
      server.on("connection", (s: Net.Socket) => {
        connections++
        sockets.add(s)
        s.on("close", () => sockets.delete(s))
      })
      server.on("tlsClientError", () => undefined)
      server.listen(options?.port ?? 0, options?.host ?? "127.0.0.1", () => {
        const a = server.address()
        const port = typeof a === "object" && a !== null ? a.port : 0
        resume(
          Effect.succeed({ server, api: { port, seen, connections: () => connections, open: () => sockets.size } })
        )
      })
    }),
    ({ server }) =>
      Effect.async<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ api }) => api))

/**
 * A port on 127.0.0.1 with nothing listening: bindable a moment ago, below the kernel's ephemeral
 * range (freePort), where no other test's listener on port 0 can land before the connection.
 */
const closedPort = Effect.promise(freePort)

/** a raw TCP server on 127.0.0.1 (scoped: closed with the test); yields its port */
const rawServer = (onConnection: (socket: Net.Socket) => void) =>
  Effect.acquireRelease(
    Effect.async<{ readonly server: Net.Server; readonly port: number }>((resume) => {
      const server = Net.createServer(onConnection)
      server.listen(0, "127.0.0.1", () => {
        const a = server.address()
        resume(Effect.succeed({ server, port: typeof a === "object" && a !== null ? a.port : 0 }))
      })
    }),
    ({ server }) =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ port }) => port))

/**
 * A raw server's connection handler: the first request on each connection is answered (keep-alive);
 * the next one finds the connection closed (destroyed once its request has arrived whole).
 */
const answerFirstDropRest =
  (seen: { readonly connection: () => void; readonly request: () => void }) => (socket: Net.Socket): void => {
    seen.connection()
    let served = 0
    let buffered = ""
    socket.setEncoding("latin1") // one character per byte, so lengths are byte counts
    socket.on("error", () => undefined)
    socket.on("data", (d: string) => {
      buffered += d
      const end = buffered.indexOf("\r\n\r\n")
      if (end < 0) return
      const length = Number(/content-length: (\d+)/i.exec(buffered)?.[1] ?? "0")
      if (buffered.length < end + 4 + length) return
      buffered = ""
      seen.request()
      served++
      if (served === 1) socket.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
      else socket.destroy()
    })
  }

const eventually = (check: () => boolean, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 100; i++) {
      if (check()) return
      yield* Effect.sleep(Duration.millis(50))
    }
    expect.fail(`never happened: ${what}`)
  })

// ---------------------------------------------------------------------------------------------
// Fake resolver

const fam = (address: string): ResolvedAddress => ({ address, family: address.includes(":") ? 6 : 4 })

const fakeResolver = (answer: (host: string) => Effect.Effect<ReadonlyArray<ResolvedAddress>, ResolveError>) => {
  const calls: Array<string> = []
  const layer = Layer.succeed(Resolver, {
    lookup: (host) =>
      Effect.suspend(() => {
        calls.push(host)
        return answer(host)
      })
  })
  return { calls, layer }
}

const answers = (...addresses: ReadonlyArray<string>) => fakeResolver(() => Effect.succeed(addresses.map(fam)))

const DEV: SafeHttpOptions = { allowInsecureDev: true, allowCidrs: [] }
const PROD: SafeHttpOptions = { allowInsecureDev: false, allowCidrs: [] }

const cidrs = (s: string) => Either.getOrThrow(parseAllowCidrs(s))

const post = (url: string, extra?: Partial<SafeRequest>): SafeRequest => ({
  url,
  method: "POST",
  headers: { "Content-Type": "application/json", "User-Agent": "firehook/test" },
  body: "{\"hello\":\"wörld\"}",
  timeoutMs: 5_000,
  maxResponseBytes: 64 * 1024,
  ...extra
})

const send = (options: SafeHttpOptions, resolver: { readonly layer: Layer.Layer<Resolver> }, req: SafeRequest) =>
  Effect.flatMap(SafeHttp, (http) => http.request(req)).pipe(
    Effect.provide(SafeHttp.layer(options).pipe(Layer.provide(resolver.layer)))
  )

/** Runs `f` against one transport layer that stays open until `f` is done (its agents are not closed early). */
const withHttp = <A, E>(
  options: SafeHttpOptions,
  resolver: { readonly layer: Layer.Layer<Resolver> },
  f: (http: Context.Tag.Service<SafeHttp>) => Effect.Effect<A, E>
) => Effect.flatMap(SafeHttp, f).pipe(Effect.provide(SafeHttp.layer(options).pipe(Layer.provide(resolver.layer))))

/** Every error must be generic: none of `secrets` may appear in its message, string or JSON forms. */
const expectGeneric = (error: SafeHttpError, secrets: ReadonlyArray<string>) => {
  const renderings = [
    error.message,
    String(error),
    JSON.stringify(error),
    JSON.stringify(Object.getOwnPropertyNames(error).map((k) => [k, String(Reflect.get(error, k))])),
    Cause.pretty(Cause.fail(error))
  ]
  for (const r of renderings) {
    for (const s of secrets) expect(r).not.toContain(s)
  }
  expect(error.message).toBe(`delivery failed: ${error.kind}`)
  expect(Object.keys(error).sort()).toEqual(["_tag", "kind"])
}

const expectKind = <R>(
  effect: Effect.Effect<unknown, SafeHttpError, R>,
  kind: SafeHttpErrorKind,
  secrets: ReadonlyArray<string>
) =>
  Effect.gen(function*() {
    const error = yield* Effect.flip(effect)
    expect(error).toBeInstanceOf(SafeHttpError)
    expect(error.kind).toBe(kind)
    expectGeneric(error, secrets)
    return error
  })

const text = (b: Uint8Array) => Buffer.from(b).toString("utf8")

// ---------------------------------------------------------------------------------------------

describe("SafeHttp: blocked targets (no resolution, no connection)", () => {
  const LITERALS = [
    "10.0.0.1",
    "169.254.169.254",
    "100.64.0.1",
    "192.168.1.1",
    "172.16.0.1",
    "0.0.0.0",
    "127.0.0.1",
    "198.18.0.1",
    "224.0.0.1",
    "192.0.2.1",
    "240.0.0.1",
    "[fc00::1]",
    "[fe80::1]",
    "[::1]",
    "[::]",
    "[::ffff:127.0.0.1]",
    "[::127.0.0.1]",
    "[2001:db8::1]",
    "[64:ff9b::1]",
    "[2002::1]",
    "[ff02::1]"
  ]

  it.scopedLive("every non-public literal IP is blocked_target", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const resolver = answers("1.1.1.1")
      for (const lit of LITERALS) {
        const url = `https://${lit}:${server.port}/hook`
        yield* expectKind(send(PROD, resolver, post(url)), "blocked_target", [
          lit,
          lit.replace(/[[\]]/g, ""),
          String(server.port),
          "/hook"
        ])
      }
      // insecure development mode only opens loopback (127/8, ::1); everything else stays blocked
      for (const lit of LITERALS.filter((l) => l !== "127.0.0.1" && l !== "[::1]")) {
        yield* expectKind(send(DEV, resolver, post(`https://${lit}:${server.port}/hook`)), "blocked_target", [lit])
      }
      // 0.0.0.0 and ::ffff:127.0.0.1 would have reached this server had a connection been attempted
      expect(resolver.calls).toEqual([])
      expect(server.connections()).toBe(0)
    }))

  it.scopedLive("blocked host names are blocked_target without a lookup", () =>
    Effect.gen(function*() {
      const resolver = answers("1.1.1.1")
      for (
        const host of [
          "localhost",
          "LOCALHOST.",
          "a.b.localhost",
          "metadata.google.internal",
          "metadata.google.internal."
        ]
      ) {
        yield* expectKind(send(PROD, resolver, post(`https://${host}/x`)), "blocked_target", [host.toLowerCase()])
      }
      // in insecure development mode, http: to a *.localhost or the metadata host is still blocked
      for (const host of ["a.localhost", "metadata.google.internal"]) {
        yield* expectKind(send(DEV, resolver, post(`http://${host}/x`)), "blocked_target", [host])
      }
      expect(resolver.calls).toEqual([])
    }))

  it.scopedLive("syntax errors and http: outside development mode are invalid_target", () =>
    Effect.gen(function*() {
      const resolver = answers("1.1.1.1")
      for (
        const url of [
          "not a url",
          "ftp://receiver.test/",
          "https://u:p@receiver.test/",
          "https://receiver.test/#f",
          "http://receiver.test/",
          "http://1.1.1.1/",
          "https://",
          "https://[::1/",
          `https://receiver.test/${"a".repeat(2100)}`
        ]
      ) {
        yield* expectKind(send(PROD, resolver, post(url)), "invalid_target", ["receiver.test", "1.1.1.1"])
      }
      // development mode: http: only to loopback; a public literal is still a scheme error
      yield* expectKind(send(DEV, resolver, post("http://1.1.1.1/")), "invalid_target", ["1.1.1.1"])
      expect(resolver.calls).toEqual([])
    }))
})

describe("SafeHttp: DNS answers", () => {
  it.scopedLive("mixed public/private answers are blocked_target after exactly one lookup", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const sets: ReadonlyArray<ReadonlyArray<string>> = [
        ["1.1.1.1", "10.0.0.1"],
        ["10.0.0.1", "1.1.1.1"],
        ["2606:4700::1111", "fd00::1"],
        ["1.1.1.1", "::ffff:127.0.0.1"],
        ["1.1.1.1", "127.0.0.1"],
        ["1.1.1.1", "169.254.169.254"],
        ["1.1.1.1", "fe80::1%eth0"],
        ["1.1.1.1", "127.1"],
        ["1.1.1.1", "not-an-ip"]
      ]
      for (const set of sets) {
        const resolver = answers(...set)
        yield* expectKind(
          send(PROD, resolver, post(`https://receiver.test:${server.port}/hook`)),
          "blocked_target",
          ["receiver.test", ...set, String(server.port)]
        )
        expect(resolver.calls).toEqual(["receiver.test"])
      }
      expect(server.connections()).toBe(0)
    }))

  it.scopedLive("a failing lookup is dns; no answers is dns", () =>
    Effect.gen(function*() {
      const failing = fakeResolver(() => Effect.fail(new ResolveError({ reason: "not_found" })))
      yield* expectKind(send(PROD, failing, post("https://receiver.test/hook")), "dns", ["receiver.test"])
      expect(failing.calls).toEqual(["receiver.test"])
      const empty = answers()
      yield* expectKind(send(PROD, empty, post("https://receiver.test/hook")), "dns", ["receiver.test"])
      expect(empty.calls).toHaveLength(1)
    }))

  it.scopedLive("a lookup that never answers is a timeout within the deadline", () =>
    Effect.gen(function*() {
      const hanging = fakeResolver(() => Effect.never)
      yield* expectKind(send(PROD, hanging, post("https://receiver.test/hook", { timeoutMs: 200 })), "timeout", [
        "receiver.test"
      ])
    }))

  it.scoped("a lookup that never answers fails as timeout exactly at timeoutMs, at most MAX_TIMEOUT_MS (TestClock)", () =>
    Effect.gen(function*() {
      const hanging = fakeResolver(() => Effect.never)
      yield* withHttp(PROD, hanging, (http) =>
        Effect.gen(function*() {
          const settle = () => Effect.repeatN(Effect.yieldNow(), 20)
          for (const [timeoutMs, bound] of [[200, 200], [60 * 60 * 1000, MAX_TIMEOUT_MS]] as const) {
            const fiber = yield* Effect.fork(http.request(post("https://receiver.test/hook", { timeoutMs })))
            yield* settle()
            yield* TestClock.adjust(Duration.millis(bound - 1))
            yield* settle()
            expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
            yield* TestClock.adjust(Duration.millis(1))
            yield* settle()
            const exit = yield* Fiber.poll(fiber)
            expect(Option.isSome(exit) && Exit.isFailure(exit.value) ? String(Cause.squash(exit.value.cause)) : exit)
              .toBe("SafeHttpError: delivery failed: timeout")
          }
        }))
    }))

  it.scopedLive("the system resolver answers for localhost and fails generically for .invalid", () =>
    Effect.gen(function*() {
      const resolver = yield* Resolver.pipe(Effect.provide(Resolver.layer))
      const local = yield* resolver.lookup("localhost")
      expect(local.length).toBeGreaterThan(0)
      for (const a of local) expect([4, 6]).toContain(a.family)
      const error = yield* Effect.flip(resolver.lookup("no-such-host.invalid"))
      expect(error).toBeInstanceOf(ResolveError)
      expect(String(error)).not.toContain("no-such-host")
      expect(JSON.stringify(error)).not.toContain("no-such-host")
    }))

  it.effect("under Bun the system resolver is Bun.dns.lookup with the c-ares backend (no thread per lookup)", () =>
    Effect.gen(function*() {
      const calls: Array<[string, unknown]> = []
      const fakeBun = {
        dns: {
          lookup(this: unknown, hostname: string, options: unknown) {
            calls.push([hostname, options])
            if (this !== fakeBun.dns) return Promise.reject(new Error("called without its receiver"))
            if (hostname === "gone.test") {
              return Promise.reject(Object.assign(new Error("x"), { code: "DNS_ENOTFOUND" }))
            }
            if (hostname === "slow.test") return Promise.reject(Object.assign(new Error("x"), { code: "DNS_ETIMEOUT" }))
            return Promise.resolve([
              { address: "203.0.113.7", family: 4, ttl: 60 },
              { address: "2001:db8::7", family: 6, ttl: 60 },
              { address: "bogus", family: "IPv4" },
              null
            ])
          }
        }
      }
      const look = bunLookup(fakeBun)
      expect(look).toBeDefined()
      if (look === undefined) return
      const lookup = makeLookup(look)
      expect(yield* lookup("receiver.test")).toEqual([
        { address: "203.0.113.7", family: 4 },
        { address: "2001:db8::7", family: 6 }
      ])
      expect(calls).toEqual([["receiver.test", { backend: "c-ares" }]])
      expect((yield* Effect.flip(lookup("gone.test"))).reason).toBe("not_found")
      expect((yield* Effect.flip(lookup("slow.test"))).reason).toBe("temporary")
      // not Bun (Node, the tests' runtime): node:dns
      expect(bunLookup(undefined)).toBeUndefined()
      expect(bunLookup({})).toBeUndefined()
      expect(bunLookup({ dns: {} })).toBeUndefined()
    }))
})

describe("SafeHttp: connecting to the validated address", () => {
  it.scopedLive("layerDefault (system resolver): http://localhost in development mode reaches the 127.0.0.1 server", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const res = yield* Effect.flatMap(SafeHttp, (http) => http.request(post(`http://localhost:${server.port}/sys`)))
        .pipe(
          Effect.provide(SafeHttp.layerDefault(DEV))
        )
      expect(res.status).toBe(200)
      expect(server.seen[0]!.headers.host).toBe(`localhost:${server.port}`)
      // and a name that does not exist is a dns failure
      yield* expectKind(
        Effect.flatMap(SafeHttp, (http) => http.request(post("https://no-such-host.invalid/x"))).pipe(
          Effect.provide(SafeHttp.layerDefault(PROD))
        ),
        "dns",
        ["no-such-host"]
      )
    }))

  it.scopedLive("development mode: http://receiver.test → resolver once, connects to 127.0.0.1, Host is the name", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      const res = yield* send(
        DEV,
        resolver,
        post(`http://receiver.test:${server.port}/hook?x=1&y=%20`, {
          headers: {
            "Content-Type": "application/json",
            "Idempotency-Key": "d-1",
            Host: "evil.example",
            "Content-Length": "1",
            "Transfer-Encoding": "chunked",
            Connection: "close"
          }
        })
      )
      expect(res.status).toBe(200)
      expect(res.truncated).toBe(false)
      expect(text(res.body)).toBe("thanks")
      expect(res.headers["x-reply"]).toBe("yes")
      expect(res.headers["content-type"]).toBe("text/plain")
      expect(resolver.calls).toEqual(["receiver.test"])
      expect(server.seen).toHaveLength(1)
      const seen = server.seen[0]!
      expect(seen.headers.host).toBe(`receiver.test:${server.port}`)
      expect(seen.remoteAddress).toBe("127.0.0.1")
      expect(seen.method).toBe("POST")
      expect(seen.url).toBe("/hook?x=1&y=%20")
      expect(seen.body).toBe("{\"hello\":\"wörld\"}")
      expect(seen.headers["content-length"]).toBe(String(Buffer.byteLength("{\"hello\":\"wörld\"}")))
      expect(seen.headers["transfer-encoding"]).toBeUndefined()
      expect(seen.headers["content-type"]).toBe("application/json")
      expect(seen.headers["idempotency-key"]).toBe("d-1")
      expect(seen.headers.connection).toBe("keep-alive")
    }))

  it.scopedLive("development mode: http: to a name is allowed only when every answer is loopback", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const url = `http://receiver.test:${server.port}/hook`
      yield* expectKind(send(DEV, answers("127.0.0.1", "1.1.1.1"), post(url)), "invalid_target", [
        "receiver.test",
        "1.1.1.1"
      ])
      yield* expectKind(
        send({ ...DEV, allowCidrs: cidrs("10.0.0.0/8") }, answers("10.0.0.1"), post(url)),
        "invalid_target",
        ["10.0.0.1"]
      )
      yield* expectKind(send(DEV, answers("127.0.0.1", "192.168.0.1"), post(url)), "blocked_target", ["192.168.0.1"])
      // http://localhost is no exception: a public answer for it breaks the scheme rule too
      yield* expectKind(
        send(DEV, answers("127.0.0.1", "1.1.1.1"), post(`http://localhost:${server.port}/hook`)),
        "invalid_target",
        ["localhost", "1.1.1.1"]
      )
      expect(server.connections()).toBe(0)
      // a loopback literal and "localhost" work as before
      const literal = yield* send(DEV, answers(), post(`http://127.0.0.1:${server.port}/a`))
      expect(literal.status).toBe(200)
      const local = answers("127.0.0.1")
      const named = yield* send(DEV, local, post(`http://localhost:${server.port}/b`))
      expect(named.status).toBe(200)
      expect(local.calls).toEqual(["localhost"])
      expect(server.seen.map((s) => s.headers.host)).toEqual([`127.0.0.1:${server.port}`, `localhost:${server.port}`])
    }))

  it.scopedLive("IPv6: an AAAA answer ::1 and the literal [::1] (development mode)", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { host: "::1" })
      const resolver = answers("::1")
      const named = yield* send(DEV, resolver, post(`http://receiver.test:${server.port}/v6`))
      expect(named.status).toBe(200)
      const literal = yield* send(DEV, answers(), post(`http://[::1]:${server.port}/v6`))
      expect(literal.status).toBe(200)
      expect(server.seen.map((s) => [s.headers.host, s.remoteAddress])).toEqual([
        [`receiver.test:${server.port}`, "::1"],
        [`[::1]:${server.port}`, "::1"]
      ])
      expect(resolver.calls).toEqual(["receiver.test"])
    }))

  it.scopedLive("header names are data: __proto__ is sent as a header, not a prototype", () =>
    Effect.gen(function*() {
      const server = yield* startServer((_req, res) => {
        res.setHeader("__proto__", "server-side")
        ok(_req, res, "")
      })
      const headers: Record<string, string> = { "X-Plain": "1" }
      Object.defineProperty(headers, "__proto__", { value: "caller-side", enumerable: true })
      const res = yield* send(DEV, answers("127.0.0.1"), post(`http://receiver.test:${server.port}/`, { headers }))
      expect(res.status).toBe(200)
      expect(server.seen[0]!.headers["x-plain"]).toBe("1")
      expect(server.seen[0]!.rawHeaders).toContain("caller-side")
      // Node's own response parser drops the name; what matters is that nothing was polluted
      expect(Object.getPrototypeOf(res.headers)).toBe(Object.prototype)
    }))

  it.scopedLive("GET without a body sends no Content-Length; POST without a body sends 0", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      const url = `http://receiver.test:${server.port}/x`
      yield* send(DEV, resolver, { ...post(url), method: "GET", body: undefined })
      yield* send(DEV, resolver, { ...post(url), body: undefined })
      expect(server.seen.map((s) => [s.method, s.headers["content-length"], s.headers["transfer-encoding"]])).toEqual([
        ["GET", undefined, undefined],
        ["POST", "0", undefined]
      ])
    }))

  it.scopedLive("the next address is tried after a connect error (127.0.0.2 refused, then 127.0.0.1)", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.2", "127.0.0.1")
      const res = yield* send(DEV, resolver, post(`http://receiver.test:${server.port}/hook`))
      expect(res.status).toBe(200)
      expect(resolver.calls).toHaveLength(1)
      expect(server.seen).toHaveLength(1)
      expect(server.seen[0]!.remoteAddress).toBe("127.0.0.1")
    }))

  it.scopedLive("at most MAX_CONNECT_ADDRESSES distinct addresses are tried (duplicates count once); every answer is still checked", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const url = `http://receiver.test:${server.port}/hook`
      // 127.0.0.2 refuses; repeated, it is one address, so 127.0.0.1 is tried next
      const repeated = Array.from({ length: MAX_CONNECT_ADDRESSES + 4 }, () => "127.0.0.2")
      expect((yield* send(DEV, answers(...repeated, "127.0.0.1"), post(url))).status).toBe(200)
      // MAX_CONNECT_ADDRESSES distinct refusing addresses first: the one after them is never tried
      const refusing = Array.from({ length: MAX_CONNECT_ADDRESSES }, (_, i) => `127.0.0.${i + 2}`)
      yield* expectKind(send(DEV, answers(...refusing, "127.0.0.1"), post(url)), "network", ["127.0.0"])
      // an answer past the bound is validated all the same
      yield* expectKind(send(DEV, answers(...refusing, "10.0.0.1"), post(url)), "blocked_target", ["10.0.0.1"])
      expect(server.seen).toHaveLength(1)
    }))

  it.scopedLive("a queued/slow connect on one address gets a share of the deadline, then the next address is tried", () =>
    Effect.gen(function*() {
      const first = yield* startServer((req, res) => {
        if (req.url !== "/hang") ok(req, res, "")
      })
      const second = yield* startServer(ok, { host: "127.0.0.3", port: first.port })
      const resolver = fakeResolver((host) =>
        Effect.succeed(host === "receiver.test" ? [fam("127.0.0.1"), fam("127.0.0.3")] : [])
      )
      yield* Effect.gen(function*() {
        const http = yield* SafeHttp
        // the only socket allowed to 127.0.0.1:port is held by a request that never gets an answer
        const hanging = yield* Effect.fork(
          http.request(post(`http://127.0.0.1:${first.port}/hang`, { timeoutMs: 10_000 }))
        )
        yield* eventually(() => first.seen.length === 1, "hanging request arrived")
        const res = yield* http.request(post(`http://receiver.test:${first.port}/hook`, { timeoutMs: 2_000 }))
        expect(res.status).toBe(200)
        expect(second.seen).toHaveLength(1)
        expect(second.seen[0]!.headers.host).toBe(`receiver.test:${first.port}`)
        expect(first.seen).toHaveLength(1)
        yield* Fiber.interrupt(hanging)
      }).pipe(Effect.provide(SafeHttp.layer({ ...DEV, maxSocketsPerHost: 1 }).pipe(Layer.provide(resolver.layer))))
    }))

  it.scopedLive("a keep-alive socket closed by the server is retried once on a fresh connection", () =>
    Effect.gen(function*() {
      let connections = 0
      let requests = 0
      const port = yield* rawServer(answerFirstDropRest({
        connection: () => void connections++,
        request: () => void requests++
      }))
      const res = yield* Effect.flatMap(
        SafeHttp,
        (http) => Effect.forEach([1, 2], () => http.request(post(`http://receiver.test:${port}/hook`)))
      ).pipe(Effect.provide(SafeHttp.layer(DEV).pipe(Layer.provide(answers("127.0.0.1").layer))))
      expect(res.map((r) => [r.status, text(r.body)])).toEqual([[200, "ok"], [200, "ok"]])
      expect(requests).toBe(3)
      expect(connections).toBe(2)
    }))

  it.scopedLive("a stale keep-alive socket is retried once only: a second stale socket fails as network, the request sent twice", () =>
    Effect.gen(function*() {
      let connections = 0
      let requests = 0
      const port = yield* rawServer(answerFirstDropRest({
        connection: () => void connections++,
        request: () => void requests++
      }))
      yield* Effect.gen(function*() {
        const http = yield* SafeHttp
        // two requests at once leave two idle keep-alive sockets in the pool
        const first = yield* Effect.all(
          [1, 2].map(() => http.request(post(`http://receiver.test:${port}/hook`))),
          { concurrency: "unbounded" }
        )
        expect(first.map((r) => r.status)).toEqual([200, 200])
        expect(connections).toBe(2)
        // the next request meets both, stale, one after the other: one retry, then network
        yield* expectKind(http.request(post(`http://receiver.test:${port}/hook`)), "network", ["receiver.test"])
        expect(requests).toBe(4)
        expect(connections).toBe(2)
      }).pipe(Effect.provide(SafeHttp.layer(DEV).pipe(Layer.provide(answers("127.0.0.1").layer))))
    }))

  it.scopedLive("a fresh connection closed before any response is network, not retried (the receiver may have the request)", () =>
    Effect.gen(function*() {
      let requests = 0
      const port = yield* rawServer((socket) => {
        socket.on("error", () => undefined)
        socket.on("data", () => {
          requests++
          socket.destroy()
        })
      })
      yield* expectKind(send(DEV, answers("127.0.0.1"), post(`http://receiver.test:${port}/hook`)), "network", [
        "receiver.test",
        "ECONNRESET"
      ])
      expect(requests).toBe(1)
    }))

  it.scopedLive("a malformed response head (a header name with a space, both Content-Length and chunked) is network, never read leniently", () =>
    Effect.gen(function*() {
      const heads = [
        "HTTP/1.1 200 OK\r\nBad Name: x\r\nContent-Length: 2\r\n\r\nok",
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
      ]
      for (const head of heads) {
        const port = yield* rawServer((socket) => {
          socket.on("error", () => undefined)
          socket.once("data", () => socket.end(head))
        })
        yield* expectKind(send(DEV, answers("127.0.0.1"), post(`http://receiver.test:${port}/hook`)), "network", [
          "receiver.test"
        ])
      }
    }))

  it.scopedLive("connection refused on the only address is network", () =>
    Effect.gen(function*() {
      const port = yield* closedPort
      yield* expectKind(send(DEV, answers("127.0.0.1"), post(`http://receiver.test:${port}/hook`)), "network", [
        "receiver.test",
        "127.0.0.1",
        String(port),
        "ECONNREFUSED"
      ])
      yield* expectKind(
        send(DEV, answers("127.0.0.2", "127.0.0.3"), post(`http://receiver.test:${port}/hook`)),
        "network",
        ["127.0.0.2", "127.0.0.3", String(port)]
      )
      yield* expectKind(send(DEV, answers(), post(`http://127.0.0.1:${port}/hook`)), "network", [
        "127.0.0.1",
        String(port)
      ])
    }))

  it.scopedLive("keep-alive: sequential requests to one receiver reuse one connection", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      const res = yield* Effect.flatMap(SafeHttp, (http) =>
        Effect.forEach([1, 2, 3, 4, 5], (i) =>
          http.request(post(`http://receiver.test:${server.port}/hook/${i}`)))).pipe(
          Effect.provide(SafeHttp.layer(DEV).pipe(Layer.provide(resolver.layer)))
        )
      expect(res.map((r) =>
        r.status
      )).toEqual([200, 200, 200, 200, 200])
      expect(server.seen).toHaveLength(5)
      expect(server.connections()).toBe(1)
      // closing the layer's scope destroys the agents and their pooled sockets
      yield* eventually(() => server.open() === 0, "pooled socket closed with the layer")
    }))

  it.scopedLive("maxSocketsPerHost bounds parallel connections to one receiver", () =>
    Effect.gen(function*() {
      const server = yield* startServer((_req, res) => setTimeout(() => ok(_req, res, ""), 100))
      const resolver = answers("127.0.0.1")
      const res = yield* Effect.flatMap(SafeHttp, (http) =>
        Effect.forEach(
          Array.from({ length: 6 }, (_, i) => i),
          (i) => http.request(post(`http://receiver.test:${server.port}/p/${i}`)),
          { concurrency: "unbounded" }
        )).pipe(Effect.provide(SafeHttp.layer({ ...DEV, maxSocketsPerHost: 2 }).pipe(Layer.provide(resolver.layer))))
      expect(res.every((r) => r.status === 200)).toBe(true)
      expect(server.connections()).toBe(2)
    }))

  it.scopedLive("invalid caller headers are refused before connecting", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const url = `http://receiver.test:${server.port}/hook`
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(url, { headers: { "X-A": "line\r\nInjected: 1" } })),
        "invalid_target",
        ["Injected", "receiver.test"]
      )
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(url, { headers: { "Bad Name": "v" } })),
        "invalid_target",
        ["Bad Name"]
      )
      // what node:http itself would throw on is refused as the caller's error, not a network failure
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(url, { headers: { "Bad:Name": "v" } })),
        "invalid_target",
        ["Bad:Name"]
      )
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(url, { headers: { "X-A": "price: 5 €" } })),
        "invalid_target",
        ["price"]
      )
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(url, { headers: { "X-Big": "v".repeat(70 * 1024) } })),
        "request_too_large",
        ["vvvv"]
      )
      expect(server.connections()).toBe(0)
    }))
})

describe("SafeHttp: HTTPS (SNI and certificate checked against the name)", () => {
  const TLS = { ca: CERT }

  it.scopedLive("allow-list: 127.0.0.1 for http://receiver.test without development mode fails the scheme rule", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      yield* expectKind(
        send(
          { allowInsecureDev: false, allowCidrs: cidrs("127.0.0.0/8"), tls: TLS },
          resolver,
          post(`http://receiver.test:${server.port}/hook`)
        ),
        "invalid_target",
        ["receiver.test", "127.0.0.1"]
      )
      expect(resolver.calls).toEqual([])
      expect(server.connections()).toBe(0)
    }))

  it.scopedLive("allow-list: https://receiver.test answering 127.0.0.1 is allowed with 127.0.0.0/8 listed, blocked without", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const url = `https://receiver.test:${server.port}/hook`
      const blocked = answers("127.0.0.1")
      yield* expectKind(send({ ...PROD, tls: TLS }, blocked, post(url)), "blocked_target", [
        "receiver.test",
        "127.0.0.1"
      ])
      yield* expectKind(
        send({ ...PROD, allowCidrs: cidrs("10.0.0.0/8, fd00::/8"), tls: TLS }, answers("127.0.0.1"), post(url)),
        "blocked_target",
        ["127.0.0.1"]
      )
      expect(server.connections()).toBe(0)

      const resolver = answers("127.0.0.1")
      const res = yield* send(
        { allowInsecureDev: false, allowCidrs: cidrs("10.0.0.0/8, 127.0.0.0/8"), tls: TLS },
        resolver,
        post(url)
      )
      expect(res.status).toBe(200)
      expect(text(res.body)).toBe("thanks")
      expect(resolver.calls).toEqual(["receiver.test"])
      expect(server.seen[0]!.headers.host).toBe(`receiver.test:${server.port}`)
      expect(server.seen[0]!.remoteAddress).toBe("127.0.0.1")
    }))

  it.scopedLive("allow-list also admits an https: literal inside it (certificate checked against the IP)", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const url = `https://127.0.0.1:${server.port}/hook`
      yield* expectKind(send({ ...PROD, tls: TLS }, answers(), post(url)), "blocked_target", ["127.0.0.1"])
      const res = yield* send({ ...PROD, allowCidrs: cidrs("127.0.0.1/32"), tls: TLS }, answers(), post(url))
      expect(res.status).toBe(200)
      expect(server.seen[0]!.headers.host).toBe(`127.0.0.1:${server.port}`)
    }))

  it.scopedLive("development mode: https://receiver.test on loopback, SNI = the name; no SNI for a literal", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const resolver = answers("127.0.0.1")
      const res = yield* send({ ...DEV, tls: TLS }, resolver, post(`https://receiver.test:${server.port}/hook`))
      expect(res.status).toBe(200)
      expect(resolver.calls).toEqual(["receiver.test"])
      expect(server.seen[0]!.sni).toBe("receiver.test")
      expect(server.seen[0]!.headers.host).toBe(`receiver.test:${server.port}`)
      const literal = yield* send({ ...DEV, tls: TLS }, answers(), post(`https://127.0.0.1:${server.port}/hook`))
      expect(literal.status).toBe(200)
      expect(server.seen[1]!.sni).toBe(false)
    }))

  it.scopedLive("TLS failures are network: wrong name for the certificate, untrusted certificate", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      // the certificate is for receiver.test: connecting to the same address as other.test must fail
      yield* expectKind(
        send({ ...DEV, tls: TLS }, answers("127.0.0.1"), post(`https://other.test:${server.port}/hook`)),
        "network",
        ["other.test", "127.0.0.1", String(server.port), "altname", "ERR_TLS"]
      )
      // no custom CA: the self-signed certificate is not trusted
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(`https://receiver.test:${server.port}/hook`)),
        "network",
        ["receiver.test", "self-signed", "SELF_SIGNED"]
      )
      expect(server.seen).toHaveLength(0)
      expect(server.connections()).toBe(2)
    }))

  it.scopedLive("NODE_TLS_REJECT_UNAUTHORIZED=0 cannot turn certificate verification off", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const before = process.env["NODE_TLS_REJECT_UNAUTHORIZED"]
      yield* Effect.acquireRelease(
        Effect.sync(() => (process.env["NODE_TLS_REJECT_UNAUTHORIZED"] = "0")),
        () =>
          Effect.sync(() => {
            if (before === undefined) delete process.env["NODE_TLS_REJECT_UNAUTHORIZED"]
            else process.env["NODE_TLS_REJECT_UNAUTHORIZED"] = before
          })
      )
      yield* expectKind(send(DEV, answers("127.0.0.1"), post(`https://receiver.test:${server.port}/hook`)), "network", [
        "receiver.test"
      ])
      expect(server.seen).toHaveLength(0)
    }))
})

describe("SafeHttp: responses", () => {
  it.scopedLive("redirects are not followed: the 302 is the response, the Location target gets nothing", () =>
    Effect.gen(function*() {
      const other = yield* startServer(ok)
      const server = yield* startServer((_req, res) => {
        res.writeHead(302, { Location: `http://receiver.test:${other.port}/elsewhere` })
        res.end()
      })
      const resolver = answers("127.0.0.1")
      const res = yield* send(DEV, resolver, post(`http://receiver.test:${server.port}/hook`))
      expect(res.status).toBe(302)
      expect(res.headers["location"]).toBe(`http://receiver.test:${other.port}/elsewhere`)
      expect(resolver.calls).toHaveLength(1)
      expect(other.connections()).toBe(0)
      expect(other.seen).toHaveLength(0)
    }))

  // These run inside one open layer: closing the layer would destroy every socket and hide a leak.
  it.scopedLive("a receiver that never answers is a timeout; the connection is destroyed", () =>
    Effect.gen(function*() {
      const server = yield* startServer(() => undefined)
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          yield* expectKind(
            http.request(post(`http://receiver.test:${server.port}/hook`, { timeoutMs: 300 })),
            "timeout",
            ["receiver.test", "127.0.0.1", String(server.port)]
          )
          expect(server.seen).toHaveLength(1)
          yield* eventually(() => server.open() === 0, "the timed-out connection closed")
        }))
    }))

  it.scopedLive("a body that stalls half-way is a timeout; the connection is destroyed", () =>
    Effect.gen(function*() {
      const server = yield* startServer((_req, res) => {
        res.writeHead(200, { "content-length": "100" })
        res.write("partial")
      })
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          yield* expectKind(
            http.request(post(`http://receiver.test:${server.port}/hook`, { timeoutMs: 300 })),
            "timeout",
            ["receiver.test"]
          )
          yield* eventually(() => server.open() === 0, "the stalled connection closed")
        }))
    }))

  it.scopedLive("timeoutMs: Infinity is the longest deadline (5 min), not an immediate timeout; NaN, 0 and below fail at once", () =>
    Effect.gen(function*() {
      const server = yield* startServer((_req, res) => res.end("ok"))
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          const res = yield* http.request(post(`http://receiver.test:${server.port}/hook`, { timeoutMs: Infinity }))
          expect(res.status).toBe(200)
          for (const timeoutMs of [Number.NaN, 0, -1, -Infinity]) {
            yield* expectKind(
              http.request(post(`http://receiver.test:${server.port}/hook`, { timeoutMs })),
              "timeout",
              []
            )
          }
          expect(server.seen.length).toBe(1)
        }))
    }))

  it.scopedLive("interrupting a request destroys its connection", () =>
    Effect.gen(function*() {
      const server = yield* startServer(() => undefined)
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.fork(
            http.request(post(`http://receiver.test:${server.port}/hook`, { timeoutMs: 30_000 }))
          )
          yield* eventually(() => server.seen.length === 1, "request arrived")
          expect(server.open()).toBe(1)
          yield* Fiber.interrupt(fiber)
          yield* eventually(() => server.open() === 0, "the interrupted connection closed")
        }))
    }))

  it.scopedLive("a response body over the cap is response_too_large (declared or streamed); at the cap is fine", () =>
    Effect.gen(function*() {
      const declared = yield* startServer((_req, res) => {
        res.writeHead(200, { "content-length": "2000" })
        res.end("x".repeat(2000))
      })
      const streamed = yield* startServer((_req, res) => {
        res.writeHead(200) // chunked: no length announced
        res.write("x".repeat(600))
        setTimeout(() => res.end("y".repeat(600)), 20)
      })
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          yield* expectKind(
            http.request(post(`http://receiver.test:${declared.port}/`, { maxResponseBytes: 1000 })),
            "response_too_large",
            ["receiver.test"]
          )
          yield* expectKind(
            http.request(post(`http://receiver.test:${streamed.port}/`, { maxResponseBytes: 1000 })),
            "response_too_large",
            ["receiver.test"]
          )
          yield* eventually(() => streamed.open() === 0 && declared.open() === 0, "the oversized responses were cut")
          const exact = yield* http.request(post(`http://receiver.test:${declared.port}/`, { maxResponseBytes: 2000 }))
          expect(exact.body.length).toBe(2000)
          expect(exact.truncated).toBe(false)
        }))
    }))

  it.scopedLive("onResponseOverflow: truncate returns the first maxResponseBytes", () =>
    Effect.gen(function*() {
      const server = yield* startServer((_req, res) => {
        res.writeHead(500, { "content-length": "5000", "retry-after": "7" })
        res.end("z".repeat(5000))
      })
      const res = yield* send(
        DEV,
        answers("127.0.0.1"),
        post(`http://receiver.test:${server.port}/`, { maxResponseBytes: 1024, onResponseOverflow: "truncate" })
      )
      expect(res.status).toBe(500)
      expect(res.truncated).toBe(true)
      expect(res.body.length).toBe(1024)
      expect(res.headers["retry-after"]).toBe("7")
      const none = yield* send(
        DEV,
        answers("127.0.0.1"),
        post(`http://receiver.test:${server.port}/`, { maxResponseBytes: 0, onResponseOverflow: "truncate" })
      )
      expect(none.body.length).toBe(0)
      expect(none.truncated).toBe(true)
    }))

  it.scopedLive("truncate (deliveries): a large body gives its status and first bytes; the rest is cut, never a failure", () =>
    Effect.gen(function*() {
      const big = Buffer.alloc(100 * 1024, 0x61)
      big.write("first bytes ", 0)
      const declared = yield* startServer((_req, res) => {
        res.writeHead(200, { "content-length": String(big.length) })
        res.end(big)
      })
      const chunked = yield* startServer((_req, res) => {
        res.writeHead(503, { "retry-after": "3" }) // no length announced
        for (let at = 0; at < big.length; at += 10 * 1024) res.write(big.subarray(at, at + 10 * 1024))
        res.end()
      })
      const small = yield* startServer((_req, res) => {
        res.writeHead(410, { "content-length": "2000" })
        res.end("g".repeat(2000))
      })
      const truncating = {
        maxResponseBytes: 64 * 1024,
        onResponseOverflow: "truncate",
        keepResponseBytes: 1024
      } as const
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          for (const [server, status] of [[declared, 200], [chunked, 503]] as const) {
            const res = yield* http.request(post(`http://receiver.test:${server.port}/`, truncating))
            expect(res.status).toBe(status)
            expect(res.truncated).toBe(true)
            expect(res.body.length).toBe(1024)
            expect(text(res.body)).toBe(big.subarray(0, 1024).toString("utf8"))
          }
          expect(
            (yield* http.request(post(`http://receiver.test:${chunked.port}/`, truncating))).headers["retry-after"]
          )
            .toBe("3")
          yield* eventually(() => declared.open() === 0 && chunked.open() === 0, "the large responses were cut")
          // a body within the cap is read to its end (only the first bytes kept): the connection stays
          for (let i = 0; i < 2; i++) {
            const res = yield* http.request(post(`http://receiver.test:${small.port}/`, truncating))
            expect(res.status).toBe(410)
            expect(res.truncated).toBe(true)
            expect(text(res.body)).toBe("g".repeat(1024))
          }
          expect(small.connections()).toBe(1)
          const whole = yield* http.request(
            post(`http://receiver.test:${small.port}/`, { ...truncating, keepResponseBytes: undefined })
          )
          expect(whole.truncated).toBe(false)
          expect(whole.body.length).toBe(2000)
          // the same large body without truncate (DID documents, PDS calls): still response_too_large
          yield* expectKind(
            http.request(post(`http://receiver.test:${chunked.port}/`, { maxResponseBytes: 64 * 1024 })),
            "response_too_large",
            ["receiver.test"]
          )
        }))
    }))

  it.scopedLive("truncate: once the head arrived, a stalled or broken body ends the read with the status", () =>
    Effect.gen(function*() {
      const stalled = yield* startServer((_req, res) => {
        res.writeHead(200, { "content-length": "100" })
        res.write("partial")
      })
      const broken = yield* startServer((_req, res) => {
        res.writeHead(503, { "content-length": "100" })
        res.write("partial", () => setTimeout(() => res.socket?.destroy(), 20))
      })
      const silent = yield* startServer(() => undefined)
      const truncating = { timeoutMs: 300, onResponseOverflow: "truncate" } as const
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          const late = yield* http.request(post(`http://receiver.test:${stalled.port}/`, truncating))
          expect(late).toMatchObject({ status: 200, truncated: true })
          expect(text(late.body)).toBe("partial")
          yield* eventually(() => stalled.open() === 0, "the stalled connection closed")
          const cut = yield* http.request(
            post(`http://receiver.test:${broken.port}/`, { ...truncating, timeoutMs: 5_000 })
          )
          expect(cut).toMatchObject({ status: 503, truncated: true })
          expect(text(cut.body)).toBe("partial")
          // no head: still a timeout
          yield* expectKind(http.request(post(`http://receiver.test:${silent.port}/`, truncating)), "timeout", [
            "receiver.test"
          ])
          // without truncate, a stalled body is a timeout (as before)
          yield* expectKind(
            http.request(post(`http://receiver.test:${stalled.port}/`, { timeoutMs: 300 })),
            "timeout",
            ["receiver.test"]
          )
        }))
    }))

  it.scopedLive("a request body over the cap is request_too_large without resolving or connecting", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      const url = `http://receiver.test:${server.port}/hook`
      yield* expectKind(
        send(DEV, resolver, post(url, { body: "a".repeat(DEFAULT_MAX_REQUEST_BYTES + 1) })),
        "request_too_large",
        ["receiver.test", "aaaa"]
      )
      // bytes, not characters: 6 × "é" is 12 bytes
      yield* expectKind(send(DEV, resolver, post(url, { body: "éééééé", maxRequestBytes: 11 })), "request_too_large", [
        "é"
      ])
      expect(resolver.calls).toEqual([])
      expect(server.connections()).toBe(0)
      const atCap = yield* send(DEV, resolver, post(url, { body: "éééééé", maxRequestBytes: 12 }))
      expect(atCap.status).toBe(200)
      expect(server.seen[0]!.body).toBe("éééééé")
    }))

  it.scopedLive("URL length: 2,048 characters by default (a webhook URL); a caller's maxUrlLength up to MAX_SERVICE_URL_LENGTH", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      const base = `http://receiver.test:${server.port}/x?c=`
      const of = (n: number) => base + "c".repeat(n - base.length)
      yield* withHttp(DEV, resolver, (http) =>
        Effect.gen(function*() {
          expect((yield* http.request(post(of(2048)))).status).toBe(200)
          yield* expectKind(http.request(post(of(2049))), "invalid_target", ["receiver.test"])
          // the same URL on the same transport (its plans are memoised): accepted under a raised bound
          expect((yield* http.request(post(of(2049), { maxUrlLength: MAX_SERVICE_URL_LENGTH }))).status).toBe(200)
          const longest = of(MAX_SERVICE_URL_LENGTH)
          expect((yield* http.request(post(longest, { maxUrlLength: MAX_SERVICE_URL_LENGTH }))).status).toBe(200)
          // never beyond MAX_SERVICE_URL_LENGTH, whatever the caller asks
          yield* expectKind(
            http.request(post(of(MAX_SERVICE_URL_LENGTH + 1), { maxUrlLength: 10 * MAX_SERVICE_URL_LENGTH })),
            "invalid_target",
            ["receiver.test"]
          )
          // and the default again after a raised one
          yield* expectKind(http.request(post(of(2049))), "invalid_target", ["receiver.test"])
        }))
      expect(server.seen).toHaveLength(3)
    }))

  it.scopedLive("a 101 Switching Protocols is the response (SPEC §4.3: 1xx → redirect), not a network error", () =>
    Effect.gen(function*() {
      const server = yield* startServer((req) => {
        // answered on the raw socket: node's ServerResponse would not send a 101 to a plain POST
        req.socket.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nraw")
      })
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          const res = yield* http.request(post(`http://receiver.test:${server.port}/hook`))
          expect(res.status).toBe(101)
          expect(res.headers["upgrade"]).toBe("websocket")
          expect(res.body).toHaveLength(0)
          expect(res.truncated).toBe(false)
          // the switched connection is never used again: closed, and the next request opens another
          yield* eventually(() => server.open() === 0, "the 101 connection is closed")
          const again = yield* http.request(post(`http://receiver.test:${server.port}/hook`))
          expect(again.status).toBe(101)
          expect(server.connections()).toBe(2)
          expect(server.seen).toHaveLength(2)
        }))
    }))

  it.scopedLive("a response head of 20 KB (over node:http's default 16 KiB) is the response; over 64 KiB is network", () =>
    Effect.gen(function*() {
      const server = yield* startServer((req, res) => {
        const size = req.url === "/huge" ? 70_000 : 20_000
        res.writeHead(200, { "x-padding": "a".repeat(size), "content-length": "2" })
        res.end("ok")
      })
      yield* withHttp(DEV, answers("127.0.0.1"), (http) =>
        Effect.gen(function*() {
          const res = yield* http.request(post(`http://receiver.test:${server.port}/hook`))
          expect(res.status).toBe(200)
          expect(res.headers["x-padding"]).toHaveLength(20_000)
        }))
      yield* expectKind(send(DEV, answers("127.0.0.1"), post(`http://receiver.test:${server.port}/huge`)), "network", [
        "receiver.test",
        "127.0.0.1"
      ])
    }))

  it.scopedLive("a server that resets the connection mid-response is network", () =>
    Effect.gen(function*() {
      const server = yield* startServer((req, res) => {
        res.writeHead(200, { "content-length": "100" })
        res.write("partial", () => req.socket.destroy())
      })
      yield* expectKind(send(DEV, answers("127.0.0.1"), post(`http://receiver.test:${server.port}/hook`)), "network", [
        "receiver.test",
        "127.0.0.1"
      ])
    }))
})

describe("SafeHttp: pure parts", () => {
  it("parseAllowCidrs: comma-separated, whitespace-tolerant, strict", () => {
    expect(parseAllowCidrs("")).toEqual(Either.right([]))
    expect(parseAllowCidrs("   ")).toEqual(Either.right([]))
    const two = parseAllowCidrs(" 10.0.0.0/8 ,fd00::/8")
    expect(Either.isRight(two) && two.right.map((c) => [c.family, c.prefix])).toEqual([[4, 8], [6, 8]])
    for (
      const bad of [
        "10.0.0.0/8,",
        ",10.0.0.0/8",
        "10.0.0.0/8,,fd00::/8",
        "10.0.0.1/8",
        "10.0.0.0",
        "10.0.0.0/33",
        "fe80::1%eth0/64",
        "example.com/8"
      ]
    ) {
      expect(parseAllowCidrs(bad)).toEqual(Either.left("invalid_cidr"))
    }
    const many = (n: number) => Array.from({ length: n }, (_, i) => `10.${i >> 8}.${i & 255}.0/24`).join(",")
    expect(Either.isRight(parseAllowCidrs(many(256)))).toBe(true)
    expect(parseAllowCidrs(many(257))).toEqual(Either.left("invalid_cidr"))
  })

  it("request headers: names, values and 4 bytes each count toward MAX_REQUEST_HEADER_BYTES; hop-by-hop headers are dropped", () => {
    const fill = (total: number) => ({ "X-Big": "v".repeat(total - "X-Big".length - 4) })
    expect(Either.isRight(buildHeaders(fill(MAX_REQUEST_HEADER_BYTES), "h.test", undefined))).toBe(true)
    expect(buildHeaders(fill(MAX_REQUEST_HEADER_BYTES + 1), "h.test", undefined)).toEqual(
      Either.left("request_too_large")
    )
    const hopByHop = [
      "HOST",
      "Content-Length",
      "transfer-encoding",
      "Connection",
      "Keep-Alive",
      "Proxy-Connection",
      "Upgrade",
      "TE",
      "Trailer",
      "Expect",
      "HTTP2-Settings"
    ]
    const headers = Either.getOrThrow(
      buildHeaders(Object.fromEntries([["X-Keep", "1"], ...hopByHop.map((n) => [n, "x"])]), "h.test:8443", 3)
    )
    expect(headers).toEqual({ "X-Keep": "1", Host: "h.test:8443", "Content-Length": "3" })
  })

  it("allowedAddress: public, allow-list, development loopback, loopback-only", () => {
    const allow = [parseCidr("10.0.0.0/8")!, parseCidr("fd00::/8")!]
    const prod = { allowInsecureDev: false, allowCidrs: allow, loopbackOnly: false }
    const dev = { allowInsecureDev: true, allowCidrs: [], loopbackOnly: false }
    const devHttp = { allowInsecureDev: true, allowCidrs: allow, loopbackOnly: true }
    expect(allowedAddress("1.1.1.1", prod)).toBeDefined()
    expect(allowedAddress("2606:4700::1111", prod)).toBeDefined()
    expect(allowedAddress("10.1.2.3", prod)).toBeDefined()
    expect(allowedAddress("fd12::1", prod)).toBeDefined()
    expect(allowedAddress("11.0.0.1", prod)).toBeDefined()
    expect(allowedAddress("192.168.0.1", prod)).toBeUndefined()
    expect(allowedAddress("127.0.0.1", prod)).toBeUndefined()
    expect(allowedAddress("::ffff:10.0.0.1", prod)).toBeUndefined() // families never mix
    expect(allowedAddress("127.0.0.1", dev)).toBeDefined()
    expect(allowedAddress("::1", dev)).toBeDefined()
    expect(allowedAddress("10.0.0.1", dev)).toBeUndefined()
    expect(allowedAddress("127.0.0.5", devHttp)).toBeDefined()
    expect(allowedAddress("1.1.1.1", devHttp)).toBeUndefined()
    expect(allowedAddress("10.0.0.1", devHttp)).toBeUndefined()
    expect(allowedAddress("127.0.0.1", { ...devHttp, allowInsecureDev: false })).toBeUndefined()
    for (const junk of ["", "127.1", "0x7f.0.0.1", "fe80::1%eth0", "[::1]", "localhost", "1.1.1.1 "]) {
      expect(allowedAddress(junk, { ...dev, allowCidrs: [parseCidr("0.0.0.0/0")!] })).toBeUndefined()
    }
  })

  it("planTarget: Host header, port, path, SNI", () => {
    const opts = { allowInsecureDev: false, allowCidrs: [] }
    const t = Either.getOrThrow(planTarget("https://Example.COM./a/b?c=d%20e", opts))
    expect(t).toMatchObject({
      protocol: "https:",
      hostname: "example.com.",
      hostHeader: "example.com.",
      port: 443,
      path: "/a/b?c=d%20e",
      servername: "example.com",
      loopbackOnly: false,
      literal: undefined
    })
    const p = Either.getOrThrow(planTarget("https://example.com:8443", opts))
    expect(p).toMatchObject({ hostHeader: "example.com:8443", port: 8443, path: "/" })
    const v6 = Either.getOrThrow(planTarget("https://[2606:4700::1111]:444/x", opts))
    expect(v6).toMatchObject({ hostHeader: "[2606:4700::1111]:444", servername: undefined })
    expect(v6.literal).toHaveLength(16)
    expect(planTarget("https://1.1.1.1/", opts)).toSatisfy(Either.isRight)
    expect(planTarget("https://0x7f.1/", opts)).toEqual(Either.left("blocked_target"))
    expect(planTarget("https://127.1/", opts)).toEqual(Either.left("blocked_target"))
    expect(planTarget("https://[fe80::1%25eth0]/", opts)).toSatisfy(Either.isLeft)
    const dev = { allowInsecureDev: true, allowCidrs: [] }
    expect(Either.getOrThrow(planTarget("http://receiver.test:8080/h", dev))).toMatchObject({
      protocol: "http:",
      loopbackOnly: true,
      servername: undefined,
      port: 8080
    })
    expect(planTarget("http://u:p@receiver.test/", dev)).toEqual(Either.left("invalid_target"))
    expect(planTarget("http://receiver.test/#x", dev)).toEqual(Either.left("invalid_target"))
    expect(planTarget("http://10.0.0.1/", { ...dev, allowCidrs: cidrs("10.0.0.0/8") })).toEqual(
      Either.left("invalid_target")
    )
  })

  it("errors render generically", () => {
    for (
      const kind of [
        "invalid_target",
        "blocked_target",
        "dns",
        "timeout",
        "network",
        "request_too_large",
        "response_too_large"
      ] as const
    ) {
      const e = new SafeHttpError({ kind })
      expect(String(e)).toBe(`SafeHttpError: delivery failed: ${kind}`)
      expect(JSON.parse(JSON.stringify(e))).toEqual({ _tag: "SafeHttpError", kind })
    }
  })
})

describe("SafeHttp under Bun", () => {
  it("the production runtime's node:http honours host/servername/Host (smoke script prints ok)", async () => {
    const out = await new Promise<{ stdout: string; stderr: string; code: number | null }>((resolve) => {
      execFile(
        BUN,
        [Path.join(ROOT, "test/support/safehttp-bun-smoke.ts")],
        {
          cwd: ROOT,
          timeout: 60_000,
          env: {
            PATH: process.env["PATH"] ?? "",
            HOME: process.env["HOME"] ?? "/tmp",
            SMOKE_CERT: CERT_PATH,
            SMOKE_KEY: KEY_PATH
          }
        },
        (error, stdout, stderr) =>
          resolve({ stdout, stderr, code: error === null ? 0 : typeof error.code === "number" ? error.code : -1 })
      )
    })
    expect(out.stderr).toBe("")
    expect(out.stdout.trim()).toBe("ok")
    expect(out.code).toBe(0)
  })
})
