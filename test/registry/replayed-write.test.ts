/**
 * A replayed wh event whose write another process already committed (SPEC §6.4 failover: the old
 * intake leader commits a batch after the new one took the lock and loaded its registry; the new
 * leader then replays the same events from its cursor), on a real PostgreSQL database. Two
 * registries share the database: `other` (the old leader) applies and commits the events, then
 * `self` (the new leader, loaded before) is fed the same events. The write is not repeated (stale,
 * nothing stored changes), but the index of `self` takes the stored state of the key: registered
 * for an active row, unregistered for a tombstone or a disabled row. A strictly older replay
 * changes nothing, in the store or in memory.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import * as Config from "../../src/services/platform/Config.js"
import { StoreError, Tx } from "../../src/services/platform/Persistence.js"
import * as RegistryMod from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)

const Base = Layer.mergeAll(RegistryStore.layerSql, Tx.layerSql).pipe(
  Layer.provideMerge(Layer.mergeAll(Db.layer(), Config.layerValue(testConfig())))
)

const create = (rkey: string, n: number, o: { readonly url?: string; readonly enabled?: boolean } = {}) =>
  whEv(ALICE, rkey, whRecordValue(`at://${BOB}`, o), { rev: rev(n) })
const update = (rkey: string, n: number, o: { readonly url?: string; readonly enabled?: boolean } = {}) =>
  whEv(ALICE, rkey, whRecordValue(`at://${BOB}`, o), { rev: rev(n), operation: "update" })
const del = (rkey: string, n: number) => whEv(ALICE, rkey, undefined, { rev: rev(n), operation: "delete" })

/** Two registries on one database, both loaded from the same (empty) state. */
const setup = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const tx = yield* Tx
  yield* sql`TRUNCATE webhooks, owners, tombstones`
  const other = yield* RegistryMod.make
  const self = yield* RegistryMod.make
  yield* other.load
  yield* self.load
  /** one intake batch: a transaction, the registry's unit of work */
  const batch = (registry: RegistryMod.RegistryShape, events: ReadonlyArray<RecordEvent>) =>
    tx.withTransaction(registry.transactional(Effect.forEach(events, registry.applyWhEvent)))
  const stored = Effect.map(
    sql<{ rkey: string; rev: string; url: string; active: boolean; generation: string }>`
      SELECT rkey, rev, url, active, generation::text FROM webhooks ORDER BY rkey`,
    (rows) => rows.map((r) => ({ ...r }))
  )
  const generation = Effect.map(
    sql<{ generation: string }>`SELECT generation::text FROM owners WHERE did = ${ALICE}`,
    (rows) => rows[0]?.generation
  )
  return { other, self, batch, stored, generation }
})

const indexed = (registry: RegistryMod.RegistryShape) =>
  registry.index.byOwner(ALICE).map((w) => `${w.rkey}@${w.rev}:${w.url}`).sort()

