/**
 * The owners' API requests (SPEC §8.1, §8.3) over real HTTP: routes, verbs, the unconfigured
 * service, `/.well-known/did.json`, JSON bodies (≤ 64 KiB, application/json), parameters decoded by
 * the lexicon Schemas, the 10 s deadline (TestClock), errors as `{error, message}`, and a
 * subscription method that gets the verified caller at the WebSocket upgrade. Probe methods
 * (`dev.firehook.test.*`) stand in where the served table has no method of the kind.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Socket from "@effect/platform/Socket"
import { describe, expect, it, layer } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Layer, Schema, Scope, TestClock } from "effect"
import * as Http from "node:http"
import WebSocket from "ws"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"
import { contract, NoParams } from "../../src/schemas/XrpcContract.js"
import * as Api from "../../src/services/api/Api.js"
import { method, subscription } from "../../src/services/api/Methods.js"
import { MAX_PARAMS, queryParams } from "../../src/services/api/Xrpc.js"
import { invalidRequest } from "../../src/services/api/XrpcError.js"
import { apiLayer, call, callAs, healthApi, mint, newOwner, serverPort } from "./support.js"

/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))

/** A procedure whose handler waits until released (the deadline test). */
let entered: Deferred.Deferred<void> | undefined
let interrupted = false
const slow = method(
  contract({
    nsid: "dev.firehook.test.slow",
    kind: "procedure",
    params: NoParams,
    input: Schema.Struct({ x: Schema.Number }),
    output: Schema.Struct({})
  }),
  () =>
    Effect.gen(function*() {
      if (entered !== undefined) yield* Deferred.succeed(entered, undefined)
      return yield* Effect.never.pipe(Effect.onInterrupt(() => Effect.sync(() => (interrupted = true))))
    })
)

/** listDeliveries' contract with a handler that echoes the decoded parameters' count. */
let lastParams: unknown
const deliveries = method(WebhookLexicon.listDeliveries, ({ params }) =>
  Effect.sync(() => {
    lastParams = params
    return { deliveries: [] }
  }))

/** A handler whose output breaks its Schema (a bug): 500, never the value. */
const broken = method(
  contract({
    nsid: "dev.firehook.test.broken",
    kind: "query",
    params: NoParams,
    output: Schema.Struct({ n: Schema.Number })
  }),
  () => Effect.succeed({ n: "x" as unknown as number })
)

/** A subscription: the verified caller, sent over the upgraded WebSocket. */
const tail = subscription(
  contract({ nsid: "dev.firehook.test.tail", kind: "subscription", params: NoParams, output: Schema.Unknown }),
  ({ caller }) =>
    Effect.gen(function*() {
      const socket = yield* HttpServerRequest.upgrade.pipe(Effect.mapError(() => invalidRequest("not an upgrade")))
      const write = yield* socket.writer
      yield* socket.runRaw(() => Effect.void, {
        onOpen: write(JSON.stringify({ caller })).pipe(
          Effect.zipRight(write(new Socket.CloseEvent(1000))),
          Effect.orDie
        )
      }).pipe(Effect.ignore)
      return HttpServerResponse.empty()
    })
)

/** A subscription that stays open until the client or the server ends it. */
const forever = subscription(
  contract({ nsid: "dev.firehook.test.forever", kind: "subscription", params: NoParams, output: Schema.Unknown }),
  () =>
    Effect.gen(function*() {
      const socket = yield* HttpServerRequest.upgrade.pipe(Effect.mapError(() => invalidRequest("not an upgrade")))
      const write = yield* socket.writer
      yield* socket.runRaw(() => Effect.void, { onOpen: Effect.orDie(write("open")) }).pipe(Effect.ignore)
      return HttpServerResponse.empty()
    })
)

const METHODS = [...Api.SERVED_METHODS, slow, deliveries, broken, tail, forever]

