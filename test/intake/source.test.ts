/**
 * FirehoseSource against local WebSocket servers (`ws`, 127.0.0.1, port 0) speaking Jetstream and
 * subscribeRepos. The client side is the runtime's global WebSocket (Node 22 here; Bun in the smoke
 * script).
 */
import * as Socket from "@effect/platform/Socket"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Deferred, Duration, Effect, Either, Fiber, Option, Stream, TestClock } from "effect"
import type { IncomingMessage } from "node:http"
import * as Net from "node:net"
import { WebSocket as WsClient, WebSocketServer } from "ws"
import { TID_ALPHABET } from "../../src/schemas/Tid.js"
import {
  checkSourceUrl,
  connectJetstream,
  connectRelay,
  type JetstreamItem,
  openJetstream,
  type RelayItem,
  SourceError
} from "../../src/services/intake/FirehoseSource.js"
import { jetstreamSpecs } from "../../src/services/intake/JetstreamPlan.js"
import type { WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { freePort } from "../support/proc.js"
import {
  commitFrame,
  DID,
  errorFrame,
  identityFrame,
  infoFrame,
  jetstreamCreate,
  richRecord,
  richRecordJson
} from "./frames.js"

interface Server {
  readonly port: number
  readonly connections: () => number
}

/** A WebSocket server for the test's scope; `onConnection` drives each client. */
const wsServer = (
  onConnection: (socket: WsClient, req: IncomingMessage) => void,
  options: { readonly verifyClient?: () => boolean } = {}
) =>
  Effect.acquireRelease(
    Effect.async<{ wss: WebSocketServer; count: { n: number } }>((resume) => {
      const count = { n: 0 }
      const wss = new WebSocketServer({
        host: "127.0.0.1",
        port: 0,
        ...(options.verifyClient ? { verifyClient: options.verifyClient } : {})
      })
      wss.on("connection", (socket, req) => {
        count.n++
        onConnection(socket, req)
      })
      wss.once("listening", () => resume(Effect.succeed({ wss, count })))
    }),
    ({ wss }) =>
      Effect.async<void>((resume) => {
        for (const c of wss.clients) c.terminate()
        wss.close(() => resume(Effect.void))
      })
  ).pipe(
    Effect.map(({ wss, count }): Server => {
      const a = wss.address()
      return { port: typeof a === "object" && a !== null ? a.port : 0, connections: () => count.n }
    })
  )

/** Deterministic canonical did:plc values. */
const fakeDid = (i: number): string => {
  let s = ""
  let v = i
  for (let k = 0; k < 24; k++) {
    s = TID_ALPHABET.charAt(v % 32) + s
    v = Math.floor(v / 32)
  }
  return `did:plc:${s}`
}

const base = {
  stream: "direct",
  relay: "wss://jetstream.example/subscribe",
  maxBytes: 1 << 20,
  connectTimeoutMs: 5000,
  allowInsecure: true
}

const collectAll = <A>(s: Stream.Stream<A, SourceError>) =>
  s.pipe(Stream.either, Stream.runCollect, Effect.map(Chunk.toReadonlyArray))

const T0 = 1725911162329308

describe("FirehoseSource: URL rules", () => {
  it("wss: always; ws: only to loopback and only in insecure dev mode; nothing else", () => {
    const okUrls: ReadonlyArray<readonly [string, boolean]> = [
      ["wss://jetstream2.us-east.bsky.network/subscribe", false],
      ["wss://bsky.network", false],
      ["ws://127.0.0.1:6008/subscribe", true],
      ["ws://localhost:2583", true],
      ["ws://[::1]:2583", true]
    ]
    for (const [u, insecure] of okUrls) expect(Either.isRight(checkSourceUrl(u, insecure)), u).toBe(true)
    const bad: ReadonlyArray<readonly [string, boolean]> = [
      ["ws://127.0.0.1:6008/subscribe", false],
      ["ws://10.0.0.1/subscribe", true],
      ["ws://jetstream.example/subscribe", true],
      ["ws://[::2]/", true],
      ["https://bsky.network", true],
      ["http://127.0.0.1", true],
      ["wss://user:pw@bsky.network", false],
      ["wss://bsky.network/#frag", false],
      ["not a url", true],
      ["", true]
    ]
    for (const [u, insecure] of bad) {
      expect(checkSourceUrl(u, insecure), u).toEqual(Either.left(new SourceError({ kind: "connect" })))
    }
  })

  it("an empty fragment is a fragment too (the URL parser drops it silently)", () => {
    expect(checkSourceUrl("wss://bsky.network/#", false)).toEqual(Either.left(new SourceError({ kind: "connect" })))
    expect(checkSourceUrl("wss://bsky.network/subscribe#", false)).toEqual(
      Either.left(new SourceError({ kind: "connect" }))
    )
  })

  it.scopedLive("a rejected URL fails with connect before any connection is made", () =>
    Effect.gen(function*() {
      const srv = yield* wsServer(() => {})
      const r = yield* connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${srv.port}/subscribe`,
        allowInsecure: false,
        cursor: undefined
      }).pipe(
        Stream.runCollect,
        Effect.flip
      )
      expect(r).toEqual(new SourceError({ kind: "connect" }))
      expect(srv.connections()).toBe(0)
      const r2 = yield* connectRelay({ ...base, url: `http://127.0.0.1:${srv.port}`, cursor: undefined }).pipe(
        Stream.runCollect,
        Effect.flip
      )
      expect(r2.kind).toBe("connect")
      expect(r2.message).not.toContain("127.0.0.1")
    }))
})

