/**
 * The XRPC responses backfill reads (SPEC §5.2–5.3) at the edges of their decoding: bodies that are
 * not UTF-8 JSON, the decoding bounds (set above the protocol's rules, whose violations the callers
 * report under their own kinds), and the well-formed-text check that guards a cursor put in a URL.
 */
import { describe, expect, it } from "vitest"
import {
  decodeJsonBody,
  isWellFormedText,
  LatestCommit,
  ListRecordsPage,
  ReposByCollectionPage,
  XrpcError
} from "../../src/schemas/Xrpc.js"

const json = (value: unknown): Uint8Array => new TextEncoder().encode(JSON.stringify(value))
const record = (i: number) => ({
  uri: `at://did:plc:aaaaaaaaaaaaaaaaaaaaaaaa/app.bsky.feed.post/${i}`,
  cid: "b",
  value: {}
})

describe("decodeJsonBody", () => {
  it("UTF-8 JSON that matches the Schema", () => {
    expect(decodeJsonBody(LatestCommit, json({ cid: "bafy", rev: "3jzfcijpj2z2a", extra: 1 }))).toEqual({
      cid: "bafy",
      rev: "3jzfcijpj2z2a"
    })
    expect(decodeJsonBody(XrpcError, json({ error: "RepoNotFound", message: "no" }))).toEqual({
      error: "RepoNotFound",
      message: "no"
    })
  })

  it("undefined for bytes that are not UTF-8, even inside a string, and for JSON that does not match", () => {
    const bytes = (s: string, ...extra: ReadonlyArray<number>) =>
      new Uint8Array([...new TextEncoder().encode(s), ...extra])
    // {"error":"<0xff>"} and {"error":"<a lone continuation byte>"}
    expect(decodeJsonBody(XrpcError, bytes("{\"error\":\"", 0xff, 0x22, 0x7d))).toBeUndefined()
    expect(decodeJsonBody(XrpcError, bytes("{\"error\":\"", 0x80, 0x22, 0x7d))).toBeUndefined()
    expect(decodeJsonBody(XrpcError, bytes("{\"error\":\"x\"}"))).toEqual({ error: "x" })
    expect(decodeJsonBody(XrpcError, bytes("{not json"))).toBeUndefined()
    expect(decodeJsonBody(XrpcError, json({ message: "no error field" }))).toBeUndefined()
    expect(decodeJsonBody(LatestCommit, json({ cid: "bafy" }))).toBeUndefined()
  })
})

describe("decoding bounds", () => {
  it("strings up to 64 KiB; a rev up to 64 characters", () => {
    const s = (n: number) => "c".repeat(n)
    expect(decodeJsonBody(ListRecordsPage, json({ records: [], cursor: s(65_536) }))?.cursor).toHaveLength(65_536)
    expect(decodeJsonBody(ListRecordsPage, json({ records: [], cursor: s(65_537) }))).toBeUndefined()
    expect(decodeJsonBody(ReposByCollectionPage, json({ repos: [{ did: s(65_536) }] }))).toBeDefined()
    expect(decodeJsonBody(ReposByCollectionPage, json({ repos: [{ did: s(65_537) }] }))).toBeUndefined()
    expect(decodeJsonBody(LatestCommit, json({ cid: s(65_536), rev: s(64) }))).toBeDefined()
    expect(decodeJsonBody(LatestCommit, json({ cid: "b", rev: s(65) }))).toBeUndefined()
  })

  it("a page of 101 records still decodes (the caller reports the rule's violation); 10,000 at most", () => {
    const page = (n: number) => json({ records: Array.from({ length: n }, (_, i) => record(i)) })
    expect(decodeJsonBody(ListRecordsPage, page(101))?.records).toHaveLength(101)
    expect(decodeJsonBody(ListRecordsPage, page(10_000))?.records).toHaveLength(10_000)
    expect(decodeJsonBody(ListRecordsPage, page(10_001))).toBeUndefined()
    const repos = (n: number) => json({ repos: Array.from({ length: n }, () => ({ did: "did:plc:x" })) })
    expect(decodeJsonBody(ReposByCollectionPage, repos(10_000))?.repos).toHaveLength(10_000)
    expect(decodeJsonBody(ReposByCollectionPage, repos(10_001))).toBeUndefined()
  })

  it("a cursor, when present, is a string", () => {
    expect(decodeJsonBody(ListRecordsPage, json({ records: [], cursor: 5 }))).toBeUndefined()
    expect(decodeJsonBody(ReposByCollectionPage, json({ repos: [], cursor: null }))).toBeUndefined()
  })
})

describe("isWellFormedText", () => {
  it("refuses a lone surrogate of either half, anywhere; accepts pairs", () => {
    for (const s of ["", "abc", "\ud83d\ude00", "a\ud83d\ude00b\ud800\udc00"]) {
      expect([s, isWellFormedText(s)]).toEqual([s, true])
    }
    for (
      const s of ["\ud800", "\udc00", "a\ud800", "\udfffa", "\udc00\ud800", "\ud83d\ude00\ude00", "\ud800\ud800\udc00"]
    ) {
      expect([s, isWellFormedText(s)]).toEqual([s, false])
    }
  })
})
