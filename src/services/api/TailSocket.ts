/**
 * The live tail's WebSocket (SPEC §8.5): the upgrade, and the bytes the runtime holds for the
 * socket that the client has not taken yet, so that a slow reader's frames wait (and drop,
 * counted) in the hub's bounded queue rather than in the runtime's socket buffer.
 *
 * @effect/platform's Socket writer hands every frame to the runtime and ignores backpressure (Bun:
 * `ServerWebSocket.sendText`, whose buffer grows to the server's backpressure limit, 16 MiB by
 * default, beyond which Bun drops silently; Node's `ws`: unbounded), and its Socket does not expose
 * the buffered amount. So this module observes it:
 * - Bun: the `ServerWebSocket`'s `getBufferedAmount()`. @effect/platform-bun (0.91.2) keeps the
 *   socket to itself; its upgrade passes Bun's `server.upgrade` a `data` object whose `deferred` it
 *   completes with the socket when it opens. The upgrade here runs the library's own, on a view of
 *   the request whose `bunServer.upgrade` notes that `data` on its way; everything else (frames,
 *   reads, closes) is still the library's. test/api/tail-bun.test.ts fails if the library changes.
 * - Node (tests): the request's `net.Socket`, which `ws` writes to: its `writableLength`.
 * - Any other server: unknown (logged once per connection); the hub's bound holds, the socket's
 *   is the runtime's.
 *
 * {@link room} waits (polling on the Effect Clock, only while the socket is over
 * {@link SOCKET_BUFFER_BYTES}, 10 ms doubling up to {@link DRAIN_POLL_MAX}: Bun has no per-socket
 * drain event, and @effect/platform-bun registers no `drain` handler) and fails with
 * {@link SlowReader} after {@link DRAIN_DEADLINE}.
 *
 * The stream is one way, so what a client sends is bounded too:
 * - Node: the request's socket is read alongside `ws` ({@link inboundGuard}): once the client's data
 *   frames (headers and announced payloads) pass {@link MAX_INBOUND_BYTES}, the socket is ended,
 *   before `ws` buffers such a message (its own bound is the server's `maxPayload`, 100 MiB, which
 *   @effect/platform-node's WebSocketServer does not let a caller set).
 * - Bun: not here. Bun bounds a message by the server's `websocket.maxPayloadLength` (16 MiB by
 *   default) and has no per-socket setting; @effect/platform-bun 0.91.2's server replaces any
 *   `websocket` options it is given, so the service cannot lower it.
 *
 * {@link TailSocket.terminate} ends a socket whose client does not answer the service's close frame
 * (Node's `ws` otherwise waits 30 s for it, and the listener's close waits for `ws`).
 */
import type * as HttpServerError from "@effect/platform/HttpServerError"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as Socket from "@effect/platform/Socket"
import { Data, Deferred, Duration, Effect, Schedule } from "effect"
import * as Net from "node:net"

/** A connection's socket takes no more frames while the runtime holds more than this for it. */
export const SOCKET_BUFFER_BYTES = 64 * 1024
/** A socket that stays over {@link SOCKET_BUFFER_BYTES} this long is closed ({@link SLOW_READER_CLOSE}). */
export const DRAIN_DEADLINE = Duration.seconds(30)
/** A socket over its bound is looked at again after 10 ms, then twice as long each time, up to this. */
export const DRAIN_POLL_MAX = Duration.millis(250)
const drainPoll = Schedule.exponential(Duration.millis(10)).pipe(Schedule.union(Schedule.spaced(DRAIN_POLL_MAX)))
/** The close of a connection whose socket stayed over its bound for {@link DRAIN_DEADLINE}. */
export const SLOW_READER_CLOSE = { code: 1008, reason: "slow reader" } as const
/**
 * The most a client may send in data frames (text, binary, continuation: their headers and
 * payloads) over a connection, where the server shows its socket (Node). The stream is one way:
 * the first message closes it (`TailMethods`); past this the socket is ended at once.
 */
export const MAX_INBOUND_BYTES = 1024

export class SlowReader extends Data.TaggedError("SlowReader")<{}> {}

export interface TailSocket {
  readonly socket: Socket.Socket
  /** The bytes the runtime holds for the socket, not yet taken by the client; `undefined`: unknown. */
  readonly buffered: Effect.Effect<number> | undefined
  /**
   * Waits at most `grace` (Effect Clock) for the socket to close, then ends it without a close
   * handshake: for a client that does not answer the service's close frame. Where the server does
   * not show its socket, waits `grace`.
   */
  readonly terminate: (grace: Duration.DurationInput) => Effect.Effect<void>
}

interface BunServer {
  readonly upgrade: (request: unknown, options: unknown) => unknown
}

interface BunWebSocket {
  readonly getBufferedAmount: () => number
  readonly terminate: () => void
  readonly readyState: number
}

