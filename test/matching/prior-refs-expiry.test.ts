/**
 * The prior-reference key index forgets expired keys (SPEC §2.4: "TTL 7 days, table bound 100,000
 * rows"; "when the table is full, new keys are refused … while existing keys stay updatable").
 * Maintenance deletes expired rows, possibly in another process (SPEC §6.4 roles); the index, which
 * the table bound is checked against, must forget those keys too, or once it has reached the bound
 * it refuses every new key for ever although the table is empty. And it must never forget a key
 * whose row is still in the table (the bound could then be exceeded).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, TestClock } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import {
  boundRefs,
  defaultPriorRefLimits,
  EXPIRY_CHECK,
  PriorRefIndex
} from "../../src/services/matching/PriorRefIndex.js"
import { layerSql, PriorRefsStore } from "../../src/services/matching/PriorRefsStore.js"
import { make as makeProcessor, Processor } from "../../src/services/matching/Processor.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Db from "../support/db.js"
import { ev, memoryStack, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const OWNER = plc(1)
const SUBJECT = plc(2)
const AUTHOR = plc(3)
const POST = "app.bsky.feed.post"
const subjectPost = `at://${SUBJECT}/${POST}/3kpostpostpo2`

const run = (batch: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, { registryWriter: true }))
const stats = Effect.flatMap(Processor, (p) => p.stats)
const rows = Effect.flatMap(PriorRefsStore, (s) => s.count)
const outcome = (batch: ReadonlyArray<StreamEvent>) => Effect.map(run(batch), (r) => r.outcomes[0]?._tag)

let nextRev = 100
const reply = (rkey: string) =>
  ev(AUTHOR, POST, rkey, { rev: rev(nextRev++), record: { reply: { parent: { uri: subjectPost } } } })
const unreferenced = (rkey: string) =>
  ev(AUTHOR, POST, rkey, { rev: rev(nextRev++), operation: "update", record: { text: "no reference" } })

/** A backlink webhook on SUBJECT (its own record references SUBJECT: one key), then replies up to `keys` keys. */
const fill = (keys: number) =>
  Effect.gen(function*() {
    yield* run([whEv(OWNER, "bl", whRecordValue(`at://${SUBJECT}`, { backlinks: true }), { rev: rev(1) })])
    for (let start = 1; start < keys; start += 100) {
      yield* run(Array.from({ length: Math.min(100, keys - start) }, (_, i) => reply(`old${start + i}`)))
    }
    expect(yield* stats).toMatchObject({ priorRefKeys: keys, priorRefsRefused: 0, priorRefIndexComplete: true })
    expect(yield* rows).toBe(keys)
    // full: a new key is refused
    expect(yield* outcome([reply("refused")])).toBe("enqueued")
    expect((yield* stats).priorRefsRefused).toBe(1)
  })

/**
 * A new reply is stored again (not refused), and an update that removes its reference still
 * matches through its prior references.
 */
const storedAndUpdatable = (rkey: string) =>
  Effect.gen(function*() {
    const refusedBefore = (yield* stats).priorRefsRefused
    expect(yield* outcome([reply(rkey)])).toBe("enqueued")
    expect((yield* stats).priorRefsRefused).toBe(refusedBefore)
    expect(yield* outcome([unreferenced(rkey)])).toBe("enqueued")
  })

describe("the prior-reference key index forgets expired keys (in memory, TestClock)", () => {
  it.effect("a full table admits new keys again once its rows have expired", () =>
    Effect.gen(function*() {
      yield* fill(3)
      // a minute before the TTL ends nothing has expired: still full
      yield* TestClock.adjust("59 minutes")
      expect(yield* outcome([reply("early")])).toBe("enqueued")
      expect((yield* stats).priorRefsRefused).toBe(2)
      expect((yield* stats).priorRefKeys).toBe(3)
      // the TTL has passed: the rows expired, the index forgets their keys
      yield* TestClock.adjust("2 minutes")
      yield* storedAndUpdatable("new")
      expect(yield* stats).toMatchObject({ priorRefKeys: 0, priorRefsRefused: 2 })
      expect(yield* rows).toBe(0)
    }).pipe(
      Effect.provide(memoryStack({ priorLimits: { maxRefs: 100, maxBytes: 32 * 1024, ttlSeconds: 3600, maxRows: 3 } }))
    ))
})

