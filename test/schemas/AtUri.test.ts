import { describe, expect, it } from "vitest"
import {
  compileCollectionGlob,
  isCanonicalDid,
  isCollection,
  isNsidStrict,
  isRkey,
  parseScopeUri
} from "../../src/schemas/AtUri.js"

const PLC = "did:plc:ewvi7nxzyoun6zhxrhs64oiz"
const label = (n: number): string => "a".repeat(n)

describe("isCanonicalDid", () => {
  it.each([
    PLC,
    "did:plc:" + "a".repeat(24),
    "did:plc:" + "2".repeat(24),
    "did:plc:abcdefghijklmnopqrstuvwx",
    "did:plc:yz234567yz234567yz234567",
    "did:web:example.com",
    "did:web:localhost",
    "did:web:a",
    "did:web:0",
    "did:web:sub.example.co.uk",
    "did:web:my-host.example",
    "did:web:a-b-c.d-e",
    "did:web:xn--nxasmq6b.com",
    `did:web:${label(63)}.com`,
    "did:web:example.com:user:alice",
    "did:web:example.com:u",
    "did:web:example.com:a.b_c-d",
    "did:web:example.com:..",
    "did:web:" + Array.from({ length: 30 }, () => label(63)).join(".") // long but ≤ 2048
  ])("accepts %s", (did) => {
    expect(isCanonicalDid(did)).toBe(true)
  })

  it.each([
    ["empty", ""],
    ["handle", "alice.bsky.social"],
    ["at-handle", "@alice.bsky.social"],
    ["plc prefix only", "did:plc:"],
    ["plc 23 chars", "did:plc:" + "a".repeat(23)],
    ["plc 25 chars", "did:plc:" + "a".repeat(25)],
    ["plc uppercase", "did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ"],
    ["plc one uppercase", "did:plc:Ewvi7nxzyoun6zhxrhs64oiz"],
    ["plc digit 0", "did:plc:0wvi7nxzyoun6zhxrhs64oiz"],
    ["plc digit 1", "did:plc:1wvi7nxzyoun6zhxrhs64oiz"],
    ["plc digit 8", "did:plc:8wvi7nxzyoun6zhxrhs64oiz"],
    ["plc digit 9", "did:plc:9wvi7nxzyoun6zhxrhs64oiz"],
    ["plc trailing slash", PLC + "/"],
    ["plc with space", "did:plc:ewvi7nxzyoun6zhxrhs64oi "],
    ["uppercase method", "did:PLC:ewvi7nxzyoun6zhxrhs64oiz"],
    ["uppercase scheme", "DID:plc:ewvi7nxzyoun6zhxrhs64oiz"],
    ["other method", "did:key:z6MkhaXgBZDvotDkL5257faiztiGiC2QtKLGpbnnEGta2doK"],
    ["web prefix only", "did:web:"],
    ["web uppercase host", "did:web:Example.com"],
    ["web leading hyphen", "did:web:-example.com"],
    ["web trailing hyphen", "did:web:example-.com"],
    ["web label trailing hyphen end", "did:web:example.com-"],
    ["web label leading hyphen inner", "did:web:example.-com"],
    ["web empty label", "did:web:example..com"],
    ["web leading dot", "did:web:.example.com"],
    ["web trailing dot", "did:web:example.com."],
    ["web 64-char label", `did:web:${label(64)}.com`],
    ["web 64-char last label", `did:web:example.${label(64)}`],
    ["web underscore in host", "did:web:my_host.com"],
    ["web percent-encoded port", "did:web:localhost%3A3000"],
    ["web port", "did:web:localhost:3000:"],
    ["web empty path segment", "did:web:example.com::alice"],
    ["web trailing colon", "did:web:example.com:"],
    ["web path starts host", "did:web::alice"],
    ["web uppercase path", "did:web:example.com:Alice"],
    ["web path with slash", "did:web:example.com:a/b"],
    ["web path with percent", "did:web:example.com:a%20b"],
    ["web unicode", "did:web:exämple.com"],
    ["web too long", "did:web:" + "a.".repeat(1020) + "abc"] // 2051 chars
  ])("rejects %s", (_name, did) => {
    expect(isCanonicalDid(did)).toBe(false)
  })

  it("the web length limit is inclusive at 2048", () => {
    const ok = "did:web:" + Array.from({ length: 50 }, () => label(39)).join(".") + "." + label(40)
    expect(ok).toHaveLength(2048)
    expect(isCanonicalDid(ok)).toBe(true)
    expect(isCanonicalDid(ok + "a")).toBe(false)
    expect(isCanonicalDid("did:web:example.com:" + "p".repeat(2048 - 20))).toBe(true)
    expect(isCanonicalDid("did:web:example.com:" + "p".repeat(2048 - 19))).toBe(false)
  })
})

