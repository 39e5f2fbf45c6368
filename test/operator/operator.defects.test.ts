/**
 * Operator actions (SPEC §4.8) on real PostgreSQL, the operator CLI's defects: replay paging forward
 * while rows are dead-lettered again, time ranges, expired leases, the newest attempts of a show,
 * and rows whose subscription is no longer active. Outbox rows made by the real
 * `Processor.processEvents`.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Option } from "effect"
import * as Operator from "../../src/services/operator/Operator.js"
import { ev, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import {
  ALICE,
  BOB,
  CAROL,
  invalid,
  POST,
  rowOf,
  rows,
  run,
  seed,
  settle,
  stack,
  T1,
  T2,
  T3
} from "./operator-support.js"

/**
 * Simulates workers dead-lettering replayed rows again while a replay runs, deterministically:
 * after every replay statement (each its own transaction), the rows that earlier statements made
 * pending go back to `dead_letter` (once each), as a worker's settle would write them.
 */
const reDeadLetterBetweenBatches = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.gen(function*() {
    yield* sql`CREATE TABLE replay_log (delivery_id text PRIMARY KEY, tx bigint NOT NULL, redone boolean NOT NULL DEFAULT false)`
    yield* sql.unsafe(`
      CREATE FUNCTION log_replay() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF OLD.status = 'dead_letter' AND NEW.status = 'pending' THEN
          INSERT INTO replay_log (delivery_id, tx) VALUES (NEW.delivery_id, txid_current())
          ON CONFLICT (delivery_id) DO UPDATE SET tx = EXCLUDED.tx;
        END IF;
        RETURN NEW;
      END $$`)
    yield* sql.unsafe(`
      CREATE FUNCTION redo_dead_letters() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        IF pg_trigger_depth() = 1 THEN
          WITH earlier AS (
            UPDATE replay_log SET redone = true WHERE tx <> txid_current() AND NOT redone RETURNING delivery_id
          )
          UPDATE outbox SET status = 'dead_letter', attempt_count = 12, finished_at = now(), updated_at = now()
          WHERE delivery_id IN (SELECT delivery_id FROM earlier) AND status = 'pending';
        END IF;
        RETURN NULL;
      END $$`)
    yield* sql.unsafe(`CREATE TRIGGER log_replay AFTER UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION log_replay()`)
    yield* sql.unsafe(
      `CREATE TRIGGER redo_dead_letters AFTER UPDATE ON outbox FOR EACH STATEMENT EXECUTE FUNCTION redo_dead_letters()`
    )
  }))

