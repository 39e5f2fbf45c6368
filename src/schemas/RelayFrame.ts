/**
 * Relay firehose frames (`com.atproto.sync.subscribeRepos`, SPEC §3.1, §3.2): one binary WebSocket
 * message = two concatenated DAG-CBOR values, a header and a body.
 *
 * - `{op: 1, t: "#commit" | "#identity" | "#account" | "#sync" | "#info"}` then the message body;
 * - `{op: -1}` then `{error, message?}` (`FutureCursor`, `ConsumerTooSlow`, …); the server closes next.
 *
 * A `#commit` carries `ops: [{action, path: "<collection>/<rkey>", cid}]` and `blocks`, a CAR slice
 * holding the records of its creates and updates. Records are turned into the JSON data model, the
 * way Jetstream presents them: CID links → `{"$link": "<cid>"}`, bytes → `{"$bytes": "<base64>"}`
 * (unpadded, as atproto JSON writes them), so both sources feed the matcher the same values.
 * Integers outside ±(2^53 − 1) (valid DAG-CBOR) become `bigint`, as on Jetstream.
 *
 * Like Jetstream, nothing here is verified cryptographically (signatures are optional and off by
 * default, SPEC §3.1); block CIDs are trusted as sent.
 *
 * @since 0.1.0
 */
import * as Car from "@atcute/car"
import * as Cbor from "@atcute/cbor"
import * as Cborg from "cborg"
import { Either } from "effect"
import { isAtprotoDidSyntax, isNsidStrict, isRkey } from "./AtUri.js"
import { type FrameContext, type FrameError, frameError, type FrameErrorReason } from "./Jetstream.js"
import { MAX_CID_LENGTH, type RecordEvent, type StreamEvent } from "./RecordEvent.js"
import { isTid } from "./Tid.js"

/**
 * One accepted relay frame.
 *
 * - `events`: a sequenced message; `seq` is the cursor. `#commit` → one `RecordEvent` per op;
 *   `#identity`/`#account` → one `IdentityEvent` (an account's `active` when it is a boolean);
 *   `#sync` and `tooBig` commits → no events (the frame is acknowledged so the cursor can move
 *   past it).
 * - `info`: an `#info` message (`OutdatedCursor`); not sequenced.
 * - `error`: an error frame (`op: -1`); the server closes the connection after it.
 * - `ignored`: a well-formed message type this decoder does not know (the event-stream spec says
 *   to ignore unknown types); not sequenced.
 *
 * @since 0.1.0
 */
export type RelayDecoded =
  | { readonly kind: "events"; readonly seq: bigint; readonly events: ReadonlyArray<StreamEvent> }
  | { readonly kind: "info"; readonly name: string }
  | { readonly kind: "error"; readonly error: string }
  | { readonly kind: "ignored" }

const fail = (reason: FrameErrorReason): Either.Either<never, FrameError> => Either.left(frameError(reason))

const isObject = (u: unknown): u is Record<string, unknown> =>
  typeof u === "object" && u !== null && !Array.isArray(u) && !(u instanceof Cbor.CidLinkWrapper) &&
  !(u instanceof Cbor.BytesWrapper)

/**
 * An event-stream frame's two DAG-CBOR objects (atproto's subscription framing): the header, then
 * the body. `json`: the bytes do not decode; `shape`: either is not an object.
 *
 * @since 0.1.0
 */
export const splitFrame = (
  bytes: Uint8Array
): Either.Either<
  { readonly header: Record<string, unknown>; readonly body: Record<string, unknown> },
  "json" | "shape"
> => {
  let header: unknown
  let body: unknown
  try {
    const [h, rest] = Cbor.decodeFirst(bytes)
    header = h
    body = Cbor.decode(rest)
  } catch {
    return Either.left("json")
  }
  return isObject(header) && isObject(body) ? Either.right({ header, body }) : Either.left("shape")
}

