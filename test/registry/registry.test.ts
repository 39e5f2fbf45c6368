/**
 * Registry load at startup (SPEC §2.5, §2.6), the per-owner swap used by reconciliation, and the
 * snapshot-rev fence of live writes on the memory store (SPEC §3.4; the PostgreSQL store's is in
 * test/reconciliation/snapshot-fence.test.ts), which the index follows while that snapshot is taken.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Metric, Ref } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryMod from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)

const row = (owner: string, rkey: string, record: Record<string, unknown>, active = true) => {
  const v = validateWhRecord(record, { allowInsecureDev: true })
  if (Either.isLeft(v)) throw new Error(`invalid fixture: ${v.left}`)
  return toRow(owner, rkey, v.right.record, v.right.scope, rev(1), 1, undefined, active)
}

/** A registry over a memory store seeded with `rows` (written before the registry loads). */
const seeded = (rows: ReadonlyArray<RegistryStore.WebhookRow>, env: Record<string, string> = {}) => {
  const StoreLive = Layer.effect(
    RegistryStore.RegistryStore,
    Effect.tap(RegistryStore.makeMemory, (s) => Effect.forEach(rows, (r) => s.upsert(r)))
  )
  const LifecycleLive = Lifecycle.layer({ shutdownTimeout: "5 seconds" })
  return RegistryMod.layer.pipe(
    Layer.provideMerge(StoreLive),
    Layer.provideMerge(Health.layer.pipe(Layer.provideMerge(LifecycleLive))),
    Layer.provideMerge(Config.layerValue(testConfig(env)))
  )
}

describe("Registry.load", () => {
  it.effect("loads active rows; disabled, gone and over-limit rows are not loaded and counted", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      expect(registry.index.size).toBe(2)
      const stats = yield* registry.stats
      expect(stats.active).toBe(2)
      expect(stats.notLoaded).toBe(1)
      const lifecycle = yield* Lifecycle.Lifecycle
      yield* lifecycle.setPhase("live")
      const report = yield* (yield* Health.Health).report
      expect(report.ready).toBe(true)
      expect(report.body["registry"]).toMatchObject({ active: 2, notLoaded: 1 })
    }).pipe(
      Effect.provide(
        seeded(
          [
            row(ALICE, "a", whRecordValue(`at://${BOB}`)),
            row(ALICE, "b", whRecordValue(`at://${BOB}`)),
            row(ALICE, "c", whRecordValue(`at://${BOB}`)),
            row(ALICE, "off", whRecordValue(`at://${BOB}`, { enabled: false }), false)
          ],
          { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "2" }
        )
      )
    ))

  it.effect("a stored record with enabled: false is never loaded, whatever its row's active flag says (SPEC §1)", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      // the load re-validates the stored record: a paused one is never matched and uses no capacity
      expect([...registry.index.all()].map((w) => w.rkey)).toEqual(["on"])
      expect((yield* registry.stats).notLoaded).toBe(1)
      // and the swap of a reconciled owner reads it by the same rule
      yield* registry.swapOwner(ALICE)
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["on"])
    }).pipe(
      Effect.provide(
        seeded([
          row(ALICE, "paused", whRecordValue(`at://${BOB}`, { enabled: false }), true),
          row(ALICE, "on", whRecordValue(`at://${BOB}`))
        ])
      )
    ))

  it.effect("re-validates stored records under the current configuration (insecure URLs are not loaded in production)", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      expect([...registry.index.all()].map((w) => w.rkey)).toEqual(["https"])
      expect((yield* registry.stats).notLoaded).toBe(1)
    }).pipe(
      Effect.provide(
        seeded([
          row(ALICE, "https", whRecordValue(`at://${BOB}`)),
          row(ALICE, "http", whRecordValue(`at://${BOB}`, { url: "http://127.0.0.1:9999/hook" }))
        ])
      )
    ))
})

