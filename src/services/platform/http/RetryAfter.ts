/**
 * `Retry-After` (RFC 9110 §10.2.3): delay-seconds or an HTTP-date (RFC 9110 §5.6.7), read by the
 * delivery attempt (delivery/Classify.ts re-exports it) and by the reconciler's PDS reads.
 */
const MONTHS: Readonly<Record<string, number>> = {
  Jan: 0,
  Feb: 1,
  Mar: 2,
  Apr: 3,
  May: 4,
  Jun: 5,
  Jul: 6,
  Aug: 7,
  Sep: 8,
  Oct: 9,
  Nov: 10,
  Dec: 11
}
const DAY_NAMES = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
const DAY_NAMES_LONG = "(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)"
const MONTH_NAMES = "(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
const TIME = "(\\d{2}):(\\d{2}):(\\d{2})"

/** `Sun, 06 Nov 1994 08:49:37 GMT` */
const IMF_FIXDATE = new RegExp(`^${DAY_NAMES}, (\\d{2}) ${MONTH_NAMES} (\\d{4}) ${TIME} GMT$`)
/** `Sunday, 06-Nov-94 08:49:37 GMT` */
const RFC850_DATE = new RegExp(`^${DAY_NAMES_LONG}, (\\d{2})-${MONTH_NAMES}-(\\d{2}) ${TIME} GMT$`)
/** `Sun Nov  6 08:49:37 1994` */
const ASCTIME_DATE = new RegExp(`^${DAY_NAMES} ${MONTH_NAMES} ([ \\d]\\d) ${TIME} (\\d{4})$`)

const DELAY_SECONDS = /^\d+$/

const daysInMonth = (year: number, month: number): number => {
  if (month === 1) return (year % 4 === 0 && year % 100 !== 0) || year % 400 === 0 ? 29 : 28
  return [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month] ?? 0
}

const toEpochMs = (
  year: number,
  monthName: string,
  day: number,
  hh: number,
  mm: number,
  ss: number
): number | undefined => {
  const month = MONTHS[monthName]
  if (month === undefined) return undefined
  // second 60 is a leap second (RFC 9110 allows it); it lands on the next minute.
  if (day < 1 || day > daysInMonth(year, month) || hh > 23 || mm > 59 || ss > 60) return undefined
  return Date.UTC(year, month, day, hh, mm, ss)
}

/** Parses an HTTP-date in any of its three forms into epoch milliseconds. */
export const parseHttpDate = (value: string, nowMs: number): number | undefined => {
  let m = IMF_FIXDATE.exec(value)
  if (m !== null) {
    return toEpochMs(Number(m[3]), m[2] ?? "", Number(m[1]), Number(m[4]), Number(m[5]), Number(m[6]))
  }
  m = RFC850_DATE.exec(value)
  if (m !== null) {
    // RFC 9110: a two-digit year more than 50 years in the future is in the previous century.
    const yy = Number(m[3])
    const currentYear = new Date(nowMs).getUTCFullYear()
    let year = Math.floor(currentYear / 100) * 100 + yy
    if (year > currentYear + 50) year -= 100
    else if (year <= currentYear - 50) year += 100
    return toEpochMs(year, m[2] ?? "", Number(m[1]), Number(m[4]), Number(m[5]), Number(m[6]))
  }
  m = ASCTIME_DATE.exec(value)
  if (m !== null) {
    return toEpochMs(Number(m[6]), m[1] ?? "", Number((m[2] ?? "").trim()), Number(m[3]), Number(m[4]), Number(m[5]))
  }
  return undefined
}

/**
 * The delay in milliseconds requested by a `Retry-After` header value, relative to `nowMs`.
 * Accepts delay-seconds (`^\d+$`) and HTTP-dates (IMF-fixdate, RFC 850, asctime). Never negative
 * (a date in the past is 0); `undefined` when absent or unparseable. Surrounding whitespace is ignored.
 * Huge delay-seconds values are clamped to `Number.MAX_SAFE_INTEGER`; the caller applies the real cap.
 */
export const parseRetryAfter = (value: string | undefined, nowMs: number): number | undefined => {
  if (value === undefined) return undefined
  const v = value.trim()
  if (v.length === 0) return undefined
  if (DELAY_SECONDS.test(v)) {
    const ms = Number(v) * 1000
    return Number.isFinite(ms) ? Math.min(ms, Number.MAX_SAFE_INTEGER) : Number.MAX_SAFE_INTEGER
  }
  const at = parseHttpDate(v, nowMs)
  if (at === undefined) return undefined
  return Math.max(0, at - nowMs)
}