describe("the prior-reference key index forgets expired keys (PostgreSQL)", () => {
  const expireAll = Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql`UPDATE prior_refs SET expires_at = now() - interval '1 second'`.pipe(Effect.orDie)
  )

  it.effect(
    "rows pruned by maintenance (its own statement): the table admits new keys again; a row still there keeps its key",
    () =>
      Effect.gen(function*() {
        yield* fill(1000)
        // the process clock says the TTL has passed, but the table (its now()) says the rows
        // live on: no key is forgotten before its row, the table stays full
        yield* TestClock.adjust("7 days")
        yield* TestClock.adjust("1 minute")
        expect(yield* outcome([reply("early")])).toBe("enqueued")
        expect(yield* stats).toMatchObject({ priorRefKeys: 1000, priorRefsRefused: 2 })
        expect(yield* rows).toBe(1000)
        // a week later every row has expired, and maintenance pruned them
        yield* expireAll
        expect((yield* Maintenance.runOnce()).prior_refs).toBe(1000)
        expect(yield* rows).toBe(0)
        yield* TestClock.adjust("7 days")
        yield* TestClock.adjust("1 minute")
        yield* storedAndUpdatable("new")
        expect(yield* stats).toMatchObject({ priorRefKeys: 0, priorRefsRefused: 2 })
      }).pipe(Effect.provide(sqlStack({ env: { PRIOR_REFS_MAX_ROWS: "1000" } }))),
    { timeout: 120_000 }
  )

  it.effect(
    "without maintenance (another role, or none): the index's check deletes the expired rows itself",
    () =>
      Effect.gen(function*() {
        yield* fill(1000)
        yield* expireAll
        yield* TestClock.adjust("7 days")
        yield* TestClock.adjust("1 minute")
        yield* storedAndUpdatable("new")
        // the reply's row was created and then cleared; the expired rows are gone
        expect(yield* rows).toBe(0)
        expect(yield* stats).toMatchObject({ priorRefKeys: 0, priorRefsRefused: 1 })
        // and the table is usable up to its bound again
        yield* run(Array.from({ length: 100 }, (_, i) => reply(`again${i}`)))
        expect(yield* rows).toBe(100)
        expect((yield* stats).priorRefKeys).toBe(100)
      }).pipe(Effect.provide(sqlStack({ env: { PRIOR_REFS_MAX_ROWS: "1000" } }))),
    { timeout: 120_000 }
  )
})

describe("an index over its bound at load (the bound was lowered)", () => {
  it.scoped("admits no new key until a check loads it again within the bound", () =>
    Effect.gen(function*() {
      yield* fill(3)
      // a processor with a bound of 2 over the 3 stored rows: its index is incomplete
      const limits = { maxRefs: 100, maxBytes: 32 * 1024, ttlSeconds: 3600, maxRows: 2 }
      const lowered = yield* makeProcessor(limits)
      const runLowered = (batch: ReadonlyArray<StreamEvent>) => lowered.processEvents(batch, { registryWriter: true })
      expect(yield* lowered.stats).toMatchObject({ priorRefKeys: 3, priorRefIndexComplete: false })
      // two of the stored records drop their reference: 1 row left, still incomplete
      yield* runLowered([unreferenced("old1"), unreferenced("old2")])
      expect(yield* rows).toBe(1)
      yield* runLowered([reply("refused")])
      expect(yield* lowered.stats).toMatchObject({ priorRefKeys: 1, priorRefsRefused: 1, priorRefIndexComplete: false })
      // a minute later the check loads the keys again: within the bound, complete, a new key is admitted
      yield* TestClock.adjust("1 minute")
      yield* runLowered([reply("admitted")])
      expect(yield* lowered.stats).toMatchObject({ priorRefKeys: 2, priorRefsRefused: 1, priorRefIndexComplete: true })
      expect(yield* rows).toBe(2)
    }).pipe(
      Effect.provide(memoryStack({ priorLimits: { maxRefs: 100, maxBytes: 32 * 1024, ttlSeconds: 3600, maxRows: 3 } }))
    ))
})

