/**
 * `dev.firehook.webhook.subscribeDeliveries` (SPEC §8.5): the owner's live tail over a WebSocket.
 *
 * The pipeline (`Xrpc.ts`) has verified the token of the upgrade request (its `Authorization`
 * header, `lxm` = this NSID) and applied the rate limits before the handler runs. The handler
 * opens a connection on the {@link Tail} hub (the fifth of a DID is refused with 429
 * `TooManyConnections`, before the upgrade), upgrades, and writes one frame per terminal outcome
 * of the caller's deliveries until the connection has lived 24 h (closed with 1000 `lifetime`),
 * the hub closes (API shutdown) or the client goes away.
 *
 * Frames are JSON text messages, each an object of the lexicon's message union with its `$type`:
 * `{"$type":"dev.firehook.webhook.subscribeDeliveries#outcome","id",…}` and
 * `{"$type":"dev.firehook.webhook.subscribeDeliveries#info","name":"DeliveriesDropped","dropped":n}`
 * (encoded by the contract's Schema). firehook does not use atproto's binary DAG-CBOR framing: the
 * stream carries no CIDs or bytes, and a JSON reader is all a client needs. The stream is one way:
 * a message from the client closes the connection.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import * as Socket from "@effect/platform/Socket"
import { Duration, Effect, Schema } from "effect"
import * as WebhookLexicon from "../../schemas/WebhookLexicon.js"
import { subscription } from "./Methods.js"
import { type Frame, MAX_LIFETIME, pump, Tail } from "./Tail.js"
import { invalidRequest, XrpcFailure } from "./XrpcError.js"

/** After the closing frame, the client has this long to close its side. */
const CLOSE_GRACE = Duration.seconds(10)

const encodeFrame = Schema.encodeUnknown(WebhookLexicon.subscribeDeliveries.output)

export class ClientMessage extends Schema.TaggedError<ClientMessage>()("ClientMessage", {}) {}

export const subscribeDeliveries = subscription(
  WebhookLexicon.subscribeDeliveries,
  ({ caller }) =>
    Effect.gen(function*() {
      const tail = yield* Tail
      const connection = yield* tail.connect(caller).pipe(
        Effect.catchTag("TooManyConnections", () =>
          Effect.fail(
            new XrpcFailure({
              status: 429,
              error: "TooManyConnections",
              message: "at most 4 live tails per DID"
            })
          ))
      )
      const request = yield* HttpServerRequest.HttpServerRequest
      const socket = yield* request.upgrade.pipe(
        Effect.mapError(() => invalidRequest("a WebSocket upgrade is required"))
      )
      const write = yield* socket.writer
      const send = (frames: ReadonlyArray<Frame>) =>
        Effect.forEach(frames, (frame) =>
          encodeFrame(frame).pipe(
            Effect.flatMap((json) => write(JSON.stringify(json))),
            // a frame the lexicon refuses is a bug: skipped, logged without its values
            Effect.catchTag("ParseError", () => Effect.logError("api: a tail frame does not match its lexicon"))
          ), { discard: true })
      const serve = pump(connection, send, MAX_LIFETIME).pipe(
        Effect.zipRight(write(new Socket.CloseEvent(1000, "lifetime"))),
        Effect.zipRight(Effect.sleep(CLOSE_GRACE))
      )
      // the socket ends when the client closes it (or sends anything: the stream is one way)
      const read = socket.runRaw(() => Effect.fail(new ClientMessage()))
      yield* Effect.raceFirst(read, serve).pipe(
        Effect.catchAll((e) => Effect.logDebug("api: tail closed").pipe(Effect.annotateLogs({ reason: e._tag })))
      )
      return HttpServerResponse.empty()
    })
)

/** The live tail, as the API serves it. */
export const TAIL_METHODS = [subscribeDeliveries] as const
