import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { createCipheriv, createHash, randomBytes } from "node:crypto"
import {
  emptyKeyring,
  generateToken,
  keyId,
  type Keyring,
  makeKeyring,
  open,
  parseKey,
  parseKeyList,
  seal,
  sealRandom,
  SecretUnavailable,
  tokenFromBytes,
  validateCallerToken
} from "../../src/services/delivery/SecretBox.js"

const keyA = Uint8Array.from({ length: 32 }, (_, i) => i)
const keyB = Uint8Array.from({ length: 32 }, (_, i) => 255 - i)
const nonce = Uint8Array.from({ length: 12 }, (_, i) => i + 100)
const SECRET = "whsec_c3VwZXItc2VjcmV0LXRva2VuLXZhbHVlLTEyMzQ1Njc4OQ=="

const ring = (current: Uint8Array | undefined, previous: ReadonlyArray<Uint8Array> = []): Keyring =>
  Either.getOrThrow(makeKeyring(current, previous))

const sealed = (k: Keyring, plaintext: string, n: Uint8Array = nonce): string =>
  Either.getOrThrow(seal(k, plaintext, n))

/** Replaces part `index` of an envelope. */
const withPart = (envelope: string, index: number, value: string): string => {
  const parts = envelope.split(".")
  parts[index] = value
  return parts.join(".")
}

/** Flips one bit of a base64url part. */
const flip = (part: string): string => {
  const bytes = Buffer.from(part, "base64url")
  bytes[0] = (bytes[0] ?? 0) ^ 1
  return bytes.toString("base64url")
}

const expectGeneric = (result: Either.Either<string, SecretUnavailable>) => {
  expect(Either.isLeft(result)).toBe(true)
  if (Either.isLeft(result)) {
    expect(result.left).toBeInstanceOf(SecretUnavailable)
    expect(result.left._tag).toBe("SecretUnavailable")
    expect(result.left.message).toBe("secret unavailable")
    expect(result.left).toEqual(new SecretUnavailable())
  }
}

describe("keys", () => {
  it("keyId is the first 16 chars of base64url(sha256(key))", () => {
    expect(keyId(keyA)).toBe(createHash("sha256").update(keyA).digest("base64url").slice(0, 16))
    expect(keyId(keyA)).toHaveLength(16)
  })

  it("parseKey accepts base64, base64url (padded or not) and 64 hex chars of a 32-byte key", () => {
    const raw = Buffer.from(randomBytes(32))
    const forms = [
      raw.toString("base64"),
      raw.toString("base64").replace(/=$/, ""),
      raw.toString("base64url"),
      raw.toString("base64url") + "=",
      raw.toString("hex"),
      raw.toString("hex").toUpperCase(),
      `  ${raw.toString("base64")}\n`
    ]
    for (const form of forms) {
      const parsed = parseKey(form)
      expect(Either.isRight(parsed)).toBe(true)
      if (Either.isRight(parsed)) expect(Buffer.from(parsed.right)).toEqual(raw)
    }
  })

  it("parseKey rejects wrong sizes, mixed alphabets, non-canonical encodings and junk", () => {
    const bad = [
      "",
      Buffer.from(randomBytes(31)).toString("base64"),
      Buffer.from(randomBytes(33)).toString("base64"),
      Buffer.from(randomBytes(16)).toString("hex"),
      "g".repeat(64),
      "+" + "_" + "A".repeat(41),
      "A".repeat(42) + "B", // last char carries non-zero padding bits
      "A".repeat(43) + "==",
      "not a key at all"
    ]
    for (const s of bad) expect(parseKey(s)).toEqual(Either.left("invalid_key"))
  })

  it("parseKey ignores whitespace around a hex key too", () => {
    const raw = Buffer.from(randomBytes(32))
    for (const form of [` ${raw.toString("hex")}\n`, `\t${raw.toString("hex").toUpperCase()}  `]) {
      const parsed = parseKey(form)
      expect(Either.isRight(parsed), JSON.stringify(form)).toBe(true)
      if (Either.isRight(parsed)) expect(Buffer.from(parsed.right)).toEqual(raw)
    }
  })

  it("parseKeyList reads a comma-separated list and fails on any bad item", () => {
    const a = Buffer.from(keyA).toString("base64")
    const b = Buffer.from(keyB).toString("hex")
    const parsed = parseKeyList(` ${a}, ,${b},`)
    expect(Either.isRight(parsed)).toBe(true)
    if (Either.isRight(parsed)) {
      expect(parsed.right.map((k) => Buffer.from(k))).toEqual([Buffer.from(keyA), Buffer.from(keyB)])
    }
    expect(parseKeyList("")).toEqual(Either.right([]))
    expect(parseKeyList(`${a},nope`)).toEqual(Either.left("invalid_key"))
  })

  it("makeKeyring bounds previous keys at 8 and requires 32-byte keys", () => {
    const nine = Array.from({ length: 9 }, () => Uint8Array.from(randomBytes(32)))
    expect(Either.isRight(makeKeyring(keyA, nine.slice(0, 8)))).toBe(true)
    expect(makeKeyring(keyA, nine)).toEqual(Either.left("too_many_previous_keys"))
    expect(makeKeyring(new Uint8Array(16), [])).toEqual(Either.left("invalid_key"))
    expect(makeKeyring(keyA, [new Uint8Array(31)])).toEqual(Either.left("invalid_key"))
  })
})