describe("Registry: the operator's allow-list (DELIVERY_ALLOW_CIDRS)", () => {
  const internal = whRecordValue(`at://${BOB}`, { url: "https://10.0.0.5/hook" })

  it.effect("a record whose URL is an allow-listed internal IP literal becomes active", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const outcome = yield* registry.applyWhEvent(whEv(ALICE, "internal", internal, { rev: rev(2) }))
      expect(outcome._tag).toBe("active")
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["internal"])
    }).pipe(Effect.provide(seeded([], { DELIVERY_ALLOW_CIDRS: "10.0.0.0/8" }))))

  it.effect("without the allow-list the same record is refused (url)", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const outcome = yield* registry.applyWhEvent(whEv(ALICE, "internal", internal, { rev: rev(2) }))
      expect(outcome._tag).not.toBe("active")
      expect(registry.index.byOwner(ALICE)).toEqual([])
    }).pipe(Effect.provide(seeded([]))))
})

describe("Registry.swapOwner", () => {
  it.effect("replaces one owner's registrations with the stored set in one step", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey).sort()).toEqual(["a", "b"])
      // a reconciliation rewrote the owner's rows in the database
      yield* store.remove(ALICE, "a", { rev: rev(2), generation: 2 })
      yield* store.upsert(row(ALICE, "z", whRecordValue(`at://${BOB}/app.bsky.feed.post`)))
      // nothing changes in memory until the swap
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey).sort()).toEqual(["a", "b"])
      yield* registry.swapOwner(ALICE)
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey).sort()).toEqual(["b", "z"])
      expect(registry.index.byOwner(BOB).map((w) => w.rkey)).toEqual(["x"])
    }).pipe(
      Effect.provide(
        seeded([
          row(ALICE, "a", whRecordValue(`at://${BOB}`)),
          row(ALICE, "b", whRecordValue(`at://${BOB}`)),
          row(BOB, "x", whRecordValue(`at://${ALICE}`))
        ])
      )
    ))

  it.effect("a swap that keeps a registration as it was counts no new registration (the streams replay only for new ones)", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const before = registry.index.registrationsVersion
      const backlinkBefore = registry.index.backlinkRegistrationsVersion
      // a scan that found exactly what the index holds (every completed scan of the owner)
      yield* registry.swapOwner(ALICE)
      yield* registry.swapOwner(ALICE)
      expect(registry.index.registrationsVersion).toBe(before)
      expect(registry.index.backlinkRegistrationsVersion).toBe(backlinkBefore)
      // a new version of one webhook (another URL) and a new one are new registrations
      yield* store.upsert(row(ALICE, "a", whRecordValue(`at://${BOB}`, { url: "https://example.com/other" })))
      yield* store.upsert(row(ALICE, "c", whRecordValue(`at://${BOB}`)))
      yield* registry.swapOwner(ALICE)
      expect(registry.index.registrationsVersion).toBe(before + 2)
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey).sort()).toEqual(["a", "b", "c"])
    }).pipe(
      Effect.provide(
        seeded([
          row(ALICE, "a", whRecordValue(`at://${BOB}`)),
          row(ALICE, "b", whRecordValue(`at://${BOB}`, { backlinks: true }))
        ])
      )
    ))

  it.effect("an owner's paused (inactive) rows take none of its ownerActiveMax candidates", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["on"])
      // the swap of a reconciled owner takes its first active rows: the paused one, stored first, is none
      yield* registry.swapOwner(ALICE)
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["on"])
      expect((yield* registry.stats).rejected.owner).toBe(0)
    }).pipe(
      Effect.provide(
        seeded(
          [
            row(ALICE, "off", whRecordValue(`at://${BOB}`, { enabled: false }), false),
            row(ALICE, "on", whRecordValue(`at://${BOB}`))
          ],
          { REGISTRY_OWNER_ACTIVE_RECORDS_MAX: "1" }
        )
      )
    ))
})

