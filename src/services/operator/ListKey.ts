/**
 * The text of a delivery's `created_at` in a list key (the owners' API cursor, the replay's paging
 * key): UTC, `YYYY-MM-DDTHH:MM:SS.ffffffZ`, full microsecond precision, so that ordering and
 * equality are exact. The database writes it with an explicit format ({@link KEY_TEXT_FORMAT}),
 * never `created_at::text`, whose form follows the session's `DateStyle` and `TimeZone`; it is
 * read back with `::timestamptz`, which parses ISO 8601 with a zone the same way under every
 * `DateStyle`.
 *
 * A key that comes back from a client is untrusted: {@link normalizeKeyTime} accepts only a real
 * calendar time in years 0001–9999 (UTC) with a sane zone offset, so whatever it returns never
 * fails the cast (a 500) and always names the instant the client was given. It also accepts the
 * ISO-`DateStyle` `created_at::text` form older cursors carry (`2026-05-01 10:00:00.123456+00`,
 * offsets up to ±15:59:59), normalized to the UTC form.
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import type { ListKey } from "./Operator.js"

/** `to_char` format of a key (applied to `created_at AT TIME ZONE 'UTC'`). */
export const KEY_TEXT_FORMAT = "YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\""

const KEY_TIME =
  /^(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,6}))?(Z|([+-])(\d{2})(?::(\d{2}))?(?::(\d{2}))?)$/

/** The largest zone offset PostgreSQL writes or reads, in seconds (15:59:59). */
const MAX_OFFSET_SECONDS = 15 * 3600 + 59 * 60 + 59

const isLeap = (y: number): boolean => (y % 4 === 0 && y % 100 !== 0) || y % 400 === 0

const daysIn = (y: number, m: number): number =>
  m === 2 ? (isLeap(y) ? 29 : 28) : m === 4 || m === 6 || m === 9 || m === 11 ? 30 : 31

const pad = (n: number, width: number): string => String(n).padStart(width, "0")

/**
 * A key time in the canonical UTC form, or undefined when `text` is not a real calendar time in
 * years 0001–9999 (before and after applying its offset), or its offset exceeds ±15:59:59.
 */
export const normalizeKeyTime = (text: string): string | undefined => {
  const m = KEY_TIME.exec(text)
  if (m === null) return undefined
  const field = (i: number): number => Number(m[i] ?? "0")
  const [year, month, day, hour, minute, second] = [field(1), field(2), field(3), field(4), field(5), field(6)]
  if (year < 1 || month < 1 || month > 12 || day < 1 || day > daysIn(year, month)) return undefined
  if (hour > 23 || minute > 59 || second > 59) return undefined
  if (field(11) > 59 || field(12) > 59) return undefined
  const offset = (m[9] === "-" ? -1 : 1) * (field(10) * 3600 + field(11) * 60 + field(12))
  if (Math.abs(offset) > MAX_OFFSET_SECONDS) return undefined
  // whole seconds (the offset has no fraction)
  const t = utcAt(year, month, day, hour, minute, second - offset)
  const y = t.getUTCFullYear()
  if (y < 1 || y > 9999) return undefined
  return keyTextOf(t, (m[7] ?? "").padEnd(6, "0"))
}

/** A UTC time set field by field (`Date.UTC` would read years 0–99 as 1900–1999). */
const utcAt = (year: number, month: number, day: number, hour: number, minute: number, second: number): Date => {
  const t = new Date(0)
  t.setUTCFullYear(year, month - 1, day)
  t.setUTCHours(hour, minute, second, 0)
  return t
}

/** The key text of `t`'s whole seconds and a six-digit `fraction`: `2026-03-01T10:00:00.000500Z`. */
const keyTextOf = (t: Date, fraction: string): string =>
  `${pad(t.getUTCFullYear(), 4)}-${pad(t.getUTCMonth() + 1, 2)}-${pad(t.getUTCDate(), 2)}T${pad(t.getUTCHours(), 2)}:${
    pad(t.getUTCMinutes(), 2)
  }:${pad(t.getUTCSeconds(), 2)}.${fraction}Z`

// ---------------------------------------------------------------------------------------------
// Filter bounds (`since` / `until` on `created_at`, which the database keeps to the microsecond)

/** The first microsecond of year 0000, of year 0001 and of year 10000 (UTC), since the epoch. */
const YEAR_0000_US = -62_167_219_200_000_000n
const YEAR_0001_US = -62_135_596_800_000_000n
const YEAR_10000_US = 253_402_300_800_000_000n