describe("isCollection / isNsidStrict", () => {
  it.each(["app.bsky.feed.post", "place.wisp.v2.wh", "a", "A-b.C-9", "x".repeat(253)])("both accept %s", (c) => {
    expect(isCollection(c)).toBe(true)
    expect(isNsidStrict(c)).toBe(true)
  })

  it.each(["app.bsky.feed.*", "*", "app.*.post", "**"])("glob %s: collection yes, strict NSID no", (c) => {
    expect(isCollection(c)).toBe(true)
    expect(isNsidStrict(c)).toBe(false)
  })

  it.each(["", "x".repeat(318), "app/bsky", "app bsky", "app_bsky", "app.bsky.feed.post#x", "app?x", "äpp", "a:b"])(
    "both reject %j",
    (c) => {
      expect(isCollection(c)).toBe(false)
      expect(isNsidStrict(c)).toBe(false)
    }
  )
})

describe("event collections longer than a scope's 253 (atproto NSIDs go up to 317)", () => {
  // 4 + 3 × 64 + 61 + 6 = 263 chars: a valid atproto NSID (253-char authority max, 63-char name)
  const seg = "a".repeat(63)
  const long263 = `com.${seg}.${seg}.${seg}.${"b".repeat(60)}.record`
  const long317 = `${`${"a".repeat(63)}.`.repeat(3)}${"a".repeat(61)}.${"n".repeat(63)}`

  it("an event accepts them; a scope does not", () => {
    expect(long263.length).toBe(263)
    expect(long317.length).toBe(317)
    for (const c of [long263, long317, "x".repeat(254)]) {
      expect(isNsidStrict(c)).toBe(true)
      expect(isCollection(c)).toBe(false)
      expect(parseScopeUri(`at://did:plc:eygmaihciaxprqvxpfvl6flk/${c}`)).toBeUndefined()
    }
    expect(isNsidStrict(`${long317}x`)).toBe(false)
  })
})

describe("isRkey", () => {
  it.each(["3jzfcijpj2z2a", "self", "a", "...", ".a", "a.", "A-Z_a~z:0%9@+x-", "x".repeat(512), "literal:self"])(
    "accepts %s",
    (k) => {
      expect(isRkey(k)).toBe(true)
    }
  )

  it.each(["", ".", "..", "x".repeat(513), "a/b", "a b", "a?b", "a#b", "a\\b", "a*b", "ä", "a\nb"])(
    "rejects %j",
    (k) => {
      expect(isRkey(k)).toBe(false)
    }
  )
})

describe("parseScopeUri", () => {
  it.each([
    [`at://${PLC}`, PLC, undefined, undefined],
    [`at://${PLC}/app.bsky.feed.post`, PLC, "app.bsky.feed.post", undefined],
    [`at://${PLC}/app.bsky.feed.post/3jzfcijpj2z2a`, PLC, "app.bsky.feed.post", "3jzfcijpj2z2a"],
    [`at://${PLC}/app.bsky.feed.*`, PLC, "app.bsky.feed.*", undefined],
    [`at://${PLC}/app.bsky.*/self`, PLC, "app.bsky.*", "self"],
    ["at://did:web:example.com", "did:web:example.com", undefined, undefined],
    ["at://did:web:example.com:u:bob/a.b.c/k", "did:web:example.com:u:bob", "a.b.c", "k"]
  ])("parses %s", (uri, did, collection, rkey) => {
    expect(parseScopeUri(uri)).toEqual({ did, collection, rkey })
  })

  it("always returns all three keys", () => {
    const p = parseScopeUri(`at://${PLC}`)
    expect(p && Object.keys(p).sort()).toEqual(["collection", "did", "rkey"])
  })

  it.each([
    ["empty", ""],
    ["bare did", PLC],
    ["handle authority", "at://alice.bsky.social"],
    ["handle with collection", "at://alice.bsky.social/app.bsky.feed.post"],
    ["uppercase scheme", `AT://${PLC}`],
    ["missing slash", `at:/${PLC}`],
    ["https scheme", `https://${PLC}`],
    ["trailing slash", `at://${PLC}/`],
    ["trailing slash after collection", `at://${PLC}/app.bsky.feed.post/`],
    ["empty collection", `at://${PLC}//3jzfcijpj2z2a`],
    ["four segments", `at://${PLC}/app.bsky.feed.post/abc/def`],
    ["query", `at://${PLC}/app.bsky.feed.post?x=1`],
    ["fragment", `at://${PLC}/app.bsky.feed.post#frag`],
    ["fragment on did", `at://${PLC}#x`],
    ["backslash", `at://${PLC}/app.bsky.feed.post\\x`],
    ["space", `at://${PLC}/app.bsky.feed.post abc`],
    ["tab", `at://${PLC}\t`],
    ["newline", `at://${PLC}/app.bsky.feed.post\n`],
    ["leading space", ` at://${PLC}`],
    ["bad plc length", "at://did:plc:abc"],
    ["uppercase plc", "at://did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ"],
    ["bad collection char", `at://${PLC}/app_bsky`],
    ["collection too long", `at://${PLC}/${"x".repeat(254)}`],
    ["rkey dot", `at://${PLC}/app.bsky.feed.post/.`],
    ["rkey dotdot", `at://${PLC}/app.bsky.feed.post/..`],
    ["rkey too long", `at://${PLC}/a.b.c/${"k".repeat(513)}`],
    ["rkey bad char", `at://${PLC}/a.b.c/k*`],
    ["did with userinfo", `at://user@${PLC}`]
  ])("rejects %s", (_name, uri) => {
    expect(parseScopeUri(uri)).toBeUndefined()
  })

  it("length limit: 2048 ok when the parts are ok, 2049 rejected", () => {
    const host = Array.from({ length: 40 }, () => "a".repeat(50)).join(".")
    const base = `at://did:web:${host}`
    const at2048 = base.slice(0, 2048)
    expect(at2048).toHaveLength(2048)
    expect(parseScopeUri(at2048)?.did).toBe(at2048.slice(5))
    expect(parseScopeUri(base.slice(0, 2049))).toBeUndefined()
  })
})

