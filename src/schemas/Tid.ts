/**
 * atproto TIDs (timestamp identifiers): 13 characters of base32-sortable
 * (`234567abcdefghijklmnopqrstuvwxyz`) encoding a 64-bit integer whose top bit is 0, then 53 bits of
 * microseconds since the Unix epoch, then a 10-bit clock id. Lexicographic order is chronological
 * order; revisions (`rev`) are TIDs (SPEC §3.4).
 *
 * @since 0.1.0
 */

/** The base32-sortable alphabet. */
export const TID_ALPHABET = "234567abcdefghijklmnopqrstuvwxyz"
export const TID_LENGTH = 13
/** The largest timestamp a TID holds: 2^53 - 1 microseconds. */
export const MAX_TID_MICROS = Number.MAX_SAFE_INTEGER
export const MAX_CLOCK_ID = 1023

/** Index of a char code in TID_ALPHABET, or -1. */
const b32Value = (c: number): number => {
  if (c >= 50 && c <= 55) return c - 50 // 2-7 → 0-5
  if (c >= 97 && c <= 122) return c - 91 // a-z → 6-31
  return -1
}

/**
 * A syntactically valid TID: 13 base32-sortable chars, the first in `234567abcdefghij` (top bit 0).
 *
 * @since 0.1.0
 */
export const isTid = (s: string): boolean => {
  if (s.length !== TID_LENGTH) return false
  const first = b32Value(s.charCodeAt(0))
  if (first < 0 || first > 15) return false
  for (let i = 1; i < TID_LENGTH; i++) {
    if (b32Value(s.charCodeAt(i)) < 0) return false
  }
  return true
}

/**
 * Orders two TIDs: negative if `a` is older, 0 if equal, positive if `a` is newer. Plain code-unit
 * comparison (which is chronological for valid TIDs), independent of locale.
 *
 * @since 0.1.0
 */
export const compareTid = (a: string, b: string): -1 | 0 | 1 => (a < b ? -1 : a > b ? 1 : 0)

/**
 * Encodes a TID from a timestamp in microseconds and a clock id.
 * Out-of-range inputs are clamped, never rejected: `micros` is truncated to an integer and clamped to
 * [0, 2^53 - 1] (NaN → 0); `clockId` is truncated and clamped to [0, 1023].
 *
 * @since 0.1.0
 */
export const tidFromMicros = (micros: number, clockId: number = 0): string => {
  let t = Number.isNaN(micros) ? 0 : Math.trunc(Math.min(Math.max(micros, 0), MAX_TID_MICROS))
  let clock = Number.isNaN(clockId) ? 0 : Math.trunc(Math.min(Math.max(clockId, 0), MAX_CLOCK_ID))
  // The 63-bit value does not fit a double; encode the two parts separately. 10 clock bits are
  // exactly the last 2 chars; the 53 timestamp bits are the first 11 chars (top char ≤ 15).
  let out = ""
  for (let i = 0; i < 2; i++) {
    out = TID_ALPHABET.charAt(clock % 32) + out
    clock = Math.floor(clock / 32)
  }
  for (let i = 0; i < 11; i++) {
    out = TID_ALPHABET.charAt(t % 32) + out
    t = Math.floor(t / 32)
  }
  return out
}

/**
 * Decodes the timestamp (microseconds) of a valid TID, or `undefined` if `s` is not a TID.
 *
 * @since 0.1.0
 */
export const tidToMicros = (s: string): number | undefined => {
  if (!isTid(s)) return undefined
  let t = 0
  for (let i = 0; i < 11; i++) t = t * 32 + b32Value(s.charCodeAt(i))
  // 55 bits of capacity; a valid TID can carry up to 2^54 - 1 here, beyond exact doubles
  return t <= MAX_TID_MICROS ? t : undefined
}
