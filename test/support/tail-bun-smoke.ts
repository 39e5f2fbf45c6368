/**
 * The live tail's socket handling under Bun, the production runtime:
 * `node_modules/.bin/bun test/support/tail-bun-smoke.ts` prints `ok` and exits 0, or prints the
 * failure and exits 1. Run by test/api/tail-bun.test.ts. The same steps as TailMethods (a Tail
 * connection, `request.upgrade`, the pump raced with the socket's reader, in an interruptible
 * region as the XRPC pipeline runs it) on BunHttpServer, with Bun's own WebSocket client: a frame
 * arrives, the 24 h lifetime (TestClock) closes with 1000 `lifetime`, and the connection's place is
 * released.
 */
import * as BunHttpServer from "@effect/platform-bun/BunHttpServer"
import * as HttpServer from "@effect/platform/HttpServer"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Socket from "@effect/platform/Socket"
import { Context, Deferred, Duration, Effect, Layer, TestClock, TestContext } from "effect"
import * as TailHub from "../../src/services/api/Tail.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"

const OWNER = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

const app = Effect.gen(function*() {
  const tail = yield* TailHub.Tail
  const conn = yield* tail.connect(OWNER)
  const request = yield* HttpServerRequest.HttpServerRequest
  const socket = yield* request.upgrade
  const write = yield* socket.writer
  const serve = TailHub.pump(conn, (fs) => Effect.forEach(fs, (f) => write(JSON.stringify(f)), { discard: true })).pipe(
    Effect.zipRight(write(new Socket.CloseEvent(1000, "lifetime"))),
    Effect.zipRight(Effect.sleep("10 seconds"))
  )
  yield* Effect.raceFirst(socket.runRaw(() => Effect.void), serve).pipe(Effect.catchAll(() => Effect.void))
  return HttpServerResponse.empty()
}).pipe(Effect.interruptible, Effect.catchAll(() => Effect.succeed(HttpServerResponse.text("no", { status: 400 }))))

const poll = (cond: () => boolean) =>
  Effect.promise(async () => {
    for (let i = 0; i < 250 && !cond(); i++) await new Promise((r) => setTimeout(r, 20))
    return cond()
  })

const main = Effect.gen(function*() {
  const ctx = yield* Layer.build(
    HttpServer.serve(app).pipe(
      Layer.provideMerge(BunHttpServer.layer({ port: 0, hostname: "127.0.0.1" })),
      Layer.provideMerge(TailHub.layer()),
      Layer.provideMerge(DeliveryOutcomes.layerMemory)
    )
  )
  const server = Context.get(ctx, HttpServer.HttpServer)
  const port = server.address._tag === "TcpAddress" ? server.address.port : 0
  const outcomes = Context.get(ctx, DeliveryOutcomes.DeliveryOutcomes)
  const tail = Context.get(ctx, TailHub.Tail)
  const got: Array<{ readonly [k: string]: unknown }> = []
  let closed = ""
  const opened = yield* Deferred.make<void>()
  const ws = new WebSocket(`ws://127.0.0.1:${port}/`)
  ws.onopen = () => Deferred.unsafeDone(opened, Effect.void)
  ws.onmessage = (m) => got.push(JSON.parse(String(m.data)) as { readonly [k: string]: unknown })
  ws.onclose = (e) => (closed = `${e.code} ${e.reason}`)
  yield* Deferred.await(opened).pipe(Effect.timeout("10 seconds"))
  yield* outcomes.publish({
    id: "01SMOKE",
    owner: OWNER,
    rkey: "hook",
    event: "create",
    status: "delivered",
    httpStatus: 200,
    errorKind: undefined,
    atMs: 0
  })
  if (!(yield* poll(() => got.length === 1))) return "FAIL: no frame"
  if (got[0]?.["id"] !== "01SMOKE" || got[0]?.["$type"] !== TailHub.OUTCOME_TYPE) return "FAIL: frame"
  yield* TestClock.adjust(Duration.hours(24))
  if (!(yield* poll(() => closed !== ""))) return "FAIL: not closed"
  if (closed !== "1000 lifetime") return `FAIL: closed ${closed}`
  if (!(yield* poll(() => Effect.runSync(tail.stats).connections === 0))) return "FAIL: not released"
  return "ok"
})

Effect.runPromise(Effect.scoped(main).pipe(Effect.provide(TestContext.TestContext))).then(
  (r) => {
    console.log(r)
    process.exit(r === "ok" ? 0 : 1)
  },
  (e) => {
    console.log("FAIL", String(e))
    process.exit(1)
  }
)
