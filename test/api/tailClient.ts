/**
 * A WebSocket client of the live tail for tests (the `ws` package, which sends the upgrade's
 * `Authorization` header), and a bounded poll on an observable condition.
 *
 * Run by Bun (`bun test/api/tailClient.ts`, as test/api/tail-bun.test.ts does), this file is also
 * the live tail served on BunHttpServer, the production runtime, for a client in the test's process
 * (see {@link serveUnderBun}).
 */
import * as BunHttpServer from "@effect/platform-bun/BunHttpServer"
import * as HttpServer from "@effect/platform/HttpServer"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Context, Deferred, Duration, Effect, Fiber, Layer, TestClock, TestContext } from "effect"
import WebSocket from "ws"
import * as TailHub from "../../src/services/api/Tail.js"
import { subscribeDeliveries } from "../../src/services/api/TailMethods.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import type { Outcome } from "../../src/services/delivery/DeliveryOutcomes.js"

export interface TailClient {
  readonly ws: WebSocket
  /** every frame received, parsed */
  readonly frames: Array<{ readonly [k: string]: unknown }>
  /** set when the connection has closed */
  closed: { readonly code: number; readonly reason: string } | undefined
}

export type Connected =
  | { readonly _tag: "open"; readonly client: TailClient }
  | { readonly _tag: "refused"; readonly status: number; readonly body: string }

const NSID = "dev.firehook.webhook.subscribeDeliveries"

/** Open a tail on `port` (with `token` as the bearer, if any): open, or refused with the HTTP answer. */
export const openTail = (port: number, token: string | undefined, nsid = NSID) =>
  Effect.async<Connected>((resume) => {
    const ws = new WebSocket(`ws://127.0.0.1:${port}/xrpc/${nsid}`, {
      headers: token === undefined ? {} : { authorization: `Bearer ${token}` },
      handshakeTimeout: 10_000
    })
    const client: TailClient = { ws, frames: [], closed: undefined }
    ws.on("message", (data: Buffer) => client.frames.push(JSON.parse(data.toString("utf8")) as TailClient["frames"][0]))
    ws.on("close", (code: number, reason: Buffer) => (client.closed = { code, reason: reason.toString("utf8") }))
    ws.on("open", () => resume(Effect.succeed({ _tag: "open", client })))
    ws.on("unexpected-response", (_req, res) => {
      let body = ""
      res.on("data", (d: Buffer) => (body += d.toString("utf8")))
      res.on("end", () => {
        resume(Effect.succeed({ _tag: "refused", status: res.statusCode ?? 0, body }))
        ws.terminate()
      })
    })
    ws.on("error", () => {})
    return Effect.sync(() => ws.terminate())
  })

/** An open tail (fails the test otherwise). */
export const openTailOrDie = (port: number, token: string) =>
  Effect.flatMap(openTail(port, token), (c) =>
    c._tag === "open"
      ? Effect.succeed(c.client)
      : Effect.dieMessage(`tail refused: ${c.status} ${c.body}`))

/**
 * Wait (real time, at most `tries` × 20 ms) until `cond` holds; fails the test otherwise. Not a
 * timing assertion: it waits for an observable condition, with a bound.
 */
export const until = (what: string, cond: () => boolean, tries = 500): Effect.Effect<void> =>
  Effect.promise(async () => {
    for (let i = 0; i < tries; i++) {
      if (cond()) return true
      await new Promise((r) => setTimeout(r, 20))
    }
    return cond()
  }).pipe(Effect.flatMap((ok) => ok ? Effect.void : Effect.dieMessage(`timed out waiting: ${what}`)))

export const close = (client: TailClient) =>
  Effect.zipRight(Effect.sync(() => client.ws.close(1000)), until("closed", () => client.closed !== undefined))

/** {@link until} for a condition read by an effect. */
export const untilEffect = <R>(what: string, cond: Effect.Effect<boolean, never, R>, tries = 500) =>
  Effect.gen(function*() {
    for (let i = 0; i < tries; i++) {
      if (yield* cond) return
      yield* Effect.promise(() => new Promise((r) => setTimeout(r, 20)))
    }
    return yield* Effect.dieMessage(`timed out waiting: ${what}`)
  })

/** An outcome of `owner` (a fresh id; delivered with 200 unless `extra` says otherwise). */
let seq = 0
export const outcome = (owner: string, extra: Partial<Outcome> = {}): Outcome => ({
  id: `01TAIL${String(++seq).padStart(8, "0")}`,
  owner,
  rkey: "hook1",
  event: "create",
  status: "delivered",
  httpStatus: 200,
  errorKind: undefined,
  atMs: Date.now(),
  ...extra
})

// ---------------------------------------------------------------------------------------------
// Under Bun: the live tail on BunHttpServer, driven over HTTP by the test's process

/** The caller of every tail {@link serveUnderBun} serves. */
export const BUN_OWNER = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"

/** What `GET /stats` of {@link serveUnderBun} answers. */
export interface BunTailStats extends TailHub.TailStats {
  readonly published: number
  /** the bytes Bun holds for the newest tail's socket, not yet taken by its client (-1: none) */
  readonly buffered: number
}

