/**
 * Shared pieces of the Reconciler tests (reconciler.*.test.ts): an owner's DID document and repo on
 * the fake PLC and PDS, live events, the stored and in-memory registrations, a reconcile with the
 * PDS's listRecords answered by the test, and listRecords pages.
 */
import { Effect } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { didDoc, type FakeRecord, type FakeRequest, type FakeResponse } from "../support/fakeAtproto.js"
import { Fakes } from "../support/reconcile.js"
import { plc, whRecordValue } from "../support/stack.js"

export const BOB = plc(9_999)
export const POST = "app.bsky.feed.post"

export const hook = (url = "https://receiver.example/hook") => whRecordValue(`at://${BOB}`, { url })

/** Publish `did`'s DID document (PDS = the fake PDS unless given) and its repo. */
export const setup = (did: string, records: ReadonlyArray<FakeRecord>, options: { rev?: string; pds?: string } = {}) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.docs.set(did, didDoc(did, options.pds ?? fakes.pds.url))
    fakes.repos.set(did, { rev: options.rev, records: [...records] })
  })

export const live = (events: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true }))

export const storedRkeys = (did: string) =>
  Effect.flatMap(RegistryStore, (s) => s.ownerRows(did)).pipe(Effect.map((rows) => rows.map((r) => r.rkey).sort()))

export const memoryRkeys = (did: string) => Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => w.rkey).sort())

export const reconcile = (did: string) => Effect.flatMap(Reconciler, (r) => r.reconcile(did))

export const ownerState = (did: string) => Effect.flatMap(ReconcileStore, (s) => s.ownerState(did))

/**
 * Reconcile `did` while `respond` answers its listRecords requests (the default PDS answers the
 * rest); the default PDS handler is restored afterwards, also when the reconcile fails.
 */
export const reconcileServing = (did: string, respond: (req: FakeRequest) => FakeResponse) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.pds.handler = (req) =>
      req.path === "/xrpc/com.atproto.repo.listRecords" && req.query.get("repo") === did
        ? respond(req)
        : fakes.defaultPds(req)
    return yield* reconcile(did).pipe(Effect.ensuring(Effect.sync(() => (fakes.pds.handler = fakes.defaultPds))))
  })

export const json = (status: number, value: unknown): FakeResponse => ({ status, body: JSON.stringify(value) })

export const page = (did: string, rkeys: ReadonlyArray<string>, cursor?: string, value: unknown = hook()) =>
  json(200, {
    records: rkeys.map((k) => ({ uri: `at://${did}/place.wisp.v2.wh/${k}`, cid: `bafy${k}`, value })),
    ...(cursor === undefined ? {} : { cursor })
  })
