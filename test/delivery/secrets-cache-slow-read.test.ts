/**
 * The resolve cache's lifetime is counted from when the store read STARTED (its snapshot), not from
 * when it returned. A read that is slow to come back (a loaded database: the statement bound is
 * 15 s) and saw the envelope from before another process's rotation keeps the old token only for what
 * is left of the TTL, so the documented "a rotation made by the CLI reaches a running service within
 * 10 s" holds; a read that took the whole TTL is not cached at all. Driven by the TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Either, Fiber, TestClock } from "effect"
import { randomBytes } from "node:crypto"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import { make as makeSecrets, makeMemoryStore, type SecretsStoreShape } from "../../src/services/delivery/Secrets.js"
import { plc } from "../support/stack.js"

const ALICE = plc(1)

const newRing = () => Either.getOrThrow(SecretBox.makeKeyring(Uint8Array.from(randomBytes(32)), []))

/**
 * A memory store whose next `get` (once `gate()` is called) takes its snapshot, signals `read`, and
 * only returns once `release` is completed: a slow read.
 */
const slowStore = Effect.gen(function*() {
  const base = yield* makeMemoryStore
  const read = yield* Deferred.make<void>()
  const release = yield* Deferred.make<void>()
  let gated = false
  const store: SecretsStoreShape = {
    ...base,
    get: (o, n) =>
      gated
        ? base.get(o, n).pipe(
          Effect.tap(() => {
            gated = false
            return Deferred.succeed(read, undefined)
          }),
          Effect.zipLeft(Deferred.await(release))
        )
        : base.get(o, n)
  }
  return {
    base,
    store,
    gate: () => {
      gated = true
    },
    read: Deferred.await(read),
    release: Deferred.succeed(release, undefined)
  }
})

describe("Secrets.resolve cache: lifetime counted from the store read's start", () => {
  it.effect("another process's rotation right after a slow read's snapshot is seen 10 s after it, not 10 s after the read returned", () =>
    Effect.gen(function*() {
      const kr = newRing()
      const slow = yield* slowStore
      const worker = yield* makeSecrets(slow.store, kr, { cacheTtl: "10 seconds" })
      const old = (yield* worker.create(ALICE, "slow")).token
      slow.gate()
      const inFlight = yield* Effect.fork(worker.resolve(ALICE, "slow"))
      yield* slow.read
      // the CLI (another process) rotates right after the snapshot: t = 0
      const other = "N".repeat(40)
      yield* slow.base.update(ALICE, "slow", Either.getOrThrow(SecretBox.sealRandom(kr, other)))
      // the read comes back 5 s later with the old envelope
      yield* TestClock.adjust("5 seconds")
      yield* slow.release
      expect(yield* Fiber.join(inFlight)).toBe(old)
      // it was cached, for what is left of the TTL: 1 ms before the end still the old token …
      yield* TestClock.adjust("4999 millis")
      expect(yield* worker.resolve(ALICE, "slow"), "cached until 10 s after the read started").toBe(old)
      // … and 10 s after the read started (and the rotation) the new one
      yield* TestClock.adjust("1 millis")
      expect(yield* worker.resolve(ALICE, "slow"), "old token served 10 s after the rotation").toBe(other)
    }))

  it.effect("a read that took the whole TTL is not cached: the next resolve reads again", () =>
    Effect.gen(function*() {
      const kr = newRing()
      const slow = yield* slowStore
      const worker = yield* makeSecrets(slow.store, kr, { cacheTtl: "10 seconds" })
      const old = (yield* worker.create(ALICE, "slower")).token
      slow.gate()
      const inFlight = yield* Effect.fork(worker.resolve(ALICE, "slower"))
      yield* slow.read
      const other = "M".repeat(40)
      yield* slow.base.update(ALICE, "slower", Either.getOrThrow(SecretBox.sealRandom(kr, other)))
      // 12 s: within the 15 s statement bound, past the TTL
      yield* TestClock.adjust("12 seconds")
      yield* slow.release
      expect(yield* Fiber.join(inFlight)).toBe(old)
      expect(yield* worker.resolve(ALICE, "slower"), "a read older than the TTL was cached").toBe(other)
    }))

  it.effect("a fast read is cached for the full TTL, as before", () =>
    Effect.gen(function*() {
      const kr = newRing()
      const slow = yield* slowStore
      const worker = yield* makeSecrets(slow.store, kr, { cacheTtl: "10 seconds" })
      const old = (yield* worker.create(ALICE, "fast")).token
      expect(yield* worker.resolve(ALICE, "fast")).toBe(old) // now cached
      const other = "F".repeat(40)
      yield* slow.base.update(ALICE, "fast", Either.getOrThrow(SecretBox.sealRandom(kr, other)))
      yield* TestClock.adjust("9999 millis")
      expect(yield* worker.resolve(ALICE, "fast")).toBe(old)
      yield* TestClock.adjust("1 millis")
      expect(yield* worker.resolve(ALICE, "fast")).toBe(other)
    }))
})
