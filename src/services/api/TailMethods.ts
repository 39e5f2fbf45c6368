/**
 * `dev.firehook.webhook.subscribeDeliveries` (SPEC §8.5): the owner's live tail over a WebSocket.
 *
 * The pipeline (`Xrpc.ts`) has verified the token of the upgrade request (its `Authorization`
 * header, `lxm` = this NSID) and applied the rate limits before the handler runs. The handler
 * opens a connection on the {@link Tail} hub (the fifth of a DID, or any past the process's
 * 1,000, is refused with 429 `TooManyConnections`, before the upgrade), upgrades, and writes one frame per terminal outcome
 * of the caller's deliveries until the connection has lived 24 h (closed with 1000 `lifetime`),
 * the service shuts down (closed with 1001 `shutdown`, going away: a reader reconnects to another
 * replica or after the restart) or the client goes away.
 *
 * A slow reader: frames are handed to the socket only while the runtime holds at most
 * `TailSocket.SOCKET_BUFFER_BYTES` for it; meanwhile they wait in the hub's bounded queue, which
 * drops and counts (the `#info` frame). A socket that stays over that bound for
 * `TailSocket.DRAIN_DEADLINE` (30 s) is closed with 1008 `slow reader`.
 *
 * Frames are JSON text messages, each an object of the lexicon's message union with its `$type`:
 * `{"$type":"dev.firehook.webhook.subscribeDeliveries#outcome","id",…}` and
 * `{"$type":"dev.firehook.webhook.subscribeDeliveries#info","name":"DeliveriesDropped","dropped":n}`
 * (encoded by the contract's Schema). firehook does not use atproto's binary DAG-CBOR framing: the
 * stream carries no CIDs or bytes, and a JSON reader is all a client needs. The stream is one way:
 * a message from the client closes the connection (1008 `the stream is one way`; its first message
 * only: later ones are ignored while the close completes), and a client that sends more than
 * `TailSocket.MAX_INBOUND_BYTES` in messages has its socket ended where the server shows it (Node).
 *
 * After each close frame the client has a grace to close its side ({@link CLOSE_GRACE}; at shutdown
 * {@link SHUTDOWN_GRACE}), then its socket is ended (`TailSocket.terminate`): a client that never
 * answers does not hold the socket (or, on Node, the listener's close) for `ws`'s own 30 s.
 */
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Socket from "@effect/platform/Socket"
import { Duration, Effect, Option, Schema } from "effect"
import * as WebhookLexicon from "../../schemas/WebhookLexicon.js"
import { ApiLog } from "./ApiLog.js"
import { subscription } from "./Methods.js"
import { type Frame, INFO_TYPE, infoFrame, MAX_LIFETIME, pump, Tail } from "./Tail.js"
import * as TailSocket from "./TailSocket.js"
import { invalidRequest, XrpcFailure } from "./XrpcError.js"

/** After the closing frame, the client has this long to close its side; then its socket is ended. */
export const CLOSE_GRACE = Duration.seconds(10)
/** At shutdown, after the 1001, the client has this long to close its side; then its socket is ended. */
export const SHUTDOWN_GRACE = Duration.seconds(1)

const encodeFrame = Schema.encodeUnknown(WebhookLexicon.subscribeDeliveries.output)

const FRAME_REFUSED = "api: a tail frame does not match its lexicon"

/** A frame the lexicon refused: an error, at most once a minute under the API's limiter. */
const frameRefused = Effect.flatMap(Effect.serviceOption(ApiLog), (log) => {
  const write = (suppressed: number) => Effect.logError(FRAME_REFUSED).pipe(Effect.annotateLogs({ suppressed }))
  return Option.isSome(log) ? log.value.run(FRAME_REFUSED, write) : write(0)
})

export class ClientMessage extends Schema.TaggedError<ClientMessage>()("ClientMessage", {}) {}

/**
 * How the service closes its tails at shutdown (the listener's scope interrupts each handler, or the
 * hub closes under it): 1001, going away, which clients take as a normal end. Without it the
 * platform's socket closed them with 1011 (an internal error) on the interruption.
 */
export const SHUTDOWN_CLOSE = { code: 1001, reason: "shutdown" } as const

