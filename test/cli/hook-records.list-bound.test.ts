/**
 * `firehook hooks list` at its bound (src/cli/HookRecords.ts, `list`): at most `MAX_LIST_PAGES`
 * pages of `LIST_PAGE_SIZE`, and "more exist" only when a record lies beyond them. A PDS (the
 * reference PDS, and ./hook-records-fake-pds.ts) sends a cursor with every page that has records,
 * the last one too, so the cursor of the 50th page alone does not say that more exist: one
 * `listRecords` of limit 1 from it does. A PDS that answers a cursor with that same cursor again
 * (it did not move on) ends the listing, and that page's records are not listed a second time.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import * as Hooks from "../../src/cli/HookRecords.js"
import { type FakePds, fakePds, PDS_DID } from "./hook-records-fake-pds.js"
import { POSTS, run, signedIn, URL_A, WH } from "./hook-records-support.js"

const value = { $type: WH, scope: { aturi: POSTS }, url: URL_A, createdAt: "2026-01-01T00:00:00Z" }
const key = (i: number) => `k${String(i).padStart(5, "0")}`
const fill = (pds: FakePds, n: number) => {
  for (let i = 0; i < n; i++) pds.records.set(key(i), { cid: pds.nextCid(), value })
}
const listCalls = (pds: FakePds) =>
  pds.calls.filter((c) => c.nsid === "com.atproto.repo.listRecords").map((c) => ({
    limit: c.query.get("limit"),
    cursor: c.query.get("cursor")
  }))
const BOUND = Hooks.LIST_PAGE_SIZE * Hooks.MAX_LIST_PAGES

describe("firehook hooks list: the page bound", () => {
  it.scoped(
    "4,950 records: all of them over 50 pages, not truncated (the probe after the last page finds none)",
    () =>
      Effect.gen(function*() {
        const pds = yield* fakePds
        fill(pds, BOUND - 50)
        const listed = yield* signedIn(pds, (h) => h.list)
        expect(listed.webhooks.map((w) => w.rkey)).toEqual([...pds.records.keys()].sort())
        expect(listed.truncated).toBe(false)
        const calls = listCalls(pds)
        expect(calls).toHaveLength(Hooks.MAX_LIST_PAGES + 1)
        // the probe: limit 1 from the cursor of the 50th page (its last record)
        expect(calls.at(-1)).toEqual({ limit: "1", cursor: key(BOUND - 51) })
        // the command says no more exist
        pds.calls.length = 0
        const r = yield* run(pds, ["list"])
        expect(r.code, r.line).toBe(0)
        expect(r.stdout).not.toContain("more exist")
        const json = yield* run(pds, ["list", "--json"])
        expect(json.code, json.line).toBe(0)
        expect(JSON.parse(json.stdout)).toMatchObject({ truncated: false })
      }),
    { timeout: 120_000 }
  )

  it.scoped("exactly 5,000 records: not truncated; 5,001: the first 5,000 and truncated", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      fill(pds, BOUND)
      const exact = yield* signedIn(pds, (h) => h.list)
      expect(exact.webhooks).toHaveLength(BOUND)
      expect(exact.truncated).toBe(false)
      pds.records.set(key(BOUND), { cid: pds.nextCid(), value })
      pds.calls.length = 0
      const over = yield* signedIn(pds, (h) => h.list)
      expect(over.webhooks).toHaveLength(BOUND)
      expect(over.webhooks.at(-1)?.rkey).toBe(key(BOUND - 1))
      expect(over.truncated).toBe(true)
      expect(listCalls(pds).at(-1)).toEqual({ limit: "1", cursor: key(BOUND - 1) })
      const r = yield* run(pds, ["list"])
      expect(r.stdout).toContain(`(the first ${BOUND} records; more exist)`)
    }), { timeout: 120_000 })

  it.scoped("a PDS that answers a cursor with the same cursor: the listing ends there, no record listed twice", () =>
    Effect.gen(function*() {
      const pds = yield* fakePds
      const record = (rkey: string) => ({
        uri: `at://${PDS_DID}/${WH}/${rkey}`,
        cid: "bafyreiej5wohacte5wj4l44s4wx3q6dhaeslgqf6x6d7nkq7i6xrwzdxsy",
        value
      })
      // the same page (and cursor) for every cursor
      pds.override.set("com.atproto.repo.listRecords", () => ({
        status: 200,
        body: { records: [record("same")], cursor: "same" }
      }))
      const looping = yield* signedIn(pds, (h) => h.list)
      expect(looping).toEqual({ did: PDS_DID, webhooks: [expect.objectContaining({ rkey: "same" })], truncated: false })
      expect(listCalls(pds)).toEqual([{ limit: "100", cursor: null }, { limit: "100", cursor: "same" }])
      // a PDS that moves on once, then repeats its second page with its cursor
      pds.calls.length = 0
      pds.override.set("com.atproto.repo.listRecords", (call) => ({
        status: 200,
        body: call.query.get("cursor") === null
          ? { records: [record("a1"), record("a2")], cursor: "a2" }
          : { records: [record("b1")], cursor: "b1" }
      }))
      const stuck = yield* signedIn(pds, (h) => h.list)
      expect(stuck.webhooks.map((w) => w.rkey)).toEqual(["a1", "a2", "b1"])
      expect(stuck.truncated).toBe(false)
      expect(listCalls(pds).map((c) => c.cursor)).toEqual([null, "a2", "b1"])
    }))
})
