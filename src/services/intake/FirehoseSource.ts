/**
 * The firehose connection layer (SPEC §3.1): one WebSocket per intake stream, Jetstream JSON or the
 * relay's `subscribeRepos`, presented as an Effect `Stream` of decoded frames.
 *
 * - Every frame is decoded on arrival (`decodeJetstreamFrame` / `decodeRelayFrame`); a frame that
 *   fails validation is emitted as `Left(FrameError)`, in order, and the caller (intake) decides
 *   to quarantine and reconnect. The stream never skips a frame.
 * - Browser-style WebSockets (Bun's and Node's global) cannot pause the network, so frames land in
 *   a bounded buffer (frame count and bytes). When the consumer falls that far behind, the socket is
 *   closed and, after the frames already buffered, the stream fails with `SourceError("overflow")`:
 *   nothing is dropped silently, and the caller reconnects from its durable cursor (SPEC §3.3).
 * - The server closing the socket (cleanly or not) ends the stream with `SourceError("closed")`
 *   after the buffered frames. Failing to open within `connectTimeoutMs`, a refused upgrade or a
 *   rejected URL is `SourceError("connect")`.
 * - Closing the stream's scope (interrupting or finishing the consumer) closes the socket.
 *
 * The WebSocket constructor is `@effect/platform`'s `Socket.WebSocketConstructor` when the caller
 * provides one (e.g. `Socket.layerWebSocketConstructorGlobal`, or a `ws`-based one on runtimes
 * without a global WebSocket), else `globalThis.WebSocket` (Bun; Node ≥ 22).
 *
 * @since 0.1.0
 */
import * as Socket from "@effect/platform/Socket"
import { Chunk, Data, Deferred, Duration, Effect, Either, Exit, Mailbox, Option, type Scope, Stream } from "effect"
import {
  type DecodedFrame,
  decodeJetstreamFrame,
  type FrameContext,
  type FrameError,
  frameError,
  type JetstreamOptions,
  jetstreamUrl,
  optionsUpdate
} from "../../schemas/Jetstream.js"
import { isLoopbackHost } from "../../schemas/Net.js"
import { decodeRelayFrame, type RelayDecoded } from "../../schemas/RelayFrame.js"

/**
 * A connection-level failure. Carries only its kind: never a URL, a frame or a server message.
 *
 * - `connect`: the URL was rejected, or the socket did not open (refused, timed out);
 * - `closed`: the socket closed or errored after it was open;
 * - `overflow`: the consumer fell behind the bounded buffer; the socket was closed;
 * - `protocol`: the server sent something no frame decoder can look at (an unexpected data type);
 * - `idle`: no frame for `idleTimeoutMs`; the socket was closed (the caller reconnects at once).
 *
 * @since 0.1.0
 */
export class SourceError extends Data.TaggedError("SourceError")<{
  readonly kind: "connect" | "closed" | "overflow" | "protocol" | "idle"
}> {
  override get message(): string {
    return `firehose source: ${this.kind}`
  }
}

/** Decoded Jetstream frames, in arrival order. */
export type JetstreamItem = Either.Either<DecodedFrame, FrameError>
/** Decoded relay frames, in arrival order. */
export type RelayItem = Either.Either<RelayDecoded, FrameError>

/**
 * An open connection: `frames` (consume once), `send` (a text message; fails with `closed` when
 * the socket is not open) and `close` (closes the socket now; `frames` then ends with `closed` after
 * what was already buffered). The socket lives at most as long as the Scope it was opened in.
 *
 * @since 0.1.0
 */
export interface FirehoseConnection<A> {
  readonly frames: Stream.Stream<A, SourceError>
  readonly send: (text: string) => Effect.Effect<void, SourceError>
  readonly close: Effect.Effect<void>
}

/** A Jetstream connection can replace its filters mid-stream (`options_update`). */
export interface JetstreamConnection extends FirehoseConnection<JetstreamItem> {
  readonly updateOptions: (opts: JetstreamOptions) => Effect.Effect<void, SourceError>
}

