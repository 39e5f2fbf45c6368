/**
 * An owner left `scanning` by the database (SPEC §5.3 step 5, issue 14 item 13): a scan that the
 * database failed mid-way, or an interrupted scan whose `interrupted` mark the database did not
 * take, is marked failed once the database answers again, so the owner's deliveries are not
 * deferred until a rescan. A real PostgreSQL behind a store that fails every call while "down", a
 * fake PLC and PDS.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Either, Fiber } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { Processor } from "../../src/services/matching/Processor.js"
import { Reconciler } from "../../src/services/reconciliation/Reconciler.js"
import { type OwnerReconcileState, ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { RegistryStore } from "../../src/services/registry/RegistryStore.js"
import { didDoc, listRecordsRequests } from "../support/fakeAtproto.js"
import { downableStore, Fakes, reconcileStack, waitFor } from "../support/reconcile.js"
import { plc, rev, whEv, whRecordValue } from "../support/stack.js"

const down = { value: false }
const hook = whRecordValue(`at://${plc(9_999)}`)

const live = (events: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(events, { registryWriter: true }))

const reconcile = (did: string) => Effect.flatMap(Reconciler, (r) => r.reconcile(did))

/** The owner's status as the database holds it, read around the failing store. */
const storedStatus = (did: string) =>
  Effect.flatMap(RegistryStore, (s) => s.owner(did)).pipe(Effect.map((o) => o?.status))

const memoryRkeys = (did: string) => Effect.map(Registry, (r) => r.index.byOwner(did).map((w) => w.rkey).sort())

/** Poll (live clock) the owner's reconcile state until `ok` holds; dies after `timeoutMs`. */
const eventually = (did: string, ok: (s: OwnerReconcileState | undefined) => boolean, timeoutMs = 5_000) =>
  Effect.gen(function*() {
    const store = yield* ReconcileStore
    for (let waited = 0; waited < timeoutMs; waited += 20) {
      const state = yield* store.ownerState(did)
      if (ok(state)) return state
      yield* Effect.sleep("20 millis")
    }
    return yield* Effect.dieMessage("owner state not reached in time")
  })

/** Publish `did`'s DID document and a repo holding `w`. */
const setup = (did: string) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    fakes.docs.set(did, didDoc(did, fakes.pds.url))
    fakes.repos.set(did, { rev: rev(100), records: [{ rkey: "w", value: hook }] })
  })

const isOwnerList = (did: string) => (req: { readonly path: string; readonly query: URLSearchParams }) =>
  req.path === "/xrpc/com.atproto.repo.listRecords" && req.query.get("repo") === did

describe("failure marks the database did not take", () => {
  layer(
    reconcileStack({
      limits: { failureMarkRetryBaseMs: 20, failureMarkRetryMaxMs: 100 },
      wrapStore: (real) => downableStore(real, down)
    }),
    { timeout: "120 seconds", excludeTestServices: true }
  )("on PostgreSQL", (it) => {
    it.effect("a scan the database failed mid-way: the owner is marked failed when the database answers again", () =>
      Effect.gen(function*() {
        const did = plc(401)
        const fakes = yield* Fakes
        yield* live([whEv(did, "w", hook, { rev: rev(1) })])
        yield* setup(did)
        // the database goes away while the PDS answers the first page: writing it fails
        fakes.pds.handler = (req) => {
          if (isOwnerList(did)(req)) down.value = true
          return fakes.defaultPds(req)
        }
        const result = yield* Effect.either(reconcile(did)).pipe(
          Effect.ensuring(Effect.sync(() => (fakes.pds.handler = fakes.defaultPds)))
        )
        expect(Either.isLeft(result) && result.left._tag).toBe("StoreError")
        expect(yield* storedStatus(did)).toBe("scanning")
        // it answers again: no rescan needed for the owner to leave `scanning`
        down.value = false
        const state = yield* eventually(did, (s) => s?.status === "failed")
        expect(state).toMatchObject({ status: "failed", lastFailureKind: "database_error", failureCount: 1 })
        // its last known-good registrations are kept
        expect(yield* memoryRkeys(did)).toEqual(["w"])
        // and the next scan completes as usual
        expect((yield* reconcile(did))._tag).toBe("complete")
      }).pipe(Effect.ensuring(Effect.sync(() => (down.value = false)))))

    it.effect("an interrupted scan whose mark the database did not take is marked when it answers again", () =>
      Effect.gen(function*() {
        const did = plc(402)
        const fakes = yield* Fakes
        yield* setup(did)
        let release: () => void = () => undefined
        const gate = new Promise<void>((resolve) => (release = resolve))
        fakes.pds.handler = async (req) => {
          if (isOwnerList(did)(req)) await gate
          return fakes.defaultPds(req)
        }
        const fiber = yield* Effect.fork(reconcile(did))
        yield* waitFor(() => listRecordsRequests(fakes.pds).some(isOwnerList(did)))
        down.value = true
        yield* Fiber.interrupt(fiber)
        release()
        fakes.pds.handler = fakes.defaultPds
        expect(yield* storedStatus(did)).toBe("scanning")
        down.value = false
        const state = yield* eventually(did, (s) => s?.status === "failed")
        expect(state).toMatchObject({ status: "failed", lastFailureKind: "interrupted", failureCount: 1 })
      }).pipe(Effect.ensuring(Effect.sync(() => (down.value = false)))))
  })
})
