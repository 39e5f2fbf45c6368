import { describe, expect, it } from "vitest"
import {
  extractReferences,
  formatScopeUri,
  ReferenceLimits,
  utf8Length
} from "../../src/services/matching/References.js"
import { plc } from "./fixtures.js"

const A = plc(1)
const B = plc(2)
const uris = (r: { readonly refs: ReadonlyArray<{ readonly uri: string }> }) => r.refs.map((x) => x.uri)

describe("extractReferences: what is a reference", () => {
  it("finds whole-string AT-URIs anywhere in the record, parsed into did/collection/rkey", () => {
    const r = extractReferences({
      $type: "app.bsky.feed.like",
      subject: { uri: `at://${A}/app.bsky.feed.post/3kabc`, cid: "bafy" },
      nested: [[{ x: `at://${B}` }]],
      coll: `at://${B}/app.bsky.graph.list`
    })
    expect(r.tooComplex).toBe(false)
    expect(r.refs).toEqual([
      { did: A, collection: "app.bsky.feed.post", rkey: "3kabc", uri: `at://${A}/app.bsky.feed.post/3kabc` },
      { did: B, collection: undefined, rkey: undefined, uri: `at://${B}` },
      { did: B, collection: "app.bsky.graph.list", rkey: undefined, uri: `at://${B}/app.bsky.graph.list` }
    ])
  })

  it("trims whitespace and strips trailing punctuation repeatedly", () => {
    const cases = [
      `  at://${A}/app.bsky.feed.post/3kabc  `,
      `at://${A}/app.bsky.feed.post/3kabc).`,
      `at://${A}/app.bsky.feed.post/3kabc"]}'`,
      `\n\tat://${A}/app.bsky.feed.post/3kabc!?;,\n`
    ]
    for (const s of cases) {
      expect(uris(extractReferences({ text: s }))).toEqual([`at://${A}/app.bsky.feed.post/3kabc`])
    }
    // a DID-only URI followed by a period
    expect(uris(extractReferences([`at://${A}.`]))).toEqual([`at://${A}`])
  })

  it("trims trailing whitespace of a string that starts with the URI (the WHOLE string, trimmed, SPEC §2.3)", () => {
    for (
      const s of [
        `at://${A}/app.bsky.feed.post/3kabc `,
        `at://${A}/app.bsky.feed.post/3kabc\n`,
        `at://${A}/app.bsky.feed.post/3kabc.\t`
      ]
    ) {
      expect(uris(extractReferences({ text: s }))).toEqual([`at://${A}/app.bsky.feed.post/3kabc`])
    }
  })

  it("trims leading Unicode whitespace (no-break space, ideographic space, BOM) before the URI, SPEC §2.3", () => {
    for (const lead of ["\u00a0", "\u3000", "\ufeff", "\u2028"]) {
      expect(uris(extractReferences({ text: `${lead}at://${A}/app.bsky.feed.post/3kabc` }))).toEqual([
        `at://${A}/app.bsky.feed.post/3kabc`
      ])
    }
  })

  it("does not treat prose containing a URI as a reference", () => {
    const r = extractReferences({
      text: `look at at://${A}/app.bsky.feed.post/3kabc please`,
      a: `(at://${A})`,
      b: `see at://${A}`,
      c: `at://${A} and more`
    })
    expect(r).toEqual({ refs: [], tooComplex: false })
  })

  it("rejects non-canonical URIs (handles, query, fragment, too many segments, empty segments)", () => {
    const r = extractReferences([
      "at://alice.bsky.social/app.bsky.feed.post/3kabc",
      `at://${A}/app.bsky.feed.post/3kabc?x=1`,
      `at://${A}#frag`,
      `at://${A}/a/b/c`,
      `at://${A}//x`,
      `at://${A}/`,
      `AT://${A}`,
      "at://did:plc:TOOSHORT"
    ])
    expect(r.refs).toEqual([])
  })

  it("turns a mention facet with a canonical did into a DID-only reference", () => {
    const post = {
      $type: "app.bsky.feed.post",
      text: "hi @alice",
      facets: [
        {
          index: { byteStart: 3, byteEnd: 9 },
          features: [{ $type: "app.bsky.richtext.facet#mention", did: A }]
        }
      ]
    }
    expect(extractReferences(post).refs).toEqual([{ did: A, collection: undefined, rkey: undefined, uri: `at://${A}` }])
  })

  it("ignores did fields of other objects and mentions with non-canonical dids", () => {
    const r = extractReferences({
      did: A,
      author: { did: B },
      features: [
        { $type: "app.bsky.richtext.facet#link", did: A },
        { $type: "app.bsky.richtext.facet#mention", did: "alice.bsky.social" },
        { $type: "app.bsky.richtext.facet#mention", did: ` ${A}` },
        { $type: "app.bsky.richtext.facet#mention", did: 42 }
      ]
    })
    expect(r.refs).toEqual([])
  })

  it("does not treat object keys as references", () => {
    expect(extractReferences({ [`at://${A}`]: 1 }).refs).toEqual([])
  })

  it("deduplicates by uri (string and mention of the same DID)", () => {
    const r = extractReferences({
      a: `at://${A}`,
      b: ` at://${A}.`,
      f: { $type: "app.bsky.richtext.facet#mention", did: A },
      c: `at://${A}/app.bsky.feed.post/1`,
      d: `at://${A}/app.bsky.feed.post/1`
    })
    expect(uris(r)).toEqual([`at://${A}`, `at://${A}/app.bsky.feed.post/1`])
  })

  it("keeps only relevant references, at most 100, without becoming too complex", () => {
    const relevant = new Set([A])
    const r = extractReferences({ a: `at://${A}`, b: `at://${B}` }, (d) => relevant.has(d))
    expect(uris(r)).toEqual([`at://${A}`])

    const many = Array.from({ length: 150 }, (_, i) => `at://${A}/app.bsky.feed.post/k${i}`)
    const irrelevant = Array.from({ length: 50 }, (_, i) => `at://${B}/app.bsky.feed.post/k${i}`)
    const r2 = extractReferences({ irrelevant, many }, (d) => d === A)
    expect(r2.tooComplex).toBe(false)
    expect(r2.refs.length).toBe(ReferenceLimits.maxRelevant)
    expect(r2.refs[0]?.uri).toBe(`at://${A}/app.bsky.feed.post/k0`)
    expect(r2.refs[99]?.uri).toBe(`at://${A}/app.bsky.feed.post/k99`)
  })

  it("returns nothing for primitives and records without references", () => {
    expect(extractReferences(undefined)).toEqual({ refs: [], tooComplex: false })
    expect(extractReferences(null)).toEqual({ refs: [], tooComplex: false })
    expect(extractReferences(42)).toEqual({ refs: [], tooComplex: false })
    expect(extractReferences({ text: "hello", n: 1, b: true, z: null })).toEqual({ refs: [], tooComplex: false })
    expect(uris(extractReferences(`at://${A}`))).toEqual([`at://${A}`])
  })
})

