/**
 * The live tail (SPEC §8.5 `subscribeDeliveries`) on a real socket: a WebSocket client (`ws`)
 * against the API served on a Node HTTP server, the token in the upgrade's Authorization header.
 * Outcomes are published to the process's `DeliveryOutcomes` as the settle path does. Covered: a
 * caller sees its own outcomes only; frames valid under the lexicon; the 401 of an upgrade without
 * a valid token; the fifth connection of a DID refused; the process's bound on open tails (any DID
 * refused past it, a dropped, closed or failed socket giving its place back); a slow reader's bounded buffer and its
 * `#info` drop count; the 24 h lifetime under TestClock; and the hub's own rules in a unit. The
 * socket's own bound: `TailSocket.room` in a unit, and that Node's server shows the socket's
 * buffered bytes (a slow reader under Bun, the production runtime: test/api/tail-bun.test.ts).
 */
import { Lexicons } from "@atproto/lexicon"
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpServer from "@effect/platform/HttpServer"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { describe, expect, it, layer } from "@effect/vitest"
import { Deferred, Duration, Effect, Exit, Fiber, Layer, Ref, Scope, TestClock } from "effect"
import * as Http from "node:http"
import * as Net from "node:net"
import * as TailHub from "../../src/services/api/Tail.js"
import { Tail } from "../../src/services/api/Tail.js"
import * as TailMethods from "../../src/services/api/TailMethods.js"
import * as TailSocket from "../../src/services/api/TailSocket.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import type { Outcome } from "../../src/services/delivery/DeliveryOutcomes.js"
import { apiLayer, lexiconDocs, mint, newOwner, serverPort } from "./support.js"
import { close, type Connected, openTail, openTailOrDie, outcome, until, untilEffect } from "./tailClient.js"

const NSID = "dev.firehook.webhook.subscribeDeliveries"
const lex = new Lexicons(lexiconDocs())
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const HIGH = { limit: 1_000_000, perMs: 60_000 }
const BUFFER = 8

const publish = (outcomes: ReadonlyArray<Outcome>) =>
  Effect.flatMap(DeliveryOutcomes.DeliveryOutcomes, (o) => Effect.forEach(outcomes, o.publish, { discard: true }))

const open = (owner: { did: string }) =>
  Effect.gen(function*() {
    yield* wallClock
    const token = yield* mint(owner as Parameters<typeof mint>[0], NSID)
    return yield* openTailOrDie(yield* serverPort, token)
  })

const connections = Effect.flatMap(Tail, (t) => Effect.map(t.stats, (s) => s.connections))

