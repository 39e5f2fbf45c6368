/**
 * Canonical JSON, the delivery payload body, and the deterministic ids derived from an event
 * (SPEC §3.5).
 *
 * Canonical JSON here means: object keys sorted recursively by UTF-16 code unit order (the default
 * order of `Array.prototype.sort`), no whitespace, strings escaped exactly as `JSON.stringify` escapes
 * them (well-formed: lone surrogates become `\uXXXX`), numbers formatted as `JSON.stringify` formats
 * them, a `bigint` (an integer outside ±(2^53 − 1) decoded from a record) as its exact decimal digits. The same value always gives the same bytes, so the body can be stored once, signed and sent
 * byte for byte, and hashed into ids.
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import { createHash } from "node:crypto"
import type { Operation, RecordEvent } from "../../schemas/RecordEvent.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { utf8Length } from "./References.js"

/** Bounds of a canonical JSON value (SPEC §3.5). */
export const CanonicalLimits = {
  /** containers nested deeper than this (the value itself is level 1) → payload_too_large */
  maxDepth: 64,
  /** own enumerable string keys of one object → payload_too_large */
  maxKeysPerObject: 4096,
  /** UTF-8 bytes of one key → payload_too_large */
  maxKeyBytes: 512,
  /** UTF-8 bytes of one string value → payload_too_large */
  maxStringBytes: 512 * 1024,
  /** UTF-8 bytes of the whole output → payload_too_large */
  maxBodyBytes: 512 * 1024
} as const

/**
 * `payload_too_large`: a size bound was hit (depth, keys per object, key length, string length, body).
 * `payload_invalid`: the value is not JSON data (non-finite number, undefined, function, symbol,
 * non-plain object, accessor property, array hole, cycle). A `bigint` is JSON data (exact digits).
 */
export type CanonicalError = "payload_too_large" | "payload_invalid"

class Writer {
  out = ""
  bytes = 0
  error: CanonicalError | undefined = undefined
  /** containers on the current path (a cycle is a container that contains itself) */
  readonly path = new Set<object>()

  fail(e: CanonicalError): false {
    this.error = e
    return false
  }

  /** Appends an already-encoded piece of JSON, counting its UTF-8 bytes. */
  push(piece: string, pieceBytes: number): boolean {
    this.bytes += pieceBytes
    if (this.bytes > CanonicalLimits.maxBodyBytes) return this.fail("payload_too_large")
    this.out += piece
    return true
  }

  string(s: string, maxBytes: number): boolean {
    // UTF-8 bytes ≥ UTF-16 code units: refuse a huge string before escaping it
    if (s.length > maxBytes || s.length > CanonicalLimits.maxBodyBytes) return this.fail("payload_too_large")
    const raw = utf8Length(s)
    if (raw > maxBytes) return this.fail("payload_too_large")
    const escaped = JSON.stringify(s)
    return this.push(escaped, escaped.length === s.length + 2 ? raw + 2 : utf8Length(escaped))
  }

  value(v: unknown, depth: number): boolean {
    switch (typeof v) {
      case "string":
        return this.string(v, CanonicalLimits.maxStringBytes)
      case "number": {
        if (!Number.isFinite(v)) return this.fail("payload_invalid")
        const s = JSON.stringify(v)
        return this.push(s, s.length)
      }
      case "boolean":
        return v ? this.push("true", 4) : this.push("false", 5)
      case "bigint": {
        // an integer outside ±(2^53 − 1) from a record: its exact decimal digits (JSON numbers have
        // no range; `JSON.stringify` would refuse it, a `number` would round it)
        const s = v.toString()
        return this.push(s, s.length)
      }
      case "object":
        break
      default:
        // undefined, function, symbol
        return this.fail("payload_invalid")
    }
    if (v === null) return this.push("null", 4)
    if (depth > CanonicalLimits.maxDepth) return this.fail("payload_too_large")
    if (this.path.has(v)) return this.fail("payload_invalid")
    if (Array.isArray(v)) {
      if (Object.getPrototypeOf(v) !== Array.prototype) return this.fail("payload_invalid")
      const arr: ReadonlyArray<unknown> = v
      const n = arr.length
      // every element takes at least one byte plus a comma: refuse a huge array up front
      if (n > CanonicalLimits.maxBodyBytes) return this.fail("payload_too_large")
      this.path.add(v)
      if (!this.push("[", 1)) return false
      for (let i = 0; i < n; i++) {
        if (i > 0 && !this.push(",", 1)) return false
        const d = Object.getOwnPropertyDescriptor(arr, i)
        // a hole or an accessor is not JSON data
        if (d === undefined || !("value" in d)) return this.fail("payload_invalid")
        if (!this.value(d.value, depth + 1)) return false
      }
      this.path.delete(v)
      return this.push("]", 1)
    }
    const proto: unknown = Object.getPrototypeOf(v)
    if (proto !== Object.prototype && proto !== null) return this.fail("payload_invalid")
    const keys = Object.keys(v)
    if (keys.length > CanonicalLimits.maxKeysPerObject) return this.fail("payload_too_large")
    keys.sort()
    this.path.add(v)
    if (!this.push("{", 1)) return false
    for (let i = 0; i < keys.length; i++) {
      const k = keys[i] as string
      const d = Object.getOwnPropertyDescriptor(v, k)
      if (d === undefined || !("value" in d)) return this.fail("payload_invalid")
      if (i > 0 && !this.push(",", 1)) return false
      if (!this.string(k, CanonicalLimits.maxKeyBytes)) return false
      if (!this.push(":", 1)) return false
      if (!this.value(d.value, depth + 1)) return false
    }
    this.path.delete(v)
    return this.push("}", 1)
  }
}

