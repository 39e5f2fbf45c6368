import { describe, expect, it } from "vitest"
import { makeActiveWebhook, WebhookIndex, webhookKey } from "../../src/services/matching/WebhookIndex.js"
import { plc, REV, scope, webhook, whRecord } from "./fixtures.js"

const O1 = plc(1)
const O2 = plc(2)
const S = plc(10)
const T = plc(11)

describe("makeActiveWebhook", () => {
  it("derives key, scope, events, signing mode and fingerprint", () => {
    const w = webhook(O1, "w1", `at://${S}/app.bsky.feed.*`, {
      backlinks: true,
      events: ["create", "update"],
      secret: "s3cret"
    })
    expect(w.key).toBe(`${O1}/w1`)
    expect(webhookKey(O1, "w1")).toBe(w.key)
    expect(w.scopeUri).toBe(`at://${S}/app.bsky.feed.*`)
    expect(w.scope).toEqual({ did: S, collection: "app.bsky.feed.*", rkey: undefined })
    expect(w.backlinks).toBe(true)
    expect([...(w.events ?? [])].sort()).toEqual(["create", "update"])
    expect(w.signingMode).toBe("record_secret")
    expect(w.secretId).toBeUndefined()
    expect(w.rev).toBe(REV)
    expect(w.matchesCollection("app.bsky.feed.post")).toBe(true)
    expect(w.matchesCollection("app.bsky.graph.follow")).toBe(false)
    expect(JSON.stringify(w)).not.toContain("s3cret")

    expect(webhook(O1, "w2", `at://${S}`, { secretId: "k1" }).signingMode).toBe("secret_id")
    expect(webhook(O1, "w2", `at://${S}`, { secretId: "k1" }).secretId).toBe("k1")
    expect(webhook(O1, "w2", `at://${S}`).signingMode).toBe("none")
    expect(webhook(O1, "w2", `at://${S}`).matchesCollection("anything")).toBe(true)
    expect(webhook(O1, "w2", `at://${S}`, { events: [] }).events).toBeUndefined()
    expect(webhook(O1, "w2", `at://${S}`, { events: ["delete", "create", "update"] }).events).toBeUndefined()
    expect(webhook(O1, "w2", `at://${S}`).backlinks).toBe(false)
    expect(webhook(O1, "w2", `at://${S}`, { backlinks: false }).backlinks).toBe(false)
  })

  it("fingerprint excludes the secret value but reflects having one", () => {
    const a = webhook(O1, "w1", `at://${S}`, { secret: "one" })
    const b = webhook(O1, "w1", `at://${S}`, { secret: "two" })
    const none = webhook(O1, "w1", `at://${S}`)
    const id = webhook(O1, "w1", `at://${S}`, { secretId: "k" })
    expect(a.fingerprint).toBe(b.fingerprint)
    expect(a.fingerprint).not.toBe(none.fingerprint)
    expect(id.fingerprint).not.toBe(none.fingerprint)
    expect(webhook(O1, "w1", `at://${S}`, { url: "https://example.com/x" }).fingerprint).not.toBe(none.fingerprint)
    expect(webhook(O1, "w1", `at://${S}`, { backlinks: true }).fingerprint).not.toBe(none.fingerprint)
    expect(webhook(O1, "w1", `at://${S}/app.bsky.feed.post`).fingerprint).not.toBe(none.fingerprint)
    expect(webhook(O1, "w1", `at://${S}`, { events: ["create"] }).fingerprint).not.toBe(none.fingerprint)
    // the fingerprint describes the subscription, not its key or rev
    expect(makeActiveWebhook(O2, "w9", whRecord(`at://${S}`), scope(`at://${S}`), "3zzzzzzzzzzzz").fingerprint).toBe(
      none.fingerprint
    )
  })
})

