/**
 * Issue 14 item 4 (SPEC §3.4, §5.3 step 2): a live write applies only if its rev is strictly greater
 * than the owner's snapshot rev, which is stored as soon as the scan reads it. So on a fresh
 * database, an old create that the stream replays (the owner deleted the webhook since; only the
 * stream's history still has it) never brings the webhook back, whether it lands before, during or
 * after the owner's scan; a genuinely newer live write still applies. A scan that fails gives the
 * fence back to the owner's latest completed snapshot (none: no fence), SPEC §3.4. A write fenced
 * only by the snapshot in progress is stored below the scan's token (the snapshot decides its key
 * when the scan completes), so a scan that fails leaves the store with what the owner wrote.
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
import { didDoc, type FakeRecord, type FakeRequest } from "../support/fakeAtproto.js"
import { Fakes, holdPdsPath, reconcileStack, waitFor } from "../support/reconcile.js"
import { ev, plc, rev, whEv, whRecordValue } from "../support/stack.js"

const BOB = plc(9_998)
const hook = (url = "https://receiver.example/hook") => whRecordValue(`at://${BOB}`, { url })

/** the replayed create of the webhook the owner has since deleted (its rkey is `w`) */
const OLD = rev(1)
/** the repo's rev when the owner is scanned (getLatestCommit) */
const SNAP = rev(100)
/** a create made after the snapshot */
const NEW = rev(150)

const LATEST_COMMIT = "/xrpc/com.atproto.sync.getLatestCommit"
const LIST_RECORDS = "/xrpc/com.atproto.repo.listRecords"

/** The PDS has only `keep` (the webhook `w` was deleted there), at rev SNAP. */
const setup = (did: string, records: ReadonlyArray<FakeRecord> = [{ rkey: "keep", value: hook() }]) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.docs.set(did, didDoc(did, fakes.pds.url))
    fakes.repos.set(did, { rev: SNAP, records: [...records] })
  })

/** Process events as the registry stream's batch; the registry outcome of each. */
const live = (events: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true })).pipe(
    Effect.map((r) => r.outcomes.map((o) => (o._tag === "no_match" ? o.registry?._tag : o._tag)))
  )

const replayOldCreate = (did: string) => live([whEv(did, "w", hook("https://old.example/hook"), { rev: OLD })])

const reconcile = (did: string) => Effect.flatMap(Reconciler, (r) => r.reconcile(did))
const ownerState = (did: string) => Effect.flatMap(ReconcileStore, (s) => s.ownerState(did))
const stored = (did: string, rkey: string) => Effect.flatMap(RegistryStore, (s) => s.get(did, rkey))
const memoryRkeys = (did: string) => Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => w.rkey).sort())

/** `w` is deleted: no row, the tombstone at `tombstoneRev` (or none), not in memory. */
const expectGone = (did: string, tombstoneRev: string | undefined) =>
  Effect.gen(function*() {
    const { row, tombstone } = yield* stored(did, "w")
    expect(row).toBeUndefined()
    expect(tombstone?.rev).toBe(tombstoneRev)
    expect(yield* memoryRkeys(did)).not.toContain("w")
  })

/** A create newer than the snapshot applies: stored at its rev and matched. */
const expectNewerApplies = (did: string) =>
  Effect.gen(function*() {
    expect(yield* live([whEv(did, "w", hook("https://new.example/hook"), { rev: NEW })])).toEqual(["active"])
    const { row, tombstone } = yield* stored(did, "w")
    expect(row?.rev).toBe(NEW)
    expect(row?.url).toBe("https://new.example/hook")
    expect(tombstone).toBeUndefined()
    expect(yield* memoryRkeys(did)).toContain("w")
  })

/** Its listing of `did` (`listRecords`). */
const listingOf = (did: string) => (req: FakeRequest) => req.path === LIST_RECORDS && req.query.get("repo") === did

/**
 * A scan of `did` during which the PDS answers 503 to the requests `failing` picks (default: the
 * listing of `did`), and answers again afterwards.
 */
const failedScan = (did: string, failing: (req: FakeRequest) => boolean = listingOf(did)) =>
  Effect.flatMap(Fakes, (fakes) => {
    fakes.pds.handler = (req) => failing(req) ? { status: 503, body: "{}" } : fakes.defaultPds(req)
    return reconcile(did).pipe(Effect.ensuring(Effect.sync(() => (fakes.pds.handler = fakes.defaultPds))))
  })

/** Wait until the fake PDS got `path` for `did`. */
const requested = (path: string, did: string) =>
  Effect.flatMap(
    Fakes,
    (fakes) =>
      waitFor(() =>
        fakes.pds.requests.some((r) => r.path === path && (r.query.get("repo") ?? r.query.get("did")) === did)
      )
  )