describe("an index over its bound at load: a stored key it did not load stays updatable", () => {
  // SPEC §2.4: "when the table is full, new keys are refused … while existing keys stay updatable".
  // An incomplete index reads every candidate from the table, so it knows the key has a row.
  it.scoped("an update of a stored record whose key is not in the index is written, not refused", () =>
    Effect.gen(function*() {
      yield* fill(4)
      const limits = { maxRefs: 100, maxBytes: 32 * 1024, ttlSeconds: 3600, maxRows: 2 }
      const lowered = yield* makeProcessor(limits)
      // it loads 3 keys of the 4 (its bound + 1): incomplete, old3's key is not among them
      expect(yield* lowered.stats).toMatchObject({ priorRefKeys: 3, priorRefIndexComplete: false })
      const other = `at://${SUBJECT}/${POST}/3kotherpost22`
      const update = ev(AUTHOR, POST, "old3", {
        rev: rev(nextRev++),
        operation: "update",
        record: { reply: { parent: { uri: other } } }
      })
      const r = yield* lowered.processEvents([update], { registryWriter: true })
      expect(r.outcomes[0]?._tag).toBe("enqueued")
      expect((yield* lowered.stats).priorRefsRefused).toBe(0)
      const stored = yield* Effect.flatMap(PriorRefsStore, (s) => s.read([`at://${AUTHOR}/${POST}/old3`]))
      expect(stored.get(`at://${AUTHOR}/${POST}/old3`)).toMatchObject({ rev: update.rev, refs: [other] })
      expect(yield* rows).toBe(4)
    }).pipe(
      Effect.provide(memoryStack({ priorLimits: { maxRefs: 100, maxBytes: 32 * 1024, ttlSeconds: 3600, maxRows: 4 } }))
    ))
})

describe("PriorRefIndex: when it asks the table, and what it does with the answer (time passed in)", () => {
  const HOUR = 3_600_000
  const uri = (i: number) => `at://${AUTHOR}/${POST}/k${i}`
  const stored = (n: number, ttlMs: (i: number) => number) =>
    Array.from({ length: n }, (_, i) => ({ recordUri: uri(i), ttlMs: ttlMs(i) }))

  it("asks nothing before a key is due; then the due keys, oldest first, at most a batch; a backlog is asked at once", () => {
    const x = new PriorRefIndex(10_000, HOUR)
    // loaded in any order: k0 expires last
    x.reload(stored(1500, (i) => (i === 0 ? HOUR + 30_000 : HOUR + i)), 0)
    expect(x.expiryStep(HOUR)).toEqual({ _tag: "none" })
    const first = x.expiryStep(HOUR + 2000)
    expect(first._tag === "check" && first.keys.length).toBe(EXPIRY_CHECK.maxKeys)
    expect(first._tag === "check" && first.keys.slice(0, 3)).toEqual([uri(1), uri(2), uri(3)])
    x.expired(first._tag === "check" ? first.keys : [], new Map(), HOUR + 2000)
    expect(x.keys.size).toBe(500)
    // more keys were due than one batch: asked at once, not a minute later
    const second = x.expiryStep(HOUR + 2001)
    expect(second._tag === "check" && second.keys.length).toBe(499)
    x.expired(second._tag === "check" ? second.keys : [], new Map(), HOUR + 2001)
    expect([...x.keys.keys()]).toEqual([uri(0)])
    expect(x.expiryStep(HOUR + 30_000)).toEqual({ _tag: "none" }) // due, but within the minute
    expect(x.expiryStep(HOUR + 2001 + EXPIRY_CHECK.intervalMs)._tag).toBe("check")
  })

  it("a key whose row is still there is kept, and asked about again when the table says it expires", () => {
    const x = new PriorRefIndex(10_000, HOUR)
    x.reload(stored(3, () => HOUR), 0)
    const step = x.expiryStep(HOUR)
    expect(step).toEqual({ _tag: "check", keys: [uri(0), uri(1), uri(2)] })
    // the table (its clock a little ahead) says k1 lives 5 more minutes; k0 and k2 are gone
    x.expired([uri(0), uri(1), uri(2)], new Map([[uri(1), 300_000]]), HOUR)
    expect([...x.keys]).toEqual([[uri(1), HOUR + 300_000]])
    expect(x.keyDids.get(AUTHOR)).toBe(1)
    expect(x.expiryStep(HOUR + 299_999)).toEqual({ _tag: "none" })
    expect(x.expiryStep(HOUR + 300_000)).toEqual({ _tag: "check", keys: [uri(1)] })
  })

  it("a written key moves to the end, due a TTL after the write; a full index is checked at once", () => {
    const x = new PriorRefIndex(3, HOUR)
    x.reload([], 0)
    x.follow([], [uri(0), uri(1)], 0)
    x.follow([], [uri(2), uri(0)], 10)
    expect([...x.keys]).toEqual([[uri(1), HOUR], [uri(2), HOUR + 10], [uri(0), HOUR + 10]])
    expect(x.expiryStep(HOUR)).toEqual({ _tag: "check", keys: [uri(1)] })
    x.expired([uri(1)], new Map([[uri(1), 1]]), HOUR)
    // full (3 keys of 3): the interval does not apply
    expect(x.expiryStep(HOUR + 10)).toEqual({ _tag: "check", keys: [uri(1), uri(2), uri(0)] })
  })

  it("keys a commit of unknown outcome may have written past the bound make the index incomplete", () => {
    const x = new PriorRefIndex(2, HOUR)
    x.reload([], 0)
    x.mayHaveWritten([uri(0), uri(1)], 0)
    expect(x.complete).toBe(true)
    x.mayHaveWritten([uri(2)], 0)
    expect(x.complete).toBe(false)
    expect(x.keys.size).toBe(3)
  })

  it("an incomplete index (over its bound at load) loads the keys again at each check", () => {
    const x = new PriorRefIndex(2, HOUR)
    x.reload(stored(3, () => HOUR), 0)
    expect(x.complete).toBe(false)
    expect(x.expiryStep(1)).toEqual({ _tag: "none" })
    expect(x.expiryStep(EXPIRY_CHECK.intervalMs)).toEqual({ _tag: "reload" })
    x.reload(stored(2, () => HOUR), EXPIRY_CHECK.intervalMs)
    expect(x.complete).toBe(true)
  })
})

