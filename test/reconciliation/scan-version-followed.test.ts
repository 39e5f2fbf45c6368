/**
 * A live write that reaches intake during its owner's scan, older than the version the scan already
 * stored for its key (a page's row, or step 4's tombstone, both at the snapshot's rev), is `stale`
 * by that version; the in-memory index then takes the scan's version (what the scan's swap will
 * register or drop), as it follows a write that lands before the page (`followDuringScan`).
 * Before, the index kept the pre-scan registration until completion: a webhook created or moved
 * just before the snapshot missed its events (the moved one's rows went to the old URL), and a
 * deleted webhook kept its admission slot, so a new record of its owner was refused `limit_owner`
 * and stayed refused after the completion (which requests nothing). A version a live write stored
 * since the scan began is not the scan's: an older replay of it changes nothing.
 * A real PostgreSQL, a fake PLC and PDS (real HTTP servers on loopback).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { didDoc } from "../support/fakeAtproto.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { ev, plc, rev, whEv, whRecordValue } from "../support/stack.js"

const BOB = plc(9_998)
const FIRST = "https://receiver.example/hook"
const hook = (url = FIRST) => whRecordValue(`at://${BOB}`, { url })
/** the repo's rev when the owner is scanned (getLatestCommit) */
const SNAP = rev(100)
const LIST_RECORDS = "/xrpc/com.atproto.repo.listRecords"

/** Process events as the registry stream's batch; the registry outcome of each. */
const live = (events: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true })).pipe(
    Effect.map((r) => r.outcomes.map((o) => (o._tag === "no_match" ? o.registry?._tag : o._tag)))
  )
const stored = (did: string, rkey: string) => Effect.flatMap(RegistryStore, (s) => s.get(did, rkey))
const memory = (did: string) =>
  Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => [w.rkey, w.url] as const).sort())
const memoryRkeys = (did: string) => Effect.map(memory(did), (m) => m.map(([rkey]) => rkey))

/**
 * Hold the fake PDS's listing pages of `did` that carry a cursor (every page after the first), so
 * that the scan has applied its first page; `asked` resolves once such a page is requested.
 */
const holdAfterFirstPage = (did: string) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    let release: () => void = () => undefined
    let signal: () => void = () => undefined
    const gate = new Promise<void>((resolve) => (release = resolve))
    const asked = new Promise<void>((resolve) => (signal = resolve))
    fakes.pds.handler = async (req) => {
      if (req.path === LIST_RECORDS && req.query.get("repo") === did && req.query.get("cursor") !== null) {
        signal()
        await gate
      }
      return fakes.defaultPds(req)
    }
    return {
      asked: Effect.promise(() => asked).pipe(
        Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "no page" })
      ),
      release: () => {
        release()
        fakes.pds.handler = fakes.defaultPds
      }
    }
  })

