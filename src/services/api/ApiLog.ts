/**
 * The owners' API's recurring warnings. A store that cannot answer (a database outage) fails every
 * call; its warning is written at most once a minute per message and code (RateLimitedLog), not
 * once per call: callers may make 120 calls a minute per DID and may have many DIDs.
 *
 * @since 0.1.0
 */
import { Context, Effect, Option } from "effect"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"

/** The API's limiter of recurring warnings (one per API instance, provided to every call). */
export class ApiLog extends Context.Tag("firehook/ApiLog")<ApiLog, RateLimitedLog.RateLimitedLog>() {}

/**
 * Log `message` (warning) with `annotations` (kinds and codes only), at most once a minute per
 * message and `code` when the call runs under the API (else every time), with `suppressed`.
 */
export const recurringWarning = (
  message: string,
  annotations: { readonly code: string } & Record<string, string>
): Effect.Effect<void> =>
  Effect.flatMap(Effect.serviceOption(ApiLog), (log) => {
    const write = (suppressed: number) =>
      Effect.logWarning(message).pipe(Effect.annotateLogs({ ...annotations, suppressed }))
    return Option.isSome(log) ? log.value.run(`${message}:${annotations.code}`, write) : write(0)
  })
