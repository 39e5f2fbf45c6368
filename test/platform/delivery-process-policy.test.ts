/**
 * The delivery child's supervisor, the edges the main suite (delivery-process.test.ts) leaves open:
 * the window's bound, the database-outage count (reset by another exit, only for a failed exit),
 * a child that never answered (never unresponsive; killed after 120 silent looks, never while it
 * answers 503), no pid once the child is gone, no SIGKILL from the health looks
 * once the shutdown began, no start during the shutdown, the exit of a child that stopped before the
 * drain, and the `failed` state kept through the shutdown. A fake spawner under TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Fiber, Option, Ref, TestClock } from "effect"
import * as DeliveryProcess from "../../src/services/platform/DeliveryProcess.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { makeFakeSpawner } from "../support/fakeDeliveryChild.js"
import { settle } from "../support/settle.js"

const READY: DeliveryProcess.HealthAnswer = { ready: true, sections: { delivery: { pending: 0 } } }
const UNREACHABLE = "firehook: database: could not connect (ECONNREFUSED)"

/** children that exit 0 on SIGTERM and die of SIGKILL, print `state.lastError`, answer `answer` */
const setup = (options: { readonly answer?: Option.Option<DeliveryProcess.HealthAnswer> } = {}) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
    const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
    const gaveUp = yield* Deferred.make<string>()
    const { answer, children, crash, spawner, state } = yield* makeFakeSpawner({
      firstPid: 2000,
      answer: options.answer ?? Option.some(READY),
      metrics: false
    })
    yield* DeliveryProcess.supervise({
      spawner,
      onGiveUp: (line) => Effect.asVoid(Deferred.succeed(gaveUp, line))
    }).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle), Effect.provideService(Health.Health, health))
    yield* lifecycle.setPhase("live")
    yield* settle
    const section = Effect.map(health.report, (r) => r.body["deliveryProcess"])
    return { lifecycle, gaveUp, answer, children, state, section, crash }
  })

/** advance `ms` in 1 s steps (each a health look), letting the fibers run after each */
const advance = (ms: number) =>
  Effect.gen(function*() {
    for (let t = 0; t < ms; t += 1000) {
      yield* TestClock.adjust(Duration.millis(Math.min(1000, ms - t)))
      yield* settle
    }
  })

describe("DeliveryProcess.decide: the window's bound", () => {
  it("an exit exactly one window ago no longer counts", () => {
    const earlier = [0, 1000, 2000, 3000, 4000]
    expect(DeliveryProcess.decide(DeliveryProcess.defaultPolicy, earlier, 600_000)).toEqual(
      DeliveryProcess.Decision.Restart({ delayMs: 16000, recent: [1000, 2000, 3000, 4000, 600_000] })
    )
    expect(DeliveryProcess.decide(DeliveryProcess.defaultPolicy, earlier, 599_999)._tag).toBe("GiveUp")
  })
})