describe("WebhookIndex", () => {
  it("indexes by key, owner, scope DID and backlink DID", () => {
    const idx = new WebhookIndex()
    const a = webhook(O1, "a", `at://${S}`, { backlinks: true })
    const b = webhook(O1, "b", `at://${T}/app.bsky.feed.post`)
    const c = webhook(O2, "c", `at://${S}/app.bsky.feed.like`)
    for (const w of [a, b, c]) expect(idx.upsert(w)).toBeUndefined()
    expect(idx.size).toBe(3)
    expect(idx.get(a.key)).toBe(a)
    expect(idx.ownerCount(O1)).toBe(2)
    expect(idx.ownerCount(O2)).toBe(1)
    expect(idx.ownerCount(plc(99))).toBe(0)
    expect(idx.byOwner(O1)).toEqual([a, b])
    expect(idx.byOwner(plc(99))).toEqual([])
    expect([...idx.candidatesByScopeDid(S)]).toEqual([a, c])
    expect([...idx.candidatesByScopeDid(T)]).toEqual([b])
    expect([...idx.candidatesByScopeDid(O1)]).toEqual([])
    expect([...idx.candidatesByBacklinkDid(S)]).toEqual([a])
    expect([...idx.candidatesByBacklinkDid(T)]).toEqual([])
    expect(idx.hasDirectScopeDid(S)).toBe(true)
    expect(idx.hasDirectScopeDid(O1)).toBe(false)
    expect(idx.isBacklinkDid(S)).toBe(true)
    expect(idx.isBacklinkDid(T)).toBe(false)
    expect(new Set(idx.wantedDids())).toEqual(new Set([O1, O2, S, T]))
    expect(new Set(idx.backlinkDids())).toEqual(new Set([S]))
    expect([...idx.all()]).toEqual([a, b, c])
  })

  it("refcounts: two webhooks on the same scope DID; removing one keeps the DID wanted", () => {
    const idx = new WebhookIndex()
    const a = webhook(O1, "a", `at://${S}`, { backlinks: true })
    const b = webhook(O2, "b", `at://${S}/app.bsky.feed.post`, { backlinks: true })
    idx.upsert(a)
    idx.upsert(b)
    expect(idx.remove(a.key)).toBe(a)
    expect(idx.remove(a.key)).toBeUndefined()
    expect(idx.wantedDids().has(S)).toBe(true)
    expect(idx.wantedDids().has(O1)).toBe(false)
    expect(idx.backlinkDids().has(S)).toBe(true)
    expect(idx.isBacklinkDid(S)).toBe(true)
    expect([...idx.candidatesByScopeDid(S)]).toEqual([b])
    idx.remove(b.key)
    expect(idx.wantedDids().size).toBe(0)
    expect(idx.backlinkDids().size).toBe(0)
    expect(idx.hasDirectScopeDid(S)).toBe(false)
    expect(idx.isBacklinkDid(S)).toBe(false)
    expect(idx.size).toBe(0)
  })

  it("an owner that is also a scope DID is counted twice and released correctly", () => {
    const idx = new WebhookIndex()
    const self = webhook(O1, "self", `at://${O1}`)
    const other = webhook(O1, "other", `at://${S}`)
    idx.upsert(self)
    idx.upsert(other)
    idx.remove(self.key)
    expect(idx.wantedDids().has(O1)).toBe(true) // still an owner
    idx.remove(other.key)
    expect(idx.wantedDids().has(O1)).toBe(false)
  })

  it("upsert replaces by key and moves the DID sets", () => {
    const idx = new WebhookIndex()
    const v1 = webhook(O1, "a", `at://${S}`, { backlinks: true })
    const v2 = webhook(O1, "a", `at://${T}`)
    idx.upsert(v1)
    const before = idx.wantedDidsVersion
    const bBefore = idx.backlinkDidsVersion
    expect(idx.upsert(v2)).toBe(v1)
    expect(idx.size).toBe(1)
    expect(idx.get(v1.key)).toBe(v2)
    expect(new Set(idx.wantedDids())).toEqual(new Set([O1, T]))
    expect(idx.backlinkDids().size).toBe(0)
    expect([...idx.candidatesByScopeDid(S)]).toEqual([])
    expect([...idx.candidatesByBacklinkDid(S)]).toEqual([])
    expect(idx.wantedDidsVersion).toBeGreaterThan(before)
    expect(idx.backlinkDidsVersion).toBeGreaterThan(bBefore)
    // replacing with an equivalent scope does not change the sets' versions
    const v = idx.wantedDidsVersion
    idx.upsert(webhook(O1, "a", `at://${T}/app.bsky.feed.post`))
    expect(idx.wantedDidsVersion).toBe(v)
  })

  it("replaceOwner swaps an owner's webhooks in one step", () => {
    const idx = new WebhookIndex()
    const a = webhook(O1, "a", `at://${S}`, { backlinks: true })
    const b = webhook(O1, "b", `at://${T}`)
    const other = webhook(O2, "x", `at://${T}`)
    idx.upsert(a)
    idx.upsert(b)
    idx.upsert(other)
    const wantedV = idx.wantedDidsVersion
    const c = webhook(O1, "c", `at://${T}/app.bsky.feed.post`)
    const b2 = webhook(O1, "b", `at://${S}`)
    expect(idx.replaceOwner(O1, [c, b2])).toBe(true)
    expect(idx.size).toBe(3)
    expect(idx.get(a.key)).toBeUndefined()
    expect(idx.get(b.key)).toBe(b2)
    expect(idx.get(c.key)).toBe(c)
    expect(idx.ownerCount(O1)).toBe(2)
    expect(new Set(idx.byOwner(O1))).toEqual(new Set([c, b2]))
    expect(idx.get(other.key)).toBe(other)
    // S and T still wanted (S by b2, T by c and other), so the set never changed
    expect(new Set(idx.wantedDids())).toEqual(new Set([O1, O2, S, T]))
    expect(idx.wantedDidsVersion).toBe(wantedV)
    // a was the only backlink webhook
    expect(idx.backlinkDids().size).toBe(0)
    expect([...idx.candidatesByScopeDid(S)]).toEqual([b2])

    // refuses webhooks of another owner, changing nothing
    expect(idx.replaceOwner(O1, [webhook(O2, "z", `at://${S}`)])).toBe(false)
    expect(idx.ownerCount(O1)).toBe(2)

    // empty list removes the owner
    expect(idx.replaceOwner(O1, [])).toBe(true)
    expect(idx.ownerCount(O1)).toBe(0)
    expect(new Set(idx.wantedDids())).toEqual(new Set([O2, T]))
    expect(idx.size).toBe(1)
  })

  it("replaceOwner given two registrations of one key keeps the last, and holds only its DIDs", () => {
    const idx = new WebhookIndex()
    const first = webhook(O1, "a", `at://${S}`, { backlinks: true })
    const last = webhook(O1, "a", `at://${T}`)
    expect(idx.replaceOwner(O1, [first, last])).toBe(true)
    expect(idx.size).toBe(1)
    expect(idx.get(first.key)).toBe(last)
    expect(new Set(idx.wantedDids())).toEqual(new Set([O1, T]))
    expect(idx.backlinkDids().size).toBe(0)
    expect(idx.replaceOwner(O1, [])).toBe(true)
    expect(idx.wantedDids().size).toBe(0)
  })

  it("projectUpsert reports the counts after a hypothetical upsert without mutating", () => {
    const idx = new WebhookIndex()
    idx.upsert(webhook(O1, "a", `at://${S}`, { backlinks: true }))
    expect(idx.projectUpsert(webhook(O2, "b", `at://${T}`, { backlinks: true }))).toEqual({
      total: 2,
      ownerCount: 1,
      wantedDids: 4,
      backlinkDids: 2
    })
    // replacing a's scope with another backlink DID: same total, S released
    expect(idx.projectUpsert(webhook(O1, "a", `at://${T}`, { backlinks: true }))).toEqual({
      total: 1,
      ownerCount: 1,
      wantedDids: 2,
      backlinkDids: 1
    })
    expect(idx.projectUpsert(webhook(O1, "c", `at://${S}/app.bsky.feed.post`))).toEqual({
      total: 2,
      ownerCount: 2,
      wantedDids: 2,
      backlinkDids: 1
    })
    expect(idx.size).toBe(1)
    expect(idx.wantedDids().size).toBe(2)
  })
})