/** A relay message or error name: `[A-Za-z0-9_.-]{1,128}` (e.g. `FutureCursor`, `OutdatedCursor`). */
const isNameToken = (u: unknown): u is string => {
  if (typeof u !== "string") return false
  const len = u.length
  if (len < 1 || len > 128) return false
  for (let i = 0; i < len; i++) {
    const c = u.charCodeAt(i)
    const ok = (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 95 || c === 46 ||
      c === 45
    if (!ok) return false
  }
  return true
}

/** A message type: `#` then a name token. */
const isTypeToken = (u: unknown): u is string =>
  typeof u === "string" && u.length >= 2 && u.charCodeAt(0) === 35 && isNameToken(u.slice(1))

const isSeq = (u: unknown): u is number => typeof u === "number" && Number.isSafeInteger(u) && u >= 0

// ---------------------------------------------------------------------------------------------
// RFC 3339 time → microseconds

const digitsAt = (s: string, at: number, n: number): number => {
  let v = 0
  for (let i = at; i < at + n; i++) {
    const d = s.charCodeAt(i) - 48
    if (d < 0 || d > 9) return -1
    v = v * 10 + d
  }
  return v
}

const daysInMonth = (y: number, m: number): number =>
  m === 2 ? ((y % 4 === 0 && y % 100 !== 0) || y % 400 === 0 ? 29 : 28) : m === 4 || m === 6 || m === 9 ||
      m === 11
    ? 30
    : 31

/**
 * Parses an RFC 3339 datetime `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)` into microseconds since
 * the Unix epoch (fraction digits beyond the sixth are truncated). `undefined` when malformed, out
 * of range, before 1970 or not representable exactly.
 *
 * @since 0.1.0
 */
export const parseTimeUs = (s: string): number | undefined => {
  const len = s.length
  if (len < 20 || len > 64) return undefined
  const y = digitsAt(s, 0, 4)
  const mo = digitsAt(s, 5, 2)
  const d = digitsAt(s, 8, 2)
  const h = digitsAt(s, 11, 2)
  const mi = digitsAt(s, 14, 2)
  const se = digitsAt(s, 17, 2)
  const t = s.charCodeAt(10)
  if (
    s.charCodeAt(4) !== 45 || s.charCodeAt(7) !== 45 || (t !== 84 && t !== 116) || s.charCodeAt(13) !== 58 ||
    s.charCodeAt(16) !== 58
  ) return undefined
  if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > daysInMonth(y, mo) || h < 0 || h > 23 || mi < 0 || mi > 59) {
    return undefined
  }
  if (se < 0 || se > 60) return undefined
  let i = 19
  let micros = 0
  if (s.charCodeAt(i) === 46 /* . */) {
    i++
    const start = i
    while (i < len) {
      const c = s.charCodeAt(i) - 48
      if (c < 0 || c > 9) break
      if (i - start < 6) micros = micros * 10 + c
      i++
    }
    const n = i - start
    if (n === 0) return undefined
    for (let k = n; k < 6; k++) micros *= 10
  }
  let offsetMin = 0
  const z = s.charCodeAt(i)
  if (z === 90 || z === 122) {
    i++
  } else if (z === 43 || z === 45) {
    const oh = digitsAt(s, i + 1, 2)
    const om = digitsAt(s, i + 4, 2)
    if (oh < 0 || oh > 23 || om < 0 || om > 59 || s.charCodeAt(i + 3) !== 58) return undefined
    offsetMin = (z === 43 ? 1 : -1) * (oh * 60 + om)
    i += 6
  } else {
    return undefined
  }
  if (i !== len) return undefined
  const ms = Date.UTC(y, mo - 1, d, h, mi, se) - offsetMin * 60_000
  const us = ms * 1000 + micros
  return Number.isSafeInteger(us) && us > 0 ? us : undefined
}

// ---------------------------------------------------------------------------------------------
// DAG-CBOR values → the atproto JSON data model (in place)

type Container = Record<string, unknown> | Array<unknown>

/** A CID link or bytes wrapper replaced by its JSON form, or `undefined` when `v` is neither. */
const jsonForm = (v: unknown): unknown => {
  if (v instanceof Cbor.CidLinkWrapper) return { $link: v.$link }
  if (v instanceof Cbor.BytesWrapper) return { $bytes: v.$bytes }
  return undefined
}

/**
 * Rewrites a freshly decoded DAG-CBOR value in place so it is plain JSON data: CID links become
 * `{$link}` objects and byte strings `{$bytes}` objects. Iterative (an explicit stack), so deeply
 * nested records cannot exhaust the call stack. The value must be owned by the caller (it is, right
 * after decoding). Returns whether the value holds a `bigint` (an integer outside ±(2^53 − 1)).
 *
 * @since 0.1.0
 */