/**
 * Serializes JSON data canonically (see the module comment), within `CanonicalLimits`.
 *
 * Only own enumerable string-keyed DATA properties of plain objects (prototype `Object.prototype`
 * or `null`) and plain arrays are read; an accessor is never invoked (it makes the value invalid),
 * `toJSON` is never called. Unlike `JSON.stringify`, an `undefined` (or function/symbol) object
 * member is NOT silently dropped: it makes the value `payload_invalid` (atproto records never
 * contain them, and a silent drop would hide a bug in whatever built the value).
 *
 * @since 0.1.0
 */
export const canonicalJson = (value: unknown): Either.Either<string, CanonicalError> => {
  const w = new Writer()
  if (!w.value(value, 1)) return Either.left(w.error ?? "payload_invalid")
  return Either.right(w.out)
}

/**
 * Lowercase hex SHA-256 of the UTF-8 bytes of `s` (node:crypto; also available in Bun).
 *
 * @since 0.1.0
 */
export const sha256Hex = (s: string): string => createHash("sha256").update(s, "utf8").digest("hex")

/**
 * Canonical JSON of a flat object whose values are strings, finite numbers, booleans or null.
 * Infallible (a non-finite number would be written as `null`, as `JSON.stringify` does); equal to
 * `canonicalJson` of the same object whenever that succeeds. Used for ids so that computing an id
 * can never fail.
 */
const canonicalFlat = (o: Readonly<Record<string, string | number | boolean | null>>): string => {
  const keys = Object.keys(o).sort()
  let out = "{"
  for (let i = 0; i < keys.length; i++) {
    const k = keys[i] as string
    if (i > 0) out += ","
    out += JSON.stringify(k) + ":" + JSON.stringify(o[k] ?? null)
  }
  return out + "}"
}

/** What the ids hash: a record event's identity (or a test delivery's, {@link buildTestPayload}). */
type IdSource = Pick<RecordEvent, "relay" | "timeUs" | "rev" | "did" | "collection" | "rkey" | "cid"> & {
  readonly operation: string
}

const idFields = (e: IdSource): Record<string, string | number | null> => ({
  version: 1,
  relay: e.relay,
  time: e.timeUs,
  rev: e.rev,
  operation: e.operation,
  did: e.did,
  collection: e.collection,
  rkey: e.rkey,
  cid: e.cid ?? null
})

/**
 * The event id: `whe_v1_` + sha256 of the canonical JSON of
 * `{version: 1, relay, time, rev, operation, did, collection, rkey, cid | null}` (SPEC §3.5).
 * `time` is the source time in microseconds (`timeUs`); `relay` is taken as given (the event
 * producer canonicalizes the relay URL).
 *
 * @since 0.1.0
 */
export const eventId = (e: RecordEvent): string => eventIdOf(e)

const eventIdOf = (e: IdSource): string => "whe_v1_" + sha256Hex(canonicalFlat(idFields(e)))

/**
 * The delivery id: `whd_v1_` + sha256 of the event id's object plus `ownerDid` and `webhookRkey`
 * (SPEC §3.5). Deterministic, so a replayed event never duplicates a delivery.
 *
 * @since 0.1.0
 */
export const deliveryId = (e: RecordEvent, ownerDid: string, webhookRkey: string): string =>
  deliveryIdOf(e, ownerDid, webhookRkey)

const deliveryIdOf = (e: IdSource, ownerDid: string, webhookRkey: string): string => {
  const o = idFields(e)
  o["ownerDid"] = ownerDid
  o["webhookRkey"] = webhookRkey
  return "whd_v1_" + sha256Hex(canonicalFlat(o))
}

export interface SubscriptionFingerprintInput {
  readonly url: string
  /** the canonical scope AT-URI */
  readonly scope: string
  readonly backlinks: boolean
  /** `scope.backlinksOnly`; only `true` enters the hash (absent and false hash as before it existed) */
  readonly backlinksOnly?: boolean | undefined
  /** missing or empty = all operations */
  readonly events: ReadonlyArray<Operation> | undefined
  readonly enabled: boolean
  readonly secretId: string | undefined
  readonly hasInlineSecret: boolean
}

const ALL_OPERATIONS: ReadonlyArray<Operation> = ["create", "delete", "update"]

