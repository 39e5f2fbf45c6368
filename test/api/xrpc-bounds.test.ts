/**
 * The pipeline's error mapping and deadline (SPEC §8.3; Xrpc.ts: "a defect is a 500 with a fixed
 * message and a log line naming the method, never a value"; "a 10 s deadline covers a call from
 * authentication"): an output its lexicon refuses is such a 500, with its line; a verification
 * that never ends is a 504 after 10 s, for a query and for a subscription's upgrade request; a
 * call that is interrupted (its client went away, the server stops) is not a defect: it ends
 * interrupted, with no 500 and no error line; the platform's answer to it (an empty 503 before)
 * is the XRPC error `{error, message}` with `Cache-Control: no-store`. The app runs here directly,
 * over an in-memory verifier (for the interruption: as the platform runs a request, uninterruptibly,
 * the call itself interruptible; and through `HttpApp.toHandled`, as Bun's and Node's servers run
 * it).
 */
import * as HttpApp from "@effect/platform/HttpApp"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Deferred, Duration, Effect, Exit, Fiber, Logger, Schema, TestClock } from "effect"
import { contract, NoParams } from "../../src/schemas/XrpcContract.js"
import { type ApiMethod, method, subscription } from "../../src/services/api/Methods.js"
import { makeBuckets } from "../../src/services/api/RateLimiter.js"
import type { ServiceAuthShape } from "../../src/services/api/ServiceAuth.js"
import * as Xrpc from "../../src/services/api/Xrpc.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"
import { captureLogs } from "./support.js"

const NSID = "dev.firehook.test.hang"

/** The app over `m` alone, with a verifier that accepts every token. */
const depsOf = (m: ApiMethod<never>): Xrpc.PipelineDeps<never> => {
  const rate = { limit: 100, perMs: 60_000 }
  return {
    methods: new Map([[m.contract.nsid, m]]),
    auth: { verify: () => Effect.succeed({ did: "did:plc:caller" }), replayEntries: Effect.succeed(0) },
    trustProxy: false,
    didDocument: undefined,
    limiters: { failedAuth: makeBuckets(rate, 10), calls: makeBuckets(rate, 10), methods: new Map() },
    counters: { calls: 0, authFailures: 0, rateLimited: 0 },
    log: RateLimitedLog.make(),
    deadline: Duration.seconds(10),
    maxBodyBytes: Xrpc.MAX_BODY_BYTES
  }
}

const requestOf = (nsid: string) =>
  HttpServerRequest.fromWeb(new Request(`http://127.0.0.1/xrpc/${nsid}`, { headers: { authorization: "Bearer x" } }))

describe("a handler whose output breaks its lexicon", () => {
  it.effect("is a 500 with the fixed message, and an error line naming the method, never the value", () =>
    Effect.gen(function*() {
      const broken = method(
        contract({
          nsid: "dev.firehook.test.broken",
          kind: "query",
          params: NoParams,
          output: Schema.Struct({ n: Schema.Number })
        }),
        () => Effect.succeed({ n: "secret-value" as unknown as number })
      )
      const { capture, lines } = captureLogs()
      const annotations: Array<Record<string, unknown>> = []
      const keep = Logger.make(({ annotations: a, logLevel }) => {
        if (logLevel.label === "ERROR") annotations.push(Object.fromEntries(a))
      })
      const response = yield* Xrpc.app(depsOf(broken)).pipe(
        Effect.provideService(HttpServerRequest.HttpServerRequest, requestOf("dev.firehook.test.broken")),
        Effect.scoped,
        Effect.provide(Logger.replace(Logger.defaultLogger, Logger.zip(capture, keep)))
      )
      expect(response.status).toBe(500)
      const errors = lines.filter((l) => l.level === "ERROR")
      expect(errors.map((l) => l.message)).toEqual(["api: a handler's output does not match its lexicon"])
      expect(annotations).toEqual([{ nsid: "dev.firehook.test.broken" }])
      expect(JSON.stringify(lines)).not.toContain("secret-value")
    }))
})

describe("the call's deadline covers the verification (SPEC §8.3: 10 s per call)", () => {
  const hanging = (m: ApiMethod<never>): Xrpc.PipelineDeps<never> => ({
    ...depsOf(m),
    auth: { verify: () => Effect.never, replayEntries: Effect.succeed(0) }
  })
  const answered = (m: ApiMethod<never>) =>
    Effect.gen(function*() {
      const fiber = yield* Xrpc.app(hanging(m)).pipe(
        Effect.provideService(HttpServerRequest.HttpServerRequest, requestOf(m.contract.nsid)),
        Effect.scoped,
        Effect.fork
      )
      // the deadline's timer is set
      yield* Effect.repeat(TestClock.sleeps(), { until: (sleeps) => Chunk.size(sleeps) > 0 })
      yield* TestClock.adjust("9999 millis")
      expect(fiber.unsafePoll()).toBeNull()
      yield* TestClock.adjust("1 millis")
      const response = yield* Fiber.join(fiber)
      return response.status
    })

  it.effect("a query whose token is never verified is a 504 after 10 s (TestClock)", () =>
    Effect.gen(function*() {
      const query = method(
        contract({ nsid: "dev.firehook.test.q", kind: "query", params: NoParams, output: Schema.Struct({}) }),
        () => Effect.succeed({})
      )
      expect(yield* answered(query)).toBe(504)
    }))

  it.effect("so is a subscription's upgrade request", () =>
    Effect.gen(function*() {
      const sub = subscription(
        contract({ nsid: "dev.firehook.test.s", kind: "subscription", params: NoParams, output: Schema.Unknown }),
        () => Effect.succeed(HttpServerResponse.empty())
      )
      expect(yield* answered(sub)).toBe(504)
    }))
})

