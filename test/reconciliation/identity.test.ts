/**
 * Identity (SPEC §5.1): DID document URLs, document validation and the PDS endpoint rules, and the
 * bounded cache under TestClock (stale → served and refreshed in the background, expired →
 * refetched, invalidation, also of a lookup in flight, eviction). The transport is a fake SafeHttp
 * answering from a map.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Either, Fiber, TestClock } from "effect"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { didDoc } from "../support/fakeAtproto.js"
import { plc } from "../support/stack.js"
import { identityLayer, newFake, PLC, settle } from "./identity-fake.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)

const resolve = (did: string) => Effect.flatMap(Identity.Identity, (i) => i.resolvePds(did))
const resolveEither = (did: string) => Effect.either(resolve(did))

describe("Identity: document URLs and validation", () => {
  it("did:plc via the PLC directory; did:web host and path forms", () => {
    expect(Identity.didDocumentUrl(ALICE, PLC)).toBe(`${PLC}/${ALICE}`)
    expect(Identity.didDocumentUrl("did:web:example.com", PLC)).toBe("https://example.com/.well-known/did.json")
    expect(Identity.didDocumentUrl("did:web:example.com:u:alice", PLC)).toBe("https://example.com/u/alice/did.json")
    expect(Identity.didDocumentUrl("did:web:Example.com", PLC)).toBeUndefined()
    expect(Identity.didDocumentUrl("alice.bsky.social", PLC)).toBeUndefined()
    expect(Identity.didDocumentUrl("did:key:z6Mk", PLC)).toBeUndefined()
  })

  it("PDS endpoint URL rules", () => {
    expect(Identity.normalizePdsEndpoint("https://pds.example.com/", false)).toBe("https://pds.example.com")
    expect(Identity.normalizePdsEndpoint("https://pds.example.com:8443/base/", false)).toBe(
      "https://pds.example.com:8443/base"
    )
    expect(Identity.normalizePdsEndpoint("http://pds.example.com", false)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("http://127.0.0.1:2583", false)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("http://127.0.0.1:2583", true)).toBe("http://127.0.0.1:2583")
    expect(Identity.normalizePdsEndpoint("http://169.254.169.254", true)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("https://169.254.169.254", true)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("https://10.1.2.3", false)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("https://localhost", false)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("https://u:p@pds.example.com", false)).toBeUndefined()
    expect(Identity.normalizePdsEndpoint("https://pds.example.com/?x=1", false)).toBeUndefined()
  })

  it.effect("the PDS is the first #atproto_pds AtprotoPersonalDataServer service; bad documents are typed failures", () => {
    const fake = newFake()
    const url = (did: string) => `${PLC}/${did}`
    const dids = Array.from({ length: 12 }, (_, i) => plc(100 + i))
    const d = (i: number) => dids[i] ?? ""
    fake.answers.set(url(d(0)), {
      id: d(0),
      service: [
        "not an object",
        { id: "#atproto_labeler", type: "AtprotoLabeler", serviceEndpoint: "https://labeler.example" },
        { id: "#atproto_pds", type: "SomethingElse", serviceEndpoint: "https://wrong-type.example" },
        { id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint: { uri: "https://object.example" } },
        { id: `${d(0)}#atproto_pds`, type: "AtprotoPersonalDataServer", serviceEndpoint: "https://first.example/" },
        { id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint: "https://second.example" }
      ]
    })
    fake.answers.set(url(d(1)), didDoc(plc(999), "https://pds.example"))
    fake.answers.set(url(d(2)), { id: d(2), service: [] })
    fake.answers.set(url(d(3)), didDoc(d(3), "http://169.254.169.254"))
    fake.answers.set(url(d(4)), didDoc(d(4), "https://10.0.0.1"))
    fake.answers.set(url(d(5)), { status: 500, raw: { error: "Internal" } })
    fake.answers.set(url(d(6)), { status: 410, raw: { message: "DID not available" } })
    fake.answers.set(url(d(7)), { status: 200, raw: "{not json" })
    fake.answers.set(url(d(8)), { id: d(8), service: Array.from({ length: 65 }, () => ({})) })
    fake.answers.set(url(d(9)), didDoc(d(9), "ftp://pds.example"))
    return Effect.gen(function*() {
      expect(yield* resolve(d(0))).toBe("https://first.example")
      const kinds = yield* Effect.forEach(
        dids.slice(1, 11),
        (did) => Effect.map(resolveEither(did), (r) => (Either.isLeft(r) ? r.left.kind : "ok"))
      )
      expect(kinds).toEqual([
        "identity_invalid",
        "no_pds",
        "pds_unsafe",
        "pds_unsafe",
        "identity_unavailable",
        "did_not_found",
        "identity_invalid",
        "identity_invalid",
        "pds_unsafe",
        "did_not_found"
      ])
      const invalid = yield* resolveEither("alice.test")
      expect(Either.isLeft(invalid) && invalid.left.kind).toBe("invalid_did")
      fake.fail = true
      const down = yield* resolveEither(plc(500))
      expect(Either.isLeft(down) && down.left.kind).toBe("identity_unavailable")
      // errors carry no URL or document
      if (Either.isLeft(down)) expect(down.left.message).toBe("identity resolution failed: identity_unavailable")
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.effect("insecure development mode allows a loopback http PDS", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "http://127.0.0.1:2583"))
    return Effect.gen(function*() {
      expect(yield* resolve(ALICE)).toBe("http://127.0.0.1:2583")
    }).pipe(Effect.provide(identityLayer(fake, {}, { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" })))
  })
})

describe("Identity: the cache under TestClock", () => {
  it.scoped("fresh entries are served from the cache", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      yield* TestClock.adjust("59 minutes")
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      expect(fake.requests).toHaveLength(1)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("a stale entry is served at once and refreshed in the background (once)", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://two.example"))
      fake.gate = yield* Deferred.make<void>()
      yield* TestClock.adjust("61 minutes")
      // stale: the old answer now, a refresh in the background (only one, however many callers)
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      yield* settle
      expect(fake.requests).toHaveLength(2)
      yield* Deferred.succeed(fake.gate, undefined)
      fake.gate = undefined
      yield* settle
      expect(yield* resolve(ALICE)).toBe("https://two.example")
      expect(fake.requests).toHaveLength(2)
      expect((yield* Effect.flatMap(Identity.Identity, (i) => i.stats)).refreshes).toBe(1)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("a failed background refresh keeps serving the stale entry until it expires", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      yield* resolve(ALICE)
      fake.fail = true
      yield* TestClock.adjust("2 hours")
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      yield* settle
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      yield* settle
      expect(fake.requests.length).toBe(3)
      // expired: never served; refetched (and here it fails)
      yield* TestClock.adjust("23 hours")
      const r = yield* resolveEither(ALICE)
      expect(Either.isLeft(r) && r.left.kind).toBe("identity_unavailable")
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("an expired entry is refetched before answering", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      yield* resolve(ALICE)
      fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://two.example"))
      yield* TestClock.adjust("24 hours")
      expect(yield* resolve(ALICE)).toBe("https://two.example")
      expect(fake.requests).toHaveLength(2)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("#identity invalidates: the next lookup fetches; a refresh begun before never writes back", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      const identity = yield* Identity.Identity
      yield* resolve(ALICE)
      yield* identity.invalidate(ALICE)
      fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://two.example"))
      expect(yield* resolve(ALICE)).toBe("https://two.example")
      expect(fake.requests).toHaveLength(2)
      // a stale refresh in flight, then an invalidation, then the refresh answers (old data)
      fake.gate = yield* Deferred.make<void>()
      yield* TestClock.adjust("90 minutes")
      expect(yield* resolve(ALICE)).toBe("https://two.example")
      yield* settle
      yield* identity.invalidate(ALICE)
      const gate = fake.gate
      fake.gate = undefined
      fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://three.example"))
      yield* Deferred.succeed(gate, undefined)
      yield* settle
      expect((yield* identity.stats).entries).toBe(0)
      expect(yield* resolve(ALICE)).toBe("https://three.example")
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("a foreground lookup begun before an invalidation answers its caller but does not cache its answer", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      const identity = yield* Identity.Identity
      // a miss: the fetch is held open across an `#identity` event
      const gate = yield* Deferred.make<void>()
      fake.gate = gate
      const lookup = yield* Effect.fork(resolve(ALICE))
      yield* settle
      expect(fake.requests).toHaveLength(1)
      yield* identity.invalidate(ALICE)
      fake.gate = undefined
      yield* Deferred.succeed(gate, undefined)
      // its caller gets what it fetched (the document from before the event); the cache keeps
      // nothing of it
      expect(yield* Fiber.join(lookup)).toBe("https://one.example")
      expect((yield* identity.stats).entries).toBe(0)
      fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://two.example"))
      expect(yield* resolve(ALICE)).toBe("https://two.example")
      expect(fake.requests).toHaveLength(2)
      // a lookup begun after the invalidation is cached as before
      expect(yield* resolve(ALICE)).toBe("https://two.example")
      expect(fake.requests).toHaveLength(2)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("concurrent lookups of one DID share one fetch; one begun after an invalidation fetches anew", () => {
    const fake = newFake()
    fake.answers.set(`${PLC}/${ALICE}`, didDoc(ALICE, "https://one.example"))
    return Effect.gen(function*() {
      const identity = yield* Identity.Identity
      const gate = yield* Deferred.make<void>()
      fake.gate = gate
      const burst = yield* Effect.fork(Effect.all(Array.from({ length: 5 }, () => resolve(ALICE)), { concurrency: 5 }))
      yield* settle
      expect(fake.requests).toHaveLength(1)
      // a caller that gives up does not cancel the fetch the others wait for
      const quitter = yield* Effect.fork(resolve(ALICE))
      yield* settle
      yield* Fiber.interrupt(quitter)
      // after an invalidation, a new caller does not join the fetch begun before it
      yield* identity.invalidate(ALICE)
      const after = yield* Effect.fork(resolve(ALICE))
      yield* settle
      expect(fake.requests).toHaveLength(2)
      fake.gate = undefined
      yield* Deferred.succeed(gate, undefined)
      expect(yield* Fiber.join(burst)).toEqual(Array.from({ length: 5 }, () => "https://one.example"))
      expect(yield* Fiber.join(after)).toBe("https://one.example")
      expect(yield* resolve(ALICE)).toBe("https://one.example")
      expect(fake.requests).toHaveLength(2)
      // a failed fetch is shared too, and not cached
      fake.fail = true
      const failed = yield* Effect.all(Array.from({ length: 3 }, () => Effect.either(resolve(BOB))), {
        concurrency: 3
      })
      expect(failed.map((e) => Either.isLeft(e) && e.left.kind)).toEqual(
        Array.from({ length: 3 }, () => "identity_unavailable")
      )
      expect(fake.requests).toHaveLength(3)
    }).pipe(Effect.provide(identityLayer(fake)))
  })

  it.scoped("the cache is bounded: the least recently used entry is evicted", () => {
    const fake = newFake()
    for (const did of [ALICE, BOB, CAROL]) fake.answers.set(`${PLC}/${did}`, didDoc(did, "https://pds.example"))
    return Effect.gen(function*() {
      yield* resolve(ALICE)
      yield* resolve(BOB)
      yield* resolve(ALICE) // ALICE is now the most recently used
      yield* resolve(CAROL) // evicts BOB
      expect((yield* Effect.flatMap(Identity.Identity, (i) => i.stats)).entries).toBe(2)
      const before = fake.requests.length
      yield* resolve(ALICE)
      expect(fake.requests.length).toBe(before)
      yield* resolve(BOB)
      expect(fake.requests.length).toBe(before + 1)
    }).pipe(Effect.provide(identityLayer(fake, { maxEntries: 2 })))
  })
})
