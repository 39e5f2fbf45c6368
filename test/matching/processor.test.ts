/**
 * processEvents end to end on the in-memory stores: registry mutations, matching (SPEC §2.2–2.4),
 * fencing (§3.4), admission (§2.6) and what lands in the outbox.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { type ProcessOptions, Processor } from "../../src/services/matching/Processor.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { ev, memoryStack, plc, rev, WH, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const DAVE = plc(4)
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"

const W = { registryWriter: true } satisfies ProcessOptions

const run = (batch: ReadonlyArray<StreamEvent>, options: ProcessOptions = W) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, options))

const outboxRows = Effect.gen(function*() {
  const s = yield* Ref.get(yield* Outbox.MemoryOutboxState)
  return [...s.rows.values()]
})
const deliveriesTo = (owner: string, rkey: string) =>
  Effect.map(outboxRows, (rows) => rows.filter((r) => r.ownerDid === owner && r.webhookRkey === rkey))

const register = (owner: string, rkey: string, record: Record<string, unknown>, n = 1) =>
  run([whEv(owner, rkey, record, { rev: rev(n) })])

describe("matching through processEvents", () => {
  it.effect("DID-only, collection, glob and rkey scopes", () =>
    Effect.gen(function*() {
      yield* register(ALICE, "did", whRecordValue(`at://${BOB}`))
      yield* register(ALICE, "coll", whRecordValue(`at://${BOB}/${POST}`))
      yield* register(ALICE, "glob", whRecordValue(`at://${BOB}/app.bsky.feed.*`))
      yield* register(ALICE, "rkey", whRecordValue(`at://${BOB}/${POST}/3kpost`))
      const result = yield* run([
        ev(BOB, POST, "3kpost", { rev: rev(10) }),
        ev(BOB, POST, "other", { rev: rev(11) }),
        ev(BOB, LIKE, "l1", { rev: rev(12) }),
        ev(BOB, "app.bsky.graph.follow", "f1", { rev: rev(13) }),
        ev(CAROL, POST, "3kpost", { rev: rev(14) })
      ])
      expect(result.outcomes.map((o) => o._tag)).toEqual(["enqueued", "enqueued", "enqueued", "enqueued", "no_match"])
      expect((yield* deliveriesTo(ALICE, "did")).length).toBe(4)
      expect((yield* deliveriesTo(ALICE, "coll")).map((r) => r.eventRkey).sort()).toEqual(["3kpost", "other"])
      expect((yield* deliveriesTo(ALICE, "glob")).map((r) => r.eventCollection).sort()).toEqual([LIKE, POST, POST])
      expect((yield* deliveriesTo(ALICE, "rkey")).map((r) => r.eventRkey)).toEqual(["3kpost"])
      expect((yield* outboxRows).every((r) => r.matchKind === "direct")).toBe(true)
    }).pipe(Effect.provide(memoryStack())))

  it.effect("the events filter", () =>
    Effect.gen(function*() {
      yield* register(ALICE, "w", whRecordValue(`at://${BOB}/${POST}`, { events: ["delete"] }))
      yield* run([
        ev(BOB, POST, "p", { rev: rev(10) }),
        ev(BOB, POST, "p", { rev: rev(11), operation: "update" }),
        ev(BOB, POST, "p", { rev: rev(12), operation: "delete" })
      ])
      expect((yield* deliveriesTo(ALICE, "w")).map((r) => r.eventOperation)).toEqual(["delete"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("disabled records are stored, never matched, and re-enabling activates them", () =>
    Effect.gen(function*() {
      const r = yield* register(ALICE, "w", whRecordValue(`at://${BOB}`, { enabled: false }))
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "disabled" } })
      const stored = yield* (yield* RegistryStore).get(ALICE, "w")
      expect(stored.row?.active).toBe(false)
      yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
      expect(yield* outboxRows).toEqual([])
      yield* register(ALICE, "w", whRecordValue(`at://${BOB}`, { enabled: true }), 2)
      yield* run([ev(BOB, POST, "p2", { rev: rev(11) })])
      expect((yield* deliveriesTo(ALICE, "w")).map((x) => x.eventRkey)).toEqual(["p2"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("self-exclusion: a webhook never gets its own record's event; others watching wh records do, without the secret", () =>
    Effect.gen(function*() {
      yield* register(BOB, "watcher", whRecordValue(`at://${ALICE}/${WH}`))
      yield* register(ALICE, "self", whRecordValue(`at://${ALICE}`, { secret: "inline-secret-value" }), 2)
      const rows = yield* outboxRows
      expect(rows.map((r) => `${r.ownerDid}/${r.webhookRkey}`)).toEqual([`${BOB}/watcher`])
      const bodies = (yield* Ref.get(yield* Outbox.MemoryOutboxState)).events
      const body = [...bodies.values()][0]?.body ?? ""
      expect(body).toContain("\"rkey\":\"self\"")
      expect(body).not.toContain("inline-secret-value")
      expect(JSON.parse(body).record.secret).toBeUndefined()
      // the self webhook (DID scope on Alice) still gets Alice's other records
      yield* run([ev(ALICE, POST, "p", { rev: rev(10) })])
      expect((yield* deliveriesTo(ALICE, "self")).length).toBe(1)
    }).pipe(Effect.provide(memoryStack())))

  it.effect("one delivery per (event, webhook) even when it matches directly and by backlink", () =>
    Effect.gen(function*() {
      yield* register(ALICE, "w", whRecordValue(`at://${BOB}`, { backlinks: true }))
      const r = yield* run([
        ev(BOB, POST, "p", { rev: rev(10), record: { text: "self ref", subject: `at://${BOB}/${POST}/x` } })
      ])
      expect(r.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
      expect((yield* deliveriesTo(ALICE, "w")).map((x) => x.matchKind)).toEqual(["direct"])
    }).pipe(Effect.provide(memoryStack())))
})

describe("backlinks and prior references", () => {
  const bobPost = `at://${BOB}/${POST}/3kbobpost`
  const likeOf = (uri: string) => ({ $type: LIKE, subject: { uri, cid: "bafyx" }, createdAt: "2026-01-01T00:00:00Z" })

  it.effect("an AT-URI string (trailing punctuation allowed) and a mention facet are references; prose and `did` fields are not", () =>
    Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      yield* run([
        ev(ALICE, LIKE, "l1", { rev: rev(10), record: likeOf(bobPost) }),
        ev(ALICE, POST, "q1", { rev: rev(11), record: { text: "x", embed: { uri: `${bobPost}).` } } }),
        ev(ALICE, POST, "m1", {
          rev: rev(12),
          record: {
            text: "hi @bob",
            facets: [{ features: [{ $type: "app.bsky.richtext.facet#mention", did: BOB }] }]
          }
        }),
        ev(ALICE, POST, "prose", { rev: rev(13), record: { text: `look at ${bobPost} please` } }),
        ev(ALICE, POST, "didfield", { rev: rev(14), record: { text: "x", author: { did: BOB } } })
      ])
      const got = (yield* deliveriesTo(BOB, "bl")).map((r) => `${r.eventRkey}:${r.matchKind}`).sort()
      expect(got).toEqual(["l1:backlink", "m1:backlink", "q1:backlink"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("backlinks:false never matches by reference; a collection-scoped backlink needs the collection", () =>
    Effect.gen(function*() {
      yield* register(CAROL, "nobl", whRecordValue(`at://${BOB}`))
      yield* register(CAROL, "postsonly", whRecordValue(`at://${BOB}/${POST}`, { backlinks: true }), 2)
      yield* run([
        ev(ALICE, LIKE, "l1", { rev: rev(10), record: likeOf(bobPost) }),
        ev(ALICE, LIKE, "l2", { rev: rev(11), record: likeOf(`at://${BOB}/app.bsky.feed.generator/g`) })
      ])
      expect(yield* deliveriesTo(CAROL, "nobl")).toEqual([])
      expect((yield* deliveriesTo(CAROL, "postsonly")).map((r) => r.eventRkey)).toEqual(["l1"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("an update that removes the reference, and a delete, still match through prior references", () => {
    const calls = { get: 0, put: 0, remove: 0 }
    return Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      const base = { ...calls }
      yield* run([
        ev(ALICE, POST, "r1", { rev: rev(10), record: { text: "x", reply: { parent: { uri: bobPost } } } }),
        ev(ALICE, LIKE, "r2", { rev: rev(10), record: likeOf(bobPost) })
      ])
      expect(calls.put - base.put).toBe(2)
      yield* run([ev(ALICE, POST, "r1", { rev: rev(11), operation: "update", record: { text: "edited, no ref" } })])
      yield* run([ev(ALICE, LIKE, "r2", { rev: rev(11), operation: "delete" })])
      const got = (yield* deliveriesTo(BOB, "bl")).map((r) => `${r.eventRkey}:${r.eventOperation}:${r.matchKind}`)
        .sort()
      expect(got).toEqual(["r1:create:backlink", "r1:update:backlink", "r2:create:backlink", "r2:delete:backlink"])
      // the update cleared r1's stored refs and the delete removed r2's: later events no longer match
      yield* run([
        ev(ALICE, POST, "r1", { rev: rev(12), operation: "update", record: { text: "again" } }),
        ev(ALICE, POST, "r1", { rev: rev(13), operation: "delete" })
      ])
      expect((yield* deliveriesTo(BOB, "bl")).length).toBe(4)
      // a replayed older update cannot overwrite newer prior-reference state
      yield* run([ev(ALICE, POST, "r3", { rev: rev(20), record: { r: bobPost } })])
      const putsBefore = calls.put
      yield* run([ev(ALICE, POST, "r3", { rev: rev(19), operation: "update", record: { r: `${bobPost}x` } })])
      // the batch read r3's row (rev 20): the older update is not even sent to the store
      expect(calls.put).toBe(putsBefore)
      yield* run([ev(ALICE, POST, "r3", { rev: rev(21), operation: "update", record: { text: "none" } })])
      expect((yield* deliveriesTo(BOB, "bl")).filter((r) => r.eventRkey === "r3").map((r) => r.eventOperation)).toEqual(
        [
          "create",
          "update",
          "update"
        ]
      )
    }).pipe(Effect.provide(memoryStack({ calls })))
  })

  it.effect("a create never matches on stored references: they belong to a version whose delete was missed (SPEC §2.2 step 5)", () =>
    Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      yield* run([ev(ALICE, POST, "c1", { rev: rev(10), record: { text: "x", r: bobPost } })])
      // the record's delete never arrived (a gap); its rkey is created again, without the reference
      const r = yield* run([ev(ALICE, POST, "c1", { rev: rev(12), record: { text: "new" } })])
      expect(r.outcomes.map((o) => o._tag)).toEqual(["no_match"])
      expect((yield* deliveriesTo(BOB, "bl")).map((x) => x.eventOperation)).toEqual(["create"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("a referencing record created and deleted in the same batch matches both times", () =>
    Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      yield* run([
        ev(ALICE, LIKE, "quick", { rev: rev(10), record: likeOf(bobPost) }),
        ev(ALICE, LIKE, "quick", { rev: rev(11), operation: "delete" })
      ])
      const got = (yield* deliveriesTo(BOB, "bl")).map((r) => `${r.eventOperation}:${r.matchKind}`)
      expect(got).toEqual(["create:backlink", "delete:backlink"])
      // and the key index did not keep the removed key
      expect((yield* (yield* Processor).stats).priorRefKeys).toBe(1) // the wh record's own refs
    }).pipe(Effect.provide(memoryStack())))

  it.effect("an irrelevant record costs zero prior-reference reads and writes", () => {
    const calls = { get: 0, put: 0, remove: 0 }
    return Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      // (the wh record itself references at://bob, so registering stored one row)
      calls.get = 0
      calls.put = 0
      calls.remove = 0
      yield* run([
        ev(ALICE, POST, "x1", { rev: rev(10), record: { text: "no refs" } }),
        ev(ALICE, POST, "x1", { rev: rev(11), operation: "update", record: { text: "still none" } }),
        ev(ALICE, LIKE, "x2", { rev: rev(12), record: likeOf(`at://${CAROL}/${POST}/p`) }),
        ev(ALICE, LIKE, "x2", { rev: rev(13), operation: "delete" })
      ])
      expect(calls).toEqual({ get: 0, put: 0, remove: 0 })
      expect(yield* outboxRows).toEqual([])
    }).pipe(Effect.provide(memoryStack({ calls })))
  })

  it.effect("a too-complex record skips backlink matching (counted) but still matches directly", () =>
    Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      yield* register(CAROL, "direct", whRecordValue(`at://${ALICE}`), 2)
      let deep: Record<string, unknown> = { uri: bobPost }
      for (let i = 0; i < 40; i++) deep = { nested: deep }
      yield* run([ev(ALICE, POST, "deep", { rev: rev(10), record: deep })])
      expect(yield* deliveriesTo(BOB, "bl")).toEqual([])
      expect((yield* deliveriesTo(CAROL, "direct")).length).toBe(1)
      expect((yield* (yield* Processor).stats).tooComplex).toBe(1)
    }).pipe(Effect.provide(memoryStack())))

  it.effect("a too-complex update ignores the stored prior references too (no backlink match), still matches directly, and clears them", () =>
    Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      yield* register(CAROL, "direct", whRecordValue(`at://${ALICE}`), 2)
      yield* run([ev(ALICE, LIKE, "r", { rev: rev(10), record: likeOf(bobPost) })])
      expect((yield* deliveriesTo(BOB, "bl")).map((r) => `${r.eventOperation}:${r.matchKind}`)).toEqual([
        "create:backlink"
      ])
      expect((yield* (yield* Processor).stats).priorRefKeys).toBe(2) // BOB's wh record and the like
      let deep: Record<string, unknown> = { uri: bobPost }
      for (let i = 0; i < 40; i++) deep = { nested: deep }
      const r = yield* run([ev(ALICE, LIKE, "r", { rev: rev(11), operation: "update", record: deep })])
      expect(r.outcomes.map((o) => o._tag)).toEqual(["enqueued"])
      expect((yield* (yield* Processor).stats).tooComplex).toBe(1)
      // the stored reference to bob's post did not make the too-complex update a backlink match
      expect((yield* deliveriesTo(BOB, "bl")).map((x) => x.eventOperation)).toEqual(["create"])
      expect((yield* deliveriesTo(CAROL, "direct")).map((x) => `${x.eventOperation}:${x.matchKind}`).sort()).toEqual([
        "create:direct",
        "update:direct"
      ])
      // its references are the empty set: the stored row is cleared (SPEC §2.4)...
      expect((yield* (yield* Processor).stats).priorRefKeys).toBe(1)
      // ...so a later delete does not backlink-match on the old version's references
      yield* run([ev(ALICE, LIKE, "r", { rev: rev(12), operation: "delete" })])
      expect((yield* deliveriesTo(BOB, "bl")).map((x) => x.eventOperation)).toEqual(["create"])
      expect((yield* deliveriesTo(CAROL, "direct")).length).toBe(3)
      // and a later simple re-creation matches on its own references again
      yield* run([ev(ALICE, LIKE, "r", { rev: rev(13), record: likeOf(bobPost) })])
      expect((yield* deliveriesTo(BOB, "bl")).map((x) => x.eventOperation)).toEqual(["create", "create"])
    }).pipe(Effect.provide(memoryStack())))

  it.effect("a full prior-reference table refuses new keys but keeps existing ones updatable", () => {
    const calls = { get: 0, put: 0, remove: 0 }
    return Effect.gen(function*() {
      yield* register(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }))
      calls.put = 0
      yield* run([
        ev(ALICE, POST, "a", { rev: rev(10), record: { r: bobPost } }),
        ev(ALICE, POST, "b", { rev: rev(11), record: { r: bobPost } })
      ])
      expect(calls.put).toBe(1)
      expect((yield* (yield* Processor).stats).priorRefsRefused).toBe(1)
      yield* run([ev(ALICE, POST, "a", { rev: rev(12), operation: "update", record: { r: `${bobPost}2` } })])
      expect(calls.put).toBe(2)
    }).pipe(
      Effect.provide(memoryStack({ calls, priorLimits: { maxRefs: 100, maxBytes: 32768, ttlSeconds: 60, maxRows: 2 } }))
    )
  })
})

describe("fencing (SPEC §3.4)", () => {
  it.effect("an older replayed create after a newer delete is ignored, even with a later relay time", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(5), timeUs: 1_000 })])
      yield* run([whEv(ALICE, "w", undefined, { rev: rev(6), operation: "delete", timeUs: 2_000 })])
      const replay = yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(5), timeUs: 9_000 })])
      expect(replay.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
      expect((yield* Registry).index.size).toBe(0)
      const stored = yield* (yield* RegistryStore).get(ALICE, "w")
      expect(stored.row).toBeUndefined()
      expect(stored.tombstone?.rev).toBe(rev(6))
    }).pipe(Effect.provide(memoryStack())))

  it.effect("an equal rev changes nothing", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`, { url: "https://a.example/1" }), { rev: rev(5) })])
      const r = yield* run([
        whEv(ALICE, "w", whRecordValue(`at://${BOB}`, { url: "https://a.example/2" }), { rev: rev(5) })
      ])
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
      expect((yield* Registry).index.get(`${ALICE}/w`)?.url).toBe("https://a.example/1")
    }).pipe(Effect.provide(memoryStack())))

  it.effect("a delete leaves a tombstone that blocks an older upsert of a record never seen before", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "w", undefined, { rev: rev(4), operation: "delete" })])
      const r = yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(3) })])
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
      expect((yield* Registry).index.size).toBe(0)
      // a newer create does apply
      const r2 = yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(7) })])
      expect(r2.outcomes[0]).toMatchObject({ registry: { _tag: "active" } })
    }).pipe(Effect.provide(memoryStack())))

  it.effect("each applied write bumps the owner's generation and stamps the row", () =>
    Effect.gen(function*() {
      const store = yield* RegistryStore
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${CAROL}`), { rev: rev(2), operation: "update" })])
      expect((yield* store.owner(ALICE))?.generation).toBe(2)
      expect((yield* store.get(ALICE, "w")).row?.generation).toBe(2)
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${CAROL}`), { rev: rev(1) })])
      expect((yield* store.owner(ALICE))?.generation).toBe(2)
    }).pipe(Effect.provide(memoryStack())))

  it.effect("an invalid record revokes the previous registration and fences older valid replays", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      const r = yield* run([
        whEv(ALICE, "w", { ...whRecordValue(`at://${BOB}`), url: "http://10.0.0.1/x" }, {
          rev: rev(2),
          operation: "update"
        })
      ])
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "invalid", kind: "url", revoked: true } })
      expect((yield* Registry).index.size).toBe(0)
      const replay = yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      expect(replay.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
      expect((yield* Registry).index.size).toBe(0)
    }).pipe(Effect.provide(memoryStack())))

  it.effect("the relay firehose and direct streams do not write the registry unless they are the writer", () =>
    Effect.gen(function*() {
      const r = yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })], { registryWriter: false })
      expect(r.outcomes[0]?._tag).toBe("no_match")
      expect((yield* Registry).index.size).toBe(0)
    }).pipe(Effect.provide(memoryStack())))
})

describe("admission (SPEC §2.6)", () => {
  it.effect("the 101st active record of one owner is rejected (counted, quarantined); 500 disabled ones use no capacity", () =>
    Effect.gen(function*() {
      const disabled = Array.from(
        { length: 500 },
        (_, i) => whEv(ALICE, `off${i}`, whRecordValue(`at://${BOB}`, { enabled: false }), { rev: rev(1) })
      )
      for (let i = 0; i < disabled.length; i += 100) yield* run(disabled.slice(i, i + 100))
      const active = Array.from(
        { length: 101 },
        (_, i) => whEv(ALICE, `on${String(i).padStart(3, "0")}`, whRecordValue(`at://${BOB}`), { rev: rev(2) })
      )
      const r1 = yield* run(active.slice(0, 100))
      expect(r1.outcomes.every((o) => "registry" in o && o.registry?._tag === "active")).toBe(true)
      const r2 = yield* run(active.slice(100))
      expect(r2.outcomes[0]).toMatchObject({
        _tag: "quarantined",
        reason: "invalid_subscription",
        registry: { _tag: "rejected", limit: "owner" }
      })
      const registry = yield* Registry
      expect(registry.index.size).toBe(100)
      expect((yield* registry.stats).rejected.owner).toBe(1)
      const q = (yield* Ref.get(yield* Outbox.MemoryOutboxState)).quarantine
      expect(q.map((x) => x.reason)).toEqual(["invalid_subscription"])
      expect(JSON.stringify(q, (_, v) => (typeof v === "bigint" ? v.toString() : v))).not.toContain("receiver.example")
    }).pipe(Effect.provide(memoryStack())))

  it.effect("a delete in a later commit of the batch frees no room for an earlier create", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "y", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      // two commits (two revs): the create comes first, while the owner is at its limit
      const r = yield* run([
        whEv(ALICE, "x", whRecordValue(`at://${BOB}`), { rev: rev(2) }),
        whEv(ALICE, "y", undefined, { operation: "delete", rev: rev(3) })
      ])
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "rejected", limit: "owner" } })
      expect(r.outcomes[1]).toMatchObject({ registry: { _tag: "deleted" } })
      expect((yield* Registry).index.byOwner(ALICE)).toEqual([])
    }).pipe(Effect.provide(memoryStack({ env: { REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" } }))))

  it.effect("a record over a limit is still an event: a webhook watching wh records gets it", () =>
    Effect.gen(function*() {
      yield* register(BOB, "watcher", whRecordValue(`at://${ALICE}/${WH}`))
      yield* register(ALICE, "w1", whRecordValue(`at://${CAROL}`), 2)
      const r = yield* register(ALICE, "w2", whRecordValue(`at://${CAROL}`), 3)
      expect(r.outcomes[0]).toMatchObject({
        _tag: "quarantined",
        reason: "invalid_subscription",
        registry: { _tag: "rejected", limit: "owner" }
      })
      expect((yield* deliveriesTo(BOB, "watcher")).map((x) => x.eventRkey).sort()).toEqual(["w1", "w2"])
    }).pipe(Effect.provide(memoryStack({ env: { REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" } }))))

  it.effect("a rejected update revokes the previous registration", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "w1", whRecordValue(`at://${ALICE}`), { rev: rev(1) })])
      yield* run([whEv(BOB, "w2", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      const registry = yield* Registry
      expect(registry.index.size).toBe(2)
      // scope moves to a third DID: alice, bob, dave = 3 > 2
      const r = yield* run([whEv(ALICE, "w1", whRecordValue(`at://${DAVE}`), { rev: rev(2), operation: "update" })])
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "rejected", limit: "direct_dids", revoked: true } })
      expect(registry.index.get(`${ALICE}/w1`)).toBeUndefined()
      expect((yield* (yield* RegistryStore).get(ALICE, "w1")).row).toBeUndefined()
      yield* run([ev(ALICE, POST, "p", { rev: rev(9) })])
      expect(yield* deliveriesTo(ALICE, "w1")).toEqual([])
    }).pipe(Effect.provide(memoryStack({ env: { REGISTRY_DIRECT_SCOPE_DIDS_MAX: "2" } }))))

  it.effect("the backlink scope DID limit: reaching it is allowed, only a DID beyond it is refused", () =>
    Effect.gen(function*() {
      const r1 = yield* run([whEv(ALICE, "b1", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
      expect(r1.outcomes[0]).toMatchObject({ registry: { _tag: "active" } })
      // the same backlink scope DID again: no new DID, admitted
      const r2 = yield* run([
        whEv(ALICE, "b3", whRecordValue(`at://${BOB}/${POST}`, { backlinks: true }), { rev: rev(1) })
      ])
      expect(r2.outcomes[0]).toMatchObject({ registry: { _tag: "active" } })
      const r = yield* run([whEv(ALICE, "b2", whRecordValue(`at://${CAROL}`, { backlinks: true }), { rev: rev(1) })])
      expect(r.outcomes[0]).toMatchObject({ registry: { _tag: "rejected", limit: "backlink_dids" } })
      // a webhook on that DID without backlinks takes no backlink scope DID
      const r3 = yield* run([whEv(ALICE, "d1", whRecordValue(`at://${CAROL}`), { rev: rev(1) })])
      expect(r3.outcomes[0]).toMatchObject({ registry: { _tag: "active" } })
      const registry = yield* Registry
      expect(registry.index.size).toBe(3)
      expect((yield* registry.stats).rejected).toMatchObject({ backlink_dids: 1, total: 0, owner: 0 })
    }).pipe(Effect.provide(memoryStack({ env: { REGISTRY_BACKLINK_SCOPE_DIDS_MAX: "1" } }))))
})
