/**
 * Reconciliation remembers the records it omits as invalid (SPEC §8.5 `rejected`, §5.3), and a
 * completed snapshot that no longer holds a refused key clears its entry. A real PostgreSQL, a fake
 * PLC and PDS (real HTTP servers on loopback), the registry stream through the real Processor.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { entries, listed, live, memoryRkeys, reconcile, setRepo } from "../support/refusals.js"
import { ev, plc, rev, WH, whRecordValue } from "../support/stack.js"

const BOB = plc(9_997)
const valid = (o: Parameters<typeof whRecordValue>[1] = {}) => whRecordValue(`at://${BOB}`, o)
/** refused in production mode and accepted nowhere: `ftp:` (error kind `url`) */
const badUrl = () => valid({ url: "ftp://receiver.example/hook" })
const badEvents = () => ({ ...valid(), events: ["create", "create"] })

/** The repo's rev at the first and the second scan. */
const SNAP = rev(100)
const SNAP2 = rev(200)

describe("reconciliation's refused records", () => {
  layer(Layer.fresh(RejectedStore.layerSql.pipe(Layer.provideMerge(reconcileStack()))), {
    timeout: "120 seconds",
    excludeTestServices: true
  })("snapshots", (it) => {
    it.effect("the records a snapshot omits as invalid are listed with their kind, cid and the snapshot's rev", () =>
      Effect.gen(function*() {
        const did = plc(501)
        yield* setRepo(did, SNAP, [
          { rkey: "ok", value: valid() },
          { rkey: "url", value: badUrl() },
          { rkey: "events", value: badEvents(), cid: "bafycustom" },
          { rkey: "notobj", value: "a string" },
          // valid, but PostgreSQL cannot store a NUL: omitted as `unstorable`
          { rkey: "nul", value: { ...valid(), secret: "a\u0000b" } }
        ])
        expect(yield* reconcile(did)).toBe("complete")
        expect(yield* memoryRkeys(did)).toEqual(["ok"])
        expect(yield* listed(did)).toEqual([
          { rkey: "events", rev: SNAP, cid: "bafycustom", reason: "events", source: "reconciliation" },
          { rkey: "notobj", rev: SNAP, cid: "bafynotobj", reason: "not_object", source: "reconciliation" },
          { rkey: "nul", rev: SNAP, cid: "bafynul", reason: "unstorable", source: "reconciliation" },
          { rkey: "url", rev: SNAP, cid: "bafyurl", reason: "url", source: "reconciliation" }
        ])
      }))

    it.effect("a later snapshot clears the keys it no longer refuses (deleted or fixed) and refreshes the others", () =>
      Effect.gen(function*() {
        const did = plc(502)
        yield* setRepo(did, SNAP, [
          { rkey: "gone", value: badUrl() },
          { rkey: "fixed", value: badUrl() },
          { rkey: "still", value: badUrl() }
        ])
        expect(yield* reconcile(did)).toBe("complete")
        expect((yield* listed(did)).map((e) => e.rkey)).toEqual(["fixed", "gone", "still"])
        const before = (yield* entries(did)).find((e) => e.rkey === "still")
        // the owner deleted `gone` and fixed `fixed`; `still` is still invalid (for another reason)
        yield* setRepo(did, SNAP2, [{ rkey: "fixed", value: valid() }, { rkey: "still", value: badEvents() }])
        expect(yield* reconcile(did)).toBe("complete")
        expect(yield* listed(did)).toEqual([
          { rkey: "still", rev: SNAP2, cid: "bafystill", reason: "events", source: "reconciliation" }
        ])
        const after = (yield* entries(did)).find((e) => e.rkey === "still")
        expect(after?.firstSeenAt).toEqual(before?.firstSeenAt)
        expect(yield* memoryRkeys(did)).toEqual(["fixed"])
      }))

    it.effect("a repo that is not found clears every entry older than the snapshot", () =>
      Effect.gen(function*() {
        const did = plc(503)
        yield* setRepo(did, SNAP, [{ rkey: "bad", value: badUrl() }])
        expect(yield* reconcile(did)).toBe("complete")
        expect((yield* listed(did)).map((e) => e.rkey)).toEqual(["bad"])
        const fakes = yield* Fakes
        fakes.repos.delete(did)
        expect(yield* reconcile(did)).toBe("complete")
        expect(yield* listed(did)).toEqual([])
      }))

    it.effect("stream entries: one older than the snapshot whose key it lacks is cleared, a newer one stays", () =>
      Effect.gen(function*() {
        const did = plc(504)
        // before any scan: no fence, the stream refuses both
        expect(
          yield* live([
            ev(did, WH, "old", { record: badUrl(), rev: rev(50), cid: "bafyold" }),
            ev(did, WH, "new", { record: badUrl(), rev: rev(150), cid: "bafynew" })
          ])
        ).toEqual(["invalid", "invalid"])
        // the snapshot (rev 100) holds neither
        yield* setRepo(did, SNAP, [{ rkey: "ok", value: valid() }])
        expect(yield* reconcile(did)).toBe("complete")
        expect(yield* listed(did)).toEqual([
          { rkey: "new", rev: rev(150), cid: "bafynew", reason: "url", source: "stream" }
        ])
      }))

    it.effect("an invalid version in a snapshot older than the stored valid one is not recorded (no newer state is undone)", () =>
      Effect.gen(function*() {
        const did = plc(505)
        // the stream's valid version at rev 150, then a snapshot at rev 100 that lists an older, invalid one
        expect(yield* live([ev(did, WH, "w", { record: valid(), rev: rev(150) })])).toEqual(["active"])
        yield* setRepo(did, SNAP, [{ rkey: "w", value: badUrl() }])
        expect(yield* reconcile(did)).toBe("complete")
        expect(yield* listed(did)).toEqual([])
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        // an invalid stream version newer than the snapshot is not overwritten by an older snapshot's view
        expect(yield* live([ev(did, WH, "w", { record: badEvents(), rev: rev(160), operation: "update" })])).toEqual([
          "invalid"
        ])
        yield* setRepo(did, rev(155), [{ rkey: "w", value: badUrl() }])
        expect(yield* reconcile(did)).toBe("complete")
        expect(yield* listed(did)).toEqual([
          { rkey: "w", rev: rev(160), cid: "bafyreib2rxk3rh6kzwq", reason: "events", source: "stream" }
        ])
      }))

    it.effect("an owner keeps its newest 100 across pages", () =>
      Effect.gen(function*() {
        const did = plc(506)
        const records = Array.from({ length: 120 }, (_, i) => ({
          rkey: `r${String(i).padStart(3, "0")}`,
          value: badUrl()
        }))
        yield* setRepo(did, SNAP, records)
        expect(yield* reconcile(did)).toBe("complete")
        const rkeys = (yield* entries(did)).map((e) => e.rkey)
        expect(rkeys.length).toBe(100)
        // the fake PDS lists rkeys in descending order: the second page (r019 .. r000) is the newest
        for (let i = 0; i < 20; i++) expect(rkeys).toContain(`r${String(i).padStart(3, "0")}`)
      }))
  })
})
