import { describe, expect, it } from "@effect/vitest"
import { createHmac, randomBytes } from "node:crypto"
import { Webhook } from "standardwebhooks"
import {
  signatureHeaders,
  standardWebhooksKey,
  standardWebhooksSignature,
  wispSignature
} from "../../src/services/delivery/Signer.js"

const body = JSON.stringify({ did: "did:plc:abcdefghijklmnopqrstuvwx", text: "héllo ✓ 🦋", n: 1 })
const nowSeconds = () => Math.floor(Date.now() / 1000)

describe("wispSignature", () => {
  it("is sha256= lowercase hex HMAC-SHA256 over the exact UTF-8 body", () => {
    const secret = "s3cret-ünïcode"
    const expected = createHmac("sha256", Buffer.from(secret, "utf8")).update(Buffer.from(body, "utf8")).digest("hex")
    const sig = wispSignature(secret, body)
    expect(sig).toBe(`sha256=${expected}`)
    expect(sig).toMatch(/^sha256=[0-9a-f]{64}$/)
  })

  it("uses the whole whsec_ string as the key (no decoding)", () => {
    const secret = "whsec_" + randomBytes(32).toString("base64")
    const expected = createHmac("sha256", secret).update(body).digest("hex")
    expect(wispSignature(secret, body)).toBe(`sha256=${expected}`)
  })

  it("matches a known vector (RFC 4231 test case 2)", () => {
    expect(wispSignature("Jefe", "what do ya want for nothing?")).toBe(
      "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    )
  })
})

describe("standardWebhooksKey", () => {
  it("decodes the base64 part of a whsec_ secret", () => {
    const raw = randomBytes(32)
    expect(Buffer.from(standardWebhooksKey("whsec_" + raw.toString("base64")))).toEqual(raw)
  })

  it("decodes a whsec_ secret of a single key byte (padded or not) rather than using the raw string", () => {
    expect(Array.from(standardWebhooksKey("whsec_AQ=="))).toEqual([1])
    expect(Array.from(standardWebhooksKey("whsec_/w"))).toEqual([255])
  })

  it("uses UTF-8 bytes for plain secrets", () => {
    expect(Buffer.from(standardWebhooksKey("pässword"))).toEqual(Buffer.from("pässword", "utf8"))
  })

  it("uses the UTF-8 bytes of a plain secret that starts with whsec but not whsec_", () => {
    const secret = "whsec-AQ=="
    expect(Buffer.from(standardWebhooksKey(secret))).toEqual(Buffer.from(secret, "utf8"))
    const headers = signatureHeaders({ secret, deliveryId: "d-7", timestampSeconds: nowSeconds(), body })
    expect(new Webhook(new TextEncoder().encode(secret), { format: "raw" }).verify(body, headers)).toEqual(
      JSON.parse(body)
    )
  })

  it("falls back to the UTF-8 bytes of the whole secret when whsec_ is not followed by base64", () => {
    expect(Buffer.from(standardWebhooksKey("whsec_not base64!"))).toEqual(Buffer.from("whsec_not base64!", "utf8"))
    expect(Buffer.from(standardWebhooksKey("whsec_"))).toEqual(Buffer.from("whsec_", "utf8"))
  })

  it("falls back to the UTF-8 bytes of the whole secret when the remainder uses the base64url alphabet", () => {
    // the standardwebhooks library cannot decode these either: a receiver verifies with the raw key
    for (const secret of ["whsec_ab-_", "whsec_AQ-_AQ=="]) {
      expect(Buffer.from(standardWebhooksKey(secret)), secret).toEqual(Buffer.from(secret, "utf8"))
      const headers = signatureHeaders({ secret, deliveryId: "d-8", timestampSeconds: nowSeconds(), body })
      expect(new Webhook(new TextEncoder().encode(secret), { format: "raw" }).verify(body, headers)).toEqual(
        JSON.parse(body)
      )
    }
  })
})

describe("standardWebhooksSignature", () => {
  it("is v1,<base64 HMAC-SHA256(key, id.ts.body)>", () => {
    const key = randomBytes(24)
    const expected = createHmac("sha256", key).update(`msg_1.1700000000.${body}`).digest("base64")
    expect(standardWebhooksSignature(key, "msg_1", 1700000000, body)).toBe(`v1,${expected}`)
  })

  it("signs the exact body bytes, surrounding whitespace included (both schemes)", () => {
    const key = randomBytes(24)
    const padded = ` ${body}\n`
    const expected = createHmac("sha256", key).update(`msg_1.1700000000.${padded}`).digest("base64")
    expect(standardWebhooksSignature(key, "msg_1", 1700000000, padded)).toBe(`v1,${expected}`)
    expect(wispSignature("k", padded)).toBe(`sha256=${createHmac("sha256", "k").update(padded).digest("hex")}`)
  })

  it("agrees with the standardwebhooks library's own signer", () => {
    const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    const ts = 1614265330
    const lib = new Webhook(secret).sign("msg_p5jXN8AQM9LWM0D4loKWxJek", new Date(ts * 1000), "{\"test\": 2432232314}")
    expect(
      standardWebhooksSignature(
        standardWebhooksKey(secret),
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        ts,
        "{\"test\": 2432232314}"
      )
    ).toBe(lib)
    // the published Standard Webhooks test vector
    expect(lib).toBe("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
  })

  it("truncates a fractional timestamp itself (the published Standard Webhooks test vector)", () => {
    const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    expect(
      standardWebhooksSignature(
        standardWebhooksKey(secret),
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330.9,
        "{\"test\": 2432232314}"
      )
    ).toBe("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=")
  })
})

describe("signatureHeaders", () => {
  it("verifies with the standardwebhooks library for a whsec_ secret", () => {
    const secret = "whsec_" + randomBytes(32).toString("base64")
    const deliveryId = "0190f3a1-7c2e-7b1a-9d4e-1f2a3b4c5d6e"
    const ts = nowSeconds()
    const headers = signatureHeaders({ secret, deliveryId, timestampSeconds: ts, body })
    expect(Object.keys(headers).sort()).toEqual(
      ["X-Webhook-Signature", "webhook-id", "webhook-signature", "webhook-timestamp"].sort()
    )
    expect(headers["webhook-id"]).toBe(deliveryId)
    expect(headers["webhook-timestamp"]).toBe(String(ts))
    expect(new Webhook(secret).verify(body, headers)).toEqual(JSON.parse(body))
    expect(headers["X-Webhook-Signature"]).toBe(
      "sha256=" + createHmac("sha256", secret).update(body, "utf8").digest("hex")
    )
  })

  it("verifies with the library for a plain (non-whsec) secret via its raw key", () => {
    const secret = "plain secret with ünïcode and spaces"
    const deliveryId = "d-42"
    const headers = signatureHeaders({ secret, deliveryId, timestampSeconds: nowSeconds(), body })
    // The library base64-decodes non-raw secrets, so give it the UTF-8 bytes as a raw key ...
    expect(new Webhook(new TextEncoder().encode(secret), { format: "raw" }).verify(body, headers)).toEqual(
      JSON.parse(body)
    )
    // ... or, equivalently, the base64 of those bytes in its default format.
    expect(new Webhook(Buffer.from(secret, "utf8").toString("base64")).verify(body, headers)).toEqual(JSON.parse(body))
    expect(headers["X-Webhook-Signature"]).toBe(
      "sha256=" + createHmac("sha256", Buffer.from(secret, "utf8")).update(Buffer.from(body, "utf8")).digest("hex")
    )
  })

  it("fails verification when the body, id or key differ", () => {
    const secret = "whsec_" + randomBytes(32).toString("base64")
    const headers = signatureHeaders({ secret, deliveryId: "d-1", timestampSeconds: nowSeconds(), body })
    expect(() => new Webhook(secret).verify(body + " ", headers)).toThrow()
    expect(() => new Webhook(secret).verify(body, { ...headers, "webhook-id": "d-2" })).toThrow()
    expect(() => new Webhook("whsec_" + randomBytes(32).toString("base64")).verify(body, headers)).toThrow()
  })

  it("truncates a fractional timestamp to integer seconds in both header and signature", () => {
    const secret = "whsec_" + randomBytes(32).toString("base64")
    const ts = nowSeconds() + 0.75
    const headers = signatureHeaders({ secret, deliveryId: "d-1", timestampSeconds: ts, body })
    expect(headers["webhook-timestamp"]).toBe(String(Math.trunc(ts)))
    expect(new Webhook(secret).verify(body, headers)).toEqual(JSON.parse(body))
  })
})
