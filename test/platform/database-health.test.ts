/**
 * The `database` section of /health (DatabaseHealth.ts): ready while a ping answered within the
 * last 6 s, whether the database refuses (the ping fails) or is frozen (the ping never answers);
 * ready again at the first answer. TestClock, a fake ping.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Layer, Ref, TestClock } from "effect"
import * as DatabaseHealth from "../../src/services/platform/DatabaseHealth.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"

const HealthLive = Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" })))

type Mode = "answer" | "refuse" | "freeze"

const section = Effect.gen(function*() {
  const health = yield* Health.Health
  const report = yield* health.report
  return report.body["database"]
})

/** advance the clock by `s` seconds, one second at a time (the ping loop runs in between) */
const advance = (s: number) => Effect.forEach(Array.from({ length: s }), () => TestClock.adjust("1 second"))

describe("DatabaseHealth", () => {
  it.scoped("a refusing or frozen database turns the section not ready within 6 s; the first answer brings it back", () =>
    Effect.gen(function*() {
      const mode = yield* Ref.make<Mode>("answer")
      const never = yield* Deferred.make<void>()
      const pings = yield* Ref.make(0)
      const ping = Effect.flatMap(
        Ref.getAndUpdate(pings, (n) => n + 1),
        () =>
          Effect.flatMap(
            Ref.get(mode),
            (m) => m === "answer" ? Effect.void : m === "refuse" ? Effect.fail("ECONNREFUSED") : Deferred.await(never)
          )
      )
      yield* DatabaseHealth.registerWith(ping)
      const health = yield* Health.Health
      const readyOf = Effect.map(health.report, (r) => (r.body["database"] as { reachable: boolean }).reachable)
      expect(yield* section).toEqual({ reachable: true })
      yield* advance(10)
      expect(yield* readyOf).toBe(true)
      // refused: not ready once no ping answered for more than 6 s
      yield* Ref.set(mode, "refuse")
      yield* advance(6)
      expect(yield* readyOf).toBe(true)
      yield* advance(3)
      expect(yield* readyOf).toBe(false)
      expect(yield* section).toEqual({ reachable: false })
      yield* Ref.set(mode, "answer")
      yield* advance(2)
      expect(yield* readyOf).toBe(true)
      // frozen: the ping never answers; its bound (2 s) ends it and the next one waits too
      yield* Ref.set(mode, "freeze")
      yield* advance(10)
      expect(yield* readyOf).toBe(false)
      const during = yield* Ref.get(pings)
      yield* advance(8)
      // one ping at a time, each bounded: the loop goes on (2 s bound + 2 s spacing)
      expect((yield* Ref.get(pings)) - during).toBeGreaterThanOrEqual(1)
      yield* Ref.set(mode, "answer")
      yield* advance(4)
      expect(yield* readyOf).toBe(true)
    }).pipe(Effect.provide(HealthLive)))

  it.scoped("the section gates the report's readiness", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      yield* lifecycle.setPhase("live")
      const up = yield* Ref.make(true)
      yield* DatabaseHealth.registerWith(Effect.flatMap(Ref.get(up), (ok) => (ok ? Effect.void : Effect.fail("down"))))
      const health = yield* Health.Health
      expect((yield* health.report).ready).toBe(true)
      yield* Ref.set(up, false)
      yield* advance(Duration.toSeconds(DatabaseHealth.UNREACHABLE_AFTER) + 3)
      expect((yield* health.report).ready).toBe(false)
    }).pipe(Effect.provide(HealthLive)))
})