describe("a live write older than its owner's scan's version of the key", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })("after the scan's page", (it) => {
    it.effect("a webhook created or moved just before the snapshot, its write landing after the page: the events after it match the snapshot's version", () =>
      Effect.gen(function*() {
        const did = plc(4_801)
        const moved = "https://moved.example/hook"
        const movedAgain = "https://moved-again.example/hook"
        const fakes = yield* Fakes
        fakes.docs.set(did, didDoc(did, fakes.pds.url))
        // on the PDS: `keep` moved (rev 90) then moved again (rev 95); `n` created (rev 90); snapshot at 100
        fakes.repos.set(did, {
          rev: SNAP,
          records: [{ rkey: "keep", value: hook(movedAgain) }, { rkey: "n", value: hook() }]
        })
        // before the scan: `keep` at its first URL
        expect(yield* live([whEv(did, "keep", hook(), { rev: rev(10) })])).toEqual(["active"])
        const held = yield* holdAfterFirstPage(did)
        const fiber = yield* Effect.fork(Effect.flatMap(Reconciler, (r) => r.reconcile(did)))
        yield* held.asked
        expect(yield* Effect.flatMap(ReconcileStore, (s) => s.ownerState(did))).toMatchObject({
          status: "scanning",
          snapshotRev: SNAP
        })
        // the page wrote both keys at the snapshot's rev (store only)
        expect((yield* stored(did, "n")).row?.rev).toBe(SNAP)
        expect((yield* stored(did, "keep")).row?.url).toBe(movedAgain)
        expect(yield* memory(did)).toEqual([["keep", FIRST]])
        // the stream lags the PDS: the rev-90 writes arrive now, older than the page's rows
        expect(
          yield* live([whEv(did, "keep", hook(moved), { rev: rev(90) }), whEv(did, "n", hook(), { rev: rev(90) })])
        ).toEqual(["stale", "stale"])
        // the index takes the scan's versions (newer than the writes), not the pre-scan registration
        expect(yield* memory(did)).toEqual([["keep", movedAgain], ["n", FIRST]])
        // BOB's next post matches both as the snapshot has them
        expect(yield* live([ev(BOB, "app.bsky.feed.post", "p1", { rev: rev(96), stream: "direct" })])).toEqual([
          "enqueued"
        ])
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ rkey: string; targetUrl: string }>`
          SELECT webhook_rkey AS rkey, target_url AS "targetUrl" FROM outbox
          WHERE owner_did = ${did} ORDER BY webhook_rkey`
        expect(rows).toEqual([{ rkey: "keep", targetUrl: movedAgain }, { rkey: "n", targetUrl: FIRST }])
        held.release()
        expect((yield* Fiber.join(fiber))._tag).toBe("complete")
        expect(yield* memory(did)).toEqual([["keep", movedAgain], ["n", FIRST]])
      }))
  })

  layer(reconcileStack({ env: { REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" } }), {
    timeout: "120 seconds",
    excludeTestServices: true
  })("after the scan's deletions", (it) => {
    it.effect("a delete landing after the scan tombstoned its key frees the admission slot: a new webhook is admitted", () =>
      Effect.gen(function*() {
        const did = plc(4_901)
        const store = yield* ReconcileStore
        const registry = yield* Registry
        const sql = yield* SqlClient.SqlClient
        // before the scan: `x` registered (the owner's one slot)
        expect(yield* live([whEv(did, "x", hook(), { rev: rev(10) })])).toEqual(["active"])
        // the owner deleted `x` at rev 50; the scan reads the repo at rev 100 (empty), step 4 tombstones `x`
        const begun = yield* store.begin(did, { maxOtherScanning: 8, staleScanMs: 900_000 })
        if (begun._tag !== "begun") return expect.fail(`not begun: ${begun._tag}`)
        expect(yield* store.saveSnapshotRev(did, begun.token, SNAP)).toBe(true)
        expect(yield* store.deleteOlder(did, begun.token, SNAP, 100)).toEqual({ fenced: false, deleted: 1 })
        expect(yield* memoryRkeys(did)).toEqual(["x"])
        // the lagging stream delivers the delete (rev 50): stale by the scan's tombstone, `x` leaves memory
        expect(yield* live([whEv(did, "x", undefined, { operation: "delete", rev: rev(50) })])).toEqual(["stale"])
        expect(yield* memoryRkeys(did)).toEqual([])
        // the owner's new webhook (rev 150) takes the free slot
        expect(yield* live([whEv(did, "n", hook(), { rev: rev(150) })])).toEqual(["active"])
        expect(yield* memoryRkeys(did)).toEqual(["n"])
        // an older replay of `n` (rev 120, another URL) is stale by the live row (not the scan's): nothing changes
        expect(yield* live([whEv(did, "n", hook("https://elsewhere.example/hook"), { rev: rev(120) })])).toEqual([
          "stale"
        ])
        expect(yield* memory(did)).toEqual([["n", FIRST]])
        expect(yield* store.complete(did, begun.token, SNAP, registry.swapOwner(did))).toBe(true)
        expect(yield* memoryRkeys(did)).toEqual(["n"])
        const refused = yield* sql<{ rkey: string }>`SELECT rkey FROM rejected_records WHERE owner_did = ${did}`
        expect(refused).toEqual([])
      }))
  })
})