describe("FirehoseSource: Jetstream", () => {
  it.scopedLive("requireHello + cursor in the URL, 10,000 wantedDids in options_update, frames in order, malformed → Left, close → closed", () =>
    Effect.gen(function*() {
      const seen: { url: string | undefined; hello: unknown } = { url: undefined, hello: undefined }
      const frames = [
        jetstreamCreate(T0 + 1, "r1", richRecordJson()),
        jetstreamCreate(T0 + 2, "r2"),
        "{not json",
        JSON.stringify({ did: DID, time_us: T0 + 3, kind: "identity", identity: { did: DID } }),
        jetstreamCreate(T0 + 4, "r4")
      ]
      const srv = yield* wsServer((socket, req) => {
        seen.url = req.url
        socket.once("message", (data) => {
          seen.hello = JSON.parse(String(data))
          for (const f of frames) socket.send(f)
          socket.close(1000)
        })
      })
      const wantedDids = Array.from({ length: 10_000 }, (_, i) => fakeDid(i))
      const items = yield* collectAll(connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${srv.port}/subscribe`,
        cursor: 1725911162329308n,
        wantedCollections: ["app.bsky.feed.post"],
        wantedDids
      }))

      // the URL carries only requireHello and the cursor
      const url = new URL(seen.url ?? "", "ws://x")
      expect(url.pathname).toBe("/subscribe")
      expect(url.searchParams.get("requireHello")).toBe("true")
      expect(url.searchParams.get("cursor")).toBe("1725911162329308")
      expect([...url.searchParams.keys()].sort()).toEqual(["cursor", "requireHello"])
      expect(seen.url).not.toContain("wanted")
      // the filters arrive in the hello
      expect(seen.hello).toEqual({
        type: "options_update",
        payload: { wantedCollections: ["app.bsky.feed.post"], wantedDids }
      })
      expect(new Set(wantedDids).size).toBe(10_000)

      // every frame, in order; the malformed one as Left(json); then the close as SourceError closed
      expect(items).toHaveLength(6)
      const decoded = items.slice(0, 5).map((i) => Either.getOrThrow(i))
      expect(decoded.map((d) => (Either.isRight(d) ? d.right.cursor : d.left.reason))).toEqual([
        BigInt(T0 + 1),
        BigInt(T0 + 2),
        "json",
        BigInt(T0 + 3),
        BigInt(T0 + 4)
      ])
      const first = decoded[0] as JetstreamItem
      expect(Either.isRight(first) && first.right.event?.kind === "commit" && first.right.event.record).toEqual(
        richRecordJson()
      )
      expect(items[5]).toEqual(Either.left(new SourceError({ kind: "closed" })))
    }))

  it.scopedLive("closing the stream's scope closes the socket", () =>
    Effect.gen(function*() {
      const serverSawClose = yield* Deferred.make<number>()
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => {
          for (let i = 1; i <= 3; i++) socket.send(jetstreamCreate(T0 + i, `r${i}`))
        })
        socket.on("close", (code) => Deferred.unsafeDone(serverSawClose, Effect.succeed(code)))
      })
      const got = yield* connectJetstream({ ...base, url: `ws://127.0.0.1:${srv.port}/subscribe`, cursor: undefined })
        .pipe(
          Stream.take(2),
          Stream.runCollect
        )
      expect(Chunk.size(got)).toBe(2)
      const code = yield* Deferred.await(serverSawClose).pipe(Effect.timeout("5 seconds"))
      expect(code).toBe(1000)
    }))

  it.scopedLive("interrupting the consumer closes the socket", () =>
    Effect.gen(function*() {
      const serverSawClose = yield* Deferred.make<void>()
      const serverGotHello = yield* Deferred.make<void>()
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => Deferred.unsafeDone(serverGotHello, Effect.void))
        socket.on("close", () => Deferred.unsafeDone(serverSawClose, Effect.void))
      })
      const fiber = yield* connectJetstream({ ...base, url: `ws://127.0.0.1:${srv.port}/subscribe`, cursor: undefined })
        .pipe(
          Stream.runDrain,
          Effect.fork
        )
      yield* Deferred.await(serverGotHello).pipe(Effect.timeout("5 seconds"))
      yield* Fiber.interrupt(fiber)
      yield* Deferred.await(serverSawClose).pipe(Effect.timeout("5 seconds"))
    }))

  it.scopedLive("a consumer that falls behind the bounded buffer: buffered frames, then overflow; socket closed", () =>
    Effect.gen(function*() {
      const serverSawClose = yield* Deferred.make<void>()
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => {
          for (let i = 1; i <= 50; i++) socket.send(jetstreamCreate(T0 + i, `r${i}`))
        })
        socket.on("close", () => Deferred.unsafeDone(serverSawClose, Effect.void))
      })
      const conn = yield* openJetstream({
        ...base,
        url: `ws://127.0.0.1:${srv.port}/subscribe`,
        cursor: undefined,
        bufferFrames: 4
      })
      // nobody reads until the client has given up on the connection
      yield* Deferred.await(serverSawClose).pipe(Effect.timeout("5 seconds"))
      const items = yield* collectAll(conn.frames)
      expect(items).toHaveLength(5)
      expect(
        items.slice(0, 4).map((i) => {
          const d = Either.getOrThrow(i)
          return Either.isRight(d) ? d.right.cursor : undefined
        })
      ).toEqual([1n, 2n, 3n, 4n].map((n) => BigInt(T0) + n))
      expect(items[4]).toEqual(Either.left(new SourceError({ kind: "overflow" })))
    }))

  it.scopedLive("a frame over the byte bound arriving into an empty buffer is admitted (then too_large, SPEC §3.2), not an overflow", () =>
    Effect.gen(function*() {
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => {
          socket.send(jetstreamCreate(T0 + 1, "big", { $type: "x.y.z", pad: "x".repeat(4000) }))
          socket.close()
        })
      })
      // the byte buffer is as small as it can be: the frame limit
      const items = yield* collectAll(connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${srv.port}/subscribe`,
        cursor: undefined,
        maxBytes: 1024,
        bufferBytes: 1024
      }))
      expect(items).toHaveLength(2)
      const first = items[0] === undefined ? undefined : Either.getOrThrow(items[0])
      expect(first !== undefined && Either.isLeft(first) ? first.left.reason : first).toBe("too_large")
      expect(items[1]).toEqual(Either.left(new SourceError({ kind: "closed" })))
    }))

  it.scopedLive("the byte buffer is at least the frame limit, whatever bufferBytes says", () =>
    Effect.gen(function*() {
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => {
          // two valid frames of about 600 and 300 bytes: together within the 1024-byte frame limit
          socket.send(jetstreamCreate(T0 + 1, "a", { $type: "x.y.z", pad: "x".repeat(300) }))
          socket.send(jetstreamCreate(T0 + 2, "b"))
          socket.close()
        })
      })
      const items = yield* collectAll(connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${srv.port}/subscribe`,
        cursor: undefined,
        maxBytes: 1024,
        bufferBytes: 100
      }))
      expect(items.map((i) => Either.isRight(i) && Either.isRight(i.right))).toEqual([true, true, false])
      expect(items[2]).toEqual(Either.left(new SourceError({ kind: "closed" })))
    }))

  it.scoped("a refused connection fails with connect when the socket says so, not after the open timeout (TestClock)", () =>
    Effect.gen(function*() {
      const closedPort = yield* Effect.promise(freePort)
      // the TestClock never reaches the open timeout: only the socket's own error can end this
      const r = yield* connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${closedPort}/subscribe`,
        cursor: undefined,
        connectTimeoutMs: 60_000
      }).pipe(
        Stream.runCollect,
        Effect.flip,
        // a guard on the real clock, so that a regression fails instead of hanging the file
        Effect.raceFirst(Effect.promise(() => new Promise<undefined>((r) => setTimeout(() => r(undefined), 20_000))))
      )
      expect(r).toEqual(new SourceError({ kind: "connect" }))
    }))

  it.scopedLive("updateOptions sends a new options_update mid-stream", () =>
    Effect.gen(function*() {
      const messages: Array<unknown> = []
      const second = yield* Deferred.make<void>()
      const srv = yield* wsServer((socket) => {
        socket.on("message", (data) => {
          messages.push(JSON.parse(String(data)))
          if (messages.length === 2) Deferred.unsafeDone(second, Effect.void)
        })
      })
      const conn = yield* openJetstream({ ...base, url: `ws://127.0.0.1:${srv.port}/subscribe`, cursor: undefined })
      yield* conn.updateOptions({ wantedDids: [DID] })
      yield* Deferred.await(second).pipe(Effect.timeout("5 seconds"))
      expect(messages).toEqual([
        { type: "options_update", payload: {} },
        { type: "options_update", payload: { wantedDids: [DID] } }
      ])
    }))

  it.scopedLive("connect failures: refused, upgrade rejected, open timeout", () =>
    Effect.gen(function*() {
      // a port nobody listens on (below the ephemeral range: no listener on port 0 takes it meanwhile)
      const closedPort = yield* Effect.promise(freePort)
      const refused = yield* connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${closedPort}/subscribe`,
        cursor: undefined
      }).pipe(
        Stream.runCollect,
        Effect.flip
      )
      expect(refused).toEqual(new SourceError({ kind: "connect" }))

      const rejecting = yield* wsServer(() => {}, { verifyClient: () => false })
      const rejected = yield* connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${rejecting.port}/subscribe`,
        cursor: undefined
      }).pipe(
        Stream.runCollect,
        Effect.flip
      )
      expect(rejected).toEqual(new SourceError({ kind: "connect" }))

      // accepts TCP, never answers the upgrade
      const silent = yield* Effect.acquireRelease(
        Effect.async<Net.Server>((resume) => {
          const sockets: Array<Net.Socket> = []
          const s = Net.createServer((sock) => sockets.push(sock))
          s.on("close", () => sockets.forEach((x) => x.destroy()))
          s.listen(0, "127.0.0.1", () => resume(Effect.succeed(s)))
        }),
        (s) => Effect.sync(() => s.close())
      )
      const a = silent.address()
      const port = typeof a === "object" && a !== null ? a.port : 1
      const started = Date.now()
      const timedOut = yield* connectJetstream({
        ...base,
        url: `ws://127.0.0.1:${port}/subscribe`,
        cursor: undefined,
        connectTimeoutMs: 300
      }).pipe(
        Stream.runCollect,
        Effect.flip
      )
      expect(timedOut).toEqual(new SourceError({ kind: "connect" }))
      expect(Date.now() - started).toBeLessThan(4000)
    }))
})