/**
 * A view of `request` on which @effect/platform-bun's upgrade hands the `data` it gives Bun's
 * `server.upgrade` to `opened`, whose `deferred` the library completes with the ServerWebSocket:
 * the test reads Bun's buffered amount itself, not through the code under test.
 */
const observed = (request: HttpServerRequest.HttpServerRequest, opened: Array<unknown>) => {
  const server: unknown = Reflect.get(request, "bunServer")
  const upgrade: unknown = typeof server === "object" && server !== null ? Reflect.get(server, "upgrade") : undefined
  if (typeof upgrade !== "function") return request
  const spy = {
    upgrade: (source: unknown, options: { readonly data?: unknown }) => {
      opened.push(options.data)
      return Reflect.apply(upgrade, server, [source, options])
    }
  }
  return new Proxy(request, {
    get: (target, key, receiver) => key === "bunServer" ? spy : Reflect.get(target, key, receiver)
  })
}

const bufferedOf = (data: unknown): Effect.Effect<number> => {
  const deferred: unknown = typeof data === "object" && data !== null ? Reflect.get(data, "deferred") : undefined
  if (typeof deferred !== "object" || deferred === null || !(Deferred.DeferredTypeId in deferred)) {
    return Effect.succeed(-1)
  }
  return Deferred.await(deferred as Deferred.Deferred<unknown, unknown>).pipe(
    Effect.map((ws) => {
      const get: unknown = typeof ws === "object" && ws !== null ? Reflect.get(ws, "getBufferedAmount") : undefined
      const n: unknown = typeof get === "function" ? Reflect.apply(get, ws, []) : undefined
      return typeof n === "number" ? n : -1
    }),
    Effect.orElseSucceed(() => -1)
  )
}

/**
 * Serve on BunHttpServer (127.0.0.1, a free port, printed on stdout as `{"port":n}`), on the
 * TestClock, until killed:
 * - `/xrpc/dev.firehook.webhook.subscribeDeliveries`: the real method's handler (TailMethods) for
 *   {@link BUN_OWNER}, without the XRPC pipeline's authentication;
 * - `POST /publish?n=`: publish `n` outcomes of {@link BUN_OWNER}, one at a time, letting the hub
 *   and the tails run between them;
 * - `GET /stats`: {@link BunTailStats};
 * - `POST /advance?ms=`: `TestClock.adjust`.
 */
export const serveUnderBun = Effect.gen(function*() {
  const opened: Array<unknown> = []
  let published = 0
  const app = Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const url = new URL(request.url, "http://localhost")
    const n = Number(url.searchParams.get("n") ?? url.searchParams.get("ms") ?? "0")
    switch (url.pathname) {
      case "/xrpc/dev.firehook.webhook.subscribeDeliveries": {
        const prepared = yield* subscribeDeliveries.prepare({}, undefined)
        return yield* prepared.respond(BUN_OWNER).pipe(
          Effect.provideService(HttpServerRequest.HttpServerRequest, observed(request, opened))
        )
      }
      case "/publish": {
        const outcomes = yield* DeliveryOutcomes.DeliveryOutcomes
        for (let i = 0; i < n; i++) {
          yield* outcomes.publish(outcome(BUN_OWNER))
          published++
          yield* Effect.yieldNow()
        }
        return HttpServerResponse.empty()
      }
      case "/stats": {
        const stats = yield* Effect.flatMap(TailHub.Tail, (t) => t.stats)
        const last = opened.at(-1)
        const body: BunTailStats = {
          ...stats,
          published,
          buffered: last === undefined ? -1 : yield* bufferedOf(last)
        }
        return yield* HttpServerResponse.json(body)
      }
      case "/advance": {
        yield* TestClock.adjust(Duration.millis(n))
        return HttpServerResponse.empty()
      }
    }
    return HttpServerResponse.text("not found", { status: 404 })
  }).pipe(
    Effect.interruptible,
    Effect.catchAll((e) => Effect.succeed(HttpServerResponse.text(e._tag, { status: 400 })))
  )
  const ctx = yield* Layer.build(
    HttpServer.serve(app).pipe(
      Layer.provideMerge(BunHttpServer.layer({ port: 0, hostname: "127.0.0.1" })),
      Layer.provideMerge(TailHub.layer()),
      Layer.provideMerge(DeliveryOutcomes.layerMemory)
    )
  )
  const address = Context.get(ctx, HttpServer.HttpServer).address
  console.log(JSON.stringify({ port: address._tag === "TcpAddress" ? address.port : 0 }))
  return yield* Effect.never
}).pipe(Effect.scoped, Effect.provide(TestContext.TestContext))

if (import.meta.main) {
  const fiber = Effect.runFork(serveUnderBun)
  // SIGTERM closes the server's scope as the service's shutdown does: the serving fiber (and each
  // open tail's handler) is interrupted, then the listener stops, then the hub closes
  process.once("SIGTERM", () => Effect.runFork(Fiber.interrupt(fiber)))
}
