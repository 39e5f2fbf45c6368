/**
 * The identity lookup budget of service auth (SPEC §8.2 over §5.1): a forged token names any DID,
 * a failed lookup is not cached, and the failed-authentication limit counts per client address, so
 * forged tokens naming DIDs that do not exist, from many addresses, would each make firehook fetch
 * from the PLC directory (whose 429 then holds it for every owner, the reconciler's too). The
 * lookups of unverified tokens are budgeted across the process: 100 at once, then 10 a second
 * (`IDENTITY_FETCH_BUDGET`); past it the token is answered `identity_unavailable` (as for a held
 * directory) without a fetch. A normal lookup Identity answers from its cache (`isCached`) is free:
 * a known owner whose document is cached is never refused by it; one whose document is not is charged.
 *
 * Through the ServiceAuth layer with a fake Identity: its cache (DIDs answered without a fetch) and
 * its fetches are counted. The client address is the API pipeline's (Xrpc.ts), not ServiceAuth's:
 * a budget per process holds whatever the addresses, which is the point.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, TestClock } from "effect"
import type { SigningKey } from "../../src/schemas/DidDocument.js"
import * as ServiceAuth from "../../src/services/api/ServiceAuth.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { forgedToken, HEADER, LIST, tally, verdict as verdictOf } from "./identity-budget-support.js"
import { claims, forge, keypair, newDid, newOwner, type Owner, SERVICE_DID } from "./support.js"

/** the budget's contract: a burst of 100, then 10 a second */
const BURST = 100
const PER_SECOND = 10
const PORT_DID = "did:web:hooks.example.com%3A8443"

/** A fake Identity: `cached` DIDs answer from its cache (`isCached`); any other lookup is a fetch (counted). */
const fakeIdentity = () => {
  const state = {
    fetches: 0,
    /** what the directory publishes */
    published: new Map<string, SigningKey>(),
    /** what the cache holds */
    cached: new Map<string, SigningKey>()
  }
  const resolveSigningKey = (did: string, options: { readonly fresh?: boolean } = {}) =>
    Effect.suspend(() => {
      const hit = state.cached.get(did)
      if (hit !== undefined && options.fresh !== true) return Effect.succeed<SigningKey | undefined>(hit)
      state.fetches++
      const key = state.published.get(did)
      if (key === undefined) return Effect.fail(new Identity.IdentityError({ kind: "did_not_found" }))
      state.cached.set(did, key)
      return Effect.succeed<SigningKey | undefined>(key)
    })
  const shape: Identity.IdentityShape = {
    resolvePds: () => Effect.succeed("https://pds.example"),
    resolveSigningKey,
    isCached: (did) => Effect.sync(() => state.cached.has(did)),
    invalidate: (did) => Effect.sync(() => void state.cached.delete(did)),
    stats: Effect.succeed({ entries: 0, hits: 0, misses: 0, refreshes: 0, failures: 0 })
  }
  return { state, layer: Layer.succeed(Identity.Identity, shape) }
}

const publish = (fake: ReturnType<typeof fakeIdentity>, owner: Owner & { readonly multikey: string }) =>
  fake.state.published.set(owner.did, { type: "Multikey", publicKeyMultibase: owner.multikey })

/** A token naming a DID nobody has (its signature is never checked: the lookup comes first). */
const forged = (aud: string) => forgedToken(newDid(), aud)

/** the verdicts of this file say whether a 503 tells when to retry */
const verdict = (auth: ServiceAuth.ServiceAuthShape, token: string) => verdictOf(auth, token, true)

/** A genuine token of `owner` (signed with its key) addressed to `aud`. */
const genuine = (owner: Owner, aud: string) => forge(owner.key, HEADER, claims(owner, LIST, { aud }))

/** An owner whose document the directory publishes and whose token verified once (a known owner). */
const knownOwner = (fake: ReturnType<typeof fakeIdentity>, auth: ServiceAuth.ServiceAuthShape, aud: string) =>
  Effect.gen(function*() {
    const key = yield* keypair()
    const owner = { did: newDid(), key, multikey: key.multikey }
    publish(fake, owner)
    expect(yield* verdict(auth, yield* genuine(owner, aud))).toBe("ok")
    return owner
  })