describe("FirehoseSource: connection control", () => {
  it.scopedLive("close: the socket closes now; frames end with closed after what was buffered", () =>
    Effect.gen(function*() {
      const serverSawClose = yield* Deferred.make<void>()
      const sent = yield* Deferred.make<void>()
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => {
          socket.send(jetstreamCreate(T0 + 1, "r1"), () => Deferred.unsafeDone(sent, Effect.void))
        })
        socket.on("close", () => Deferred.unsafeDone(serverSawClose, Effect.void))
      })
      const conn = yield* openJetstream({ ...base, url: `ws://127.0.0.1:${srv.port}/subscribe`, cursor: undefined })
      const first = yield* conn.frames.pipe(Stream.take(1), Stream.runCollect)
      expect(Chunk.size(first)).toBe(1)
      yield* Deferred.await(sent)
      yield* conn.close
      yield* Deferred.await(serverSawClose).pipe(Effect.timeout("5 seconds"))
      expect(yield* conn.send("x").pipe(Effect.flip)).toEqual(new SourceError({ kind: "closed" }))
    }))

  it.scoped("a connection silent for the idle timeout is closed as `idle` (half-open sockets are noticed); frames keep it open (TestClock)", () =>
    Effect.gen(function*() {
      const serverSawClose = yield* Deferred.make<void>()
      const hello = yield* Deferred.make<WsClient>()
      const srv = yield* wsServer((socket) => {
        socket.once("message", () => Deferred.unsafeDone(hello, Effect.succeed(socket)))
        socket.on("close", () => Deferred.unsafeDone(serverSawClose, Effect.void))
      })
      const conn = yield* openJetstream({
        ...base,
        url: `ws://127.0.0.1:${srv.port}/subscribe`,
        cursor: undefined,
        idleTimeoutMs: 60_000
      })
      const socket = yield* Deferred.await(hello)
      const gotFirst = yield* Deferred.make<void>()
      const frames = yield* Effect.fork(
        collectAll(conn.frames.pipe(Stream.tap(() => Deferred.succeed(gotFirst, undefined))))
      )
      // a frame within the first period, seen by the client before the period ends: still open after it
      socket.send(jetstreamCreate(T0 + 1, "r1"))
      yield* Deferred.await(gotFirst)
      yield* TestClock.adjust("60 seconds")
      for (let i = 0; i < 20; i++) yield* Effect.yieldNow()
      // the client side is still open: the frames have not ended
      expect(Option.isNone(yield* Fiber.poll(frames))).toBe(true)
      expect(yield* Deferred.isDone(serverSawClose)).toBe(false)
      // then a whole period of silence: closed, the frames end with `closed`
      yield* TestClock.adjust("60 seconds")
      const got = yield* Fiber.join(frames)
      expect(got.length).toBe(2)
      expect(got.map((x) => Either.isRight(x))).toEqual([true, false])
      expect(got[1]).toEqual(Either.left(new SourceError({ kind: "idle" })))
      yield* Deferred.await(serverSawClose)
    }))

  it.scopedLive("an injected Socket.WebSocketConstructor is used (here the `ws` client)", () =>
    Effect.gen(function*() {
      let constructed = 0
      const srv = yield* wsServer((socket) => {
        socket.send(identityFrame(9))
        socket.close(1000)
      })
      const items = yield* collectAll(connectRelay({ ...base, url: `ws://127.0.0.1:${srv.port}`, cursor: undefined }))
        .pipe(
          Effect.provideService(Socket.WebSocketConstructor, (url) => {
            constructed++
            return new WsClient(url) as unknown as globalThis.WebSocket
          })
        )
      expect(constructed).toBe(1)
      expect(items).toHaveLength(2)
      expect(items[0]).toEqual(Either.right(Either.right({
        kind: "events",
        seq: 9n,
        events: [{
          kind: "identity",
          did: DID,
          timeUs: expect.any(Number),
          stream: "direct",
          relay: base.relay,
          cursor: "9"
        }]
      })))
    }))
})

