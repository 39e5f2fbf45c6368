/**
 * RegistrySync on a real PostgreSQL database, where the catch-up horizon is held back and where a
 * completion is followed at once by the owner's next scan (SPEC §5.3 step 5, §6.4):
 * - a transaction left open anywhere in the cluster holds the horizon back: after one whole reload
 *   the rounds sync only what changed since (before: a whole reload every round until it ended);
 *   beyond what a round remembers, the reloads back off, and none of the changes is missed;
 * - an owner completed by another process whose next scan began before the leader synced it, and
 *   failed: the leader ends with the store's rows, not the registrations from before the first scan.
 * TestClock drives the rounds; another process's writes are plain SQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Fiber, Layer, Queue, TestClock, TestServices } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as Config from "../../src/services/platform/Config.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import { Registry, type RegistryShape, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryMod from "../../src/services/registry/Registry.js"
import * as RegistryChanges from "../../src/services/registry/RegistryChanges.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as RegistrySync from "../../src/services/registry/RegistrySync.js"
import * as Db from "../support/db.js"
import { plc, rev, testConfig, whRecordValue } from "../support/stack.js"

const [A, B, C] = [plc(1), plc(2), plc(3)]
/** owners changed one per round after the first */
const LATER = [plc(4), plc(5), plc(6), plc(7), plc(8)]

const row = (owner: string, rkey: string) => {
  const v = validateWhRecord(
    whRecordValue(`at://${owner}/app.bsky.feed.post`, { url: `https://${rkey}.example/hook` }),
    { allowInsecureDev: false }
  )
  if (Either.isLeft(v)) throw new Error(`invalid fixture: ${v.left}`)
  return toRow(owner, rkey, v.right.record, v.right.scope, rev(1), 1, undefined, true)
}

const TestLayer = RegistryMod.layer.pipe(
  Layer.provideMerge(RegistryChanges.layerSql),
  Layer.provideMerge(Layer.mergeAll(RegistryStore.layerSql, Tx.layerSql)),
  Layer.provideMerge(Layer.mergeAll(Db.layer(), Config.layerValue(testConfig())))
)

/** Seed one webhook per owner (`status` for some), load it, and follow from a horizon taken before. */
const setup = (
  owners: ReadonlyArray<string>,
  status: Record<string, string>,
  options: Partial<RegistrySync.FollowOptions> = {}
) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const store = yield* RegistryStore.RegistryStore
    const registry = yield* Registry
    const changes = yield* RegistryChanges.RegistryChanges
    yield* sql`TRUNCATE webhooks, owners, registry_changes, tombstones`
    for (const [did, s] of Object.entries(status)) {
      yield* sql`INSERT INTO owners (did, reconcile_status, completed_at) VALUES (${did}, ${s}, now())`
    }
    for (const did of owners) yield* store.upsert(row(did, "old"))
    const from = yield* changes.horizon
    yield* registry.reload
    let reloads = 0
    const synced = yield* Queue.unbounded<string>()
    const rounds = yield* Queue.unbounded<RegistrySync.RoundOutcome>()
    const follow = options
    const fiber = yield* Effect.fork(
      RegistrySync.follow({
        from,
        registry,
        reloadAll: Effect.zipRight(Effect.sync(() => reloads++), registry.reload),
        interval: "5 seconds",
        listen: false,
        onSynced: (trigger, did) => Queue.offer(synced, `${trigger}:${did ?? ""}`),
        onRound: (outcome) => Queue.offer(rounds, outcome),
        ...follow
      })
    )
    /** one round: the clock moves on to it, and it has ended (its outcome) */
    const next = Effect.zipRight(TestClock.adjust("5 seconds"), Queue.take(rounds))
    return { sql, store, registry, synced, next, fiber, reloads: () => reloads }
  })

/** Another process's change that a sync makes visible: the row is deactivated and marked gone (it notifies). */
const deactivate = (sql: SqlClient.SqlClient, did: string) =>
  sql`UPDATE webhooks SET active = false, gone_at = now() WHERE owner_did = ${did} AND rkey = 'old'`

/**
 * A session of another application, its transaction open with a transaction id: the horizon stays
 * at it. Returns once the horizon is that transaction's (an older one of another test file has
 * ended; polled every 20 ms of live time), so that it does not move before the commit.
 */