describe("gone (410): RegistryStore.markGone; a gone registration stays in matching (SPEC §4.3)", () => {
  it.effect("only the registration the 410 answered (same fingerprint) is marked gone; it stays matched", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const a = registry.index.get(`${ALICE}/a`)
      const b = registry.index.get(`${ALICE}/b`)
      if (a === undefined || b === undefined) return expect.unreachable("both registrations loaded")
      // a 410 for an older version of b (its record changed since): b is not marked
      expect(yield* store.markGone(ALICE, "b", "an-older-fingerprint")).toBe(false)
      // a 410 for a as it is: marked gone in the store
      expect(yield* store.markGone(ALICE, "a", a.fingerprint)).toBe(true)
      expect((yield* store.ownerRows(ALICE)).filter((r) => r.gone).map((r) => r.rkey)).toEqual(["a"])
      // gone only affects delivery: a reload (and an owner sync) keeps a matching, so its new
      // matches are enqueued and parked by the worker until it is resumed
      yield* registry.reload
      expect(registry.index.get(`${ALICE}/a`)?.fingerprint).toBe(a.fingerprint)
      yield* registry.syncOwner(ALICE)
      expect([...registry.index.candidatesByScopeDid(BOB)].map((w) => w.rkey).sort()).toEqual(["a", "b"])
      const stats = yield* registry.stats
      expect(stats.active).toBe(2)
      expect(stats.notLoaded).toBe(0)
    }).pipe(
      Effect.provide(
        seeded([row(ALICE, "a", whRecordValue(`at://${BOB}`)), row(ALICE, "b", whRecordValue(`at://${BOB}`))])
      )
    ))
})

describe("admission refusals of an owner swap", () => {
  it.effect("are counted by the metric as by health", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      // the same name and description as the registry's counter: one series
      const metric = Metric.tagged(
        Metric.counter("firehook_registry_admission_rejected_total", {
          description: "Webhook records not activated because an admission limit was reached"
        }),
        "limit",
        "total"
      )
      const before = (yield* Metric.value(metric)).count
      const healthBefore = (yield* registry.stats).rejected.total ?? 0
      yield* store.upsert(row(ALICE, "a", whRecordValue(`at://${BOB}`)))
      yield* store.upsert(row(ALICE, "b", whRecordValue(`at://${BOB}`)))
      yield* registry.swapOwner(ALICE)
      expect(registry.index.byOwner(ALICE)).toHaveLength(1)
      expect(((yield* registry.stats).rejected.total ?? 0) - healthBefore).toBe(1)
      expect((yield* Metric.value(metric)).count - before).toBe(1)
    }).pipe(Effect.provide(seeded([], { REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }))))
})

describe("admission: the direct-DIDs limit is Jetstream's (SPEC §2.6)", () => {
  const rows = [plc(11), plc(12), plc(13)].map((scope, i) => row(ALICE, `r${i}`, whRecordValue(`at://${scope}`)))
  it.effect("on Jetstream, registrations beyond REGISTRY_DIRECT_SCOPE_DIDS_MAX distinct DIDs are not activated", () =>
    Effect.gen(function*() {
      const stats = yield* (yield* Registry).stats
      // owner + 2 scope DIDs = 3 distinct DIDs: the third scope would make 4
      expect(stats.active).toBe(2)
      expect(stats.rejected.direct_dids).toBe(0)
      expect(stats.notLoaded).toBe(1)
    }).pipe(Effect.provide(seeded(rows, { REGISTRY_DIRECT_SCOPE_DIDS_MAX: "3" }))))
  it.effect("on the relay firehose there is no wantedDids set: the limit does not apply", () =>
    Effect.gen(function*() {
      const stats = yield* (yield* Registry).stats
      expect(stats.active).toBe(3)
      expect(stats.notLoaded).toBe(0)
    }).pipe(Effect.provide(seeded(rows, { REGISTRY_DIRECT_SCOPE_DIDS_MAX: "3", FIREHOSE_SOURCE: "relay" }))))
})

