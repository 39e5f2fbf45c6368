/**
 * DID documents as firehook reads them (SPEC §5.1, §8.2): the envelope's bounds, the PDS service
 * entry and the `#atproto` signing key, at the edges of their rules. Identity's own tests
 * (test/reconciliation/identity.test.ts, test/api/signing-keys.test.ts) cover the common cases
 * through the resolver.
 */
import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { atprotoSigningKey, DidDocument, pdsEndpoint } from "../../src/schemas/DidDocument.js"

const DID = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const PDS = "AtprotoPersonalDataServer"
const KEY = "zQ3shokFTS3brHcDQrn82RUDfCZESWL1ZdCEJwekUDPQiYBme"
/** The base58btc alphabet (no 0, O, I, l). */
const BASE58 = "123456789ABCDEFGHJKLMNPQRSTUVWXYZabcdefghijkmnopqrstuvwxyz"

const decodes = (u: unknown): boolean => Either.isRight(Schema.decodeUnknownEither(DidDocument)(u))
const pdsOf = (service: ReadonlyArray<unknown>) =>
  pdsEndpoint(Schema.decodeUnknownSync(DidDocument)({ id: DID, service }))
const keyOf = (verificationMethod: ReadonlyArray<unknown>) =>
  atprotoSigningKey(Schema.decodeUnknownSync(DidDocument)({ id: DID, verificationMethod }))
const pds = (serviceEndpoint: string, id = "#atproto_pds", type = PDS) => ({ id, type, serviceEndpoint })
const method = (publicKeyMultibase: string, type = "Multikey", id = `${DID}#atproto`) => ({
  id,
  type,
  controller: DID,
  publicKeyMultibase
})

describe("DidDocument: the envelope's bounds", () => {
  it("at most 64 services and 64 verification methods", () => {
    const many = (n: number) => Array.from({ length: n }, () => ({}))
    expect(decodes({ id: DID, service: many(64) })).toBe(true)
    expect(decodes({ id: DID, service: many(65) })).toBe(false)
    expect(decodes({ id: DID, verificationMethod: many(64) })).toBe(true)
    expect(decodes({ id: DID, verificationMethod: many(65) })).toBe(false)
  })

  it("an id of 2,048 characters (the longest did:web, SPEC §1.1), not 2,049", () => {
    const web = (n: number) => "did:web:" + "a".repeat(n - "did:web:".length)
    expect(decodes({ id: web(2048) })).toBe(true)
    expect(decodes({ id: web(2049) })).toBe(false)
  })
})

describe("DidDocument.pdsEndpoint", () => {
  it("the id must end with #atproto_pds exactly; the type is matched case-sensitively", () => {
    const second = pds("https://second.example")
    for (
      const first of [
        pds("https://a.example", "#atproto_pds_old"),
        pds("https://b.example", "#atproto_pdsx"),
        pds("https://c.example", "#other_atproto_pds"),
        pds("https://d.example", `${DID}_atproto_pds`),
        pds("https://e.example", "#atproto_pds", "atprotopersonaldataserver"),
        pds("https://f.example", "#atproto_pds", "AtprotoPersonalDataServerX")
      ]
    ) {
      expect([first, pdsOf([first, second])]).toEqual([first, "https://second.example"])
    }
    expect(pdsOf([pds("https://first.example", `${DID}#atproto_pds`), second])).toBe("https://first.example")
  })

  it("an entry whose id or endpoint is longer than 2,048 characters is skipped, not chosen", () => {
    const long = "https://pds.example/" + "a".repeat(2048 - "https://pds.example/".length)
    expect(pdsOf([pds(long)])).toBe(long)
    expect(pdsOf([pds(`${long}a`), pds("https://second.example")])).toBe("https://second.example")
    const id = (n: number) => "x".repeat(n - "#atproto_pds".length) + "#atproto_pds"
    expect(pdsOf([pds("https://a.example", id(2048))])).toBe("https://a.example")
    expect(pdsOf([pds("https://a.example", id(2049)), pds("https://second.example")])).toBe("https://second.example")
  })
})

describe("DidDocument.atprotoSigningKey", () => {
  it("the first #atproto method with a key decides: an invalid key there is no key, even if a valid one follows", () => {
    expect(keyOf([method("zQ3sh0"), method(KEY)])).toBeUndefined()
    expect(keyOf([method(KEY, ""), method(KEY)])).toBeUndefined()
    expect(keyOf([method(KEY), method("zQ3sh0")])).toEqual({ type: "Multikey", publicKeyMultibase: KEY })
  })

  it("publicKeyMultibase is z then 1 to 255 base58btc characters", () => {
    expect(keyOf([method(`z${BASE58}`)])?.publicKeyMultibase).toBe(`z${BASE58}`)
    expect(keyOf([method("z1")])?.publicKeyMultibase).toBe("z1")
    expect(keyOf([method("z" + "z".repeat(255))])?.publicKeyMultibase).toBe("z" + "z".repeat(255))
    expect(keyOf([method("z" + "z".repeat(256))])).toBeUndefined()
    expect(keyOf([method("z")])).toBeUndefined()
    for (const c of ["0", "O", "I", "l", "+", "/", "=", "-", "_"]) {
      expect([c, keyOf([method(`${KEY}${c}`)])]).toEqual([c, undefined])
      expect([c, keyOf([method(`z${c}${KEY.slice(1)}`)])]).toEqual([c, undefined])
    }
    // the multibase prefix is the first character, nothing before it
    expect(keyOf([method(`u${KEY}`)])).toBeUndefined()
    expect(keyOf([method(`Z${KEY.slice(1)}`)])).toBeUndefined()
  })

  it("the key's type: 1 to 64 characters", () => {
    expect(keyOf([method(KEY, "t".repeat(64))])?.type).toBe("t".repeat(64))
    expect(keyOf([method(KEY, "t".repeat(65))])).toBeUndefined()
    expect(keyOf([method(KEY, "")])).toBeUndefined()
    expect(keyOf([method(KEY, "EcdsaSecp256k1VerificationKey2019")])).toEqual({
      type: "EcdsaSecp256k1VerificationKey2019",
      publicKeyMultibase: KEY
    })
  })

  it("the id is #atproto or <did>#atproto, nothing else ending so", () => {
    expect(keyOf([method(KEY, "Multikey", "#atproto")])?.publicKeyMultibase).toBe(KEY)
    for (const id of ["#Atproto", `${DID}#atproto_label`, `${DID}x#atproto`, "atproto", `${DID}#atproto#atproto`]) {
      expect([id, keyOf([method(KEY, "Multikey", id)])]).toEqual([id, undefined])
    }
  })
})