describe("FirehoseSource: relay (subscribeRepos)", () => {
  it.scopedLive("binary frames → decoded events with records; error frame; close → closed", () =>
    Effect.gen(function*() {
      let url: string | undefined
      const srv = yield* wsServer((socket, req) => {
        url = req.url
        socket.send(identityFrame(5))
        socket.send(commitFrame({
          seq: 6,
          ops: [
            { action: "create", path: "app.bsky.feed.post/3l3qo2vuowo2b", record: richRecord() },
            { action: "delete", path: "app.bsky.feed.post/3l3qo2vuowo2c" }
          ]
        }))
        socket.send(infoFrame("OutdatedCursor"))
        socket.send("a text frame")
        socket.send(Uint8Array.from([0xff, 0xfe]))
        socket.send(errorFrame("FutureCursor"))
        socket.close(1008, "FutureCursor")
      })
      const items = yield* collectAll(connectRelay({
        ...base,
        stream: "relay",
        relay: "wss://bsky.network",
        url: `ws://127.0.0.1:${srv.port}/`,
        cursor: 5n
      }))
      expect(url).toBe("/xrpc/com.atproto.sync.subscribeRepos?cursor=5")
      expect(items).toHaveLength(7)
      const d = items.slice(0, 6).map((i) => Either.getOrThrow(i)) as ReadonlyArray<RelayItem>
      const r0 = d[0]
      expect(r0 && Either.isRight(r0) && r0.right).toMatchObject({
        kind: "events",
        seq: 5n,
        events: [{ kind: "identity", did: DID }]
      })
      const r1 = d[1]
      if (!r1 || Either.isLeft(r1) || r1.right.kind !== "events") throw new Error("commit not decoded")
      expect(r1.right.seq).toBe(6n)
      expect(r1.right.events).toHaveLength(2)
      expect(r1.right.events[0]).toMatchObject({
        kind: "commit",
        operation: "create",
        collection: "app.bsky.feed.post",
        rkey: "3l3qo2vuowo2b",
        record: richRecordJson(),
        cursor: "6",
        stream: "relay",
        relay: "wss://bsky.network"
      })
      expect(r1.right.events[1]).toMatchObject({ kind: "commit", operation: "delete", record: undefined })
      expect(d[2]).toEqual(Either.right({ kind: "info", name: "OutdatedCursor" }))
      expect(d[3]).toEqual(Either.left({ reason: "shape" }))
      expect(d[4]).toEqual(Either.left({ reason: "json" }))
      expect(d[5]).toEqual(Either.right({ kind: "error", error: "FutureCursor" }))
      expect(items[6]).toEqual(Either.left(new SourceError({ kind: "closed" })))
    }))

  it.scopedLive("no cursor = live tail (no query string)", () =>
    Effect.gen(function*() {
      let url: string | undefined
      const srv = yield* wsServer((socket, req) => {
        url = req.url
        socket.close(1000)
      })
      const items = yield* collectAll(connectRelay({ ...base, url: `ws://127.0.0.1:${srv.port}`, cursor: undefined }))
      expect(url).toBe("/xrpc/com.atproto.sync.subscribeRepos")
      expect(items).toEqual([Either.left(new SourceError({ kind: "closed" }))])
    }))
})

