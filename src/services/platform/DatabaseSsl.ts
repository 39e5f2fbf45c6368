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
 * - any other `sslmode` is a startup error ({@link sslModeRule}): `pg` would ignore it silently;
 * - an `ssl` query value other than `true`, `1`, `0` and `no-verify` is a startup error
 *   ({@link sslParamRule}): `pg` turns TLS on for it, `ssl=false` included.
 *
 * What the driver is given is a client config, not the connection string ({@link driverConfig}):
 * `pg` turns every checking mode into `ssl: {}` (or `true`), without `rejectUnauthorized`, so
 * Node's and Bun's TLS fell back to `NODE_TLS_REJECT_UNAUTHORIZED`, and `=0` in the environment
 * turned the check off (the startup message and the password then went to whatever answered).
 *
 * The URL is parsed again for each new connection ({@link connectingClient}): the parser reads the
 * files named by `sslrootcert`, `sslcert` and `sslkey`, so a rotated client certificate or a renewed
 * CA bundle is used by the next connection, as when `pg` parsed the connection string itself.
 */
import { Either, Redacted } from "effect"
import Pg from "pg"
import * as PgConnectionString from "pg-connection-string"
import type { StringRule } from "./ConfigRead.js"

/** The `sslmode` values firehook accepts (pg's list; libpq's `allow` is not one of them). */
export const SSL_MODES = ["disable", "prefer", "require", "verify-ca", "verify-full", "no-verify"] as const
export type SslMode = (typeof SSL_MODES)[number]

/** The modes `pg` 8 treats as `verify-full` while warning that `pg` 9 will weaken them. */
const VERIFYING_ALIASES: ReadonlySet<string> = new Set(["prefer", "require", "verify-ca"])

const parse = (url: string): URL | undefined => (URL.canParse(url) ? new URL(url) : undefined)

/** The last value of a query parameter (the one `pg` reads: later entries overwrite earlier ones). */
const lastParam = (u: URL, name: string): string | undefined => u.searchParams.getAll(name).at(-1)

/** Whether the URL's query parameter `name` (its last value), if any, is one of `known`. */
const lastParamKnown = (url: string, name: string, known: ReadonlyArray<string>): boolean => {
  const u = parse(url)
  const value = u === undefined ? undefined : lastParam(u, name)
  return value === undefined || known.includes(value)
}

/** Whether the URL's `sslmode`, if any, is one of {@link SSL_MODES}. */
export const hasKnownSslMode = (url: string): boolean => lastParamKnown(url, "sslmode", SSL_MODES)

/** `DATABASE_URL`'s `sslmode` rule, checked at startup (SPEC §6.5). */
export const sslModeRule: StringRule = {
  test: hasKnownSslMode,
  text: `sslmode must be one of ${SSL_MODES.join(", ")}`
}

/**
 * The `ssl` query values `pg` gives a meaning (`true`/`1`: TLS, checked; `0`: none; `no-verify`: TLS
 * without checking). Any other value (`ssl=false`, `ssl=yes`) turned TLS on in `pg` whatever it said,
 * so it is a startup error instead ({@link sslParamRule}).
 */
export const SSL_PARAMS = ["true", "1", "0", "no-verify"] as const

/** Whether the URL's `ssl` query value, if any, is one of {@link SSL_PARAMS}. */
export const hasKnownSslParam = (url: string): boolean => lastParamKnown(url, "ssl", SSL_PARAMS)