describe("the identity lookup budget of unverified tokens", () => {
  const flood = (serviceDid: string, aud: string) =>
    Effect.gen(function*() {
      // the verifier library reads the wall clock; ServiceAuth's own checks and the budget the Effect Clock
      yield* TestClock.setTime(Date.now())
      const fake = fakeIdentity()
      const auth = yield* ServiceAuth.make({ serviceDid }).pipe(Effect.provide(fake.layer))
      const owner = yield* knownOwner(fake, auth, aud)
      expect(fake.state.fetches).toBe(1)

      // 1,000 forged tokens, each naming a DID that does not exist (each from its own address)
      const verdicts = yield* Effect.forEach(
        Array.from({ length: 1000 }, () => forged(aud)),
        (t) => verdict(auth, t),
        { concurrency: 50 }
      )
      // the burst (the TestClock stands still: no refill) less the known owner's first lookup,
      // which was charged before its token verified: fetched, and refused as not found
      const fetched = fake.state.fetches - 1
      expect(fetched).toBe(BURST - 1)
      expect(tally(verdicts)).toEqual({
        "401:InvalidToken": fetched,
        "503:identity_unavailable:wait": 1000 - fetched
      })

      // the known owner still verifies, with no fetch, while the budget is spent
      const before = fake.state.fetches
      expect(yield* verdict(auth, yield* genuine(owner, aud))).toBe("ok")
      expect(fake.state.fetches).toBe(before)
      // a token naming it that its key does not verify asks for a fresh document: a fetch, budgeted too
      const other = yield* newOwner()
      const wrongKey = yield* forge(other.key, HEADER, claims(owner, LIST, { aud }))
      expect(yield* verdict(auth, wrongKey)).toBe("503:identity_unavailable:wait")
      expect(fake.state.fetches).toBe(before)

      // a second later, 10 more lookups are fetched; the rest still are not
      yield* TestClock.adjust("1 second")
      const later = yield* Effect.forEach(Array.from({ length: 50 }, () => forged(aud)), (t) => verdict(auth, t))
      expect(fake.state.fetches - before).toBe(PER_SECOND)
      expect(tally(later)).toEqual({
        "401:InvalidToken": PER_SECOND,
        "503:identity_unavailable:wait": 50 - PER_SECOND
      })
      // a whole burst again once the bucket has refilled
      yield* TestClock.adjust("10 seconds")
      const refilled = yield* Effect.forEach(Array.from({ length: 150 }, () => forged(aud)), (t) => verdict(auth, t))
      expect(tally(refilled)["401:InvalidToken"]).toBe(BURST)
      expect(fake.state.fetches - before).toBe(PER_SECOND + BURST)
    })

  it.effect("the verifier library's path: at most the burst fetched, the rest 503 without a fetch", () =>
    flood(SERVICE_DID, SERVICE_DID))

  it.effect("firehook's own steps (a did:web service DID with a port): the same budget", () =>
    flood(PORT_DID, `${PORT_DID}#firehook`))

  it.effect("a known owner whose document cannot be fetched any more is charged again", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(Date.now())
      const fake = fakeIdentity()
      const auth = yield* ServiceAuth.make({ serviceDid: SERVICE_DID }).pipe(Effect.provide(fake.layer))
      const owner = yield* knownOwner(fake, auth, SERVICE_DID)
      // the owner's DID is gone (tombstoned): its lookups fail, and failures are not cached
      fake.state.cached.delete(owner.did)
      fake.state.published.delete(owner.did)
      const verdicts: Array<string> = []
      for (let i = 0; i < 300; i++) verdicts.push(yield* verdict(auth, yield* genuine(owner, SERVICE_DID)))
      // its first verification took one token; then, Identity holding nothing for it, the rest of
      // the burst (having verified before frees no lookup), each a fetch refused as not found; then
      // no fetch
      expect(fake.state.fetches).toBe(1 + (BURST - 1))
      expect(tally(verdicts)).toEqual({
        "401:InvalidToken": BURST - 1,
        "503:identity_unavailable:wait": 300 - (BURST - 1)
      })
    }))
})