describe("PriorRefsStore.expire on PostgreSQL", () => {
  it.effect(
    "deletes the expired rows asked about; reports the others still there (a row another transaction holds: 0 ms)",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const store = yield* PriorRefsStore
        const row = (u: string, seconds: number) =>
          sql`INSERT INTO prior_refs (record_uri, rev, refs, bytes, expires_at)
          VALUES (${u}, '3kabc', '[]'::jsonb, 2, now() + make_interval(secs => ${seconds}))`
        yield* row("at://a/live", 3600)
        yield* row("at://a/expired", -1)
        yield* row("at://a/held", -1)
        yield* row("at://a/other", -1)
        // another transaction (maintenance deleting it) holds one expired row
        const locked = yield* Deferred.make<void>()
        const release = yield* Deferred.make<void>()
        const holder = yield* Effect.fork(
          sql.withTransaction(Effect.gen(function*() {
            yield* sql`SELECT 1 FROM prior_refs WHERE record_uri = 'at://a/held' FOR UPDATE`
            yield* Deferred.succeed(locked, undefined)
            yield* Deferred.await(release)
          }))
        )
        yield* Deferred.await(locked)
        const left = yield* store.expire(["at://a/live", "at://a/expired", "at://a/held", "at://a/absent"])
        expect([...left.keys()].sort()).toEqual(["at://a/held", "at://a/live"])
        expect(left.get("at://a/held")).toBe(0)
        expect(left.get("at://a/live")).toBeGreaterThan(3_500_000)
        expect(left.get("at://a/live")).toBeLessThanOrEqual(3_600_000)
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        const remaining = yield* sql<{ record_uri: string }>`SELECT record_uri FROM prior_refs ORDER BY 1`
        // a row not asked about is left to maintenance
        expect(remaining.map((r) => r.record_uri)).toEqual(["at://a/held", "at://a/live", "at://a/other"])
      }).pipe(Effect.provide(layerSql.pipe(Layer.provideMerge(Db.layer())))),
    { timeout: 60_000 }
  )
})

describe("boundRefs: a stored row's bounds (SPEC §2.4: ≤ 100 refs, ≤ 32 KiB)", () => {
  const uris = Array.from({ length: 150 }, (_, i) => `at://${plc(1)}/app.bsky.feed.post/k${i}`)

  it("keeps at most maxRefs references, in order", () => {
    const r = boundRefs(uris, defaultPriorRefLimits)
    expect(r.refs).toEqual(uris.slice(0, defaultPriorRefLimits.maxRefs))
  })

  it("keeps a reference that fits exactly (the count: brackets, then per reference its quotes and a comma)", () => {
    const one = uris[0] ?? ""
    const exact = 2 + Buffer.byteLength(one) + 3
    expect(boundRefs([one], { ...defaultPriorRefLimits, maxBytes: exact })).toEqual({ refs: [one], bytes: exact })
    expect(boundRefs([one], { ...defaultPriorRefLimits, maxBytes: exact - 1 })).toEqual({ refs: [], bytes: 2 })
  })

  it("never counts more bytes than maxBytes, and the stored JSON fits them", () => {
    for (let maxBytes = 2; maxBytes <= 400; maxBytes++) {
      const r = boundRefs(uris, { ...defaultPriorRefLimits, maxBytes })
      expect(r.bytes).toBeLessThanOrEqual(maxBytes)
      expect(Buffer.byteLength(JSON.stringify(r.refs))).toBeLessThanOrEqual(maxBytes)
    }
  })
})
