/**
 * Argument checks beyond @effect/cli (times, DIDs, record keys, names, delivery ids) and the
 * options and arguments several commands share.
 */
import { Args, Options } from "@effect/cli"
import { Clock, Effect, Option } from "effect"
import { isCanonicalDid, isRkey } from "../schemas/AtUri.js"
import { SUBSCRIPTION_CHANGED_KIND } from "../services/delivery/Attempt.js"
import { failureKinds } from "../services/delivery/Classify.js"
import { SECRET_NAME } from "../services/delivery/Secrets.js"
import { CRASHED_KIND } from "../services/delivery/Settlement.js"
import { PARKED_KIND } from "../services/delivery/WebhookHealthSql.js"
import { usage, type UsageError } from "./Failure.js"

// ---------------------------------------------------------------------------------------------
// Argument parsing beyond @effect/cli

const RELATIVE = /^([1-9][0-9]{0,5})(m|h|d)$/
const ISO_DATE = /^\d{4}-\d{2}-\d{2}$/
const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})?$/

/**
 * Whether the date and hour as written exist (`2026-02-30`, `2026-04-31`, `T24:00` do not):
 * `Date.parse` rolls them over to the next day or month instead of refusing them.
 */
const isRealDateTime = (s: string): boolean => {
  const year = Number(s.slice(0, 4))
  const month = Number(s.slice(5, 7))
  const day = Number(s.slice(8, 10))
  const hour = s.length > 10 ? Number(s.slice(11, 13)) : 0
  const leap = year % 4 === 0 && (year % 100 !== 0 || year % 400 === 0)
  const last = month === 2 ? (leap ? 29 : 28) : month === 4 || month === 6 || month === 9 || month === 11 ? 30 : 31
  return month >= 1 && month <= 12 && day >= 1 && day <= last && hour <= 23
}

/** Fraction digits past the millisecond that are not all zeros (`.0345678`: `5678`). */
const SUB_MILLISECOND = /\.\d{3}\d*[1-9]\d*(Z|[+-]\d{2}:\d{2})?$/

/**
 * A time argument: RFC 3339 / ISO 8601 (`2026-01-02`, `2026-01-02T03:04:05Z`, an offset, or no
 * offset = UTC), or a duration before now (`30m`, `12h`, `7d`). The bounds are compared to the
 * millisecond: a time finer than that (`.0345678`, `.034530`) is refused, never rounded, since a
 * row's `created_at` (microseconds) would then fall on the wrong side of it; `.034000` is `.034`.
 */
const parseTime = (flag: string, value: Option.Option<string>): Effect.Effect<Date | undefined, UsageError> =>
  Effect.gen(function*() {
    if (Option.isNone(value)) return undefined
    const s = value.value.trim()
    const rel = RELATIVE.exec(s)
    if (rel !== null) {
      const n = Number(rel[1])
      const unit = rel[2] === "m" ? 60_000 : rel[2] === "h" ? 3_600_000 : 86_400_000
      const now = yield* Clock.currentTimeMillis
      return new Date(now - n * unit)
    }
    const text = ISO_DATE.test(s)
      ? `${s}T00:00:00Z`
      : ISO_TIME.test(s)
      ? (/(Z|[+-]\d{2}:\d{2})$/.test(s) ? s : `${s}Z`)
      : ""
    if (text !== "" && SUB_MILLISECOND.test(s)) {
      return yield* usage(
        `invalid --${flag}: at most millisecond precision (3 fraction digits, 2026-01-02T03:04:05.123Z): a finer time is refused, not rounded`
      )
    }
    const ms = text === "" || !isRealDateTime(s) ? Number.NaN : Date.parse(text)
    if (Number.isNaN(ms)) {
      return yield* usage(
        `invalid --${flag}: expected an ISO 8601 time (2026-01-02, 2026-01-02T03:04:05Z) or a duration ago (30m, 12h, 7d)`
      )
    }
    return new Date(ms)
  })

