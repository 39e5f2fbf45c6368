/**
 * Shared steps of the refused-records tests on a reconcile stack (test/support/reconcile.ts): a
 * repo on the fake PDS, a reconciliation, live registry-stream events through the real Processor,
 * and what the rejected store and the registry's memory then hold.
 */
import { Effect } from "effect"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { Registry } from "../../src/services/registry/Registry.js"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import { didDoc, type FakeRecord } from "./fakeAtproto.js"
import { Fakes } from "./reconcile.js"

export const setRepo = (did: string, repoRev: string, records: ReadonlyArray<FakeRecord>) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.docs.set(did, didDoc(did, fakes.pds.url))
    fakes.repos.set(did, { rev: repoRev, records: [...records] })
  })

export const reconcile = (did: string) =>
  Effect.flatMap(Reconciler, (r) => r.reconcile(did)).pipe(Effect.map((o) => o._tag))

export const live = (events: ReadonlyArray<RecordEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true })).pipe(
    Effect.map((r) => r.outcomes.map((o) => ("registry" in o && o.registry !== undefined ? o.registry._tag : o._tag)))
  )

export const entries = (did: string) => Effect.flatMap(RejectedStore.RejectedStore, (s) => s.list(did))
export const listed = (did: string) =>
  Effect.map(
    entries(did),
    (es) =>
      es.map((e) => ({ rkey: e.rkey, rev: e.rev, cid: e.cid, reason: e.reason, source: e.source })).sort((a, b) =>
        a.rkey < b.rkey ? -1 : 1
      )
  )
export const memoryRkeys = (did: string) => Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => w.rkey).sort())
