/**
 * Room freed under a global admission limit (SPEC §2.6) requests the owners of the oldest refusals
 * for that limit, leaving out owners already requested, scanning or failed. Those are left out
 * before the `ROOM_SCAN_MAX` oldest refusals per limit are taken: the old refusals of owners that
 * cannot be requested never fill the window. Before, the window was taken first, so ten failed
 * owners with their 100 refusals each (the per-owner bound) hid every other owner for good.
 * The statement still reads the partial index `rejected_records_limit_since`, at most
 * `ROOM_READ_MAX` entries of it per limit (before that bound, a limit whose refusals were all of
 * failed owners read every one: 500,000 entries, 320 ms, for each freeing write of a batch; a
 * limit that stamped nobody is not asked again in its unit). Real PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import {
  REJECTED_LIMITS,
  ROOM_READ_MAX,
  ROOM_SCAN_MAX,
  roomRequestStatement
} from "../../src/services/registry/RejectedStore.js"
import { run } from "../delivery/worker-support.js"
import { plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const hook = whRecordValue(`at://${plc(9)}`)

/** the owners with a pending reconciliation request */
const requested = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<{ did: string }>`SELECT did FROM owners WHERE reconcile_requested_at IS NOT NULL ORDER BY did`.pipe(
      Effect.map((rows) => rows.map((r) => r.did))
    )
)

/** An owner in `state` with `n` `limit_total` refusals first seen a day ago (older than any live one). */
const oldRefusals = (did: string, state: "failed" | "scanning" | "requested", n: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.zipRight(
      state === "requested"
        ? sql`INSERT INTO owners (did, reconcile_requested_at) VALUES (${did}, now() - interval '1 hour')`
        : sql`INSERT INTO owners (did, reconcile_status) VALUES (${did}, ${state})`,
      sql`
        INSERT INTO rejected_records (owner_did, rkey, rev, reason, source, first_seen_at, last_seen_at)
        SELECT ${did}, 'k' || g, ${rev(1)}, 'limit_total', 'stream', now() - interval '1 day', now() - interval '1 day'
        FROM generate_series(1, ${n}::int) g`
    ))

const env = { WEBHOOK_ALLOW_INSECURE_DEV: "1", REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX: "1" }

describe("room requests under a global limit skip owners that cannot be requested before the window", () => {
  it.scopedLive(
    "old refusals of failed, scanning and already requested owners filling the window do not hide a waiting owner",
    () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "a", hook, { rev: rev(1) })])
        // ROOM_SCAN_MAX old refusals, 100 (the per-owner bound) for each of ten owners that cannot be requested
        const per = REJECTED_LIMITS.perOwner
        const states = [
          "failed",
          "failed",
          "failed",
          "failed",
          "scanning",
          "scanning",
          "scanning",
          "requested",
          "requested",
          "requested"
        ] as const
        expect(states.length * per).toBe(ROOM_SCAN_MAX)
        const blocked = states.map((_, i) => plc(300 + i))
        for (const [i, state] of states.entries()) yield* oldRefusals(blocked[i] ?? "", state, per)
        const already = yield* requested
        expect(already).toHaveLength(3)
        // an idle owner refused for the total limit now (the newest refusal)
        const idle = plc(400)
        const out = yield* run([whEv(idle, "w", hook, { rev: rev(2) })])
        expect(out.outcomes.map((o) => (o._tag === "no_match" ? o.registry?._tag : o._tag))).toEqual(["quarantined"])
        // Alice deletes her webhook: room for one; the idle owner is requested, no blocked one is
        yield* run([whEv(ALICE, "a", undefined, { operation: "delete", rev: rev(3) })])
        expect(yield* requested).toEqual([...already, idle].sort())
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env }))),
    { timeout: 60_000 }
  )

  it.scopedLive("the statement reads the oldest refusals through the partial index", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const [text, params] = roomRequestStatement(sql, {
        ownerDid: ALICE,
        owner: false,
        ownerRecords: false,
        global: ["total", "direct_dids", "backlink_dids"],
        othersMax: 16
      }).compile()
      // (a few rows: a sequential scan would be cheaper, so the planner is told not to)
      const plan = yield* Effect.zipRight(
        sql`SET LOCAL enable_seqscan = off`,
        sql.unsafe<{ "QUERY PLAN": string }>(`EXPLAIN ${text}`, params)
      ).pipe(sql.withTransaction)
      const lines = plan.map((r) => r["QUERY PLAN"]).join("\n")
      expect(lines.match(/rejected_records_limit_since/g)).toHaveLength(3)
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env }))))

  it.scopedLive(
    "a limit whose oldest refusals are all of failed owners: at most ROOM_READ_MAX entries read",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        // 1.5 × ROOM_READ_MAX refusals of failed owners (100 each), no owner that may be requested
        const owners = Math.ceil((1.5 * ROOM_READ_MAX) / 100)
        yield* sql.unsafe(`INSERT INTO owners (did, reconcile_status)
        SELECT 'did:plc:f' || lpad(i::text, 23, '0'), 'failed' FROM generate_series(1, ${owners}) i`)
        // and the deployment's other owners, that may be requested but hold no refusal
        yield* sql.unsafe(`INSERT INTO owners (did, reconcile_status)
          SELECT 'did:plc:c' || lpad(i::text, 23, '0'), 'complete' FROM generate_series(1, 100000) i`)
        yield* sql.unsafe(
          `INSERT INTO rejected_records (owner_did, rkey, rev, reason, source, first_seen_at, last_seen_at)
        SELECT 'did:plc:f' || lpad((i / 100 + 1)::text, 23, '0'), 'k' || (i % 100), '${
            rev(1)
          }', 'limit_total', 'stream',
          now() - interval '10 days' + i * interval '1 millisecond', now()
        FROM generate_series(0, ${owners * 100 - 1}) i`
        )
        yield* sql.unsafe(`ANALYZE rejected_records`)
        yield* sql.unsafe(`ANALYZE owners`)
        const [text, params] = roomRequestStatement(sql, {
          ownerDid: ALICE,
          owner: false,
          ownerRecords: false,
          global: ["total"],
          othersMax: 16
        }).compile()
        const plan = (yield* sql.unsafe<{ "QUERY PLAN": string }>(`EXPLAIN (ANALYZE) ${text}`, params))
          .map((r) => r["QUERY PLAN"]).join("\n")
        const read = Number(/rejected_records_limit_since[^\n]*actual time=[^\n]*rows=(\d+)/.exec(plan)?.[1])
        expect(read).toBeGreaterThan(0)
        expect(read, plan).toBeLessThanOrEqual(ROOM_READ_MAX)
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env }))),
    { timeout: 120_000 }
  )
})
