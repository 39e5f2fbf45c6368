/**
 * What `sslmode` in `DATABASE_URL` means for firehook (docs/decisions.md), decided here rather than
 * by whichever `pg` version is installed.
 *
 * `pg` 8 (pg-connection-string 2.x) treats `prefer`, `require` and `verify-ca` as aliases of
 * `verify-full`: TLS, the server's certificate checked against the system CAs (or `sslrootcert`) and
 * its host name checked. It also prints a ten-line `SECURITY WARNING` process warning on stderr the
 * first time it parses one of them, announcing that `pg` 9 will switch to libpq's meaning (`require`
 * = encrypt without checking who answers). stderr carries only firehook's one-line failure report
 * (SPEC §6.1), and an upgrade must not silently weaken the connection, so firehook keeps the checking
 * meaning: those three modes reach the driver as `sslmode=verify-full` (no warning, same behaviour).
 *
 * - `disable`, `verify-full` and `no-verify` (pg's explicit "TLS without checking") pass unchanged;
 * - `uselibpqcompat=true` is the operator asking for libpq's meanings (`require` without checking):
 *   passed unchanged, `pg` honours it without a warning;
 * - any other `sslmode` is a startup error ({@link sslModeRule}): `pg` would ignore it silently.
 */
import type { StringRule } from "./ConfigRead.js"

/** The `sslmode` values firehook accepts (pg's list; libpq's `allow` is not one of them). */
export const SSL_MODES = ["disable", "prefer", "require", "verify-ca", "verify-full", "no-verify"] as const
export type SslMode = (typeof SSL_MODES)[number]

/** The modes `pg` 8 treats as `verify-full` while warning that `pg` 9 will weaken them. */
const VERIFYING_ALIASES: ReadonlySet<string> = new Set(["prefer", "require", "verify-ca"])

const parse = (url: string): URL | undefined => (URL.canParse(url) ? new URL(url) : undefined)

/** The last value of a query parameter (the one `pg` reads: later entries overwrite earlier ones). */
const lastParam = (u: URL, name: string): string | undefined => u.searchParams.getAll(name).at(-1)

/** Whether the URL's `sslmode`, if any, is one of {@link SSL_MODES}. */
export const hasKnownSslMode = (url: string): boolean => {
  const u = parse(url)
  const mode = u === undefined ? undefined : lastParam(u, "sslmode")
  return mode === undefined || SSL_MODES.some((m) => m === mode)
}

/** `DATABASE_URL`'s `sslmode` rule, checked at startup (SPEC §6.5). */
export const sslModeRule: StringRule = {
  test: hasKnownSslMode,
  text: `sslmode must be one of ${SSL_MODES.join(", ")}`
}

/**
 * The connection string handed to `pg`: `url` itself, except that `sslmode=prefer|require|verify-ca`
 * (without `uselibpqcompat=true`) becomes `sslmode=verify-full`, the meaning `pg` 8 gives them,
 * so that the driver neither warns nor changes meaning on upgrade. Idempotent.
 */
export const driverConnectionString = (url: string): string => {
  const u = parse(url)
  if (u === undefined) return url
  const mode = lastParam(u, "sslmode")
  if (mode === undefined || !VERIFYING_ALIASES.has(mode) || lastParam(u, "uselibpqcompat") === "true") return url
  u.searchParams.set("sslmode", "verify-full")
  return u.toString()
}
