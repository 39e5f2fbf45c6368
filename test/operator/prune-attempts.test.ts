/**
 * Maintenance's bounds on the attempts of kept outbox rows (PruneAttempts.ts) on real PostgreSQL:
 * a delivery keeps its newest 100 attempts, and attempts older than the longest outbox retention
 * go except their delivery's newest, whether or not the row is alive; recent attempts and those of
 * other rows stay, and a pruned row's attempts still go with it.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as PruneAttempts from "../../src/services/operator/PruneAttempts.js"
import * as Db from "../support/db.js"

const reset = Effect.flatMap(SqlClient.SqlClient, (sql) => sql`TRUNCATE outbox, delivery_attempts, delivery_events`)

/** An outbox row; `finishedDays` ago for terminal rows (null: pending). */
const outbox = (id: string, status: string, finishedDays: number | null) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                          event_rkey, event_operation, target_url, signing_mode, fingerprint, status, created_at,
                          finished_at)
      VALUES (${id}, ${"ev-" + id}, 'did:plc:owner', 'w1', 'direct', 'did:plc:subject', 'app.bsky.feed.post', 'p1',
              'create', 'https://receiver.invalid/hook', 'none', 'fp', ${status}, now() - interval '60 days',
              CASE WHEN ${finishedDays}::int IS NULL THEN NULL
                   ELSE now() - make_interval(days => ${finishedDays}::int) END)`)

/** Attempts `from`..`to` of a delivery, `days` ago, one second apart in attempt order. */
const attempts = (deliveryId: string, from: number, to: number, days: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
      INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, response_excerpt)
      SELECT ${deliveryId}, g, now() - make_interval(days => ${days}) + make_interval(secs => g), 12, 'failed',
             repeat('x', 1024)
      FROM generate_series(${from}::int, ${to}::int) AS g`)

/** A delivery's attempt numbers: [count, lowest, highest]. */
const numbers = (deliveryId: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ n: number; lo: number | null; hi: number | null }>`
        SELECT count(*)::int AS n, min(attempt) AS lo, max(attempt) AS hi
        FROM delivery_attempts WHERE delivery_id = ${deliveryId}`,
      (rows) => [rows[0]?.n ?? 0, rows[0]?.lo ?? null, rows[0]?.hi ?? null]
    ))

