/**
 * Logging: structured JSON (one object per line) in production, pretty on a TTY, level from config.
 * Log lines carry annotations (counts, kinds, ids); never secrets, webhook URLs, record bodies or
 * SQL values.
 */
import { Layer, Logger, type LogLevel } from "effect"
import type { LogFormat } from "./Config.js"

export const layer = (options: { readonly format: LogFormat; readonly level: LogLevel.LogLevel }): Layer.Layer<never> =>
  Layer.mergeAll(options.format === "json" ? Logger.json : Logger.pretty, Logger.minimumLogLevel(options.level))
