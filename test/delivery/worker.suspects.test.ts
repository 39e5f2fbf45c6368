/**
 * The poison-row guard's store side on real PostgreSQL: a row claimed from an expired lease is a
 * suspect; the claim says so and keeps its crash count (a row claimed from `pending` starts at 0);
 * `markSuspect` counts under the lease token only.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { run } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1", DELIVERY_RETRY_BASE_MS: "100" }

/** A test on a fresh stack with a delivery store of its own (the "dead worker's", or the store under test). */
const onStack = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  eff.pipe(
    Effect.scoped,
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
})