/** Options common to both sources. */
export interface SourceOptions {
  /** the stream name, copied into every event */
  readonly stream: string
  /** the canonical relay URL, copied into every event */
  readonly relay: string
  /** per-frame byte limit (SPEC §3.2) */
  readonly maxBytes: number
  readonly connectTimeoutMs: number
  /** `ws:` URLs (loopback hosts only) are accepted only when this is true (insecure dev mode) */
  readonly allowInsecure: boolean
  /** bounded receive buffer, in frames (default 1024) */
  readonly bufferFrames?: number | undefined
  /** bounded receive buffer, in bytes of raw frames (default 16 MiB, at least `maxBytes`) */
  readonly bufferBytes?: number | undefined
  /**
   * An open connection that receives no frame for this long is closed (`idle`; the caller
   * reconnects from its cursor): a half-open TCP connection (the peer gone without a FIN, a NAT
   * entry dropped) is otherwise never noticed, as browser-style WebSockets cannot send pings.
   * Checked every `idleTimeoutMs`, so it fires between one and two periods of silence. Default 5
   * minutes; 0 = off.
   */
  readonly idleTimeoutMs?: number | undefined
}

export interface JetstreamSourceOptions extends SourceOptions {
  /** the Jetstream endpoint, e.g. `wss://jetstream2.us-east.bsky.network/subscribe` */
  readonly url: string
  /** `time_us` to resume from; `undefined` = live tail */
  readonly cursor: bigint | undefined
  readonly wantedCollections?: ReadonlyArray<string> | undefined
  readonly wantedDids?: ReadonlyArray<string> | undefined
}

export interface RelaySourceOptions extends SourceOptions {
  /** the relay or PDS host, e.g. `wss://bsky.network` */
  readonly url: string
  /** relay `seq` to resume from; `undefined` = live tail */
  readonly cursor: bigint | undefined
}

export const DEFAULT_BUFFER_FRAMES = 1024
export const DEFAULT_BUFFER_BYTES = 16 * 1024 * 1024
export const DEFAULT_IDLE_TIMEOUT_MS = 300_000

const connectError = new SourceError({ kind: "connect" })
const closedError = new SourceError({ kind: "closed" })
const overflowError = new SourceError({ kind: "overflow" })
const protocolError = new SourceError({ kind: "protocol" })
const idleError = new SourceError({ kind: "idle" })

// ---------------------------------------------------------------------------------------------
// URLs

/**
 * Checks a firehose endpoint: an absolute `wss:` URL with a host, no credentials, no fragment;
 * `ws:` only to a loopback host (`localhost`, 127/8, `[::1]`) and only when `allowInsecure`.
 *
 * @since 0.1.0
 */
export const checkSourceUrl = (raw: string, allowInsecure: boolean): Either.Either<URL, SourceError> => {
  if (!URL.canParse(raw)) return Either.left(connectError)
  const u = new URL(raw)
  if (u.hostname === "" || u.username !== "" || u.password !== "" || u.hash !== "" || raw.includes("#")) {
    return Either.left(connectError)
  }
  if (u.protocol === "wss:") return Either.right(u)
  if (u.protocol === "ws:" && allowInsecure && isLoopbackHost(u.hostname)) return Either.right(u)
  return Either.left(connectError)
}

/**
 * `<url>/xrpc/com.atproto.sync.subscribeRepos[?cursor=N]` (any query on `url` is dropped; a path is
 * kept, without its trailing slashes).
 *
 * @since 0.1.0
 */
export const relayUrl = (base: URL, opts: { readonly cursor?: bigint | undefined }): string => {
  let path = base.pathname
  while (path.endsWith("/")) path = path.slice(0, -1)
  const cursor = opts.cursor
  return `${base.protocol}//${base.host}${path}/xrpc/com.atproto.sync.subscribeRepos` +
    (cursor !== undefined && cursor >= 0n ? `?cursor=${cursor.toString()}` : "")
}

// ---------------------------------------------------------------------------------------------
// The socket

interface Buffered<A> {
  readonly item: A
  readonly size: number
}

interface SocketSpec<A> {
  readonly url: string
  readonly connectTimeoutMs: number
  readonly bufferFrames: number
  readonly bufferBytes: number
  /** 0 = off; see `SourceOptions.idleTimeoutMs` */
  readonly idleTimeoutMs: number
  /** sent right after open, before any frame is read */
  readonly hello: string | undefined
  readonly onText: (text: string) => A
  readonly onBinary: (bytes: Uint8Array) => A
}

