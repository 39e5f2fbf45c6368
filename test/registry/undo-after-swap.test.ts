/**
 * A failed unit of intake work (`Registry.transactional`) undoes its index changes; swaps of other
 * owners (RegistrySync's `syncOwner`, the retry scheduler's and the reconciler's `swapOwner`) do not
 * wait for it (the owner lock orders one owner only), so a swap that ran while the unit was open was
 * judged against changes the undo takes back (SPEC §2.6: a record that would become active is
 * checked against the registrations there are). After such a failure, even one the server answered
 * (rolled back for sure), the swapped owners are judged again: at once in memory (no limit exceeded,
 * even while the store does not answer), then from the store after the unit's own owners, so the
 * registrations the unit left as they were keep their room.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Either, Fiber, Layer } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as Config from "../../src/services/platform/Config.js"
import { StoreError, Tx } from "../../src/services/platform/Persistence.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryMod from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

const row = (owner: string, rkey: string) => {
  const v = validateWhRecord(
    whRecordValue(`at://${owner}/app.bsky.feed.post`, { url: `https://${rkey}.example/hook` }),
    {
      allowInsecureDev: false
    }
  )
  if (Either.isLeft(v)) throw new Error("invalid fixture")
  return toRow(owner, rkey, v.right.record, v.right.scope, rev(1), 1, `cid-${rkey}`, true)
}

/** the server's own answer to a statement: the transaction was rolled back (no commit hidden) */
const rolledBack = new StoreError({ op: "test", code: "40001" })

/** every key in the index, sorted */
const keys = Effect.map(Registry, (r) => [...r.index.all()].map((w) => w.key).sort())

/**
 * Run `work` as a unit (in a transaction) that fails with `rolledBack` once `during` (run by
 * another fiber after `work`) is done; the unit's result.
 */
const unitRacing = <A, R>(work: Effect.Effect<A, StoreError, R>, during: Effect.Effect<void, StoreError>) =>
  Effect.gen(function*() {
    const registry = yield* Registry
    const tx = yield* Tx
    const worked = yield* Deferred.make<void>()
    const swapped = yield* Deferred.make<void>()
    const unit = registry.transactional(tx.withTransaction(Effect.gen(function*() {
      yield* work
      yield* Deferred.succeed(worked, undefined)
      yield* Deferred.await(swapped)
      return yield* Effect.fail(rolledBack)
    })))
    const fiber = yield* Effect.fork(Effect.either(unit))
    yield* Deferred.await(worked)
    yield* during
    yield* Deferred.succeed(swapped, undefined)
    return yield* Fiber.join(fiber)
  })