describe("seal / open", () => {
  it("round-trips, deterministically for a given nonce, in the documented envelope format", () => {
    const k = ring(keyA)
    const env = sealed(k, SECRET)
    expect(sealed(k, SECRET)).toBe(env)
    const parts = env.split(".")
    expect(parts).toHaveLength(5)
    expect(parts[0]).toBe("wse1")
    expect(parts[1]).toBe(keyId(keyA))
    expect(Buffer.from(parts[2] ?? "", "base64url")).toEqual(Buffer.from(nonce))
    expect(Buffer.from(parts[3] ?? "", "base64url")).toHaveLength(Buffer.byteLength(SECRET))
    expect(Buffer.from(parts[4] ?? "", "base64url")).toHaveLength(16)
    for (const p of parts) expect(p).toMatch(/^[A-Za-z0-9_-]+$/)
    expect(open(k, env)).toEqual(Either.right(SECRET))
  })

  it("is exactly AES-256-GCM with AAD wse1.<keyId> (independent computation)", () => {
    const id = keyId(keyA)
    const cipher = createCipheriv("aes-256-gcm", keyA, nonce, { authTagLength: 16 })
    cipher.setAAD(Buffer.from(`wse1.${id}`, "utf8"))
    const ct = Buffer.concat([cipher.update(SECRET, "utf8"), cipher.final()])
    const expected = [
      "wse1",
      id,
      Buffer.from(nonce).toString("base64url"),
      ct.toString("base64url"),
      cipher.getAuthTag().toString("base64url")
    ].join(".")
    expect(sealed(ring(keyA), SECRET)).toBe(expected)
  })

  it("round-trips unicode and empty plaintexts", () => {
    const k = ring(keyA)
    for (const s of ["", "ünïcødé 🔑", "x".repeat(256)]) expect(open(k, sealed(k, s))).toEqual(Either.right(s))
  })

  it("sealRandom uses a fresh nonce each time and opens", () => {
    const k = ring(keyA)
    const a = Either.getOrThrow(sealRandom(k, SECRET))
    const b = Either.getOrThrow(sealRandom(k, SECRET))
    expect(a).not.toBe(b)
    expect(open(k, a)).toEqual(Either.right(SECRET))
    expect(open(k, b)).toEqual(Either.right(SECRET))
  })

  it("rotation: sealed with the old key opens once the old key is only a previous key; new seals use the new key", () => {
    const old = ring(keyA)
    const env = sealed(old, SECRET)
    const rotated = ring(keyB, [keyA])
    expect(open(rotated, env)).toEqual(Either.right(SECRET))
    const fresh = sealed(rotated, SECRET)
    expect(fresh.split(".")[1]).toBe(keyId(keyB))
    expect(open(rotated, fresh)).toEqual(Either.right(SECRET))
    // the old key alone cannot open what the new key sealed
    expectGeneric(open(old, fresh))
    // decrypt-only keyring (no current key) still opens, but cannot seal
    const decryptOnly = ring(undefined, [keyA])
    expect(open(decryptOnly, env)).toEqual(Either.right(SECRET))
    expectGeneric(seal(decryptOnly, SECRET, nonce))
  })

  it("the keyring keeps its own copies of the keys: wiping the caller's buffers afterwards breaks nothing", () => {
    const current = Uint8Array.from(keyA)
    const previous = Uint8Array.from(keyB)
    const k = ring(current, [previous])
    const underA = sealed(k, SECRET)
    const underB = sealed(ring(keyB), SECRET)
    current.fill(0)
    previous.fill(0)
    expect(open(k, underA)).toEqual(Either.right(SECRET))
    expect(open(k, underB)).toEqual(Either.right(SECRET))
    expect(sealed(k, SECRET)).toBe(underA)
  })

  it("an unknown keyId is the generic error (key dropped from the ring)", () => {
    const env = sealed(ring(keyA), SECRET)
    expectGeneric(open(ring(keyB), env))
    expectGeneric(open(emptyKeyring, env))
  })

  it("tampering with ciphertext, tag, nonce, keyId or version is the generic error", () => {
    const k = ring(keyB, [keyA])
    const env = sealed(ring(keyA), SECRET)
    const parts = env.split(".")
    expectGeneric(open(k, withPart(env, 3, flip(parts[3] ?? ""))))
    expectGeneric(open(k, withPart(env, 4, flip(parts[4] ?? ""))))
    expectGeneric(open(k, withPart(env, 2, flip(parts[2] ?? ""))))
    // keyId swapped for another key in the ring: AAD and key both change → auth failure
    expectGeneric(open(k, withPart(env, 1, keyId(keyB))))
    expectGeneric(open(k, withPart(env, 0, "wse2")))
  })

  /** a "wse1" envelope of keyA sealed directly with node:crypto, its AAD prefixed `aadVersion` */
  const sealedByHand = (aadVersion: string, plaintext: Buffer) => {
    const id = keyId(keyA)
    const cipher = createCipheriv("aes-256-gcm", keyA, nonce, { authTagLength: 16 })
    cipher.setAAD(Buffer.from(`${aadVersion}.${id}`, "utf8"))
    const ct = Buffer.concat([cipher.update(plaintext), cipher.final()])
    return [
      "wse1",
      id,
      Buffer.from(nonce).toString("base64url"),
      ct.toString("base64url"),
      cipher.getAuthTag().toString("base64url")
    ].join(".")
  }

  it("an envelope sealed under different AAD does not open", () => {
    const forged = sealedByHand("wse0", Buffer.from(SECRET, "utf8"))
    expectGeneric(open(ring(keyA), forged))
  })

  it("an authentic envelope whose plaintext is not valid UTF-8 is the generic error, never a lossy token", () => {
    const envelope = sealedByHand("wse1", Buffer.from([0x77, 0x68, 0xff, 0xfe, 0x73]))
    expectGeneric(open(ring(keyA), envelope))
  })

  it("malformed envelopes are the generic error", () => {
    const k = ring(keyA)
    const env = sealed(k, SECRET)
    const parts = env.split(".")
    const bad = [
      "",
      "wse1",
      parts.slice(0, 4).join("."),
      env + ".x",
      withPart(env, 2, Buffer.from(randomBytes(8)).toString("base64url")), // short nonce
      withPart(env, 4, Buffer.from(randomBytes(12)).toString("base64url")), // short tag
      withPart(env, 3, (parts[3] ?? "") + "="), // padding is not canonical
      withPart(env, 3, (parts[3] ?? "").replace(/./, "+")), // wrong alphabet
      withPart(env, 1, "short")
    ]
    for (const b of bad) expectGeneric(open(k, b))
  })

  it("seal rejects a nonce of the wrong size", () => {
    expectGeneric(seal(ring(keyA), SECRET, new Uint8Array(16)))
  })

  it("errors never contain the secret, the key or the envelope", () => {
    const k = ring(keyA)
    const env = sealed(k, SECRET)
    const failures = [
      open(ring(keyB), env),
      open(k, withPart(env, 4, flip(env.split(".")[4] ?? ""))),
      open(k, SECRET),
      seal(emptyKeyring, SECRET, nonce)
    ]
    for (const f of failures) {
      expect(Either.isLeft(f)).toBe(true)
      if (Either.isLeft(f)) {
        const rendered = [
          String(f.left),
          f.left.message,
          f.left.stack ?? "",
          JSON.stringify(f.left),
          JSON.stringify(Object.entries(f.left))
        ].join("\n")
        for (
          const needle of [
            SECRET,
            "c3VwZXItc2VjcmV0",
            env,
            Buffer.from(keyA).toString("base64"),
            Buffer.from(keyA).toString("hex")
          ]
        ) {
          expect(rendered).not.toContain(needle)
        }
      }
    }
  })
})