/** `--since` and `--until` (the enqueue time, created_at): a range [since, until) that is not empty. */
export const parseRange = (sinceArg: Option.Option<string>, untilArg: Option.Option<string>) =>
  Effect.gen(function*() {
    const sinceT = yield* parseTime("since", sinceArg)
    const untilT = yield* parseTime("until", untilArg)
    if (sinceT !== undefined && untilT !== undefined && sinceT.getTime() >= untilT.getTime()) {
      return yield* usage(
        `invalid --since/--until: --since (${sinceT.toISOString()}) must be earlier than --until (${untilT.toISOString()})`
      )
    }
    return { sinceT, untilT }
  })

export const checkDid = (flag: string, value: string) =>
  isCanonicalDid(value) ? Effect.void : usage(`invalid ${flag}: must be a canonical DID (did:plc:… or did:web:…)`)

/** The rules the refusals of a record key, a secret name and a delivery id state. */
export const RKEY_RULE = "must be a record key"
export const NAME_RULE = "must match ^[A-Za-z0-9._-]{1,64}$"
export const DELIVERY_ID_RULE = "expected a delivery id (whd_v1_…)"

export const checkRkey = (flag: string, value: string) =>
  isRkey(value) ? Effect.void : usage(`invalid ${flag}: ${RKEY_RULE}`)

export const checkName = (value: string) =>
  SECRET_NAME.test(value) ? Effect.void : usage(`invalid <name>: ${NAME_RULE}`)

const DELIVERY_ID = /^[A-Za-z0-9_]{1,128}$/
export const checkDeliveryId = (value: string) =>
  DELIVERY_ID.test(value) ? Effect.void : usage(`invalid <id>: ${DELIVERY_ID_RULE}`)

// ---------------------------------------------------------------------------------------------
// Options shared by commands

/** An optional option with a pseudo-name and a description, as every optional one here is built. */
export const optional = <A>(option: Options.Options<A>, pseudoName: string, description: string) =>
  option.pipe(Options.withPseudoName(pseudoName), Options.withDescription(description), Options.optional)

export const json = Options.boolean("json").pipe(Options.withDescription("machine-readable JSON output"))
export const showUrls = Options.boolean("show-urls").pipe(
  Options.withDescription("show webhook target URLs (hidden by default)")
)
export const owner = optional(Options.text("owner"), "DID", "owner DID")
export const webhook = optional(Options.text("webhook"), "RKEY", "webhook record key")
export const since = optional(
  Options.text("since"),
  "TIME",
  "enqueue time (created_at) at or after (ISO 8601, or 30m / 12h / 7d ago); earlier than --until"
)
export const until = optional(
  Options.text("until"),
  "TIME",
  "enqueue time (created_at) before (ISO 8601, or 30m / 12h / 7d ago)"
)
/**
 * Every `last_error_kind` a row can have: the attempt failure kinds, parked rows' kind, the dead
 * letters of a request that killed its worker (`crashed`, replayable) and rows cancelled because
 * their subscription changed.
 */
export const ERROR_KINDS = [...failureKinds, PARKED_KIND, CRASHED_KIND, SUBSCRIPTION_CHANGED_KIND] as const
export const errorKind = Options.choice("error-kind", ERROR_KINDS).pipe(
  Options.withDescription(
    `only deliveries whose last error is of this kind (${PARKED_KIND}: parked while their webhook was gone or auto-disabled; ${CRASHED_KIND}: dead-lettered after its request killed the worker three times; ${SUBSCRIPTION_CHANGED_KIND}: cancelled)`
  ),
  Options.optional
)
export const deliveryId = Args.text({ name: "id" }).pipe(Args.withDescription("delivery id (whd_v1_…)"))
export const didArg = Args.text({ name: "did" }).pipe(Args.withDescription("owner DID"))
export const nameArg = Args.text({ name: "name" }).pipe(Args.withDescription("secret name (the record's secretId)"))
export const token = optional(
  Options.redacted("token"),
  "TOKEN",
  "use this token (32-256 printable ASCII characters) instead of a generated one; visible to other local users (ps)"
)
