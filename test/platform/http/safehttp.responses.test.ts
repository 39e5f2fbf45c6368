/**
 * SafeHttp (SPEC §4.6), responses: redirects, timeouts, interruption, size caps and truncation,
 * URL length, unusual response heads (real HTTP servers on 127.0.0.1, a fake Resolver).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { DEFAULT_MAX_REQUEST_BYTES, MAX_SERVICE_URL_LENGTH } from "../../../src/services/platform/http/SafeHttp.js"
import {
  answers,
  DEV,
  eventually,
  expectKind,
  ok,
  post,
  send,
  startServer,
  text,
  withHttp
} from "./safehttp-support.js"

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