const holdHorizon = (sql: SqlClient.SqlClient) =>
  Effect.gen(function*() {
    const changes = yield* RegistryChanges.RegistryChanges
    const other = yield* sql.reserve
    yield* other.executeValues("BEGIN", [])
    const xid = String((yield* other.executeValues("SELECT pg_current_xact_id()::text", []))[0]?.[0])
    const held = yield* changes.horizon.pipe(
      Effect.map((h) => h === xid),
      Effect.tap((yes) => (yes ? Effect.void : Effect.sleep("20 millis"))),
      Effect.repeat({ until: (yes) => yes, times: 1_499 }),
      TestServices.provideLive,
      Effect.orDie
    )
    if (!held) return yield* Effect.dieMessage("the horizon never reached the held transaction")
    return other
  })

/** The syncs reported until `last` (at most `max`): a round's, when `last` is its final change. */
const takeUntil = (synced: Queue.Queue<string>, last: string, max = 4) =>
  Effect.gen(function*() {
    const seen: Array<string> = []
    for (let i = 0; i < max && seen[seen.length - 1] !== last; i++) seen.push(yield* Queue.take(synced))
    return seen
  })

const rkeys = (registry: RegistryShape, did: string) => registry.index.byOwner(did).map((w) => w.rkey).sort()

/**
 * Another process reconciles `did`: its scan stores "new", the completion deletes "old" and marks
 * it complete (the trigger records the change), and its next scan begins at once.
 */
const completeThenScanAgain = (sql: SqlClient.SqlClient, store: RegistryStore.RegistryStoreShape, did: string) =>
  Effect.gen(function*() {
    yield* sql`UPDATE owners SET reconcile_status = 'scanning' WHERE did = ${did}`
    yield* store.upsert(row(did, "new"))
    yield* sql`DELETE FROM webhooks WHERE owner_did = ${did} AND rkey = 'old'`
    yield* sql`UPDATE owners SET reconcile_status = 'complete', completed_at = now() WHERE did = ${did}`
    yield* sql`UPDATE owners SET reconcile_status = 'scanning' WHERE did = ${did}`
  })

