/**
 * The Jetstream direct set goes whole into one `options_update` message, which Jetstream refuses
 * over 10 MB (closing the connection: the direct stream would never get a frame). Admission bounds
 * the set's bytes as well as its count (IndexRules.DIRECT_DIDS_MAX_BYTES), refused as the count is
 * (`direct_dids`). A scope DID may be a did:web of 2,043 characters: 10,000 of them are ~20 MB.
 */
import { describe, expect, it } from "vitest"
import { MAX_SCOPE_URI_LENGTH, parseScopeUri } from "../../src/schemas/AtUri.js"
import { OPTIONS_UPDATE_MAX_BYTES, optionsUpdate } from "../../src/schemas/Jetstream.js"
import { listEntryBytes, WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { admissionIn, DIRECT_DIDS_MAX_BYTES, type Rules } from "../../src/services/registry/IndexRules.js"
import { plc, webhook } from "../matching/fixtures.js"
import { longDidWeb } from "../support/longDidWeb.js"

const rules = (jetstream: boolean): Rules => ({
  limits: { activeMax: 100_000, ownerActiveMax: 100_000, directDidsMax: 10_000, backlinkDidsMax: 1024 },
  jetstream,
  validateOpts: { allowInsecureDev: false }
})
const OWNER = plc(1)
// the longest DID a scope AT-URI (≤ 2,048 characters) can carry
const LEN = MAX_SCOPE_URI_LENGTH - "at://".length
const hookOn = (i: number) => webhook(OWNER, `w${i}`, `at://${longDidWeb(i, LEN)}`)

/** admits one webhook a long did:web each, while admitted (at most 10,000); the first refused */
const fill = (index: WebhookIndex) => {
  for (let i = 0; i < 10_000; i++) {
    const w = hookOn(i)
    const limit = admissionIn(rules(true), index, w)
    if (limit !== undefined) return { i, limit }
    index.upsert(w)
  }
  return undefined
}

describe("admission bounds the bytes of the Jetstream direct set", () => {
  it("the fixture's DIDs are valid scope DIDs of the longest length", () => {
    const did = longDidWeb(7, LEN)
    expect(did.length).toBe(LEN)
    expect(parseScopeUri(`at://${did}`)?.did).toBe(did)
  })

  it("refuses (direct_dids) the DID that would take the set over the byte bound, its count well within", () => {
    const index = new WebhookIndex()
    const refused = fill(index)
    expect(refused?.limit).toBe("direct_dids")
    expect(index.wantedDids().size).toBeLessThan(10_000)
    expect(index.wantedDidsBytes).toBeLessThanOrEqual(DIRECT_DIDS_MAX_BYTES)
    expect(index.wantedDidsBytes + listEntryBytes(longDidWeb(refused?.i ?? 0, LEN))).toBeGreaterThan(
      DIRECT_DIDS_MAX_BYTES
    )
    // the byte count is the members' own
    let sum = 0
    for (const d of index.wantedDids()) sum += listEntryBytes(d)
    expect(index.wantedDidsBytes).toBe(sum)
    // a webhook on a DID already in the set adds no bytes: admitted
    expect(admissionIn(rules(true), index, webhook(OWNER, "again", `at://${longDidWeb(0, LEN)}`))).toBeUndefined()
    // the relay firehose has no direct set: no bound
    expect(admissionIn(rules(false), index, hookOn(refused?.i ?? 0))).toBeUndefined()
  })

  it("the options_update of a full admitted set fits Jetstream's 10 MB", () => {
    const index = new WebhookIndex()
    fill(index)
    const hello = optionsUpdate({ wantedDids: [...index.wantedDids()].sort() })
    expect(Buffer.byteLength(hello, "utf8")).toBeLessThanOrEqual(10 * 1000 * 1000)
    expect(OPTIONS_UPDATE_MAX_BYTES).toBe(10 * 1000 * 1000)
  })

  it("a removal frees its bytes: the refused DID is then admitted", () => {
    const index = new WebhookIndex()
    const refused = fill(index)
    const before = index.wantedDidsBytes
    index.remove(hookOn(0).key)
    expect(index.wantedDidsBytes).toBe(before - listEntryBytes(longDidWeb(0, LEN)))
    expect(admissionIn(rules(true), index, hookOn(refused?.i ?? 0))).toBeUndefined()
  })

  it("a replacement by another DID of the same length adds no bytes: admitted into a full set", () => {
    const index = new WebhookIndex()
    const refused = fill(index)
    // the last admitted webhook moved to a DID of the same length: the set's bytes do not change
    const last = (refused?.i ?? 1) - 1
    const moved = webhook(OWNER, `w${last}`, `at://${longDidWeb(refused?.i ?? 0, LEN)}`)
    expect(index.projectWantedDidsBytes(moved)).toBe(index.wantedDidsBytes)
    expect(admissionIn(rules(true), index, moved)).toBeUndefined()
  })
})
