/**
 * The per-attempt read barrier of the delivery worker (src/services/delivery/FreshReader.ts): every get is
 * answered by a lookup that started after it; gets made together share one lookup; equal keys are
 * looked up once; a failed lookup fails its waiters only; batches are bounded.
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Either, Exit, Fiber } from "effect"
import * as FreshReader from "../../src/services/delivery/FreshReader.js"

/** A store whose lookups wait for the test to open a gate, and which records what they read. */
const gatedStore = Effect.gen(function*() {
  const state = { version: 0, fail: false }
  const lookups: Array<{ readonly keys: ReadonlyArray<string>; readonly version: number }> = []
  let gate = yield* Deferred.make<void>()
  const started = { count: 0 }
  const lookup = (keys: ReadonlyArray<string>) =>
    Effect.gen(function*() {
      // the value is read when the lookup starts, like a statement's snapshot
      const version = state.version
      const fail = state.fail
      lookups.push({ keys, version })
      started.count++
      yield* Deferred.await(gate)
      if (fail) return yield* Effect.fail("db down" as const)
      return keys.map((k) => `${k}@${version}`)
    })
  const open = Effect.gen(function*() {
    const g = gate
    gate = yield* Deferred.make<void>()
    yield* Deferred.succeed(g, undefined)
  })
  return { state, lookups, lookup, open, started }
})

const waitFor = (cond: () => boolean) =>
  Effect.gen(function*() {
    for (let i = 0; i < 1_000 && !cond(); i++) yield* Effect.yieldNow()
    expect(cond()).toBe(true)
  })

describe("FreshReader", () => {
  it.scoped("a get made while a lookup runs is answered by the next lookup, which sees the change", () =>
    Effect.gen(function*() {
      const store = yield* gatedStore
      const reader = yield* FreshReader.make({ lookup: store.lookup, keyOf: (k: string) => k, maxBatch: 10 })
      const first = yield* Effect.fork(reader.get("a"))
      yield* waitFor(() => store.started.count === 1)
      // the subscription changes after the first lookup started; then an attempt starts
      store.state.version = 1
      const second = yield* Effect.fork(reader.get("a"))
      yield* Effect.yieldNow()
      yield* store.open
      expect(yield* Fiber.join(first)).toBe("a@0")
      yield* waitFor(() => store.started.count === 2)
      yield* store.open
      expect(yield* Fiber.join(second)).toBe("a@1")
      expect(store.lookups.map((l) => l.keys)).toEqual([["a"], ["a"]])
    }))

  it.scoped("gets made together share one lookup; equal keys are looked up once; answers keep their order", () =>
    Effect.gen(function*() {
      const store = yield* gatedStore
      const reader = yield* FreshReader.make({ lookup: store.lookup, keyOf: (k: string) => k, maxBatch: 10 })
      const fibers = yield* Effect.forEach(["a", "b", "a", "c"], (k) => Effect.fork(reader.get(k)))
      yield* waitFor(() => store.started.count === 1)
      yield* store.open
      const values = yield* Effect.forEach(fibers, Fiber.join)
      expect(values).toEqual(["a@0", "b@0", "a@0", "c@0"])
      expect(store.lookups.map((l) => l.keys)).toEqual([["a", "b", "c"]])
      expect(reader.lookups()).toBe(1)
    }))

  it.scoped("a lookup reads at most maxBatch distinct keys; the rest go to the next lookup", () =>
    Effect.gen(function*() {
      const store = yield* gatedStore
      const reader = yield* FreshReader.make({ lookup: store.lookup, keyOf: (k: string) => k, maxBatch: 2 })
      const fibers = yield* Effect.forEach(["a", "b", "a", "c", "d"], (k) => Effect.fork(reader.get(k)))
      yield* waitFor(() => store.started.count === 1)
      yield* store.open
      yield* waitFor(() => store.started.count === 2)
      yield* store.open
      const values = yield* Effect.forEach(fibers, Fiber.join)
      expect(values).toEqual(["a@0", "b@0", "a@0", "c@0", "d@0"])
      expect(store.lookups.map((l) => l.keys)).toEqual([["a", "b"], ["c", "d"]])
    }))

  it.scoped("a failed lookup fails its own waiters only", () =>
    Effect.gen(function*() {
      const store = yield* gatedStore
      const reader = yield* FreshReader.make({ lookup: store.lookup, keyOf: (k: string) => k, maxBatch: 10 })
      store.state.fail = true
      const failing = yield* Effect.fork(Effect.either(reader.get("a")))
      yield* waitFor(() => store.started.count === 1)
      store.state.fail = false
      const later = yield* Effect.fork(Effect.either(reader.get("b")))
      yield* Effect.yieldNow()
      yield* store.open
      const a = yield* Fiber.join(failing)
      expect(Either.isLeft(a) && a.left).toBe("db down")
      yield* waitFor(() => store.started.count === 2)
      yield* store.open
      expect(yield* Fiber.join(later)).toEqual(Either.right("b@0"))
    }))

  it.effect("waiters are interrupted when the reader's scope closes", () =>
    Effect.gen(function*() {
      const store = yield* gatedStore
      const result = yield* Effect.scoped(
        Effect.gen(function*() {
          const reader = yield* FreshReader.make({ lookup: store.lookup, keyOf: (k: string) => k, maxBatch: 10 })
          const fiber = yield* Effect.forkDaemon(reader.get("a"))
          yield* waitFor(() => store.started.count === 1)
          return fiber
        })
      )
      const exit = yield* Fiber.await(result)
      expect(exit._tag).toBe("Failure")
    }))
})

describe("FreshReader: a short answer (policy audit)", () => {
  it.scoped("a lookup that answers fewer values than keys is a defect for the waiters left without one", () =>
    Effect.gen(function*() {
      const reader = yield* FreshReader.make({
        lookup: (_keys: ReadonlyArray<string>) => Effect.succeed<ReadonlyArray<string>>([]),
        keyOf: (k: string) => k,
        maxBatch: 10
      })
      const exit = yield* Effect.exit(reader.get("a"))
      expect(Exit.isFailure(exit) && Cause.isDie(exit.cause)).toBe(true)
    }))
})