/** Open a WebSocket to `nsid`; the first message, or the HTTP status of a refused upgrade. */
const websocket = (port: number, nsid: string, token: string | undefined) =>
  Effect.async<{ message?: string; status?: number }>((resume) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/xrpc/${nsid}`, {
      headers: token === undefined ? {} : { authorization: `Bearer ${token}` }
    })
    ws.on("message", (d: Buffer) => {
      resume(Effect.succeed({ message: d.toString("utf8") }))
      ws.close()
    })
    ws.on("unexpected-response", (_req, res) => {
      resume(Effect.succeed({ status: res.statusCode ?? 0 }))
      ws.terminate()
    })
    ws.on("error", () => {})
    return Effect.sync(() => ws.terminate())
  })

/** A chunked POST (no Content-Length) of `bytes`; the status. */
const chunkedPost = (port: number, nsid: string, token: string, bytes: Buffer) =>
  Effect.async<number>((resume) => {
    const req = Http.request({
      host: "127.0.0.1",
      port,
      method: "POST",
      path: `/xrpc/${nsid}`,
      headers: { "content-type": "application/json", authorization: `Bearer ${token}`, "transfer-encoding": "chunked" }
    })
    req.on("response", (res) => {
      res.resume()
      resume(Effect.succeed(res.statusCode ?? 0))
    })
    req.on("error", () => {})
    for (let i = 0; i < bytes.length; i += 8192) req.write(bytes.subarray(i, i + 8192))
    req.end()
    return Effect.sync(() => req.destroy())
  })

describe("requests", () => {
  layer(apiLayer({ methods: METHODS }))((it) => {
    it.effect("routes: /xrpc/<nsid> and nothing else; unknown methods 501; wrong verbs 405", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const client = yield* call("place.wisp.v2.secret.nope")
        expect([client.status, client.body["error"]]).toEqual([501, "MethodNotImplemented"])
        const port = yield* serverPort
        for (const path of ["/", "/xrpc", "/health", "/.well-known/did.json", "/xrpc-x/place.wisp.v2.secret.list"]) {
          const r = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}${path}`))
          expect([path, r.status]).toEqual([path, 404])
          expect(yield* Effect.promise(() => r.json())).toEqual({ error: "NotFound", message: "not found" })
        }
        const get = yield* callAs(owner, "place.wisp.v2.secret.create")
        expect([get.status, get.body["error"], get.headers["allow"]]).toEqual([405, "InvalidRequest", "POST"])
        const post = yield* callAs(owner, "place.wisp.v2.secret.list", { body: {} })
        expect([post.status, post.headers["allow"]]).toEqual([405, "GET"])
      }))

    it.effect("procedure bodies: application/json, at most 64 KiB, UTF-8 JSON; otherwise InvalidRequest", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const create = "place.wisp.v2.secret.create"
        const cases: ReadonlyArray<readonly [string, Parameters<typeof callAs>[2]]> = [
          ["no body", { method: "POST" }],
          ["text/plain", { body: { name: "a" }, contentType: "text/plain" }],
          ["application/json-seq", { body: { name: "a" }, contentType: "application/json-seq" }],
          ["not JSON", { raw: new TextEncoder().encode("{name:") }],
          ["not UTF-8", { raw: Uint8Array.from([0x7b, 0xff, 0xfe, 0x7d]) }],
          ["over 64 KiB", { body: { name: "a", pad: "x".repeat(65 * 1024) } }],
          ["a JSON string", { body: "name" }],
          // deeply nested JSON (under 64 KiB): the Schema refuses it without formatting the value
          ["nested arrays", { raw: new TextEncoder().encode("[".repeat(5000) + "]".repeat(5000)) }],
          ["a nested name", { raw: new TextEncoder().encode(`{"name":${"[".repeat(5000)}${"]".repeat(5000)}}`) }]
        ]
        for (const [what, options] of cases) {
          const r = yield* callAs(owner, create, options)
          expect([what, r.status, r.body["error"], typeof r.body["message"]]).toEqual([
            what,
            400,
            "InvalidRequest",
            "string"
          ])
        }
        // just under the bound is read (and the unknown field ignored)
        const big = yield* callAs(owner, create, { body: { name: "big", pad: "x".repeat(60 * 1024) } })
        expect(big.status).toBe(200)
        // a body without Content-Length is bounded as it is read
        const port = yield* serverPort
        const huge = Buffer.from(JSON.stringify({ name: "huge", pad: "x".repeat(200 * 1024) }))
        expect(yield* chunkedPost(port, create, yield* mint(owner, create), huge)).toBe(400)
        const small = Buffer.from(JSON.stringify({ name: "chunked" }))
        expect(yield* chunkedPost(port, create, yield* mint(owner, create), small)).toBe(200)
      }))

    it.effect("procedure bodies: exactly 64 KiB (65,536 UTF-8 bytes) is read, one byte more is refused, with or without Content-Length", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const create = "place.wisp.v2.secret.create"
        const port = yield* serverPort
        // `{"name":"<name>","pad":"<pad>"}` of exactly `bytes` UTF-8 bytes; `two` pads with 2-byte "é"
        const body = (name: string, bytes: number, two = false): Buffer => {
          const room = bytes - Buffer.byteLength(JSON.stringify({ name, pad: "" }))
          const pad = two ? "é".repeat(Math.floor(room / 2)) + "x".repeat(room % 2) : "x".repeat(room)
          const b = Buffer.from(JSON.stringify({ name, pad }))
          expect(b.length).toBe(bytes)
          return b
        }
        const sent = (b: Buffer) => ({ raw: new Uint8Array(b.buffer, b.byteOffset, b.length) })
        expect((yield* callAs(owner, create, sent(body("edge-cl", 65_536)))).status).toBe(200)
        expect((yield* callAs(owner, create, sent(body("over-cl", 65_537)))).status).toBe(400)
        // bytes, not characters: 65,537 bytes are fewer than 33,000 characters here
        expect((yield* callAs(owner, create, sent(body("over-utf8", 65_537, true)))).status).toBe(400)
        expect(yield* chunkedPost(port, create, yield* mint(owner, create), body("edge-chunked", 65_536))).toBe(200)
        expect(yield* chunkedPost(port, create, yield* mint(owner, create), body("over-chunked", 65_537))).toBe(400)
        expect(yield* chunkedPost(port, create, yield* mint(owner, create), body("over-chunked8", 65_537, true))).toBe(
          400
        )
      }))

    it.effect("parameters are decoded by the lexicon Schema: malformed ones are InvalidRequest", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const nsid = "dev.firehook.webhook.listDeliveries"
        const ok = yield* callAs(owner, nsid, {
          query: "rkey=abc&status=dead_letter&limit=7&since=2026-01-01T00:00:00Z"
        })
        expect([ok.status, ok.body]).toEqual([200, { deliveries: [] }])
        expect(lastParams).toEqual({ rkey: "abc", status: "dead_letter", limit: 7, since: "2026-01-01T00:00:00Z" })
        expect((yield* callAs(owner, nsid)).status).toBe(200)
        expect(lastParams).toEqual({ limit: 50 })
        for (
          const query of [
            "limit=0",
            "limit=101",
            "limit=abc",
            "limit=1.5",
            "limit=01",
            "limit=1&limit=2",
            "status=unknown",
            "since=yesterday",
            "since=2026-01-01",
            "rkey=..",
            `cursor=${"c".repeat(600)}`,
            `x=${"y".repeat(9000)}`
          ]
        ) {
          const r = yield* callAs(owner, nsid, { query })
          expect([query, r.status, r.body["error"]]).toEqual([query, 400, "InvalidRequest"])
        }
      }))

    it.effect("a 10 s deadline per call (TestClock): 504, the handler interrupted", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        entered = yield* Deferred.make<void>()
        const pending = yield* Effect.fork(callAs(owner, "dev.firehook.test.slow", { body: { x: 1 } }))
        yield* Deferred.await(entered)
        yield* TestClock.adjust("9 seconds")
        expect(pending.unsafePoll()).toBeNull()
        yield* TestClock.adjust("1 second")
        const r = yield* Fiber.join(pending)
        expect([r.status, r.body["error"]]).toEqual([504, "UpstreamTimeout"])
        expect(interrupted).toBe(true)
        entered = undefined
      }))

    it.effect("an output that breaks its Schema is a 500 with a fixed message", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const r = yield* callAs(owner, "dev.firehook.test.broken")
        expect([r.status, r.body]).toEqual([500, { error: "InternalServerError", message: "internal error" }])
      }))

    it.effect("a subscription gets the verified caller at the WebSocket upgrade; a bad token is refused there", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const port = yield* serverPort
        const nsid = "dev.firehook.test.tail"
        const ok = yield* websocket(port, nsid, yield* mint(owner, nsid))
        expect(ok.message === undefined ? undefined : JSON.parse(ok.message)).toEqual({ caller: owner.did })
        expect((yield* websocket(port, nsid, undefined)).status).toBe(401)
        expect((yield* websocket(port, nsid, yield* mint(owner, "place.wisp.v2.secret.list"))).status).toBe(401)
      }))

    it.effect("health: configured, and counts", () =>
      Effect.gen(function*() {
        const api = (yield* healthApi) as { configured: boolean; calls: number; authFailures: number }
        expect(api.configured).toBe(true)
        expect(api.calls).toBeGreaterThan(20)
        expect(api.authFailures).toBe(2)
      }))
  })
})

