/**
 * The admission counters (health's `rejected`, `firehook_registry_admission_rejected_total`) count
 * records not activated because a limit was reached: a swap of an owner (a completion, a sync of a
 * change another process made: a gone mark set or cleared, a new rev from a scan) counts a refusal
 * only when it is new (the key was registered before the swap, or that version was not already
 * refused for that limit in this process: by a swap, a live write, or the load, which counts it as
 * not loaded), for a global limit as for the owner's. Before, every swap counted again every row it
 * refused for a global limit, and never one beyond the owner's limit.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, Layer, Metric, Queue, TestClock } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as Config from "../../src/services/platform/Config.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import type { AdmissionLimit } from "../../src/services/registry/Registry.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryMod from "../../src/services/registry/Registry.js"
import * as RegistryChanges from "../../src/services/registry/RegistryChanges.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RegistrySync from "../../src/services/registry/RegistrySync.js"
import * as Db from "../support/db.js"
import { plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

const row = (owner: string, rkey: string, n = 1, cid = `cid-${rkey}`) => {
  const v = validateWhRecord(
    whRecordValue(`at://${owner}/app.bsky.feed.post`, { url: `https://${rkey}.example/hook` }),
    {
      allowInsecureDev: false
    }
  )
  if (Either.isLeft(v)) throw new Error("invalid fixture")
  return toRow(owner, rkey, v.right.record, v.right.scope, rev(n), 1, cid, true)
}

/** the registry's counter for `limit` (the same name and description: one series) */
const metricOf = (limit: AdmissionLimit) =>
  Metric.tagged(
    Metric.counter("firehook_registry_admission_rejected_total", {
      description: "Webhook records not activated because an admission limit was reached"
    }),
    "limit",
    limit
  )

/** health's and the metric's counts of `limit` since `counted` was called */
const counting = (limit: AdmissionLimit) =>
  Effect.gen(function*() {
    const registry = yield* Registry
    const health = (yield* registry.stats).rejected[limit]
    const metric = (yield* Metric.value(metricOf(limit))).count
    return Effect.gen(function*() {
      const h = (yield* registry.stats).rejected[limit] - health
      const m = (yield* Metric.value(metricOf(limit))).count - metric
      expect(m).toBe(h)
      return h
    })
  })

/** A registry over a memory store seeded with `rows` (written before the registry loads). */
const seeded = (rows: ReadonlyArray<RegistryStore.WebhookRow>, env: Record<string, string>) =>
  RegistryMod.layer.pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        Layer.effect(
          RegistryStore.RegistryStore,
          Effect.tap(RegistryStore.makeMemory, (s) => Effect.forEach(rows, s.upsert))
        ),
        Tx.layerMemory
      )
    ),
    Layer.provideMerge(Config.layerValue(testConfig(env)))
  )

