/**
 * Capture the log lines (message + annotations, each as one JSON string) of the effect run with
 * `layer` and the fibers it forks; `lines` reads what was logged so far. Used by the Redis
 * publisher's tests to check what a failure logs (and that it never logs the URL or password).
 */
import { Effect, Logger, Ref } from "effect"

export const captureLogs = Effect.gen(function*() {
  const lines = yield* Ref.make<ReadonlyArray<string>>([])
  const logger = Logger.make(({ message, annotations }) => {
    const text = JSON.stringify({ message, annotations: Object.fromEntries(annotations) })
    Effect.runSync(Ref.update(lines, (xs) => [...xs, text]))
  })
  return { lines: Ref.get(lines), layer: Logger.replace(Logger.defaultLogger, logger) }
})