describe("a failed unit after a concurrent swap of another owner (PostgreSQL)", () => {
  const layer = RegistryMod.layer.pipe(
    Layer.provideMerge(Layer.mergeAll(RegistryStore.layerSql, Tx.layerSql)),
    Layer.provideMerge(
      Layer.mergeAll(Db.layer(), Config.layerValue(testConfig({ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2" })))
    )
  )
  it.layer(layer, { timeout: 60_000 })("activeMax 2", (it) => {
    /** the store holds `loaded` (loaded into the index), then `stored` (not yet in memory) */
    const seed = (loaded: ReadonlyArray<RegistryStore.WebhookRow>, stored: ReadonlyArray<RegistryStore.WebhookRow>) =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const store = yield* RegistryStore.RegistryStore
        yield* sql`TRUNCATE webhooks, owners, tombstones, rejected_records`
        yield* Effect.forEach(loaded, store.upsert)
        yield* (yield* Registry).reload
        yield* Effect.forEach(stored, store.upsert)
      })

    it.effect("room the unit freed and a swap used: the undone delete keeps its room, the swapped record is refused", () =>
      Effect.gen(function*() {
        const [X, Y, Z] = [plc(101), plc(102), plc(103)]
        const registry = yield* Registry
        const sql = yield* SqlClient.SqlClient
        // y1 and z1 fill the index; x1 is X's reconciled record, stored by another process
        yield* seed([row(Y, "y1"), row(Z, "z1")], [row(X, "x1")])
        expect(yield* keys).toEqual([`${Y}/y1`, `${Z}/z1`].sort())
        const rejectedBefore = (yield* registry.stats).rejected.total
        const result = yield* unitRacing(
          // the unit deletes y1: room under activeMax, in memory at once
          registry.applyWhEvent(whEv(Y, "y1", undefined, { operation: "delete", rev: rev(2) })),
          // meanwhile the leader follows X's completion, into that room
          Effect.gen(function*() {
            yield* registry.syncOwner(X)
            expect(registry.index.byOwner(X).map((w) => w.rkey)).toEqual(["x1"])
          })
        )
        expect(Either.isLeft(result)).toBe(true)
        // the delete was rolled back: y1 is registered as it was, x1 (which would become active
        // with y1 there) is refused for the total, and the index holds activeMax registrations
        expect(yield* keys).toEqual([`${Y}/y1`, `${Z}/z1`].sort())
        expect(registry.index.size).toBe(2)
        const refused = yield* sql<{ rkey: string; reason: string }>`
          SELECT rkey, reason FROM rejected_records WHERE owner_did = ${X}`
        expect(refused).toEqual([{ rkey: "x1", reason: "limit_total" }])
        // x1's registration was revoked: one refusal counted
        expect((yield* registry.stats).rejected.total - rejectedBefore).toBe(1)
      }))

    it.effect("room the unit used while a swap was refused: the undone create frees it, the swapped record is admitted", () =>
      Effect.gen(function*() {
        const [X, Y, Z] = [plc(111), plc(112), plc(113)]
        const registry = yield* Registry
        const sql = yield* SqlClient.SqlClient
        yield* seed([row(Z, "z1")], [row(X, "x1")])
        const result = yield* unitRacing(
          // the unit creates y2: the index is full
          Effect.gen(function*() {
            const created = yield* registry.applyWhEvent(
              whEv(Y, "y2", whRecordValue(`at://${Y}/app.bsky.feed.post`), { rev: rev(2) })
            )
            expect(created._tag).toBe("active")
          }),
          // meanwhile X's completion is followed: refused for the total
          Effect.gen(function*() {
            yield* registry.syncOwner(X)
            expect(registry.index.byOwner(X)).toEqual([])
          })
        )
        expect(Either.isLeft(result)).toBe(true)
        // y2 was never stored: x1 takes the room, and its refusal is no longer listed
        expect(yield* keys).toEqual([`${X}/x1`, `${Z}/z1`].sort())
        expect(yield* sql`SELECT 1 FROM rejected_records WHERE owner_did = ${X}`).toEqual([])
      }))
  })
})

describe("a failed unit after a concurrent swap, the store not answering (memory store)", () => {
  it.effect("no limit is exceeded meanwhile; the next unit fails until the owners are reloaded", () => {
    const [X, Y, Z] = [plc(121), plc(122), plc(123)]
    let down = false
    const StoreLive = Layer.effect(
      RegistryStore.RegistryStore,
      Effect.map(RegistryStore.makeMemory, (s): RegistryStore.RegistryStoreShape => ({
        ...s,
        ownerRows: (did) => down ? Effect.fail(new StoreError({ op: "test", code: "57P01" })) : s.ownerRows(did)
      }))
    )
    const layer = RegistryMod.layer.pipe(
      Layer.provideMerge(Layer.mergeAll(StoreLive, Tx.layerMemory)),
      Layer.provideMerge(Config.layerValue(testConfig({ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2" })))
    )
    return Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      yield* store.upsert(row(Y, "y1"))
      yield* store.upsert(row(Z, "z1"))
      yield* registry.reload
      yield* store.upsert(row(X, "x1"))
      const result = yield* unitRacing(
        registry.applyWhEvent(whEv(Y, "y1", undefined, { operation: "delete", rev: rev(2) })),
        Effect.gen(function*() {
          yield* registry.syncOwner(X)
          expect(registry.index.byOwner(X).map((w) => w.rkey)).toEqual(["x1"])
          down = true
        })
      )
      expect(Either.isLeft(result)).toBe(true)
      // the undo put y1 back; x1, judged again in memory, no longer fits
      expect(yield* keys).toEqual([`${Y}/y1`, `${Z}/z1`].sort())
      // the owners could not be reloaded: the next unit fails before it runs
      let ran = false
      const next = registry.transactional(Effect.sync(() => void (ran = true)))
      expect(Either.isLeft(yield* Effect.either(next))).toBe(true)
      expect(ran).toBe(false)
      // the store answers again: reloaded first (this memory store kept the delete, as a commit
      // would have: y1 is gone and x1 takes its room), then the unit runs
      down = false
      yield* next
      expect(ran).toBe(true)
      expect(yield* keys).toEqual([`${X}/x1`, `${Z}/z1`].sort())
    }).pipe(Effect.provide(layer))
  })
})
