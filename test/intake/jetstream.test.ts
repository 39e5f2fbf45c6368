import { Either } from "effect"
import { describe, expect, it } from "vitest"
import {
  decodeJetstreamFrame,
  type FrameErrorReason,
  jetstreamUrl,
  optionsUpdate,
  utf8LengthExceeds
} from "../../src/schemas/Jetstream.js"
import { isWellFormedRecordEvent, type RecordEvent } from "../../src/schemas/RecordEvent.js"
import { buildPayload } from "../../src/services/matching/Canonical.js"
import { DID, DID2, jetstreamCommit, REV } from "./frames.js"

const ctx = { stream: "direct", relay: "wss://jetstream2.us-east.bsky.network/subscribe", maxBytes: 4096 }
const T = 1725911162329308
const CID = "bafyreidwaivazkwu67xztlmuobx35hs2lnfh3kolmgfmucldvhd3sgzcqi"

const commit = (over: Record<string, unknown> = {}): Record<string, unknown> => ({
  rev: REV,
  operation: "create",
  collection: "app.bsky.feed.like",
  rkey: "3l3qo2vuowo2b",
  record: { $type: "app.bsky.feed.like", subject: { uri: `at://${DID2}/app.bsky.feed.post/3abc`, cid: CID } },
  cid: CID,
  ...over
})

const decode = (text: string) => decodeJetstreamFrame(text, ctx)

const reasonOf = (text: string): FrameErrorReason | undefined => {
  const r = decode(text)
  return Either.isLeft(r) ? r.left.reason : undefined
}

const recordEvent = (text: string): RecordEvent => {
  const r = decode(text)
  if (Either.isLeft(r)) throw new Error(`rejected: ${r.left.reason}`)
  const e = r.right.event
  if (e === undefined || e.kind !== "commit") throw new Error("not a commit")
  return e
}

describe("decodeJetstreamFrame: accepted frames", () => {
  it("create: every field, cursor = time_us", () => {
    const r = decode(jetstreamCommit(T, commit()))
    expect(Either.isRight(r)).toBe(true)
    if (Either.isLeft(r)) return
    expect(r.right.cursor).toBe(1725911162329308n)
    expect(r.right.event).toEqual({
      kind: "commit",
      did: DID,
      collection: "app.bsky.feed.like",
      rkey: "3l3qo2vuowo2b",
      operation: "create",
      rev: REV,
      cid: CID,
      record: commit()["record"],
      timeUs: T,
      stream: "direct",
      relay: ctx.relay,
      cursor: "1725911162329308"
    })
    expect(isWellFormedRecordEvent(recordEvent(jetstreamCommit(T, commit())))).toBe(true)
  })

  it("update without a cid: cid undefined", () => {
    const e = recordEvent(jetstreamCommit(T, commit({ operation: "update", cid: undefined })))
    expect(e.operation).toBe("update")
    expect(e.cid).toBeUndefined()
    expect(e.record).toEqual(commit()["record"])
    expect(isWellFormedRecordEvent(e)).toBe(true)
  })

  it("delete: neither record nor cid (stray ones are dropped)", () => {
    const plain = recordEvent(jetstreamCommit(T, { rev: REV, operation: "delete", collection: "a.b.c", rkey: "k" }))
    expect(plain.operation).toBe("delete")
    expect(plain.record).toBeUndefined()
    expect(plain.cid).toBeUndefined()
    expect(isWellFormedRecordEvent(plain)).toBe(true)
    const stray = recordEvent(jetstreamCommit(T, commit({ operation: "delete", cid: 42, record: "x" })))
    expect(stray.record).toBeUndefined()
    expect(stray.cid).toBeUndefined()
  })

  it("did:web DIDs and unusual (valid) rkeys", () => {
    const e = recordEvent(jetstreamCommit(T, commit({ rkey: "self:a~b@c+d%20" }), DID2))
    expect(e.did).toBe(DID2)
    expect(e.rkey).toBe("self:a~b@c+d%20")
  })

  it("identity and account → IdentityEvent", () => {
    for (const kind of ["identity", "account"] as const) {
      const text = JSON.stringify({
        did: DID,
        time_us: T,
        kind,
        [kind]: { did: DID, seq: 1409752997, time: "2024-09-05T06:11:04.870Z", active: false }
      })
      const r = decode(text)
      expect(r).toEqual(Either.right({
        cursor: BigInt(T),
        event: {
          kind,
          did: DID,
          ...(kind === "account" ? { active: false } : {}),
          timeUs: T,
          stream: "direct",
          relay: ctx.relay,
          cursor: String(T)
        }
      }))
    }
  })

  it("identity without a handle is fine (relays may omit it)", () => {
    const r = decode(JSON.stringify({ did: DID, time_us: T, kind: "identity", identity: { did: DID } }))
    expect(Either.isRight(r)).toBe(true)
  })

  it("a well-formed unknown kind is acknowledged with no event", () => {
    expect(decode(JSON.stringify({ did: DID, time_us: T, kind: "sync" }))).toEqual(
      Either.right({ cursor: BigInt(T), event: undefined })
    )
  })

  it("a well-formed unknown kind of 32 letters (the longest token) is acknowledged with no event", () => {
    expect(decode(JSON.stringify({ did: DID, time_us: T, kind: "a".repeat(32) }))).toEqual(
      Either.right({ cursor: BigInt(T), event: undefined })
    )
  })

  it("a valid atproto NSID longer than a scope's 253 chars (up to 317) is accepted as the collection", () => {
    const seg = "a".repeat(63)
    const collection = `com.${seg}.${seg}.${seg}.${"b".repeat(60)}.record` // 263 chars
    const e = decodeJetstreamFrame(
      jetstreamCommit(T, commit({ collection, record: { $type: collection } })),
      { ...ctx, maxBytes: 1 << 20 }
    )
    if (Either.isLeft(e)) throw new Error(`rejected: ${e.left.reason}`)
    const ev = e.right.event as RecordEvent
    expect(ev.collection).toBe(collection)
    expect(isWellFormedRecordEvent(ev)).toBe(true)
  })

  it("v2 extras (a `cursor` field) are ignored", () => {
    const text = JSON.stringify({ did: DID, time_us: T, kind: "commit", cursor: 12345, commit: commit() })
    expect(recordEvent(text).cursor).toBe(String(T))
  })
})