const isObject = (u: unknown): u is object => typeof u === "object" && u !== null

const isBunServer = (u: unknown): u is BunServer => isObject(u) && typeof Reflect.get(u, "upgrade") === "function"

const isDeferred = (u: unknown): u is Deferred.Deferred<unknown, unknown> => isObject(u) && Deferred.DeferredTypeId in u

const isBunWebSocket = (u: unknown): u is BunWebSocket =>
  isObject(u) && typeof Reflect.get(u, "getBufferedAmount") === "function" &&
  typeof Reflect.get(u, "terminate") === "function"

/** `closed`, or `grace` on the Clock, then `end`. Each side is interruptible on its own, so that this
 * works in a finalizer (uninterruptible): the loser of the race is interrupted, not waited for. */
const terminateWith = (closed: Effect.Effect<void>, end: () => void) => (grace: Duration.DurationInput) =>
  Effect.raceFirst(Effect.interruptible(closed), Effect.interruptible(Effect.sleep(grace))).pipe(
    Effect.zipRight(Effect.sync(end))
  )

/** Where the socket cannot be seen: the grace, then nothing. */
const unknownTerminate = terminateWith(Effect.never, () => undefined)

/** Bun: the library's upgrade, with the `data` it gives Bun's `server.upgrade` noted. */
const upgradeBun = (request: HttpServerRequest.HttpServerRequest, server: BunServer) =>
  Effect.gen(function*() {
    let data: unknown = undefined
    const noting: BunServer = {
      upgrade: (source, options) => {
        data = isObject(options) ? Reflect.get(options, "data") : undefined
        return server.upgrade(source, options)
      }
    }
    const view = new Proxy(request, {
      get: (target, key, receiver) => key === "bunServer" ? noting : Reflect.get(target, key, receiver)
    })
    const socket = yield* view.upgrade
    const opened: unknown = isObject(data) ? Reflect.get(data, "deferred") : undefined
    // completed by the library before its upgrade succeeded: this does not wait
    const ws = isDeferred(opened) ? yield* Effect.option(Deferred.await(opened)) : undefined
    const raw = ws?._tag === "Some" ? ws.value : undefined
    // completed by the library's `close` handler
    const closing: unknown = isObject(data) ? Reflect.get(data, "closeDeferred") : undefined
    const closed = isDeferred(closing) ? Effect.ignore(Deferred.await(closing)) : Effect.never
    const upgraded: TailSocket = isBunWebSocket(raw)
      ? {
        socket,
        buffered: Effect.sync(() => raw.getBufferedAmount()),
        // 3: CLOSED (Bun's `terminate` of a closed socket is not documented as a no-op)
        terminate: terminateWith(closed, () => raw.readyState === 3 ? undefined : raw.terminate())
      }
      : { socket, buffered: undefined, terminate: unknownTerminate }
    return upgraded
  })

/** Node: the request's `net.Socket`, which `ws` writes the frames to. */
const nodeSocket = (request: HttpServerRequest.HttpServerRequest): Net.Socket | undefined => {
  const source: unknown = Reflect.get(request, "source")
  const socket: unknown = isObject(source) ? Reflect.get(source, "socket") : undefined
  return socket instanceof Net.Socket ? socket : undefined
}

/**
 * Node: fails once `socket` has closed. `ws` answers a handshake it refuses (no or a malformed
 * `Sec-WebSocket-Key`, another `Sec-WebSocket-Version` …) with a 400 itself, ends the socket and
 * never calls @effect/platform-node's upgrade callback. The library acquires the WebSocket (waits
 * for that callback, uninterruptibly) when the socket is first read, and does not interrupt the
 * request for a socket it ended: the read waited forever, holding the caller's tail place and
 * keeping the API's scope from closing.
 */
const socketClosed = (socket: Net.Socket): Effect.Effect<never, Socket.SocketError> =>
  Effect.flatMap(
    nodeClosed(socket),
    () => Effect.fail(new Socket.SocketGenericError({ reason: "Open", cause: "the socket closed before it opened" }))
  )

/** Node: succeeds once `socket` has closed (at once when it is destroyed). */
const nodeClosed = (socket: Net.Socket): Effect.Effect<void> =>
  Effect.async<void>((resume) => {
    const closed = () => resume(Effect.void)
    if (socket.destroyed) return closed()
    socket.once("close", closed)
    return Effect.sync(() => void socket.off("close", closed))
  })

/** The length of a WebSocket frame's header, from its first bytes (2 while the second is unknown). */
const headerLength = (header: Uint8Array): number => {
  const b1 = header[1]
  if (b1 === undefined) return 2
  const len7 = b1 & 0x7f
  return 2 + (len7 === 126 ? 2 : len7 === 127 ? 8 : 0) + ((b1 & 0x80) === 0 ? 0 : 4)
}

