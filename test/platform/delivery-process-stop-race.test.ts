/**
 * The delivery child's drain against a child that exits at the same moment (a process-group SIGTERM
 * reaching both processes): the supervisor clears its handle of the child as soon as the child
 * exits, then closes that child's scope (interrupting its health look). A drain that ran in that
 * window once saw neither the child nor its exit, interrupted the loop before the exit was
 * recorded, and reported a child that had exited 1 as stopped cleanly, its pid still shown. The
 * window is held open by a health look that ends only when the test opens a gate (an HTTP look
 * being aborted takes a moment). A fake spawner under TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Option, Ref, TestClock } from "effect"
import * as DeliveryProcess from "../../src/services/platform/DeliveryProcess.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { makeFakeSpawner } from "../support/fakeDeliveryChild.js"
import { settle } from "../support/settle.js"

const READY: DeliveryProcess.HealthAnswer = { ready: true, sections: {} }

/**
 * Children whose health look answers ready at once, or, while `hold` is set, only once that gate
 * opens (not interruptible before: the look of a child that just exited keeps its scope open).
 */
const setup = Effect.gen(function*() {
  const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "10 seconds" })
  const health = yield* Health.makeWith({}).pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
  const fake = yield* makeFakeSpawner({ firstPid: 1000, answer: Option.some(READY), metrics: false })
  const hold = yield* Ref.make<Option.Option<Deferred.Deferred<void>>>(Option.none())
  const looking = yield* Ref.make(0)
  const spawner: DeliveryProcess.Spawner = {
    spawn: Effect.map(fake.spawner.spawn, (s) => ({
      ...s,
      health: Effect.flatMap(Ref.get(hold), (gate) =>
        Option.match(gate, {
          onNone: () => Effect.succeed(Option.some(READY)),
          onSome: (open) =>
            Ref.update(looking, (n) => n + 1).pipe(
              Effect.zipRight(Deferred.await(open)),
              Effect.as(Option.some(READY))
            )
        })).pipe(Effect.uninterruptible)
    }))
  }
  yield* DeliveryProcess.supervise({ spawner, pollInterval: "1 second", onGiveUp: () => Effect.void }).pipe(
    Effect.provideService(Lifecycle.Lifecycle, lifecycle),
    Effect.provideService(Health.Health, health)
  )
  yield* lifecycle.setPhase("live")
  yield* settle
  const section = Effect.map(health.report, (r) => r.body["deliveryProcess"])
  return { lifecycle, fake, hold, looking, section }
})

describe("DeliveryProcess: the drain and a child exiting at the same moment", () => {
  it.scoped("a child that exits 1 while its look is being ended makes the shutdown unclean; no pid is left", () =>
    Effect.gen(function*() {
      const { fake, hold, lifecycle, looking, section } = yield* setup
      expect(yield* section).toMatchObject({ state: "running", pid: "1000" })
      // the next look hangs until the gate opens
      const gate = yield* Deferred.make<void>()
      yield* Ref.set(hold, Option.some(gate))
      yield* TestClock.adjust("1 second")
      yield* settle
      expect(yield* Ref.get(looking)).toBe(1)
      // the child exits 1 (its own shutdown was not clean); the supervisor is closing its scope,
      // held by the look, when the parent's drain runs
      yield* fake.crash(0, 1)
      yield* settle
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      yield* Deferred.succeed(gate, undefined)
      yield* settle
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: false, unclean: ["delivery-process"] })
      expect(yield* section).toMatchObject({ state: "failed", pid: null })
      // stopping: not restarted, and the drain sent no signal to a child already gone
      expect(fake.children).toHaveLength(1)
      expect(fake.children[0]!.signals).toEqual([])
    }))

  it.scoped("the same exit 0 is clean", () =>
    Effect.gen(function*() {
      const { fake, hold, lifecycle, section } = yield* setup
      const gate = yield* Deferred.make<void>()
      yield* Ref.set(hold, Option.some(gate))
      yield* TestClock.adjust("1 second")
      yield* settle
      yield* fake.crash(0, 0)
      yield* settle
      const shutdown = yield* Effect.fork(lifecycle.shutdown)
      yield* settle
      yield* Deferred.succeed(gate, undefined)
      yield* settle
      expect(yield* Fiber.join(shutdown)).toEqual({ clean: true, unclean: [] })
      expect(yield* section).toMatchObject({ state: "stopped", pid: null })
    }))

  it.scoped("a crash the supervisor has handled before the shutdown (backoff) leaves the shutdown clean", () =>
    Effect.gen(function*() {
      const { fake, lifecycle, section } = yield* setup
      yield* fake.crash(0, 1)
      yield* settle
      expect(yield* section).toMatchObject({ state: "backoff", pid: null })
      expect(yield* lifecycle.shutdown).toEqual({ clean: true, unclean: [] })
      expect(fake.children).toHaveLength(1)
    }))
})
