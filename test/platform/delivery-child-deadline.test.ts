/**
 * The delivery child's shutdown ends before its parent's deadline. The parent's Lifecycle runs its
 * stages within one deadline; at stage `delivery` it SIGTERMs the child and SIGKILLs it at that
 * deadline. The child's own deadline used to start at its SIGTERM (now + SHUTDOWN_TIMEOUT_MS), so
 * it planned with the time the parent's earlier stages had taken more than it had, and a child
 * whose attempts ran to its grace end was SIGKILLed (unclean, its cut rows not marked).
 *
 * Now the parent writes `deadline <ms>` on the child's stdin before the SIGTERM, and the child caps
 * its Lifecycle's deadline at it less a margin, whether the line comes before its shutdown starts
 * or after. Parent side: a fake spawner under TestClock; child side: the stdin watch fed through a
 * PassThrough.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Fiber, Option, Queue, TestClock } from "effect"
import { PassThrough } from "node:stream"
import * as ChildProcess from "../../src/services/platform/ChildProcess.js"
import * as DeliveryChild from "../../src/services/platform/DeliveryChild.js"
import * as DeliveryProcess from "../../src/services/platform/DeliveryProcess.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { makeFakeSpawner } from "../support/fakeDeliveryChild.js"
import { settle } from "../support/settle.js"

const READY: DeliveryProcess.HealthAnswer = { ready: true, sections: {} }
const TIMEOUT_MS = 10_000
/** DeliveryChild.parentMarginMs(TIMEOUT_MS): 500 ms, at most an eighth of the timeout */
const MARGIN_MS = 500

describe("DeliveryProcess: the parent tells the child its deadline", () => {
  it.scoped("the deadline line is written on the child's stdin before the SIGTERM", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: TIMEOUT_MS })
      const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      const fake = yield* makeFakeSpawner({ firstPid: 1000, answer: Option.some(READY), metrics: false })
      /** what reached the child, in order: lines on its stdin and signals */
      const events: Array<string> = []
      const spawner: DeliveryProcess.Spawner = {
        spawn: Effect.map(fake.spawner.spawn, (s) => ({
          ...s,
          handle: {
            ...s.handle,
            kill: (signal) => Effect.zipRight(Effect.sync(() => events.push(signal)), s.handle.kill(signal)),
            tell: (line) => Effect.sync(() => void events.push(`line ${line}`))
          }
        }))
      }
      yield* DeliveryProcess.supervise({ spawner, pollInterval: "1 second", onGiveUp: () => Effect.void }).pipe(
        Effect.provideService(Lifecycle.Lifecycle, lifecycle),
        Effect.provideService(Health.Health, health)
      )
      yield* lifecycle.setPhase("live")
      yield* settle
      // an earlier stage (the intake's drain) takes 3 s of the shutdown's 10
      yield* lifecycle.registerStop("intake-drain", "slow-intake", Effect.sleep("3 seconds"))
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      yield* TestClock.adjust("3 seconds")
      yield* settle
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
      // the shutdown started at 0: its deadline is 10 000, 7 s after the child's SIGTERM
      expect(events).toEqual(["line deadline 10000", "SIGTERM"])
    }))

  it("the line's format and the margin", () => {
    expect(DeliveryChild.parentMarginMs(TIMEOUT_MS)).toBe(MARGIN_MS)
    expect(DeliveryChild.parentMarginMs(1000)).toBe(125)
    expect(DeliveryProcess.deadlineLine(1_765_000_000_123)).toBe("deadline 1765000000123")
    expect(DeliveryProcess.parseDeadline("deadline 1765000000123")).toEqual(Option.some(1_765_000_000_123))
    expect(Option.isNone(DeliveryProcess.parseDeadline("deadline soon"))).toBe(true)
    expect(Option.isNone(DeliveryProcess.parseDeadline("deadline -5"))).toBe(true)
    expect(Option.isNone(DeliveryProcess.parseDeadline("stop"))).toBe(true)
    expect(Buffer.byteLength(`${DeliveryProcess.deadlineLine(Number.MAX_SAFE_INTEGER)}\n`))
      .toBeLessThanOrEqual(ChildProcess.LINE_BYTES)
  })
})

/**
 * The child's stdin watch on a PassThrough: each line handled by DeliveryChild.onParentLine, then
 * offered to `seen` (so the test waits for it); `gone` once the watch saw the parent gone.
 */
const watch = (lifecycle: Lifecycle.LifecycleShape) =>
  Effect.gen(function*() {
    const input = new PassThrough()
    const seen = yield* Queue.unbounded<string>()
    const gone = yield* Deferred.make<void>()
    const apply = DeliveryChild.onParentLine(lifecycle, TIMEOUT_MS)
    yield* Effect.forkScoped(ChildProcess.watchParent({
      onGone: Deferred.succeed(gone, undefined),
      onLine: (line) => Effect.zipRight(apply(line), Queue.offer(seen, line)),
      input
    }))
    yield* settle
    return { input, seen, gone }
  })

