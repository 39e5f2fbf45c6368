/**
 * The owners' API requests (SPEC §8.1, §8.3) over real HTTP, pinned where a mutation audit found
 * them untested: a media type's case and its `charset` parameter (docs/api.md: "application/json
 * exactly, with an optional charset"; none at all is a 400), a Content-Length over the bound
 * refused before the body is read, a body that is not UTF-8 inside a JSON string, the messages of
 * refused input (the field and the rule, never the value), the routes of `/.well-known/did.json`
 * (GET only) and of an unconfigured service (every `/xrpc/` call 503, known method or not), the
 * metric's `unknown` label for paths that are no method, `Cache-Control: no-store` on errors, and
 * the deadline of `API_CALL_TIMEOUT_MS` (TestClock).
 */
import { describe, expect, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Metric, MetricState, Schema, TestClock } from "effect"
import { contract, NoParams } from "../../src/schemas/XrpcContract.js"
import * as Api from "../../src/services/api/Api.js"
import { method } from "../../src/services/api/Methods.js"
import { apiLayer, callAs, mint, newOwner, serverPort, unfinishedPost } from "./support.js"

/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const CREATE = "place.wisp.v2.secret.create"

/** A procedure whose handler never ends (the deadline test). */
let entered: Deferred.Deferred<void> | undefined
const slow = method(
  contract({
    nsid: "dev.firehook.test.slow",
    kind: "procedure",
    params: NoParams,
    input: Schema.Struct({}),
    output: Schema.Struct({})
  }),
  () =>
    Effect.gen(function*() {
      if (entered !== undefined) yield* Deferred.succeed(entered, undefined)
      return yield* Effect.never
    })
)

/** The count of `firehook_api_calls_total` per method label. */
const callsByMethod = Effect.map(Metric.snapshot, (pairs) => {
  const out = new Map<string, number>()
  for (const pair of pairs) {
    if (pair.metricKey.name !== "firehook_api_calls_total") continue
    const label = pair.metricKey.tags.find((t) => t.key === "method")?.value ?? ""
    const state = pair.metricState
    if (MetricState.isCounterState(state)) out.set(label, (out.get(label) ?? 0) + Number(state.count))
  }
  return out
})

