/**
 * A batch whose commit outcome is unknown to the client (SPEC §3.3, issue 14 item 13): the server
 * committed, then the call failed (the connection dropped before the answer). The in-memory
 * registry must end up as the database is, and so must the prior-reference key index, before the
 * next batch is processed. Stores on PostgreSQL whose transaction (or one-statement batch) commits
 * and then fails the call.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Deferred, Effect, Either, Fiber, FiberId, Layer } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../../src/services/matching/PriorRefsStore.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import { StoreError, Tx } from "../../src/services/platform/Persistence.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const bobPost = `at://${BOB}/${POST}/3kbobpost`
const likeOf = (uri: string) => ({ $type: LIKE, subject: { uri, cid: "bafyx" }, createdAt: "2026-01-01T00:00:00Z" })

/** how many of the next calls commit and then fail; reads of an owner's rows that fail */
interface Faults {
  transactions: number
  statements: number
  ownerReads: number
}

const lost = () => new StoreError({ op: "transaction", code: "08006" })

/** after the real call succeeded (committed), fail it while `faults[k]` > 0 */
const afterCommit = <A>(faults: Faults, k: "transactions" | "statements", a: A) =>
  Effect.suspend(() => {
    if (faults[k] <= 0) return Effect.succeed(a)
    faults[k]--
    return Effect.fail(lost())
  })

const stack = (faults: Faults) => {
  const tx = Layer.effect(
    Tx,
    Effect.map(Tx, (real) => ({
      withTransaction: <A, E, R>(eff: Effect.Effect<A, E, R>) =>
        real.withTransaction(eff).pipe(Effect.flatMap((a) => afterCommit(faults, "transactions", a)))
    }))
  ).pipe(Layer.provide(Tx.layerSql))
  const outbox = Layer.effect(
    Outbox.OutboxStore,
    Effect.map(Outbox.OutboxStore, (real): Outbox.OutboxStoreShape => {
      const commit = real.commitBatch
      if (commit === undefined) return real
      return { ...real, commitBatch: (c) => Effect.flatMap(commit(c), (r) => afterCommit(faults, "statements", r)) }
    })
  ).pipe(Layer.provide(Outbox.layerSql))
  const registryStore = Layer.effect(
    RegistryStore.RegistryStore,
    Effect.map(RegistryStore.RegistryStore, (real): RegistryStore.RegistryStoreShape => ({
      ...real,
      ownerRows: (did) =>
        Effect.suspend(() => {
          if (faults.ownerReads <= 0) return real.ownerRows(did)
          faults.ownerReads--
          return Effect.fail(new StoreError({ op: "registry.ownerRows", code: "08006" }))
        })
    }))
  ).pipe(Layer.provide(RegistryStore.layerSql))
  return Processor.layer().pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(registryStore, PriorRefsStore.layerSql, outbox, CursorStore.layerSql, tx)
    ),
    Layer.provideMerge(Layer.mergeAll(Db.layer(), Config.layerValue(testConfig())))
  )
}

const W = { registryWriter: true } satisfies Processor.ProcessOptions
const run = (batch: ReadonlyArray<StreamEvent>) => Effect.flatMap(Processor.Processor, (p) => p.processEvents(batch, W))

/** the in-memory registrations of an owner (rkeys, sorted) */
const inMemory = (owner: string) =>
  Effect.map(Registry.Registry, (r) => r.index.byOwner(owner).map((w) => w.rkey).sort())

/** the active stored registrations of an owner (rkeys, sorted) */
const inDatabase = (owner: string) =>
  Effect.flatMap(RegistryStore.RegistryStore, (s) => s.ownerRows(owner)).pipe(
    Effect.map((rows) => rows.filter((r) => r.active).map((r) => r.rkey).sort())
  )

/** outbox rows of a webhook for an event record (operations, in insertion order) */
const delivered = (owner: string, rkey: string, eventRkey: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<{ event_operation: string }>`
      SELECT event_operation FROM outbox
      WHERE owner_did = ${owner} AND webhook_rkey = ${rkey} AND event_rkey = ${eventRkey}
      ORDER BY created_at, event_operation`.pipe(Effect.orDie)).pipe(
      Effect.map((rows) => rows.map((r) => r.event_operation))
    )

