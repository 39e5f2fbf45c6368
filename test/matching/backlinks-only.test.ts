/**
 * `scope.backlinksOnly` (SPEC §1, §2.2 steps 4–5), from the raw record through validation into the
 * active-webhook index and the matcher: such a hook gets the backlinks of its scope (the like of
 * the scope's post), never the scope's own records (the post itself).
 */
import { Either } from "effect"
import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import { subscriptionFingerprint } from "../../src/services/matching/Canonical.js"
import { matchEvent } from "../../src/services/matching/Match.js"
import { extractReferences } from "../../src/services/matching/References.js"
import { type ActiveWebhook, makeActiveWebhook, WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { event, plc, REV, webhook } from "./fixtures.js"

const OWNER = plc(1)
const BOB = plc(11)
const CAROL = plc(12)
const POST = `at://${BOB}/app.bsky.feed.post/3kpost`

/** The active form of a raw wh record, as the registry builds it (validation first). */
const fromRaw = (rkey: string, scope: Record<string, unknown>): ActiveWebhook => {
  const v = validateWhRecord({
    $type: "place.wisp.v2.wh",
    scope,
    url: "https://example.com/hook",
    createdAt: "2024-01-01T00:00:00Z"
  }, { allowInsecureDev: false })
  if (Either.isLeft(v)) throw new Error(`expected a valid record, got ${v.left}`)
  return makeActiveWebhook(OWNER, rkey, v.right.record, v.right.scope, REV)
}

const run = (idx: WebhookIndex, e: RecordEvent): ReadonlyArray<string> =>
  matchEvent(idx, e, extractReferences(e.record).refs).map((m) => `${m.webhook.rkey}:${m.match}`).sort()

const like = (rkey: string) =>
  event(CAROL, "app.bsky.feed.like", rkey, {
    record: { $type: "app.bsky.feed.like", subject: { uri: POST, cid: "bafyreib2rxk3rh6kzwq" } }
  })

describe("scope.backlinksOnly: matching", () => {
  it("gets the like of the scope's post, not the scope's own post", () => {
    const idx = new WebhookIndex()
    idx.upsert(fromRaw("only", { aturi: POST, backlinksOnly: true }))
    expect(run(idx, like("l1"))).toEqual(["only:backlink"])
    expect(run(idx, event(BOB, "app.bsky.feed.post", "3kpost"))).toEqual([])
    expect(run(idx, event(BOB, "app.bsky.feed.post", "3kpost", { operation: "update" }))).toEqual([])
    expect(run(idx, event(BOB, "app.bsky.feed.post", "3kpost", { operation: "delete" }))).toEqual([])
  })

  it("a DID scope: the scope's own records never match directly, a reference from any repo does", () => {
    const idx = new WebhookIndex()
    idx.upsert(fromRaw("only", { aturi: `at://${BOB}`, backlinksOnly: true, backlinks: true }))
    idx.upsert(fromRaw("both", { aturi: `at://${BOB}`, backlinks: true }))
    idx.upsert(fromRaw("direct", { aturi: `at://${BOB}` }))
    // Bob's own post: the others match directly
    expect(run(idx, event(BOB, "app.bsky.feed.post", "p1"))).toEqual(["both:direct", "direct:direct"])
    // Carol likes Bob's post: both backlink hooks
    expect(run(idx, like("l2"))).toEqual(["both:backlink", "only:backlink"])
    // Bob replies to his own post: a backlink of his (direct for the others, one result each)
    const reply = event(BOB, "app.bsky.feed.post", "p2", {
      record: { $type: "app.bsky.feed.post", text: "more", reply: { parent: { uri: POST }, root: { uri: POST } } }
    })
    expect(run(idx, reply)).toEqual(["both:direct", "direct:direct", "only:backlink"])
  })

  it("backlinksOnly: false changes nothing", () => {
    const w = fromRaw("w", { aturi: `at://${BOB}`, backlinksOnly: false })
    expect(w.backlinksOnly).toBe(false)
    expect(w.backlinks).toBe(false)
    const idx = new WebhookIndex()
    idx.upsert(w)
    expect(run(idx, event(BOB, "app.bsky.feed.post", "p1"))).toEqual(["w:direct"])
    expect(run(idx, like("l3"))).toEqual([])
  })
})

describe("scope.backlinksOnly: the index", () => {
  it("implies backlinks; it is a backlink candidate, never a direct one; the DID stays wanted", () => {
    const idx = new WebhookIndex()
    const only = fromRaw("only", { aturi: `at://${BOB}`, backlinksOnly: true })
    expect(only.backlinks).toBe(true)
    expect(only.backlinksOnly).toBe(true)
    idx.upsert(only)
    expect([...idx.candidatesByScopeDid(BOB)]).toEqual([])
    expect(idx.hasDirectScopeDid(BOB)).toBe(false)
    expect([...idx.candidatesByBacklinkDid(BOB)]).toEqual([only])
    expect(idx.isBacklinkDid(BOB)).toBe(true)
    expect(new Set(idx.wantedDids())).toEqual(new Set([OWNER, BOB]))
    expect(new Set(idx.backlinkDids())).toEqual(new Set([BOB]))
    expect(idx.projectUpsert(fromRaw("second", { aturi: `at://${CAROL}`, backlinksOnly: true })).backlinkDids).toBe(2)

    // replaced by a direct registration of the same key, then removed: every map follows
    const direct = fromRaw("only", { aturi: `at://${BOB}` })
    expect(idx.upsert(direct)).toBe(only)
    expect([...idx.candidatesByScopeDid(BOB)]).toEqual([direct])
    expect([...idx.candidatesByBacklinkDid(BOB)]).toEqual([])
    expect(idx.backlinkDids().size).toBe(0)
    expect(idx.upsert(only)).toBe(direct)
    expect([...idx.candidatesByScopeDid(BOB)]).toEqual([])
    expect(idx.remove(only.key)).toBe(only)
    expect(idx.size).toBe(0)
    expect(idx.wantedDids().size).toBe(0)
    expect(idx.backlinkDids().size).toBe(0)
    expect(idx.isBacklinkDid(BOB)).toBe(false)
  })

  it("replaceOwner keeps the direct map right", () => {
    const idx = new WebhookIndex()
    idx.upsert(fromRaw("a", { aturi: `at://${BOB}` }))
    const only = fromRaw("a", { aturi: `at://${BOB}`, backlinksOnly: true })
    expect(idx.replaceOwner(OWNER, [only])).toBe(true)
    expect([...idx.candidatesByScopeDid(BOB)]).toEqual([])
    expect([...idx.candidatesByBacklinkDid(BOB)]).toEqual([only])
    expect(idx.replaceOwner(OWNER, [])).toBe(true)
    expect(idx.size).toBe(0)
    expect(idx.isBacklinkDid(BOB)).toBe(false)
  })
})

describe("scope.backlinksOnly: the fingerprint", () => {
  /** sha256 of the canonical JSON the fingerprint has always hashed (SPEC §3.5), with `extra` keys */
  const pinned = (backlinks: boolean, extra = "") =>
    createHash("sha256").update(
      `{"backlinks":${backlinks},${extra}"enabled":true,"events":"create,delete,update","hasInlineSecret":false,` +
        `"scope":"at://${BOB}","secretId":null,"url":"https://example.com/hook","v":1}`
    ).digest("hex")

  it("a webhook without it keeps the fingerprint it had before the field existed", () => {
    expect(fromRaw("w", { aturi: `at://${BOB}`, backlinks: true }).fingerprint).toBe(pinned(true))
    expect(fromRaw("w", { aturi: `at://${BOB}`, backlinks: true, backlinksOnly: false }).fingerprint).toBe(
      pinned(true)
    )
    expect(fromRaw("w", { aturi: `at://${BOB}` }).fingerprint).toBe(pinned(false))
    expect(webhook(OWNER, "w", `at://${BOB}`).fingerprint).toBe(pinned(false))
  })

  it("is part of it when true: turning it on is a new subscription (pending deliveries are cancelled)", () => {
    const only = fromRaw("w", { aturi: `at://${BOB}`, backlinksOnly: true })
    expect(only.fingerprint).toBe(pinned(true, `"backlinksOnly":true,`))
    expect(fromRaw("w", { aturi: `at://${BOB}`, backlinksOnly: true, backlinks: true }).fingerprint).toBe(
      only.fingerprint
    )
    expect(only.fingerprint).not.toBe(pinned(true))
    expect(
      subscriptionFingerprint({
        url: "https://example.com/hook",
        scope: `at://${BOB}`,
        backlinks: true,
        backlinksOnly: true,
        events: undefined,
        enabled: true,
        secretId: undefined,
        hasInlineSecret: false
      })
    ).toBe(only.fingerprint)
  })
})