export const toJsonDataModel = (root: Container): boolean => {
  let wide = false
  const stack: Array<Container> = [root]
  for (let node = stack.pop(); node !== undefined; node = stack.pop()) {
    if (Array.isArray(node)) {
      for (let i = 0; i < node.length; i++) {
        const v = node[i]
        if (typeof v !== "object" || v === null) {
          if (typeof v === "bigint") wide = true
          continue
        }
        const j = jsonForm(v)
        if (j !== undefined) node[i] = j
        else stack.push(v as Container)
      }
    } else {
      const keys = Object.keys(node)
      for (let i = 0; i < keys.length; i++) {
        const k = keys[i] as string
        const v = node[k]
        if (typeof v !== "object" || v === null) {
          if (typeof v === "bigint") wide = true
          continue
        }
        const j = jsonForm(v)
        if (j !== undefined) {
          Object.defineProperty(node, k, { value: j, enumerable: true, writable: true, configurable: true })
        } else {
          stack.push(v as Container)
        }
      }
    }
  }
  return wide
}

// ---------------------------------------------------------------------------------------------
// CAR blocks

/** A CID's bytes as a map key (one char per byte). */
const cidKey = (cid: Uint8Array): string => {
  let key = ""
  for (let i = 0; i < cid.length; i++) key += String.fromCharCode(cid[i] as number)
  return key
}

/**
 * Every block of a CAR slice by its CID (the first block of a CID wins, as a scan from the start
 * found it), or `undefined` when it does not parse. A map, so that finding each op's record is
 * O(1): a scan per op made a commit with many ops quadratic (measured: 30,000 ops in a 4.8 MB
 * frame, 3.3 s of a blocked event loop; a relay frame may be 8 MiB).
 */
const readBlocks = (car: Uint8Array): ReadonlyMap<string, Uint8Array> | undefined => {
  try {
    const out = new Map<string, Uint8Array>()
    for (const entry of Car.fromUint8Array(car)) {
      const key = cidKey(entry.cid.bytes)
      if (!out.has(key)) out.set(key, entry.bytes)
    }
    return out
  } catch {
    return undefined
  }
}

/** A DAG-CBOR CID link's tag-42 content: 0x00, then CIDv1 dag-cbor/raw sha2-256 (as @atcute/cid accepts). */
const isCidContent = (u: unknown): u is Uint8Array =>
  u instanceof Uint8Array && u.length === 37 && u[0] === 0x00 && u[1] === 0x01 &&
  (u[2] === 0x71 || u[2] === 0x55) && u[3] === 0x12 && u[4] === 0x20

/** cborg's options for a record block: the DAG-CBOR rules its tokenizer checks. */
const WIDE_OPTIONS: Cborg.DecodeOptions = {
  allowIndefinite: false,
  allowUndefined: false,
  allowNaN: false,
  allowInfinity: false,
  allowBigInt: true,
  strict: true
}

/**
 * A container still being filled by {@link decodeWideRecord}: an array with `left` items to come,
 * a map with `left` entries to come (`key`: the entry's key once read), or a tag-42 CID link
 * awaiting its content.
 */
type Open =
  | { readonly kind: "array"; readonly value: Array<unknown>; left: number }
  | { readonly kind: "map"; readonly value: Record<string, unknown>; left: number; key: string | undefined }
  | { readonly kind: "link" }

/**
 * Decodes a record block under the DAG-CBOR rules (strict minimal encoding, no indefinite lengths,
 * no undefined / NaN / ±Infinity, string map keys only, no duplicate keys, tag 42 only, nothing
 * after the value): integers outside ±(2^53 − 1) become `bigint`, CID links `CidLinkWrapper`s,
 * byte strings `BytesWrapper`s, maps plain objects whose keys are own data properties (a
 * `__proto__` key too): the shapes `@atcute/cbor` gives. `undefined` when it does not decode.
 *
 * cborg's tokenizer reads the tokens and checks the encoding rules; the value is built here with
 * an explicit stack of open containers, because cborg's own `decode` recurses (a record nested
 * about 3,500 levels deep overflowed the call stack, and its frame was poison). Each token is at
 * least one byte, so the loop ends within the block's length.
 */
