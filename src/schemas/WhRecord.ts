/**
 * The webhook record `place.wisp.v2.wh` (SPEC §1): validation into a clean copy.
 *
 * Untrusted input rules:
 * - the record and `scope` must be plain objects (prototype `Object.prototype` or `null`);
 * - only OWN DATA properties are read (`Object.getOwnPropertyDescriptor` + `"value" in desc`); a
 *   getter is never invoked and an inherited field is never seen;
 * - an accessor property on a known field (required or optional) makes that field invalid
 *   (error kind of that field); accessors on unknown fields are ignored;
 * - unknown fields are dropped.
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import { parseScopeUri, type ScopeUri } from "./AtUri.js"
import type { Cidr } from "./Net.js"
import { validateWebhookUrl } from "./WebhookUrl.js"

export const WH_COLLECTION = "place.wisp.v2.wh"
export const WH_SCOPE_TYPE = "place.wisp.v2.wh#atUri"

export type WhOperation = "create" | "update" | "delete"

export interface WhRecord {
  readonly $type: "place.wisp.v2.wh"
  readonly scope: {
    readonly aturi: string
    readonly backlinks?: boolean
    /** `true`: only backlink matches, never the scope's own records (implies `backlinks`) */
    readonly backlinksOnly?: boolean
    readonly $type?: "place.wisp.v2.wh#atUri"
  }
  readonly url: string
  readonly events?: ReadonlyArray<WhOperation>
  readonly secret?: string
  readonly secretId?: string
  readonly enabled?: boolean
  readonly createdAt: string
}

/** The error kinds of an invalid record (SPEC §1), in the order the fields are checked. */
export const WH_RECORD_ERROR_KINDS = [
  "not_object",
  "type",
  "scope",
  "url",
  "events",
  "secret",
  "secret_id",
  "enabled",
  "created_at"
] as const

export type WhRecordErrorKind = (typeof WH_RECORD_ERROR_KINDS)[number]

export interface ValidatedWh {
  /** the clean copy: known fields only, optional fields absent rather than undefined */
  readonly record: WhRecord
  /** the parsed `scope.aturi` */
  readonly scope: ScopeUri
}

export interface WhRecordOptions {
  /** passed to the URL rules (SPEC §1.2); see `WebhookUrlOptions` */
  readonly allowInsecureDev: boolean
  /** passed to the URL rules: the operator's allow-list; see `WebhookUrlOptions` */
  readonly allowCidrs?: ReadonlyArray<Cidr>
}

export const MAX_SECRET_LENGTH = 256
export const MAX_SECRET_ID_LENGTH = 64
export const MAX_CREATED_AT_LENGTH = 128
export const MAX_EVENTS = 3

// ---------------------------------------------------------------------------------------------
// own data property access
// ---------------------------------------------------------------------------------------------

/** The property does not exist as an own property. */
const ABSENT: unique symbol = Symbol("absent")
/** The property is an own accessor (getter/setter): never invoked. */
const ACCESSOR: unique symbol = Symbol("accessor")

type Own = unknown | typeof ABSENT | typeof ACCESSOR

const readOwn = (o: object, key: string): Own => {
  const desc = Object.getOwnPropertyDescriptor(o, key)
  if (desc === undefined) return ABSENT
  if (!("value" in desc)) return ACCESSOR
  return desc.value
}

/**
 * A plain object: not null, not an array, prototype exactly `Object.prototype` or `null`.
 * Class instances, Maps, Dates, `Object.create(proto)` and arrays are not plain.
 *
 * @since 0.1.0
 */
export const isPlainObject = (u: unknown): u is object => {
  if (typeof u !== "object" || u === null || Array.isArray(u)) return false
  const proto: unknown = Object.getPrototypeOf(u)
  return proto === Object.prototype || proto === null
}

// ---------------------------------------------------------------------------------------------
// field rules
// ---------------------------------------------------------------------------------------------

const isSecretIdChar = (c: number): boolean =>
  (c >= 48 && c <= 57) || (c >= 65 && c <= 90) || (c >= 97 && c <= 122) || c === 46 || c === 95 ||
  c === 45

/** `^[A-Za-z0-9._-]{1,64}$` */
const isSecretId = (s: string): boolean => {
  if (s.length < 1 || s.length > MAX_SECRET_ID_LENGTH) return false
  for (let i = 0; i < s.length; i++) if (!isSecretIdChar(s.charCodeAt(i))) return false
  return true
}

/** 1–256 UTF-16 code units, well-formed (no lone surrogates, which would change when UTF-8 encoded). */
const isSecret = (s: string): boolean => {
  if (s.length < 1 || s.length > MAX_SECRET_LENGTH) return false
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c >= 0xd800 && c <= 0xdbff) {
      const next = s.charCodeAt(i + 1)
      if (!(next >= 0xdc00 && next <= 0xdfff)) return false
      i++
    } else if (c >= 0xdc00 && c <= 0xdfff) {
      return false
    }
  }
  return true
}