describe("a commit whose outcome is unknown to the client", () => {
  it.effect("a registration committed before the call failed: in memory afterwards, and its events match", () => {
    const faults: Faults = { transactions: 0, statements: 0, ownerReads: 0 }
    return Effect.gen(function*() {
      const batch = [whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })]
      faults.transactions = 1
      expect(Either.isLeft(yield* Effect.either(run(batch)))).toBe(true)
      expect(yield* inDatabase(ALICE)).toEqual(["w"])
      expect(yield* inMemory(ALICE)).toEqual(["w"])
      // the stream retries the batch in place: the database calls it stale
      const again = yield* run(batch)
      expect(again.outcomes[0]).toMatchObject({ registry: { _tag: "stale" } })
      yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
      expect(yield* delivered(ALICE, "w", "p1")).toEqual(["create"])
    }).pipe(Effect.provide(stack(faults)))
  })

  it.effect("a deletion committed before the call failed: out of memory afterwards, its events no longer match", () => {
    const faults: Faults = { transactions: 0, statements: 0, ownerReads: 0 }
    return Effect.gen(function*() {
      yield* run([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      yield* run([whEv(ALICE, "v", whRecordValue(`at://${BOB}/${POST}`), { rev: rev(2) })])
      expect(yield* inMemory(ALICE)).toEqual(["v", "w"])
      faults.transactions = 1
      const del = [whEv(ALICE, "w", undefined, { rev: rev(3), operation: "delete" })]
      expect(Either.isLeft(yield* Effect.either(run(del)))).toBe(true)
      expect(yield* inDatabase(ALICE)).toEqual(["v"])
      expect(yield* inMemory(ALICE)).toEqual(["v"])
      yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
      expect(yield* delivered(ALICE, "w", "p1")).toEqual([])
      expect(yield* delivered(ALICE, "v", "p1")).toEqual(["create"])
    }).pipe(Effect.provide(stack(faults)))
  })

  it.effect("when the owners cannot be reloaded at once, they are before the next batch", () => {
    const faults: Faults = { transactions: 0, statements: 0, ownerReads: 0 }
    return Effect.gen(function*() {
      faults.transactions = 1
      faults.ownerReads = 1
      const batch = [whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })]
      expect(Either.isLeft(yield* Effect.either(run(batch)))).toBe(true)
      expect(faults.ownerReads).toBe(0)
      // the next batch (another stream's: no registry write) is matched against the reloaded owner
      yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
      expect(yield* inMemory(ALICE)).toEqual(["w"])
      expect(yield* delivered(ALICE, "w", "p1")).toEqual(["create"])
    }).pipe(Effect.provide(stack(faults)))
  })

  it.effect("when the owners cannot be reloaded at once, they are before the next batches written together", () => {
    const faults: Faults = { transactions: 0, statements: 0, ownerReads: 0 }
    return Effect.gen(function*() {
      const processor = yield* Processor.Processor
      faults.transactions = 1
      faults.ownerReads = 1
      // the registration commits, then its call fails; its finalize holds it until the two
      // one-statement batches below are queued behind it (so they are written together)
      const gate = yield* Deferred.make<void>()
      const registration = yield* Effect.fork(
        Effect.either(
          processor.processEvents([whEv(ALICE, "w", whRecordValue(`at://${BOB}`), { rev: rev(1) })], {
            registryWriter: true,
            finalize: Deferred.await(gate)
          })
        )
      )
      yield* Effect.yieldNow()
      const at = (stream: string, cursor: bigint): Processor.ProcessOptions => ({
        registryWriter: false,
        cursor: { stream, relay: "wss://relay.test", cursor }
      })
      const a = yield* Effect.fork(processor.processEvents([ev(BOB, POST, "g1", { rev: rev(10) })], at("direct", 10n)))
      const b = yield* Effect.fork(
        processor.processEvents([ev(BOB, POST, "g2", { rev: rev(11) })], at("backlink", 11n))
      )
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      expect(Either.isLeft(yield* Fiber.join(registration))).toBe(true)
      expect(faults.ownerReads).toBe(0)
      // both are matched against the reloaded owner
      expect((yield* Fiber.join(a)).outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
      expect((yield* Fiber.join(b)).outcomes[0]).toMatchObject({ _tag: "enqueued", deliveries: 1 })
      expect(yield* inMemory(ALICE)).toEqual(["w"])
      expect(yield* delivered(ALICE, "w", "g1")).toEqual(["create"])
      expect(yield* delivered(ALICE, "w", "g2")).toEqual(["create"])
    }).pipe(Effect.provide(stack(faults)))
  })

  it.effect("prior references written before the call failed: the record's update and delete still reach the backlink hook", () => {
    const faults: Faults = { transactions: 0, statements: 0, ownerReads: 0 }
    return Effect.gen(function*() {
      yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
      const like = [ev(ALICE, LIKE, "l1", { rev: rev(10), record: likeOf(bobPost) })]
      // one statement (no registry write): it commits, then the call fails; the stream retries it
      faults.statements = 1
      expect(Either.isLeft(yield* Effect.either(run(like)))).toBe(true)
      const again = yield* run(like)
      expect(again.duplicates).toBe(1)
      yield* run([ev(ALICE, LIKE, "l1", { rev: rev(11), operation: "update", record: { $type: LIKE, text: "x" } })])
      expect(yield* delivered(BOB, "bl", "l1")).toEqual(["create", "update"])
      const post = [ev(ALICE, POST, "p2", { rev: rev(20), record: { $type: POST, text: bobPost } })]
      faults.statements = 1
      expect(Either.isLeft(yield* Effect.either(run(post)))).toBe(true)
      yield* run(post)
      yield* run([ev(ALICE, POST, "p2", { rev: rev(21), operation: "delete" })])
      expect(yield* delivered(BOB, "bl", "p2")).toEqual(["create", "delete"])
    }).pipe(Effect.provide(stack(faults)))
  })

  it.effect("prior references written by a transaction before the call failed: the record's update still reaches the backlink hook", () => {
    const faults: Faults = { transactions: 0, statements: 0, ownerReads: 0 }
    // a finalize without cursor data: the batch runs in a transaction (separate statements)
    const inTransaction = { registryWriter: false, finalize: Effect.void } satisfies Processor.ProcessOptions
    const runTx = (batch: ReadonlyArray<StreamEvent>) =>
      Effect.flatMap(Processor.Processor, (p) => p.processEvents(batch, inTransaction))
    return Effect.gen(function*() {
      yield* run([whEv(BOB, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })])
      const like = [ev(ALICE, LIKE, "l3", { rev: rev(30), record: likeOf(bobPost) })]
      faults.transactions = 1
      expect(Either.isLeft(yield* Effect.either(runTx(like)))).toBe(true)
      const again = yield* runTx(like)
      expect(again.duplicates).toBe(1)
      yield* runTx([ev(ALICE, LIKE, "l3", { rev: rev(31), operation: "update", record: { $type: LIKE, text: "x" } })])
      expect(yield* delivered(BOB, "bl", "l3")).toEqual(["create", "update"])
    }).pipe(Effect.provide(stack(faults)))
  })
})

describe("mayHaveCommitted", () => {
  const fail = (code: string) => Cause.fail(new StoreError({ op: "transaction", code }))
  it("the server's answer to a statement means rolled back; anything else may hide a commit", () => {
    // the server answered: the transaction was rolled back
    for (const code of ["22003", "23505", "40001", "40P01", "42P01", "53300"]) {
      expect(Registry.mayHaveCommitted(fail(code))).toBe(false)
    }
    // a lost connection, a server going away, a timeout, a local error: unknown
    for (const code of ["08006", "08003", "57P01", "57014", "58030", "XX000", "EPIPE", "ECONNRESET", "timeout"]) {
      expect(Registry.mayHaveCommitted(fail(code))).toBe(true)
    }
    expect(Registry.mayHaveCommitted(Cause.interrupt(FiberId.none))).toBe(true)
    expect(Registry.mayHaveCommitted(Cause.die("a bug"))).toBe(true)
  })
})
