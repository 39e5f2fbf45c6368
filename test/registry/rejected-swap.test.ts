/**
 * The refusals a reconciliation's swap makes are remembered (SPEC §2.6, §8.5 `rejected`): a scan
 * stores every valid record of the owner as active and clears the entries of the keys it stored;
 * the swap then admits the owner's rows against the admission limits in memory. A row it refuses
 * (beyond the owner's limit, or over a global one) is recorded with source `reconciliation` and
 * its reason, so that the owner can see why it receives nothing and RoomRequests finds the owner
 * when room is freed; a row it admits loses its entry. Real PostgreSQL, a fake PLC and PDS.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Either, Layer, Ref } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import { WebhookStateStore } from "../../src/services/operator/WebhookState.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RejectedStore from "../../src/services/registry/RejectedStore.js"
import { reconcileStack } from "../support/reconcile.js"
import { entries, listed, live, memoryRkeys, reconcile, setRepo } from "../support/refusals.js"
import { ev, memoryStack, plc, rev, WH, whRecordValue } from "../support/stack.js"

const hook = whRecordValue(`at://${plc(9_999)}`)
const SNAP = rev(100)
const SNAP2 = rev(200)

/** the owners with a pending reconciliation request */
const requested = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<{ did: string }>`SELECT did FROM owners WHERE reconcile_requested_at IS NOT NULL ORDER BY did`.pipe(
      Effect.map((rows) => rows.map((r) => r.did))
    )
)

const stack = (env: Record<string, string>) =>
  Layer.fresh(
    Layer.mergeAll(RejectedStore.layerSql, WebhookState.layerSql).pipe(Layer.provideMerge(reconcileStack({ env })))
  )

/** The owner's repo holds a, b and c, one over its limit of 2: reconciled, a and b admitted. */
const reconciledOverLimit = (did: string) =>
  Effect.gen(function*() {
    yield* setRepo(did, SNAP, [
      { rkey: "a", value: hook },
      { rkey: "b", value: hook },
      { rkey: "c", value: hook }
    ])
    expect(yield* reconcile(did)).toBe("complete")
    expect(yield* memoryRkeys(did)).toEqual(["a", "b"])
  })

describe("the swap's refusals (limit_owner)", () => {
  layer(stack({ REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "2" }), { timeout: "120 seconds", excludeTestServices: true })(
    "reconciled",
    (it) => {
      it.effect("a row beyond the owner's limit is listed as refused (limit_owner, reconciliation), once however often swapped", () =>
        Effect.gen(function*() {
          const did = plc(601)
          yield* reconciledOverLimit(did)
          // (1) the cut row is listed, with the row's cid and the snapshot's rev
          expect(yield* listed(did)).toEqual([
            { rkey: "c", rev: SNAP, cid: "bafyc", reason: "limit_owner", source: "reconciliation" }
          ])
          const first = (yield* entries(did))[0]?.firstSeenAt
          // a swap again (another process, a sync) changes nothing but the sighting
          yield* Effect.flatMap(Registry, (r) => r.swapOwner(did))
          expect(yield* listed(did)).toEqual([
            { rkey: "c", rev: SNAP, cid: "bafyc", reason: "limit_owner", source: "reconciliation" }
          ])
          expect((yield* entries(did))[0]?.firstSeenAt).toEqual(first)
          // the stored row stays active (admission is in memory)
          const states = yield* Effect.flatMap(WebhookStateStore, (s) => s.list(did))
          expect(states.map((s) => [s.rkey, s.active])).toEqual([["a", true], ["b", true], ["c", true]])
        }))

      it.effect("then the owner deletes an active webhook: RoomRequests requests it, the scan admits the row and its entry goes", () =>
        Effect.gen(function*() {
          const did = plc(603)
          yield* reconciledOverLimit(did)
          // (2) the owner deletes a: RoomRequests finds its limit_owner refusal and stamps it
          expect(yield* live([ev(did, WH, "a", { operation: "delete", rev: rev(150) })])).toEqual(["deleted"])
          expect(yield* requested).toEqual([did])
          yield* setRepo(did, SNAP2, [{ rkey: "b", value: hook }, { rkey: "c", value: hook }])
          expect(yield* reconcile(did)).toBe("complete")
          expect(yield* memoryRkeys(did)).toEqual(["b", "c"])
          expect(yield* listed(did)).toEqual([])
          expect(yield* requested).toEqual([])
        }))

      it.effect("a swap's refusal is recorded only while the refused row is the key's stored active version", () =>
        Effect.gen(function*() {
          const did = plc(605)
          yield* reconciledOverLimit(did)
          // a swap that read an older version of b, or a key stored no more (a live write came between)
          const store = yield* RegistryStore.RegistryStore
          yield* store.recordSwap(did, {
            refused: [
              { rkey: "b", rev: rev(1), cid: "bafyb", reason: "limit_owner" },
              { rkey: "gone", rev: SNAP, cid: "bafyg", reason: "limit_owner" }
            ],
            admitted: []
          })
          expect((yield* listed(did)).map((e) => e.rkey)).toEqual(["c"])
        }))

      it.effect("a failing recordSwap leaves the enclosing transaction usable (its own savepoint)", () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const store = yield* RegistryStore.RegistryStore
          const did = plc(604)
          const result = yield* Effect.gen(function*() {
            // jsonb refuses \u0000: the statement fails
            const failed = yield* Effect.either(
              store.recordSwap(did, {
                refused: [{ rkey: "a\u0000", rev: SNAP, cid: undefined, reason: "limit_owner" }],
                admitted: []
              })
            )
            const after = yield* sql<{ n: number }>`SELECT 1::int AS n`
            return [Either.isLeft(failed), after[0]?.n]
          }).pipe(sql.withTransaction)
          expect(result).toEqual([true, 1])
        }))

      it.effect("an owner's entries stay bounded: at most perOwner refusals recorded by one swap", () =>
        Effect.gen(function*() {
          const did = plc(602)
          const n = RejectedStore.REJECTED_LIMITS.perOwner + 30
          const records = Array.from({ length: n }, (_, i) => ({ rkey: `k${String(i).padStart(4, "0")}`, value: hook }))
          yield* setRepo(did, SNAP, records)
          expect(yield* reconcile(did)).toBe("complete")
          expect((yield* memoryRkeys(did)).length).toBe(2)
          const listedNow = yield* entries(did)
          // the first refused in the load order (the next to be admitted) are the ones kept
          const sql = yield* SqlClient.SqlClient
          const order = yield* sql<{ rkey: string }>`
            SELECT rkey FROM webhooks WHERE owner_did = ${did} ORDER BY created_at, rkey`
          expect(listedNow.map((e) => e.rkey).sort()).toEqual(
            order.slice(2, 2 + RejectedStore.REJECTED_LIMITS.perOwner).map((r) => r.rkey).sort()
          )
        }))
    }
  )
})

