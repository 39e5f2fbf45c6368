/**
 * Jetstream v1 (`/subscribe`) JSON frames (SPEC §3.1, §3.2): decoding and validation of one frame,
 * the connection URL and the `options_update` hello message.
 *
 * Frame validation runs on every frame of the whole-network `backlink` stream (≥ 20k frames/s of
 * headroom is the target), so it is a hand-written check over the parsed JSON rather than an Effect
 * Schema: one `JSON.parse`, a few property reads, the grammar scans of `AtUri`/`Tid`, no extra
 * allocation except the event itself.
 *
 * Wire format (reference/atproto.md §1.1):
 * ```json
 * {"did":"did:plc:…","time_us":1725911162329308,"kind":"commit",
 *  "commit":{"rev":"3l3qo2vutsw2b","operation":"create","collection":"app.bsky.feed.like",
 *            "rkey":"3l3qo2vuowo2b","record":{…},"cid":"bafyrei…"}}
 * {"did":"…","time_us":…,"kind":"identity","identity":{…}}
 * {"did":"…","time_us":…,"kind":"account","account":{…}}
 * ```
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import { isAtprotoDidSyntax, isNsidStrict, isRkey } from "./AtUri.js"
import { MAX_CID_LENGTH, type Operation, type RecordEvent, type StreamEvent } from "./RecordEvent.js"
import { isTid } from "./Tid.js"

/**
 * Why a frame was rejected (SPEC §3.2). Never carries frame bytes, DIDs or URLs, so it can be logged
 * and stored as is.
 *
 * - `too_large`: the frame is over the configured byte limit (checked before decoding);
 * - `json`: the frame does not decode (not JSON on Jetstream; not DAG-CBOR / truncated on the relay);
 * - `shape`: it decodes but is not the expected envelope (not an object, missing body, bad types);
 * - `did`: not a canonical DID (handles are rejected);
 * - `time`: the cursor or time is missing or invalid (`time_us`, relay `seq` or `time`);
 * - `kind`: the event kind / message type is missing or malformed;
 * - `rev`, `operation`, `collection`, `rkey`, `record`, `cid`: the commit field broke its rule.
 *
 * @since 0.1.0
 */
export type FrameErrorReason =
  | "too_large"
  | "json"
  | "shape"
  | "did"
  | "time"
  | "kind"
  | "rev"
  | "operation"
  | "collection"
  | "rkey"
  | "record"
  | "cid"

/** @since 0.1.0 */
export interface FrameError {
  readonly reason: FrameErrorReason
}

/**
 * One accepted Jetstream frame. `cursor` is the frame's `time_us` (the resume cursor).
 * `event` is `undefined` when the frame is acknowledged but carries nothing to match: a well-formed
 * kind this decoder does not know (forward compatibility; Jetstream v1 only sends the three below).
 *
 * @since 0.1.0
 */
export interface DecodedFrame {
  readonly cursor: bigint
  readonly event: StreamEvent | undefined
}

/** @since 0.1.0 */
export interface FrameContext {
  /** the intake stream name (`registry`, `direct`, `backlink`, …) */
  readonly stream: string
  /** the canonical relay URL the events are attributed to */
  readonly relay: string
  /** frames whose UTF-8 (or binary) size is over this are rejected with `too_large` */
  readonly maxBytes: number
}

// Pre-built errors: frames are rejected by reason only, so the objects can be shared.
const errors: { readonly [K in FrameErrorReason]: FrameError } = {
  too_large: { reason: "too_large" },
  json: { reason: "json" },
  shape: { reason: "shape" },
  did: { reason: "did" },
  time: { reason: "time" },
  kind: { reason: "kind" },
  rev: { reason: "rev" },
  operation: { reason: "operation" },
  collection: { reason: "collection" },
  rkey: { reason: "rkey" },
  record: { reason: "record" },
  cid: { reason: "cid" }
}

/** @since 0.1.0 */
export const frameError = (reason: FrameErrorReason): FrameError => errors[reason]

const fail = (reason: FrameErrorReason): Either.Either<never, FrameError> => Either.left(errors[reason])

/**
 * UTF-8 byte length of `s` is greater than `max`. Cheap bounds first: every UTF-16 code unit is
 * 1–3 UTF-8 bytes (a surrogate pair, 2 units, is 4 bytes), so only frames in the ambiguous band are
 * measured exactly.
 *
 * @since 0.1.0
 */
export const utf8LengthExceeds = (s: string, max: number): boolean => {
  const len = s.length
  if (len > max) return true
  if (len * 3 <= max) return false
  let bytes = 0
  for (let i = 0; i < len; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x80) bytes += 1
    else if (c < 0x800) bytes += 2
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < len) {
      const d = s.charCodeAt(i + 1)
      if (d >= 0xdc00 && d <= 0xdfff) {
        bytes += 4
        i++
      } else {
        bytes += 3
      }
    } else {
      bytes += 3
    }
    if (bytes > max) return true
  }
  return false
}

