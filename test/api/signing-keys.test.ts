/**
 * Identity's signing keys (SPEC §8.2 over §5.1): the `#atproto` verification method of a DID
 * document, validated and cached with the document's PDS; `fresh` refetches once (key rotation),
 * at most once per DID within FRESH_REFETCH_MIN_INTERVAL_MS. The transport is a fake SafeHttp.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Schema, TestClock } from "effect"
import { atprotoSigningKey, DidDocument } from "../../src/schemas/DidDocument.js"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp, type SafeRequest } from "../../src/services/platform/http/SafeHttp.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import { plc, testConfig } from "../support/stack.js"

const PLC = "https://plc.test"
const ALICE = plc(1)
const KEY_A = "zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"
const KEY_B = "zDnaembgSGUhZULN2Caob4HLJPaxBh92N7rtH21TErzqf8HQo"

const doc = (did: string, keys: ReadonlyArray<unknown>, pds: string | null = "https://pds.example") => ({
  id: did,
  verificationMethod: keys,
  service: pds === null ? [] : [{ id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint: pds }]
})
const multikey = (did: string, key: string, id = "#atproto") => ({
  id: id.startsWith("#") ? `${did}${id}` : id,
  type: "Multikey",
  controller: did,
  publicKeyMultibase: key
})

const fake = { requests: [] as Array<string>, answers: new Map<string, unknown>() }
const fakeHttp = Layer.succeed(SafeHttp, {
  request: (req: SafeRequest) =>
    Effect.sync(() => {
      fake.requests.push(req.url)
      const answer = fake.answers.get(req.url)
      const body = new TextEncoder().encode(JSON.stringify(answer ?? { message: "not found" }))
      return { status: answer === undefined ? 404 : 200, headers: {}, body, truncated: false }
    })
})
const layer = Identity.layer().pipe(
  Layer.provide(fakeHttp),
  Layer.provide(Config.layerValue(testConfig({ PLC_DIRECTORY_URL: PLC })))
)
const key = (did: string, fresh = false) =>
  Effect.flatMap(Identity.Identity, (i) => i.resolveSigningKey(did, { fresh }))

describe("DidDocument.atprotoSigningKey", () => {
  const decode = (u: unknown) => atprotoSigningKey(Schema.decodeUnknownSync(DidDocument)(u))
  it("the first #atproto (or <did>#atproto) method with a multibase key", () => {
    expect(decode(doc(ALICE, [multikey(ALICE, KEY_B, "#atproto_label"), multikey(ALICE, KEY_A)]))).toEqual({
      type: "Multikey",
      publicKeyMultibase: KEY_A
    })
    expect(decode(doc(ALICE, [{ id: "#atproto", type: "Multikey", publicKeyMultibase: KEY_B }]))).toEqual({
      type: "Multikey",
      publicKeyMultibase: KEY_B
    })
    // entries that do not decode are skipped; one without a key is skipped
    expect(
      decode(doc(ALICE, ["x", { id: "#atproto", type: "Multikey" }, { id: 5 }, multikey(ALICE, KEY_A)]))
    ).toEqual({ type: "Multikey", publicKeyMultibase: KEY_A })
    // another DID's #atproto, a key that is not base58btc multibase, none at all
    expect(decode(doc(ALICE, [multikey(plc(2), KEY_A)]))).toBeUndefined()
    expect(decode(doc(ALICE, [multikey(ALICE, "uAAAA")]))).toBeUndefined()
    expect(decode(doc(ALICE, [multikey(ALICE, "z0OIl")]))).toBeUndefined()
    expect(decode({ id: ALICE })).toBeUndefined()
  })
})

describe("Identity.resolveSigningKey", () => {
  it.scoped("cached with the document; fresh refetches at most once per interval", () =>
    Effect.gen(function*() {
      fake.requests.length = 0
      fake.answers.set(`${PLC}/${ALICE}`, doc(ALICE, [multikey(ALICE, KEY_A)]))
      expect(yield* key(ALICE)).toEqual({ type: "Multikey", publicKeyMultibase: KEY_A })
      // the PDS comes from the same fetch
      expect(yield* Effect.flatMap(Identity.Identity, (i) => i.resolvePds(ALICE))).toBe("https://pds.example")
      expect(fake.requests).toHaveLength(1)
      // the owner rotates the key: the cache still has the old one
      fake.answers.set(`${PLC}/${ALICE}`, doc(ALICE, [multikey(ALICE, KEY_B)]))
      expect((yield* key(ALICE))?.publicKeyMultibase).toBe(KEY_A)
      // fresh right after a fetch: served from the cache (no hammering)
      expect((yield* key(ALICE, true))?.publicKeyMultibase).toBe(KEY_A)
      expect(fake.requests).toHaveLength(1)
      yield* TestClock.adjust(Identity.FRESH_REFETCH_MIN_INTERVAL_MS)
      expect((yield* key(ALICE, true))?.publicKeyMultibase).toBe(KEY_B)
      expect(fake.requests).toHaveLength(2)
      // and the refetched document is what the cache serves now
      expect((yield* key(ALICE))?.publicKeyMultibase).toBe(KEY_B)
      expect((yield* key(ALICE, true))?.publicKeyMultibase).toBe(KEY_B)
      expect(fake.requests).toHaveLength(2)
    }).pipe(Effect.provide(layer)))

  it.scoped("a document without a key answers undefined; without a PDS it still has its key", () =>
    Effect.gen(function*() {
      const bob = plc(2)
      const carol = plc(3)
      fake.answers.set(`${PLC}/${bob}`, doc(bob, []))
      fake.answers.set(`${PLC}/${carol}`, doc(carol, [multikey(carol, KEY_A)], null))
      expect(yield* key(bob)).toBeUndefined()
      expect((yield* key(carol))?.publicKeyMultibase).toBe(KEY_A)
      const pds = yield* Effect.either(Effect.flatMap(Identity.Identity, (i) => i.resolvePds(carol)))
      expect(Either.isLeft(pds) && pds.left.kind).toBe("no_pds")
      const unknown = yield* Effect.either(key(plc(4)))
      expect(Either.isLeft(unknown) && unknown.left.kind).toBe("did_not_found")
    }).pipe(Effect.provide(layer)))
})