const decodeWideRecord = (bytes: Uint8Array): unknown => {
  try {
    // a plain view (not a Buffer, whose `slice` shares memory), as cborg's `decode` reads it
    const plain = new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)
    const tokens = new Cborg.Tokenizer(plain, WIDE_OPTIONS)
    const open: Array<Open> = []
    while (!tokens.done()) {
      const token = tokens.next()
      const type = token.type
      let value: unknown
      if (Cborg.Type.equals(type, Cborg.Type.array) || Cborg.Type.equals(type, Cborg.Type.map)) {
        const isArray = Cborg.Type.equals(type, Cborg.Type.array)
        value = isArray ? [] : {}
        const left = token.value as number
        if (left > 0) {
          open.push(
            isArray
              ? { kind: "array", value: value as Array<unknown>, left }
              : { kind: "map", value: value as Record<string, unknown>, left, key: undefined }
          )
          continue
        }
      } else if (Cborg.Type.equals(type, Cborg.Type.tag)) {
        if (token.value !== 42) return undefined
        open.push({ kind: "link" })
        continue
      } else if (type.terminal && !Cborg.Type.equals(type, Cborg.Type.break)) {
        value = token.value
      } else {
        return undefined
      }
      // `value` is complete: put it into the innermost open container, closing each one it fills
      for (;;) {
        const top = open.at(-1)
        if (top === undefined) return tokens.done() ? value : undefined
        if (top.kind === "link") {
          if (!isCidContent(value)) return undefined
          open.pop()
          value = new Cbor.CidLinkWrapper(value.slice(1))
          continue
        }
        const item = value instanceof Uint8Array ? new Cbor.BytesWrapper(value) : value
        if (top.kind === "array") {
          top.value.push(item)
        } else if (top.key === undefined) {
          if (typeof value !== "string" || Object.hasOwn(top.value, value)) return undefined
          top.key = value
          break
        } else {
          Object.defineProperty(top.value, top.key, {
            value: item,
            enumerable: true,
            writable: true,
            configurable: true
          })
          top.key = undefined
        }
        top.left -= 1
        if (top.left > 0) break
        open.pop()
        value = top.value
      }
    }
    return undefined
  } catch {
    return undefined
  }
}

/**
 * Decodes a record block into a JSON-model plain object, or `undefined`.
 *
 * The fast path is `@atcute/cbor`, which refuses integers outside ±(2^53 − 1); those are valid
 * DAG-CBOR (and anyone can write such a record), so a block it refuses is decoded again with cborg
 * ({@link decodeWideRecord}) and kept only when that finds a `bigint` in it. Any other block
 * `@atcute/cbor` refuses stays refused.
 */
const decodeRecord = (bytes: Uint8Array): Record<string, unknown> | undefined => {
  let value: unknown
  try {
    value = Cbor.decode(bytes)
  } catch {
    value = decodeWideRecord(bytes)
    if (!isObject(value) || !toJsonDataModel(value)) return undefined
    return value
  }
  if (!isObject(value)) return undefined
  toJsonDataModel(value)
  return value
}

// ---------------------------------------------------------------------------------------------
// Frames

const decodeCommit = (
  body: Record<string, unknown>,
  seq: number,
  timeUs: number,
  ctx: FrameContext
): Either.Either<RelayDecoded, FrameError> => {
  const did = body["repo"]
  if (typeof did !== "string" || !isAtprotoDidSyntax(did)) return fail("did")
  const rev = body["rev"]
  if (typeof rev !== "string" || !isTid(rev)) return fail("rev")
  const seqBig = BigInt(seq)
  // `tooBig` (deprecated): the records are not in `blocks`; acknowledge, nothing to match.
  if (body["tooBig"] === true) return Either.right({ kind: "events", seq: seqBig, events: [] })
  const ops = body["ops"]
  if (!Array.isArray(ops)) return fail("shape")
  const cursor = String(seq)
  let blocks: ReadonlyMap<string, Uint8Array> | undefined
  // each block is decoded once per frame: a commit's ops may name one block any number of times
  // (identical records share a CID), and their events share its record (read only), so the work and
  // memory of a frame stay within its bytes however its ops reuse blocks
  const decoded = new Map<string, unknown>()
  const events: Array<RecordEvent> = []
  for (let i = 0; i < ops.length; i++) {
    const op: unknown = ops[i]
    if (!isObject(op)) return fail("shape")
    const action = op["action"]
    if (action !== "create" && action !== "update" && action !== "delete") return fail("operation")
    const path = op["path"]
    if (typeof path !== "string") return fail("collection")
    const slash = path.indexOf("/")
    const collection = slash < 0 ? path : path.slice(0, slash)
    if (!isNsidStrict(collection)) return fail("collection")
    const rkey = slash < 0 ? "" : path.slice(slash + 1)
    if (!isRkey(rkey)) return fail("rkey")
    let cid: string | undefined = undefined
    let record: unknown = undefined
    if (action !== "delete") {
      const link = op["cid"]
      if (!(link instanceof Cbor.CidLinkWrapper)) return fail("cid")
      cid = link.$link
      if (cid.length < 1 || cid.length > MAX_CID_LENGTH) return fail("cid")
      if (blocks === undefined) {
        const car = body["blocks"]
        if (!(car instanceof Cbor.BytesWrapper)) return fail("record")
        blocks = readBlocks(car.buf)
        if (blocks === undefined) return fail("record")
      }
      const key = cidKey(link.bytes)
      record = decoded.get(key)
      if (record === undefined) {
        const block = blocks.get(key)
        if (block === undefined) return fail("record")
        record = decodeRecord(block)
        if (record === undefined) return fail("record")
        decoded.set(key, record)
      }
    }
    events.push({
      kind: "commit",
      did,
      collection,
      rkey,
      operation: action,
      rev,
      cid,
      record,
      timeUs,
      stream: ctx.stream,
      relay: ctx.relay,
      cursor
    })
  }
  return Either.right({ kind: "events", seq: seqBig, events })
}