describe("tokens", () => {
  it("generateToken is whsec_ + base64 of 32 random bytes", () => {
    const a = generateToken()
    const b = generateToken()
    expect(a).not.toBe(b)
    for (const t of [a, b]) {
      expect(t).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)
      expect(Buffer.from(t.slice(6), "base64")).toHaveLength(32)
      expect(validateCallerToken(t)).toBe(true)
    }
    expect(tokenFromBytes(new Uint8Array(32))).toBe("whsec_" + "A".repeat(43) + "=")
  })

  it("validateCallerToken: 32–256 printable ASCII, no whitespace", () => {
    expect(validateCallerToken("a".repeat(32))).toBe(true)
    expect(validateCallerToken("~!".repeat(128))).toBe(true)
    expect(validateCallerToken("a".repeat(31))).toBe(false)
    expect(validateCallerToken("a".repeat(257))).toBe(false)
    expect(validateCallerToken("a".repeat(31) + " ")).toBe(false)
    expect(validateCallerToken("a".repeat(31) + "\t")).toBe(false)
    expect(validateCallerToken("a".repeat(31) + "\u007f")).toBe(false)
    expect(validateCallerToken("a".repeat(31) + "é")).toBe(false)
    expect(validateCallerToken("")).toBe(false)
  })
})