describe("decodeJetstreamFrame: integers outside ±(2^53 − 1) stay exact", () => {
  const withRecord = (recordJson: string): string =>
    jetstreamCommit(T, commit({ record: { $type: "com.example.counter", n: 0 } })).replace(
      "{\"$type\":\"com.example.counter\",\"n\":0}",
      recordJson
    )

  it("JSON.parse would round them: they become the bigint of their digits, and the body keeps them", () => {
    const e = recordEvent(withRecord(
      "{\"$type\":\"com.example.counter\",\"n\":1152921504606846978,\"m\":-9007199254740993,\"k\":9007199254740992," +
        "\"safe\":9007199254740991,\"l\":[18446744073709551615],\"f\":1.5e300,\"g\":9007199254740993.0}"
    ))
    const r = e.record as Record<string, unknown>
    expect(r["n"]).toBe(1152921504606846978n)
    expect(r["m"]).toBe(-9007199254740993n)
    expect(r["k"]).toBe(9007199254740992n)
    expect(r["l"]).toEqual([18446744073709551615n])
    // not integer literals: left as JSON.parse reads them
    expect(r["safe"]).toBe(9007199254740991)
    expect(r["f"]).toBe(1.5e300)
    expect(r["g"]).toBe(9007199254740992)
    expect(e.timeUs).toBe(T)
    const body = Either.getOrThrow(buildPayload(e, e.record)).body
    expect(body).toContain("\"n\":1152921504606846978")
    expect(body).toContain("\"m\":-9007199254740993")
    expect(body).toContain("\"l\":[18446744073709551615]")
  })

  it("a 16-digit integer just above 2^53 − 1, alone in the record, stays exact", () => {
    // no 17-digit run anywhere in the frame: only the 16-digit spellings starting with 9 can
    // exceed 2^53 − 1, and they alone must still reach the exact path
    const e = recordEvent(withRecord("{\"$type\":\"com.example.counter\",\"n\":9007199254740993}"))
    expect((e.record as Record<string, unknown>)["n"]).toBe(9007199254740993n)
    expect(Either.getOrThrow(buildPayload(e, e.record)).body).toContain("\"n\":9007199254740993")
  })

  it("long digit runs inside strings change nothing", () => {
    const e = recordEvent(withRecord("{\"$type\":\"x.y.z\",\"s\":\"99999999999999999999\",\"n\":12}"))
    expect(e.record).toEqual({ $type: "x.y.z", s: "99999999999999999999", n: 12 })
  })

  it("a record too deep for the exact path's recursion still decodes (valid JSON is never a poison frame)", () => {
    // a 17-digit run in a string sends the frame to the reviver, which the engine walks
    // recursively: 10,000 levels overflowed its stack, and the frame was refused as `json`
    const deep = `${"[".repeat(10_000)}${"]".repeat(10_000)}`
    const text = withRecord(`{"$type":"x.y.z","s":"id 12345678901234567","d":${deep}}`)
    const r = decodeJetstreamFrame(text, { ...ctx, maxBytes: 1 << 20 })
    expect(Either.isLeft(r) ? r.left.reason : "decoded").toBe("decoded")
    const e = Either.isRight(r) ? r.right.event : undefined
    expect(e?.kind === "commit" ? (e.record as Record<string, unknown>)["s"] : undefined).toBe("id 12345678901234567")
  })
})