describe("extractReferences: untrusted input", () => {
  it("never invokes getters (objects and arrays) and never reads inherited properties", () => {
    let calls = 0
    const o: Record<string, unknown> = { plain: `at://${B}` }
    Object.defineProperty(o, "evil", {
      enumerable: true,
      get: () => {
        calls++
        return `at://${A}`
      }
    })
    const arr: Array<unknown> = [`at://${B}/app.bsky.feed.post/1`]
    Object.defineProperty(arr, 1, {
      enumerable: true,
      get: () => {
        calls++
        return `at://${A}`
      }
    })
    const proto = { inherited: `at://${A}` }
    const child: unknown = Object.create(proto)
    const nullProto = Object.assign(Object.create(null) as object, { x: `at://${A}/app.bsky.feed.post/2` })
    const r = extractReferences({ o, arr, child, nullProto })
    expect(calls).toBe(0)
    expect(uris(r)).toEqual([`at://${B}`, `at://${B}/app.bsky.feed.post/1`, `at://${A}/app.bsky.feed.post/2`])
  })

  it("ignores non-plain objects (class instances, Map, Date, typed arrays, String objects)", () => {
    class Post {
      uri = `at://${A}`
    }
    const r = extractReferences({
      a: new Post(),
      b: new Map([["x", `at://${A}`]]),
      c: new Date(0),
      d: new Uint8Array(4),
      e: new String(`at://${A}`)
    })
    expect(r).toEqual({ refs: [], tooComplex: false })
  })

  it("does not walk array subclasses (only plain arrays)", () => {
    class List extends Array<unknown> {}
    const r = extractReferences({ list: List.of(`at://${A}`), plain: [`at://${B}`] })
    expect(uris(r)).toEqual([`at://${B}`])
  })

  it("skips cycles", () => {
    const a: Record<string, unknown> = { uri: `at://${A}` }
    const b: Record<string, unknown> = { parent: a, uri: `at://${B}` }
    a["child"] = b
    a["self"] = a
    const list: Array<unknown> = [a]
    list.push(list)
    const r = extractReferences({ list })
    expect(r.tooComplex).toBe(false)
    expect(uris(r)).toEqual([`at://${A}`, `at://${B}`])
  })
})