describe("compileCollectionGlob", () => {
  it.each([
    // equality fast path
    ["app.bsky.feed.post", "app.bsky.feed.post", true],
    ["app.bsky.feed.post", "app.bsky.feed.posts", false],
    ["app.bsky.feed.post", "App.bsky.feed.post", false],
    ["app.bsky.feed.post", "app.bsky.feed", false],
    // prefix
    ["app.bsky.feed.*", "app.bsky.feed.post", true],
    ["app.bsky.feed.*", "app.bsky.feed.like", true],
    ["app.bsky.feed.*", "app.bsky.feed.", true],
    ["app.bsky.feed.*", "app.bsky.feed.threadgate.x", true],
    ["app.bsky.feed.*", "app.bsky.feed", false],
    ["app.bsky.feed.*", "app.bsky.graph.follow", false],
    ["app.bsky.*", "app.bsky.feed.post", true],
    // suffix
    ["*.post", "app.bsky.feed.post", true],
    ["*.post", "app.bsky.feed.like", false],
    ["*post", "post", true],
    // match-all
    ["*", "anything.at.all", true],
    ["*", "", true],
    ["**", "x", true],
    // infix
    ["app.*.post", "app.bsky.feed.post", true],
    ["app.*.post", "app.post", false],
    ["app.*.post", "app..post", true],
    ["a*a", "a", false],
    ["a*a", "aa", true],
    ["a*a", "aba", true],
    ["app.*.feed.*", "app.bsky.feed.post", true],
    ["app.*.feed.*", "app.bsky.graph.post", false],
    ["*.feed.*", "app.bsky.feed.post", true],
    ["a*b*c", "abc", true],
    ["a*b*c", "acb", false],
    ["a*b*c", "axxbyyc", true],
    ["a*b*c", "axxbyycz", false],
    ["a*bc*bc", "abcbc", true],
    ["a*bc*bc", "abcxbc", true],
    ["a*bc*bc", "abc", false],
    ["*ab*ab*", "abab", true],
    ["*ab*ab*", "aba", false],
    // a middle piece found only inside the suffix is not a match ("app.bsky.feed" has no ".feed" before a final "feed")
    ["*.feed*feed", "app.bsky.feed", false],
    ["*.feed*feed", "app.bsky.feed.feed", true],
    // the pattern's dots and dashes are literal, not regex
    ["app.bsky.*", "appxbsky.feed", false],
    ["a-b.*", "a-b.c", true]
  ])("%s ~ %s → %s", (pattern, collection, expected) => {
    expect(compileCollectionGlob(pattern)(collection)).toBe(expected)
  })

  it("a hostile pattern does not backtrack catastrophically", () => {
    const pattern = "*a".repeat(120) + "*b"
    const match = compileCollectionGlob(pattern)
    const subject = "a".repeat(253)
    for (let i = 0; i < 1000; i++) expect(match(subject)).toBe(false)
    expect(match("a".repeat(120) + "b")).toBe(true)
  })
})
