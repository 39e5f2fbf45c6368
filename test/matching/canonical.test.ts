import { Either } from "effect"
import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import {
  buildPayload,
  buildTestPayload,
  canonicalJson,
  CanonicalLimits,
  deliveryId,
  eventId,
  formatTimestamp,
  sha256Hex,
  subscriptionFingerprint,
  type SubscriptionFingerprintInput
} from "../../src/services/matching/Canonical.js"
import { event, plc } from "./fixtures.js"

const ok = (u: unknown): string => {
  const r = canonicalJson(u)
  if (Either.isLeft(r)) throw new Error(`unexpected ${r.left}`)
  return r.right
}
const left = (u: unknown): string | undefined => {
  const r = canonicalJson(u)
  return Either.isLeft(r) ? r.left : undefined
}

describe("canonicalJson", () => {
  it("sorts keys recursively by UTF-16 code unit order", () => {
    expect(ok({ b: 1, a: { z: [3, { y: 1, x: 2 }], B: null }, "": true })).toBe(
      "{\"\":true,\"a\":{\"B\":null,\"z\":[3,{\"x\":2,\"y\":1}]},\"b\":1}"
    )
    // UTF-16 order, not code point order: U+FF5E sorts after U+1F600 (surrogates 0xD83D...)
    const k1 = "\uff5e"
    const k2 = "😀"
    expect(ok({ [k1]: 1, [k2]: 2 })).toBe(`{"${k2}":2,"${k1}":1}`)
    expect(ok({ b: 1, a: 2, aa: 3, A: 4, _: 5 })).toBe("{\"A\":4,\"_\":5,\"a\":2,\"aa\":3,\"b\":1}")
  })

  it("is independent of insertion order and matches JSON.stringify for sorted input", () => {
    const a = ok({ x: 1, y: [1, 2, { q: "s", p: false }] })
    const b = ok({ y: [1, 2, { p: false, q: "s" }], x: 1 })
    expect(a).toBe(b)
    const sorted = { a: "é\u0000\n\"\\\u2028😀", b: [1.5, -0, 1e21, 1e-7, 0.1], c: null }
    expect(ok(sorted)).toBe(JSON.stringify(sorted))
  })

  it("escapes strings exactly as JSON.stringify (lone surrogates, control chars)", () => {
    for (const s of ["\ud800", "a\udc00b", "\u001f\u007f", "\t\r\b\f", "</script>", "\u2029"]) {
      expect(ok(s)).toBe(JSON.stringify(s))
      expect(ok({ [s]: s })).toBe(`{${JSON.stringify(s)}:${JSON.stringify(s)}}`)
    }
  })

  it("accepts null-prototype objects and top-level primitives", () => {
    const o = Object.assign(Object.create(null) as object, { b: 2, a: 1 })
    expect(ok(o)).toBe("{\"a\":1,\"b\":2}")
    expect(ok("x")).toBe("\"x\"")
    expect(ok(null)).toBe("null")
    expect(ok([])).toBe("[]")
    expect(ok({})).toBe("{}")
  })

  it("a bigint (an integer outside ±(2^53 − 1) from a record) is written as its exact digits", () => {
    expect(ok({ n: 1152921504606846978n, m: -9007199254740993n, s: 10n })).toBe(
      "{\"m\":-9007199254740993,\"n\":1152921504606846978,\"s\":10}"
    )
    expect(ok([18446744073709551615n])).toBe("[18446744073709551615]")
    expect(ok(2n ** 64n * 3n)).toBe("55340232221128654848")
  })

  it("payload_invalid: non-finite numbers, undefined, functions, symbols", () => {
    for (const v of [NaN, Infinity, -Infinity, undefined, () => 1, Symbol("s")]) {
      expect(left(v)).toBe("payload_invalid")
      expect(left({ a: v })).toBe("payload_invalid")
      expect(left([1, v])).toBe("payload_invalid")
    }
  })

  it("payload_invalid: non-plain objects, array holes, accessors, cycles", () => {
    class C {
      a = 1
    }
    for (const v of [new C(), new Date(0), new Map(), new Uint8Array(1), Object.create({ a: 1 }) as object]) {
      expect(left({ v })).toBe("payload_invalid")
    }
    // eslint-disable-next-line no-sparse-arrays
    expect(left([1, , 3])).toBe("payload_invalid")
    let calls = 0
    const g = {}
    Object.defineProperty(g, "x", {
      enumerable: true,
      get: () => {
        calls++
        return 1
      }
    })
    expect(left(g)).toBe("payload_invalid")
    expect(calls).toBe(0)
    const cyc: Record<string, unknown> = {}
    cyc["self"] = cyc
    expect(left(cyc)).toBe("payload_invalid")
    const arr: Array<unknown> = []
    arr.push(arr)
    expect(left(arr)).toBe("payload_invalid")
    // a shared (acyclic) sub-object is fine
    const shared = { s: 1 }
    expect(ok({ a: shared, b: shared })).toBe("{\"a\":{\"s\":1},\"b\":{\"s\":1}}")
  })

  it("payload_invalid: an array subclass is not a plain array", () => {
    class List extends Array<unknown> {}
    expect(left(List.of(1, 2))).toBe("payload_invalid")
    expect(left({ v: List.of("a") })).toBe("payload_invalid")
  })

  it("payload_too_large: an array with more slots than the body has bytes is refused before its slots are read", () => {
    const sparse: Array<unknown> = []
    sparse.length = CanonicalLimits.maxBodyBytes + 1
    expect(left(sparse)).toBe("payload_too_large")
    expect(left({ v: sparse })).toBe("payload_too_large")
  })

  it("a shared (acyclic) array is fine: only a container inside itself is a cycle", () => {
    const shared = [1, 2]
    expect(ok({ a: shared, b: shared, c: [shared, shared] })).toBe("{\"a\":[1,2],\"b\":[1,2],\"c\":[[1,2],[1,2]]}")
  })

  it("payload_too_large: an object key over 512 UTF-8 bytes, even in at most 512 code units", () => {
    // "é" is 2 bytes in UTF-8: 1 + 510 code units = 512 bytes; 1 + 511 = 513 bytes in 512 units
    expect(Either.isRight(canonicalJson({ ["é" + "k".repeat(510)]: 1 }))).toBe(true)
    expect(left({ ["é" + "k".repeat(511)]: 1 })).toBe("payload_too_large")
  })

  it("payload_too_large: depth over 64", () => {
    const nest = (n: number): unknown => {
      let v: unknown = 1
      for (let i = 0; i < n; i++) v = i % 2 === 0 ? { v } : [v]
      return v
    }
    expect(Either.isRight(canonicalJson(nest(64)))).toBe(true)
    expect(left(nest(65))).toBe("payload_too_large")
  })

  it("payload_too_large: more than 4096 keys in one object", () => {
    const obj = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, 0]))
    expect(Either.isRight(canonicalJson(obj(CanonicalLimits.maxKeysPerObject)))).toBe(true)
    expect(left(obj(CanonicalLimits.maxKeysPerObject + 1))).toBe("payload_too_large")
  })

  it("payload_too_large: a key over 512 UTF-8 bytes", () => {
    expect(Either.isRight(canonicalJson({ ["k".repeat(512)]: 1 }))).toBe(true)
    expect(left({ ["k".repeat(513)]: 1 })).toBe("payload_too_large")
    expect(left({ ["é".repeat(257)]: 1 })).toBe("payload_too_large")
  })

  it("payload_too_large: a string over 512 KiB, or a whole body over 512 KiB", () => {
    const max = CanonicalLimits.maxBodyBytes
    expect(left("x".repeat(max + 1))).toBe("payload_too_large")
    expect(left("€".repeat(Math.ceil(max / 3) + 1))).toBe("payload_too_large")
    // exactly at the bound: the two quotes count
    expect(Either.isRight(canonicalJson("x".repeat(max - 2)))).toBe(true)
    expect(left("x".repeat(max - 1))).toBe("payload_too_large")
    // many small strings
    expect(left(Array.from({ length: 3 }, () => "y".repeat(200_000)))).toBe("payload_too_large")
    // escaping expands the body
    expect(left("\u0000".repeat(100_000))).toBe("payload_too_large")
  })

  it("the body bound is in UTF-8 bytes", () => {
    const s = "😀".repeat(40_000) // 160,000 bytes
    const body = ok([s, s, s])
    expect(Buffer.byteLength(body, "utf8")).toBe(480_010) // 3 × 160,000 + 6 quotes + 2 commas + 2 brackets
    expect(left([s, s, s, s])).toBe("payload_too_large")
  })
})

