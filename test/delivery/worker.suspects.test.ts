/**
 * The poison-row guard (Suspects.ts) on real PostgreSQL: a row claimed from an expired lease is a
 * suspect; the claim says so and keeps its crash count (a row claimed from `pending` starts at 0);
 * `markSuspect` counts under the lease token only; the worker attempts a first reclaim's suspects at
 * full concurrency and those counted before one at a time while fresh rows keep their concurrency
 * (the claim takes at most `reclaimRoom` of the latter), counts each first, and dead-letters one over
 * the limit
 * (`crashed`) without a request; a replay sends it again. The whole cycle with workers that die
 * mid-request: worker.reclaim.test.ts.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import { CRASH_LIMIT, SUSPECTS_HELD } from "../../src/services/delivery/Suspects.js"
import * as Operator from "../../src/services/operator/Operator.js"
import * as Metrics from "../../src/services/platform/Metrics.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, receiver, recordingPublisher, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1", DELIVERY_RETRY_BASE_MS: "100" }
const DEAD = "host:9:dead-worker"

/** A test on a fresh stack with a delivery store of its own (the "dead worker's", or the store under test). */
const onStack = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  eff.pipe(
    Effect.scoped,
    Effect.provide(Operator.layer),
    Effect.provide(Layer.provideMerge(deliveryStoreSql, sqlStack({ env: ENV })))
  )

interface GuardRow {
  readonly delivery_id: string
  readonly event_rkey: string
  readonly status: string
  readonly attempt_count: number
  readonly crash_count: number
  readonly last_error_kind: string | null
  readonly last_http_status: number | null
}

const guardRows = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<GuardRow>`
    SELECT delivery_id, event_rkey, status, attempt_count, crash_count, last_error_kind, last_http_status
    FROM outbox ORDER BY event_rkey`).pipe(Effect.orDie)

/** The oldest `n` pending rows as a dead worker leaves them: leased by it, the lease expired. */
const leftByDeadWorker = (n: number) =>
  Effect.gen(function*() {
    const store = yield* DeliveryStore
    const claimed = yield* store.claim(DEAD, n, 60_000)
    const sql = yield* SqlClient.SqlClient
    yield* sql`UPDATE outbox SET leased_until = now() - interval '1 second' WHERE lease_token LIKE ${DEAD + ":%"}`
    return claimed.rows.map((r) => r.deliveryId)
  })

/**
 * A receiver answering 200 after `delayMs` that records, per kind of request (`kindOf` its delivery
 * id; undefined: not counted), the most in flight at once.
 */
const countingReceiver = <K extends string>(delayMs: number, kindOf: (deliveryId: string) => K | undefined) =>
  Effect.gen(function*() {
    const now = new Map<K, number>()
    const most = new Map<K, number>()
    const rx = yield* receiver({
      reply: (_, req) => {
        const kind = kindOf(String(req.headers["idempotency-key"]))
        if (kind !== undefined) {
          const n = (now.get(kind) ?? 0) + 1
          now.set(kind, n)
          most.set(kind, Math.max(most.get(kind) ?? 0, n))
          // registered before the receiver's own answer timer of the same delay: runs first
          setTimeout(() => now.set(kind, (now.get(kind) ?? 1) - 1), delayMs)
        }
        return { status: 200, delayMs }
      }
    })
    return { rx, max: (kind: K): number => most.get(kind) ?? 0 }
  })