const textDecoder = new TextDecoder("utf-8", { fatal: true })

/** A binary frame as text (Jetstream sends text; some proxies re-frame as binary). */
export const binaryAsText = (bytes: Uint8Array): string | undefined => {
  try {
    return textDecoder.decode(bytes)
  } catch {
    return undefined
  }
}

const OPEN = 1

const openSocket = <A>(spec: SocketSpec<A>): Effect.Effect<FirehoseConnection<A>, SourceError, Scope.Scope> =>
  Effect.gen(function*() {
    const injected = yield* Effect.serviceOption(Socket.WebSocketConstructor)
    const construct = Option.getOrUndefined(injected) ??
      (typeof globalThis.WebSocket === "function"
        ? (url: string) => new globalThis.WebSocket(url)
        : undefined)
    if (construct === undefined) return yield* Effect.fail(connectError)

    const mailbox = yield* Mailbox.make<Buffered<A>, SourceError>({
      capacity: spec.bufferFrames,
      strategy: "suspend"
    })
    const opened = yield* Deferred.make<void, SourceError>()
    let isOpen = false
    let finished = false
    let bufferedBytes = 0
    /** frames received so far (the idle watchdog compares it between two looks) */
    let received = 0

    const finish = (error: SourceError, ws: globalThis.WebSocket | undefined): void => {
      if (finished) return
      finished = true
      Deferred.unsafeDone(opened, Exit.fail(connectError))
      mailbox.unsafeDone(Exit.fail(error))
      if (ws !== undefined && ws.readyState <= OPEN) {
        try {
          ws.close(1000)
        } catch {
          // an already failing socket; nothing left to close
        }
      }
    }

    const ws = yield* Effect.acquireRelease(
      Effect.try({ try: () => construct(spec.url), catch: () => connectError }),
      (ws) =>
        Effect.sync(() => {
          ws.onopen = null
          ws.onmessage = null
          ws.onerror = null
          ws.onclose = null
          finish(closedError, ws)
        })
    )
    ws.binaryType = "arraybuffer"

    const push = (item: A, size: number): void => {
      if (finished) return
      if (bufferedBytes > 0 && bufferedBytes + size > spec.bufferBytes) return finish(overflowError, ws)
      if (!mailbox.unsafeOffer({ item, size })) return finish(overflowError, ws)
      bufferedBytes += size
    }

    ws.onopen = () => {
      isOpen = true
      Deferred.unsafeDone(opened, Exit.void)
    }
    ws.onmessage = (event: MessageEvent) => {
      received++
      const data: unknown = event.data
      if (typeof data === "string") {
        push(spec.onText(data), data.length)
      } else if (data instanceof ArrayBuffer) {
        push(spec.onBinary(new Uint8Array(data)), data.byteLength)
      } else if (ArrayBuffer.isView(data)) {
        push(spec.onBinary(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)), data.byteLength)
      } else {
        finish(protocolError, ws)
      }
    }
    ws.onerror = () => finish(isOpen ? closedError : connectError, ws)
    ws.onclose = () => finish(isOpen ? closedError : connectError, ws)

    yield* Deferred.await(opened).pipe(
      Effect.timeoutFail({ duration: Duration.millis(spec.connectTimeoutMs), onTimeout: () => connectError })
    )

    const send = (text: string): Effect.Effect<void, SourceError> =>
      Effect.suspend(() =>
        finished || ws.readyState !== OPEN ? Effect.fail(closedError) : Effect.try({
          try: () => ws.send(text),
          catch: () => closedError
        })
      )
    if (spec.hello !== undefined) yield* send(spec.hello)

    if (spec.idleTimeoutMs > 0) {
      // the idle watchdog: lives with the connection's scope; bounded by `finished`
      yield* Effect.forkScoped(
        Effect.gen(function*() {
          let seen = received
          while (!finished) {
            yield* Effect.sleep(Duration.millis(spec.idleTimeoutMs))
            if (finished) return
            if (received === seen) return finish(idleError, ws)
            seen = received
          }
        })
      )
    }

    const frames = Mailbox.toStream(mailbox).pipe(
      Stream.mapChunks((chunk) => {
        let total = 0
        const out = Chunk.map(chunk, (b) => {
          total += b.size
          return b.item
        })
        bufferedBytes -= total
        return out
      })
    )
    return { frames, send, close: Effect.sync(() => finish(closedError, ws)) }
  })

