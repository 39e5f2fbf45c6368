/**
 * Shared pieces of the Redis publisher's tests (publisher*.test.ts): a Health over a fresh
 * Lifecycle, a publisher built in it, the TestClock driven until a condition holds, a parsed Redis
 * URL, and a port nothing listens on.
 */
import { type Duration, Effect, Either, TestClock } from "effect"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { freePort } from "../support/proc.js"

/** A Health over a fresh Lifecycle (5 s shutdown timeout), and that Lifecycle. */
export const newHealth = Effect.gen(function*() {
  const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
  const health = yield* Health.make.pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
  return { lifecycle, health }
})

/** A publisher that registers its health section in `health`. */
export const publisherIn = (health: Health.HealthShape, options: Publisher.PublisherOptions) =>
  Publisher.make(options).pipe(Effect.provideService(Health.Health, health))

/** Advance the TestClock in `step`s until `done` holds (each step lets socket I/O progress). */
export const driveUntil = (done: Effect.Effect<boolean>, step: Duration.DurationInput, maxSteps = 5_000) =>
  Effect.gen(function*() {
    for (let i = 0; i < maxSteps; i++) {
      if (yield* done) return i
      yield* TestClock.adjust(step)
    }
    return yield* Effect.dieMessage("condition not reached")
  })

/** A Redis URL parsed for `Publisher.connect` (a test URL that does not parse throws). */
export const target = (url: string) => Either.getOrThrowWith(Publisher.parseRedisUrl(url), (e) => new Error(e.message))

/** A port nothing listens on. */
export const closedPort = Effect.promise(freePort)