describe("Operator (operator CLI defects)", () => {
  it.effect(
    "replay pages forward: rows dead-lettered again while it runs are not replayed twice, and it ends",
    () =>
      Effect.gen(function*() {
        yield* run([whEv(ALICE, "many", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
        const n = 9
        yield* run(Array.from({ length: n }, (_, i) => ev(BOB, POST, `r${i}`, { rev: rev(100 + i) })))
        yield* settle(undefined, undefined, "dead_letter")
        const sql = yield* SqlClient.SqlClient
        // two rows share one created_at: the key is (created_at, delivery_id), not created_at alone
        yield* sql`UPDATE outbox SET created_at = ${T1} WHERE event_rkey IN ('r0', 'r1')`
        yield* reDeadLetterBetweenBatches
        const op = yield* Operator.Operator
        const result = yield* op.replayDeadLetters({ owner: ALICE }).pipe(Effect.timeout("20 seconds"))
        expect(result).toEqual({ replayed: n, inactiveSubscription: 0, complete: true, truncated: false })
        // every row was replayed exactly once (the rows of earlier statements were dead-lettered again)
        const log = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM replay_log`
        expect(log[0]?.n).toBe(n)
        const statuses = yield* sql<
          { status: string; n: number }
        >`SELECT status, count(*)::int AS n FROM outbox GROUP BY status`
        // the simulation did happen: all but the last statement's row are dead letters again
        expect(Object.fromEntries(statuses.map((r) => [r.status, r.n]))).toEqual({ dead_letter: n - 1, pending: 1 })
      }).pipe(Effect.provide(Operator.layerWith({ replayBatchSize: 2 }).pipe(Layer.provideMerge(sqlStack())))),
    { timeout: 60_000 }
  )

  it.effect("an inverted or empty time range is an invalid argument (list and replay)", () =>
    Effect.gen(function*() {
      yield* seed
      yield* settle(undefined, undefined, "dead_letter")
      const op = yield* Operator.Operator
      expect(invalid(yield* Effect.exit(op.listDeliveries({ since: T3, until: T2 })))).toBe(true)
      expect(invalid(yield* Effect.exit(op.listDeliveries({ since: T2, until: T2 })))).toBe(true)
      expect(invalid(yield* Effect.exit(op.replayDeadLetters({ since: T3, until: T1 })))).toBe(true)
      expect((yield* rows).every((r) => r.status === "dead_letter")).toBe(true)
      expect(yield* op.listDeliveries({ since: T2, until: T3 })).toHaveLength(2)
    }).pipe(Effect.provide(stack())))

  it.effect("redeliver: an expired lease (a stopped worker) is redelivered and said so; a valid lease is refused", () =>
    Effect.gen(function*() {
      yield* seed
      const sql = yield* SqlClient.SqlClient
      const op = yield* Operator.Operator
      const stale = yield* rowOf(ALICE, "p1")
      yield* sql`UPDATE outbox SET status = 'leased', attempt_count = 4, lease_token = 'dead:1',
                   leased_until = now() - interval '5 minutes' WHERE delivery_id = ${stale.delivery_id}`
      expect(yield* op.redeliver(stale.delivery_id)).toEqual({
        _tag: "Redelivered",
        previousStatus: "leased",
        leaseExpired: true,
        subscriptionInactive: false
      })
      expect(yield* rowOf(ALICE, "p1")).toMatchObject({
        status: "pending",
        attempt_count: 0,
        lease_token: null,
        leased_until: null
      })
      const live = yield* rowOf(ALICE, "p2")
      yield* sql`UPDATE outbox SET status = 'leased', lease_token = 'w:1',
                   leased_until = now() + interval '1 minute' WHERE delivery_id = ${live.delivery_id}`
      const refused = yield* op.redeliver(live.delivery_id)
      expect(refused._tag).toBe("Leased")
      if (refused._tag === "Leased") expect(refused.leasedUntil).toBeInstanceOf(Date)
      expect((yield* rowOf(ALICE, "p2")).lease_token).toBe("w:1")
    }).pipe(Effect.provide(stack())))

  it.effect("show: the newest 1,000 attempts in attempt order, and how many older ones are not shown", () =>
    Effect.gen(function*() {
      yield* seed
      const sql = yield* SqlClient.SqlClient
      const op = yield* Operator.Operator
      const target = yield* rowOf(ALICE, "p1")
      const total = Operator.MAX_ATTEMPTS_SHOWN + 5
      yield* sql`
        INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status)
        SELECT ${target.delivery_id}, g, now() - make_interval(secs => ${total} - g), 1, 'failed', 'http_5xx', 503
        FROM generate_series(1, ${total}) g`
      const shown = yield* op.showDelivery(target.delivery_id)
      if (Option.isNone(shown)) return expect.unreachable()
      expect(shown.value.attempts).toHaveLength(Operator.MAX_ATTEMPTS_SHOWN)
      expect(shown.value.attempts[0]?.attempt).toBe(6)
      expect(shown.value.attempts.at(-1)?.attempt).toBe(total)
      expect(shown.value.olderAttemptsNotShown).toBe(5)
      const few = yield* op.showDelivery((yield* rowOf(CAROL, "p1")).delivery_id)
      expect(Option.map(few, (d) => d.olderAttemptsNotShown)).toEqual(Option.some(0))
    }).pipe(Effect.provide(stack())))

  it.effect("replay and redeliver report rows whose subscription is no longer active as enqueued (and still replay them)", () =>
    Effect.gen(function*() {
      yield* seed
      yield* settle(undefined, undefined, "dead_letter")
      const sql = yield* SqlClient.SqlClient
      const op = yield* Operator.Operator
      // CAROL/w2 disabled: her three rows would be cancelled; ALICE/w1 unchanged
      yield* sql`UPDATE webhooks SET enabled = false, active = false WHERE owner_did = ${CAROL}`
      expect(yield* op.replayDeadLetters({})).toEqual({
        replayed: 6,
        inactiveSubscription: 3,
        complete: true,
        truncated: false
      })
      expect((yield* rows).every((r) => r.status === "pending")).toBe(true)
      // each way a subscription stops matching its rows (undone after each, deleting last)
      const [w] = yield* sql<
        { url: string; fingerprint: string }
      >`SELECT url, fingerprint FROM webhooks WHERE owner_did = ${ALICE}`
      if (w === undefined) return expect.unreachable()
      const restore =
        sql`UPDATE webhooks SET fingerprint = ${w.fingerprint}, url = ${w.url}, gone_at = NULL, auto_disabled_at = NULL
            WHERE owner_did = ${ALICE}`
      const cases: ReadonlyArray<readonly [string, Effect.Effect<unknown, unknown>]> = [
        ["fingerprint", sql`UPDATE webhooks SET fingerprint = 'other' WHERE owner_did = ${ALICE}`],
        ["gone", sql`UPDATE webhooks SET gone_at = now() WHERE owner_did = ${ALICE}`],
        // parked again unsent (SPEC §4.3) while auto-disabled
        ["autoDisabled", sql`UPDATE webhooks SET auto_disabled_at = now() WHERE owner_did = ${ALICE}`],
        ["url", sql`UPDATE webhooks SET url = 'https://elsewhere.example/' WHERE owner_did = ${ALICE}`],
        ["disabled", sql`UPDATE webhooks SET enabled = false, active = false WHERE owner_did = ${ALICE}`],
        ["deleted", sql`DELETE FROM webhooks WHERE owner_did = ${ALICE}`]
      ]
      const p1 = (yield* rowOf(ALICE, "p1")).delivery_id
      expect(yield* op.redeliver(p1)).toMatchObject({ _tag: "Redelivered", subscriptionInactive: false })
      for (const [name, change] of cases) {
        yield* change
        const r = yield* op.redeliver(p1)
        expect([name, r]).toEqual([name, expect.objectContaining({ _tag: "Redelivered", subscriptionInactive: true })])
        yield* restore
        yield* sql`UPDATE webhooks SET enabled = true, active = true WHERE owner_did = ${ALICE}`
        expect((yield* op.redeliver(p1))._tag).toBe("Redelivered")
      }
      expect(yield* op.redeliver(p1)).toMatchObject({ _tag: "Redelivered", subscriptionInactive: true })
    }).pipe(Effect.provide(stack())))
})