describe("an interrupted call", () => {
  it.scoped("ends interrupted: no 500, no error line", () =>
    Effect.gen(function*() {
      const entered = yield* Deferred.make<void>()
      const hang = method(
        contract({ nsid: NSID, kind: "query", params: NoParams, output: Schema.Struct({}) }),
        () => Effect.zipRight(Deferred.succeed(entered, undefined), Effect.never)
      )
      const auth: ServiceAuthShape = {
        verify: () => Effect.succeed({ did: "did:plc:caller" }),
        replayEntries: Effect.succeed(0)
      }
      const rate = { limit: 100, perMs: 60_000 }
      const counters: Xrpc.ApiCounters = { calls: 0, authFailures: 0, rateLimited: 0 }
      const deps: Xrpc.PipelineDeps<never> = {
        methods: new Map([[NSID, hang]]),
        auth,
        trustProxy: false,
        didDocument: undefined,
        limiters: { failedAuth: makeBuckets(rate, 10), calls: makeBuckets(rate, 10), methods: new Map() },
        counters,
        log: RateLimitedLog.make(),
        deadline: Duration.seconds(10),
        maxBodyBytes: Xrpc.MAX_BODY_BYTES
      }
      const request = HttpServerRequest.fromWeb(
        new Request(`http://127.0.0.1/xrpc/${NSID}`, { headers: { authorization: "Bearer x" } })
      )
      const { capture, lines } = captureLogs()
      const fiber = yield* Xrpc.app(deps).pipe(
        Effect.provideService(HttpServerRequest.HttpServerRequest, request),
        Effect.uninterruptible,
        Effect.provide(Logger.replace(Logger.defaultLogger, capture)),
        Effect.fork
      )
      yield* Deferred.await(entered)
      const exit = yield* Fiber.interrupt(fiber)
      expect(Exit.isInterrupted(exit)).toBe(true)
      expect(lines.filter((l) => l.level === "ERROR")).toEqual([])
      expect(counters.calls).toBe(1)
    }))
})

describe("a call in flight when the listener stops (shutdown stage `http`)", () => {
  it.scoped("is answered 503 with the XRPC error body {error, message} and no-store, not an empty 503", () =>
    Effect.gen(function*() {
      const entered = yield* Deferred.make<void>()
      const hang = method(
        contract({ nsid: NSID, kind: "query", params: NoParams, output: Schema.Struct({}) }),
        () => Effect.zipRight(Deferred.succeed(entered, undefined), Effect.never)
      )
      const sent: Array<HttpServerResponse.HttpServerResponse> = []
      // what BunHttpServer / NodeHttpServer do with an app: toHandled, the response handed to the socket
      const handled = HttpApp.toHandled(Xrpc.app(depsOf(hang)), (_request, response) =>
        Effect.sync(() => {
          sent.push(response)
        }))
      const fiber = yield* handled.pipe(
        Effect.provideService(HttpServerRequest.HttpServerRequest, requestOf(NSID)),
        Effect.fork
      )
      yield* Deferred.await(entered)
      // the listener's scope closes: the server interrupts its requests
      yield* Fiber.interrupt(fiber)
      expect(sent).toHaveLength(1)
      const response = sent[0]!
      expect(response.status).toBe(503)
      expect(response.headers["cache-control"]).toBe("no-store")
      expect(response.body._tag).toBe("Uint8Array")
      const text = response.body._tag === "Uint8Array" ? new TextDecoder().decode(response.body.body) : ""
      expect(JSON.parse(text)).toEqual({ error: "ServiceUnavailable", message: "the service is stopping; retry" })
    }))

  it.effect("the app's own responses pass unchanged, its own 503s included", () =>
    Effect.gen(function*() {
      const ok = method(
        contract({ nsid: "dev.firehook.test.ok", kind: "query", params: NoParams, output: Schema.Struct({}) }),
        () => Effect.succeed({})
      )
      const answer = (deps: Xrpc.PipelineDeps<never>, nsid: string) =>
        Effect.gen(function*() {
          const sent: Array<HttpServerResponse.HttpServerResponse> = []
          yield* HttpApp.toHandled(Xrpc.app(deps), (_request, response) => Effect.sync(() => void sent.push(response)))
            .pipe(Effect.provideService(HttpServerRequest.HttpServerRequest, requestOf(nsid)))
          const response = sent[0]!
          const text = response.body._tag === "Uint8Array" ? new TextDecoder().decode(response.body.body) : ""
          return [response.status, JSON.parse(text) as unknown]
        })
      expect(yield* answer(depsOf(ok), "dev.firehook.test.ok")).toEqual([200, {}])
      expect(yield* answer({ ...depsOf(ok), auth: undefined }, "dev.firehook.test.ok")).toEqual([
        503,
        { error: "NotConfigured", message: "this service has no service DID (SERVICE_DID / PUBLIC_URL)" }
      ])
    }))
})