describe("a swap counts only new refusals", () => {
  const [A, B] = [plc(201), plc(202)]

  it.effect("a row the load refused is not counted again by the owner's syncs", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      expect((yield* registry.stats).notLoaded).toBe(1)
      const counted = yield* counting("total")
      const b1 = registry.index.get(`${B}/b1`)
      expect(b1).toBeUndefined()
      for (let i = 0; i < 3; i++) {
        // a gone mark set, then cleared (a new version of the row, same record), each followed
        yield* store.markGone(B, "b1", row(B, "b1", 2).fingerprint)
        yield* registry.syncOwner(B)
        yield* store.upsert(row(B, "b1", 2))
        yield* registry.syncOwner(B)
      }
      expect(yield* counted).toBe(0)
    }).pipe(Effect.provide(seeded([row(A, "a1"), row(B, "b1", 2)], { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }))))

  it.effect("a completion's refusal counts once (the reconciler's swap, the leader's sync); a new version again", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const counted = yield* counting("total")
      // B's scan stored b1: the reconciler's swap refuses it, then the same process follows the
      // completion again (the leader's sync), and a later scan stores it at its snapshot's rev
      yield* store.upsert(row(B, "b1", 2))
      yield* registry.swapOwner(B)
      yield* registry.syncOwner(B)
      yield* store.upsert(row(B, "b1", 3))
      yield* registry.swapOwner(B)
      expect(yield* counted).toBe(1)
      // a new version of the record (another cid) is another refusal
      yield* store.upsert(row(B, "b1", 4, "cid-b1-v2"))
      yield* registry.syncOwner(B)
      yield* registry.syncOwner(B)
      expect(yield* counted).toBe(2)
      expect(registry.index.size).toBe(1)
    }).pipe(Effect.provide(seeded([row(A, "a1")], { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }))))

  it.effect("refusals beyond the owner's limit are counted, once each", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const counted = yield* counting("owner")
      yield* store.upsert(row(A, "a2", 2))
      yield* store.upsert(row(A, "a3", 2))
      for (let i = 0; i < 3; i++) yield* registry.syncOwner(A)
      expect(registry.index.byOwner(A).map((w) => w.rkey)).toEqual(["a1"])
      expect(yield* counted).toBe(2)
    }).pipe(Effect.provide(seeded([row(A, "a1")], { REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" }))))

  it.effect("a version refused on the stream is not counted again when a scan stores it and the swap refuses it", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const counted = yield* counting("total")
      const value = whRecordValue(`at://${B}/app.bsky.feed.post`, { url: "https://b1.example/hook" })
      const outcome = yield* registry.applyWhEvent(whEv(B, "b1", value, { rev: rev(2) }))
      expect(outcome).toMatchObject({ _tag: "rejected", limit: "total" })
      expect(yield* counted).toBe(1)
      // the owner's scan stores the same record (its cid) at the snapshot's rev; the swap refuses it
      const cid = "bafyreib2rxk3rh6kzwq"
      yield* store.upsert(row(B, "b1", 5, cid))
      yield* registry.syncOwner(B)
      yield* registry.syncOwner(B)
      expect(registry.index.byOwner(B)).toEqual([])
      expect(yield* counted).toBe(1)
    }).pipe(Effect.provide(seeded([row(A, "a1")], { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }))))
})

describe("gone marks set and cleared by another process (RegistrySync, PostgreSQL)", () => {
  const [A, B] = [plc(211), plc(212)]
  const layer = RegistryMod.layer.pipe(
    Layer.provideMerge(RegistryChanges.layerSql),
    Layer.provideMerge(Layer.mergeAll(RegistryStore.layerSql, Tx.layerSql)),
    Layer.provideMerge(
      Layer.mergeAll(Db.layer(), Config.layerValue(testConfig({ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" })))
    )
  )
  it.layer(layer, { timeout: 60_000 })("activeMax 1", (it) => {
    it.effect("each sync of the owner of a refused row counts nothing new", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const store = yield* RegistryStore.RegistryStore
        const registry = yield* Registry
        const changes = yield* RegistryChanges.RegistryChanges
        yield* sql`INSERT INTO owners (did, reconcile_status) VALUES (${A}, 'complete'), (${B}, 'complete')`
        yield* store.upsert(row(A, "a1", 1))
        yield* store.upsert(row(B, "b1", 2))
        const from = yield* changes.horizon
        yield* registry.reload
        const synced = yield* Queue.unbounded<string>()
        const fiber = yield* Effect.fork(RegistrySync.follow({
          from,
          registry,
          reloadAll: registry.reload,
          listen: false,
          onSynced: (t, d) => Queue.offer(synced, `${t}:${d}`)
        }))
        const counted = yield* counting("total")
        for (let i = 0; i < 3; i++) {
          yield* sql`UPDATE webhooks SET gone_at = now() WHERE owner_did = ${B} AND rkey = 'b1'`
          yield* TestClock.adjust("5 seconds")
          yield* Queue.take(synced)
          yield* sql`UPDATE webhooks SET gone_at = NULL WHERE owner_did = ${B} AND rkey = 'b1'`
          yield* TestClock.adjust("5 seconds")
          yield* Queue.take(synced)
        }
        yield* Fiber.interrupt(fiber)
        expect(registry.index.size).toBe(1)
        expect(yield* counted).toBe(0)
      }))
  })
})