/** How the service closes a tail whose client sent a message. */
export const CLIENT_MESSAGE_CLOSE = { code: 1008, reason: "the stream is one way" } as const

export const subscribeDeliveries = subscription(
  WebhookLexicon.subscribeDeliveries,
  ({ caller }) =>
    Effect.gen(function*() {
      const tail = yield* Tail
      const connection = yield* tail.connect(caller).pipe(
        Effect.catchTag("TooManyConnections", (e) =>
          Effect.fail(
            new XrpcFailure({
              status: 429,
              error: "TooManyConnections",
              message: e.limit === "did" ? "at most 4 live tails per DID" : "too many live tails on this server"
            })
          ))
      )
      const { buffered, socket, terminate } = yield* TailSocket.upgrade.pipe(
        Effect.mapError(() => invalidRequest("a WebSocket upgrade is required"))
      )
      const write = yield* socket.writer
      const writeFrame = (frame: Frame) =>
        Effect.flatMap(encodeFrame(frame), (json) => write(JSON.stringify(json))).pipe(
          Effect.as(true),
          Effect.catchTag("ParseError", () => Effect.as(frameRefused, false))
        )
      // A frame the lexicon refuses is a bug: skipped, logged without its values (at most once a
      // minute), and counted as dropped, so that the owner learns of it from an `#info`: the one
      // that ends the batch (the hub puts it last), or one of its own after the batch.
      const send = (frames: ReadonlyArray<Frame>) =>
        Effect.gen(function*() {
          let refused = 0
          for (const frame of frames) {
            if (frame.$type === INFO_TYPE) {
              yield* writeFrame(refused === 0 ? frame : infoFrame(frame.dropped + refused))
              refused = 0
            } else if (!(yield* writeFrame(frame))) {
              refused++
            }
          }
          if (refused > 0) yield* writeFrame(infoFrame(refused))
        })
      // set by the first close the service writes: a client's later messages start nothing
      let closing = false
      // the service's close, then the client's turn to close its side (or its socket is ended)
      const closeWith = (code: number, reason: string) =>
        Effect.suspend(() => {
          closing = true
          return write(new Socket.CloseEvent(code, reason)).pipe(Effect.zipRight(terminate(CLOSE_GRACE)))
        })
      const serve = pump(connection, send, MAX_LIFETIME, TailSocket.room(buffered)).pipe(
        Effect.zipRight(closeWith(1000, "lifetime")),
        Effect.catchTag("SlowReader", (e) =>
          closeWith(TailSocket.SLOW_READER_CLOSE.code, TailSocket.SLOW_READER_CLOSE.reason).pipe(
            Effect.zipRight(Effect.fail(e))
          ))
      )
      // the socket ends when the client closes it, or sends anything: the stream is one way (1008,
      // a policy violation, said in its reason; not 1011, which would blame the server). The
      // platform runs each message's effect in a fiber of its own: only the first message has one.
      const read = socket.runRaw(() => {
        if (closing) {
          return
        }
        closing = true
        return closeWith(CLIENT_MESSAGE_CLOSE.code, CLIENT_MESSAGE_CLOSE.reason).pipe(
          Effect.zipRight(Effect.fail(new ClientMessage()))
        )
      })
      yield* Effect.raceFirst(read, serve).pipe(
        Effect.catchAll((e) =>
          Effect.logDebug("api: tail closed").pipe(Effect.annotateLogs({ reason: e._tag }))
        ),
        // interrupted: the shutdown (a socket the client closed ends `read`, not in an interruption);
        // the close frame is written at once, the runtime's later close of the socket is a no-op; a
        // client that does not answer it within SHUTDOWN_GRACE has its socket ended (Node's listener
        // waits for every upgraded socket: for `ws`'s own 30 s close timer, before)
        Effect.onInterrupt(() =>
          Effect.ignore(write(new Socket.CloseEvent(SHUTDOWN_CLOSE.code, SHUTDOWN_CLOSE.reason))).pipe(
            Effect.zipRight(terminate(SHUTDOWN_GRACE))
          )
        )
      )
      return HttpServerResponse.empty()
    })
)

/** The live tail, as the API serves it. */
export const TAIL_METHODS = [subscribeDeliveries] as const