/** `DATABASE_URL`'s `ssl` rule, checked at startup after {@link sslModeRule}. */
export const sslParamRule: StringRule = {
  test: hasKnownSslParam,
  text: `ssl must be one of ${SSL_PARAMS.join(", ")} (or use sslmode)`
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

/** The `PGSSLMODE` values `pg` 8 reads as `ssl: true` (TLS, checked), when the URL says nothing of TLS. */
const CHECKING_ENV_MODES: ReadonlySet<string> = new Set(["prefer", "require", "verify-ca", "verify-full"])

/** What the connection string's TLS settings, as `pg-connection-string` parsed them, come to. */
type ParsedSsl = PgConnectionString.ConnectionOptions["ssl"]

/**
 * The `ssl` the driver is given for `ssl` (the parser's) and `pgSslMode` (`PGSSLMODE`): what `pg`
 * 8.23.1 makes of them (connection-parameters.js), except that whatever it would check is checked
 * whatever the environment says (`rejectUnauthorized: true`):
 * - an object without `rejectUnauthorized: false` (every `sslmode` but `disable` and the opt-outs;
 *   `sslcert`/`sslkey`/`sslrootcert`; libpq's `verify-ca`, which keeps its `checkServerIdentity`
 *   that skips the name only) gets `rejectUnauthorized: true`; `false` (`no-verify`, libpq's
 *   `prefer`/`require`) is the operator's and is kept;
 * - `ssl=true` (`true`), and any other non-empty `ssl` string (`pg` turns TLS on for it) → checked;
 *   `ssl=no-verify` → `rejectUnauthorized: false` (as `pg`); `ssl=` (empty) → no TLS (as `pg`);
 * - no TLS setting in the URL: `PGSSLMODE`, as `pg` reads it, with its checking modes checked;
 *   any other value (or none) is left to `pg` (`undefined`).
 */
export const checkedSsl = (ssl: ParsedSsl, pgSslMode: string | undefined): ParsedSsl => {
  if (ssl === undefined) {
    return pgSslMode !== undefined && CHECKING_ENV_MODES.has(pgSslMode) ? { rejectUnauthorized: true } : undefined
  }
  if (typeof ssl === "boolean") return ssl ? { rejectUnauthorized: true } : false
  if (typeof ssl === "string") {
    return ssl === "no-verify" ? { rejectUnauthorized: false } : ssl === "" ? false : { rejectUnauthorized: true }
  }
  return ssl.rejectUnauthorized === false ? ssl : { ...ssl, rejectUnauthorized: true }
}

/**
 * The `pg` client settings for `url`: {@link driverConnectionString}, parsed by the parser `pg`
 * itself uses (pg-connection-string, pinned to pg's version), with {@link checkedSsl}'s `ssl`.
 * Passed without `connectionString`, since `pg` would parse that again over any `ssl` given beside
 * it. The parser's errors (an unreadable `sslrootcert`, an invalid port, libpq's `verify-ca`
 * without `sslrootcert`) are returned, not thrown: `pg` raised them at connect time.
 */
export const driverConfig = (
  url: string,
  pgSslMode: string | undefined = process.env["PGSSLMODE"]
): Either.Either<Pg.ClientConfig, unknown> =>
  Either.try({
    try: () => {
      const parsed = PgConnectionString.parse(driverConnectionString(url))
      const ssl = checkedSsl(parsed.ssl, pgSslMode)
      return PgConnectionString.toClientConfig(ssl === undefined ? parsed : { ...parsed, ssl })
    },
    catch: (e) => e
  })

/**
 * The code of a connection that could not be made because the URL could no longer be parsed: the
 * files named by `sslrootcert`, `sslcert` or `sslkey` could not be read when it was made (removed,
 * unreadable; or, with libpq's `verify-ca`, the CA file found empty). The URL itself was checked at
 * startup.
 */
export const FILES_UNREADABLE = "ssl_files_unreadable"

/** The error of such a connection: a fixed text and {@link FILES_UNREADABLE}, never a path or the parser's text. */
const filesUnreadable = (): Error =>
  Object.assign(new Error("the certificate files named in DATABASE_URL could not be read"), { code: FILES_UNREADABLE })

export interface ConnectingOptions {
  /** settings under the URL's (the URL's own win, as when `pg` parsed it): `application_name` */
  readonly defaults?: Pg.ClientConfig
  /** the class the connections are made with (the pool's preparing client); `Pg.Client` by default */
  readonly base?: typeof Pg.Client
}

/** The statement that gives a session ISO output, keeping its order (`DMY`/`MDY`) for input. */
export const SET_ISO_DATESTYLE = "SET DateStyle TO ISO"

/** Whether a reported `DateStyle` (`ISO, MDY`) writes dates in ISO form. */
const isIsoDateStyle = (style: string | undefined): boolean => style !== undefined && /^\s*ISO\b/i.test(style)

/** The `DateStyle` of a `ParameterStatus` message, if it is one. */
const reportedDateStyle = (msg: unknown): string | undefined => {
  if (typeof msg !== "object" || msg === null) return undefined
  const name: unknown = "parameterName" in msg ? msg.parameterName : undefined
  const value: unknown = "parameterValue" in msg ? msg.parameterValue : undefined
  return typeof name === "string" && name.toLowerCase() === "datestyle" && typeof value === "string"
    ? value
    : undefined
}

/**
 * A `pg` client class whose every instance connects with {@link driverConfig}`(url)` parsed when it
 * is made (once per connection, never per query), so that the certificate files named in the URL
 * are read for each new connection: the pool's (`Client`, which pg-pool makes for each connection)
 * and the LISTEN connection's. A client's own config (the pool's or PgListen's settings: timeouts)
 * wins over the URL's, `defaults` give way to it; `pgSslMode` is read when the class is made.
 *
 * Every connection writes dates in ISO form: `pg`'s `timestamptz`, `timestamp` and `date` parsers
 * read only that form (under `DateStyle = 'SQL, DMY'` every timestamp came back null), so when the
 * server reports (its startup `ParameterStatus`) a `DateStyle` that is not ISO, `connect` sends
 * {@link SET_ISO_DATESTYLE} before it completes, before any other statement on the connection. A
 * server that already writes ISO (PostgreSQL's default) costs nothing more. Not the startup
 * `options` parameter: PgBouncer refuses it by default, and it tracks `DateStyle` set this way. The
 * set-up is inside the connect, so the pool's connect timeout bounds it; a failed one ends the
 * connection and fails the connect.
 *
 * When the URL no longer parses (the files cannot be read: {@link FILES_UNREADABLE}), the client's
 * `connect` fails with that error and sends nothing: the pool, or PgListen's follower, reports it
 * and tries again later, when the files may be back. Nothing is thrown.
 */
export const connectingClient = (
  url: Redacted.Redacted<string>,
  options: ConnectingOptions = {},
  pgSslMode: string | undefined = process.env["PGSSLMODE"]
): typeof Pg.Client => {
  const Base = options.base ?? Pg.Client
  const defaults = options.defaults ?? {}
  return class ConnectingClient extends Base {
    readonly #unreadable: Error | undefined
    /** the `DateStyle` the server reported last (at startup) */
    #dateStyle: string | undefined = undefined

    constructor(config?: string | Pg.ClientConfig) {
      const given = typeof config === "object" ? config : {}
      const driver = driverConfig(Redacted.value(url), pgSslMode)
      super(
        Either.isRight(driver) ? { ...defaults, ...driver.right, ...given } : { ...defaults, ...given }
      )
      this.#unreadable = Either.isLeft(driver) ? filesUnreadable() : undefined
      this.connection.on("parameterStatus", (msg: unknown) => {
        const style = reportedDateStyle(msg)
        if (style !== undefined) this.#dateStyle = style
      })
    }

    /** After the connection is made: ISO dates unless the server already writes them. */
    #setUp(done: (err: Error | undefined) => void): void {
      if (isIsoDateStyle(this.#dateStyle)) {
        done(undefined)
        return
      }
      // a connection lost meanwhile is emitted as `error` as well as failing the statement; the
      // pool listens only once the connect is done, and an unheard `error` would end the process
      const heard = (): void => {}
      this.on("error", heard)
      super.query(SET_ISO_DATESTYLE, (err: Error | null | undefined) => {
        this.off("error", heard)
        if (err === null || err === undefined) {
          done(undefined)
          return
        }
        // connected, so the pool would leave it open: end it here
        this.end(() => {})
        done(err)
      })
    }

    override connect(): Promise<void>
    override connect(callback: (err: Error) => void): void
    override connect(callback?: (err: Error) => void): Promise<void> | undefined {
      const unreadable = this.#unreadable
      if (callback === undefined) {
        if (unreadable !== undefined) return Promise.reject(unreadable)
        return super.connect().then(() =>
          new Promise<void>((resolve, reject) => this.#setUp((err) => (err === undefined ? resolve() : reject(err))))
        )
      }
      if (unreadable === undefined) {
        super.connect((err) => {
          // pg passes null when the connection is made
          if (err !== null && err !== undefined) callback(err)
          else this.#setUp((setUpErr) => callback(setUpErr ?? err))
        })
      } else queueMicrotask(() => callback(unreadable))
      return undefined
    }
  }
}