const RFC3339 = /^(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?([Zz]|([+-])(\d{2}):(\d{2}))$/

/**
 * An RFC 3339 time (a lexicon `datetime`: `2026-03-01T10:00:00.000500Z`, any number of fraction
 * digits, `Z` or `±hh:mm`) as microseconds since the epoch, or undefined when it is not a real
 * calendar time in years 0000–9999 (UTC) of at most 64 characters. A fraction finer than a
 * microsecond is rounded UP: for a `created_at` kept in whole microseconds, `>= t` and `< t` are
 * then exactly `>=` and `<` the result. A bigint: years 0000–9999 exceed 2^53 microseconds.
 */
export const timeMicros = (text: string): bigint | undefined => {
  if (text.length > 64) return undefined
  const m = RFC3339.exec(text)
  if (m === null) return undefined
  const field = (i: number): number => Number(m[i] ?? "0")
  const [year, month, day, hour, minute, second] = [field(1), field(2), field(3), field(4), field(5), field(6)]
  if (month < 1 || month > 12 || day < 1 || day > daysIn(year, month)) return undefined
  if (hour > 23 || minute > 59 || second > 59 || field(10) > 23 || field(11) > 59) return undefined
  const offset = (m[9] === "-" ? -1 : 1) * (field(10) * 3600 + field(11) * 60)
  const t = utcAt(year, month, day, hour, minute, second - offset)
  const digits = m[7] ?? ""
  const finer = /[1-9]/.test(digits.slice(6)) ? 1n : 0n
  const us = BigInt(t.getTime()) * 1000n + BigInt(digits.slice(0, 6).padEnd(6, "0")) + finer
  return us >= YEAR_0000_US && us < YEAR_10000_US ? us : undefined
}

/** A Date as microseconds since the epoch, or undefined when it is invalid or outside years 0000–9999 (UTC). */
export const dateMicros = (d: Date): bigint | undefined => {
  const ms = d.getTime()
  if (Number.isNaN(ms)) return undefined
  const us = BigInt(ms) * 1000n
  return us >= YEAR_0000_US && us < YEAR_10000_US ? us : undefined
}

/**
 * The key text ({@link KEY_TEXT_FORMAT}'s form, `2026-03-01T10:00:00.000500Z`) of a time in
 * microseconds, for `::timestamptz`, which keeps every microsecond of it. PostgreSQL has no year
 * 0000 (it would fail the cast): a time before 0001-01-01 is written as 0001-01-01T00:00:00Z, the
 * same bound for a `created_at` (nothing is enqueued before year 1).
 */
export const microsKeyText = (micros: bigint): string => {
  const us = micros < YEAR_0001_US ? YEAR_0001_US : micros
  let seconds = us / 1_000_000n
  let fraction = us % 1_000_000n
  if (fraction < 0n) {
    seconds -= 1n
    fraction += 1_000_000n
  }
  return keyTextOf(new Date(Number(seconds) * 1000), String(fraction).padStart(6, "0"))
}

// ---------------------------------------------------------------------------------------------
// Cursors (the owners' API's `cursor`, the operator CLI's `--cursor`)

const DELIVERY_ID = /^[\x21-\x7e]{1,128}$/

/**
 * The opaque cursor of a list key: base64url of `[createdAt, deliveryId]`, `createdAt` in the
 * UTC form of this module (`2026-05-01T10:00:00.123456Z`).
 */
export const encodeCursor = (key: ListKey): string =>
  Buffer.from(JSON.stringify([key.createdAt, key.deliveryId]), "utf8").toString("base64url")

/**
 * The list key of a cursor (its time normalized to UTC), or undefined when it is not one: a time
 * that is not a real calendar time in years 0001–9999 with a sane offset (`ListKey.normalizeKeyTime`)
 * is refused here, never at the database. Cursors of earlier versions (`created_at::text` of the
 * ISO DateStyle, `2026-05-01 10:00:00.123456+00`) are still accepted.
 */
export const decodeCursor = (cursor: string): ListKey | undefined => {
  const parsed = Either.try(() => JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as unknown)
  if (Either.isLeft(parsed) || !Array.isArray(parsed.right) || parsed.right.length !== 2) return undefined
  const [createdAt, deliveryId]: ReadonlyArray<unknown> = parsed.right
  const at = typeof createdAt === "string" ? normalizeKeyTime(createdAt) : undefined
  if (at === undefined) return undefined
  if (typeof deliveryId !== "string" || !DELIVERY_ID.test(deliveryId)) return undefined
  return { createdAt: at, deliveryId }
}