/**
 * Decodes and validates one `subscribeRepos` frame (SPEC §3.2). The frame must be ≤ `maxBytes`,
 * consist of exactly a header and a body, and every sequenced message must carry a valid `seq` and
 * `time` and a canonical DID; commits also a TID `rev`, and per op a known action, a valid
 * `collection/rkey` path, and for creates/updates a CID link whose block is in `blocks` and decodes
 * to an object. One bad op rejects the whole frame (a commit is atomic).
 *
 * @since 0.1.0
 */
export const decodeRelayFrame = (
  bytes: Uint8Array,
  ctx: FrameContext
): Either.Either<RelayDecoded, FrameError> => {
  if (bytes.length > ctx.maxBytes) return fail("too_large")
  const split = splitFrame(bytes)
  if (Either.isLeft(split)) return fail(split.left)
  const { body, header } = split.right
  const op = header["op"]
  if (op === -1) {
    const error = body["error"]
    return isNameToken(error) ? Either.right({ kind: "error", error }) : fail("shape")
  }
  if (op !== 1) return fail("kind")
  const t = header["t"]
  if (!isTypeToken(t)) return fail("kind")
  if (t === "#info") {
    const name = body["name"]
    return isNameToken(name) ? Either.right({ kind: "info", name }) : fail("shape")
  }
  if (t !== "#commit" && t !== "#identity" && t !== "#account" && t !== "#sync") {
    return Either.right({ kind: "ignored" })
  }
  const seq = body["seq"]
  if (!isSeq(seq)) return fail("time")
  const time = body["time"]
  const timeUs = typeof time === "string" ? parseTimeUs(time) : undefined
  if (timeUs === undefined) return fail("time")
  if (t === "#commit") return decodeCommit(body, seq, timeUs, ctx)
  const did = body["did"]
  if (typeof did !== "string" || !isAtprotoDidSyntax(did)) return fail("did")
  const common = { did, timeUs, stream: ctx.stream, relay: ctx.relay, cursor: String(seq) }
  if (t === "#sync") {
    // A repo state reset (Sync 1.1: the repo's state is the one at `rev`; its earlier commits may
    // never be seen): nothing to match, but a known owner's registrations are reconciled (a `sync`
    // event: the owner's reconciliation request, like an `#account` event)
    const rev = body["rev"]
    if (typeof rev !== "string" || !isTid(rev)) return fail("rev")
    return Either.right({ kind: "events", seq: BigInt(seq), events: [{ kind: "sync", ...common }] })
  }
  if (t === "#identity") {
    return Either.right({ kind: "events", seq: BigInt(seq), events: [{ kind: "identity", ...common }] })
  }
  // `#account`: only `active` is read, and only a boolean is taken; anything else leaves it
  // undefined (never a poison frame: the body is not part of the frame's validity)
  const active = body["active"]
  return Either.right({
    kind: "events",
    seq: BigInt(seq),
    events: [{ kind: "account", ...common, active: typeof active === "boolean" ? active : undefined }]
  })
}
