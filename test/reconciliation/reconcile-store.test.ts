/**
 * ReconcileStore against real PostgreSQL: the completion keyset read by the retry scheduler's swap
 * sync (SPEC §5.3.5: owners completed by another process are swapped into this one's registry).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { layerSql, ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import * as Db from "../support/db.js"
import { plc, rev } from "../support/stack.js"

const stack = layerSql.pipe(Layer.provideMerge(Db.layer()))

const completeAt = (did: string, secondsAgo: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`INSERT INTO owners (did, reconcile_status, completed_at)
        VALUES (${did}, 'complete', now() - make_interval(secs => ${secondsAgo}))`)

describe("ReconcileStore.completedSince", () => {
  it.scopedLive("a completion whose transaction started earlier but committed later is not skipped", () =>
    Effect.gen(function*() {
      const store = yield* ReconcileStore
      const start = yield* store.completedCursor(10 * 60_000)
      // Y completed 30 s ago: within the settle time (35 s here), not read yet
      yield* completeAt(plc(2), 30)
      const first = yield* store.completedSince(start, 10, 35_000)
      expect(first.dids).toEqual([])
      // X's completing transaction started 40 s ago and commits only now (its completed_at is its
      // start): the cursor has not passed it, so it is read
      yield* completeAt(plc(1), 40)
      const second = yield* store.completedSince(first.cursor, 10, 35_000)
      expect(second.dids).toEqual([plc(1)])
      // and Y once it has settled (here: a settle time of 0)
      const third = yield* store.completedSince(second.cursor, 10, 0)
      expect(third.dids).toEqual([plc(2)])
      const fourth = yield* store.completedSince(third.cursor, 10, 0)
      expect(fourth.dids).toEqual([])
    }).pipe(Effect.provide(stack)))

  it.scopedLive("the default settle time is 90 s", () =>
    Effect.gen(function*() {
      const store = yield* ReconcileStore
      const start = yield* store.completedCursor(10 * 60_000)
      yield* completeAt(plc(3), 80)
      yield* completeAt(plc(4), 100)
      expect((yield* store.completedSince(start, 10)).dids).toEqual([plc(4)])
    }).pipe(Effect.provide(stack)))
})

describe("ReconcileStore.retryCandidates", () => {
  it.scopedLive("a crashed scan (scanning past staleScanMs) is marked failed, even when failed owners fill every slot", () =>
    Effect.gen(function*() {
      const store = yield* ReconcileStore
      const sql = yield* SqlClient.SqlClient
      for (let i = 0; i < 20; i++) {
        yield* sql`INSERT INTO owners (did, reconcile_status, failed_at, failure_count)
          VALUES (${plc(100 + i)}, 'failed', now() - make_interval(secs => ${100 - i}), 3)`
      }
      yield* sql`INSERT INTO owners (did, reconcile_status, scan_generation, scan_started_at)
        VALUES (${plc(200)}, 'scanning', 1, now() - interval '20 minutes')`
      yield* sql`INSERT INTO owners (did, reconcile_status, scan_generation, scan_started_at)
        VALUES (${plc(201)}, 'scanning', 1, now() - interval '1 minute')`
      const got = yield* store.retryCandidates({ limit: 16, staleScanMs: 15 * 60_000, exclude: [] })
      expect(got.map((c) => c.did)).toEqual(Array.from({ length: 16 }, (_, i) => plc(100 + i)))
      // the crashed scan no longer defers its owner's deliveries; it waits its turn as a failure
      expect(yield* store.ownerState(plc(200))).toMatchObject({
        status: "failed",
        lastFailureKind: "scan_crashed",
        failureCount: 1
      })
      // a scan that is merely running stays
      expect((yield* store.ownerState(plc(201)))?.status).toBe("scanning")
    }).pipe(Effect.provide(stack)))

  it.scopedLive("a crashed scan marked failed gives the fence back to the latest completed snapshot's rev (SPEC §3.4)", () =>
    Effect.gen(function*() {
      const store = yield* ReconcileStore
      const sql = yield* SqlClient.SqlClient
      const [done, crashed, running] = [rev(100), rev(200), rev(300)]
      yield* sql`INSERT INTO owners (did, reconcile_status, scan_generation, scan_started_at, snapshot_rev, completed_snapshot_rev)
        VALUES (${plc(300)}, 'scanning', 2, now() - interval '20 minutes', ${crashed}, ${done})`
      yield* sql`INSERT INTO owners (did, reconcile_status, scan_generation, scan_started_at, snapshot_rev)
        VALUES (${plc(301)}, 'scanning', 1, now() - interval '20 minutes', ${crashed})`
      yield* sql`INSERT INTO owners (did, reconcile_status, scan_generation, scan_started_at, snapshot_rev, completed_snapshot_rev)
        VALUES (${plc(302)}, 'scanning', 2, now() - interval '1 minute', ${running}, ${done})`
      yield* store.retryCandidates({ limit: 16, staleScanMs: 15 * 60_000, exclude: [] })
      expect(yield* store.ownerState(plc(300))).toMatchObject({ status: "failed", snapshotRev: done })
      // never completed a scan: no fence
      expect(yield* store.ownerState(plc(301))).toMatchObject({ status: "failed", snapshotRev: undefined })
      // a scan in progress keeps fencing with its own rev
      expect(yield* store.ownerState(plc(302))).toMatchObject({ status: "scanning", snapshotRev: running })
    }).pipe(Effect.provide(stack)))
})