describe("the swap's refusals (global limit)", () => {
  layer(stack({ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2" }), { timeout: "120 seconds", excludeTestServices: true })(
    "reconciled",
    (it) => {
      it.effect("a row refused for limit_total is recorded; a later swap that admits it clears the entry", () =>
        Effect.gen(function*() {
          const alice = plc(611)
          const bob = plc(612)
          expect(
            yield* live([
              ev(alice, WH, "a1", { record: hook, rev: rev(1) }),
              ev(alice, WH, "a2", { record: hook, rev: rev(2) })
            ])
          ).toEqual(["active", "active"])
          yield* setRepo(bob, SNAP, [{ rkey: "b", value: hook }])
          expect(yield* reconcile(bob)).toBe("complete")
          expect(yield* memoryRkeys(bob)).toEqual([])
          // (3) the global limit's refusal is recorded
          expect(yield* listed(bob)).toEqual([
            { rkey: "b", rev: SNAP, cid: "bafyb", reason: "limit_total", source: "reconciliation" }
          ])
          // Alice deletes one: Bob is requested (his refusal is found)
          expect(yield* live([ev(alice, WH, "a1", { operation: "delete", rev: rev(3) })])).toEqual(["deleted"])
          expect(yield* requested).toEqual([bob])
          // a swap that admits it (here at once, without a scan) clears the entry
          yield* Effect.flatMap(Registry, (r) => r.swapOwner(bob))
          expect(yield* memoryRkeys(bob)).toEqual(["b"])
          expect(yield* listed(bob)).toEqual([])
        }))
    }
  )
})

describe("the swap's refusals (in memory)", () => {
  const row = (did: string, rkey: string, n: number) => {
    const v = validateWhRecord(hook, { allowInsecureDev: true })
    if (Either.isLeft(v)) throw new Error(v.left)
    return toRow(did, rkey, v.right.record, v.right.scope, rev(n), 1, `bafy${rkey}`, true)
  }
  /** the memory stack over `state`, its store's recordSwap failing while `down.value` */
  const stack = (state: RegistryStore.MemoryRegistryState, down: { value: boolean }) =>
    memoryStack({
      env: { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" },
      registryStore: Layer.effect(
        RegistryStore.RegistryStore,
        Effect.map(Ref.make(state), (ref) => {
          const real = RegistryStore.makeMemoryOver(ref)
          return {
            ...real,
            recordSwap: (did: string, o: Parameters<typeof real.recordSwap>[1]) =>
              Effect.suspend(() =>
                down.value ? Effect.fail(new StoreError({ op: "test", code: "57P01" })) : real.recordSwap(did, o)
              )
          }
        })
      )
    })
  const did = plc(621)

  it.effect("the in-memory store records the refusal and clears it once admitted", () => {
    const state = RegistryStore.emptyMemoryState()
    return Effect.gen(function*() {
      const store = yield* RegistryStore.RegistryStore
      const registry = yield* Registry
      yield* store.upsert(row(did, "a", 1))
      yield* store.upsert(row(did, "b", 2))
      yield* registry.swapOwner(did)
      expect(registry.index.byOwner(did).map((w) => w.rkey)).toEqual(["a"])
      expect([...state.rejected.values()].map((e) => [e.rkey, e.rev, e.reason, e.source])).toEqual([
        ["b", rev(2), "limit_owner", "reconciliation"]
      ])
      // a is gone from the store: b is admitted, its entry cleared
      yield* store.remove(did, "a", { rev: rev(3), generation: 2 })
      yield* registry.swapOwner(did)
      expect(registry.index.byOwner(did).map((w) => w.rkey)).toEqual(["b"])
      expect([...state.rejected.values()]).toEqual([])
    }).pipe(Effect.provide(stack(state, { value: false })))
  })

  it.effect("a store failure does not fail the swap (logged; the next swap records it)", () => {
    const state = RegistryStore.emptyMemoryState()
    const down = { value: true }
    return Effect.gen(function*() {
      const store = yield* RegistryStore.RegistryStore
      const registry = yield* Registry
      yield* store.upsert(row(did, "a", 1))
      yield* store.upsert(row(did, "b", 2))
      yield* registry.swapOwner(did)
      expect(registry.index.byOwner(did).map((w) => w.rkey)).toEqual(["a"])
      expect(state.rejected.size).toBe(0)
      down.value = false
      yield* registry.swapOwner(did)
      expect([...state.rejected.values()].map((e) => e.rkey)).toEqual(["b"])
    }).pipe(Effect.provide(stack(state, down)))
  })
})
