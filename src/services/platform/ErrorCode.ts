/**
 * The one reader of driver error codes (PostgreSQL SQLSTATE, Node errno, Redis/TLS codes): a short
 * upper-case identifier taken from an error's `code`, never its message (which may carry a URL, a
 * credential or an SQL value). Logs, health and typed errors carry only this.
 *
 * @since 0.1.0
 */

/**
 * What a code looks like: `ECONNREFUSED`, `57014`, `ERR_TLS_CERT_ALTNAME_INVALID`, and firehook's
 * own lower-case codes (`timeout`, `defect`) carried by `StoreError`. Anything else (a URL, a
 * sentence, a value) is not a code.
 */
const CODE = /^[A-Za-z0-9_-]{1,40}$/

/** The error's own `code`, when it is a well-formed code. */
export const ownCode = (e: unknown): string | undefined => {
  if (typeof e !== "object" || e === null) return undefined
  const code: unknown = Reflect.get(e, "code")
  return typeof code === "string" && CODE.test(code) ? code : undefined
}

/**
 * The driver's code behind an error: that of its `cause` when it has one (`@effect/sql`'s
 * `SqlError` wraps the driver's error), else its own.
 */
export const driverCode = (e: unknown): string | undefined =>
  ownCode(typeof e === "object" && e !== null && "cause" in e ? e.cause : e)

/** {@link driverCode}, or `fallback` (default `"unknown"`) when there is none. */
export const codeOr = (e: unknown, fallback = "unknown"): string => driverCode(e) ?? fallback