/** A non-null, non-array object (anything `JSON.parse` makes is otherwise plain). */
const isObject = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/** A Jetstream kind token: 1–32 chars of `[a-z]` (v1 sends `commit`, `identity`, `account`). */
const isKindToken = (s: string): boolean => {
  const len = s.length
  if (len < 1 || len > 32) return false
  for (let i = 0; i < len; i++) {
    const c = s.charCodeAt(i)
    if (c < 97 || c > 122) return false
  }
  return true
}

/**
 * `text` has a run of ≥ 17 digits, or of 16 digits starting with `9`: the only spellings of an
 * integer outside ±(2^53 − 1) = ±9007199254740991 (without an exponent). A cheap precheck, so the
 * reviver below runs only on the rare frames that may need it (`time_us`, 16 digits starting with
 * `1`, does not trigger it).
 */
const UNSAFE_INTEGER_RUN = /9[0-9]{15}|[0-9]{17}/
const mayHoldUnsafeInteger = (text: string): boolean => UNSAFE_INTEGER_RUN.test(text)

/** The parse context a `JSON.parse` reviver receives (JSON.parse source text access). */
interface ReviverContext {
  readonly source?: string | undefined
}

/** A plain decimal integer literal: `-?[0-9]+` (no fraction, no exponent). */
const isIntegerLiteral = (s: string): boolean => {
  const len = s.length
  let i = s.charCodeAt(0) === 45 /* - */ ? 1 : 0
  if (i >= len) return false
  for (; i < len; i++) {
    const c = s.charCodeAt(i)
    if (c < 48 || c > 57) return false
  }
  return true
}

/**
 * A `JSON.parse` reviver: an integer literal outside ±(2^53 − 1), which `JSON.parse` would round,
 * becomes the exact `bigint` of its source text (as the relay decoder gives it), so the delivered
 * body keeps its digits. Everything else is returned as parsed.
 */
const exactIntegers = (_key: string, value: unknown, context?: ReviverContext): unknown => {
  if (typeof value !== "number" || Number.isSafeInteger(value) || !Number.isInteger(value)) return value
  const source = context?.source
  return source !== undefined && isIntegerLiteral(source) ? BigInt(source) : value
}

/**
 * The frame's JSON, integers outside ±(2^53 − 1) exact where it may hold any (the reviver). The
 * engine walks a reviver recursively, so a record a few thousand levels deep overflows the stack
 * there although it is valid JSON: it is then read without the reviver (its integers as
 * `JSON.parse` reads them; such a record is far past the payload's depth bound, SPEC §3.5, and is
 * never delivered). Before, a long digit run anywhere in such a frame (a string will do) made it a
 * poison frame that held its stream for good (the audit of 6 December 2026). Left: not JSON.
 */
const parseFrameJson = (text: string): Either.Either<unknown, "json"> => {
  if (mayHoldUnsafeInteger(text)) {
    try {
      return Either.right(JSON.parse(text, exactIntegers))
    } catch {
      // not JSON, or too deep for the reviver: read once more without it
    }
  }
  try {
    return Either.right(JSON.parse(text))
  } catch {
    return Either.left("json")
  }
}

const isOperation = (u: unknown): u is Operation => u === "create" || u === "update" || u === "delete"

/**
 * Decodes and validates one Jetstream JSON frame (SPEC §3.2). An integer in the record outside
 * ±(2^53 − 1) is kept exact as a `bigint` (as on the relay), not rounded. Order of checks (the first failure
 * wins): size, JSON, envelope object, `did`, `time_us` (a positive safe integer), `kind`, then for
 * commits `commit` object, `rev` (TID), `operation`, `collection`, `rkey`, and for create/update a
 * plain-object `record` and an optional `cid` of 1–512 chars.
 *
 * A delete carries neither `record` nor `cid`; if a server sends them anyway they are dropped.
 * `identity` and `account` frames become `IdentityEvent`s; of their bodies only `account.active` is
 * read (a boolean, else undefined: a malformed account body is not a poison frame). Other
 * well-formed kinds are acknowledged with `event: undefined`; a missing or malformed kind is an error.
 *
 * @since 0.1.0
 */