describe("snapshots beat old replays (issue 14 item 4)", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })("a replayed old create", (it) => {
    it.effect("lands before the scan: applied (no snapshot yet), then deleted by the scan; replayed again, ignored", () =>
      Effect.gen(function*() {
        const did = plc(401)
        yield* setup(did)
        // never scanned: no snapshot rev, no fence
        expect(yield* replayOldCreate(did)).toEqual(["active"])
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        expect((yield* reconcile(did))._tag).toBe("complete")
        yield* expectGone(did, SNAP)
        expect(yield* replayOldCreate(did)).toEqual(["stale"])
        yield* expectGone(did, SNAP)
        yield* expectNewerApplies(did)
      }))

    it.effect("lands during the scan, after begin but before the snapshot's rev is read: the snapshot deletes it", () =>
      Effect.gen(function*() {
        const did = plc(402)
        // the PDS also has `n`, created (rev 90) just before the snapshot's rev was read
        yield* setup(did, [{ rkey: "keep", value: hook() }, { rkey: "n", value: hook() }])
        const release = yield* holdPdsPath(LATEST_COMMIT, did)
        const fiber = yield* Effect.fork(reconcile(did))
        yield* requested(LATEST_COMMIT, did)
        expect((yield* ownerState(did))?.status).toBe("scanning")
        // no snapshot rev yet: the writes apply (and bump the generation past the scan's token)
        expect(yield* replayOldCreate(did)).toEqual(["active"])
        expect(yield* live([whEv(did, "n", hook(), { rev: rev(90) })])).toEqual(["active"])
        release()
        expect((yield* Fiber.join(fiber))._tag).toBe("complete")
        // not newer than the snapshot: the snapshot decides their keys; it has `n` but no `w`
        yield* expectGone(did, SNAP)
        expect((yield* stored(did, "n")).row?.rev).toBe(SNAP)
        expect(yield* memoryRkeys(did)).toEqual(["keep", "n"])
        yield* expectNewerApplies(did)
      }))

    it.effect("lands during the scan, after the snapshot's rev is stored: stored below the scan's token, matched until the scan's completion deletes it", () =>
      Effect.gen(function*() {
        const did = plc(403)
        yield* setup(did)
        const release = yield* holdPdsPath(LIST_RECORDS, did)
        const fiber = yield* Effect.fork(reconcile(did))
        yield* requested(LIST_RECORDS, did)
        const scan = yield* ownerState(did)
        expect(scan).toMatchObject({ status: "scanning", snapshotRev: SNAP })
        expect(yield* replayOldCreate(did)).toEqual(["active"])
        // the generation is not bumped: the write counts as older than the scan (the snapshot decides)
        expect((yield* ownerState(did))?.generation).toBe(scan?.generation)
        const { row } = yield* stored(did, "w")
        expect(row?.rev).toBe(OLD)
        expect(row?.generation).toBe((scan?.generation ?? 0) - 1)
        // the index follows the write while the snapshot is taken (its rows wait for the scan's end)
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        release()
        expect((yield* Fiber.join(fiber))._tag).toBe("complete")
        yield* expectGone(did, SNAP)
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
        yield* expectNewerApplies(did)
      }))

    it.effect("a webhook created or changed just before the snapshot, its write landing during the scan: the events after it match it", () =>
      Effect.gen(function*() {
        const did = plc(408)
        const moved = "https://moved.example/hook"
        // before the scan: `keep` at its first URL; on the PDS, `keep` moved and `n` was created
        // (rev 90), both before the snapshot's rev (100)
        yield* setup(did, [{ rkey: "keep", value: hook(moved) }, { rkey: "n", value: hook() }])
        expect(yield* live([whEv(did, "keep", hook(), { rev: rev(10) })])).toEqual(["active"])
        const release = yield* holdPdsPath(LIST_RECORDS, did)
        const fiber = yield* Effect.fork(reconcile(did))
        yield* requested(LIST_RECORDS, did)
        expect(yield* ownerState(did)).toMatchObject({ status: "scanning", snapshotRev: SNAP })
        // the stream lags the PDS: the two writes arrive now, fenced by the snapshot in progress only
        // (stored below the scan's token: the snapshot decides their keys)
        expect(
          yield* live([whEv(did, "keep", hook(moved), { rev: rev(90) }), whEv(did, "n", hook(), { rev: rev(90) })])
        ).toEqual(["active", "active"])
        expect((yield* stored(did, "keep")).row?.url).toBe(moved)
        expect((yield* stored(did, "n")).row?.rev).toBe(rev(90))
        // BOB's next post matches both as the owner wrote them (before: `keep` at its old URL only)
        expect(yield* live([ev(BOB, "app.bsky.feed.post", "p1", { rev: rev(95), stream: "direct" })])).toEqual([
          "enqueued"
        ])
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ rkey: string; targetUrl: string }>`
          SELECT webhook_rkey AS rkey, target_url AS "targetUrl" FROM outbox
          WHERE owner_did = ${did} ORDER BY webhook_rkey`
        expect(rows).toEqual([{ rkey: "keep", targetUrl: moved }, {
          rkey: "n",
          targetUrl: "https://receiver.example/hook"
        }])
        release()
        expect((yield* Fiber.join(fiber))._tag).toBe("complete")
        // the snapshot confirms both: what the rows were matched with is what the attempt will read
        expect((yield* stored(did, "keep")).row?.url).toBe(moved)
        expect((yield* stored(did, "n")).row?.rev).toBe(SNAP)
        expect(yield* memoryRkeys(did)).toEqual(["keep", "n"])
      }))

    it.effect("a change and a delete landing during a scan that then fails are kept: the store holds what the owner wrote", () =>
      Effect.gen(function*() {
        const did = plc(409)
        const fakes = yield* Fakes
        const moved = "https://moved.example/hook"
        // on the PDS, `keep` moved and `d` was deleted, both before the snapshot's rev (100)
        yield* setup(did, [{ rkey: "keep", value: hook(moved) }])
        expect(yield* live([whEv(did, "keep", hook(), { rev: rev(10) }), whEv(did, "d", hook(), { rev: rev(11) })]))
          .toEqual(["active", "active"])
        // the listing is held, then answers 503: the scan fails once its rev was stored
        let release: () => void = () => undefined
        const gate = new Promise<void>((resolve) => (release = resolve))
        fakes.pds.handler = async (req) => {
          if (listingOf(did)(req)) {
            await gate
            return { status: 503, body: "{}" }
          }
          return fakes.defaultPds(req)
        }
        const fiber = yield* Effect.fork(
          reconcile(did).pipe(Effect.ensuring(Effect.sync(() => (fakes.pds.handler = fakes.defaultPds))))
        )
        yield* requested(LIST_RECORDS, did)
        expect(yield* ownerState(did)).toMatchObject({ status: "scanning", snapshotRev: SNAP })
        // the stream lags the PDS: the change and the delete arrive during the scan
        expect(
          yield* live([
            whEv(did, "keep", hook(moved), { rev: rev(90) }),
            whEv(did, "d", undefined, { operation: "delete", rev: rev(91) })
          ])
        ).toEqual(["active", "deleted"])
        release()
        expect(yield* Fiber.join(fiber)).toEqual({ _tag: "failed", kind: "pds_status" })
        // before: the store kept `keep` at its old URL and `d`, and a reload (a restart) brought
        // them back, the stream having moved past both writes
        expect((yield* stored(did, "keep")).row?.url).toBe(moved)
        const d = yield* stored(did, "d")
        expect(d.row).toBeUndefined()
        expect(d.tombstone?.rev).toBe(rev(91))
        const registry = yield* Registry
        yield* registry.reload
        expect(registry.index.byOwner(did).map((w) => [w.rkey, w.url])).toEqual([["keep", moved]])
        // the retry's snapshot confirms them
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect((yield* stored(did, "keep")).row?.url).toBe(moved)
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
      }))

    it.effect("during a scan, a write no newer than the owner's last completed snapshot is still ignored", () =>
      Effect.gen(function*() {
        const did = plc(410)
        yield* setup(did)
        expect((yield* reconcile(did))._tag).toBe("complete")
        const fakes = yield* Fakes
        fakes.repos.set(did, { rev: rev(130), records: [{ rkey: "keep", value: hook() }] })
        // the next listing asked for is the second scan's
        fakes.pds.requests.length = 0
        const release = yield* holdPdsPath(LIST_RECORDS, did)
        const fiber = yield* Effect.fork(reconcile(did))
        yield* requested(LIST_RECORDS, did)
        expect(yield* ownerState(did)).toMatchObject({ status: "scanning", snapshotRev: rev(130) })
        expect(yield* replayOldCreate(did)).toEqual(["stale"])
        expect(yield* stored(did, "w")).toEqual({ row: undefined, tombstone: undefined })
        release()
        expect((yield* Fiber.join(fiber))._tag).toBe("complete")
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
      }))

    it.effect("lands after the scan's last deletions, before its completion: held back below its token, then deleted by the completion", () =>
      Effect.gen(function*() {
        const did = plc(411)
        const store = yield* ReconcileStore
        const begun = yield* store.begin(did, { maxOtherScanning: 8, staleScanMs: 900_000 })
        if (begun._tag !== "begun") return expect.fail("begun")
        expect(yield* store.saveSnapshotRev(did, begun.token, SNAP)).toBe(true)
        // step 4 found nothing to delete; the stream replays the old create only now
        expect(yield* store.deleteOlder(did, begun.token, SNAP, 100)).toEqual({ fenced: false, deleted: 0 })
        expect(yield* replayOldCreate(did)).toEqual(["active"])
        expect((yield* stored(did, "w")).row?.generation).toBe(begun.token - 1)
        expect(yield* store.complete(did, begun.token, SNAP, Effect.void)).toBe(true)
        const { row, tombstone } = yield* stored(did, "w")
        expect(row).toBeUndefined()
        expect(tombstone?.rev).toBe(SNAP)
        expect(yield* ownerState(did)).toMatchObject({ status: "complete", snapshotRev: SNAP })
      }))

    it.effect("lands after the scan: ignored; so are a replayed delete and an invalid record, and the generation stays", () =>
      Effect.gen(function*() {
        const did = plc(404)
        yield* setup(did)
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect((yield* ownerState(did))?.snapshotRev).toBe(SNAP)
        const generation = (yield* ownerState(did))?.generation
        expect(yield* replayOldCreate(did)).toEqual(["stale"])
        expect(
          yield* live([
            whEv(did, "x", undefined, { operation: "delete", rev: rev(50) }),
            whEv(did, "y", { $type: "place.wisp.v2.wh", url: 42 }, { rev: rev(60) }),
            // the snapshot's own commit: equal is not newer
            whEv(did, "z", hook(), { rev: SNAP })
          ])
        ).toEqual(["stale", "stale", "stale"])
        yield* expectGone(did, undefined)
        for (const rkey of ["x", "y", "z"]) {
          const { row, tombstone } = yield* stored(did, rkey)
          expect(row).toBeUndefined()
          expect(tombstone).toBeUndefined()
        }
        expect((yield* ownerState(did))?.generation).toBe(generation)
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
        yield* expectNewerApplies(did)
      }))

    it.effect("lands after a scan that failed once its rev was stored: applied (no completed snapshot, no fence); the retry deletes it", () =>
      Effect.gen(function*() {
        const did = plc(405)
        yield* setup(did)
        expect(yield* failedScan(did)).toEqual({ _tag: "failed", kind: "pds_status" })
        // a failed scan is neither the latest completed snapshot nor one in progress (SPEC §3.4):
        // its rev no longer fences, and this owner never completed one
        expect(yield* ownerState(did)).toMatchObject({ status: "failed", snapshotRev: undefined })
        expect(yield* replayOldCreate(did)).toEqual(["active"])
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        expect((yield* reconcile(did))._tag).toBe("complete")
        yield* expectGone(did, SNAP)
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
        yield* expectNewerApplies(did)
      }))

    it.effect("lands after a scan that failed, the owner's earlier scan completed: that snapshot's rev fences again", () =>
      Effect.gen(function*() {
        const did = plc(406)
        const fakes = yield* Fakes
        yield* setup(did, [{ rkey: "keep", value: hook() }, { rkey: "d", value: hook() }])
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect(yield* memoryRkeys(did)).toEqual(["d", "keep"])
        // the owner deletes `d` (rev 120); the next scan reads rev 130, then its listing fails
        fakes.repos.set(did, { rev: rev(130), records: [{ rkey: "keep", value: hook() }] })
        expect(yield* failedScan(did)).toEqual({ _tag: "failed", kind: "pds_status" })
        expect(yield* ownerState(did)).toMatchObject({ status: "failed", snapshotRev: SNAP })
        // the stream's delete arrives after that failure (a lagging stream): it applies and stops matching
        expect(yield* live([whEv(did, "d", undefined, { operation: "delete", rev: rev(120) })])).toEqual(["deleted"])
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
        // older than the completed snapshot: still ignored
        expect(yield* replayOldCreate(did)).toEqual(["stale"])
        yield* expectGone(did, undefined)
        expect((yield* reconcile(did))._tag).toBe("complete")
        expect(yield* ownerState(did)).toMatchObject({ status: "complete", snapshotRev: rev(130) })
        expect(yield* memoryRkeys(did)).toEqual(["keep"])
      }))

    it.effect("lands after a scan on a PDS that answers nothing (the scan-start TID fallback) failed: applied", () =>
      Effect.gen(function*() {
        const did = plc(407)
        yield* setup(did)
        const result = yield* failedScan(did, (req) => (req.query.get("repo") ?? req.query.get("did")) === did)
        expect(result._tag).toBe("failed")
        expect((yield* ownerState(did))?.snapshotRev).toBeUndefined()
        // a create committed before the scan started (its rev below the scan-start TID) still registers
        expect(yield* live([whEv(did, "n", hook(), { rev: rev(90) })])).toEqual(["active"])
        expect(yield* memoryRkeys(did)).toEqual(["n"])
      }))
  })
})
