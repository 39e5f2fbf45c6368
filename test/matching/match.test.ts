import { describe, expect, it } from "vitest"
import type { ScopeUri } from "../../src/schemas/AtUri.js"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import { matchEvent, type MatchResult, referenceMatchesScope } from "../../src/services/matching/Match.js"
import { extractReferences } from "../../src/services/matching/References.js"
import { type ActiveWebhook, WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { event, plc, scope, webhook } from "./fixtures.js"

const OWNER = plc(1)
const ALICE = plc(10)
const BOB = plc(11)
const CAROL = plc(12)

const indexOf = (...ws: ReadonlyArray<ActiveWebhook>): WebhookIndex => {
  const idx = new WebhookIndex()
  for (const w of ws) idx.upsert(w)
  return idx
}

/** matches as `rkey:kind`, sorted */
const run = (idx: WebhookIndex, e: RecordEvent, refs?: ReadonlyArray<ScopeUri>): ReadonlyArray<string> => {
  const r: ReadonlyArray<MatchResult> = matchEvent(idx, e, refs ?? extractReferences(e.record).refs)
  return r.map((m) => `${m.webhook.rkey}:${m.match}`).sort()
}

describe("direct matching", () => {
  const idx = indexOf(
    webhook(OWNER, "did", `at://${ALICE}`),
    webhook(OWNER, "coll", `at://${ALICE}/app.bsky.feed.post`),
    webhook(OWNER, "glob", `at://${ALICE}/app.bsky.feed.*`),
    webhook(OWNER, "rkey", `at://${ALICE}/app.bsky.feed.post/3kabc`),
    webhook(OWNER, "bob", `at://${BOB}`)
  )

  it("DID-only, collection, glob and rkey scopes", () => {
    expect(run(idx, event(ALICE, "app.bsky.feed.post", "3kabc"))).toEqual([
      "coll:direct",
      "did:direct",
      "glob:direct",
      "rkey:direct"
    ])
    expect(run(idx, event(ALICE, "app.bsky.feed.post", "3kzzz"))).toEqual(["coll:direct", "did:direct", "glob:direct"])
    expect(run(idx, event(ALICE, "app.bsky.feed.like", "3kabc"))).toEqual(["did:direct", "glob:direct"])
    expect(run(idx, event(ALICE, "app.bsky.graph.follow", "3kabc"))).toEqual(["did:direct"])
    expect(run(idx, event(BOB, "app.bsky.feed.post", "3kabc"))).toEqual(["bob:direct"])
    expect(run(idx, event(CAROL, "app.bsky.feed.post", "3kabc"))).toEqual([])
  })

  it("a glob with its `*` first or in the middle matches through the index, directly and by reference", () => {
    const g = indexOf(
      webhook(OWNER, "infix", `at://${ALICE}/app.*.post`, { backlinks: true }),
      webhook(OWNER, "suffix", `at://${ALICE}/*.post`, { backlinks: true })
    )
    expect(run(g, event(ALICE, "app.bsky.feed.post", "3kabc"))).toEqual(["infix:direct", "suffix:direct"])
    expect(run(g, event(ALICE, "com.example.post", "3kabc"))).toEqual(["suffix:direct"])
    expect(run(g, event(ALICE, "app.bsky.feed.like", "3kabc"))).toEqual([])
    const like = { subject: { uri: `at://${ALICE}/app.bsky.feed.post/3kabc` } }
    expect(run(g, event(BOB, "app.bsky.feed.like", "l1", { record: like }))).toEqual([
      "infix:backlink",
      "suffix:backlink"
    ])
  })

  it("an rkey scope matches by exact rkey, also on delete", () => {
    const r = run(idx, event(ALICE, "app.bsky.feed.post", "3kabc", { operation: "delete" }))
    expect(r).toContain("rkey:direct")
  })

  it("the events filter skips other operations", () => {
    const f = indexOf(
      webhook(OWNER, "c", `at://${ALICE}`, { events: ["create"] }),
      webhook(OWNER, "ud", `at://${ALICE}`, { events: ["update", "delete"] }),
      webhook(OWNER, "all", `at://${ALICE}`, { events: [] })
    )
    expect(run(f, event(ALICE, "x.y.z", "k", { operation: "create" }))).toEqual(["all:direct", "c:direct"])
    expect(run(f, event(ALICE, "x.y.z", "k", { operation: "update" }))).toEqual(["all:direct", "ud:direct"])
    expect(run(f, event(ALICE, "x.y.z", "k", { operation: "delete" }))).toEqual(["all:direct", "ud:direct"])
  })

  it("a malformed event matches nothing", () => {
    expect(run(idx, { ...event(ALICE, "app.bsky.feed.post", "3kabc"), rev: "not-a-tid" })).toEqual([])
    expect(run(idx, { ...event(ALICE, "app.bsky.feed.*", "3kabc") })).toEqual([])
    expect(run(idx, { ...event(ALICE, "app.bsky.feed.post", "..") })).toEqual([])
  })

  it("returns a shared empty result with no allocation when nothing matches", () => {
    const a = matchEvent(idx, event(CAROL, "a.b.c", "k"), [])
    const b = matchEvent(idx, event(CAROL, "a.b.c", "k2"), [])
    expect(a).toBe(b)
    expect(a).toEqual([])
  })
})

describe("self-exclusion of wh records", () => {
  it("a webhook never receives its own wh record event; other webhooks watching the collection do", () => {
    const self = webhook(OWNER, "self", `at://${OWNER}/place.wisp.v2.wh`)
    const sibling = webhook(OWNER, "sibling", `at://${OWNER}`)
    const watcher = webhook(plc(2), "watcher", `at://${OWNER}/place.wisp.v2.wh`)
    const idx = indexOf(self, sibling, watcher)
    expect(run(idx, event(OWNER, "place.wisp.v2.wh", "self"))).toEqual(["sibling:direct", "watcher:direct"])
    expect(run(idx, event(OWNER, "place.wisp.v2.wh", "sibling"))).toEqual(["self:direct", "watcher:direct"])
    expect(run(idx, event(OWNER, "place.wisp.v2.wh", "other"))).toEqual([
      "self:direct",
      "sibling:direct",
      "watcher:direct"
    ])
  })

  it("self-exclusion is only for the wh collection: a record of another collection with the webhook's rkey still matches it", () => {
    // clients use TIDs for every collection, so a post and a wh record of one repo may share an rkey
    const w = webhook(OWNER, "3kabc", `at://${OWNER}/app.bsky.feed.post`, { backlinks: true })
    const idx = indexOf(w)
    expect(run(idx, event(OWNER, "app.bsky.feed.post", "3kabc"))).toEqual(["3kabc:direct"])
    const like = { subject: { uri: `at://${OWNER}/app.bsky.feed.post/p1` } }
    expect(run(idx, event(OWNER, "app.bsky.feed.like", "3kabc", { record: like }))).toEqual(["3kabc:backlink"])
  })

  it("a wh record of another repo with the webhook's rkey is not its own record", () => {
    // rkeys are chosen by each owner's client (TIDs): two repos' wh records may share one
    const watcher = webhook(OWNER, "3kabc", `at://${ALICE}/place.wisp.v2.wh`)
    expect(run(indexOf(watcher), event(ALICE, "place.wisp.v2.wh", "3kabc"))).toEqual(["3kabc:direct"])
    const bl = webhook(OWNER, "3kabc", `at://${BOB}`, { backlinks: true })
    const record = { $type: "place.wisp.v2.wh", scope: { aturi: `at://${BOB}`, backlinks: true } }
    expect(run(indexOf(bl), event(ALICE, "place.wisp.v2.wh", "3kabc", { record }))).toEqual(["3kabc:backlink"])
  })

  it("self-exclusion also applies to backlink matches (a wh record references its own scope)", () => {
    const self = webhook(OWNER, "self", `at://${ALICE}`, { backlinks: true })
    const other = webhook(plc(2), "other", `at://${ALICE}`, { backlinks: true })
    const idx = indexOf(self, other)
    const record = { $type: "place.wisp.v2.wh", scope: { aturi: `at://${ALICE}`, backlinks: true } }
    expect(run(idx, event(OWNER, "place.wisp.v2.wh", "self", { record }))).toEqual(["other:backlink"])
  })
})

describe("backlink matching", () => {
  const didScope = webhook(OWNER, "didScope", `at://${ALICE}`, { backlinks: true })
  const collScope = webhook(OWNER, "collScope", `at://${ALICE}/app.bsky.feed.*`, { backlinks: true })
  const rkeyScope = webhook(OWNER, "rkeyScope", `at://${ALICE}/app.bsky.feed.post/3kabc`, { backlinks: true })
  const noBacklinks = webhook(OWNER, "noBacklinks", `at://${ALICE}`)
  const idx = indexOf(didScope, collScope, rkeyScope, noBacklinks)

  it("via an AT-URI string (with trailing punctuation)", () => {
    const like = { $type: "app.bsky.feed.like", subject: { uri: `at://${ALICE}/app.bsky.feed.post/3kabc),`, cid: "x" } }
    expect(run(idx, event(BOB, "app.bsky.feed.like", "l1", { record: like }))).toEqual([
      "collScope:backlink",
      "didScope:backlink",
      "rkeyScope:backlink"
    ])
    const other = { subject: { uri: `at://${ALICE}/app.bsky.feed.post/3kother` } }
    expect(run(idx, event(BOB, "app.bsky.feed.like", "l2", { record: other }))).toEqual([
      "collScope:backlink",
      "didScope:backlink"
    ])
    const list = { list: `at://${ALICE}/app.bsky.graph.list/abc` }
    expect(run(idx, event(BOB, "app.bsky.graph.listitem", "l3", { record: list }))).toEqual(["didScope:backlink"])
  })

  it("via a mention facet: only DID-only scopes", () => {
    const post = {
      $type: "app.bsky.feed.post",
      text: "hey @alice",
      facets: [{
        index: { byteStart: 4, byteEnd: 10 },
        features: [{ $type: "app.bsky.richtext.facet#mention", did: ALICE }]
      }]
    }
    expect(run(idx, event(BOB, "app.bsky.feed.post", "p1", { record: post }))).toEqual(["didScope:backlink"])
  })

  it("NOT via prose containing a URI, NOT via arbitrary did fields", () => {
    const prose = { text: `look at at://${ALICE}/app.bsky.feed.post/3kabc wow` }
    expect(run(idx, event(BOB, "app.bsky.feed.post", "p2", { record: prose }))).toEqual([])
    const dids = { did: ALICE, author: { did: ALICE }, subject: ALICE }
    expect(run(idx, event(BOB, "app.bsky.graph.follow", "f1", { record: dids }))).toEqual([])
  })

  it("a malformed event matches nothing by reference either (SPEC §2.2 step 1)", () => {
    const only = indexOf(didScope)
    const refs = [scope(`at://${ALICE}`)]
    expect(run(only, event(BOB, "x.y.z", "k"), refs)).toEqual(["didScope:backlink"])
    expect(run(only, { ...event(BOB, "x.y.z", "k"), rev: "not-a-tid" }, refs)).toEqual([])
    expect(run(only, event(BOB, "x.y.z", ".."), refs)).toEqual([])
  })

  it("backlinks=false never backlink-matches", () => {
    const only = indexOf(noBacklinks)
    const rec = { subject: `at://${ALICE}` }
    expect(run(only, event(BOB, "x.y.z", "k", { record: rec }))).toEqual([])
  })

  it("one result per webhook: direct wins when direct and backlink both hold", () => {
    const rec = { subject: { uri: `at://${ALICE}/app.bsky.feed.post/3kabc` }, again: `at://${ALICE}` }
    // ALICE likes her own post: direct for the DID and glob scopes, backlink for the rkey scope
    const r = matchEvent(idx, event(ALICE, "app.bsky.feed.like", "l9", { record: rec }), extractReferences(rec).refs)
    expect(r.map((m) => `${m.webhook.rkey}:${m.match}`).sort()).toEqual([
      "collScope:direct",
      "didScope:direct",
      "noBacklinks:direct",
      "rkeyScope:backlink"
    ])
    expect(new Set(r.map((m) => m.webhook)).size).toBe(r.length)
  })

  it("one result per webhook when several references match it", () => {
    const rec = { a: `at://${ALICE}`, b: `at://${ALICE}/app.bsky.feed.post/1`, c: `at://${ALICE}/app.bsky.feed.post/2` }
    expect(run(idx, event(BOB, "x.y.z", "k", { record: rec }))).toEqual(["collScope:backlink", "didScope:backlink"])
  })

  it("the events filter applies to backlink matches", () => {
    const onlyDelete = webhook(OWNER, "del", `at://${ALICE}`, { backlinks: true, events: ["delete"] })
    const i2 = indexOf(onlyDelete)
    const rec = { subject: `at://${ALICE}` }
    expect(run(i2, event(BOB, "x.y.z", "k", { record: rec }))).toEqual([])
    expect(run(i2, event(BOB, "x.y.z", "k", { operation: "delete" }), extractReferences(rec).refs)).toEqual([
      "del:backlink"
    ])
  })

  it("prior references: an update removing the reference still matches via the refs passed in", () => {
    const before = {
      $type: "app.bsky.feed.post",
      text: "x",
      reply: { parent: { uri: `at://${ALICE}/app.bsky.feed.post/3kabc` } }
    }
    const after = { $type: "app.bsky.feed.post", text: "x (edited, no reply)" }
    const prior = extractReferences(before).refs
    const fresh = extractReferences(after).refs
    expect(fresh).toEqual([])
    const upd = event(BOB, "app.bsky.feed.post", "p7", { operation: "update", record: after })
    expect(run(idx, upd, fresh)).toEqual([])
    expect(run(idx, upd, [...prior, ...fresh])).toEqual([
      "collScope:backlink",
      "didScope:backlink",
      "rkeyScope:backlink"
    ])
    // and a delete (no record at all) matches through the prior refs only
    const del = event(BOB, "app.bsky.feed.post", "p7", { operation: "delete" })
    expect(run(idx, del, prior)).toEqual(["collScope:backlink", "didScope:backlink", "rkeyScope:backlink"])
  })

  it("reference/scope rules: DID-only ref vs collection scope, collection ref without rkey vs rkey scope", () => {
    const didRef: ScopeUri = { did: ALICE, collection: undefined, rkey: undefined }
    const collRef: ScopeUri = { did: ALICE, collection: "app.bsky.feed.post", rkey: undefined }
    const other: ScopeUri = { did: BOB, collection: "app.bsky.feed.post", rkey: "3kabc" }
    const e = event(CAROL, "x.y.z", "k")
    expect(run(idx, e, [didRef])).toEqual(["didScope:backlink"])
    expect(run(idx, e, [collRef])).toEqual(["collScope:backlink", "didScope:backlink"])
    expect(run(idx, e, [other])).toEqual([])
  })

  it("a too-complex record does not backlink-match (the caller passes no refs) but still direct-matches", () => {
    let deep: unknown = `at://${ALICE}`
    for (let i = 0; i < 40; i++) deep = { deep }
    const x = extractReferences(deep)
    expect(x.tooComplex).toBe(true)
    expect(run(idx, event(BOB, "x.y.z", "k", { record: deep }), x.refs)).toEqual([])
    expect(run(idx, event(ALICE, "x.y.z", "k", { record: deep }), x.refs)).toEqual([
      "didScope:direct",
      "noBacklinks:direct"
    ])
  })

  it("sees index mutations on the next event", () => {
    const i2 = indexOf()
    const e = event(ALICE, "x.y.z", "k")
    expect(run(i2, e)).toEqual([])
    i2.upsert(webhook(OWNER, "late", `at://${ALICE}`))
    expect(run(i2, e)).toEqual(["late:direct"])
    i2.remove(`${OWNER}/late`)
    expect(run(i2, e)).toEqual([])
  })
})

describe("candidate selection looks only at scopes that can match (SPEC §2.5)", () => {
  // 1,000 webhooks on one scope DID (100 owners × 10, say, watching posts of one popular account),
  // each on its own record, backlinks on; each webhook counts how often the matcher tests it
  const tested = { n: 0 }
  const counted = (w: ActiveWebhook): ActiveWebhook => ({
    ...w,
    matchesCollection: (c: string) => {
      tested.n++
      return w.matchesCollection(c)
    }
  })
  const many = Array.from(
    { length: 1000 },
    (_, i) =>
      counted(webhook(plc(100 + (i % 100)), `w${i}`, `at://${ALICE}/app.bsky.feed.post/p${i}`, { backlinks: true }))
  )
  const glob = counted(webhook(OWNER, "glob", `at://${ALICE}/app.bsky.feed.*`))
  const didOnly = counted(webhook(OWNER, "did", `at://${ALICE}`, { backlinks: true }))
  const idx = indexOf(...many, glob, didOnly)

  it("a direct event tests the webhooks of its record, its collection, the DID-only and glob scopes, not the other 999", () => {
    tested.n = 0
    expect(run(idx, event(ALICE, "app.bsky.feed.post", "p7"))).toEqual(["did:direct", "glob:direct", "w7:direct"])
    expect(tested.n).toBeLessThanOrEqual(3)
  })

  it("a reference tests the webhooks of the record it names; a DID-only reference only the DID-only scopes", () => {
    tested.n = 0
    const like = event(BOB, "app.bsky.feed.like", "l1", {
      record: { subject: { uri: `at://${ALICE}/app.bsky.feed.post/p42`, cid: "bafy" } }
    })
    expect(run(idx, like)).toEqual(["did:backlink", "w42:backlink"])
    expect(tested.n).toBeLessThanOrEqual(3)
    tested.n = 0
    const mention = event(BOB, "app.bsky.feed.post", "m1", {
      record: { facets: [{ features: [{ $type: "app.bsky.richtext.facet#mention", did: ALICE }] }] }
    })
    expect(run(idx, mention)).toEqual(["did:backlink"])
    expect(tested.n).toBeLessThanOrEqual(1)
  })

  it("many webhooks with one glob on the DID: the pattern is tested once for an event it does not match", () => {
    const same = Array.from(
      { length: 500 },
      (_, i) => counted(webhook(plc(100 + (i % 100)), `g${i}`, `at://${ALICE}/app.bsky.feed.*`))
    )
    const i2 = indexOf(...same)
    tested.n = 0
    expect(run(i2, event(ALICE, "app.bsky.graph.follow", "f1"))).toEqual([])
    expect(tested.n).toBeLessThanOrEqual(1)
    expect(run(i2, event(ALICE, "app.bsky.feed.like", "l1"))).toHaveLength(500)
  })

  it("a glob scope removed or replaced leaves the DID's lookup: its pattern is no longer tested", () => {
    const g1 = counted(webhook(OWNER, "g1", `at://${ALICE}/app.bsky.feed.*`))
    const g2 = counted(webhook(OWNER, "g2", `at://${ALICE}/app.bsky.graph.*/k1`))
    const i2 = indexOf(g1, g2, webhook(OWNER, "keep", `at://${ALICE}`))
    i2.remove(g1.key)
    i2.upsert(webhook(OWNER, "g2", `at://${ALICE}`))
    tested.n = 0
    expect(run(i2, event(ALICE, "app.bsky.feed.post", "k1"))).toEqual(["g2:direct", "keep:direct"])
    expect(run(i2, event(ALICE, "app.bsky.graph.follow", "k1"))).toEqual(["g2:direct", "keep:direct"])
    expect(tested.n).toBe(0)
  })

  it("a webhook replaced or removed leaves its old scope's lookup", () => {
    const i2 = indexOf(...many.slice(0, 3))
    i2.upsert(webhook(plc(100), "w0", `at://${ALICE}/app.bsky.feed.post/moved`, { backlinks: true }))
    i2.remove(many[1]?.key ?? "")
    expect(run(i2, event(ALICE, "app.bsky.feed.post", "p0"))).toEqual([])
    expect(run(i2, event(ALICE, "app.bsky.feed.post", "p1"))).toEqual([])
    expect(run(i2, event(ALICE, "app.bsky.feed.post", "moved"))).toEqual(["w0:direct"])
    expect(run(i2, event(ALICE, "app.bsky.feed.post", "p2"))).toEqual(["w2:direct"])
  })
})

describe("referenceMatchesScope (SPEC §2.2 step 5, on its own)", () => {
  const ref = (uri: string): ScopeUri => scope(uri)
  const post = `at://${BOB}/app.bsky.feed.post/p1`

  it("a scope with a collection needs a reference with a matching collection: a DID-only reference never matches it", () => {
    const coll = webhook(OWNER, "c", `at://${BOB}/app.bsky.feed.post`, { backlinks: true })
    const glob = webhook(OWNER, "g", `at://${BOB}/app.bsky.feed.*`, { backlinks: true })
    for (const w of [coll, glob]) {
      expect(referenceMatchesScope(w, ref(`at://${BOB}`))).toBe(false)
      expect(referenceMatchesScope(w, ref(post))).toBe(true)
      expect(referenceMatchesScope(w, ref(`at://${BOB}/app.bsky.graph.follow/p1`))).toBe(false)
    }
    expect(referenceMatchesScope(webhook(OWNER, "d", `at://${BOB}`, { backlinks: true }), ref(`at://${BOB}`))).toBe(
      true
    )
  })

  it("a scope with an rkey needs the reference's rkey to equal it", () => {
    const one = webhook(OWNER, "r", post, { backlinks: true })
    expect(referenceMatchesScope(one, ref(post))).toBe(true)
    expect(referenceMatchesScope(one, ref(`at://${BOB}/app.bsky.feed.post/p2`))).toBe(false)
    expect(referenceMatchesScope(one, ref(`at://${BOB}/app.bsky.feed.post`))).toBe(false)
  })
})
