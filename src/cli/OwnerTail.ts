/**
 * `firehook hooks tail`: the owner's live delivery outcomes, `dev.firehook.webhook.subscribeDeliveries`
 * (SPEC §8.5), over a WebSocket whose upgrade carries a fresh service token (`Authorization`).
 *
 * Frames are accepted in both encodings an XRPC subscription may use: binary atproto event-stream
 * frames (a DAG-CBOR header `{op: 1, t: "#outcome"}` then the body; `{op: -1}` then `{error,
 * message}`), and JSON text frames carrying `$type`. Each is decoded with the lexicon's Schema;
 * unknown message types are skipped (as the event-stream spec says), invalid ones counted. The
 * service's free text (an error frame's, `#info`'s `message`) has its control characters replaced,
 * so a frame written as it is (`--json`) holds none.
 *
 * Bounded: the socket's messages wait in a dropping queue of `TAIL_BUFFER` (a reader slower than
 * the service loses frames and says how many; the service's close is queued after the frames
 * received before it, so all of those are printed first); the connection is opened within the call timeout
 * and ended after `MAX_TAIL_DURATION` (the service closes it after 24 h); the socket is closed when
 * the scope closes (Ctrl-C / SIGTERM interrupt the program).
 *
 * @since 0.1.0
 */
import { Deferred, Duration, Effect, Either, Option, Queue, Redacted, Schema, Stream } from "effect"
import { splitFrame } from "../schemas/RelayFrame.js"
import * as WebhookLexicon from "../schemas/WebhookLexicon.js"
import type { HooksFailed } from "./HookRecords.js"
import { ApiFailed, type OwnerApiShape, printable } from "./OwnerApi.js"

export const NSID = WebhookLexicon.subscribeDeliveries.nsid
/** frames waiting to be printed; more are dropped (and counted) */
export const TAIL_BUFFER = 4096
/** the service ends a subscription after 24 h; the client gives up after this */
export const MAX_TAIL_DURATION = Duration.hours(25)
/** a frame larger than this is not decoded */
export const MAX_FRAME_BYTES = 64 * 1024

export type TailFrame = Schema.Schema.Type<typeof WebhookLexicon.subscribeDeliveries.output>

export type Decoded =
  | { readonly _tag: "Frame"; readonly frame: TailFrame }
  | { readonly _tag: "Error"; readonly error: string; readonly message: string }
  | { readonly _tag: "Skip" }
  | { readonly _tag: "Invalid" }

const SKIP: Decoded = { _tag: "Skip" }
const INVALID: Decoded = { _tag: "Invalid" }
const KNOWN: ReadonlySet<string> = new Set([`${NSID}#outcome`, `${NSID}#info`])
const decodeMessage = Schema.decodeUnknownOption(WebhookLexicon.subscribeDeliveries.output)

const isObject = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/**
 * The frame with its free text (`#info`'s `message`) printable, as an error frame's is: its other
 * strings are tokens, record keys, datetimes and literals, so no control character (C0, DEL, C1)
 * is left for `hooks tail --json` to write to the terminal.
 */
const printableFrame = (frame: TailFrame): TailFrame =>
  "message" in frame && frame.message !== undefined ? { ...frame, message: printable(frame.message) } : frame

const typed = (type: string, body: unknown): Decoded => {
  if (!KNOWN.has(type)) return SKIP
  if (!isObject(body)) return INVALID
  return Option.match(decodeMessage({ ...body, $type: type }), {
    onNone: () => INVALID,
    onSome: (frame) => ({ _tag: "Frame", frame: printableFrame(frame) })
  })
}

const fromCbor = (bytes: Uint8Array): Decoded => {
  const split = splitFrame(bytes)
  if (Either.isLeft(split)) return INVALID
  const { body, header } = split.right
  if (header["op"] === -1) {
    return {
      _tag: "Error",
      error: typeof body["error"] === "string" ? printable(body["error"], 64) : "Error",
      message: typeof body["message"] === "string" ? printable(body["message"]) : ""
    }
  }
  const t = header["t"]
  if (header["op"] !== 1 || typeof t !== "string") return INVALID
  return typed(t.startsWith("#") ? `${NSID}${t}` : t, body)
}

const fromJson = (text: string): Decoded => {
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch {
    return INVALID
  }
  if (!isObject(value)) return INVALID
  if (typeof value["error"] === "string" && value["$type"] === undefined) {
    return {
      _tag: "Error",
      error: printable(value["error"], 64),
      message: typeof value["message"] === "string" ? printable(value["message"]) : ""
    }
  }
  const t = value["$type"]
  return typeof t === "string" ? typed(t.startsWith("#") ? `${NSID}${t}` : t, value) : INVALID
}