/** The payload length a complete header announces. */
const payloadLength = (header: Buffer): number => {
  const len7 = (header[1] ?? 0) & 0x7f
  return len7 === 126 ? header.readUInt16BE(2) : len7 === 127 ? Number(header.readBigUInt64BE(2)) : len7
}

/**
 * A reader of the bytes a client sends (all of them, from the first, in order): it follows the
 * WebSocket frames by their headers and calls `end` (once) when the data frames (opcodes 0–2:
 * their headers and announced payloads, counted when the header arrives) pass `max`. Control
 * frames are not counted: the protocol bounds each to 125 bytes (`ws` enforces it). Frames
 * compressed by permessage-deflate would be counted as sent (`ws` servers do not negotiate it by
 * default, nor does @effect/platform-node's).
 */
export const inboundGuard = (max: number, end: () => void): (chunk: Uint8Array) => void => {
  let header = Buffer.alloc(0)
  let skip = 0
  let data = 0
  let ended = false
  return (chunk) => {
    let at = 0
    // each step takes at least one byte of the chunk
    while (at < chunk.length && !ended) {
      if (skip > 0) {
        const n = Math.min(skip, chunk.length - at)
        skip -= n
        at += n
        continue
      }
      const n = Math.min(headerLength(header) - header.length, chunk.length - at)
      header = Buffer.concat([header, chunk.subarray(at, at + n)])
      at += n
      if (header.length < headerLength(header)) continue
      const length = payloadLength(header)
      if (((header[0] ?? 0) & 0x0f) < 0x08) {
        data += header.length + length
        if (data > max) {
          ended = true
          end()
        }
      }
      skip = length
      header = Buffer.alloc(0)
    }
  }
}

/**
 * Node: reads the client's bytes with {@link inboundGuard} (past {@link MAX_INBOUND_BYTES}, the
 * socket is destroyed). The guard starts with the first `data` listener added to the socket after
 * the upgrade request, which is `ws`'s (its `setSocket`, after it has put back the bytes that came
 * with the request), so it sees every byte `ws` sees. A `ws` that stopped reading through `data`
 * events would leave the guard unstarted: test/api/tail-inbound.test.ts fails then.
 */
const guardInbound = (node: Net.Socket): void => {
  const guard = inboundGuard(MAX_INBOUND_BYTES, () => node.destroy())
  const onData = (chunk: unknown) => {
    if (chunk instanceof Uint8Array) guard(chunk)
  }
  const onListener = (event: string | symbol) => {
    if (event !== "data") return
    node.off("newListener", onListener)
    node.on("data", onData)
  }
  node.on("newListener", onListener)
}

/**
 * Node: `socket` whose reads end when the request's socket closes. The library's read is
 * disconnected, so that ending it does not wait for an acquisition that never comes (the waiting
 * fiber is then unreachable).
 */
const endingWith = (socket: Socket.Socket, node: Net.Socket): Socket.Socket => ({
  ...socket,
  runRaw: (handler, options) => Effect.raceFirst(Effect.disconnect(socket.runRaw(handler, options)), socketClosed(node))
})

/** Upgrade the request to a WebSocket, with the socket's buffered amount where the server shows it. */
export const upgrade: Effect.Effect<TailSocket, HttpServerError.RequestError, HttpServerRequest.HttpServerRequest> =
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const server: unknown = Reflect.get(request, "bunServer")
    const node = nodeSocket(request)
    if (node !== undefined && !isBunServer(server)) guardInbound(node)
    const upgraded: TailSocket = isBunServer(server)
      ? yield* upgradeBun(request, server)
      : node === undefined
      ? { socket: yield* request.upgrade, buffered: undefined, terminate: unknownTerminate }
      : {
        socket: endingWith(yield* request.upgrade, node),
        buffered: Effect.sync(() => node.writableLength),
        terminate: terminateWith(nodeClosed(node), () => void node.destroy())
      }
    if (upgraded.buffered === undefined) {
      yield* Effect.logWarning(
        "api: a tail's socket buffer cannot be observed on this server: only its frame queue is bounded"
      )
    }
    return upgraded
  })

/**
 * Succeeds once `buffered` is at most `bound` (at once when it is); fails with {@link SlowReader}
 * when it stays over for `deadline`. Unknown (`undefined`): at once.
 */
export const room = (
  buffered: Effect.Effect<number> | undefined,
  bound: number = SOCKET_BUFFER_BYTES,
  deadline: Duration.DurationInput = DRAIN_DEADLINE
): Effect.Effect<void, SlowReader> =>
  buffered === undefined ? Effect.void : Effect.flatMap(buffered, (n) =>
    n <= bound ? Effect.void : buffered.pipe(
      Effect.repeat({ schedule: drainPoll, until: (m) => m <= bound }),
      Effect.asVoid,
      Effect.timeoutFail({ duration: deadline, onTimeout: () => new SlowReader() })
    ))
