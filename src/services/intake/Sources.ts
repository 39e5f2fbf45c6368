/**
 * Sources: what the wire decoders of `FirehoseSource` (Jetstream, the relay firehose) yield, as the
 * source items a session reads, and the canonical relay URL.
 */
import { Effect, Either, Option, type Scope, Stream } from "effect"
import type * as FirehoseSource from "./FirehoseSource.js"
import type { SourceItem } from "./StreamModel.js"

export const jetstreamItem = (item: FirehoseSource.JetstreamItem): SourceItem =>
  Either.isLeft(item)
    ? { _tag: "poison", reason: item.left.reason }
    : { _tag: "events", events: item.right.event === undefined ? [] : [item.right.event], cursor: item.right.cursor }

export const relayItem = (item: FirehoseSource.RelayItem): Option.Option<SourceItem> => {
  if (Either.isLeft(item)) return Option.some({ _tag: "poison", reason: item.left.reason })
  const r = item.right
  switch (r.kind) {
    case "events":
      return Option.some({ _tag: "events", events: r.events, cursor: r.seq })
    case "error":
      return Option.some({ _tag: "relay_error", error: r.error })
    default:
      return Option.none()
  }
}

/** A stream that opens a connection in its scope and emits `opened` before the frames. */
export const withOpened = <R>(
  open: Effect.Effect<
    Stream.Stream<SourceItem, FirehoseSource.SourceError>,
    FirehoseSource.SourceError,
    R | Scope.Scope
  >
): Stream.Stream<SourceItem, FirehoseSource.SourceError, Exclude<R, Scope.Scope>> =>
  Stream.unwrapScoped(
    Effect.map(open, (frames) => Stream.concat(Stream.succeed<SourceItem>({ _tag: "opened" }), frames))
  )

/** The canonical form of a relay URL (used in cursor keys and event ids). */
export const canonicalRelay = (url: string): string => {
  if (!URL.canParse(url)) return url
  const u = new URL(url)
  return `${u.protocol}//${u.host}${u.pathname.replace(/\/+$/, "")}`
}