/** One WebSocket message as a decoded frame. */
export const decodeFrame = (data: unknown): Decoded => {
  if (typeof data === "string") return data.length > MAX_FRAME_BYTES ? INVALID : fromJson(data)
  const bytes = data instanceof ArrayBuffer
    ? new Uint8Array(data)
    : ArrayBuffer.isView(data)
    ? new Uint8Array(data.buffer, data.byteOffset, data.byteLength)
    : undefined
  return bytes === undefined || bytes.byteLength > MAX_FRAME_BYTES ? INVALID : fromCbor(bytes)
}

// ---------------------------------------------------------------------------------------------
// The connection

/** How a subscription ended when the service closed it. */
export interface TailEnd {
  readonly code: number
  readonly reason: string
}

export interface TailHandlers {
  readonly onFrame: (frame: TailFrame) => Effect.Effect<void>
  /** frames this client dropped (the printer was slower than the socket), or invalid ones skipped */
  readonly onLost: (what: "dropped" | "invalid", count: number) => Effect.Effect<void>
}

type Message = { readonly _tag: "Data"; readonly data: unknown } | { readonly _tag: "Closed" }

const closedMessage: Message = { _tag: "Closed" }

/**
 * Subscribe until the service closes the connection (then its code and reason), an error frame
 * arrives (`ApiFailed`), or the scope is interrupted.
 */
export const tail = (
  api: OwnerApiShape,
  handlers: TailHandlers
): Effect.Effect<TailEnd, ApiFailed | HooksFailed> =>
  Effect.scoped(Effect.gen(function*() {
    const bearer = yield* api.token(NSID)
    const url = `${api.serviceUrl.replace(/^http/, "ws")}/xrpc/${NSID}`
    // one place more than the frames it holds: the close, queued after them (never dropped)
    const queue = yield* Queue.dropping<Message>(TAIL_BUFFER + 1)
    const opened = yield* Deferred.make<void>()
    const closed = yield* Deferred.make<TailEnd & { readonly opened: boolean }>()
    let dropped = 0
    let wasOpen = false
    yield* Effect.acquireRelease(
      Effect.sync(() => {
        const ws = new globalThis.WebSocket(url, { headers: { authorization: `Bearer ${Redacted.value(bearer)}` } })
        ws.binaryType = "arraybuffer"
        ws.onopen = () => {
          wasOpen = true
          Deferred.unsafeDone(opened, Effect.void)
        }
        ws.onmessage = (e) => {
          const held = Option.getOrElse(queue.unsafeSize(), () => TAIL_BUFFER)
          if (held >= TAIL_BUFFER || !queue.unsafeOffer({ _tag: "Data", data: e.data })) dropped++
        }
        ws.onclose = (e) => {
          queue.unsafeOffer(closedMessage)
          Deferred.unsafeDone(closed, Effect.succeed({ code: e.code, reason: printable(e.reason), opened: wasOpen }))
        }
        return ws
      }),
      (ws) => Effect.sync(() => ws.close())
    )
    const host = new URL(api.serviceUrl).host
    const connected = yield* Effect.raceFirst(
      Effect.as(Deferred.await(opened), true),
      Effect.as(Deferred.await(closed), false)
    ).pipe(
      Effect.timeoutFail({
        duration: api.timeout,
        onTimeout: () =>
          new ApiFailed({
            error: "Timeout",
            status: undefined,
            text: `the subscription at ${host} did not open in time`
          })
      })
    )
    if (!connected) {
      // the upgrade was refused: a plain GET (with another token) says why, in XRPC terms
      const why = yield* api.probe(NSID)
      return yield* Effect.fail(Option.getOrElse(why, () =>
        new ApiFailed({
          error: "Unreachable",
          status: undefined,
          text: `could not open the subscription at ${host}`
        })))
    }
    let reported = 0
    // one consumer: the frames received before the close are all handled, then the close
    const next: Effect.Effect<Message> = Queue.take(queue)
    const handle = (m: Message) =>
      Effect.gen(function*() {
        if (m._tag !== "Data") return
        const d = decodeFrame(m.data)
        if (d._tag === "Frame") yield* handlers.onFrame(d.frame)
        else if (d._tag === "Error") {
          return yield* new ApiFailed({
            error: d.error,
            status: undefined,
            text: d.message.length > 0 ? `${d.error}: ${d.message}` : d.error
          })
        } else if (d._tag === "Invalid") {
          yield* handlers.onLost("invalid", 1)
        }
        if (dropped > reported) {
          const n = dropped - reported
          reported = dropped
          yield* handlers.onLost("dropped", n)
        }
      })
    yield* Stream.repeatEffectOption(
      Effect.flatMap(next, (m) => (m._tag === "Closed" ? Effect.fail(Option.none()) : Effect.succeed(m)))
    ).pipe(
      Stream.runForEach(handle),
      Effect.timeoutFail({
        duration: MAX_TAIL_DURATION,
        onTimeout: () =>
          new ApiFailed({ error: "Timeout", status: undefined, text: "the subscription was not closed within 25 h" })
      })
    )
    const end = yield* Deferred.await(closed)
    return { code: end.code, reason: end.reason }
  }))