/** Reads `count` decimal digits at `at`, or -1. */
const digits = (s: string, at: number, count: number): number => {
  let v = 0
  for (let i = at; i < at + count; i++) {
    const c = s.charCodeAt(i)
    if (!(c >= 48 && c <= 57)) return -1
    v = v * 10 + (c - 48)
  }
  return v
}

const daysInMonth = (year: number, month: number): number => {
  if (month === 2) {
    const leap = (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0
    return leap ? 29 : 28
  }
  return month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31
}

/**
 * RFC 3339 `date-time`: `YYYY-MM-DDTHH:MM:SS[.fraction](Z|±HH:MM)`, ≤ 128 chars, a real calendar date
 * (proleptic Gregorian, leap years; year 0000 allowed), hour ≤ 23, minute ≤ 59, second ≤ 60 (a leap
 * second is accepted at any minute), offset hour ≤ 23 and minute ≤ 59 (`-00:00` allowed).
 * `T` and `Z` may be lowercase, as RFC 3339 §5.6 permits.
 *
 * @since 0.1.0
 */
export const isRfc3339DateTime = (s: string): boolean => {
  const len = s.length
  if (len < 20 || len > MAX_CREATED_AT_LENGTH) return false
  const year = digits(s, 0, 4)
  if (year < 0 || s.charCodeAt(4) !== 45) return false
  const month = digits(s, 5, 2)
  if (month < 1 || month > 12 || s.charCodeAt(7) !== 45) return false
  const day = digits(s, 8, 2)
  if (day < 1 || day > daysInMonth(year, month)) return false
  const t = s.charCodeAt(10)
  if (t !== 84 && t !== 116) return false
  const hour = digits(s, 11, 2)
  if (hour < 0 || hour > 23 || s.charCodeAt(13) !== 58) return false
  const minute = digits(s, 14, 2)
  if (minute < 0 || minute > 59 || s.charCodeAt(16) !== 58) return false
  const second = digits(s, 17, 2)
  if (second < 0 || second > 60) return false
  let i = 19
  if (s.charCodeAt(i) === 46) {
    i++
    const fracStart = i
    while (i < len) {
      const c = s.charCodeAt(i)
      if (!(c >= 48 && c <= 57)) break
      i++
    }
    if (i === fracStart) return false
  }
  const z = s.charCodeAt(i)
  if (z === 90 || z === 122) return i + 1 === len
  if (z !== 43 && z !== 45) return false
  if (len - i !== 6) return false
  const oh = digits(s, i + 1, 2)
  if (oh < 0 || oh > 23 || s.charCodeAt(i + 3) !== 58) return false
  const om = digits(s, i + 4, 2)
  return om >= 0 && om <= 59
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] }

const OPERATIONS: ReadonlyArray<WhOperation> = ["create", "update", "delete"]

/** "0", "1", "2": property keys of the `events` array, precomputed */
const OPERATION_INDEX: ReadonlyArray<string> = OPERATIONS.map((_, i) => String(i))

const isOperation = (u: unknown): u is WhOperation => u === "create" || u === "update" || u === "delete"

/** Validates `events`: an array of ≤ 3 distinct operations, every element an own data property. */
const readEvents = (u: unknown): ReadonlyArray<WhOperation> | undefined => {
  if (!Array.isArray(u)) return undefined
  const arr: ReadonlyArray<unknown> = u
  const length = arr.length
  if (length > MAX_EVENTS) return undefined
  const out: Array<WhOperation> = []
  for (let i = 0; i < length; i++) {
    const v = readOwn(arr, OPERATION_INDEX[i] ?? "")
    if (!isOperation(v) || out.includes(v)) return undefined
    out.push(v)
  }
  return out
}

type ScopeResult = { readonly clean: WhRecord["scope"]; readonly parsed: ScopeUri }

/**
 * `scope`: a plain object with a canonical `aturi`, optional booleans `backlinks` and
 * `backlinksOnly` (wisp.place's newest validator; `backlinksOnly: true` with `backlinks: false` is
 * invalid, SPEC §1) and an optional `$type`; anything else in it is dropped.
 */
