/**
 * The identity lookup budget of service auth charged by Identity's cache (SPEC §8.2 over §5.1):
 * a normal lookup is free only when Identity will answer it from its cache (`isCached`), not
 * because the issuer's token verified before. Identity's cache is an LRU (10,000 DIDs, shared with
 * the reconciler in the all-in-one process), so an owner verified an hour ago may well have been
 * evicted: a lookup of it is a fetch, and forged tokens (no valid signature needed) naming owners'
 * public DIDs must not reach the directory past the budget.
 *
 * Through the real Identity (a small cache) over a fake transport that counts the directory's
 * requests; ServiceAuth on top. And `isCached` itself: no fetch, no change to the LRU order.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, TestClock } from "effect"
import * as ServiceAuth from "../../src/services/api/ServiceAuth.js"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp, type SafeRequest } from "../../src/services/platform/http/SafeHttp.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { plc, testConfig } from "../support/stack.js"
import { forgedToken, HEADER, LIST, tally, verdict } from "./identity-budget-support.js"
import { claims, didDocument, forge, keypair, newDid, type Owner, SERVICE_DID } from "./support.js"

const PLC = "https://plc.test"
const BURST = 100

/** A fake directory: documents by DID; requests counted; a DID in `gates` answers once opened. */
const directory = () => {
  const state = {
    requests: 0,
    docs: new Map<string, unknown>(),
    gates: new Map<string, Deferred.Deferred<void>>()
  }
  const http = Layer.succeed(SafeHttp, {
    request: (req: SafeRequest) =>
      Effect.gen(function*() {
        state.requests++
        const did = req.url.slice(`${PLC}/`.length)
        const gate = state.gates.get(did)
        if (gate !== undefined) yield* Deferred.await(gate)
        const doc = state.docs.get(did)
        const body = new TextEncoder().encode(JSON.stringify(doc ?? { message: "not found" }))
        return { status: doc === undefined ? 404 : 200, headers: {}, body, truncated: false }
      })
  })
  return { state, http }
}

const identityLayer = (http: Layer.Layer<SafeHttp>, maxEntries: number) =>
  Identity.layer({ maxEntries }).pipe(
    Layer.provide(http),
    Layer.provide(Config.layerValue(testConfig({ PLC_DIRECTORY_URL: PLC })))
  )

/** A token naming `iss` whose signature is random bytes (no key needed: DIDs are public). */
const forgedFor = (iss: string) => forgedToken(iss, SERVICE_DID)

const genuine = (owner: Owner) => forge(owner.key, HEADER, claims(owner, LIST))

describe("service auth's lookup budget follows Identity's cache", () => {
  it.effect(
    "owners evicted from Identity's cache are charged: forged tokens naming them make no fetch past the budget",
    () => {
      const dir = directory()
      return Effect.gen(function*() {
        // the verifier library reads the wall clock; the budget and Identity's cache the Effect Clock
        yield* TestClock.setTime(Date.now())
        const auth = yield* ServiceAuth.make({ serviceDid: SERVICE_DID })
        // 10 owners call the API (each verifies, each a fetch); Identity keeps 3 documents
        const owners: Array<Owner> = []
        for (let i = 0; i < 10; i++) {
          const key = yield* keypair()
          const owner = { did: newDid(), key }
          dir.state.docs.set(owner.did, didDocument(owner.did, key.multikey))
          expect(yield* verdict(auth, yield* genuine(owner))).toBe("ok")
          owners.push(owner)
        }
        expect(dir.state.requests).toBe(10)
        // the rest of the burst spent by forged tokens naming DIDs nobody has (the clock stands still)
        const spent = yield* Effect.forEach(
          Array.from({ length: 150 }, () => forgedFor(newDid())),
          (t) => verdict(auth, t)
        )
        expect(tally(spent)).toEqual({ "401:InvalidToken": BURST - 10, "503:identity_unavailable": 150 - (BURST - 10) })
        const before = dir.state.requests
        expect(before).toBe(BURST)

        // forged tokens naming the known owners: not one reaches the directory
        const forged: Array<string> = []
        for (let round = 0; round < 5; round++) {
          for (const owner of owners) {
            forged.push(yield* verdict(auth, forgedFor(owner.did)))
          }
        }
        expect(dir.state.requests - before).toBe(0)
        // the 3 cached ones: their key (free) does not verify, and the fresh refetch is charged
        expect(tally(forged)).toEqual({ "503:identity_unavailable": 50 })

        // an owner Identity still holds verifies with no fetch, the budget spent
        expect(yield* verdict(auth, yield* genuine(owners[9]!))).toBe("ok")
        // an evicted one waits for the budget like any DID Identity does not hold
        expect(yield* verdict(auth, yield* genuine(owners[0]!))).toBe("503:identity_unavailable")
        expect(dir.state.requests - before).toBe(0)
        yield* TestClock.adjust("1 second")
        expect(yield* verdict(auth, yield* genuine(owners[0]!))).toBe("ok")
        expect(dir.state.requests - before).toBe(1)
      }).pipe(Effect.provide(identityLayer(dir.http, 3)))
    },
    60_000
  )
})

describe("Identity.isCached", () => {
  const isCached = (did: string) => Effect.flatMap(Identity.Identity, (i) => i.isCached!(did))
  const resolve = (did: string) => Effect.flatMap(Identity.Identity, (i) => i.resolveSigningKey(did))

  it.effect("reads the cache without a fetch and without touching the LRU order; expired is not cached", () => {
    const dir = directory()
    const [a, b, c] = [plc(1), plc(2), plc(3)]
    for (const did of [a, b, c]) {
      dir.state.docs.set(did, didDocument(did, "zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"))
    }
    return Effect.gen(function*() {
      expect(yield* isCached(a)).toBe(false)
      expect(dir.state.requests).toBe(0)
      yield* resolve(a)
      yield* resolve(b)
      expect(yield* isCached(a)).toBe(true)
      // a is still the least recently used: c evicts it
      yield* resolve(c)
      expect(yield* isCached(a)).toBe(false)
      expect(yield* isCached(b)).toBe(true)
      expect(dir.state.requests).toBe(3)
      // past IDENTITY_CACHE_MAX_AGE_MS the lookup fetches: not cached
      yield* TestClock.adjust(Identity.DEFAULT_EXPIRE_AFTER)
      expect(yield* isCached(b)).toBe(false)
      expect(dir.state.requests).toBe(3)
    }).pipe(Effect.provide(identityLayer(dir.http, 2)))
  })

  it.effect("a fetch in flight counts (a lookup would join it), unless the DID was invalidated", () => {
    const dir = directory()
    const d = plc(4)
    dir.state.docs.set(d, didDocument(d, "zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"))
    return Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      dir.state.gates.set(d, gate)
      const first = yield* Effect.fork(resolve(d))
      while (dir.state.requests === 0) yield* Effect.yieldNow()
      expect(yield* isCached(d)).toBe(true)
      yield* Effect.flatMap(Identity.Identity, (i) => i.invalidate(d))
      expect(yield* isCached(d)).toBe(false)
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(first)
      // its answer was not stored (invalidated while it ran)
      expect(yield* isCached(d)).toBe(false)
    }).pipe(Effect.provide(identityLayer(dir.http, 2)))
  })
})