describe("sha256Hex", () => {
  it("hashes UTF-8", () => {
    expect(sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    expect(sha256Hex("é")).toBe(createHash("sha256").update(Buffer.from("é", "utf8")).digest("hex"))
  })
})

describe("ids", () => {
  const base = event(plc(1), "app.bsky.feed.post", "3kabc")

  it("eventId is whe_v1_ + sha256 of the canonical id object", () => {
    const expected = ok({
      version: 1,
      relay: base.relay,
      time: base.timeUs,
      rev: base.rev,
      operation: base.operation,
      did: base.did,
      collection: base.collection,
      rkey: base.rkey,
      cid: base.cid ?? null
    })
    expect(eventId(base)).toBe(`whe_v1_${sha256Hex(expected)}`)
    expect(eventId(base)).toMatch(/^whe_v1_[0-9a-f]{64}$/)
    expect(eventId({ ...base })).toBe(eventId(base))
  })

  it("eventId differs when any identifying field differs (and ignores stream/cursor/record)", () => {
    const variants: ReadonlyArray<Partial<RecordEvent>> = [
      { relay: "wss://other.example" },
      { timeUs: base.timeUs + 1 },
      { rev: "3kabcdefghij3" },
      { operation: "update" },
      { did: plc(2) },
      { collection: "app.bsky.feed.like" },
      { rkey: "3kabd" },
      { cid: "bafyother" },
      { cid: undefined }
    ]
    const ids = new Set([eventId(base)])
    for (const v of variants) ids.add(eventId({ ...base, ...v }))
    expect(ids.size).toBe(variants.length + 1)
    expect(eventId({ ...base, stream: "backlink", cursor: "9", record: { other: true } })).toBe(eventId(base))
  })

  it("deliveryId is whd_v1_ + sha256 of the id object plus owner and webhook rkey", () => {
    const expected = ok({
      version: 1,
      relay: base.relay,
      time: base.timeUs,
      rev: base.rev,
      operation: base.operation,
      did: base.did,
      collection: base.collection,
      rkey: base.rkey,
      cid: base.cid ?? null,
      ownerDid: plc(9),
      webhookRkey: "w1"
    })
    expect(deliveryId(base, plc(9), "w1")).toBe(`whd_v1_${sha256Hex(expected)}`)
    const ids = new Set([
      deliveryId(base, plc(9), "w1"),
      deliveryId(base, plc(8), "w1"),
      deliveryId(base, plc(9), "w2"),
      deliveryId({ ...base, rkey: "other" }, plc(9), "w1"),
      deliveryId({ ...base, timeUs: 1 }, plc(9), "w1")
    ])
    expect(ids.size).toBe(5)
    expect(deliveryId(base, plc(9), "w1")).toBe(deliveryId({ ...base }, plc(9), "w1"))
  })
})

describe("subscriptionFingerprint", () => {
  const base: SubscriptionFingerprintInput = {
    url: "https://example.com/hook",
    scope: `at://${plc(1)}`,
    backlinks: false,
    events: undefined,
    enabled: true,
    secretId: undefined,
    hasInlineSecret: true
  }

  it("changes when any field changes", () => {
    const variants: ReadonlyArray<Partial<SubscriptionFingerprintInput>> = [
      { url: "https://example.com/other" },
      { scope: `at://${plc(2)}` },
      { backlinks: true },
      { events: ["create"] },
      { enabled: false },
      { secretId: "k1", hasInlineSecret: false },
      { hasInlineSecret: false }
    ]
    const fps = new Set([subscriptionFingerprint(base)])
    for (const v of variants) fps.add(subscriptionFingerprint({ ...base, ...v }))
    expect(fps.size).toBe(variants.length + 1)
    expect(subscriptionFingerprint(base)).toMatch(/^[0-9a-f]{64}$/)
  })

  it("normalizes events: order and 'all' spellings do not matter", () => {
    const fp = (events: SubscriptionFingerprintInput["events"]) => subscriptionFingerprint({ ...base, events })
    expect(fp(["update", "create"])).toBe(fp(["create", "update"]))
    expect(fp([])).toBe(fp(undefined))
    expect(fp(["delete", "update", "create"])).toBe(fp(undefined))
    expect(fp(["create"])).not.toBe(fp(undefined))
  })

  it("backlinksOnly: false or absent hashes exactly the fields a webhook had before it existed; true adds it", () => {
    // stored fingerprints must not change on upgrade (a change cancels pending deliveries)
    const before = (extra: string) =>
      createHash("sha256").update(
        `{"backlinks":true,${extra}"enabled":true,"events":"create,delete,update","hasInlineSecret":true,` +
          `"scope":"at://${plc(1)}","secretId":null,"url":"https://example.com/hook","v":1}`
      ).digest("hex")
    expect(subscriptionFingerprint({ ...base, backlinks: true })).toBe(before(""))
    expect(subscriptionFingerprint({ ...base, backlinks: true, backlinksOnly: false })).toBe(before(""))
    expect(subscriptionFingerprint({ ...base, backlinks: true, backlinksOnly: true })).toBe(
      before("\"backlinksOnly\":true,")
    )
  })

  it("never depends on a secret value (the input has no place for one)", () => {
    // The fingerprint input type has no secret field: the value cannot reach the hash. Two records
    // with different inline secrets therefore get the same fingerprint (covered in index tests
    // through makeActiveWebhook).
    expect(Object.keys(base)).not.toContain("secret")
  })
})

describe("buildPayload", () => {
  it("produces the canonical body with sorted keys and the event id", () => {
    const e = event(plc(1), "app.bsky.feed.post", "3kabc", { record: { text: "hi", $type: "app.bsky.feed.post" } })
    const r = buildPayload(e, e.record)
    if (Either.isLeft(r)) throw new Error(r.left)
    expect(r.right.eventId).toBe(eventId(e))
    expect(r.right.body).toBe(
      `{"cid":"${e.cid}","collection":"app.bsky.feed.post","did":"${e.did}","event":"create","id":"${eventId(e)}",` +
        `"record":{"$type":"app.bsky.feed.post","text":"hi"},"rkey":"3kabc","timestamp":"2023-11-14T22:13:20.123Z"}`
    )
    expect(JSON.parse(r.right.body)).toMatchObject({ id: eventId(e), event: "create" })
  })

  it("omits record on delete and cid when absent", () => {
    const e = event(plc(1), "app.bsky.feed.post", "3kabc", { operation: "delete" })
    const r = buildPayload(e, { ignored: true })
    if (Either.isLeft(r)) throw new Error(r.left)
    const parsed: unknown = JSON.parse(r.right.body)
    expect(Object.keys(parsed as object)).toEqual(["collection", "did", "event", "id", "rkey", "timestamp"])
  })

  it("rejects a create without a record, an unformattable time, and a too-large or invalid record", () => {
    const e = event(plc(1), "app.bsky.feed.post", "3kabc")
    const missing = buildPayload(e, undefined)
    expect(Either.isLeft(missing) && missing.left).toBe("payload_invalid")
    expect(Either.isLeft(buildPayload({ ...e, timeUs: -1 }, {}))).toBe(true)
    expect(Either.isLeft(buildPayload({ ...e, timeUs: NaN }, {}))).toBe(true)
    const big = buildPayload(e, { text: "x".repeat(CanonicalLimits.maxBodyBytes) })
    expect(Either.isLeft(big) && big.left).toBe("payload_too_large")
    const inv = buildPayload(e, { n: NaN })
    expect(Either.isLeft(inv) && inv.left).toBe("payload_invalid")
  })

  it("formatTimestamp truncates microseconds to milliseconds and bounds the range", () => {
    expect(formatTimestamp(1_700_000_000_123_999)).toBe("2023-11-14T22:13:20.123Z")
    expect(formatTimestamp(0)).toBe("1970-01-01T00:00:00.000Z")
    expect(formatTimestamp(Number.MAX_SAFE_INTEGER)).toBe("2255-06-05T23:47:34.740Z")
    expect(formatTimestamp(Number.MAX_SAFE_INTEGER + 1)).toBeUndefined()
    expect(formatTimestamp(1.5)).toBeUndefined()
    expect(formatTimestamp(-1)).toBeUndefined()
  })
})

describe("buildTestPayload (SPEC §8.5 test)", () => {
  const owner = plc(7)
  const t = { ownerDid: owner, rkey: "hook", timeUs: 1_767_225_600_123_456, nonce: "00ff" }

  it("is the canonical body of the webhook record with event test and record null", () => {
    const p = Either.getOrThrow(buildTestPayload(t))
    expect(p.body).toBe(
      `{"collection":"place.wisp.v2.wh","did":"${owner}","event":"test","id":"${p.eventId}","record":null,` +
        `"rkey":"hook","timestamp":"2026-01-01T00:00:00.123Z"}`
    )
    expect(Either.getOrThrow(canonicalJson(JSON.parse(p.body)))).toBe(p.body)
    expect(p.eventId).toMatch(/^whe_v1_[0-9a-f]{64}$/)
    expect(p.deliveryId).toMatch(/^whd_v1_[0-9a-f]{64}$/)
  })

  it("a new nonce or time is a new delivery; the same inputs the same ids", () => {
    const a = Either.getOrThrow(buildTestPayload(t))
    expect(Either.getOrThrow(buildTestPayload(t))).toEqual(a)
    const b = Either.getOrThrow(buildTestPayload({ ...t, nonce: "0100" }))
    const c = Either.getOrThrow(buildTestPayload({ ...t, timeUs: t.timeUs + 1 }))
    expect(new Set([a.deliveryId, b.deliveryId, c.deliveryId]).size).toBe(3)
    expect(new Set([a.eventId, b.eventId, c.eventId]).size).toBe(3)
  })

  it("an unformattable time is payload_invalid", () => {
    expect(buildTestPayload({ ...t, timeUs: -1 })).toEqual(Either.left("payload_invalid"))
  })
})