describe("a replayed event already committed by another process: the index follows the stored state", () => {
  it.effect("create committed elsewhere: registered (nothing written again); strictly older replays change nothing", () =>
    Effect.gen(function*() {
      const { batch, generation, other, self, stored } = yield* setup
      yield* batch(other, [create("a", 2)])
      const before = { rows: yield* stored, generation: yield* generation }
      expect(indexed(self)).toEqual([])
      const outcomes = yield* batch(self, [create("a", 2)])
      expect(outcomes.map((o) => o._tag)).toEqual(["stale"])
      expect(indexed(self)).toEqual([`a@${rev(2)}:https://receiver.example/hook`])
      expect(indexed(self)).toEqual(indexed(other))
      // nothing stored changed (no generation bump for a write that is not repeated)
      expect({ rows: yield* stored, generation: yield* generation }).toEqual(before)
      expect((yield* self.stats).active).toBe(1)

      // an update committed elsewhere; replaying the older create first changes nothing
      yield* batch(other, [update("a", 3, { url: "https://new.example/hook" })])
      expect((yield* batch(self, [create("a", 2)])).map((o) => o._tag)).toEqual(["stale"])
      expect(indexed(self)).toEqual([`a@${rev(2)}:https://receiver.example/hook`])
      yield* batch(self, [update("a", 3, { url: "https://new.example/hook" })])
      expect(indexed(self)).toEqual([`a@${rev(3)}:https://new.example/hook`])
    }).pipe(Effect.provide(Base)))

  it.effect("delete or disable committed elsewhere: unregistered", () =>
    Effect.gen(function*() {
      const { batch, other, self } = yield* setup
      yield* batch(self, [create("a", 2), create("b", 2)])
      yield* other.reload
      expect(indexed(self)).toHaveLength(2)
      expect(indexed(other)).toHaveLength(2)
      yield* batch(other, [del("a", 3), update("b", 3, { enabled: false })])
      expect(indexed(other)).toEqual([])
      // the same batch replayed: both fenced (stale), both unregistered
      expect((yield* batch(self, [del("a", 3), update("b", 3, { enabled: false })])).map((o) => o._tag))
        .toEqual(["stale", "stale"])
      expect(indexed(self)).toEqual([])
      expect((yield* self.stats).active).toBe(0)
    }).pipe(Effect.provide(Base)))

  it.effect("one replayed batch is settled event by event: the older version stays stale, the stored one wins", () =>
    Effect.gen(function*() {
      const { batch, other, self } = yield* setup
      // the old leader committed a create and then a delete of the same key
      yield* batch(other, [create("a", 2), del("a", 3), create("b", 2), create("c", 2)])
      // the new leader replays them in one batch, with a new event of its own for b
      const outcomes = yield* batch(self, [
        create("a", 2),
        del("a", 3),
        create("b", 2),
        update("b", 4, { url: "https://b4.example/hook" }),
        create("c", 2)
      ])
      expect(outcomes.map((o) => o._tag)).toEqual(["stale", "stale", "stale", "active", "stale"])
      expect(indexed(self)).toEqual([
        `b@${rev(4)}:https://b4.example/hook`,
        `c@${rev(2)}:https://receiver.example/hook`
      ])
    }).pipe(Effect.provide(Base)))

  it.effect("admission as for a load: a row committed elsewhere over this process's limit is not registered", () =>
    Effect.gen(function*() {
      const { batch, other } = yield* setup
      const self = yield* RegistryMod.make.pipe(
        Effect.provideService(Config.FirehookConfig, testConfig({ REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }))
      )
      yield* batch(self, [create("a", 2)])
      yield* batch(other, [create("b", 2)])
      expect((yield* batch(self, [create("b", 2)])).map((o) => o._tag)).toEqual(["stale"])
      expect(indexed(self)).toEqual([`a@${rev(2)}:https://receiver.example/hook`])
      // the row stays stored and active, as the other process admitted it
      const rows = yield* (yield* RegistryStore.RegistryStore).ownerRows(ALICE)
      expect(rows.map((r) => [r.rkey, r.active])).toEqual([["a", true], ["b", true]])
    }).pipe(Effect.provide(Base)))

  it.effect("admission as for a load: a replayed update over this process's limit unregisters the older version", () =>
    Effect.gen(function*() {
      const { batch, other } = yield* setup
      // Jetstream's wantedDids: ALICE and BOB fill this process's set of 2
      const self = yield* RegistryMod.make.pipe(
        Effect.provideService(Config.FirehookConfig, testConfig({ REGISTRY_DIRECT_SCOPE_DIDS_MAX: "2" }))
      )
      yield* batch(self, [create("a", 2), create("c", 2)])
      // the other process moves a's scope to a third DID (its index has room)
      const moved = whEv(ALICE, "a", whRecordValue(`at://${plc(3)}`), { rev: rev(3), operation: "update" })
      expect((yield* batch(other, [moved])).map((o) => o._tag)).toEqual(["active"])
      // replayed here: the stored version would exceed this process's set; the older one must not stay
      expect((yield* batch(self, [moved])).map((o) => o._tag)).toEqual(["stale"])
      expect(indexed(self)).toEqual([`c@${rev(2)}:https://receiver.example/hook`])
    }).pipe(Effect.provide(Base)))

  it.effect("a batch that fails after settling undoes the index change (memory never runs ahead of the database)", () =>
    Effect.gen(function*() {
      const { other, self } = yield* setup
      const tx = yield* Tx
      yield* tx.withTransaction(other.transactional(other.applyWhEvent(create("a", 2))))
      // the server refused a later statement of the batch: rolled back, the settle is undone
      const failed = yield* Effect.either(
        tx.withTransaction(
          self.transactional(
            Effect.zipRight(
              self.applyWhEvent(create("a", 2)),
              Effect.fail(new StoreError({ op: "test", code: "23505" }))
            )
          )
        )
      )
      expect(failed._tag).toBe("Left")
      expect(indexed(self)).toEqual([])
      // replayed again, in a batch that commits
      yield* tx.withTransaction(self.transactional(self.applyWhEvent(create("a", 2))))
      expect(indexed(self)).toEqual([`a@${rev(2)}:https://receiver.example/hook`])
    }).pipe(Effect.provide(Base)))
})
