/**
 * A PDS snapshot never undoes newer live state (SPEC §3.4), also when the snapshot comes from a
 * PDS the account has left but that still serves its old repo (the identity cache names the old
 * PDS: its entry is served for up to 24 h, and an `#identity` invalidation can be missed): a
 * webhook the owner deleted on the stream at a rev newer than the snapshot's stays deleted. A
 * tombstone an earlier scan wrote (at its scan-start TID, for an account that was deactivated)
 * still never holds back a record the PDS lists again (docs/decisions.md, reconciliation).
 * Fake PLC and PDSes on loopback, real PostgreSQL.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { didDoc, type FakeRepo, fakeServer, pdsHandler } from "../support/fakeAtproto.js"
import { Fakes, reconcileStack } from "../support/reconcile.js"
import { plc, rev, whEv, whRecordValue } from "../support/stack.js"

const BOB = plc(9_999)
const hook = () => whRecordValue(`at://${BOB}`, { url: "https://receiver.example/hook" })
const live = (events: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true }))
const storedRkeys = (did: string) =>
  Effect.flatMap(RegistryStore, (s) => s.ownerRows(did)).pipe(Effect.map((rows) => rows.map((r) => r.rkey).sort()))
const memoryRkeys = (did: string) => Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => w.rkey).sort())
const reconcile = (did: string) => Effect.flatMap(Reconciler, (r) => r.reconcile(did))

describe("snapshots older than live state", () => {
  layer(reconcileStack(), { timeout: "120 seconds", excludeTestServices: true })("stale PDS", (it) => {
    it.effect("a snapshot of the PDS an account left does not bring back a webhook deleted live at a newer rev", () =>
      Effect.gen(function*() {
        const did = plc(77)
        const fakes = yield* Fakes
        fakes.docs.set(did, didDoc(did, fakes.pds.url))
        fakes.repos.set(did, { rev: rev(100), records: [{ rkey: "a", value: hook() }, { rkey: "b", value: hook() }] })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", written: 2 })
        // the account moves; the old PDS keeps serving the old repo, and our cache still names it
        const moved = new Map<string, FakeRepo>([[did, { rev: rev(200), records: [{ rkey: "a", value: hook() }] }]])
        const other = yield* fakeServer(pdsHandler(moved))
        fakes.docs.set(did, didDoc(did, other.url))
        // on the new PDS the owner deletes b (the stream brings it)
        yield* live([whEv(did, "b", undefined, { operation: "delete", rev: rev(200) })])
        expect(yield* storedRkeys(did)).toEqual(["a"])
        // a scan that reads the old PDS (rev 100) must not undo the delete (rev 200)
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete" })
        expect(yield* storedRkeys(did)).toEqual(["a"])
        expect(yield* memoryRkeys(did)).toEqual(["a"])
        const { tombstone } = yield* Effect.flatMap(RegistryStore, (s) => s.get(did, "b"))
        expect(tombstone?.rev).toBe(rev(200))
      }).pipe(Effect.scoped))

    it.effect("a refused version on the stream newer than the snapshot is not replaced by the stale listing", () =>
      Effect.gen(function*() {
        const did = plc(78)
        const fakes = yield* Fakes
        fakes.docs.set(did, didDoc(did, fakes.pds.url))
        fakes.repos.set(did, { rev: rev(100), records: [{ rkey: "a", value: hook() }] })
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete", written: 1 })
        // an invalid version of a at rev 200 revokes it (tombstone at 200)
        yield* live([whEv(did, "a", { $type: "place.wisp.v2.wh", url: 42 }, { operation: "update", rev: rev(200) })])
        expect(yield* storedRkeys(did)).toEqual([])
        expect(yield* reconcile(did)).toMatchObject({ _tag: "complete" })
        expect(yield* storedRkeys(did)).toEqual([])
        expect(yield* memoryRkeys(did)).toEqual([])
      }).pipe(Effect.scoped))
  })
})
