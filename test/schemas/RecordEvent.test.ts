import { describe, expect, it } from "vitest"
import { isWellFormedRecordEvent, type RecordEvent } from "../../src/schemas/RecordEvent.js"

const event = (overrides: Partial<RecordEvent> = {}): RecordEvent => ({
  kind: "commit",
  did: "did:plc:ewvi7nxzyoun6zhxrhs64oiz",
  collection: "app.bsky.feed.post",
  rkey: "3jzfcijpj2z2a",
  operation: "create",
  rev: "3kcbfyfxqnk2c",
  cid: "bafyreib2rxk3rh6kzwq",
  record: { $type: "app.bsky.feed.post", text: "hi" },
  timeUs: 1_700_000_000_000_000,
  stream: "jetstream",
  relay: "wss://jetstream1.us-east.bsky.network",
  cursor: "1700000000000000",
  ...overrides
})

describe("isWellFormedRecordEvent", () => {
  it.each([
    ["create", event()],
    ["update", event({ operation: "update" })],
    ["delete without cid and record", event({ operation: "delete", cid: undefined, record: undefined })],
    ["delete with a cid", event({ operation: "delete", record: undefined })],
    ["did:web", event({ did: "did:web:example.com" })],
    ["non-TID rkey", event({ rkey: "self" })],
    ["rkey with allowed punctuation", event({ rkey: "a.b_c~d:e%f@g+h-i" })],
    ["cid of 512", event({ cid: "b".repeat(512) })],
    ["create without cid (cid is optional)", event({ cid: undefined })],
    ["record null is present", event({ record: null })]
  ])("well-formed: %s", (_name, e) => {
    expect(isWellFormedRecordEvent(e)).toBe(true)
  })

  it.each([
    ["handle as did", event({ did: "alice.bsky.social" })],
    ["short plc", event({ did: "did:plc:abc" })],
    ["uppercase plc", event({ did: "did:plc:EWVI7NXZYOUN6ZHXRHS64OIZ" })],
    ["glob collection", event({ collection: "app.bsky.feed.*" })],
    ["empty collection", event({ collection: "" })],
    ["collection with slash", event({ collection: "app/bsky" })],
    ["collection too long", event({ collection: "a".repeat(318) })],
    ["empty rkey", event({ rkey: "" })],
    ["rkey dot", event({ rkey: "." })],
    ["rkey dotdot", event({ rkey: ".." })],
    ["rkey with slash", event({ rkey: "a/b" })],
    ["rkey too long", event({ rkey: "k".repeat(513) })],
    ["rev not a TID", event({ rev: "not-a-tid" })],
    ["rev uppercase", event({ rev: "3KCBFYFXQNK2C" })],
    ["rev empty", event({ rev: "" })],
    ["cid empty", event({ cid: "" })],
    ["cid too long", event({ cid: "b".repeat(513) })],
    ["create without record", event({ record: undefined })],
    ["update without record", event({ operation: "update", record: undefined })],
    ["unknown operation", { ...event(), operation: "upsert" } as unknown as RecordEvent]
  ])("not well-formed: %s", (_name, e) => {
    expect(isWellFormedRecordEvent(e)).toBe(false)
  })
})