describe("the owner's snapshot rev fences live writes (SPEC §3.4), memory store", () => {
  /** ALICE was reconciled at rev 100 (generation 3), or is being reconciled at that rev (`scanning`) */
  const fenced = (status: "complete" | "scanning" = "complete") => {
    const state = RegistryStore.emptyMemoryState()
    state.owners.set(ALICE, { did: ALICE, generation: 3, status, snapshotRev: rev(100) })
    const StoreLive = Layer.effect(
      RegistryStore.RegistryStore,
      Effect.map(Ref.make(state), RegistryStore.makeMemoryOver)
    )
    return RegistryMod.layer.pipe(
      Layer.provideMerge(StoreLive),
      Layer.provideMerge(Config.layerValue(testConfig()))
    )
  }

  it.effect("a write not newer than the snapshot rev changes nothing (store, generation, index); a newer one applies", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const hook = whRecordValue(`at://${BOB}`)
      const outcomes = yield* Effect.forEach([
        whEv(ALICE, "w", hook, { rev: rev(1) }),
        whEv(ALICE, "x", undefined, { operation: "delete", rev: rev(50) }),
        whEv(ALICE, "y", { $type: "place.wisp.v2.wh", url: 42 }, { rev: rev(60) }),
        whEv(ALICE, "z", hook, { rev: rev(100) })
      ], registry.applyWhEvent)
      expect(outcomes.map((o) => o._tag)).toEqual(["stale", "stale", "stale", "stale"])
      for (const rkey of ["w", "x", "y", "z"]) {
        expect(yield* store.get(ALICE, rkey)).toEqual({ row: undefined, tombstone: undefined })
      }
      expect((yield* store.owner(ALICE))?.generation).toBe(3)
      expect(registry.index.byOwner(ALICE)).toEqual([])
      // newer than the snapshot: applied
      expect((yield* registry.applyWhEvent(whEv(ALICE, "w", hook, { rev: rev(101) })))._tag).toBe("active")
      expect((yield* store.get(ALICE, "w")).row?.rev).toBe(rev(101))
      expect(yield* store.owner(ALICE)).toMatchObject({ generation: 4, snapshotRev: rev(100) })
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["w"])
      // an owner never scanned has no fence
      expect((yield* registry.applyWhEvent(whEv(BOB, "old", whRecordValue(`at://${ALICE}`), { rev: rev(1) })))._tag)
        .toBe("active")
    }).pipe(Effect.provide(fenced())))

  it.effect("while that snapshot is being taken, a fenced write is not stored but the index follows it until the swap", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      const rkeys = () => registry.index.byOwner(ALICE).map((w) => w.rkey).sort()
      const apply = (e: Parameters<typeof registry.applyWhEvent>[0]) =>
        Effect.map(registry.applyWhEvent(e), (o) => o._tag)
      const hook = whRecordValue(`at://${BOB}`)
      expect(yield* apply(whEv(ALICE, "w", hook, { rev: rev(10) }))).toBe("stale")
      expect(yield* apply(whEv(ALICE, "z", hook, { rev: rev(11) }))).toBe("stale")
      expect(rkeys()).toEqual(["w", "z"])
      expect(registry.index.byOwner(ALICE).find((w) => w.rkey === "w")?.url).toBe("https://receiver.example/hook")
      // an update follows; a pause, an invalid version and a delete drop the key
      yield* apply(whEv(ALICE, "w", whRecordValue(`at://${BOB}`, { url: "https://moved.example/h" }), { rev: rev(20) }))
      expect(registry.index.byOwner(ALICE).find((w) => w.rkey === "w")?.url).toBe("https://moved.example/h")
      yield* apply(whEv(ALICE, "w", whRecordValue(`at://${BOB}`, { enabled: false }), { rev: rev(30) }))
      expect(rkeys()).toEqual(["z"])
      yield* apply(whEv(ALICE, "w", hook, { rev: rev(40) }))
      yield* apply(whEv(ALICE, "w", { $type: "place.wisp.v2.wh", url: 42 }, { rev: rev(50) }))
      yield* apply(whEv(ALICE, "z", undefined, { operation: "delete", rev: rev(60) }))
      expect(rkeys()).toEqual([])
      yield* apply(whEv(ALICE, "y", hook, { rev: rev(70) }))
      expect(rkeys()).toEqual(["y"])
      // nothing stored, no generation bumped: the snapshot decides every key
      for (const rkey of ["w", "y", "z"]) {
        expect(yield* store.get(ALICE, rkey)).toEqual({ row: undefined, tombstone: undefined })
      }
      expect((yield* store.owner(ALICE))?.generation).toBe(3)
      // the scan's swap: the owner's registrations are the store's
      yield* registry.swapOwner(ALICE)
      expect(rkeys()).toEqual([])
    }).pipe(Effect.provide(fenced("scanning"))))

  it.effect("an invalid version newer than the snapshot revokes a key followed in memory only (SPEC §1)", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const rkeys = () => registry.index.byOwner(ALICE).map((w) => w.rkey).sort()
      expect((yield* registry.applyWhEvent(whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(10) })))._tag)
        .toBe("stale")
      expect(rkeys()).toEqual(["w"])
      // past the snapshot (rev 100): stored as a refusal, and the followed registration goes with it
      const outcome = yield* registry.applyWhEvent(
        whEv(ALICE, "w", { $type: "place.wisp.v2.wh", url: 42 }, { rev: rev(101) })
      )
      expect(outcome).toMatchObject({ _tag: "invalid", revoked: true })
      expect(rkeys()).toEqual([])
    }).pipe(Effect.provide(fenced("scanning"))))
})