describe("Maintenance: attempts of kept rows", () => {
  it.layer(Db.layer())("on PostgreSQL", (it) => {
    it.effect("a living row with 150 attempts keeps its newest 100 after one run; other rows' attempts stay", () =>
      Effect.gen(function*() {
        yield* reset
        expect(PruneAttempts.EXCESS_ATTEMPTS_KEPT).toBe(100)
        // redelivered over and over: pending again, 150 attempts over the last day
        yield* outbox("hot", "pending", null)
        yield* attempts("hot", 1, 150, 1)
        // numbered on past pruned attempts: 201..330 (130 of them)
        yield* outbox("renumbered", "delivered", 1)
        yield* attempts("renumbered", 201, 330, 2)
        yield* outbox("full", "pending", null)
        yield* attempts("full", 1, 100, 1)
        yield* outbox("few", "delivered", 2)
        yield* attempts("few", 1, 5, 2)
        // an orphan's recent attempts go by the same bound
        yield* attempts("ghost", 1, 120, 1)
        const counts = yield* Maintenance.runOnce()
        expect(counts.delivery_attempts).toBe(50 + 30 + 20)
        expect(counts.outbox).toBe(0)
        expect(yield* numbers("hot")).toEqual([100, 51, 150])
        expect(yield* numbers("renumbered")).toEqual([100, 231, 330])
        expect(yield* numbers("full")).toEqual([100, 1, 100])
        expect(yield* numbers("few")).toEqual([5, 1, 5])
        expect(yield* numbers("ghost")).toEqual([100, 21, 120])
        expect(yield* Maintenance.runOnce()).toEqual(Maintenance.ZERO_PRUNE_COUNTS)
      }))

    it.effect("a living row's attempts older than the longest retention go, except its newest", () =>
      Effect.gen(function*() {
        yield* reset
        // the longest outbox retention is the dead letters' 30 days
        yield* outbox("mixed", "pending", null)
        yield* attempts("mixed", 1, 3, 40)
        yield* attempts("mixed", 4, 5, 1)
        yield* outbox("all-old", "delivered", 1)
        yield* attempts("all-old", 1, 4, 35)
        yield* outbox("young", "pending", null)
        yield* attempts("young", 1, 3, 29)
        yield* outbox("one-old", "pending", null)
        yield* attempts("one-old", 1, 1, 45)
        const counts = yield* Maintenance.runOnce()
        expect(counts.delivery_attempts).toBe(3 + 3)
        expect(yield* numbers("mixed")).toEqual([2, 4, 5])
        // its last outcome stays for `deliveries show`
        expect(yield* numbers("all-old")).toEqual([1, 4, 4])
        expect(yield* numbers("young")).toEqual([3, 1, 3])
        expect(yield* numbers("one-old")).toEqual([1, 1, 1])
        expect(yield* Maintenance.runOnce()).toEqual(Maintenance.ZERO_PRUNE_COUNTS)
        // with shorter retentions the cutoff follows the longest of the three
        const shorter = { delivered: "2 days", cancelled: "2 days", deadLetter: "20 days" } as const
        expect((yield* Maintenance.runOnce(shorter)).delivery_attempts).toBe(2)
        expect(yield* numbers("young")).toEqual([1, 3, 3])
      }))

    it.effect("a dead row's attempts still go with the row", () =>
      Effect.gen(function*() {
        yield* reset
        yield* outbox("done", "delivered", 8)
        yield* attempts("done", 1, 150, 9)
        yield* outbox("kept", "delivered", 6)
        yield* attempts("kept", 1, 2, 7)
        const counts = yield* Maintenance.runOnce()
        expect([counts.outbox, counts.delivery_attempts]).toEqual([1, 150])
        expect(yield* numbers("done")).toEqual([0, null, null])
        expect(yield* numbers("kept")).toEqual([2, 1, 2])
      }))

    it.effect("the excess walk deletes at most batchSize a statement and follows new attempts from its cursor", () =>
      Effect.gen(function*() {
        yield* reset
        yield* outbox("hot", "pending", null)
        yield* attempts("hot", 1, 150, 1)
        const cursors = yield* PruneAttempts.newBoundCursors
        const small = { batchSize: 10, maxBatches: 2, runBudget: 0 }
        // a statement walks 100 attempts (1..100: none above 100), the next 101..150 and deletes its
        // limit, 10; a statement that deleted its limit walks the same window again
        expect((yield* Maintenance.runOnce(small, undefined, undefined, cursors)).delivery_attempts).toBe(10)
        expect(yield* numbers("hot")).toEqual([140, 11, 150])
        expect((yield* Ref.get(cursors.excess))?.attempt).toBe(100)
        expect((yield* Maintenance.runOnce(small, undefined, undefined, cursors)).delivery_attempts).toBe(20)
        expect((yield* Maintenance.runOnce(small, undefined, undefined, cursors)).delivery_attempts).toBe(20)
        expect(yield* numbers("hot")).toEqual([100, 51, 150])
        // nothing left: the walk moves to the newest attempt, and a run with nothing new deletes nothing
        expect((yield* Maintenance.runOnce(small, undefined, undefined, cursors)).delivery_attempts).toBe(0)
        expect((yield* Ref.get(cursors.excess))?.attempt).toBe(150)
        expect((yield* Maintenance.runOnce(small, undefined, undefined, cursors)).delivery_attempts).toBe(0)
        // redelivered again: the new attempts are walked and the bound follows them
        yield* attempts("hot", 151, 165, 1)
        expect((yield* Maintenance.runOnce(small, undefined, undefined, cursors)).delivery_attempts).toBe(15)
        expect(yield* numbers("hot")).toEqual([100, 66, 165])
        expect((yield* Ref.get(cursors.excess))?.attempt).toBe(165)
      }))
  })
})