describe("DeliveryChild: the child caps its shutdown deadline at its parent's", () => {
  it.scoped("a line before the shutdown: the shutdown's deadline is the parent's less the margin", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: TIMEOUT_MS })
      const { input, seen } = yield* watch(lifecycle)
      // the parent's shutdown started at 0 (deadline 10 000); its earlier stages took 3 s
      yield* TestClock.adjust("3 seconds")
      input.write(`${DeliveryProcess.deadlineLine(TIMEOUT_MS)}\n`)
      expect(yield* Queue.take(seen)).toBe("deadline 10000")
      /** what the delivery worker reads when it computes its grace */
      const read = yield* Deferred.make<Option.Option<number>>()
      yield* lifecycle.registerStop(
        "delivery",
        "delivery",
        Effect.flatMap(lifecycle.deadline, (d) => Deferred.succeed(read, d))
      )
      // a part that never stops is cut at the capped deadline, not at 3 000 + 10 000
      yield* lifecycle.registerStop("scheduler-await", "hung", Effect.never)
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(yield* Deferred.await(read)).toEqual(Option.some(TIMEOUT_MS - MARGIN_MS))
      yield* TestClock.adjust(TIMEOUT_MS - MARGIN_MS - 3000 - 1)
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(shutdown))).toBe(true)
      yield* TestClock.adjust(1)
      yield* settle
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: false, unclean: ["hung"] })
    }))

  it.scoped("a line after the shutdown started: the deadline moves forward", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: TIMEOUT_MS })
      const { input, seen } = yield* watch(lifecycle)
      yield* TestClock.adjust("3 seconds")
      const gate = yield* Deferred.make<void>()
      yield* lifecycle.registerStop("startup", "startup", Deferred.await(gate))
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(yield* lifecycle.deadline).toEqual(Option.some(3000 + TIMEOUT_MS))
      input.write(`${DeliveryProcess.deadlineLine(TIMEOUT_MS)}\n`)
      yield* Queue.take(seen)
      expect(yield* lifecycle.deadline).toEqual(Option.some(TIMEOUT_MS - MARGIN_MS))
      // a later deadline never moves it back
      input.write(`${DeliveryProcess.deadlineLine(TIMEOUT_MS * 5)}\n`)
      yield* Queue.take(seen)
      expect(yield* lifecycle.deadline).toEqual(Option.some(TIMEOUT_MS - MARGIN_MS))
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
    }))

  it.scoped("the SIGTERM seen before the line: the shutdown's first stage waits for it, the delivery stage sees it", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: TIMEOUT_MS })
      const input = new PassThrough()
      // never ended here: the parent gone would SIGTERM this process
      yield* Effect.forkScoped(DeliveryChild.followParent(lifecycle, TIMEOUT_MS, input))
      yield* settle
      yield* TestClock.adjust("3 seconds")
      const read = yield* Deferred.make<Option.Option<number>>()
      yield* lifecycle.registerStop(
        "delivery",
        "delivery",
        Effect.flatMap(lifecycle.deadline, (d) => Deferred.succeed(read, d))
      )
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(yield* Deferred.isDone(read)).toBe(false)
      input.write(`${DeliveryProcess.deadlineLine(TIMEOUT_MS)}\n`)
      expect(yield* Deferred.await(read)).toEqual(Option.some(TIMEOUT_MS - MARGIN_MS))
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
    }))

  it.scoped("no line (a SIGTERM from elsewhere): the first stage waits at most DEADLINE_LINE_WAIT", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: TIMEOUT_MS })
      yield* Effect.forkScoped(DeliveryChild.followParent(lifecycle, TIMEOUT_MS, new PassThrough()))
      yield* settle
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(Option.isNone(yield* Fiber.poll(shutdown))).toBe(true)
      yield* TestClock.adjust(DeliveryChild.DEADLINE_LINE_WAIT)
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
      expect(yield* lifecycle.deadline).toEqual(Option.some(TIMEOUT_MS))
    }))

  it.scoped("malformed and overlong lines are ignored, a line split across writes is read; lines are not the parent gone, the pipe's end is", () =>
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: TIMEOUT_MS })
      const { gone, input, seen } = yield* watch(lifecycle)
      input.write("deadline soon\n")
      expect(yield* Queue.take(seen)).toBe("deadline soon")
      // longer than LINE_BYTES: dropped whole, the deadline at its end included
      input.write(`${"x".repeat(200)}`)
      input.write(" deadline 1\n")
      input.write("dead")
      input.write("line 4000\n")
      expect(yield* Queue.take(seen)).toBe("deadline 4000")
      expect(yield* Queue.size(seen)).toBe(0)
      expect(yield* Deferred.isDone(gone)).toBe(false)
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(yield* lifecycle.deadline).toEqual(Option.some(4000 - MARGIN_MS))
      yield* Fiber.join(shutdown)
      input.end()
      yield* Deferred.await(gone)
    }))

  it("the line splitter holds at most LINE_BYTES", () => {
    const split = ChildProcess.lineSplitter(8)
    expect(split(Buffer.from("abc\nde"))).toEqual(["abc"])
    expect(split(Buffer.from("f\n"))).toEqual(["def"])
    // 7 bytes and the newline fit; 8 do not
    expect(split(Buffer.from("1234567\n12345678\nok\n"))).toEqual(["1234567", "ok"])
    expect(split(Buffer.from("123456789"))).toEqual([])
    expect(split(Buffer.from("0\nnext\n"))).toEqual(["next"])
  })

  it.live("the Lifecycle's clock is the wall clock the two processes share", () =>
    Effect.gen(function*() {
      const before = Date.now()
      const now = yield* Clock.currentTimeMillis
      expect(now).toBeGreaterThanOrEqual(before)
      expect(now).toBeLessThanOrEqual(Date.now())
    }))
})
