/**
 * The store helpers every PostgreSQL store shares: value-free errors and bounded calls (SPEC §7).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, TestClock } from "effect"
import { STORE_TIMEOUT, StoreError, storeOp, storeOpWithin } from "../../src/services/platform/Persistence.js"

describe("storeOp / storeOpWithin", () => {
  it.effect("a failure becomes StoreError with the driver's code and nothing else", () =>
    Effect.gen(function*() {
      const exit = yield* Effect.exit(
        Effect.fail({ cause: { code: "40P01", detail: "value 'secret'" } }).pipe(storeOp("outbox.claim"))
      )
      expect(exit).toEqual(Exit.fail(new StoreError({ op: "outbox.claim", code: "40P01" })))
    }))

  it.effect("a call that does not answer fails as a timeout at its deadline, not before", () =>
    Effect.gen(function*() {
      const fiber = yield* Effect.fork(Effect.never.pipe(storeOpWithin("registry.markGone", "15 seconds")))
      yield* TestClock.adjust("14999 millis")
      expect(fiber.unsafePoll()).toBeNull()
      yield* TestClock.adjust("1 millis")
      const exit = yield* Fiber.await(fiber)
      expect(exit).toEqual(Exit.fail(new StoreError({ op: "registry.markGone", code: "timeout" })))
    }))

  it.effect("an answer within the deadline passes through", () =>
    Effect.gen(function*() {
      expect(yield* Effect.succeed(7).pipe(storeOpWithin("x", "1 second"))).toBe(7)
    }))

  it.effect("storeOp itself is bounded by STORE_TIMEOUT (60 s)", () =>
    Effect.gen(function*() {
      expect(STORE_TIMEOUT).toBe("60 seconds")
      const fiber = yield* Effect.fork(Effect.never.pipe(storeOp("cursors.save")))
      yield* TestClock.adjust("59 seconds")
      expect(fiber.unsafePoll()).toBeNull()
      yield* TestClock.adjust("1 second")
      expect(yield* Fiber.await(fiber)).toEqual(Exit.fail(new StoreError({ op: "cursors.save", code: "timeout" })))
    }))
})