describe("decodeJetstreamFrame: every FrameError reason", () => {
  const cases: ReadonlyArray<readonly [string, string, FrameErrorReason]> = [
    ["not JSON", "{\"did\":", "json"],
    ["empty", "", "json"],
    ["JSON but an array", "[1,2]", "shape"],
    ["JSON null", "null", "shape"],
    ["DID with an empty method-specific id", jetstreamCommit(T, commit(), "did:plc:"), "did"],
    ["handle as DID", jetstreamCommit(T, commit(), "alice.bsky.social"), "did"],
    ["uppercase DID", jetstreamCommit(T, commit(), DID.toUpperCase()), "did"],
    ["DID ending in ':'", jetstreamCommit(T, commit(), "did:plc:abc:"), "did"],
    ["DID with a space", jetstreamCommit(T, commit(), "did:web:a b.example"), "did"],
    ["missing did", JSON.stringify({ time_us: T, kind: "commit", commit: commit() }), "did"],
    ["time_us missing", JSON.stringify({ did: DID, kind: "commit", commit: commit() }), "time"],
    ["time_us a string", JSON.stringify({ did: DID, time_us: String(T), kind: "commit", commit: commit() }), "time"],
    ["time_us fractional", JSON.stringify({ did: DID, time_us: 1.5, kind: "commit", commit: commit() }), "time"],
    ["time_us negative", JSON.stringify({ did: DID, time_us: -1, kind: "commit", commit: commit() }), "time"],
    ["time_us unsafe", `{"did":"${DID}","time_us":9007199254740993,"kind":"commit"}`, "time"],
    // a time is positive: 0 is not a source time (and, as a cursor, would mean the whole window)
    ["time_us zero", JSON.stringify({ did: DID, time_us: 0, kind: "commit", commit: commit() }), "time"],
    ["kind missing", JSON.stringify({ did: DID, time_us: T, commit: commit() }), "kind"],
    ["kind not a string", JSON.stringify({ did: DID, time_us: T, kind: 1 }), "kind"],
    ["kind malformed (unknown token)", JSON.stringify({ did: DID, time_us: T, kind: "Commit!" }), "kind"],
    ["kind empty", JSON.stringify({ did: DID, time_us: T, kind: "" }), "kind"],
    // a kind token is 1–32 lowercase letters
    ["kind with uppercase letters", JSON.stringify({ did: DID, time_us: T, kind: "Commit" }), "kind"],
    ["kind of 33 letters", JSON.stringify({ did: DID, time_us: T, kind: "a".repeat(33) }), "kind"],
    ["DID with a slash", jetstreamCommit(T, commit(), "did:web:example.com/x"), "did"],
    ["DID with an uppercase method", jetstreamCommit(T, commit(), "did:PLC:eygmaihciaxprqvxpfvl6flk"), "did"],
    ["commit body missing", JSON.stringify({ did: DID, time_us: T, kind: "commit" }), "shape"],
    ["commit body an array", JSON.stringify({ did: DID, time_us: T, kind: "commit", commit: [] }), "shape"],
    ["non-TID rev", jetstreamCommit(T, commit({ rev: "not-a-tid" })), "rev"],
    ["rev with top bit set", jetstreamCommit(T, commit({ rev: "zzzzzzzzzzzzz" })), "rev"],
    ["rev missing", jetstreamCommit(T, commit({ rev: undefined })), "rev"],
    ["bad operation", jetstreamCommit(T, commit({ operation: "upsert" })), "operation"],
    ["operation missing", jetstreamCommit(T, commit({ operation: undefined })), "operation"],
    ["bad collection", jetstreamCommit(T, commit({ collection: "app.bsky.feed.*" })), "collection"],
    ["collection with a slash", jetstreamCommit(T, commit({ collection: "a/b" })), "collection"],
    ["collection too long", jetstreamCommit(T, commit({ collection: "a".repeat(318) })), "collection"],
    [
      "time_us unsafe, with a record",
      `{"did":"${DID}","time_us":9007199254740993,"kind":"commit","commit":{}}`,
      "time"
    ],
    ["bad rkey", jetstreamCommit(T, commit({ rkey: "a/b" })), "rkey"],
    ["rkey ..", jetstreamCommit(T, commit({ rkey: ".." })), "rkey"],
    ["rkey empty", jetstreamCommit(T, commit({ rkey: "" })), "rkey"],
    ["missing record on create", jetstreamCommit(T, commit({ record: undefined })), "record"],
    ["missing record on update", jetstreamCommit(T, commit({ operation: "update", record: undefined })), "record"],
    ["record not an object", jetstreamCommit(T, commit({ record: "text" })), "record"],
    ["record an array", jetstreamCommit(T, commit({ record: [1] })), "record"],
    ["record null", jetstreamCommit(T, commit({ record: null })), "record"],
    ["cid too long", jetstreamCommit(T, commit({ cid: "b".repeat(513) })), "cid"],
    ["cid empty", jetstreamCommit(T, commit({ cid: "" })), "cid"],
    ["cid not a string", jetstreamCommit(T, commit({ cid: { $link: CID } })), "cid"],
    ["too large", jetstreamCommit(T, commit({ record: { text: "x".repeat(5000) } })), "too_large"],
    ["too large by UTF-8 bytes only", jetstreamCommit(T, commit({ record: { text: "€".repeat(1300) } })), "too_large"]
  ]
  for (const [name, text, reason] of cases) {
    it(`${name} → ${reason}`, () => expect(reasonOf(text)).toBe(reason))
  }

  // atproto DID syntax, not canonical (SPEC §1.1): a relay may carry them; poison would stop the
  // stream at such a frame for good, so the frame decodes and its event matches nothing
  it.each(["did:plc:short", "did:key:z6Mkabc", "did:web:Example.com", "did:web:localhost%3A2583", "did:plc:UPPER"])(
    "a non-canonical DID in atproto syntax is not poison; its event is not well-formed: %s",
    (did) => {
      const e = recordEvent(jetstreamCommit(T, commit(), did))
      expect(e.did).toBe(did)
      expect(isWellFormedRecordEvent(e)).toBe(false)
    }
  )

  it("a cid of exactly 512 chars is accepted", () => {
    expect(recordEvent(jetstreamCommit(T, commit({ cid: "b".repeat(512) }))).cid).toHaveLength(512)
  })

  it("the size limit is checked before parsing (a huge non-JSON frame is too_large, not json)", () => {
    expect(reasonOf("{".repeat(5000))).toBe("too_large")
  })

  it("errors carry only the reason", () => {
    const r = decode(jetstreamCommit(T, commit(), "alice.bsky.social"))
    expect(r).toEqual(Either.left({ reason: "did" }))
  })
})