describe("Registry.transactional: a failed unit undoes its index changes, latest first", () => {
  // the server's answer to a statement: rolled back for sure (no reload of the owners follows)
  const rolledBack = new StoreError({ op: "transaction", code: "23505" })
  const v1 = whRecordValue(`at://${BOB}`)
  const v2 = whRecordValue(`at://${BOB}/app.bsky.feed.post`)

  it.effect("a key written twice in the failed unit is left as it was before the unit", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const before = registry.index.get(`${ALICE}/a`)
      if (before === undefined) return expect.unreachable("a loaded")
      const failed = yield* Effect.either(registry.transactional(Effect.gen(function*() {
        // an update of a loaded key, then its delete; a new key, then its update
        expect((yield* registry.applyWhEvent(whEv(ALICE, "a", v2, { rev: rev(2) })))._tag).toBe("active")
        expect((yield* registry.applyWhEvent(whEv(ALICE, "a", undefined, { operation: "delete", rev: rev(3) })))._tag)
          .toBe("deleted")
        expect((yield* registry.applyWhEvent(whEv(ALICE, "n", v1, { rev: rev(2) })))._tag).toBe("active")
        expect((yield* registry.applyWhEvent(whEv(ALICE, "n", v2, { rev: rev(3) })))._tag).toBe("active")
        return yield* Effect.fail(rolledBack)
      })))
      expect(Either.isLeft(failed)).toBe(true)
      expect(registry.index.get(`${ALICE}/a`)).toEqual(before)
      expect(registry.index.get(`${ALICE}/n`)).toBeUndefined()
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["a"])
    }).pipe(Effect.provide(seeded([row(ALICE, "a", v1)]))))
})

describe("the stored row of a live write (SPEC §1: enabled defaults to true)", () => {
  it.effect("a record without `enabled` is stored enabled and active; `enabled: false` disabled and inactive", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      const store = yield* RegistryStore.RegistryStore
      expect((yield* registry.applyWhEvent(whEv(ALICE, "plain", whRecordValue(`at://${BOB}`), { rev: rev(2) })))._tag)
        .toBe("active")
      expect((yield* store.get(ALICE, "plain")).row).toMatchObject({ enabled: true, active: true })
      const paused = whRecordValue(`at://${BOB}`, { enabled: false })
      expect((yield* registry.applyWhEvent(whEv(ALICE, "paused", paused, { rev: rev(2) })))._tag).toBe("disabled")
      expect((yield* store.get(ALICE, "paused")).row).toMatchObject({ enabled: false, active: false })
    }).pipe(Effect.provide(seeded([]))))

  it.effect("pausing an active webhook (enabled: false) unregisters it at once", () =>
    Effect.gen(function*() {
      const registry = yield* Registry
      expect(registry.index.byOwner(ALICE).map((w) => w.rkey)).toEqual(["a"])
      const paused = whRecordValue(`at://${BOB}`, { enabled: false })
      expect((yield* registry.applyWhEvent(whEv(ALICE, "a", paused, { rev: rev(2) })))._tag).toBe("disabled")
      expect(registry.index.byOwner(ALICE)).toEqual([])
      expect([...registry.index.candidatesByScopeDid(BOB)]).toEqual([])
      // an invalid version of the paused webhook revokes no registration (there was none)
      const invalid = { $type: "place.wisp.v2.wh", url: 42 }
      expect(yield* registry.applyWhEvent(whEv(ALICE, "a", invalid, { rev: rev(3) }))).toMatchObject({
        _tag: "invalid",
        revoked: false
      })
    }).pipe(Effect.provide(seeded([row(ALICE, "a", whRecordValue(`at://${BOB}`))]))))
})
