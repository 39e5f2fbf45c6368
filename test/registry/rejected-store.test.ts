/**
 * The store of the records firehook refused (SPEC §8.5 `list`, state `rejected`), on PostgreSQL and
 * in memory: the same contract (listed newest first with reason, cid, rev and times; fenced by rev;
 * cleared by a version that is not older; the newest 100 per owner), the table's columns (never a
 * record body, URL or secret), and maintenance's bounds (age, row bound).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it, type Vitest } from "@effect/vitest"
import { Effect, Layer, TestClock } from "effect"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import * as Db from "../support/db.js"
import { plc, rev } from "../support/stack.js"

const refusal = (
  ownerDid: string,
  rkey: string,
  n: number,
  o: Partial<RejectedStore.Refusal> = {}
): RejectedStore.Refusal => ({
  ownerDid,
  rkey,
  rev: rev(n),
  cid: `bafy${rkey}${n}`,
  reason: "url",
  source: "stream",
  ...o
})

const store = RejectedStore.RejectedStore

/**
 * Time passing between two writes, for the memory store (PostgreSQL's `now()` is the time of each
 * write's own transaction, later for a later write).
 */
const tick = TestClock.adjust("1 second")

const seen = (e: RejectedStore.RejectedRecord | undefined) => ({
  first: e?.firstSeenAt.getTime() ?? Number.NaN,
  last: e?.lastSeenAt.getTime() ?? Number.NaN
})

/** The contract, run against each driver (owners are distinct per test: a driver's state is shared). */
const contract = (it: Vitest.MethodsNonLive<RejectedStore.RejectedStore>, base: number) => {
  it.effect("a refusal is listed with its reason, cid, rev, source and times", () =>
    Effect.gen(function*() {
      const s = yield* store
      const owner = plc(base + 1)
      expect(yield* s.record(refusal(owner, "a", 5, { reason: "secret_id" }))).toBe(true)
      expect(yield* s.record(refusal(owner, "b", 6, { reason: "limit_owner", source: "reconciliation" }))).toBe(true)
      expect(yield* s.record(refusal(plc(base + 2), "a", 7))).toBe(true)
      const listed = yield* s.list(owner)
      expect(listed.map((e) => ({ ...e, firstSeenAt: undefined, lastSeenAt: undefined }))).toEqual([
        {
          ownerDid: owner,
          rkey: "b",
          rev: rev(6),
          cid: "bafyb6",
          reason: "limit_owner",
          source: "reconciliation",
          firstSeenAt: undefined,
          lastSeenAt: undefined
        },
        {
          ownerDid: owner,
          rkey: "a",
          rev: rev(5),
          cid: "bafya5",
          reason: "secret_id",
          source: "stream",
          firstSeenAt: undefined,
          lastSeenAt: undefined
        }
      ])
      for (const e of listed) {
        expect(e.firstSeenAt).toBeInstanceOf(Date)
        expect(e.lastSeenAt.getTime()).toBe(e.firstSeenAt.getTime())
      }
      expect((yield* s.list(owner, 1)).map((e) => e.rkey)).toEqual(["b"])
      // the limit is clamped to 1..perOwner and rounded down
      expect((yield* s.list(owner, 0)).map((e) => e.rkey)).toEqual(["b"])
      expect((yield* s.list(owner, -5)).map((e) => e.rkey)).toEqual(["b"])
      expect((yield* s.list(owner, 1.9)).map((e) => e.rkey)).toEqual(["b"])
      expect(yield* s.list(plc(base + 3))).toEqual([])
    }))

  it.effect("fenced by rev: an older refusal never overwrites a newer entry; the same or a newer one updates it, keeping first seen", () =>
    Effect.gen(function*() {
      const s = yield* store
      const owner = plc(base + 10)
      yield* s.record(refusal(owner, "k", 5, { reason: "url" }))
      const [first] = yield* s.list(owner)
      yield* tick
      // an older replay
      expect(yield* s.record(refusal(owner, "k", 4, { reason: "events", cid: "bafyold" }))).toBe(false)
      expect(yield* s.list(owner)).toEqual([first])
      // a newer version refused for another reason
      yield* tick
      expect(yield* s.record(refusal(owner, "k", 9, { reason: "limit_total", cid: "bafynew" }))).toBe(true)
      const [now] = yield* s.list(owner)
      expect(now).toMatchObject({ rev: rev(9), reason: "limit_total", cid: "bafynew" })
      expect(seen(now).first).toBe(seen(first).first)
      expect(seen(now).last).toBeGreaterThan(seen(first).last)
      // the same version seen again (same rev) updates the entry too: it is not newer
      yield* tick
      expect(yield* s.record(refusal(owner, "k", 9, { reason: "limit_total", cid: "bafynew" }))).toBe(true)
      const [again] = yield* s.list(owner)
      expect(seen(again).first).toBe(seen(first).first)
      expect(seen(again).last).toBeGreaterThan(seen(now).last)
    }))

  it.effect("a clear drops the entry only when the entry is not newer than the clearing version", () =>
    Effect.gen(function*() {
      const s = yield* store
      const owner = plc(base + 20)
      yield* s.record(refusal(owner, "k", 5))
      yield* s.record(refusal(owner, "other", 5))
      expect(yield* s.clear(owner, "k", rev(4))).toBe(false)
      expect((yield* s.list(owner)).map((e) => e.rkey).sort()).toEqual(["k", "other"])
      expect(yield* s.clear(owner, "k", rev(6))).toBe(true)
      expect((yield* s.list(owner)).map((e) => e.rkey)).toEqual(["other"])
      // after a clear the key starts afresh
      yield* tick
      yield* s.record(refusal(owner, "k", 7))
      const listed = yield* s.list(owner)
      expect(seen(listed.find((e) => e.rkey === "k")).first).toBeGreaterThan(
        seen(listed.find((e) => e.rkey === "other")).first
      )
      // a clear at the entry's own rev drops it (the entry is not newer than the clearing version)
      expect(yield* s.clear(owner, "other", rev(5))).toBe(true)
      expect((yield* s.list(owner)).map((e) => e.rkey)).toEqual(["k"])
    }))

  it.effect("the newest 100 per owner: the 101st entry drops the oldest, other owners untouched", () =>
    Effect.gen(function*() {
      const s = yield* store
      const owner = plc(base + 30)
      const other = plc(base + 31)
      yield* s.record(refusal(other, "x", 1))
      for (let i = 0; i < 100; i++) yield* s.record(refusal(owner, `r${String(i).padStart(3, "0")}`, 100 + i))
      expect((yield* s.list(owner)).length).toBe(100)
      yield* tick
      yield* s.record(refusal(owner, "r100", 300))
      const listed = yield* s.list(owner)
      expect(listed.length).toBe(100)
      expect(listed[0]?.rkey).toBe("r100")
      expect(listed.map((e) => e.rkey)).not.toContain("r000")
      expect(listed.map((e) => e.rkey)).toContain("r001")
      // the oldest entry is gone from the store, not only from the page listed (a clear finds nothing)
      expect(yield* s.clear(owner, "r000", rev(1_000))).toBe(false)
      // re-seeing an entry that is already kept drops nothing
      yield* tick
      yield* s.record(refusal(owner, "r001", 301))
      expect((yield* s.list(owner)).length).toBe(100)
      expect((yield* s.list(owner))[0]?.rkey).toBe("r001")
      expect((yield* s.list(other)).map((e) => e.rkey)).toEqual(["x"])
      // reads are bounded
      expect((yield* s.list(owner, 1_000)).length).toBe(100)
    }))
}

