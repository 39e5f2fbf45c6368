/**
 * What the registry loads (SPEC §2.6) does not depend on how many rows other owners hold beyond
 * their limits. Reconciliation stores every valid listed record as active (admission is applied
 * in memory, at load and swap); the load used to read one window of the oldest `2 × total + 1`
 * active rows and admit from it, so owners over their per-owner limit filled the window and a
 * legitimate webhook created later was not loaded after a restart or a takeover. Now the load
 * reads, in bounded pages, each owner's first `ownerMax` active rows (created_at, rkey) until the
 * index is full or the rows run out; `swapOwner` takes an owner's candidates by the same rule.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer } from "effect"
import { tidFromMicros } from "../../src/schemas/Tid.js"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as ReconcileStore from "../../src/services/reconciliation/ReconcileStore.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { memoryStack, plc, sqlStack, WH } from "../support/stack.js"

const did = (n: number) => plc(8_000 + n)
const SCOPE = plc(8_999)
const record = (n: number, scope = SCOPE) => ({
  $type: WH,
  scope: { aturi: `at://${scope}` },
  url: `https://r${n}.example/hook`,
  createdAt: "2026-01-01T00:00:00Z"
})
const rkey = (n: number) => tidFromMicros(1_700_000_000_000_000 + n)
const row = (owner: string, key: string, n: number, scope = SCOPE) => {
  const v = validateWhRecord(record(n, scope), { allowInsecureDev: false })
  if (Either.isLeft(v)) throw new Error(`invalid fixture: ${v.left}`)
  return Registry.toRow(owner, key, v.right.record, v.right.scope, rkey(n), 1, "bafyrei", true)
}

const rkeysOf = (registry: Registry.RegistryShape, owner: string) =>
  registry.index.byOwner(owner).map((w) => w.rkey).sort()

/** total 10, 2 per owner (the audit's reproduction) */
const LIMITS = { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "10", REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "2" }

describe("the load admits by the limits, whatever other owners hold beyond theirs (PostgreSQL)", () => {
  it.layer(Layer.fresh(ReconcileStore.layerSql.pipe(Layer.provideMerge(sqlStack({ env: LIMITS })))), {
    timeout: "120 seconds"
  })("reconciled owners over their limit", (it) => {
    it.effect("a webhook admitted live is loaded again after a restart; each owner keeps its oldest rows", () =>
      Effect.gen(function*() {
        const rs = yield* ReconcileStore.ReconcileStore
        let t = 1_750_000_000_000_000
        // three owners each hold 8 valid records; reconciliation stores them all as active, in two
        // pages each (listRecords lists the newest rkeys first: page one holds rkeys 4..7)
        for (const o of [1, 2, 3]) {
          const begun = yield* rs.begin(did(o), { maxOtherScanning: 8, staleScanMs: 900_000 })
          if (begun._tag !== "begun") return expect.unreachable("begun")
          const snap = tidFromMicros(t += 1000)
          yield* rs.saveSnapshotRev(did(o), begun.token, snap)
          const page = (ns: ReadonlyArray<number>) =>
            ns.map((n) => ({ ...row(did(o), rkey(n), n), rev: snap, generation: begun.token }))
          yield* rs.applyPage(did(o), begun.token, snap, page([4, 5, 6, 7]), [])
          yield* rs.applyPage(did(o), begun.token, snap, page([0, 1, 2, 3]), [])
          yield* rs.complete(did(o), begun.token, snap, Effect.void)
        }
        // an owner registers one webhook on the stream while the service runs: admitted
        const registry = yield* Registry.Registry
        yield* registry.reload
        const legit = did(9)
        const out = yield* registry.applyWhEvent({
          kind: "commit",
          did: legit,
          collection: WH,
          rkey: rkey(99),
          operation: "create",
          rev: tidFromMicros(t += 1000),
          cid: "bafyrei",
          record: record(99),
          timeUs: t,
          stream: "registry",
          relay: "wss://relay.test",
          cursor: String(t)
        })
        expect(out._tag).toBe("active")
        expect(rkeysOf(registry, legit)).toEqual([rkey(99)])

        // a restart (or a replica taking the intake role) loads again
        const restarted = yield* Registry.make
        yield* restarted.load
        expect(rkeysOf(restarted, legit)).toEqual([rkey(99)])
        // each reconciled owner: its first two active rows by created_at (the first page), then rkey
        for (const o of [1, 2, 3]) expect(rkeysOf(restarted, did(o))).toEqual([rkey(4), rkey(5)])
        const stats = yield* restarted.stats
        expect(stats.active).toBe(7)
        expect(stats.notLoaded).toBe(25 - 7)

        // a reload of the running registry, and a swap of one owner, come to the same
        yield* registry.reload
        expect(rkeysOf(registry, legit)).toEqual([rkey(99)])
        yield* registry.swapOwner(did(1))
        expect(rkeysOf(registry, did(1))).toEqual([rkey(4), rkey(5)])
        expect((yield* registry.stats).active).toBe(7)
      }))
  })
})

/**
 * Rows refused at load for another limit (here Jetstream's direct-DIDs set) do not end the load
 * either: it reads on, page after page, until the index is full or the rows run out. Total 2 (a
 * page of 3 rows), 2 direct DIDs: the owner and its scope fill the set, the five owners after
 * them would each add a DID, and the owner's second webhook, stored last, still fits.
 */
const pagingRows = () => {
  const owner = did(20)
  const others = [21, 22, 23, 24, 25].map((o) => row(did(o), rkey(o), o, did(o)))
  return { owner, rows: [row(owner, "a", 1), ...others, row(owner, "z", 2)] }
}
const PAGING = { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2", REGISTRY_DIRECT_SCOPE_DIDS_MAX: "2" }

const pagingTest = Effect.gen(function*() {
  const { owner, rows } = pagingRows()
  const store = yield* RegistryStore.RegistryStore
  for (const r of rows) yield* store.upsert(r)
  // a disabled record is stored inactive: never loaded, and never counted as not loaded (SPEC §2.6)
  yield* store.upsert({ ...row(did(26), "off", 26), enabled: false, active: false })
  const registry = yield* Registry.make
  yield* registry.load
  expect(rkeysOf(registry, owner)).toEqual(["a", "z"])
  const stats = yield* registry.stats
  expect(stats.active).toBe(2)
  expect(stats.notLoaded).toBe(5)
})

describe("the load reads on past rows refused for another limit", () => {
  it.effect("memory store", () => pagingTest.pipe(Effect.provide(Layer.fresh(memoryStack({ env: PAGING })))))
  it.layer(Layer.fresh(sqlStack({ env: PAGING })), { timeout: "120 seconds" })("PostgreSQL", (it) => {
    it.effect("PostgreSQL store", () => pagingTest)
  })
})
