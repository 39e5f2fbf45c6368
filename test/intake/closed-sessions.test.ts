/**
 * A source that keeps closing the connection before anything commits (a proxy's policy close, a
 * Jetstream refusing the hello, a connection reset after the upgrade), on a real socket: SPEC §3.3
 * says errors are logged at most once a minute per stream. Before, a session that ended `closed`
 * was never logged, so a stream that reconnected in a loop (health: not connected, no failure
 * kind) left the operator with nothing in the log.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, HashMap, Layer, Logger, Option, Ref } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import { eventually } from "../support/eventually.js"
import { relayConfig, relayServer } from "../support/fakeRelay.js"
import { memoryStack } from "../support/stack.js"

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
}

interface Line {
  readonly message: string
  readonly level: string
  readonly stream: unknown
  readonly kind: unknown
}

describe("a source that closes every connection before anything commits", () => {
  it.scopedLive(
    "the stream logs it (rate-limited, once for several closes) and keeps reconnecting",
    () =>
      Effect.gen(function*() {
        let connects = 0
        const { port } = yield* relayServer((socket) => {
          connects++
          socket.close(1008, "policy")
        })
        const lines = yield* Ref.make<ReadonlyArray<Line>>([])
        const logger = Logger.make(({ annotations, logLevel, message }) => {
          const get = (k: string) => HashMap.get(annotations, k).pipe(Option.getOrUndefined)
          Effect.runSync(
            Ref.update(lines, (xs) => [...xs, {
              message: String(message),
              level: logLevel.label,
              stream: get("stream"),
              kind: get("kind")
            }])
          )
        })
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make({ tuning })
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => connects >= 4), "several connections, each closed")
          const closed = (yield* Ref.get(lines)).filter((l) => l.stream === "relay" && l.kind === "closed")
          // logged, as a warning, once (the stream's warnings are limited to one a minute)
          expect(closed).toHaveLength(1)
          expect(closed[0]).toMatchObject({ level: "WARN" })
          expect(closed[0]?.message).toContain("closed")
          // health: not connected; the close is no failure kind of SPEC §6.2
          const stats = yield* intake.stats
          expect(stats.streams[0]?.state.failureKind).toBeUndefined()
        }).pipe(
          Effect.provide(
            Layer.merge(memoryStack({ config: relayConfig(port) }), Logger.replace(Logger.defaultLogger, logger))
          )
        )
      }),
    { timeout: 60_000 }
  )
})
