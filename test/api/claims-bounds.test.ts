/**
 * The time and size bounds of a service token's claims (SPEC §8.2), at their edges: `exp` in the
 * future within 30 s of skew and at most 1 h ahead, `iat` at most 30 s ahead, `jti` present (≤ 128
 * printable ASCII characters, firehook's bound). `checkClaims` is pure: `now` is exact here.
 */
import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { type JwtClaims, type JwtHeader, MAX_TOKEN_LENGTH, readServiceJwt } from "../../src/schemas/ServiceJwt.js"
import { checkClaims } from "../../src/services/api/ServiceAuth.js"

const NOW = 1_800_000_000
const NSID = "place.wisp.v2.secret.list"
const AUD = "did:web:firehook.example"
const claims = (c: Partial<JwtClaims>): JwtClaims => ({
  iss: "did:plc:ewvi7nxzyoun6zhxrhs64oiz",
  aud: AUD,
  exp: NOW + 60,
  lxm: NSID,
  jti: "j1",
  ...c
})
const verdict = (c: Partial<JwtClaims>, header: JwtHeader = { alg: "ES256K" }): string => {
  const r = checkClaims(
    { header, claims: claims(c) },
    { nowMs: NOW * 1000, nsid: NSID, audiences: [AUD] }
  )
  return Either.isRight(r) ? "ok" : `${r.left.error}/${r.left.reason}`
}

describe("service token claims at their bounds (SPEC §8.2)", () => {
  it("exp: at most 1 h ahead (3,600 s accepted, 3,601 refused)", () => {
    expect(verdict({ exp: NOW + 3600 })).toBe("ok")
    expect(verdict({ exp: NOW + 3601 })).toBe("InvalidToken/exp_too_far")
  })

  it("exp: in the future with 30 s of skew (30 s ago accepted, 31 s ago expired)", () => {
    expect(verdict({ exp: NOW - 30 })).toBe("ok")
    expect(verdict({ exp: NOW - 31 })).toBe("ExpiredToken/expired")
  })

  it("iat: at most 30 s ahead", () => {
    expect(verdict({ iat: NOW + 30 })).toBe("ok")
    expect(verdict({ iat: NOW + 31 })).toBe("InvalidToken/iat_future")
  })

  it("jti: present, 1–128 printable ASCII characters", () => {
    expect(verdict({ jti: "x".repeat(128) })).toBe("ok")
    expect(verdict({ jti: "x".repeat(129) })).toBe("InvalidToken/jti")
    expect(verdict({ jti: "" })).toBe("InvalidToken/jti")
    expect(verdict({ jti: undefined })).toBe("InvalidToken/jti")
    // printable means no space or control character either
    expect(verdict({ jti: "a b" })).toBe("InvalidToken/jti")
    expect(verdict({ jti: "a\tb" })).toBe("InvalidToken/jti")
    expect(verdict({ jti: "~!" })).toBe("ok")
  })

  // refused before any DID resolution: the verifier library would refuse these too, but only
  // after resolving the issuer's document (a forged token naming any DID would make firehook fetch)
  it("alg ES256K or ES256 only; iss a canonical DID; lxm the called method", () => {
    expect(verdict({}, { alg: "ES256" })).toBe("ok")
    for (const alg of ["none", "HS256", "RS256", "es256k", "EdDSA"]) {
      expect([alg, verdict({}, { alg })]).toEqual([alg, "InvalidToken/alg"])
    }
    expect(verdict({ iss: "did:plc:ewvi7nxzyoun6zhxrhs64oiz#atproto_pds" })).toBe("InvalidToken/iss")
    expect(verdict({ iss: "not-a-did" })).toBe("InvalidToken/iss")
    expect(verdict({ lxm: "place.wisp.v2.secret.create" })).toBe("InvalidToken/lxm")
    expect(verdict({ lxm: undefined })).toBe("InvalidToken/lxm_missing")
    expect(verdict({ aud: "did:web:other.example" })).toBe("InvalidToken/aud")
  })

  it("a token is read only as three segments with a signature, at most 8,192 characters", () => {
    const b64 = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url")
    const head = b64({ alg: "ES256K", typ: "JWT" })
    const token = (c: object, sig = "c2ln") => `${head}.${b64(claims(c))}.${sig}`
    expect(readServiceJwt(token({}))).toBeDefined()
    expect(readServiceJwt(token({}, ""))).toBeUndefined()
    expect(readServiceJwt(`${token({})}.c2ln`)).toBeUndefined()
    // the bound is on the whole token, whatever its claims
    expect(readServiceJwt(token({ pad: "x".repeat(1000) }))).toBeDefined()
    expect(readServiceJwt(token({ pad: "x".repeat(MAX_TOKEN_LENGTH) }))).toBeUndefined()
    // exactly at the bound: read; one character more: not
    const unsigned = token({ pad: "x".repeat(5000) }, "")
    const at = `${unsigned}${"A".repeat(8192 - unsigned.length)}`
    expect(at.length).toBe(8192)
    expect(readServiceJwt(at)).toBeDefined()
    expect(readServiceJwt(`${at}x`)).toBeUndefined()
  })

  it("claims are read only with their types: times whole seconds 0 to 2^53 − 1, exp required, strings bounded", () => {
    const b64 = (o: object) => Buffer.from(JSON.stringify(o)).toString("base64url")
    const read = (c: object, header: object = { alg: "ES256K", typ: "JWT" }) =>
      readServiceJwt(`${b64(header)}.${b64({ ...claims({}), ...c })}.c2ln`)
    expect(read({ iat: NOW, nbf: NOW })).toBeDefined()
    const refused: ReadonlyArray<readonly [string, object, object?]> = [
      ["no exp", { exp: undefined }],
      ["exp fractional", { exp: NOW + 60.5 }],
      ["exp negative", { exp: -1 }],
      ["exp beyond 2^53 − 1", { exp: 2 ** 53 }],
      ["exp a string", { exp: String(NOW + 60) }],
      ["iat fractional", { iat: NOW + 0.5 }],
      ["nbf negative", { nbf: -5 }],
      ["iss a number", { iss: 5 }],
      ["aud an array", { aud: [AUD] }],
      ["lxm over 512 characters", { lxm: `${NSID}.${"a".repeat(512)}` }],
      ["jti over 1,024 characters", { jti: "j".repeat(1025) }],
      ["alg a number", {}, { alg: 256 }],
      ["typ a number", {}, { alg: "ES256K", typ: 1 }],
      ["kid over 256 characters", {}, { alg: "ES256K", kid: `#${"k".repeat(256)}` }]
    ]
    for (const [what, c, header] of refused) expect([what, read(c, header)]).toEqual([what, undefined])
    // at the string bounds: read
    expect(read({ jti: "j".repeat(1024), lxm: "a".repeat(512) })).toBeDefined()
  })
})