describe("Jetstream streams' idle watchdog", () => {
  /** the stream specs of a plan whose direct set is `dids` (nothing else of the index is read to connect) */
  const specs = (port: number, dids: ReadonlyArray<string>) =>
    jetstreamSpecs({
      url: `ws://127.0.0.1:${port}/subscribe`,
      common: { maxBytes: 1 << 20, connectTimeoutMs: 5000, allowInsecure: true },
      index: { wantedDids: () => new Set(dids) } as unknown as WebhookIndex,
      directDidsMax: 10_000,
      reconfigureDelay: Duration.seconds(1),
      makeRunner: () => Effect.die("not used"),
      start: () => Effect.die("not used")
    })

  it.scoped(
    "the registry stream (wantedCollections only: every DID's #account/#identity events reach it, so it is never quiet on a live network) is closed as `idle` after 5 silent minutes; the direct stream (wantedDids) is not (TestClock)",
    () =>
      Effect.gen(function*() {
        const hellos = yield* Deferred.make<void>()
        let seen = 0
        const srv = yield* wsServer((socket) => {
          socket.once("message", () => {
            seen++
            if (seen === 2) Deferred.unsafeDone(hellos, Effect.void)
          })
        })
        const plan = specs(srv.port, [DID])
        const registry = yield* Effect.fork(collectAll(plan.registry.connect(undefined)))
        const direct = yield* Effect.fork(collectAll(plan.direct.connect(undefined)))
        yield* Deferred.await(hellos)
        yield* TestClock.adjust("10 minutes")
        // the registry stream ends (bounded wait on real sockets, not on time)
        for (let i = 0; i < 200 && Option.isNone(yield* Fiber.poll(registry)); i++) {
          yield* Effect.promise(() => new Promise((r) => setTimeout(r, 10)))
        }
        expect(Option.isSome(yield* Fiber.poll(registry))).toBe(true)
        const got = yield* Fiber.join(registry)
        expect(got.at(-1)).toEqual(Either.left(new SourceError({ kind: "idle" })))
        expect(got.slice(0, -1).every(Either.isRight)).toBe(true)
        expect(yield* Fiber.poll(direct)).toEqual(Option.none())
        yield* Fiber.interrupt(direct)
      })
  )
})
