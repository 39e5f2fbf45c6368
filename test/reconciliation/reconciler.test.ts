/**
 * Reconciliation of one owner (SPEC §5.3) against a fake PLC and a fake PDS (real HTTP servers on
 * loopback, insecure development mode) and a real PostgreSQL: pages and their bounds, invalid
 * records, repo absence, unsafe PDS endpoints, fencing against live events, and no loss while an
 * owner is scanning or failed.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { tidFromMicros, tidToMicros } from "../../src/schemas/Tid.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import {
  didDoc,
  type FakeRecord,
  type FakeRepo,
  type FakeRequest,
  type FakeResponse,
  fakeServer,
  listRecordsRequests,
  pdsHandler
} from "../support/fakeAtproto.js"
import { Fakes, holdPdsPath, reconcileStack, waitFor, wrapStore } from "../support/reconcile.js"
import { ev, plc, rev, whEv, whRecordValue } from "../support/stack.js"

const BOB = plc(9_999)
const POST = "app.bsky.feed.post"

const hook = (url = "https://receiver.example/hook") => whRecordValue(`at://${BOB}`, { url })

/** Publish `did`'s DID document (PDS = the fake PDS unless given) and its repo. */
const setup = (did: string, records: ReadonlyArray<FakeRecord>, options: { rev?: string; pds?: string } = {}) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.docs.set(did, didDoc(did, options.pds ?? fakes.pds.url))
    fakes.repos.set(did, { rev: options.rev, records: [...records] })
  })

const live = (events: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true }))

const storedRkeys = (did: string) =>
  Effect.flatMap(RegistryStore, (s) => s.ownerRows(did)).pipe(Effect.map((rows) => rows.map((r) => r.rkey).sort()))

const memoryRkeys = (did: string) => Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => w.rkey).sort())

const reconcile = (did: string) => Effect.flatMap(Reconciler, (r) => r.reconcile(did))

const ownerState = (did: string) => Effect.flatMap(ReconcileStore, (s) => s.ownerState(did))

/**
 * Reconcile `did` while `respond` answers its listRecords requests (the default PDS answers the
 * rest); the default PDS handler is restored afterwards, also when the reconcile fails.
 */
const reconcileServing = (did: string, respond: (req: FakeRequest) => FakeResponse) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.pds.handler = (req) =>
      req.path === "/xrpc/com.atproto.repo.listRecords" && req.query.get("repo") === did
        ? respond(req)
        : fakes.defaultPds(req)
    return yield* reconcile(did).pipe(Effect.ensuring(Effect.sync(() => (fakes.pds.handler = fakes.defaultPds))))
  })

const json = (status: number, value: unknown): FakeResponse => ({ status, body: JSON.stringify(value) })

const page = (did: string, rkeys: ReadonlyArray<string>, cursor?: string, value: unknown = hook()) =>
  json(200, {
    records: rkeys.map((k) => ({ uri: `at://${did}/place.wisp.v2.wh/${k}`, cid: `bafy${k}`, value })),
    ...(cursor === undefined ? {} : { cursor })
  })