describe("requests (bounds)", () => {
  layer(apiLayer({ methods: [...Api.SERVED_METHODS, slow], env: { API_CALL_TIMEOUT_MS: "2000" } }))((it) => {
    it.effect("Content-Type: application/json in any case, with a charset parameter, is JSON", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        for (
          const [name, contentType] of [
            ["upper", "Application/JSON"],
            ["charset", "application/json; charset=utf-8"],
            ["both", "APPLICATION/JSON;charset=UTF-8"]
          ] as const
        ) {
          const r = yield* callAs(owner, CREATE, { body: { name }, contentType })
          expect([contentType, r.status, r.body["name"]]).toEqual([contentType, 200, name])
        }
      }))

    it.effect("a JSON body sent without a Content-Type is InvalidRequest", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const port = yield* serverPort
        const token = yield* mint(owner, CREATE)
        const res = yield* Effect.promise(() =>
          fetch(`http://127.0.0.1:${port}/xrpc/${CREATE}`, {
            method: "POST",
            headers: { authorization: `Bearer ${token}` },
            body: new TextEncoder().encode(JSON.stringify({ name: "untyped" }))
          })
        )
        expect([res.status, yield* Effect.promise(() => res.json())]).toEqual([
          400,
          { error: "InvalidRequest", message: "the body must be application/json" }
        ])
      }))

    it.effect("a body with bytes that are not UTF-8 is InvalidRequest, even inside a string it ignores", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const prefix = new TextEncoder().encode("{\"name\":\"u8\",\"pad\":\"")
        const raw = Uint8Array.from([...prefix, 0xff, 0xfe, 0x22, 0x7d])
        const r = yield* callAs(owner, CREATE, { raw })
        expect([r.status, r.body]).toEqual([400, { error: "InvalidRequest", message: "the body is not UTF-8" }])
        // the same body in UTF-8 is read
        const ok = yield* callAs(owner, CREATE, { body: { name: "u8", pad: "\u00ff" } })
        expect(ok.status).toBe(200)
      }))

    it.effect("a refused parameter or input names its field and the rule, never the value (docs/api.md)", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const cases: ReadonlyArray<readonly [string, Parameters<typeof callAs>[2], string]> = [
          [CREATE, { body: {} }, "input name: is missing"],
          [CREATE, { body: { name: "a/secret-value" } }, "input name: is invalid"],
          [CREATE, { body: [] }, "input is invalid"],
          ["dev.firehook.webhook.listDeliveries", { query: "limit=0" }, "parameter limit: is invalid"]
        ]
        for (const [nsid, options, message] of cases) {
          const r = yield* callAs(owner, nsid, options)
          expect([r.status, r.body]).toEqual([400, { error: "InvalidRequest", message }])
        }
      }))

    it.effect("a Content-Length over the bound is refused unread: 400 before the body is sent", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const port = yield* serverPort
        const headers = (token: string) => ({ authorization: `Bearer ${token}` })
        // 65,537 bytes announced, 8 sent, the rest never: the answer does not wait for them
        const over = yield* unfinishedPost(port, CREATE, headers(yield* mint(owner, CREATE)), {
          declared: 65_537,
          waitMs: 5_000
        })
        expect(over).toEqual({
          status: 400,
          body: JSON.stringify({ error: "InvalidRequest", message: "the body must be at most 65536 bytes" })
        })
      }))

    it.effect("errors are answered with Cache-Control: no-store, as every response (docs/api.md)", () =>
      Effect.gen(function*() {
        const port = yield* serverPort
        for (
          const [path, status] of [
            ["/xrpc/place.wisp.v2.secret.list", 401],
            ["/xrpc/place.wisp.v2.secret.nope", 501],
            ["/xrpc/place.wisp.v2.secret.create", 405],
            ["/nope", 404]
          ] as const
        ) {
          const res = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}${path}`))
          expect([path, res.status, res.headers.get("cache-control")]).toEqual([path, status, "no-store"])
          yield* Effect.promise(() => res.arrayBuffer())
        }
      }))

    it.effect("paths that are no method are counted under method=\"unknown\", never their own label", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const nsid = `place.wisp.v2.secret.nope${Date.now()}`
        const before = (yield* callsByMethod).get("unknown") ?? 0
        const r = yield* callAs(owner, nsid)
        expect([r.status, r.body["error"]]).toEqual([501, "MethodNotImplemented"])
        const after = yield* callsByMethod
        expect(after.get("unknown")).toBe(before + 1)
        expect(after.has(nsid)).toBe(false)
      }))

    it.effect("API_CALL_TIMEOUT_MS is the call's deadline: 504 after 2 s (TestClock), not 10", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        entered = yield* Deferred.make<void>()
        const pending = yield* Effect.fork(callAs(owner, "dev.firehook.test.slow", { body: {} }))
        yield* Deferred.await(entered)
        yield* TestClock.adjust("1999 millis")
        expect(pending.unsafePoll()).toBeNull()
        yield* TestClock.adjust("1 millis")
        const r = yield* Fiber.join(pending)
        expect([r.status, r.body]).toEqual([504, {
          error: "UpstreamTimeout",
          message: "the call did not finish in time"
        }])
        entered = undefined
      }))
  })
})

describe("/.well-known/did.json (bounds)", () => {
  layer(apiLayer({ env: { SERVICE_DID: "", PUBLIC_URL: "http://localhost:3004" } }))((it) => {
    it.effect("only GET serves it: another verb is 404 NotFound", () =>
      Effect.gen(function*() {
        const port = yield* serverPort
        for (const verb of ["POST", "PUT", "DELETE"]) {
          const res = yield* Effect.promise(() =>
            fetch(`http://127.0.0.1:${port}/.well-known/did.json`, { method: verb })
          )
          expect([verb, res.status]).toEqual([verb, 404])
          expect(yield* Effect.promise(() => res.json())).toEqual({ error: "NotFound", message: "not found" })
        }
        const get = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/.well-known/did.json`))
        expect(get.status).toBe(200)
      }))
  })
})

describe("not configured (bounds)", () => {
  layer(apiLayer({ env: { SERVICE_DID: "" } }))((it) => {
    it.effect("every /xrpc/ call is 503 NotConfigured, an unknown method and a wrong verb too (SPEC §8.1)", () =>
      Effect.gen(function*() {
        const port = yield* serverPort
        for (
          const [verb, nsid] of [
            ["GET", "place.wisp.v2.secret.nope"],
            ["POST", "place.wisp.v2.secret.list"],
            ["GET", "place.wisp.v2.secret.create"]
          ] as const
        ) {
          const res = yield* Effect.promise(() => fetch(`http://127.0.0.1:${port}/xrpc/${nsid}`, { method: verb }))
          expect([verb, nsid, res.status]).toEqual([verb, nsid, 503])
          expect(((yield* Effect.promise(() => res.json())) as { error: string }).error).toBe("NotConfigured")
        }
      }))
  })
})
