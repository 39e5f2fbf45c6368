/**
 * The settle batcher (SettleBatcher.ts): a batch whose statement failed is run again (a reset
 * connection must not leave every row of the batch leased until its lease expires), except after
 * a timeout; the retries are bounded, and a batch that keeps failing fails its settles (a longer
 * outage is the settle path's to ride out: settle-outage.test.ts). When the store's scope closes,
 * every settle still waiting is answered `shutdown`, that of a batch still running included.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Exit, Fiber, Option, Scope, TestClock } from "effect"
import { SETTLE_RETRIES } from "../../src/services/delivery/DeliveryStore.js"
import { makeSettleBatcher } from "../../src/services/delivery/SettleBatcher.js"
import { StoreError } from "../../src/services/platform/Persistence.js"

interface Item {
  readonly token: string
}

/** A statement that fails with `codes` (in turn) and then applies every settle; counts its calls. */
const failingThen = (codes: ReadonlyArray<string>) => {
  let calls = 0
  const run = (items: ReadonlyArray<Item>) =>
    Effect.suspend(() => {
      const code = codes[calls]
      calls++
      return code === undefined
        ? Effect.succeed(items.map((i) => ({ lease_token: i.token })))
        : Effect.fail(new StoreError({ op: "delivery.settle", code }))
    })
  return { run, calls: () => calls }
}

/** Settle `token` and let the retries' sleeps pass on the TestClock. */
const settleWithin = (settle: (item: Item) => Effect.Effect<boolean, StoreError>, token: string) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.fork(Effect.either(settle({ token })))
    for (let i = 0; i < 10; i++) yield* TestClock.adjust(Duration.seconds(1))
    return yield* Fiber.join(fiber)
  })

describe("settle batcher", () => {
  it.scoped("a statement that failed on its connection is run again, and its settles apply", () =>
    Effect.gen(function*() {
      const stmt = failingThen(["57P01", "unknown"])
      const settle = yield* makeSettleBatcher(stmt.run)
      const result = yield* settleWithin(settle, "w:1")
      expect(Either.getOrUndefined(result)).toBe(true)
      expect(stmt.calls()).toBe(3)
    }))

  it.scoped("a statement that timed out is not run again (its bound is 15 s; the lease would not outlast it)", () =>
    Effect.gen(function*() {
      const stmt = failingThen(["timeout"])
      const settle = yield* makeSettleBatcher(stmt.run)
      const result = yield* settleWithin(settle, "w:1")
      expect(result._tag).toBe("Left")
      expect(stmt.calls()).toBe(1)
    }))

  it.scoped("the retries are bounded: a statement that keeps failing fails its settles", () =>
    Effect.gen(function*() {
      const stmt = failingThen(Array.from({ length: 10 }, () => "08006"))
      const settle = yield* makeSettleBatcher(stmt.run)
      const result = yield* settleWithin(settle, "w:1")
      expect(result._tag).toBe("Left")
      expect(stmt.calls()).toBe(1 + SETTLE_RETRIES)
    }))

  it.scoped("when the store closes, a batch still running and settles queued behind it or after are answered 'shutdown'", () =>
    Effect.gen(function*() {
      // the statement hangs (a database gone silent), so the first batch is still running at close
      let calls = 0
      const run = (_: ReadonlyArray<Item>) => Effect.suspend(() => (calls++, Effect.never))
      const storeScope = yield* Scope.make()
      const settle = yield* Scope.extend(makeSettleBatcher(run), storeScope)
      const running = yield* Effect.fork(Effect.either(settle({ token: "w:1" })))
      yield* TestClock.adjust(Duration.millis(10))
      const queued = yield* Effect.fork(Effect.either(settle({ token: "w:2" })))
      yield* TestClock.adjust(Duration.millis(10))
      expect(calls).toBe(1)
      expect(Option.isNone(yield* Fiber.poll(running))).toBe(true)
      yield* Scope.close(storeScope, Exit.void)
      const after = yield* Effect.fork(Effect.either(settle({ token: "w:3" })))
      yield* TestClock.adjust(Duration.millis(10))
      for (const fiber of [running, queued, after]) {
        const done = yield* Fiber.poll(fiber)
        const code = Option.isSome(done) && Exit.isSuccess(done.value) && Either.isLeft(done.value.value)
          ? done.value.value.left.code
          : "still waiting"
        expect(code).toBe("shutdown")
      }
      expect(calls).toBe(1)
    }))
})
