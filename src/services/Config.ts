/**
 * The one place where configuration is read (SPEC §6.5).
 *
 * Every value comes from Effect's `ConfigProvider` (the environment in production, `fromMap` in
 * tests) and is parsed strictly: integers must match `^(0|[1-9]\d*)$` and sit in a range,
 * enumerations are closed, URLs are parsed. A bad value is a `ConfigInvalid` naming the variable
 * and the rule it broke — never the value itself, so a secret can never leak through an error.
 * An empty string counts as unset (so `VAR= npm start` falls back to the default).
 */
import { Config as EffectConfig, Context, Data, Effect, Layer, LogLevel, Option, Redacted } from "effect"

export type NodeEnv = "production" | "development" | "test"
export type LogFormat = "json" | "pretty"

export interface FirehookConfigShape {
  /** `DATABASE_URL`; `None` → embedded PostgreSQL. */
  readonly databaseUrl: Option.Option<Redacted.Redacted<string>>
  /** `FIREHOOK_DATA_DIR` (default `./.firehook`). The embedded database lives in `<dir>/pg`. */
  readonly dataDir: string
  readonly healthHost: string
  readonly healthPort: number
  readonly shutdownTimeoutMs: number
  readonly logLevel: LogLevel.LogLevel
  readonly logFormat: LogFormat
  readonly nodeEnv: NodeEnv
  /** `WEBHOOK_ALLOW_INSECURE_DEV=1` together with NODE_ENV development/test. */
  readonly allowInsecureDev: boolean
  readonly registry: {
    readonly activeMax: number
    readonly ownerActiveMax: number
    readonly directDidsMax: number
    readonly backlinkDidsMax: number
  }
  readonly intake: {
    readonly queueMax: number
    readonly batchMax: number
    readonly eventMaxBytes: number
  }
}

/** A configuration value broke a rule. `variable` and `rule` never contain the offending value. */
export class ConfigInvalid extends Data.TaggedError("ConfigInvalid")<{
  readonly variable: string
  readonly rule: string
}> {
  override get message(): string {
    return `invalid configuration: ${this.variable} ${this.rule}`
  }
}

export class FirehookConfig extends Context.Tag("firehook/Config")<FirehookConfig, FirehookConfigShape>() {}

// ---------------------------------------------------------------------------------------------
// Strict readers

const INTEGER = /^(0|[1-9]\d*)$/

/** The raw value of a variable, `None` when unset or empty. Never fails with the value. */
const raw = (name: string): Effect.Effect<Option.Option<string>, ConfigInvalid> =>
  EffectConfig.option(EffectConfig.string(name)).pipe(
    Effect.mapError(() => new ConfigInvalid({ variable: name, rule: "could not be read" })),
    Effect.map(Option.filter((s) => s.length > 0))
  )

export const readInt = (name: string, def: number, min: number, max: number) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(def),
        onSome: (s) => {
          const n = INTEGER.test(s) ? Number(s) : Number.NaN
          return Number.isSafeInteger(n) && n >= min && n <= max
            ? Effect.succeed(n)
            : Effect.fail(new ConfigInvalid({ variable: name, rule: `must be an integer in ${min}..${max}` }))
        }
      })
    )
  )

export const readEnum = <const A extends string>(name: string, values: ReadonlyArray<A>, def: A) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(def),
        onSome: (s) => {
          const found = values.find((v) => v === s)
          return found !== undefined
            ? Effect.succeed(found)
            : Effect.fail(new ConfigInvalid({ variable: name, rule: `must be one of ${values.join(", ")}` }))
        }
      })
    )
  )

export const readString = (name: string, def: string, rule: { readonly test: (s: string) => boolean; readonly text: string }) =>
  raw(name).pipe(
    Effect.flatMap(
      Option.match({
        onNone: () => Effect.succeed(def),
        onSome: (s) =>
          rule.test(s) ? Effect.succeed(s) : Effect.fail(new ConfigInvalid({ variable: name, rule: rule.text }))
      })
    )
  )

const isPostgresUrl = (s: string): boolean => {
  if (s.length > 4096) return false
  if (!URL.canParse(s)) return false
  const u = new URL(s)
  return (u.protocol === "postgres:" || u.protocol === "postgresql:") && (u.hostname.length > 0 || u.searchParams.has("host"))
}