const bufferOf = (
  o: SourceOptions
): { readonly bufferFrames: number; readonly bufferBytes: number; readonly idleTimeoutMs: number } => ({
  bufferFrames: Math.max(1, o.bufferFrames ?? DEFAULT_BUFFER_FRAMES),
  bufferBytes: Math.max(o.maxBytes, o.bufferBytes ?? DEFAULT_BUFFER_BYTES),
  idleTimeoutMs: Math.max(0, o.idleTimeoutMs ?? DEFAULT_IDLE_TIMEOUT_MS)
})

// ---------------------------------------------------------------------------------------------
// Jetstream

/**
 * Opens a Jetstream subscription in the current Scope: connects to
 * `<url>?requireHello=true[&cursor=N]`, sends the `options_update` hello with the filters
 * (`wantedCollections`, `wantedDids`; never in the URL), and returns the connection once the hello
 * is sent. Jetstream sends nothing before the hello.
 *
 * @since 0.1.0
 */
export const openJetstream = Effect.fn("FirehoseSource.openJetstream")(function*(o: JetstreamSourceOptions) {
  const base = yield* checkSourceUrl(o.url, o.allowInsecure)
  const ctx: FrameContext = { stream: o.stream, relay: o.relay, maxBytes: o.maxBytes }
  const tooLarge: JetstreamItem = Either.left(frameError("too_large"))
  const notText: JetstreamItem = Either.left(frameError("json"))
  const conn = yield* openSocket<JetstreamItem>({
    url: jetstreamUrl(base.href, { cursor: o.cursor }),
    connectTimeoutMs: o.connectTimeoutMs,
    ...bufferOf(o),
    hello: optionsUpdate({ wantedCollections: o.wantedCollections, wantedDids: o.wantedDids }),
    onText: (text) => decodeJetstreamFrame(text, ctx),
    onBinary: (bytes) => {
      if (bytes.length > o.maxBytes) return tooLarge
      const text = binaryAsText(bytes)
      return text === undefined ? notText : decodeJetstreamFrame(text, ctx)
    }
  })
  const connection: JetstreamConnection = {
    ...conn,
    updateOptions: (opts) => conn.send(optionsUpdate(opts))
  }
  return connection
})

/**
 * The Jetstream subscription as a stream of decoded frames (see {@link openJetstream}). The socket
 * is opened when the stream starts and closed when its scope closes.
 *
 * @since 0.1.0
 */
export const connectJetstream = (o: JetstreamSourceOptions): Stream.Stream<JetstreamItem, SourceError> =>
  Stream.unwrapScoped(Effect.map(openJetstream(o), (c) => c.frames))

// ---------------------------------------------------------------------------------------------
// Relay

/**
 * Opens `<url>/xrpc/com.atproto.sync.subscribeRepos[?cursor=N]` in the current Scope. Text frames are
 * not part of the protocol and are emitted as `Left(shape)`.
 *
 * @since 0.1.0
 */
export const openRelay = Effect.fn("FirehoseSource.openRelay")(function*(o: RelaySourceOptions) {
  const base = yield* checkSourceUrl(o.url, o.allowInsecure)
  const ctx: FrameContext = { stream: o.stream, relay: o.relay, maxBytes: o.maxBytes }
  const textFrame: RelayItem = Either.left(frameError("shape"))
  return yield* openSocket<RelayItem>({
    url: relayUrl(base, { cursor: o.cursor }),
    connectTimeoutMs: o.connectTimeoutMs,
    ...bufferOf(o),
    hello: undefined,
    onText: () => textFrame,
    onBinary: (bytes) => decodeRelayFrame(bytes, ctx)
  })
})

/**
 * The relay subscription as a stream of decoded frames (see {@link openRelay}).
 *
 * @since 0.1.0
 */
export const connectRelay = (o: RelaySourceOptions): Stream.Stream<RelayItem, SourceError> =>
  Stream.unwrapScoped(Effect.map(openRelay(o), (c) => c.frames))