/** An upgrade with a valid token but no `Sec-WebSocket-Key` (`ws` refuses it itself: 400, socket ended). */
const keylessUpgrade = (port: number, token: string) =>
  Effect.async<string>((resume) => {
    const socket = Net.connect(port, "127.0.0.1")
    let text = ""
    socket.on("data", (d: Buffer) => (text += d.toString("latin1")))
    socket.on("close", () => resume(Effect.succeed(text)))
    socket.on("error", () => {})
    socket.write(
      `GET /xrpc/${NSID} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${token}\r\n` +
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    return Effect.sync(() => socket.destroy())
  })

/** The HTTP answer of a refused tail, or its tag. */
const refusal = (c: Connected) => c._tag === "refused" ? [c.status, JSON.parse(c.body)] : c._tag

describe("subscribeDeliveries on a real socket", () => {
  layer(
    apiLayer({ tail: { bufferFrames: BUFFER }, api: { limits: { callsPerCaller: HIGH, failedAuthPerAddress: HIGH } } })
  )(
    (it) => {
      it.effect("a caller receives the outcomes of its own deliveries only, as lexicon frames", () =>
        Effect.gen(function*() {
          const a = yield* newOwner()
          const b = yield* newOwner()
          const tailA = yield* open(a)
          const tailB = yield* open(b)
          const forA = [
            outcome(a.did),
            outcome(a.did, { status: "dead_letter", httpStatus: 500, errorKind: "http_5xx", event: "update" }),
            outcome(a.did, { status: "cancelled", httpStatus: undefined, errorKind: "webhook_gone", event: "delete" })
          ]
          const forB = [outcome(b.did, { rkey: "other" })]
          // interleaved: A's, B's, A's
          yield* publish([forA[0]!, forB[0]!, forA[1]!, forA[2]!])
          yield* until("A's frames", () => tailA.frames.length >= 3)
          yield* until("B's frame", () => tailB.frames.length >= 1)
          expect(tailA.frames.map((f) => f["id"])).toEqual(forA.map((o) => o.id))
          expect(tailB.frames.map((f) => f["id"])).toEqual([forB[0]!.id])
          expect(tailA.frames[1]).toEqual({
            $type: `${NSID}#outcome`,
            id: forA[1]!.id,
            rkey: "hook1",
            event: "update",
            status: "dead_letter",
            httpStatus: 500,
            errorKind: "http_5xx",
            at: new Date(forA[1]!.atMs).toISOString()
          })
          for (const f of [...tailA.frames, ...tailB.frames]) lex.assertValidXrpcMessage(NSID, f)
          // no owner DID, URL or anything else in a frame
          expect(JSON.stringify(tailA.frames)).not.toContain(b.did)
          expect(JSON.stringify(tailA.frames)).not.toContain(a.did)
          // an outcome of B's later still never reaches A (A's next frame is its own)
          yield* publish([outcome(b.did), outcome(a.did, { id: "01TAILMARK" })])
          yield* until("A's marker", () => tailA.frames.length >= 4)
          expect(tailA.frames.map((f) => f["id"])).toEqual([...forA.map((o) => o.id), "01TAILMARK"])
          yield* close(tailA)
          yield* close(tailB)
          yield* untilEffect("released", Effect.map(connections, (n) => n === 0))
        }))

      it.effect("an upgrade without a valid token is refused with 401 and opens nothing", () =>
        Effect.gen(function*() {
          yield* wallClock
          const port = yield* serverPort
          const none = yield* openTail(port, undefined)
          expect(none._tag).toBe("refused")
          if (none._tag === "refused") {
            expect(none.status).toBe(401)
            expect(JSON.parse(none.body)).toMatchObject({ error: "AuthenticationRequired" })
          }
          // a token for another method
          const owner = yield* newOwner()
          const wrong = yield* openTail(port, yield* mint(owner, "dev.firehook.webhook.list"))
          expect(wrong._tag === "refused" ? [wrong.status, JSON.parse(wrong.body)["error"]] : wrong._tag).toEqual([
            401,
            "InvalidToken"
          ])
          expect(yield* connections).toBe(0)
        }))

      it.effect("at most 4 connections per DID: the fifth is refused (429 TooManyConnections), others unaffected", () =>
        Effect.gen(function*() {
          const a = yield* newOwner()
          const b = yield* newOwner()
          const tails = [yield* open(a), yield* open(a), yield* open(a), yield* open(a)]
          yield* wallClock
          const fifth = yield* openTail(yield* serverPort, yield* mint(a, NSID))
          expect(fifth._tag === "refused" ? [fifth.status, JSON.parse(fifth.body)["error"]] : fifth._tag).toEqual([
            429,
            "TooManyConnections"
          ])
          // another DID is not limited by A's
          const tailB = yield* open(b)
          expect(yield* connections).toBe(5)
          // every one of A's four gets each of A's outcomes
          const o = outcome(a.did)
          yield* publish([o])
          yield* until("all four", () => tails.every((t) => t.frames.length === 1))
          for (const t of tails) expect(t.frames[0]?.["id"]).toBe(o.id)
          expect(tailB.frames).toEqual([])
          // a closed one frees its place
          yield* close(tails[0]!)
          yield* untilEffect("released", Effect.map(connections, (n) => n === 4))
          const again = yield* open(a)
          for (const t of [...tails.slice(1), again, tailB]) yield* close(t)
          yield* untilEffect("all released", Effect.map(connections, (n) => n === 0))
        }))

      it.effect("the fifth connection of a DID is told why: 429 TooManyConnections 'at most 4 live tails per DID'", () =>
        Effect.gen(function*() {
          const a = yield* newOwner()
          const tails = [yield* open(a), yield* open(a), yield* open(a), yield* open(a)]
          yield* wallClock
          expect(refusal(yield* openTail(yield* serverPort, yield* mint(a, NSID)))).toEqual([429, {
            error: "TooManyConnections",
            message: "at most 4 live tails per DID"
          }])
          for (const t of tails) yield* close(t)
          yield* untilEffect("all released", Effect.map(connections, (n) => n === 0))
        }))

      it.effect("the stream is one way: a message from the client closes the connection and gives its place back", () =>
        Effect.gen(function*() {
          const a = yield* newOwner()
          const tail = yield* open(a)
          expect(yield* connections).toBe(1)
          tail.ws.send("hello")
          yield* until("closed by the service", () => tail.closed !== undefined)
          expect(tail.closed).toEqual({ code: 1008, reason: "the stream is one way" })
          yield* untilEffect("released", Effect.map(connections, (n) => n === 0))
          // nothing reaches the closed connection
          yield* publish([outcome(a.did)])
          expect(tail.frames).toEqual([])
        }))

      it.effect("a handshake the WebSocket server refuses (no Sec-WebSocket-Key) gives the DID's place back", () =>
        Effect.gen(function*() {
          yield* wallClock
          const owner = yield* newOwner()
          const port = yield* serverPort
          const token = yield* mint(owner, NSID)
          // a valid token, an upgrade `ws` refuses itself (400, socket ended)
          const answer = yield* keylessUpgrade(port, token)
          expect(answer.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request")
          // the call ended: the caller's place is free again (it stayed taken, and the call hung)
          yield* untilEffect("released", Effect.map(connections, (n) => n === 0))
        }))

      it.effect("a slow reader: the buffer is bounded and an #info frame counts what was dropped", () =>
        Effect.gen(function*() {
          const a = yield* newOwner()
          const tail = yield* open(a)
          const burst = Array.from({ length: 40 }, () => outcome(a.did))
          // published in one go: the hub hands them to the connection faster than it can write
          yield* publish(burst)
          const info = () => tail.frames.find((f) => f["$type"] === `${NSID}#info`)
          yield* until("#info", () => info() !== undefined)
          const kept = tail.frames.filter((f) => f["$type"] === `${NSID}#outcome`)
          const dropped = info()?.["dropped"] as number
          expect(dropped).toBeGreaterThan(0)
          expect(kept.length).toBeLessThanOrEqual(BUFFER + 1)
          expect(kept.length + dropped).toBe(burst.length)
          // the frames kept are the oldest, in order; the #info comes after them
          expect(kept.map((f) => f["id"])).toEqual(burst.slice(0, kept.length).map((o) => o.id))
          expect(tail.frames.at(-1)).toEqual(info())
          lex.assertValidXrpcMessage(NSID, info())
          expect(info()).toMatchObject({ name: "DeliveriesDropped", dropped })
          // the connection goes on
          const next = outcome(a.did)
          yield* publish([next])
          yield* until("next", () => tail.frames.at(-1)?.["id"] === next.id)
          yield* close(tail)
        }))

      it.effect("a connection is closed after 24 h (TestClock), with 1000 'lifetime'", () =>
        Effect.gen(function*() {
          const a = yield* newOwner()
          const tail = yield* open(a)
          // the connection is served (its pump, which holds the lifetime, wrote a frame)
          yield* publish([outcome(a.did)])
          yield* until("served", () => tail.frames.length === 1)
          yield* TestClock.adjust(Duration.hours(23))
          yield* publish([outcome(a.did)])
          yield* until("still served", () => tail.frames.length === 2)
          expect(tail.closed).toBeUndefined()
          yield* TestClock.adjust(Duration.hours(1))
          yield* until("closed", () => tail.closed !== undefined)
          expect(tail.closed).toEqual({ code: 1000, reason: "lifetime" })
          yield* untilEffect("released", Effect.map(connections, (n) => n === 0))
        }))
    }
  )
})

describe("subscribeDeliveries: the process's bound on open tails", () => {
  layer(
    apiLayer({ tail: { maxConnections: 3 }, api: { limits: { callsPerCaller: HIGH, failedAuthPerAddress: HIGH } } })
  )(
    (it) => {
      it.effect("past the process's bound any DID is refused (429); a closed, dropped or failed socket frees its place", () =>
        Effect.gen(function*() {
          const [a, b, c, d] = [yield* newOwner(), yield* newOwner(), yield* newOwner(), yield* newOwner()]
          const port = yield* serverPort
          const a1 = yield* open(a)
          const a2 = yield* open(a)
          // the bound's last place (here 3; 1,000 by default) is given
          const b1 = yield* open(b)
          expect(yield* connections).toBe(3)
          // the next is refused whatever its DID, as the per-DID limit is answered
          yield* wallClock
          expect(refusal(yield* openTail(port, yield* mint(c, NSID)))).toEqual([429, {
            error: "TooManyConnections",
            message: "too many live tails on this server"
          }])
          expect(yield* connections).toBe(3)
          // a client that drops its socket without a close frame gives its place back
          a1.ws.terminate()
          yield* untilEffect("dropped released", Effect.map(connections, (n) => n === 2))
          const c1 = yield* open(c)
          yield* wallClock
          expect(refusal(yield* openTail(port, yield* mint(d, NSID)))).toMatchObject([429, {
            error: "TooManyConnections"
          }])
          // a closed one, then an upgrade that fails after its place was taken: both give it back
          yield* close(a2)
          yield* untilEffect("closed released", Effect.map(connections, (n) => n === 2))
          yield* wallClock
          expect((yield* keylessUpgrade(port, yield* mint(d, NSID))).split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request")
          yield* untilEffect("failed released", Effect.map(connections, (n) => n === 2))
          const d1 = yield* open(d)
          expect(yield* connections).toBe(3)
          for (const t of [b1, c1, d1]) yield* close(t)
          yield* untilEffect("all released", Effect.map(connections, (n) => n === 0))
        }))
    }
  )
})

describe("Tail hub (unit)", () => {
  const hub = TailHub.layer({ maxConnectionsPerDid: 2, bufferFrames: 3 }).pipe(
    Layer.provideMerge(DeliveryOutcomes.layerMemory)
  )

  it.scoped("per-DID limit, isolation, bounded buffer with a drop count, release on scope close", () =>
    Effect.gen(function*() {
      const tail = yield* Tail
      const a = yield* tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
      yield* tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
      const refused = yield* Effect.flip(tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"))
      expect(refused._tag).toBe("TooManyConnections")
      const b = yield* tail.connect("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb")
      const outs = Array.from({ length: 5 }, () => outcome("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"))
      yield* publish(outs)
      // what A reads until the #info: the oldest outcomes, then the count of the others
      const frames: Array<TailHub.Frame> = []
      while (!frames.some((f) => f.$type === TailHub.INFO_TYPE)) frames.push(...(yield* a.take))
      const kept = frames.flatMap((f) => f.$type === TailHub.OUTCOME_TYPE ? [f.id] : [])
      const info = frames.at(-1)
      expect(info?.$type).toBe(TailHub.INFO_TYPE)
      expect(kept).toEqual(outs.slice(0, kept.length).map((o) => o.id))
      expect(kept.length).toBeLessThanOrEqual(4)
      expect(kept.length + (info?.$type === TailHub.INFO_TYPE ? info.dropped : 0)).toBe(5)
      // B got nothing
      const bTake = yield* Effect.fork(b.take)
      yield* publish([outcome("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb", { id: "01TAILB" })])
      const bFrames = yield* Fiber.join(bTake)
      expect(bFrames.map((f) => f.$type === TailHub.OUTCOME_TYPE ? f.id : "info")).toEqual(["01TAILB"])
      expect((yield* tail.stats).connections).toBe(3)
    }).pipe(Effect.provide(hub)))

  it.scoped("the process's bound counts every DID's connections; a closed scope gives its place back", () =>
    Effect.gen(function*() {
      const tail = yield* Tail
      const first = yield* Scope.make()
      yield* tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa").pipe(Scope.extend(first))
      yield* tail.connect("did:plc:bbbbbbbbbbbbbbbbbbbbbbbb")
      const refused = yield* Effect.flip(tail.connect("did:plc:cccccccccccccccccccccccc"))
      expect(refused).toMatchObject({ _tag: "TooManyConnections", limit: "process" })
      expect((yield* Effect.flip(tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"))).limit).toBe("process")
      yield* Scope.close(first, Exit.void)
      expect((yield* tail.stats).connections).toBe(1)
      yield* tail.connect("did:plc:cccccccccccccccccccccccc")
      expect((yield* tail.stats).connections).toBe(2)
    }).pipe(
      Effect.provide(TailHub.layer({ maxConnections: 2 }).pipe(Layer.provideMerge(DeliveryOutcomes.layerMemory)))
    ))

  it.scoped("pump: ends with 'lifetime' after 24 h of the Clock; the hub closing (shutdown) ends it", () =>
    Effect.gen(function*() {
      const written: Array<string> = []
      const write = (fs: ReadonlyArray<TailHub.Frame>) =>
        Effect.sync(() => void written.push(...fs.map((f) => f.$type)))
      const outcomes = yield* DeliveryOutcomes.make()
      const hubScope = yield* Scope.make()
      const tail = yield* TailHub.make().pipe(
        Effect.provideService(DeliveryOutcomes.DeliveryOutcomes, outcomes),
        Scope.extend(hubScope)
      )
      const conn = yield* tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
      const fiber = yield* Effect.fork(TailHub.pump(conn, write))
      yield* outcomes.publish(outcome("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"))
      yield* TestClock.adjust(Duration.hours(24).pipe(Duration.subtract(Duration.millis(1))))
      expect(fiber.unsafePoll()).toBeNull()
      expect(written).toEqual([TailHub.OUTCOME_TYPE])
      yield* TestClock.adjust(Duration.millis(1))
      expect(yield* Fiber.join(fiber)).toBe("lifetime")

      const conn2 = yield* tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
      const fiber2 = yield* Effect.fork(TailHub.pump(conn2, write))
      yield* Scope.close(hubScope, Exit.void)
      const exit = yield* Fiber.await(fiber2)
      expect(Exit.isInterrupted(exit)).toBe(true)
    }))

  it.scoped("pump: interruptible even where its caller is not (the HTTP server runs a request uninterruptibly)", () =>
    Effect.gen(function*() {
      const outcomes = yield* DeliveryOutcomes.make()
      const tail = yield* TailHub.make().pipe(Effect.provideService(DeliveryOutcomes.DeliveryOutcomes, outcomes))
      const conn = yield* tail.connect("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa")
      const fiber = yield* Effect.fork(Effect.uninterruptible(TailHub.pump(conn, () => Effect.void)))
      yield* Effect.yieldNow()
      // the client went away: the handler interrupts the pump, which waits for frames
      const interrupting = yield* Effect.fork(Fiber.interrupt(fiber).pipe(Effect.timeout("1 second")))
      yield* TestClock.adjust("1 second")
      const exit = yield* Fiber.join(interrupting)
      expect(Exit.isInterrupted(exit)).toBe(true)
    }))

  it.effect("frames: the owner is never in one; an errorKind is bounded", () =>
    Effect.sync(() => {
      const f = TailHub.frameOf(outcome("did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", { errorKind: "x".repeat(100) }))
      expect(JSON.stringify(f)).not.toContain("did:plc")
      expect(f.errorKind?.length).toBe(64)
    }))
})

describe("TailSocket", () => {
  it.effect("room: at once under the bound; polls while over; SlowReader after the deadline (TestClock)", () =>
    Effect.gen(function*() {
      const bytes = yield* Ref.make(0)
      const room = TailSocket.room(Ref.get(bytes), 1_000, "30 seconds")
      // at the bound: at once, on a clock that does not move
      yield* Ref.set(bytes, 1_000)
      yield* room
      // over it: waits until the socket drains under it
      yield* Ref.set(bytes, 1_001)
      const waiting = yield* Effect.fork(room)
      yield* TestClock.adjust(Duration.seconds(29))
      expect(waiting.unsafePoll()).toBeNull()
      yield* Ref.set(bytes, 10)
      yield* TestClock.adjust(TailSocket.DRAIN_POLL_MAX)
      expect(Exit.isSuccess(yield* Fiber.await(waiting))).toBe(true)
      // over it for the whole deadline: SlowReader
      yield* Ref.set(bytes, 5_000)
      const stuck = yield* Effect.fork(room)
      yield* TestClock.adjust(Duration.seconds(29))
      expect(stuck.unsafePoll()).toBeNull()
      yield* TestClock.adjust(Duration.seconds(1))
      expect((yield* Effect.flip(Fiber.join(stuck)))._tag).toBe("SlowReader")
      // unknown: at once
      yield* TailSocket.room(undefined)
    }))

  it.scoped("upgrade on Node's HTTP server shows the socket's buffered bytes", () =>
    Effect.gen(function*() {
      const seen = yield* Deferred.make<number | undefined>()
      const app = Effect.gen(function*() {
        const { buffered, socket } = yield* TailSocket.upgrade
        // Node's server upgrades when the socket is run
        yield* socket.runRaw(() => Effect.void, {
          onOpen: Deferred.complete(seen, buffered ?? Effect.succeed(undefined))
        })
        return HttpServerResponse.empty()
      }).pipe(Effect.catchAll(() => Effect.succeed(HttpServerResponse.text("no", { status: 400 }))))
      const server = yield* Layer.build(
        HttpServer.serve(app).pipe(Layer.provideMerge(NodeHttpServer.layer(() => Http.createServer(), { port: 0 })))
      )
      const address = (yield* Effect.provide(HttpServer.HttpServer, server)).address
      const client = yield* openTailOrDie(address._tag === "TcpAddress" ? address.port : 0, "unused")
      expect(yield* Deferred.await(seen)).toBeTypeOf("number")
      client.ws.terminate()
    }))

  it.live("the listener's shutdown closes an open tail with 1001 (going away), on Node's HTTP server", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(apiLayer({ api: { limits: { callsPerCaller: HIGH } } }), scope)
      const owner = yield* newOwner()
      const token = yield* mint(owner, NSID)
      const port = yield* Effect.provide(serverPort, context)
      const tail = yield* openTailOrDie(port, token)
      yield* Effect.provide(publish([outcome(owner.did)]), context)
      yield* until("a frame", () => tail.frames.length === 1)
      yield* Scope.close(scope, Exit.void)
      yield* until("closed", () => tail.closed !== undefined)
      expect(tail.closed).toEqual({ code: TailMethods.SHUTDOWN_CLOSE.code, reason: TailMethods.SHUTDOWN_CLOSE.reason })
    }))
})
