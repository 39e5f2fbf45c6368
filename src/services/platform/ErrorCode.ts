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

/** An error's class name, when it is an `Error` with a well-formed one (never its message). */
export const className = (e: unknown): string | undefined =>
  e instanceof Error && /^[A-Za-z][A-Za-z0-9_]{0,63}$/.test(e.name) ? e.name : undefined

/** The error's own `code`, when it is a well-formed code. */
export const ownCode = (e: unknown): string | undefined => {
  if (typeof e !== "object" || e === null) return undefined
  const code: unknown = Reflect.get(e, "code")
  return typeof code === "string" && CODE.test(code) ? code : undefined
}

/**
 * `pg`'s and `pg-pool`'s errors that have no code, each a fixed text of the driver's own (no URL,
 * credential or value in it), given a code of firehook's, so that a dropped connection (a
 * PostgreSQL restart, `pg_terminate_backend`, a proxy's idle timeout) is logged as
 * `connection_lost`, not `unknown`. Only an exact match is used; any other message is never read.
 */
const DRIVER_FIXED_TEXTS: ReadonlyMap<string, string> = new Map([
  ["Connection terminated unexpectedly", "connection_lost"],
  ["Connection terminated", "connection_lost"],
  ["Client has encountered a connection error and is not queryable", "connection_lost"],
  ["Client was closed and is not queryable", "connection_closed"],
  ["Connection terminated due to connection timeout", "timeout"],
  ["timeout exceeded when trying to connect", "timeout"]
])

const fixedTextCode = (e: unknown): string | undefined =>
  e instanceof Error ? DRIVER_FIXED_TEXTS.get(e.message) : undefined

/**
 * The driver's code behind an error: that of its `cause` when it has one (`@effect/sql`'s
 * `SqlError` wraps the driver's error), else its own; for the driver's code-less errors of fixed
 * text, firehook's code for them ({@link DRIVER_FIXED_TEXTS}).
 */
export const driverCode = (e: unknown): string | undefined => {
  const driver: unknown = typeof e === "object" && e !== null && "cause" in e ? e.cause : e
  return ownCode(driver) ?? fixedTextCode(driver)
}

/** {@link driverCode}, or `fallback` (default `"unknown"`) when there is none. */
export const codeOr = (e: unknown, fallback = "unknown"): string => driverCode(e) ?? fallback
