/**
 * SafeHttp (SPEC §4.6), connecting: only to the validated address, the next address after a
 * failure, keep-alive and its one retry, caller headers (real HTTP servers on 127.0.0.1, a fake
 * Resolver).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer } from "effect"
import { MAX_CONNECT_ADDRESSES, SafeHttp } from "../../../src/services/platform/http/SafeHttp.js"
import {
  answerFirstDropRest,
  answers,
  cidrs,
  closedPort,
  DEV,
  eventually,
  expectKind,
  fakeResolver,
  fam,
  ok,
  post,
  PROD,
  rawServer,
  send,
  startServer,
  text
} from "./safehttp-support.js"

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