const readScope = (u: Own): ScopeResult | undefined => {
  if (!isPlainObject(u)) return undefined
  const aturi = readOwn(u, "aturi")
  if (typeof aturi !== "string") return undefined
  const parsed = parseScopeUri(aturi)
  if (parsed === undefined) return undefined
  const clean: Mutable<WhRecord["scope"]> = { aturi }
  const backlinks = readOwn(u, "backlinks")
  if (backlinks !== ABSENT) {
    if (typeof backlinks !== "boolean") return undefined
    clean.backlinks = backlinks
  }
  const backlinksOnly = readOwn(u, "backlinksOnly")
  if (backlinksOnly !== ABSENT) {
    if (typeof backlinksOnly !== "boolean") return undefined
    if (backlinksOnly && backlinks === false) return undefined
    clean.backlinksOnly = backlinksOnly
  }
  const type = readOwn(u, "$type")
  if (type !== ABSENT) {
    if (type !== WH_SCOPE_TYPE) return undefined
    clean.$type = WH_SCOPE_TYPE
  }
  return { clean, parsed }
}

// ---------------------------------------------------------------------------------------------
// the record
// ---------------------------------------------------------------------------------------------

/**
 * Validates a `place.wisp.v2.wh` record value (SPEC §1) into a clean copy.
 *
 * Decisions where the SPEC is silent:
 * - `$type` is required (`"type"` when absent);
 * - errors are reported in field order: not_object, type, scope, url, events, secret, secret_id,
 *   enabled, created_at (the first failure wins);
 * - `url` keeps the string as written (not the WHATWG-normalized href); it is re-validated at delivery;
 * - an empty `events` array is normalized away: the clean copy has no `events` (= all operations);
 * - `secret` and `secretId` together → `"secret"` (after each has passed its own rule);
 * - `null` is not "absent": an optional field set to `null` is invalid;
 * - `enabled` is kept in the clean copy when present (true or false);
 * - `scope.backlinks` and `scope.backlinksOnly` are kept as written (`backlinksOnly: true` is not
 *   rewritten into `backlinks: true`; the active-webhook index reads the pair).
 *
 * @since 0.1.0
 */
export const validateWhRecord = (
  input: unknown,
  opts: WhRecordOptions
): Either.Either<ValidatedWh, WhRecordErrorKind> => {
  if (!isPlainObject(input)) return Either.left("not_object")

  if (readOwn(input, "$type") !== WH_COLLECTION) return Either.left("type")

  const scope = readScope(readOwn(input, "scope"))
  if (scope === undefined) return Either.left("scope")

  const url = readOwn(input, "url")
  if (typeof url !== "string" || Either.isLeft(validateWebhookUrl(url, opts))) return Either.left("url")

  let events: ReadonlyArray<WhOperation> | undefined
  const eventsRaw = readOwn(input, "events")
  if (eventsRaw !== ABSENT) {
    events = readEvents(eventsRaw)
    if (events === undefined) return Either.left("events")
  }

  const secret = readOwn(input, "secret")
  if (secret !== ABSENT && (typeof secret !== "string" || !isSecret(secret))) return Either.left("secret")

  const secretId = readOwn(input, "secretId")
  if (secretId !== ABSENT && (typeof secretId !== "string" || !isSecretId(secretId))) {
    return Either.left("secret_id")
  }
  if (secret !== ABSENT && secretId !== ABSENT) return Either.left("secret")

  const enabled = readOwn(input, "enabled")
  if (enabled !== ABSENT && typeof enabled !== "boolean") return Either.left("enabled")

  const createdAt = readOwn(input, "createdAt")
  if (typeof createdAt !== "string" || !isRfc3339DateTime(createdAt)) return Either.left("created_at")

  const record: Mutable<WhRecord> = { $type: WH_COLLECTION, scope: scope.clean, url, createdAt }
  if (events !== undefined && events.length > 0) record.events = events
  if (typeof secret === "string") record.secret = secret
  if (typeof secretId === "string") record.secretId = secretId
  if (typeof enabled === "boolean") record.enabled = enabled
  return Either.right({ record, scope: scope.parsed })
}

/**
 * The record as other webhooks receive it (SPEC §2.2 step 6): a shallow copy of the own enumerable
 * string-keyed DATA properties, without `secret`. Accessors are dropped (never invoked); prototypes
 * are not copied (the copy is a fresh plain object, and an own `__proto__` key is copied as data).
 * Arrays and non-objects are returned unchanged (they carry no top-level `secret` a JSON body would show).
 *
 * @since 0.1.0
 */
export const sanitizeWhRecordForDelivery = (record: unknown): unknown => {
  if (typeof record !== "object" || record === null || Array.isArray(record)) return record
  const out: Record<string, unknown> = {}
  for (const key of Object.keys(record)) {
    if (key === "secret") continue
    const desc = Object.getOwnPropertyDescriptor(record, key)
    if (desc === undefined || !("value" in desc)) continue
    Object.defineProperty(out, key, { value: desc.value, enumerable: true, writable: true, configurable: true })
  }
  return out
}