describe("DeliveryProcess.supervise: the edges", () => {
  it.scoped("the database-outage count restarts from 1 s after an exit of another kind", () =>
    Effect.gen(function*() {
      const { children, crash, state } = yield* setup()
      state.lastError = UNREACHABLE
      // three unreachable exits in a row: 1, 2, 4 s
      for (const [i, delay] of [1000, 2000, 4000].entries()) {
        yield* crash(i)
        yield* settle
        yield* advance(delay)
        expect(children).toHaveLength(i + 2)
      }
      // an ordinary crash (the first of the window: 1 s), then the database is unreachable again: 1 s
      state.lastError = "firehook: boom"
      yield* crash(3)
      yield* settle
      yield* advance(1000)
      expect(children).toHaveLength(5)
      state.lastError = UNREACHABLE
      yield* crash(4)
      yield* settle
      yield* advance(1000)
      expect(children).toHaveLength(6)
    }))

  it.scoped("a child that exits 0 after an unreachable line counts toward the give-up", () =>
    Effect.gen(function*() {
      const { crash, gaveUp, state } = yield* setup()
      state.lastError = UNREACHABLE
      for (const delay of [1000, 2000, 4000, 8000, 16000].entries()) {
        yield* crash(delay[0], 0)
        yield* settle
        yield* advance(delay[1])
      }
      yield* crash(5, 0)
      yield* settle
      expect(yield* Deferred.isDone(gaveUp)).toBe(true)
      expect(yield* Deferred.await(gaveUp)).toContain("exited 6 times within 10 min")
    }))

  it.scoped("a child that never answered stays starting: never unresponsive, never killed", () =>
    Effect.gen(function*() {
      const { children, section } = yield* setup({ answer: Option.none() })
      yield* advance(45_000)
      expect(yield* section).toMatchObject({ state: "starting", pid: "2000" })
      expect(children[0]!.signals).toEqual([])
      expect(children).toHaveLength(1)
    }))

  it.scoped("a starting child silent for 120 looks is killed and restarted; the exit counts", () =>
    Effect.gen(function*() {
      const { answer, children, section } = yield* setup({ answer: Option.none() })
      // looks at 0, 1, … s: the 119th (at 118 s) leaves it alone, the 120th (at 119 s) kills it
      yield* advance(118_000)
      expect(children[0]!.signals).toEqual([])
      expect(yield* section).toMatchObject({ state: "starting", pid: "2000" })
      yield* advance(1000)
      expect(children[0]!.signals).toEqual(["SIGKILL"])
      expect(yield* section).toMatchObject({ state: "backoff", pid: null, restarts: 0 })
      // restarted after the first backoff (1 s): the kill counted as an exit
      yield* advance(1000)
      expect(children).toHaveLength(2)
      expect(yield* section).toMatchObject({ state: "starting", pid: "2001", restarts: 1 })
      yield* Ref.set(answer, Option.some(READY))
      yield* advance(1000)
      expect(yield* section).toMatchObject({ state: "running", pid: "2001" })
      // the running child is not killed for its start's silence
      yield* advance(200_000)
      expect(children[1]!.signals).toEqual([])
    }))

  it.scoped("a starting child that answers 503 is never killed", () =>
    Effect.gen(function*() {
      const { children, section } = yield* setup({ answer: Option.some({ ready: false, sections: {} }) })
      yield* advance(250_000)
      expect(yield* section).toMatchObject({ state: "starting", pid: "2000" })
      expect(children[0]!.signals).toEqual([])
      expect(children).toHaveLength(1)
    }))

  it.scoped("the health looks send no SIGKILL once the shutdown began: the drain stops the child", () =>
    Effect.gen(function*() {
      const { answer, children, lifecycle } = yield* setup()
      // an earlier stage takes 5 s; the child stopped answering 28 looks ago
      yield* lifecycle.registerStop("intake-drain", "intake", Effect.sleep("5 seconds"))
      yield* Ref.set(answer, Option.none())
      yield* advance(28_000)
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      // the 30th silent look falls within the earlier stage
      yield* advance(4000)
      expect(children[0]!.signals).toEqual([])
      yield* advance(1000)
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
      expect(children[0]!.signals).toEqual(["SIGTERM"])
      expect(children).toHaveLength(1)
    }))

  it.scoped("a backoff that ends during the shutdown starts no child", () =>
    Effect.gen(function*() {
      const { children, crash, lifecycle } = yield* setup()
      // an earlier stage takes 5 s; the child crashed just before (backoff 1 s)
      yield* lifecycle.registerStop("intake-drain", "intake", Effect.sleep("5 seconds"))
      yield* crash(0)
      yield* settle
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* advance(5000)
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
      expect(children).toHaveLength(1)
    }))

  it.scoped("a child that exits 1 on its own during the parent's shutdown makes it unclean", () =>
    Effect.gen(function*() {
      const { children, crash, lifecycle } = yield* setup()
      yield* lifecycle.registerStop(
        "intake-drain",
        "intake",
        crash(0, 1).pipe(Effect.zipRight(Effect.sleep("2 seconds")))
      )
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* advance(2000)
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: false, unclean: ["delivery-process"] })
      expect(children).toHaveLength(1)
    }))

  it.scoped("after a give-up the health section stays failed through the shutdown", () =>
    Effect.gen(function*() {
      const { crash, gaveUp, lifecycle, section } = yield* setup()
      for (const [i, delay] of [1000, 2000, 4000, 8000, 16000].entries()) {
        yield* crash(i)
        yield* settle
        yield* advance(delay)
      }
      yield* crash(5)
      yield* settle
      expect(yield* Deferred.isDone(gaveUp)).toBe(true)
      // the last child is gone: no pid
      expect(yield* section).toMatchObject({ state: "failed", pid: null })
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      expect(yield* section).toMatchObject({ state: "failed" })
      yield* Fiber.join(shutdown)
      expect(yield* section).toMatchObject({ state: "failed", pid: null })
    }))
})