describe("RejectedStore (memory)", () => {
  it.layer(RejectedStore.layerMemory)((it) => contract(it, 0))
})

describe("RejectedStore (PostgreSQL)", () => {
  it.layer(RejectedStore.layerSql.pipe(Layer.provideMerge(Db.layer())), { timeout: "60 seconds" })((it) => {
    contract(it, 1_000)

    it.effect("the table holds no record body, URL or secret: exactly these columns", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const columns = yield* sql<{ column_name: string }>`
          SELECT column_name FROM information_schema.columns WHERE table_name = 'rejected_records'
          ORDER BY column_name`
        expect(columns.map((c) => c.column_name)).toEqual([
          "cid",
          "first_seen_at",
          "last_seen_at",
          "owner_did",
          "reason",
          "rev",
          "rkey",
          "source"
        ])
      }))

    it.effect("maintenance prunes entries last seen before the quarantine's retention, then beyond the row bound (oldest first)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const s = yield* store
        yield* sql`DELETE FROM rejected_records`
        const owner = plc(2_001)
        for (let i = 0; i < 6; i++) yield* s.record(refusal(owner, `k${i}`, i + 1))
        // k0 was last seen 31 days ago, k1 29 days ago
        yield* sql`UPDATE rejected_records SET last_seen_at = now() - interval '31 days' WHERE rkey = 'k0'`
        yield* sql`UPDATE rejected_records SET last_seen_at = now() - interval '29 days' WHERE rkey = 'k1'`
        // the defaults (30 days, 1,000,000 rows) prune k0 only
        expect(Maintenance.DEFAULT_RETENTION.rejectedMaxRows).toBe(1_000_000)
        expect((yield* Maintenance.runOnce()).rejected_records).toBe(1)
        expect((yield* s.list(owner)).map((e) => e.rkey).sort()).toEqual(["k1", "k2", "k3", "k4", "k5"])
        // beyond the 3 newest: k1 and k2 (the oldest seen)
        expect((yield* Maintenance.runOnce({ rejectedMaxRows: 3 })).rejected_records).toBe(2)
        expect((yield* s.list(owner)).map((e) => e.rkey).sort()).toEqual(["k3", "k4", "k5"])
        // the quarantine's retention governs the age
        yield* sql`UPDATE rejected_records SET last_seen_at = now() - interval '2 hours' WHERE rkey = 'k3'`
        expect((yield* Maintenance.runOnce({ quarantine: "1 hour" })).rejected_records).toBe(1)
        expect((yield* s.list(owner)).map((e) => e.rkey).sort()).toEqual(["k4", "k5"])
      }))
  })
})