/** A post by `scope`: matches every webhook scoped to it. */
let postN = 0
const postBy = (scope: string) => ev(scope, POST, `p${++postN}`, { rev: rev(5_000 + postN) })

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

  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "every listed failure fails the owner and keeps its registrations",
    (it) => {
      /** Serve `respond(request index)` for `did`'s listRecords; the default PDS otherwise. */
      const failing = (n: number, kind: string, respond: (i: number, did: string) => FakeResponse) =>
        it.effect(`${kind}`, () =>
          Effect.gen(function*() {
            const did = plc(100 + n)
            yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
            yield* setup(did, [], { rev: rev(100) })
            let i = 0
            const outcome = yield* reconcileServing(did, () => respond(i++, did))
            expect(outcome).toEqual({ _tag: "failed", kind })
            const state = yield* ownerState(did)
            expect(state).toMatchObject({ status: "failed", lastFailureKind: kind, failureCount: 1 })
            // the last known-good registrations are kept (pages already read landed in the database
            // only; nothing was deleted) and memory is unchanged
            expect(yield* storedRkeys(did)).toContain("known")
            expect(yield* memoryRkeys(did)).toEqual(["known"])
          }))

      failing(1, "record_uri", () =>
        json(200, {
          records: [{ uri: `at://${plc(7_777)}/place.wisp.v2.wh/x`, cid: "bafyx", value: hook() }],
          cursor: "x"
        }))
      failing(2, "duplicate_rkey", (i, did) => (i === 0 ? page(did, ["a", "b"], "b") : page(did, ["a"], "a")))
      failing(3, "cursor", (i, did) => (i === 0 ? page(did, ["a"], "c1") : page(did, ["b"], "c1")))
      failing(4, "too_many_pages", (i, did) => page(did, [`k${String(1000 - i).padStart(4, "0")}`], `c${i}`))
      failing(5, "too_many_records", (i, did) =>
        page(
          did,
          Array.from({ length: 100 }, (_, j) => `r${String(i * 100 + j).padStart(5, "0")}`),
          `c${i}`
        ))
      failing(
        6,
        "page_too_large",
        (_, did) => page(did, ["big"], undefined, { ...hook(), padding: "x".repeat(600 * 1024) })
      )
      failing(7, "pds_status", () => json(500, { error: "InternalServerError" }))
      failing(8, "page_invalid", () => ({ status: 200, body: "{not json" }))
      failing(9, "page_records", (_, did) =>
        page(
          did,
          Array.from({ length: 101 }, (_, j) => `r${j}`),
          "c"
        ))
      failing(
        10,
        "record_cid",
        (_, did) =>
          json(200, { records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid: "", value: hook() }], cursor: "a" })
      )
      failing(11, "cursor", (_, did) => page(did, ["a"], "x".repeat(2049)))
      failing(12, "pds_status", (i, did) => (i === 0 ? page(did, ["a"], "a") : json(400, { error: "RepoNotFound" })))
      // empty pages with a cursor are followed, and count toward the page bound; their cursors too
      // must never repeat
      failing(13, "too_many_pages", (i) => json(200, { records: [], cursor: `e${i}` }))
      failing(14, "cursor", (i) => json(200, { records: [], cursor: i < 3 ? `e${i}` : "e0" }))
      // a cursor that is not well-formed UTF-16 (a lone surrogate, `\ud800` in the JSON) cannot be
      // put in a URL: the owner fails as `cursor` (it used to die on encodeURIComponent's URIError,
      // leaving the owner `scanning`)
      failing(15, "cursor", (_, did) => page(did, ["a"], "a\ud800"))
      failing(16, "cursor", () => json(200, { records: [], cursor: "\udc00z" }))
      // a cid of 257 characters (SPEC §5.3: 1–256)
      failing(
        17,
        "record_cid",
        (_, did) =>
          json(200, {
            records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid: "b".repeat(257), value: hook() }],
            cursor: "a"
          })
      )

      // a cid is 1–256 printable characters: one holding a space is not a cid
      failing(
        18,
        "record_cid",
        (_, did) => json(200, { records: [{ uri: `at://${did}/place.wisp.v2.wh/a`, cid: "bafy a", value: hook() }] })
      )
      // a cursor, if present, is non-empty (SPEC §5.3): "" is not followed as if it were one
      failing(19, "cursor", (i, did) => (i === 0 ? page(did, ["b"], "") : page(did, ["a"])))
      // "repo not found" only in its two authoritative forms (SPEC §5.3): not for another DID,
      // and `InvalidRequest` only as a 400
      failing(
        20,
        "pds_status",
        () => json(400, { error: "InvalidRequest", message: `Could not find repo: ${plc(7_777)}` })
      )
      failing(
        21,
        "pds_status",
        (_, did) => json(404, { error: "InvalidRequest", message: `Could not find repo: ${did}` })
      )

      it.effect("exactly 20 pages are read before too_many_pages", () =>
        Effect.gen(function*() {
          const fakes = yield* Fakes
          const lists = listRecordsRequests(fakes.pds).filter((r) => r.query.get("repo") === plc(104))
          expect(lists).toHaveLength(20)
        }))
    }
  )

  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "fencing against live events",
    (it) => {
      /** Hold `did`'s listRecords until `release()`; returns the release function. */
      const holdPds = (did: string) =>
        Effect.gen(function*() {
          const fakes = yield* Fakes
          let release: () => void = () => undefined
          const gate = new Promise<void>((resolve) => (release = resolve))
          fakes.pds.handler = async (req) => {
            if (req.path === "/xrpc/com.atproto.repo.listRecords" && req.query.get("repo") === did) await gate
            return fakes.defaultPds(req)
          }
          return () => {
            release()
            fakes.pds.handler = fakes.defaultPds
          }
        })

      const scanning = (did: string) =>
        Effect.gen(function*() {
          const fakes = yield* Fakes
          yield* waitFor(() => listRecordsRequests(fakes.pds).some((r) => r.query.get("repo") === did))
          expect((yield* ownerState(did))?.status).toBe("scanning")
        })

      it.effect("a live create during the scan survives the snapshot's completion", () =>
        Effect.gen(function*() {
          const did = plc(201)
          yield* live([whEv(did, "old", hook(), { rev: rev(1) })])
          yield* setup(did, [{ rkey: "old", value: hook() }], { rev: rev(100) })
          const release = yield* holdPds(did)
          const fiber = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          // created after the snapshot was taken: not in the PDS pages
          yield* live([whEv(did, "fresh", hook("https://fresh.example/hook"), { rev: rev(150) })])
          release()
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual(["fresh", "old"])
          expect(yield* memoryRkeys(did)).toEqual(["fresh", "old"])
          const { row } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "fresh"))
          expect(row?.rev).toBe(rev(150))
        }))

      it.effect("a live delete during the scan is not resurrected by the snapshot", () =>
        Effect.gen(function*() {
          const did = plc(202)
          yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
          // the snapshot still lists w (its rev is older than the delete)
          yield* setup(did, [{ rkey: "w", value: hook() }], { rev: rev(100) })
          const release = yield* holdPds(did)
          const fiber = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          yield* live([whEv(did, "w", undefined, { operation: "delete", rev: rev(150) })])
          release()
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual([])
          expect(yield* memoryRkeys(did)).toEqual([])
          const { tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "w"))
          expect(tombstone?.rev).toBe(rev(150))
        }))

      it.effect("with the TID fallback, a live delete during the scan is fenced by the snapshot's rev; a newer one is not resurrected", () =>
        Effect.gen(function*() {
          const did = plc(205)
          yield* live([whEv(did, "w", hook(), { rev: rev(1) })])
          // no getLatestCommit: the snapshot's rev is a TID of the scan's start
          yield* setup(did, [{ rkey: "w", value: hook() }])
          const release = yield* holdPds(did)
          const fiber = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          // not newer than the snapshot's rev: ignored (SPEC §3.4; issue 14 item 4 changed this)
          const older = yield* live([whEv(did, "w", undefined, { operation: "delete", rev: rev(150) })])
          expect(older.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
          // newer than the snapshot's rev (ahead of the scan's start): applied, and the snapshot,
          // which still lists w, does not bring it back
          const newer = tidFromMicros((Date.now() + 60_000) * 1000)
          yield* live([whEv(did, "w", undefined, { operation: "delete", rev: newer })])
          release()
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual([])
          expect(yield* memoryRkeys(did)).toEqual([])
        }))

      it.effect("a webhook deleted while firehook was down is not brought back by a replay of its old create", () =>
        Effect.gen(function*() {
          const did = plc(203)
          const created = whEv(did, "w", hook(), { rev: rev(1) })
          yield* live([created])
          // the owner deleted it meanwhile: the PDS no longer has it
          yield* setup(did, [], { rev: rev(100) })
          expect((yield* reconcile(did))._tag).toBe("complete")
          expect(yield* storedRkeys(did)).toEqual([])
          // the stream replays the old create (and the delete)
          const replay = yield* live([
            whEv(did, "w", hook(), { rev: rev(1) }),
            whEv(did, "w", undefined, { operation: "delete", rev: rev(50) })
          ])
          expect(replay.outcomes.map((o) => (o._tag === "no_match" ? o.registry?._tag : o._tag))).toEqual([
            "stale",
            "stale"
          ])
          expect(yield* storedRkeys(did)).toEqual([])
          expect(yield* memoryRkeys(did)).toEqual([])
        }))

      it.effect("a newer scan fences an older one: the older one's writes stop", () =>
        Effect.gen(function*() {
          const did = plc(204)
          yield* setup(did, [{ rkey: "a", value: hook() }], { rev: rev(100) })
          const release = yield* holdPds(did)
          const first = yield* Effect.fork(reconcile(did))
          yield* scanning(did)
          release()
          const second = yield* reconcile(did)
          const firstOutcome = yield* Fiber.join(first)
          expect([firstOutcome._tag, second._tag].sort()).toEqual(["complete", "superseded"])
          expect(yield* storedRkeys(did)).toEqual(["a"])
        }))
    }
  )

  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })(
    "no loss while an owner is scanning or failed",
    (it) => {
      it.effect("events for a scanning owner match its pre-scan registrations", () =>
        Effect.gen(function*() {
          const did = plc(301)
          const scope = plc(8_001)
          const h = whRecordValue(`at://${scope}`)
          const fakes = yield* Fakes
          yield* live([whEv(did, "kept", h, { rev: rev(1) }), whEv(did, "removed", h, { rev: rev(1) })])
          yield* setup(did, [{ rkey: "kept", value: h }], { rev: rev(100) })
          let release: () => void = () => undefined
          const gate = new Promise<void>((resolve) => (release = resolve))
          fakes.pds.handler = async (req) => {
            if (req.path === "/xrpc/com.atproto.repo.listRecords") await gate
            return fakes.defaultPds(req)
          }
          const fiber = yield* Effect.fork(reconcile(did))
          yield* waitFor(() => listRecordsRequests(fakes.pds).some((r) => r.query.get("repo") === did))
          expect((yield* Effect.flatMap(RegistryStore, (s) => s.owner(did)))?.status).toBe("scanning")
          // matched against both pre-scan registrations: nothing dropped because the PDS is slow
          const during = yield* live([postBy(scope)])
          expect(during.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 2 })
          release()
          fakes.pds.handler = fakes.defaultPds
          expect((yield* Fiber.join(fiber))._tag).toBe("complete")
          // after the scan only the webhook the snapshot kept matches
          expect(yield* memoryRkeys(did)).toEqual(["kept"])
          const after = yield* live([postBy(scope)])
          expect(after.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
        }))

      it.effect("an owner whose PDS is down keeps matching its known webhooks", () =>
        Effect.gen(function*() {
          const did = plc(302)
          const scope = plc(8_002)
          const fakes = yield* Fakes
          yield* live([whEv(did, "w", whRecordValue(`at://${scope}`), { rev: rev(1) })])
          yield* setup(did, [], { rev: rev(100) })
          fakes.pds.handler = (req) =>
            req.query.get("repo") === did || req.query.get("did") === did ? json(503, {}) : fakes.defaultPds(req)
          const outcome = yield* reconcile(did)
          fakes.pds.handler = fakes.defaultPds
          expect(outcome).toEqual({ _tag: "failed", kind: "pds_status" })
          const r = yield* live([postBy(scope)])
          expect(r.outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
          expect(yield* memoryRkeys(did)).toEqual(["w"])
        }))
    }
  )
})

