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

export class SlowReader extends Data.TaggedError("SlowReader")<{}> {}

export interface TailSocket {
  readonly socket: Socket.Socket
  /** The bytes the runtime holds for the socket, not yet taken by the client; `undefined`: unknown. */
  readonly buffered: Effect.Effect<number> | undefined
}

interface BunServer {
  readonly upgrade: (request: unknown, options: unknown) => unknown
}

interface BufferedAmount {
  readonly getBufferedAmount: () => number
}

const isObject = (u: unknown): u is object => typeof u === "object" && u !== null

const isBunServer = (u: unknown): u is BunServer => isObject(u) && typeof Reflect.get(u, "upgrade") === "function"

const isDeferred = (u: unknown): u is Deferred.Deferred<unknown, unknown> => isObject(u) && Deferred.DeferredTypeId in u

const isBunWebSocket = (u: unknown): u is BufferedAmount =>
  isObject(u) && typeof Reflect.get(u, "getBufferedAmount") === "function"

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
    return { socket, buffered: isBunWebSocket(raw) ? Effect.sync(() => raw.getBufferedAmount()) : undefined }
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
  Effect.async<never, Socket.SocketError>((resume) => {
    const closed = () =>
      resume(
        Effect.fail(new Socket.SocketGenericError({ reason: "Open", cause: "the socket closed before it opened" }))
      )
    if (socket.destroyed) return closed()
    socket.once("close", closed)
    return Effect.sync(() => void socket.off("close", closed))
  })

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
    const upgraded: TailSocket = isBunServer(server)
      ? yield* upgradeBun(request, server)
      : node === undefined
      ? { socket: yield* request.upgrade, buffered: undefined }
      : { socket: endingWith(yield* request.upgrade, node), buffered: Effect.sync(() => node.writableLength) }
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