describe("crash suspects", () => {
  it.scopedLive(
    "the claim marks rows taken from an expired lease and keeps their count; from pending it resets it; markSuspect counts under the lease token only",
    () =>
      Effect.gen(function*() {
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: "https://a.example/hook" }), { rev: rev(1) })])
        yield* run(Array.from({ length: 4 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const store = yield* DeliveryStore
        const sql = yield* SqlClient.SqlClient
        const first = (yield* store.claim("w1", 2, 60_000)).rows
        expect(first.map((r) => [r.reclaimed, r.crashCount])).toEqual([[false, 0], [false, 0]])
        const [a, b] = first
        if (a === undefined || b === undefined) return
        // both were suspects before (counted once); A's holder dies, B is handed back (pending)
        yield* sql`UPDATE outbox SET crash_count = 1 WHERE delivery_id IN (${a.deliveryId}, ${b.deliveryId})`
        yield* sql`UPDATE outbox SET leased_until = now() - interval '1 second' WHERE delivery_id = ${a.deliveryId}`
        expect(yield* store.defer(b.deliveryId, b.leaseToken, 0)).toBe(true)

        // at most reclaimRoom expired-lease rows per claim; pending rows are not limited by it
        const none = (yield* store.claim("w2", 10, 60_000, { reclaimRoom: 0 })).rows
        expect(none.length).toBe(3)
        expect(none.every((r) => !r.reclaimed && r.crashCount === 0)).toBe(true)
        expect(none.some((r) => r.deliveryId === b.deliveryId)).toBe(true)
        expect(none.some((r) => r.deliveryId === a.deliveryId)).toBe(false)
        // this worker's own expired lease (its settle failed, it stalled) is no death: not a suspect
        yield* sql`UPDATE outbox SET leased_until = now() - interval '1 second' WHERE lease_token LIKE ${"w2:%"}`
        const again = (yield* store.claim("w2", 10, 60_000, { reclaimRoom: 10 })).rows
        expect(again.filter((r) => r.deliveryId !== a.deliveryId).map((r) => r.reclaimed)).toEqual([
          false,
          false,
          false
        ])
        // put A back as the dead worker left it
        yield* sql`UPDATE outbox SET lease_token = ${DEAD + ":x"}, leased_until = now() - interval '1 second'
          WHERE delivery_id = ${a.deliveryId}`
        const [taken] = (yield* store.claim("w3", 10, 60_000, { reclaimRoom: 1 })).rows
        expect(taken).toMatchObject({ deliveryId: a.deliveryId, reclaimed: true, crashCount: 1 })
        if (taken === undefined) return
        // B, claimed from pending, starts clean in the table too
        expect((yield* guardRows).find((r) => r.delivery_id === b.deliveryId)?.crash_count).toBe(0)

        // counted only under the current lease token
        expect(yield* store.markSuspect(a.deliveryId, a.leaseToken)).toBeUndefined()
        expect(yield* store.markSuspect(a.deliveryId, "w3:not-mine")).toBeUndefined()
        expect(yield* store.markSuspect(a.deliveryId, taken.leaseToken)).toBe(2)
        expect(yield* store.markSuspect(b.deliveryId, taken.leaseToken)).toBeUndefined()
        expect((yield* guardRows).find((r) => r.delivery_id === a.deliveryId)?.crash_count).toBe(2)
      }).pipe(onStack),
    60_000
  )

  it.scopedLive(
    "the reclaim room limits only rows counted before as suspects; a first reclaim is taken whole",
    () =>
      Effect.gen(function*() {
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: "https://a.example/hook" }), { rev: rev(1) })])
        yield* run(Array.from({ length: 4 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const ids = yield* leftByDeadWorker(4)
        const [c1, c2, f1, f2] = ids
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE outbox SET crash_count = 1 WHERE delivery_id IN (${c1 ?? ""}, ${c2 ?? ""})`
        const taken = (yield* (yield* DeliveryStore).claim("w2", 10, 60_000, { reclaimRoom: 1 })).rows
        expect(taken.every((r) => r.reclaimed)).toBe(true)
        expect(taken.filter((r) => r.crashCount === 1).length).toBe(1)
        expect(taken.filter((r) => r.crashCount === 0).map((r) => r.deliveryId).sort()).toEqual([f1, f2].sort())
      }).pipe(onStack),
    60_000
  )

  it.scopedLive(
    "a first reclaim's suspects run at full concurrency, each counted once before its request, then delivered",
    () =>
      Effect.gen(function*() {
        const suspects = new Set<string>()
        const { max, rx } = yield* countingReceiver(300, (id) => suspects.has(id) ? "suspect" : undefined)
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        const n = SUSPECTS_HELD + 2
        yield* run(Array.from({ length: n }, (_, i) => ev(BOB, POST, `s${i}`, { rev: rev(10 + i) })))
        for (const id of yield* leftByDeadWorker(n)) suspects.add(id)

        yield* startWorker({ options: { pollIntervalMs: 50 } })
        const rows = yield* eventually(
          "all delivered",
          guardRows,
          (rs) => rs.length === n && rs.every((r) => r.status === "delivered"),
          30_000
        )
        // several at once (up to the origin's cap of 4), not one at a time
        expect(max("suspect")).toBeGreaterThan(1)
        expect(rx.received.length).toBe(n)
        expect(rows.map((r) => [r.crash_count, r.attempt_count])).toEqual(Array.from({ length: n }, () => [1, 1]))
      }).pipe(onStack),
    60_000
  )

  it.scopedLive(
    "suspects counted before are attempted one at a time (counted once more each, then delivered) while fresh rows run concurrently",
    () =>
      Effect.gen(function*() {
        const suspects = new Set<string>()
        const { max, rx } = yield* countingReceiver(150, (id) => suspects.has(id) ? "suspects" : "fresh")
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        const n = SUSPECTS_HELD + 2
        yield* run(Array.from({ length: n }, (_, i) => ev(BOB, POST, `s${i}`, { rev: rev(10 + i) })))
        for (const id of yield* leftByDeadWorker(n)) suspects.add(id)
        expect(suspects.size).toBe(n)
        // each was in flight in a death after its first reclaim already
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE outbox SET crash_count = 1 WHERE status = 'leased'`
        yield* run(Array.from({ length: n }, (_, i) => ev(BOB, POST, `t${i}`, { rev: rev(100 + i) })))

        yield* startWorker({ options: { pollIntervalMs: 50 } })
        const rows = yield* eventually(
          "all delivered",
          guardRows,
          (rs) => rs.length === 2 * n && rs.every((r) => r.status === "delivered"),
          30_000
        )
        expect(max("suspects")).toBe(1)
        expect(max("fresh")).toBeGreaterThan(1)
        // each attempted once; the suspects counted once more each (then cleared by their outcome)
        expect(rx.received.length).toBe(2 * n)
        expect(rows.filter((r) => suspects.has(r.delivery_id)).map((r) => r.crash_count)).toEqual(
          Array.from({ length: n }, () => 2)
        )
        expect(rows.filter((r) => !suspects.has(r.delivery_id)).every((r) => r.crash_count === 0)).toBe(true)
        expect(rows.every((r) => r.attempt_count === 1)).toBe(true)
      }).pipe(onStack),
    60_000
  )

  it.scopedLive(
    "a suspect over the crash limit is dead-lettered `crashed` without a request or an attempt (audit, tail, metric); a replay delivers it",
    () =>
      Effect.gen(function*() {
        const rx = yield* receiver()
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        yield* run([ev(BOB, POST, "poison", { rev: rev(10) })])
        const [id] = yield* leftByDeadWorker(1)
        const sql = yield* SqlClient.SqlClient
        // attempted as a suspect CRASH_LIMIT times already, once answered 503 before that
        yield* sql`UPDATE outbox SET crash_count = ${CRASH_LIMIT}, attempt_count = 1, last_error_kind = 'http_5xx',
          last_http_status = 503 WHERE delivery_id = ${id ?? ""}`
        const publisher = recordingPublisher()
        yield* startWorker({ options: { pollIntervalMs: 50 }, publisher: publisher.layer })

        const [row] = yield* eventually("dead-lettered", guardRows, (rs) => rs[0]?.status === "dead_letter", 20_000)
        expect(row).toMatchObject({
          delivery_id: id,
          last_error_kind: "crashed",
          last_http_status: null,
          attempt_count: 1,
          crash_count: CRASH_LIMIT + 1
        })
        expect(rx.received.length).toBe(0)
        expect(yield* countWhere("delivery_attempts", "true")).toBe(0)
        const audit = yield* sql<{ status: string; error_kind: string; http_status: number | null; url: string }>`
          SELECT status, error_kind, http_status, url FROM audit`
        expect(audit).toEqual([{ status: "dead_letter", error_kind: "crashed", http_status: null, url: "[redacted]" }])
        expect(publisher.events.map((e) => [e.deliveryId, e.status, e.errorKind, e.httpStatus])).toEqual([
          [id, "dead_letter", "crashed", null]
        ])
        expect(yield* Metrics.exposition).toMatch(/firehook_delivery_not_attempted_total\{reason="crashed"\} [1-9]/)

        // replayed: a fresh start (claimed from pending, count 0), and delivered
        const op = yield* Operator.Operator
        expect((yield* op.replayDeadLetters({ owner: OWNER, webhook: "w" })).replayed).toBe(1)
        const [after] = yield* eventually("replay delivered", guardRows, (rs) => rs[0]?.status === "delivered", 20_000)
        expect(after).toMatchObject({ crash_count: 0, attempt_count: 1, last_http_status: 200 })
        expect(rx.hits.get(id ?? "")).toBe(1)
      }).pipe(onStack),
    60_000
  )
})