describe("Reconciler: completion in batches and timeouts", () => {
  layer(
    reconcileStack({ limits: { batchSize: 2, tombstoneRetentionMs: 0 } }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("completion in batches", (it) => {
    it.effect("rows beyond one batch are all deleted (tombstoned), and old tombstones beyond one batch all pruned", () =>
      Effect.gen(function*() {
        const did = plc(400)
        const rkeys = ["a", "b", "c", "d", "e"]
        yield* live(rkeys.map((k) => whEv(did, k, hook(), { rev: rev(1) })))
        yield* setup(did, [], { rev: rev(100) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", deleted: 5 })
        expect(yield* storedRkeys(did)).toEqual([])
        const store = yield* RegistryStore
        for (const k of rkeys) expect((yield* store.get(did, k)).tombstone?.rev).toBe(rev(100))
        // a newer snapshot: the tombstones are older than it and past their retention (0 here)
        yield* setup(did, [], { rev: rev(200) })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", deleted: 0 })
        for (const k of rkeys) expect((yield* store.get(did, k)).tombstone).toBeUndefined()
      }))
  })

  layer(reconcileStack({ limits: { timeoutMs: 300 } }), { timeout: "120 seconds", excludeTestServices: true })(
    "timeouts",
    (it) => {
      it.effect("a PDS that does not answer a page within the timeout fails the owner as pds_timeout", () =>
        Effect.gen(function*() {
          const did = plc(401)
          yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
          yield* setup(did, [], { rev: rev(100) })
          const release = yield* holdPdsPath("/xrpc/com.atproto.repo.listRecords", did)
          const outcome = yield* reconcile(did).pipe(Effect.ensuring(Effect.sync(release)))
          expect(outcome).toEqual({ _tag: "failed", kind: "pds_timeout" })
          expect(yield* ownerState(did)).toMatchObject({ status: "failed", lastFailureKind: "pds_timeout" })
          expect(yield* memoryRkeys(did)).toEqual(["known"])
        }))
    }
  )
})

describe("Reconciler: a scan that dies", () => {
  /** `deleteOlder` dies (a bug's defect) for the DIDs listed. */
  const dying = new Set<string>()
  layer(
    reconcileStack({
      wrapStore: (real) =>
        wrapStore(
          real,
          (op, eff) => Effect.suspend(() => (op === "deleteOlder" && dying.size > 0 ? Effect.dieMessage("a bug") : eff))
        )
    }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("defects", (it) => {
    it.effect("fails its owner (internal) instead of leaving it scanning; its registrations are kept", () =>
      Effect.gen(function*() {
        const did = plc(300)
        yield* live([whEv(did, "known", hook(), { rev: rev(1) })])
        yield* setup(did, [], { rev: rev(100) })
        dying.add(did)
        const outcome = yield* reconcile(did).pipe(Effect.ensuring(Effect.sync(() => dying.clear())))
        expect(outcome).toEqual({ _tag: "failed", kind: "internal" })
        expect(yield* ownerState(did)).toMatchObject({ status: "failed", lastFailureKind: "internal", failureCount: 1 })
        expect(yield* memoryRkeys(did)).toEqual(["known"])
        // the retry completes
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect(yield* ownerState(did)).toMatchObject({ status: "complete" })
      }))
  })
})