/**
 * The subscription fingerprint (SPEC §3.5): lowercase hex sha256 of the canonical JSON of
 * `{v: 1, url, scope, backlinks, events, enabled, secretId | null, hasInlineSecret}`, plus
 * `backlinksOnly: true` for such a scope (a webhook without it keeps the fingerprint it always had,
 * so an upgrade cancels no pending delivery; turning it on changes what is delivered, so it cancels).
 * Never includes a secret value. `events` is normalized to its meaning: deduplicated and sorted,
 * and missing, empty and all three operations are the same set (all), so a change that does not
 * change what is delivered does not cancel pending deliveries.
 *
 * @since 0.1.0
 */
export const subscriptionFingerprint = (s: SubscriptionFingerprintInput): string => {
  const ops = s.events === undefined || s.events.length === 0 ? ALL_OPERATIONS : s.events
  const events = ALL_OPERATIONS.filter((op) => ops.includes(op)).join(",")
  const fields: Record<string, string | number | boolean | null> = {
    v: 1,
    url: s.url,
    scope: s.scope,
    backlinks: s.backlinks,
    events,
    enabled: s.enabled,
    secretId: s.secretId ?? null,
    hasInlineSecret: s.hasInlineSecret
  }
  if (s.backlinksOnly === true) fields["backlinksOnly"] = true
  return sha256Hex(canonicalFlat(fields))
}

/**
 * The payload `timestamp`: ISO-8601 UTC with millisecond precision
 * (`YYYY-MM-DDTHH:MM:SS.mmmZ`) of the source time, microseconds truncated. Pure formatting of the
 * given number (no clock is read). `undefined` unless `timeUs` is a non-negative safe integer
 * (the largest, 2^53 - 1 µs, is in year 2255, so `toISOString` never throws and keeps its
 * 24-character form).
 *
 * @since 0.1.0
 */
export const formatTimestamp = (timeUs: number): string | undefined => {
  if (!Number.isSafeInteger(timeUs) || timeUs < 0) return undefined
  return new Date(Math.floor(timeUs / 1000)).toISOString()
}

export interface Payload {
  readonly eventId: string
  /** the exact bytes to store, sign and send */
  readonly body: string
}

/**
 * The delivery payload body (SPEC §3.5), canonical JSON of
 * `{cid?, collection, did, event, id, record?, rkey, timestamp}`:
 * - `record` is absent on delete (whatever is passed); on create/update a missing (`undefined`)
 *   record is `payload_invalid` (frame validation guarantees one);
 * - `cid` is absent when the event has none;
 * - `record` must already be sanitized (a wh record without its `secret`);
 * - a `timeUs` that cannot be formatted is `payload_invalid`.
 *
 * @since 0.1.0
 */
export const buildPayload = (
  event: RecordEvent,
  record: unknown
): Either.Either<Payload, CanonicalError> => {
  const timestamp = formatTimestamp(event.timeUs)
  if (timestamp === undefined) return Either.left("payload_invalid")
  const id = eventId(event)
  const body: Record<string, unknown> = {
    collection: event.collection,
    did: event.did,
    event: event.operation,
    id,
    rkey: event.rkey,
    timestamp
  }
  if (event.cid !== undefined) body["cid"] = event.cid
  if (event.operation !== "delete") {
    if (record === undefined) return Either.left("payload_invalid")
    body["record"] = record
  }
  return Either.map(canonicalJson(body), (json): Payload => ({ eventId: id, body: json }))
}

/** The relay a test delivery's ids name (no relay produced it). */
export const TEST_RELAY = "firehook:test"

export interface TestEvent {
  readonly ownerDid: string
  readonly rkey: string
  /** the send time in microseconds (the payload's `timestamp`) */
  readonly timeUs: number
  /** a random value that makes each test delivery's ids new */
  readonly nonce: string
}

/**
 * An owner's test delivery (SPEC §8.5 `dev.firehook.webhook.test`): the canonical body of a real
 * delivery with `event: "test"` and `record: null`, about the webhook record itself:
 * `{collection: "place.wisp.v2.wh", did: <owner>, event: "test", id, record: null, rkey: <webhook rkey>,
 * timestamp}` (no `cid`). Its ids follow the formulas of {@link eventId} / {@link deliveryId} with
 * `relay` {@link TEST_RELAY}, `operation` `test` and the nonce as `rev`, so every test is a new
 * delivery and never collides with a record event's.
 */
export const buildTestPayload = (
  t: TestEvent
): Either.Either<Payload & { readonly deliveryId: string }, CanonicalError> => {
  const timestamp = formatTimestamp(t.timeUs)
  if (timestamp === undefined) return Either.left("payload_invalid")
  const source: IdSource = {
    relay: TEST_RELAY,
    timeUs: t.timeUs,
    rev: t.nonce,
    operation: "test",
    did: t.ownerDid,
    collection: WH_COLLECTION,
    rkey: t.rkey,
    cid: undefined
  }
  const id = eventIdOf(source)
  const body = { collection: WH_COLLECTION, did: t.ownerDid, event: "test", id, record: null, rkey: t.rkey, timestamp }
  return Either.map(canonicalJson(body), (json) => ({
    eventId: id,
    body: json,
    deliveryId: deliveryIdOf(source, t.ownerDid, t.rkey)
  }))
}