describe("RegistrySync: a held horizon, a completion followed by a scan", () => {
  it.layer(TestLayer, { timeout: 60_000 })("on PostgreSQL", (it) => {
    it.effect("a held horizon: one whole reload, then only what changed since is synced, one by one", () =>
      Effect.gen(function*() {
        const { fiber, registry, reloads, sql, synced } = yield* setup([A, B, C, ...LATER], {}, {
          maxPerRound: 2
        })
        const other = yield* holdHorizon(sql)
        for (const did of [A, B, C]) yield* deactivate(sql, did)
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual("reload:")
        expect(rkeys(registry, A)).toEqual([])
        // every later round reads A, B, C again (the horizon has not moved): already in memory
        // (before: a whole reload in each of these rounds, until the transaction ended)
        for (const did of LATER.slice(0, 4)) {
          yield* deactivate(sql, did)
          yield* TestClock.adjust("5 seconds")
          expect(yield* Queue.take(synced)).toEqual(`catch_up:${did}`)
          expect(rkeys(registry, did)).toEqual([])
        }
        expect(reloads()).toBe(1)
        // the transaction ends: the horizon moves on, still no reload
        yield* other.executeValues("COMMIT", [])
        const last = LATER[4] ?? ""
        yield* deactivate(sql, last)
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(`catch_up:${last}`)
        expect(reloads()).toBe(1)
        expect(yield* Queue.size(synced)).toBe(0)
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.scoped))

    it.effect("more changes at a held horizon than a round remembers: reloads back off, no change is missed", () =>
      Effect.gen(function*() {
        const { fiber, next, registry, reloads, sql } = yield* setup([A, B, C, ...LATER], {}, {
          maxPerRound: 2,
          maxSeen: 2
        })
        const other = yield* holdHorizon(sql)
        for (const did of [A, B, C]) yield* deactivate(sql, did)
        const outcomes: Array<RegistrySync.RoundOutcome> = []
        outcomes.push(yield* next, yield* next)
        // a change after the first reload, while the reloads wait: the next one brings it
        const later = LATER[0] ?? ""
        yield* deactivate(sql, later)
        expect(rkeys(registry, later)).toEqual(["old"])
        outcomes.push(yield* next)
        expect(rkeys(registry, later)).toEqual([])
        for (let i = 0; i < 8; i++) outcomes.push(yield* next)
        // waits of 1, 2, 4 rounds (doubling up to OVERFLOW_WAIT_MAX) while the horizon stays
        expect(outcomes).toEqual([
          "reload",
          "wait",
          "reload",
          "wait",
          "wait",
          "reload",
          "wait",
          "wait",
          "wait",
          "wait",
          "reload"
        ])
        expect(reloads()).toBe(4)
        // the transaction ends: the waiting round finds the horizon moved and reloads at once (the
        // changes before it still cannot be told apart), then the rounds read again
        yield* other.executeValues("COMMIT", [])
        expect(yield* next).toBe("reload")
        const settled: Array<RegistrySync.RoundOutcome> = []
        for (let i = 0; i < 3; i++) settled.push(yield* next)
        expect(settled).toContain("read")
        yield* Fiber.interrupt(fiber)
      }).pipe(Effect.scoped))

    it.effect("completed, then scanning again before the sync, then failed: the store's rows are swapped in", () =>
      Effect.gen(function*() {
        const { fiber, next, registry, sql, store, synced } = yield* setup([A, B], {
          [A]: "complete",
          [B]: "complete"
        })
        expect(rkeys(registry, A)).toEqual(["old"])
        yield* completeThenScanAgain(sql, store, A)
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(`catch_up:${A}`)
        // scanning: its registrations stay as they were while the scan runs (SPEC §5.3 step 1)
        expect(rkeys(registry, A)).toEqual(["old"])
        // that scan fails (PDS down); B's change marks the end of the next round
        yield* sql`UPDATE owners SET reconcile_status = 'failed', failed_at = now() WHERE did = ${A}`
        yield* deactivate(sql, B)
        yield* TestClock.adjust("5 seconds")
        expect(yield* takeUntil(synced, `catch_up:${B}`)).toEqual([`after_scan:${A}`, `catch_up:${B}`])
        // the last completed set: what the store holds and a load would take
        const stored = (yield* store.ownerRows(A)).filter((r) => r.active).map((r) => r.rkey)
        expect(stored).toEqual(["new"])
        expect(rkeys(registry, A)).toEqual(["new"])
        // followed once: A is synced again only for a change of A
        yield* next
        yield* next
        expect(yield* Queue.size(synced)).toBe(0)
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("completed, then scanning again before the sync, then complete again: the new set is swapped in", () =>
      Effect.gen(function*() {
        const { fiber, registry, sql, store, synced } = yield* setup([A], { [A]: "complete" }, {})
        yield* completeThenScanAgain(sql, store, A)
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(`catch_up:${A}`)
        expect(rkeys(registry, A)).toEqual(["old"])
        yield* store.upsert(row(A, "newer"))
        yield* sql`UPDATE owners SET reconcile_status = 'complete', completed_at = now() WHERE did = ${A}`
        yield* TestClock.adjust("5 seconds")
        // the owner waiting for its scan's end, then the completion's own change
        expect(yield* takeUntil(synced, `catch_up:${A}`)).toEqual([`after_scan:${A}`, `catch_up:${A}`])
        expect(rkeys(registry, A)).toEqual(["new", "newer"])
        yield* Fiber.interrupt(fiber)
      }))

    it.effect("a failed owner with a gone mark keeps its registrations (only a change found while scanning waits)", () =>
      Effect.gen(function*() {
        const { fiber, next, registry, sql, store, synced } = yield* setup([A], { [A]: "failed" })
        // what the failed scan's pages left in the store is not swapped in for a gone mark
        yield* store.upsert(row(A, "page"))
        yield* sql`UPDATE webhooks SET gone_at = now() WHERE owner_did = ${A} AND rkey = 'old'`
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(`catch_up:${A}`)
        expect(rkeys(registry, A)).toEqual(["old"])
        yield* next
        expect(yield* Queue.size(synced)).toBe(0)
        expect(rkeys(registry, A)).toEqual(["old"])
        yield* Fiber.interrupt(fiber)
      }))

    // Defect B against the real registry: before, `Registry.syncOwner` answered nothing and skipped
    // a failed owner, so the completion stayed unapplied
    it.effect("the real registry: completed, scanning again, failed: the completed set", () =>
      Effect.gen(function*() {
        const { fiber, registry, sql, store, synced } = yield* setup([A, B], { [A]: "complete", [B]: "complete" })
        yield* completeThenScanAgain(sql, store, A)
        yield* TestClock.adjust("5 seconds")
        expect(yield* Queue.take(synced)).toEqual(`catch_up:${A}`)
        yield* sql`UPDATE owners SET reconcile_status = 'failed', failed_at = now() WHERE did = ${A}`
        yield* deactivate(sql, B)
        yield* TestClock.adjust("5 seconds")
        yield* takeUntil(synced, `catch_up:${B}`)
        yield* Fiber.interrupt(fiber)
        expect(rkeys(registry, A)).toEqual(["new"])
      }))
  })
})
