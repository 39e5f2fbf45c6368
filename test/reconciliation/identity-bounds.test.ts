/**
 * Identity's promised bounds (SPEC §5.1, §8.2) under the TestClock, with a fake transport: an
 * entry is stale from exactly `staleAfter` (1 h), background refreshes are bounded
 * (`maxBackgroundRefreshes`), a loopback or `http:` PDS is refused outside insecure development
 * mode, and a forced refetch (`fresh`) that failed still counts as begun, so a second one within
 * {@link Identity.FRESH_REFETCH_MIN_INTERVAL_MS} serves the cache instead of fetching again. A DID
 * document is read with the transport's identity limits (10 s, 1 MiB, SPEC §4.6), and only a 2xx
 * answer is a document (a redirect is not followed, and its body is not taken).
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Either, TestClock } from "effect"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { didDoc } from "../support/fakeAtproto.js"
import { plc } from "../support/stack.js"
import { identityLayer, newFake, PLC, settle } from "./identity-fake.js"

const ALICE = plc(1)
const BOB = plc(2)

const resolve = (did: string) => Effect.flatMap(Identity.Identity, (i) => i.resolvePds(did))
const fresh = (did: string) =>
  Effect.either(Effect.flatMap(Identity.Identity, (i) => i.resolveSigningKey(did, { fresh: true })))

describe("Identity bounds", () => {
  it.scoped("an entry is stale from exactly 1 h: served, and refreshed in the background", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://two.example"))
      yield* TestClock.adjust("60 minutes")
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      yield* settle
      expect(fake.requests).toHaveLength(2)
      expect(yield* resolve(ALICE)).toBe("https://two.example")
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("at most maxBackgroundRefreshes refreshes at a time; a stale entry beyond waits for a later lookup", () => {
    const fake = newFake()
    for (const did of [ALICE, BOB]) fake.answers.set(`${PLC}/${did}`, didDoc(did, "https://one.example"))
    return Effect.gen(function*() {
      yield* resolve(ALICE)
      yield* resolve(BOB)
      expect(fake.requests).toHaveLength(2)
      const gate = yield* Deferred.make<void>()
      fake.gate = gate
      yield* TestClock.adjust("90 minutes")
      // both stale and served; only one refresh may run
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      expect(yield* resolve(BOB)).toBe("https://one.example")
      yield* settle
      expect(fake.requests).toEqual([`${PLC}/${ALICE}`, `${PLC}/${BOB}`, `${PLC}/${ALICE}`])
      fake.gate = undefined
      yield* Deferred.succeed(gate, undefined)
      yield* settle
      // the slot is free again: BOB's next lookup refreshes it
      expect(yield* resolve(BOB)).toBe("https://one.example")
      yield* settle
      expect(fake.requests).toHaveLength(4)
      expect((yield* Effect.flatMap(Identity.Identity, (i) => i.stats)).refreshes).toBe(2)
    }).pipe(Effect.provide(identityLayer(fake, { maxBackgroundRefreshes: 1 })))
  })

  it.effect("outside insecure development mode a loopback or http: PDS is refused as pds_unsafe", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "http://127.0.0.1:2583"))
    fake.answers.set(`${PLC}/${BOB}`, didDoc(BOB, "http://pds.example.com"))
    return Effect.gen(function*() {
      for (const did of [ALICE, BOB]) {
        const r = yield* Effect.either(resolve(did))
        expect(Either.isLeft(r) && r.left.kind).toBe("pds_unsafe")
      }
      // each refused document is counted as a failure (health, metrics) when fetched
      expect((yield* Effect.flatMap(Identity.Identity, (i) => i.stats)).failures).toBe(2)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("a forced refetch that failed counts as begun: another within the interval serves the cache", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      yield* TestClock.adjust(Identity.FRESH_REFETCH_MIN_INTERVAL_MS)
      fake.fail = true
      const first = yield* fresh(ALICE)
      expect(Either.isLeft(first) && first.left.kind).toBe("identity_unavailable")
      expect(fake.requests).toHaveLength(2)
      // a burst of forged tokens: no request to the directory, the cached document answers
      for (let i = 0; i < 3; i++) expect(Either.isRight(yield* fresh(ALICE))).toBe(true)
      expect(fake.requests).toHaveLength(2)
      yield* TestClock.adjust(Identity.FRESH_REFETCH_MIN_INTERVAL_MS - 1)
      expect(Either.isRight(yield* fresh(ALICE))).toBe(true)
      expect(fake.requests).toHaveLength(2)
      yield* TestClock.adjust(1)
      fake.fail = false
      expect(Either.isRight(yield* fresh(ALICE))).toBe(true)
      expect(fake.requests).toHaveLength(3)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.effect("the document is read with the identity limits (10 s, 1 MiB); a 3xx with a document body is not a document", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    fake.answers.set(`${PLC}/${BOB}`, { status: 302, raw: didDoc(BOB, "https://one.example") })
    return Effect.gen(function*() {
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      expect(fake.bounds).toEqual([{ timeoutMs: 10_000, maxResponseBytes: 1024 * 1024 }])
      const r = yield* Effect.either(resolve(BOB))
      expect(Either.isLeft(r) && r.left.kind).toBe("identity_unavailable")
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("an expired entry whose refetch fails is dropped, not kept (it is never served again)", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      const identity = yield* Identity.Identity
      yield* resolve(ALICE)
      expect((yield* identity.stats).entries).toBe(1)
      fake.fail = true
      yield* TestClock.adjust("24 hours")
      const r = yield* Effect.either(resolve(ALICE))
      expect(Either.isLeft(r) && r.left.kind).toBe("identity_unavailable")
      expect((yield* identity.stats).entries).toBe(0)
    }).pipe(Effect.provide(identityLayer(fake)))
  })
})
