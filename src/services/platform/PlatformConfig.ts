/**
 * The platform's configuration (SPEC §6.5): database, data directory, health listener, shutdown,
 * logging, the insecure development mode, the process's roles (`FIREHOOK_ROLES`, RolesConfig) and
 * where delivery runs (`DELIVERY_PROCESS`, DeliveryProcessConfig). Each variable's name, default and rule live here once;
 * `load` reads them in the order `Config.load` always has.
 */
import { Effect, LogLevel } from "effect"
import type { FirehookConfigShape } from "./Config.js"
import {
  ConfigInvalid,
  DATABASE_URL_MAX_LENGTH,
  isPostgresUrl,
  listenHost,
  readEnum,
  readEnumVar,
  readIntVar,
  readListenHost,
  readRedactedAll,
  readStringVar,
  urlLength,
  urlText
} from "./ConfigRead.js"
import * as DatabaseSsl from "./DatabaseSsl.js"
import * as DeliveryProcessConfig from "./DeliveryProcessConfig.js"
import * as RolesConfig from "./RolesConfig.js"

export const NODE_ENVS = ["production", "development", "test"] as const
export type NodeEnv = (typeof NODE_ENVS)[number]
export const LOG_FORMATS = ["json", "pretty"] as const
export type LogFormat = (typeof LOG_FORMATS)[number]
export const LOG_LEVEL_NAMES = ["trace", "debug", "info", "warn", "warning", "error", "fatal", "none"] as const
export type LogLevelName = (typeof LOG_LEVEL_NAMES)[number]

const LOG_LEVELS: { readonly [K in LogLevelName]: LogLevel.LogLevel } = {
  trace: LogLevel.Trace,
  debug: LogLevel.Debug,
  info: LogLevel.Info,
  warn: LogLevel.Warning,
  warning: LogLevel.Warning,
  error: LogLevel.Error,
  fatal: LogLevel.Fatal,
  none: LogLevel.None
}

/**
 * `DATABASE_URL`: unset → embedded PostgreSQL. No whitespace or control character, at most 4096
 * characters, a postgres:// or postgresql:// URL, a known `sslmode` and a known `ssl` value
 * (DatabaseSsl.ts), in that order.
 */
export const databaseUrl = {
  env: "DATABASE_URL",
  rules: [
    urlText,
    urlLength(DATABASE_URL_MAX_LENGTH),
    { test: isPostgresUrl, text: "must be a postgres:// or postgresql:// URL" },
    DatabaseSsl.sslModeRule,
    DatabaseSsl.sslParamRule
  ]
} as const

/**
 * `DATABASE_PREPARED_STATEMENTS` ∈ {0, 1}: `1` (default) sends frequent statements as named prepared
 * statements (PreparedStatements.ts); `0` for a pooler in transaction mode that cannot keep them.
 */
export const databasePreparedStatements = {
  env: "DATABASE_PREPARED_STATEMENTS",
  default: "1",
  values: ["0", "1"]
} as const

/** A control character anywhere, or whitespace (ASCII or Unicode, a BOM too) at either end. */
const STRAY_IN_PATH = /\p{Cc}|^\s|\s$/u

/**
 * `FIREHOOK_DATA_DIR`: at most 1024 characters, no control character (NUL, CR, LF, tab) anywhere and
 * no whitespace at either end (a stray space from an env file or a quoted value would otherwise
 * name a new, empty directory beside the real one). Spaces inside a path are allowed.
 */
export const dataDir = {
  env: "FIREHOOK_DATA_DIR",
  default: "./.firehook",
  rule: {
    test: (s: string) => s.length <= 1024 && !STRAY_IN_PATH.test(s),
    text: "must be a path of at most 1024 characters, without control characters or leading or trailing whitespace"
  }
} as const

/** `HEALTH_HOST`: an IP literal or `localhost` (the rule `API_HOST` shares, in ConfigRead). */
export const healthHost = { env: "HEALTH_HOST", default: "127.0.0.1", rule: listenHost } as const

export const healthPort = { env: "HEALTH_PORT", default: 3003, min: 0, max: 65535 } as const

export const shutdownTimeoutMs = { env: "SHUTDOWN_TIMEOUT_MS", default: 30000, min: 1000, max: 120000 } as const

export const logLevel = { env: "LOG_LEVEL", default: "info", values: LOG_LEVEL_NAMES } as const

/** `LOG_FORMAT`: `defaultTty` on a TTY, `default` otherwise. */
export const logFormat = { env: "LOG_FORMAT", default: "json", defaultTty: "pretty", values: LOG_FORMATS } as const

export const nodeEnv = { env: "NODE_ENV", default: "production", values: NODE_ENVS } as const

/** `WEBHOOK_ALLOW_INSECURE_DEV=1` is accepted only with NODE_ENV development or test. */
export const allowInsecureDev = { env: "WEBHOOK_ALLOW_INSECURE_DEV", default: "0", values: ["0", "1"] } as const

/** The platform's part of the configuration (the top-level fields of `FirehookConfigShape`). */
export type PlatformSection = Pick<
  FirehookConfigShape,
  | "databaseUrl"
  | "databasePreparedStatements"
  | "dataDir"
  | "healthHost"
  | "healthPort"
  | "shutdownTimeoutMs"
  | "logLevel"
  | "logFormat"
  | "nodeEnv"
  | "allowInsecureDev"
  | "roles"
  | "deliveryProcess"
>

/**
 * `NODE_ENV` and the insecure development mode (`WEBHOOK_ALLOW_INSECURE_DEV` ∈ {0, 1}; `1` is
 * refused with production).
 */
export const loadDevMode: Effect.Effect<
  { readonly nodeEnv: NodeEnv; readonly allowInsecureDev: boolean },
  ConfigInvalid
> = Effect.gen(function*() {
  const env = yield* readEnumVar(nodeEnv)
  const flag = yield* readEnumVar(allowInsecureDev)
  if (flag === "1" && env === "production") {
    return yield* Effect.fail(
      new ConfigInvalid({ variable: allowInsecureDev.env, rule: "requires NODE_ENV=development or test" })
    )
  }
  return { nodeEnv: env, allowInsecureDev: flag === "1" }
})

/** `isTty` picks the default log format (`pretty` on a TTY, `json` otherwise). */
export const load = (options: { readonly isTty: boolean }): Effect.Effect<PlatformSection, ConfigInvalid> =>
  Effect.gen(function*() {
    const url = yield* readRedactedAll(databaseUrl.env, databaseUrl.rules)
    const prepared = yield* readEnumVar(databasePreparedStatements)
    const dir = yield* readStringVar(dataDir)
    const host = yield* readListenHost(healthHost)
    const port = yield* readIntVar(healthPort)
    const shutdown = yield* readIntVar(shutdownTimeoutMs)
    const levelName = yield* readEnumVar(logLevel)
    const format = yield* readEnum(
      logFormat.env,
      logFormat.values,
      options.isTty ? logFormat.defaultTty : logFormat.default
    )
    const devMode = yield* loadDevMode
    const roles = yield* RolesConfig.load
    const deliveryProcess = yield* DeliveryProcessConfig.load
    return {
      databaseUrl: url,
      databasePreparedStatements: prepared === "1",
      dataDir: dir,
      healthHost: host,
      healthPort: port,
      shutdownTimeoutMs: shutdown,
      logLevel: LOG_LEVELS[levelName],
      logFormat: format,
      nodeEnv: devMode.nodeEnv,
      allowInsecureDev: devMode.allowInsecureDev,
      roles,
      deliveryProcess
    }
  })
