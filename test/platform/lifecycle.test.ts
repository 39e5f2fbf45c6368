import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, HashMap, Logger, Option, Ref, TestClock } from "effect"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"

describe("Lifecycle", () => {
  it.effect("starts in `starting` and moves through the phases", () =>
    Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "30 seconds" })
      expect(yield* l.phase).toBe("starting")
      yield* l.setPhase("reconciling-live")
      expect(yield* l.phase).toBe("reconciling-live")
      yield* l.setPhase("live")
      const report = yield* l.shutdown
      expect(report).toEqual({ clean: true, unclean: [] })
      expect(yield* l.phase).toBe("stopped")
      // once stopped, a late setPhase does not move it back
      yield* l.setPhase("live")
      expect(yield* l.phase).toBe("stopped")
    }))

  it.effect("a phase the guard refuses (during or after shutdown) is not logged as the new phase", () => {
    const phases: Array<unknown> = []
    const capture = Logger.make(({ annotations, message }) => {
      if (Array.isArray(message) ? message[0] === "phase" : message === "phase") {
        phases.push(HashMap.get(annotations, "phase").pipe(Option.getOrUndefined))
      }
    })
    return Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "30 seconds" })
      yield* l.setPhase("live")
      yield* l.shutdown
      yield* l.setPhase("live")
      expect(phases).toEqual(["live"])
    }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))
  })

  it.effect("runs the stages in the order of SPEC §6.3, whatever the registration order", () =>
    Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "30 seconds" })
      const order = yield* Ref.make<ReadonlyArray<string>>([])
      const mark = (name: string) => Ref.update(order, (xs) => [...xs, name])
      yield* l.registerStop("shared-clients", "db", mark("db"))
      yield* l.registerStop("delivery", "delivery", mark("delivery"))
      yield* l.registerStop("http", "http", mark("http"))
      yield* l.registerStop("intake-drain", "intake-drain", mark("intake-drain"))
      yield* l.registerStop("backfill", "backfill", mark("backfill"))
      yield* l.registerStop("intake-stop", "intake-stop", mark("intake-stop"))
      yield* l.registerStop("scheduler-await", "scheduler-await", mark("scheduler-await"))
      yield* l.registerStop("scheduler-begin", "scheduler-begin", mark("scheduler-begin"))
      yield* l.shutdown
      expect(yield* Ref.get(order)).toEqual([
        "backfill",
        "scheduler-begin",
        "http",
        "intake-stop",
        "intake-drain",
        "delivery",
        "scheduler-await",
        "db"
      ])
    }))

  it.effect("a hung drain is cut at the deadline (TestClock) and the shutdown is not clean", () =>
    Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
      const interrupted = yield* Deferred.make<void>()
      const sharedClosed = yield* Ref.make(false)
      yield* l.registerStop(
        "delivery",
        "hung",
        Effect.never.pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
      )
      yield* l.registerStop("shared-clients", "db", Ref.set(sharedClosed, true))
      const fiber = yield* Effect.fork(l.shutdown)
      yield* TestClock.adjust(Duration.seconds(4))
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      expect(yield* l.phase).toBe("stopping")
      yield* TestClock.adjust(Duration.seconds(1))
      const report = yield* Fiber.join(fiber)
      expect(report).toEqual({ clean: false, unclean: ["hung"] })
      expect(yield* Deferred.isDone(interrupted)).toBe(true)
      // shared clients stay open after an unclean shutdown
      expect(yield* Ref.get(sharedClosed)).toBe(false)
      expect(yield* l.isClean).toBe(false)
      expect(yield* l.phase).toBe("failed")
    }))

  it.effect("the deadline is shared: later parts get only what is left", () =>
    Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
      yield* l.registerStop("http", "slow", Effect.sleep("8 seconds"))
      yield* l.registerStop("delivery", "slower", Effect.sleep("3 seconds"))
      const fiber = yield* Effect.fork(l.shutdown)
      yield* TestClock.adjust(Duration.seconds(10))
      const report = yield* Fiber.join(fiber)
      expect(report).toEqual({ clean: false, unclean: ["slower"] })
    }))

  it.effect("a failing drain makes the shutdown unclean", () =>
    Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
      yield* l.registerStop("intake-stop", "broken", Effect.fail("boom"))
      expect((yield* l.shutdown).clean).toBe(false)
    }))

  it.effect("shutdown is idempotent: concurrent and repeated calls share one run", () =>
    Effect.gen(function*() {
      const l = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
      const runs = yield* Ref.make(0)
      yield* l.registerStop(
        "http",
        "counted",
        Ref.update(runs, (n) => n + 1).pipe(Effect.zipRight(Effect.sleep("1 second")))
      )
      const a = yield* Effect.fork(l.shutdown)
      const b = yield* Effect.fork(l.shutdown)
      yield* TestClock.adjust(Duration.seconds(1))
      const [ra, rb] = [yield* Fiber.join(a), yield* Fiber.join(b)]
      const rc = yield* l.shutdown
      expect(ra).toEqual(rb)
      expect(rc).toEqual(ra)
      expect(yield* Ref.get(runs)).toBe(1)
    }))
})
