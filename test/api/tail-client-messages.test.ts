/**
 * The live tail is one way: a client's message closes it (1008). The platform's socket runs each
 * message's effect in a fiber of its own, so the handler must start the close for the first
 * message only: a client sending thousands of tiny messages must not make the service start
 * thousands of fibers, each writing a close frame and waiting out the close's grace.
 *
 * The real handler (`TailMethods.subscribeDeliveries`) runs here on a socket of the test's own
 * that delivers a burst of messages at once, as a runtime does when they arrive in one read.
 */
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerRequestTag from "@effect/platform/HttpServerRequest"
import * as Socket from "@effect/platform/Socket"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, TestClock } from "effect"
import * as TailHub from "../../src/services/api/Tail.js"
import * as TailMethods from "../../src/services/api/TailMethods.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"

const OWNER = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const BURST = 5_000

/** A socket whose reader hands the handler `BURST` messages at once, and which notes what is written. */
const burstSocket = (written: Array<string | Uint8Array | Socket.CloseEvent>, firstClose: Deferred.Deferred<void>) => {
  let started = 0
  const socket: Socket.Socket = {
    [Socket.TypeId]: Socket.TypeId,
    run: () => Effect.never,
    runRaw: (handler) =>
      Effect.gen(function*() {
        const effects = []
        for (let i = 0; i < BURST; i++) {
          const r = handler("x")
          if (r !== undefined) effects.push(r)
        }
        started = effects.length
        yield* Effect.forEach(effects, (e) => e, { concurrency: "unbounded", discard: true })
      }),
    writer: Effect.succeed((chunk) =>
      Effect.sync(() => {
        written.push(chunk)
        if (Socket.isCloseEvent(chunk)) Deferred.unsafeDone(firstClose, Exit.void)
      })
    )
  }
  return { socket, started: () => started }
}

describe("subscribeDeliveries: a client's messages", () => {
  it.scoped("a burst of 5,000 messages starts one close (one fiber, one close frame), not one per message", () =>
    Effect.gen(function*() {
      const outcomes = yield* DeliveryOutcomes.make()
      const tail = yield* TailHub.make().pipe(Effect.provideService(DeliveryOutcomes.DeliveryOutcomes, outcomes))
      const written: Array<string | Uint8Array | Socket.CloseEvent> = []
      const firstClose = yield* Deferred.make<void>()
      const { socket, started } = burstSocket(written, firstClose)
      // a request whose upgrade is that socket (no Bun server, no Node socket: the runtime's own)
      const request = { upgrade: Effect.succeed(socket) } as unknown as HttpServerRequest.HttpServerRequest
      const prepared = yield* TailMethods.subscribeDeliveries.prepare({}, undefined)
      const handler = yield* Effect.fork(
        prepared.respond(OWNER).pipe(
          Effect.provideService(HttpServerRequestTag.HttpServerRequest, request),
          Effect.provideService(TailHub.Tail, tail),
          Effect.scoped
        )
      )
      yield* Deferred.await(firstClose)
      expect(started()).toBe(1)
      // the close's grace passes: the handler ends, the connection's place is given back
      yield* TestClock.adjust(TailMethods.CLOSE_GRACE)
      expect(Exit.isSuccess(yield* Fiber.await(handler))).toBe(true)
      const closes = written.filter(Socket.isCloseEvent)
      expect(closes.map((c) => [c.code, c.reason])).toEqual([[
        TailMethods.CLIENT_MESSAGE_CLOSE.code,
        TailMethods.CLIENT_MESSAGE_CLOSE.reason
      ]])
      expect((yield* tail.stats).connections).toBe(0)
    }))
})