export const decodeJetstreamFrame = (
  text: string,
  ctx: FrameContext
): Either.Either<DecodedFrame, FrameError> => {
  if (utf8LengthExceeds(text, ctx.maxBytes)) return fail("too_large")
  const parsed = parseFrameJson(text)
  if (Either.isLeft(parsed)) return fail("json")
  const json = parsed.right
  if (!isObject(json)) return fail("shape")
  const did = json["did"]
  if (typeof did !== "string" || !isAtprotoDidSyntax(did)) return fail("did")
  const timeUs = json["time_us"]
  if (typeof timeUs !== "number" || !Number.isSafeInteger(timeUs) || timeUs <= 0) return fail("time")
  const kind = json["kind"]
  if (typeof kind !== "string" || !isKindToken(kind)) return fail("kind")
  const cursor = BigInt(timeUs)
  const cursorText = String(timeUs)

  if (kind === "commit") {
    const commit = json["commit"]
    if (!isObject(commit)) return fail("shape")
    const rev = commit["rev"]
    if (typeof rev !== "string" || !isTid(rev)) return fail("rev")
    const operation = commit["operation"]
    if (!isOperation(operation)) return fail("operation")
    const collection = commit["collection"]
    if (typeof collection !== "string" || !isNsidStrict(collection)) return fail("collection")
    const rkey = commit["rkey"]
    if (typeof rkey !== "string" || !isRkey(rkey)) return fail("rkey")
    let record: unknown = undefined
    let cid: string | undefined = undefined
    if (operation !== "delete") {
      record = commit["record"]
      if (!isObject(record)) return fail("record")
      const c = commit["cid"]
      if (c !== undefined) {
        if (typeof c !== "string" || c.length < 1 || c.length > MAX_CID_LENGTH) return fail("cid")
        cid = c
      }
    }
    const event: RecordEvent = {
      kind: "commit",
      did,
      collection,
      rkey,
      operation,
      rev,
      cid,
      record,
      timeUs,
      stream: ctx.stream,
      relay: ctx.relay,
      cursor: cursorText
    }
    return Either.right({ cursor, event })
  }
  if (kind === "identity") {
    return Either.right({
      cursor,
      event: { kind, did, timeUs, stream: ctx.stream, relay: ctx.relay, cursor: cursorText }
    })
  }
  if (kind === "account") {
    // only `account.active` is read, and only a boolean is taken; anything else leaves it undefined
    // (never a poison frame: the body is not part of the frame's validity)
    const account = json["account"]
    const active = isObject(account) && typeof account["active"] === "boolean" ? account["active"] : undefined
    return Either.right({
      cursor,
      event: { kind, did, active, timeUs, stream: ctx.stream, relay: ctx.relay, cursor: cursorText }
    })
  }
  return Either.right({ cursor, event: undefined })
}

// ---------------------------------------------------------------------------------------------
// Connection URL and the hello message

/**
 * The Jetstream connection URL: `base` without any query or fragment, then
 * `?requireHello=true[&cursor=N]`. Filters never go in the URL (SPEC §3.1): they are sent in the
 * `options_update` hello, so a stream can carry Jetstream's full 10,000 `wantedDids`.
 * A negative cursor is left out (live tail).
 *
 * @since 0.1.0
 */
export const jetstreamUrl = (base: string, opts: { readonly cursor?: bigint | undefined }): string => {
  let end = base.length
  const q = base.indexOf("?")
  if (q >= 0) end = q
  const h = base.indexOf("#")
  if (h >= 0 && h < end) end = h
  const cursor = opts.cursor
  return base.slice(0, end) + "?requireHello=true" +
    (cursor !== undefined && cursor >= 0n ? `&cursor=${cursor.toString()}` : "")
}

/** @since 0.1.0 */
export interface JetstreamOptions {
  readonly wantedCollections?: ReadonlyArray<string> | undefined
  readonly wantedDids?: ReadonlyArray<string> | undefined
  /** Jetstream drops events over this size: lossy, so intake leaves it unset (0 = no limit). */
  readonly maxMessageSizeBytes?: number | undefined
}

/**
 * The `options_update` message:
 * `{"type":"options_update","payload":{"wantedCollections":[…],"wantedDids":[…],"maxMessageSizeBytes":N}}`.
 * Fields left undefined are omitted; Jetstream reads an omitted or empty list as "no filter", and
 * every update replaces the whole filter set.
 *
 * @since 0.1.0
 */
export const optionsUpdate = (opts: JetstreamOptions): string => {
  const payload: {
    wantedCollections?: ReadonlyArray<string>
    wantedDids?: ReadonlyArray<string>
    maxMessageSizeBytes?: number
  } = {}
  if (opts.wantedCollections !== undefined) payload.wantedCollections = opts.wantedCollections
  if (opts.wantedDids !== undefined) payload.wantedDids = opts.wantedDids
  if (opts.maxMessageSizeBytes !== undefined) payload.maxMessageSizeBytes = opts.maxMessageSizeBytes
  return JSON.stringify({ type: "options_update", payload })
}

/**
 * The largest `options_update` message Jetstream accepts, in bytes (10 MB; shared/reference
 * atproto §1.2): over it the update is invalid and Jetstream closes the connection.
 *
 * @since 0.1.0
 */
export const OPTIONS_UPDATE_MAX_BYTES = 10_000_000

/**
 * Whether an `options_update` message ({@link optionsUpdate}) is over
 * {@link OPTIONS_UPDATE_MAX_BYTES} (UTF-8): such a message must not be sent.
 *
 * @since 0.1.0
 */
export const optionsUpdateTooLarge = (message: string): boolean => utf8LengthExceeds(message, OPTIONS_UPDATE_MAX_BYTES)
