/**
 * Reconciliation of one owner (SPEC §5.3) against a fake PLC and a fake PDS (real HTTP servers on
 * loopback, insecure development mode) and a real PostgreSQL, the snapshots: pages and their
 * bounds, invalid records, repo absence, and unsafe PDS endpoints.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { tidFromMicros, tidToMicros } from "../../src/schemas/Tid.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { didDoc, type FakeRepo, fakeServer, listRecordsRequests, pdsHandler } from "../support/fakeAtproto.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { plc, rev, whEv, whRecordValue } from "../support/stack.js"
import {
  BOB,
  hook,
  json,
  live,
  memoryRkeys,
  ownerState,
  page,
  reconcile,
  reconcileServing,
  setup,
  storedRkeys
} from "./reconciler-support.js"

describe("Reconciler", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })("snapshots", (it) => {
    it.effect("pages with the cursor URL-encoded; invalid and unsafe-URL records omitted; absent rows deleted with tombstones", () =>
      Effect.gen(function*() {
        const did = plc(1)
        const fakes = yield* Fakes
        // stored before: one record the PDS no longer has, one it still has
        yield* live([
          whEv(did, "gone", hook("https://old.example/hook"), { rev: rev(1) }),
          whEv(did, "keep", hook("https://old.example/keep"), { rev: rev(1) })
        ])
        expect(yield* memoryRkeys(did)).toEqual(["gone", "keep"])
        const special = "0a:b%2B+c~"
        yield* setup(
          did,
          [
            { rkey: "keep", value: hook("https://new.example/keep") },
            { rkey: "valid1", value: hook() },
            { rkey: special, value: hook("https://receiver.example/special") },
            { rkey: "malformed", value: { $type: "place.wisp.v2.wh", url: 42 } },
            { rkey: "unsafe", value: hook("https://169.254.169.254/latest/meta-data") },
            { rkey: "paused", value: whRecordValue(`at://${BOB}`, { enabled: false }) }
          ],
          { rev: rev(100) }
        )
        const outcome = yield* reconcile(did)
        expect(outcome).toEqual({
          _tag: "complete",
          records: 6,
          invalid: 2,
          written: 4,
          deleted: 1,
          pages: 2,
          repoFound: true
        })
        // the second page asked for the cursor = the last rkey of the first page, URL-encoded
        const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === did)
        expect(lists).toHaveLength(2)
        expect(lists[0]?.query.get("cursor")).toBeNull()
        expect(lists[0]?.query.get("collection")).toBe("place.wisp.v2.wh")
        expect(lists[0]?.query.get("limit")).toBe("100")
        expect(lists[1]?.query.get("cursor")).toBe(special)
        expect(lists[1]?.rawQuery).toContain(`cursor=${encodeURIComponent(special)}`)
        // the database holds the snapshot (at its rev); the memory swapped in one step
        expect(yield* storedRkeys(did)).toEqual([special, "keep", "paused", "valid1"].sort())
        const rows = yield* Effect.flatMap(RegistryStore, (s) => s.ownerRows(did))
        expect(new Set(rows.map((r) => r.rev))).toEqual(new Set([rev(100)]))
        expect(rows.find((r) => r.rkey === "keep")?.url).toBe("https://new.example/keep")
        expect(rows.find((r) => r.rkey === "paused")?.active).toBe(false)
        expect(yield* memoryRkeys(did)).toEqual([special, "keep", "valid1"].sort())
        const { row, tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "gone"))
        expect(row).toBeUndefined()
        expect(tombstone?.rev).toBe(rev(100))
        const state = yield* ownerState(did)
        expect(state).toMatchObject({ status: "complete", snapshotRev: rev(100), failureCount: 0 })
      }))

    it.effect("without getLatestCommit the snapshot rev is a TID of the scan's start", () =>
      Effect.gen(function*() {
        const did = plc(2)
        yield* setup(did, [{ rkey: "a", value: hook() }])
        const before = Date.now() * 1000
        const outcome = yield* reconcile(did)
        expect(outcome._tag).toBe("complete")
        const snap = (yield* ownerState(did))?.snapshotRev ?? ""
        const micros = tidToMicros(snap) ?? 0
        expect(micros).toBeGreaterThanOrEqual(before - 1_000_000)
        expect(micros).toBeLessThanOrEqual(Date.now() * 1000)
      }))

    it.effect("a getLatestCommit rev far in the future is not trusted", () =>
      Effect.gen(function*() {
        const did = plc(5)
        const future = tidFromMicros((Date.now() + 3_600_000) * 1000)
        yield* setup(did, [{ rkey: "a", value: hook() }], { rev: future })
        expect((yield* reconcile(did))._tag).toBe("complete")
        const snap = (yield* ownerState(did))?.snapshotRev ?? ""
        expect(snap).not.toBe(future)
        expect(tidToMicros(snap) ?? Infinity).toBeLessThanOrEqual(Date.now() * 1000)
      }))

    it.effect("'Could not find repo' on the first page: an empty snapshot deletes the owner's rows; identity invalidated", () =>
      Effect.gen(function*() {
        const did = plc(3)
        const fakes = yield* Fakes
        yield* live([whEv(did, "w1", hook(), { rev: rev(1) }), whEv(did, "w2", hook(), { rev: rev(2) })])
        fakes.docs.set(did, didDoc(did, fakes.pds.url)) // a DID document, but no repo on the PDS
        const outcome = yield* reconcile(did)
        expect(outcome).toMatchObject({ _tag: "complete", repoFound: false, records: 0, deleted: 2 })
        expect(yield* storedRkeys(did)).toEqual([])
        expect(yield* memoryRkeys(did)).toEqual([])
        const { tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "w1"))
        expect(tombstone?.rev).toBe((yield* ownerState(did))?.snapshotRev)
        // "not found" is taken as authoritative only after resolving the DID again (the PDS could
        // come from a stale cache): the cached PDS is asked, then the DID is resolved afresh
        const plcBefore = fakes.plc.requests.length
        yield* reconcile(did)
        expect(fakes.plc.requests.length).toBe(plcBefore + 1)
        yield* setup(did, [])
        const plcMid = fakes.plc.requests.length
        yield* reconcile(did)
        expect(fakes.plc.requests.length).toBe(plcMid)
      }))

    it.effect("an account 'not found' at one scan (deactivated) and back at the next gets its webhooks back without a new commit", () =>
      Effect.gen(function*() {
        const did = plc(60)
        const fakes = yield* Fakes
        yield* setup(did, [{ rkey: "w", value: hook() }], { rev: rev(100) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", written: 1 })
        // deactivated (the reference PDS answers "Could not find repo" to listRecords, and
        // getLatestCommit fails: the snapshot's rev is a TID of the scan's start, far ahead of rev(100))
        fakes.repos.delete(did)
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", repoFound: false, deleted: 1 })
        expect(yield* memoryRkeys(did)).toEqual([])
        // reactivated: the same repo, no commit since (its rev is still rev(100))
        yield* setup(did, [{ rkey: "w", value: hook() }], { rev: rev(100) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", records: 1, written: 1 })
        expect(yield* storedRkeys(did)).toEqual(["w"])
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        const { tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "w"))
        expect(tombstone).toBeUndefined()
        // a replayed old delete is still fenced by the snapshot's rev
        const replay = yield* live([whEv(did, "w", undefined, { operation: "delete", rev: rev(50) })])
        expect(replay.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
        expect(yield* storedRkeys(did)).toEqual(["w"])
      }))

    it.effect("'not found' from a cached PDS the account has left: the scan fails (pds_moved), nothing is deleted, the next one reads the new PDS", () =>
      Effect.gen(function*() {
        const did = plc(6)
        const fakes = yield* Fakes
        yield* setup(did, [{ rkey: "a", value: hook() }, { rkey: "b", value: hook() }])
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect(yield* memoryRkeys(did)).toEqual(["a", "b"])
        // the account moves to another PDS; the old one no longer has the repo; our cache still
        // points at the old one
        const otherRepos = new Map<string, FakeRepo>([[did, {
          rev: undefined,
          records: [
            { rkey: "a", value: hook() },
            { rkey: "b", value: hook() },
            { rkey: "c", value: hook() }
          ]
        }]])
        const other = yield* fakeServer(pdsHandler(otherRepos))
        fakes.docs.set(did, didDoc(did, other.url))
        fakes.repos.delete(did)
        expect(yield* reconcile(did)).toEqual({ _tag: "failed", kind: "pds_moved" })
        expect(yield* storedRkeys(did)).toEqual(["a", "b"])
        expect(yield* memoryRkeys(did)).toEqual(["a", "b"])
        // the retry resolves the new PDS (cached by the check) and completes there
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", repoFound: true, records: 3 })
        expect(yield* storedRkeys(did)).toEqual(["a", "b", "c"])
      }).pipe(Effect.scoped))

    it.effect("404 RepoNotFound on the first page is an empty snapshot too (SPEC §5.3)", () =>
      Effect.gen(function*() {
        const did = plc(10)
        yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        const outcome = yield* reconcileServing(did, () => json(404, { error: "RepoNotFound", message: "gone" }))
        expect(outcome).toMatchObject({ _tag: "complete", repoFound: false, records: 0, deleted: 1 })
        expect(yield* storedRkeys(did)).toEqual([])
        expect(yield* memoryRkeys(did)).toEqual([])
      }))

    it.effect("exactly 1,000 records (10 full pages) complete (SPEC §5.3: ≤ 1,000 records)", () =>
      Effect.gen(function*() {
        const did = plc(11)
        const rkeys = Array.from({ length: 1000 }, (_, j) => `r${String(j).padStart(4, "0")}`)
        yield* setup(did, rkeys.map((rkey) => ({ rkey, value: hook() })), { rev: rev(100) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", records: 1000, written: 1000, invalid: 0 })
        expect((yield* storedRkeys(did)).length).toBe(1000)
      }))

    it.effect("a DID that is not canonical fails as invalid_did before any scan: no owner is recorded, no PLC or PDS call", () =>
      Effect.gen(function*() {
        const fakes = yield* Fakes
        const did = "did:plc:NOT-CANONICAL"
        const plcBefore = fakes.plc.requests.length
        const pdsBefore = fakes.pds.requests.length
        expect(yield* reconcile(did)).toEqual({ _tag: "failed", kind: "invalid_did" })
        // never begun: nothing for the RetryScheduler to retry forever
        expect(yield* ownerState(did)).toBeUndefined()
        expect(fakes.plc.requests.length).toBe(plcBefore)
        expect(fakes.pds.requests.length).toBe(pdsBefore)
      }))

    it.effect("a private PDS endpoint in the DID document is rejected before any PDS call", () =>
      Effect.gen(function*() {
        const did = plc(4)
        const fakes = yield* Fakes
        yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
        yield* setup(did, [], { pds: "http://169.254.169.254" })
        const before = fakes.pds.requests.length
        expect(yield* reconcile(did)).toEqual({ _tag: "failed", kind: "pds_unsafe" })
        expect(fakes.pds.requests.length).toBe(before)
        expect(yield* storedRkeys(did)).toEqual(["w"])
        expect(yield* ownerState(did)).toMatchObject({
          status: "failed",
          lastFailureKind: "pds_unsafe",
          failureCount: 1
        })
        // https to a private address is refused the same way
        fakes.docs.set(did, didDoc(did, "https://10.0.0.8"))
        expect(yield* reconcile(did)).toEqual({ _tag: "failed", kind: "pds_unsafe" })
        expect(fakes.pds.requests.length).toBe(before)
        expect(yield* ownerState(did)).toMatchObject({ status: "failed", failureCount: 2 })
        expect(yield* memoryRkeys(did)).toEqual(["w"])
      }))

    it.effect("a page with no records but a cursor is not the end: the cursor is followed (SPEC §5.3)", () =>
      Effect.gen(function*() {
        const did = plc(7)
        const fakes = yield* Fakes
        yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        // page 1: empty with a cursor (e.g. every record of the page filtered by the PDS); page 2
        // holds the hook, and no cursor (the end)
        const outcome = yield* reconcileServing(
          did,
          (req) => (req.query.get("cursor") === null ? json(200, { records: [], cursor: "c1" }) : page(did, ["w"]))
        )
        expect(outcome).toEqual({
          _tag: "complete",
          records: 1,
          invalid: 0,
          written: 1,
          deleted: 0,
          pages: 2,
          repoFound: true
        })
        const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === did)
        expect(lists.map((r) => r.query.get("cursor"))).toEqual([null, "c1"])
        // the hook stays: stored, in memory, and no tombstone
        expect(yield* storedRkeys(did)).toEqual(["w"])
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        const { tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "w"))
        expect(tombstone).toBeUndefined()
      }))

    it.effect("a cid of exactly 256 characters is accepted (SPEC §5.3: 1–256)", () =>
      Effect.gen(function*() {
        const did = plc(8)
        const fakes = yield* Fakes
        yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        const cid = "b".repeat(256)
        const cursor = "c1"
        const outcome = yield* reconcileServing(did, (req) =>
          req.query.get("cursor") === null
            ? json(200, { records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid, value: hook() }], cursor })
            : page(did, ["w"]))
        expect(outcome).toMatchObject({ _tag: "complete", records: 2, invalid: 0, pages: 2 })
        const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === did)
        expect(lists.map((r) => r.query.get("cursor"))).toEqual([null, cursor])
        expect(yield* storedRkeys(did)).toEqual(["a", "w"])
        const { row } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "a"))
        expect(row?.cid).toBe(cid)
      }))

    it.effect("a cursor of exactly 2,048 characters is followed, also when it is percent-encoded in the URL (SPEC §5.3)", () =>
      Effect.gen(function*() {
        const did = plc(9)
        const fakes = yield* Fakes
        yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        // 2,048 characters each; the second is 6,144 in the URL (every ":" and "/" as %3A / %2F)
        const first = "c".repeat(2048)
        const second = ":/".repeat(1024)
        const outcome = yield* reconcileServing(did, (req) => {
          const at = req.query.get("cursor")
          return at === null ? page(did, ["a"], first) : at === first ? page(did, ["b"], second) : page(did, ["w"])
        })
        expect(outcome).toMatchObject({ _tag: "complete", records: 3, invalid: 0, pages: 3 })
        const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === did)
        expect(lists.map((r) => r.query.get("cursor"))).toEqual([null, first, second])
        expect(yield* storedRkeys(did)).toEqual(["a", "b", "w"])
      }))
  })
})