describe("shutdown", () => {
  it.live("an open subscription does not hold the listener's shutdown", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(apiLayer({ methods: METHODS }), scope)
      const owner = yield* newOwner()
      const nsid = "dev.firehook.test.forever"
      const port = yield* serverPort.pipe(Effect.provide(context))
      const token = yield* mint(owner, nsid)
      const closed = yield* Deferred.make<number>()
      const opened = yield* Deferred.make<string>()
      const ws = new WebSocket(`ws://127.0.0.1:${port}/xrpc/${nsid}`, { headers: { authorization: `Bearer ${token}` } })
      ws.on("message", (d: Buffer) => Effect.runSync(Deferred.succeed(opened, d.toString("utf8"))))
      ws.on("close", (code: number) => Effect.runSync(Deferred.succeed(closed, code)))
      ws.on("error", () => {})
      expect(yield* Deferred.await(opened)).toBe("open")
      const stopped = yield* Scope.close(scope, Exit.void).pipe(Effect.timeout("10 seconds"), Effect.option)
      expect(stopped._tag).toBe("Some")
      expect(yield* Deferred.await(closed).pipe(Effect.timeout("5 seconds"), Effect.option)).not.toEqual(
        { _tag: "None" }
      )
    }))
})

describe("not configured (no SERVICE_DID, no PUBLIC_URL)", () => {
  layer(apiLayer({ env: { SERVICE_DID: "" } }))((it) => {
    it.effect("every method answers 503 NotConfigured; health says configured: false", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        for (const nsid of ["place.wisp.v2.secret.list", "place.wisp.v2.secret.create", "dev.firehook.webhook.list"]) {
          const r = yield* callAs(owner, nsid, nsid.endsWith("create") ? { body: { name: "a" } } : {})
          expect([r.status, r.body["error"]]).toEqual([503, "NotConfigured"])
        }
        expect(yield* healthApi).toEqual({ configured: false, calls: 3, authFailures: 0, rateLimited: 0 })
        const port = yield* serverPort
        const did = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/.well-known/did.json`))
        expect(did.status).toBe(404)
      }))
  })
})

describe("/.well-known/did.json", () => {
  layer(apiLayer({ env: { SERVICE_DID: "", PUBLIC_URL: "http://localhost:3004" } }))((it) => {
    it.effect("served when the service DID is the did:web of PUBLIC_URL (SPEC §8.1)", () =>
      Effect.gen(function*() {
        const port = yield* serverPort
        const res = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/.well-known/did.json`))
        expect(res.status).toBe(200)
        expect(yield* Effect.promise(() => res.json())).toEqual({
          "@context": ["https://www.w3.org/ns/did/v1"],
          id: "did:web:localhost%3A3004",
          service: [{ id: "#firehook", type: "FirehookService", serviceEndpoint: "http://localhost:3004" }]
        })
      }))
  })
  layer(apiLayer({ env: { SERVICE_DID: "did:web:elsewhere.example", PUBLIC_URL: "http://localhost:3004" } }))((it) => {
    it.effect("not served for another service DID", () =>
      Effect.gen(function*() {
        const port = yield* serverPort
        const res = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/.well-known/did.json`))
        expect(res.status).toBe(404)
      }))
  })
})

describe("query strings", () => {
  it("at most 64 parameters are read; one more is InvalidRequest", () => {
    const query = (n: number) => `/xrpc/x?${Array.from({ length: n }, (_, i) => `p${i}=v`).join("&")}`
    const read = queryParams(query(MAX_PARAMS))
    expect(read._tag === "Right" ? Object.keys(read.right).length : "refused").toBe(64)
    const over = queryParams(query(MAX_PARAMS + 1))
    expect(over._tag === "Left" ? over.left.error : "read").toBe("InvalidRequest")
  })
})