describe("utf8LengthExceeds", () => {
  it("counts UTF-8 bytes, not code units", () => {
    expect(utf8LengthExceeds("aaaa", 4)).toBe(false)
    expect(utf8LengthExceeds("aaaaa", 4)).toBe(true)
    expect(utf8LengthExceeds("éé", 4)).toBe(false)
    expect(utf8LengthExceeds("ééa", 4)).toBe(true)
    expect(utf8LengthExceeds("€", 2)).toBe(true)
    expect(utf8LengthExceeds("😀", 4)).toBe(false)
    expect(utf8LengthExceeds("😀a", 4)).toBe(true)
    const s = "é€😀x".repeat(1000)
    const bytes = Buffer.byteLength(s, "utf8")
    expect(utf8LengthExceeds(s, bytes)).toBe(false)
    expect(utf8LengthExceeds(s, bytes - 1)).toBe(true)
  })
})

describe("jetstreamUrl / optionsUpdate", () => {
  const base = "wss://jetstream2.us-east.bsky.network/subscribe"
  it("only requireHello and the cursor go in the URL", () => {
    expect(jetstreamUrl(base, {})).toBe(`${base}?requireHello=true`)
    expect(jetstreamUrl(base, { cursor: 0n })).toBe(`${base}?requireHello=true&cursor=0`)
    expect(jetstreamUrl(base, { cursor: 1725911162329308n })).toBe(`${base}?requireHello=true&cursor=1725911162329308`)
    expect(jetstreamUrl(`${base}?wantedDids=${DID}#x`, { cursor: 5n })).toBe(`${base}?requireHello=true&cursor=5`)
  })

  it("options_update has Jetstream's exact shape; undefined fields are omitted", () => {
    expect(JSON.parse(optionsUpdate({ wantedCollections: ["place.wisp.v2.wh"] }))).toEqual({
      type: "options_update",
      payload: { wantedCollections: ["place.wisp.v2.wh"] }
    })
    expect(JSON.parse(optionsUpdate({ wantedDids: [DID, DID2], maxMessageSizeBytes: 1000 }))).toEqual({
      type: "options_update",
      payload: { wantedDids: [DID, DID2], maxMessageSizeBytes: 1000 }
    })
    expect(optionsUpdate({})).toBe("{\"type\":\"options_update\",\"payload\":{}}")
  })
})