describe("extractReferences: bounds make a record too complex", () => {
  const nest = (levels: number): unknown => {
    let v: unknown = `at://${A}`
    for (let i = 0; i < levels; i++) v = { v }
    return v
  }

  it("depth: 32 nested containers are fine, 33 are too complex", () => {
    expect(extractReferences(nest(32))).toEqual({ refs: [expect.objectContaining({ did: A })], tooComplex: false })
    expect(extractReferences(nest(33))).toEqual({ refs: [], tooComplex: true })
    let arr: unknown = "x"
    for (let i = 0; i < 33; i++) arr = [arr]
    expect(extractReferences(arr).tooComplex).toBe(true)
  })

  it("nodes: 2048 values are fine, 2049 are too complex", () => {
    // the array itself is one node
    expect(extractReferences(Array.from({ length: 2047 }, () => 1)).tooComplex).toBe(false)
    expect(extractReferences(Array.from({ length: 2048 }, () => 1)).tooComplex).toBe(true)
    // spread across objects
    const objs = Array.from({ length: 700 }, () => ({ a: 1, b: 2 }))
    expect(extractReferences(objs).tooComplex).toBe(true)
  })

  it("nodes: the bound is exact when the values are spread across objects (no array to check up front)", () => {
    // the record, its 8 objects and their values: 1 + 8 + 7 × 255 + last
    const record = (last: number) =>
      Object.fromEntries(
        Array.from({ length: 8 }, (_, o) => [
          `o${o}`,
          Object.fromEntries(Array.from({ length: o === 7 ? last : 255 }, (_, i) => [`k${i}`, i]))
        ])
      )
    expect(extractReferences(record(254)).tooComplex).toBe(false)
    expect(extractReferences(record(255)).tooComplex).toBe(true)
  })

  it("nodes: an array's slots count, holes included, so a huge sparse array is too complex without being walked", () => {
    const sparse: Array<unknown> = []
    sparse.length = 1_000_000
    sparse[0] = `at://${A}`
    expect(extractReferences({ sparse })).toEqual({ refs: [], tooComplex: true })
  })

  it("string bytes: 256 KiB of UTF-8 (keys included) is the bound", () => {
    const max = ReferenceLimits.maxStringBytes
    expect(extractReferences(["x".repeat(max)]).tooComplex).toBe(false)
    expect(extractReferences(["x".repeat(max + 1)]).tooComplex).toBe(true)
    // multi-byte characters count by UTF-8 length: 3 bytes each
    expect(extractReferences(["€".repeat(Math.floor(max / 3))]).tooComplex).toBe(false)
    expect(extractReferences(["€".repeat(Math.floor(max / 3) + 1)]).tooComplex).toBe(true)
    // keys count
    expect(extractReferences({ ["k".repeat(max)]: "y" }).tooComplex).toBe(true)
    // spread over many strings
    expect(extractReferences(Array.from({ length: 5 }, () => "z".repeat(60_000))).tooComplex).toBe(true)
  })

  it("keys per object: 256 are fine, 257 are too complex", () => {
    const obj = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, i]))
    expect(extractReferences(obj(256)).tooComplex).toBe(false)
    expect(extractReferences(obj(257)).tooComplex).toBe(true)
  })

  it("references: 256 found are fine, 257 are too complex (duplicates and irrelevant ones count)", () => {
    const refs = (n: number) => Array.from({ length: n }, (_, i) => `at://${A}/app.bsky.feed.post/k${i}`)
    expect(extractReferences(refs(256)).tooComplex).toBe(false)
    expect(extractReferences(refs(257))).toEqual({ refs: [], tooComplex: true })
    expect(extractReferences(Array.from({ length: 257 }, () => `at://${A}`)).tooComplex).toBe(true)
    expect(extractReferences(refs(257), () => false).tooComplex).toBe(true)
  })
})

describe("helpers", () => {
  it("utf8Length equals TextEncoder's byte length", () => {
    const samples = [
      "",
      "abc",
      "é",
      "€",
      "😀",
      "a😀b",
      "\ud800",
      "\udc00x",
      "\ud800\ud800",
      "\u0000\u007f\u0080\u07ff\u0800\uffff"
    ]
    const enc = new TextEncoder()
    for (const s of samples) expect(utf8Length(s)).toBe(enc.encode(s).length)
  })

  it("formatScopeUri", () => {
    expect(formatScopeUri({ did: A, collection: undefined, rkey: undefined })).toBe(`at://${A}`)
    expect(formatScopeUri({ did: A, collection: "a.b.c", rkey: undefined })).toBe(`at://${A}/a.b.c`)
    expect(formatScopeUri({ did: A, collection: "a.b.c", rkey: "k" })).toBe(`at://${A}/a.b.c/k`)
  })
})