/** A host name or IP literal to listen on. */
const HOST = /^[A-Za-z0-9.:_-]{1,253}$/

const LOG_LEVELS: Record<string, LogLevel.LogLevel> = {
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
 * Load and validate the whole configuration. `isTty` picks the default log format
 * (`pretty` on a TTY, `json` otherwise).
 */
export const load = (options: { readonly isTty: boolean }): Effect.Effect<FirehookConfigShape, ConfigInvalid> =>
  Effect.gen(function* () {
    const databaseUrl = yield* raw("DATABASE_URL").pipe(
      Effect.flatMap(
        Option.match({
          onNone: () => Effect.succeed(Option.none<Redacted.Redacted<string>>()),
          onSome: (s) =>
            isPostgresUrl(s)
              ? Effect.succeed(Option.some(Redacted.make(s)))
              : Effect.fail(
                  new ConfigInvalid({ variable: "DATABASE_URL", rule: "must be a postgres:// or postgresql:// URL" })
                )
        })
      )
    )
    const dataDir = yield* readString("FIREHOOK_DATA_DIR", "./.firehook", {
      test: (s) => s.length <= 1024 && !s.includes("\0"),
      text: "must be a path of at most 1024 characters"
    })
    const healthHost = yield* readString("HEALTH_HOST", "127.0.0.1", {
      test: (s) => HOST.test(s),
      text: "must be a host name or IP address"
    })
    const healthPort = yield* readInt("HEALTH_PORT", 3003, 0, 65535)
    const shutdownTimeoutMs = yield* readInt("SHUTDOWN_TIMEOUT_MS", 30000, 1000, 120000)
    const levelName = yield* readEnum("LOG_LEVEL", Object.keys(LOG_LEVELS), "info")
    const logLevel = LOG_LEVELS[levelName] ?? LogLevel.Info
    const logFormat = yield* readEnum<LogFormat>("LOG_FORMAT", ["json", "pretty"], options.isTty ? "pretty" : "json")
    const nodeEnv = yield* readEnum<NodeEnv>("NODE_ENV", ["production", "development", "test"], "production")
    const insecureFlag = yield* readEnum("WEBHOOK_ALLOW_INSECURE_DEV", ["0", "1"], "0")
    if (insecureFlag === "1" && nodeEnv === "production") {
      return yield* Effect.fail(
        new ConfigInvalid({ variable: "WEBHOOK_ALLOW_INSECURE_DEV", rule: "requires NODE_ENV=development or test" })
      )
    }
    const registry = {
      activeMax: yield* readInt("REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", 10000, 1, 1000000),
      ownerActiveMax: yield* readInt("REGISTRY_OWNER_ACTIVE_RECORDS_MAX", 100, 1, 10000),
      directDidsMax: yield* readInt("REGISTRY_DIRECT_SCOPE_DIDS_MAX", 10000, 1, 10000),
      backlinkDidsMax: yield* readInt("REGISTRY_BACKLINK_SCOPE_DIDS_MAX", 1024, 1, 10000)
    }
    const queueMax = yield* readInt("WEBHOOK_INTAKE_QUEUE_MAX", 512, 1, 65536)
    const batchMax = yield* readInt("WEBHOOK_INTAKE_BATCH_MAX", 128, 1, 4096)
    if (batchMax > queueMax) {
      return yield* Effect.fail(
        new ConfigInvalid({ variable: "WEBHOOK_INTAKE_BATCH_MAX", rule: "must not exceed WEBHOOK_INTAKE_QUEUE_MAX" })
      )
    }
    const eventMaxBytes = yield* readInt("WEBHOOK_INTAKE_EVENT_MAX_BYTES", 1048576, 1024, 8388608)
    return {
      databaseUrl,
      dataDir,
      healthHost,
      healthPort,
      shutdownTimeoutMs,
      logLevel,
      logFormat,
      nodeEnv,
      allowInsecureDev: insecureFlag === "1",
      registry,
      intake: { queueMax, batchMax, eventMaxBytes }
    }
  })

export const layer = (options: { readonly isTty: boolean }): Layer.Layer<FirehookConfig, ConfigInvalid> =>
  Layer.effect(FirehookConfig, load(options))

/** A fixed configuration (tests and embedding programs). */
export const layerValue = (value: FirehookConfigShape): Layer.Layer<FirehookConfig> => Layer.succeed(FirehookConfig, value)
