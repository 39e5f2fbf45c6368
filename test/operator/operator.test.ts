/**
 * Operator actions (SPEC §4.8) on real PostgreSQL, with outbox rows made by the real
 * `Processor.processEvents`: list filters, show with attempts, redeliver, replay of dead letters by
 * owner / webhook / time (same delivery ids, fresh attempt budget, bounded batches), NOTIFY, status.
 */
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Option, Ref, Schedule, Stream } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { DeliveryStore, layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor } from "../../src/services/matching/Processor.js"
import * as Operator from "../../src/services/operator/Operator.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"

const T1 = new Date("2026-01-01T00:00:00Z")
const T2 = new Date("2026-01-02T00:00:00Z")
const T3 = new Date("2026-01-03T00:00:00Z")

const stack = () => Operator.layer.pipe(Layer.provideMerge(sqlStack()))

const run = (batch: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, { registryWriter: true }))

interface Row {
  readonly delivery_id: string
  readonly owner_did: string
  readonly webhook_rkey: string
  readonly event_rkey: string
  readonly status: string
  readonly attempt_count: number
  readonly lease_token: string | null
  readonly leased_until: Date | null
  readonly last_error_kind: string | null
  readonly last_http_status: number | null
  readonly finished_at: Date | null
  readonly due: boolean
}

const rows = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<Row>`
    SELECT delivery_id, owner_did, webhook_rkey, event_rkey, status, attempt_count, lease_token, leased_until,
           last_error_kind, last_http_status, finished_at, next_attempt_at <= now() AS due
    FROM outbox ORDER BY owner_did, event_rkey`
)

const rowOf = (owner: string, eventRkey: string) =>
  Effect.map(rows, (rs) => {
    const r = rs.find((x) => x.owner_did === owner && x.event_rkey === eventRkey)
    if (r === undefined) return Effect.dieMessage("row missing")
    return Effect.succeed(r)
  }).pipe(Effect.flatten)

/** What the delivery worker would have written for a terminal outcome (test-side SQL). */
const settle = (owner: string | undefined, eventRkey: string | undefined, status: string, attempts = 12) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql`
      UPDATE outbox SET status = ${status}, attempt_count = ${attempts},
        last_error_kind = CASE WHEN ${status} = 'dead_letter' THEN 'http_5xx' ELSE NULL END,
        last_http_status = CASE WHEN ${status} = 'dead_letter' THEN 503 WHEN ${status} = 'delivered' THEN 200 ELSE NULL END,
        finished_at = CASE WHEN ${status} IN ('delivered', 'dead_letter', 'cancelled') THEN now() ELSE NULL END,
        next_attempt_at = now() + interval '1 hour'
      WHERE (${owner ?? null}::text IS NULL OR owner_did = ${owner ?? null})
        AND (${eventRkey ?? null}::text IS NULL OR event_rkey = ${eventRkey ?? null})`
  )

/**
 * ALICE/w1 and CAROL/w2 both watch BOB; BOB posts p1, p2, p3 (enqueued at T1, T2, T3): six
 * deliveries through the real processor.
 */
const seed = Effect.gen(function*() {
  yield* run([
    whEv(ALICE, "w1", whRecordValue(`at://${BOB}`, { url: "https://alice.example/hook" }), { rev: rev(1) }),
    whEv(CAROL, "w2", whRecordValue(`at://${BOB}`, { url: "https://carol.example/hook" }), { rev: rev(1) })
  ])
  const r = yield* run([
    ev(BOB, POST, "p1", { rev: rev(10) }),
    ev(BOB, POST, "p2", { rev: rev(11) }),
    ev(BOB, POST, "p3", { rev: rev(12) })
  ])
  expect(r.inserted).toBe(6)
  const sql = yield* SqlClient.SqlClient
  for (const [rkey, t] of [["p1", T1], ["p2", T2], ["p3", T3]] as const) {
    yield* sql`UPDATE outbox SET created_at = ${t} WHERE event_rkey = ${rkey}`
  }
})

const invalid = <A, E>(exit: Exit.Exit<A, E>) =>
  Exit.isFailure(exit) && JSON.stringify(exit.cause).includes("InvalidArgument")

describe("Operator", () => {
  it.effect("listDeliveries filters by owner, webhook, status and time; newest first; bounded limit", () =>
    Effect.gen(function*() {
      yield* seed
      yield* settle(ALICE, "p2", "dead_letter")
      const op = yield* Operator.Operator
      const all = yield* op.listDeliveries({})
      expect(all).toHaveLength(6)
      expect(all.map((d) => d.eventRkey)).toEqual(["p3", "p3", "p2", "p2", "p1", "p1"])
      const alice = yield* op.listDeliveries({ owner: ALICE })
      expect(alice.map((d) => d.ownerDid)).toEqual([ALICE, ALICE, ALICE])
      expect(alice[0]?.targetUrl).toBe("https://alice.example/hook")
      expect(alice[0]?.eventDid).toBe(BOB)
      expect(alice[0]?.createdAt).toEqual(T3)
      const w2 = yield* op.listDeliveries({ webhook: "w2" })
      expect(w2.map((d) => `${d.ownerDid}/${d.webhookRkey}`)).toEqual([`${CAROL}/w2`, `${CAROL}/w2`, `${CAROL}/w2`])
      expect(yield* op.listDeliveries({ owner: ALICE, webhook: "w2" })).toEqual([])
      const dead = yield* op.listDeliveries({ status: "dead_letter" })
      expect(dead.map((d) => [d.ownerDid, d.eventRkey, d.attemptCount, d.lastErrorKind, d.lastHttpStatus])).toEqual([
        [ALICE, "p2", 12, "http_5xx", 503]
      ])
      expect(dead[0]?.finishedAt).toBeInstanceOf(Date)
      expect((yield* op.listDeliveries({ status: "pending" })).map((d) => d.eventRkey).sort()).toEqual([
        "p1",
        "p1",
        "p2",
        "p3",
        "p3"
      ])
      expect((yield* op.listDeliveries({ since: T2 })).map((d) => d.eventRkey)).toEqual(["p3", "p3", "p2", "p2"])
      expect((yield* op.listDeliveries({ until: T2 })).map((d) => d.eventRkey)).toEqual(["p1", "p1"])
      expect((yield* op.listDeliveries({ since: T2, until: T3, owner: CAROL })).map((d) => d.eventRkey)).toEqual(["p2"])
      expect(yield* op.listDeliveries({ limit: 2 })).toHaveLength(2)
      expect(yield* op.listDeliveries({ limit: 1000 })).toHaveLength(6)
      for (const limit of [0, 1001, 1.5, -1]) {
        expect(invalid(yield* Effect.exit(op.listDeliveries({ limit })))).toBe(true)
      }
      expect(invalid(yield* Effect.exit(op.listDeliveries({ owner: "alice.example" })))).toBe(true)
      expect(invalid(yield* Effect.exit(op.listDeliveries({ webhook: "a/b" })))).toBe(true)
      expect(invalid(yield* Effect.exit(op.listDeliveries({ since: new Date(Number.NaN) })))).toBe(true)
    }).pipe(Effect.provide(stack())))

  it.effect("showDelivery returns the row and its attempts in order; unknown id → none", () =>
    Effect.gen(function*() {
      yield* seed
      const sql = yield* SqlClient.SqlClient
      const op = yield* Operator.Operator
      const target = yield* rowOf(ALICE, "p1")
      for (const n of [2, 3, 1]) {
        yield* sql`
          INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status, response_excerpt)
          VALUES (${target.delivery_id}, ${n}, now() - make_interval(mins => ${10 - n}), ${
          n * 10
        }, 'failed', 'http_5xx', 503, ${`oops ${n}`})`
      }
      const shown = yield* op.showDelivery(target.delivery_id)
      expect(Option.isSome(shown)).toBe(true)
      if (Option.isNone(shown)) return
      expect(shown.value.delivery.deliveryId).toBe(target.delivery_id)
      expect(shown.value.delivery.ownerDid).toBe(ALICE)
      expect(shown.value.delivery.matchKind).toBe("direct")
      expect(
        shown.value.attempts.map((
          a
        ) => [a.attempt, a.durationMs, a.outcome, a.errorKind, a.httpStatus, a.responseExcerpt])
      ).toEqual([
        [1, 10, "failed", "http_5xx", 503, "oops 1"],
        [2, 20, "failed", "http_5xx", 503, "oops 2"],
        [3, 30, "failed", "http_5xx", 503, "oops 3"]
      ])
      const other = yield* op.showDelivery((yield* rowOf(CAROL, "p1")).delivery_id)
      expect(Option.map(other, (d) => d.attempts)).toEqual(Option.some([]))
      expect(yield* op.showDelivery("whd_v1_unknown")).toEqual(Option.none())
    }).pipe(Effect.provide(stack())))

  it.effect("replay by owner and time range: same ids, pending, attempt_count 0; other owners untouched", () =>
    Effect.gen(function*() {
      yield* seed
      yield* settle(undefined, undefined, "dead_letter")
      const op = yield* Operator.Operator
      const before = yield* rows
      expect(before.every((r) => r.status === "dead_letter" && r.attempt_count === 12)).toBe(true)

      const count = yield* op.replayDeadLetters({ owner: ALICE, since: T2, until: new Date(T3.getTime() + 1000) })
      expect(count).toEqual({ replayed: 2, inactiveSubscription: 0, complete: true, truncated: false })
      const after = yield* rows
      expect(after.map((r) => r.delivery_id)).toEqual(before.map((r) => r.delivery_id))
      for (const r of after) {
        const replayed = r.owner_did === ALICE && (r.event_rkey === "p2" || r.event_rkey === "p3")
        if (replayed) {
          expect(r).toMatchObject({
            status: "pending",
            attempt_count: 0,
            lease_token: null,
            leased_until: null,
            last_error_kind: null,
            last_http_status: null,
            finished_at: null,
            due: true
          })
        } else {
          expect(r).toMatchObject({ status: "dead_letter", attempt_count: 12, last_error_kind: "http_5xx", due: false })
        }
      }
      // by webhook: CAROL's three; then nothing is left for that filter
      expect((yield* op.replayDeadLetters({ webhook: "w2" })).replayed).toBe(3)
      expect((yield* op.replayDeadLetters({ webhook: "w2" })).replayed).toBe(0)
      expect((yield* rows).filter((r) => r.status === "dead_letter").map((r) => [r.owner_did, r.event_rkey])).toEqual([
        [ALICE, "p1"]
      ])
      // only dead letters are replayed: a delivered row stays delivered
      yield* settle(CAROL, "p1", "delivered", 1)
      expect((yield* op.replayDeadLetters({})).replayed).toBe(1)
      expect((yield* rowOf(CAROL, "p1")).status).toBe("delivered")
      expect(invalid(yield* Effect.exit(op.replayDeadLetters({ owner: "nope" })))).toBe(true)
    }).pipe(Effect.provide(stack())))

  it.effect("replay goes through more than one batch of 1,000 and counts every row", () =>
    Effect.gen(function*() {
      yield* run([whEv(ALICE, "many", whRecordValue(`at://${BOB}`), { rev: rev(1) })])
      const n = 2_345
      const events = Array.from({ length: n }, (_, i) => ev(BOB, POST, `m${i}`, { rev: rev(100 + i) }))
      for (let i = 0; i < n; i += 128) yield* run(events.slice(i, i + 128))
      yield* settle(undefined, undefined, "dead_letter")
      const ids = (yield* rows).map((r) => r.delivery_id)
      expect(ids).toHaveLength(n)
      const op = yield* Operator.Operator
      expect(yield* op.replayDeadLetters({ owner: ALICE })).toEqual({
        replayed: n,
        inactiveSubscription: 0,
        complete: true,
        truncated: false
      })
      const after = yield* rows
      expect(after.map((r) => r.delivery_id)).toEqual(ids)
      expect(after.every((r) => r.status === "pending" && r.attempt_count === 0)).toBe(true)
    }).pipe(Effect.provide(stack())), { timeout: 120_000 })

  it.effect("redeliver makes a delivered (or cancelled, dead, pending) row pending again; never a leased one", () =>
    Effect.gen(function*() {
      yield* seed
      const sql = yield* SqlClient.SqlClient
      const op = yield* Operator.Operator
      yield* settle(ALICE, "p1", "delivered", 1)
      const delivered = yield* rowOf(ALICE, "p1")
      expect(delivered).toMatchObject({ status: "delivered", last_http_status: 200 })
      expect(yield* op.redeliver(delivered.delivery_id)).toEqual({
        _tag: "Redelivered",
        previousStatus: "delivered",
        leaseExpired: false,
        subscriptionInactive: false
      })
      expect(yield* rowOf(ALICE, "p1")).toMatchObject({
        delivery_id: delivered.delivery_id,
        status: "pending",
        attempt_count: 0,
        last_http_status: null,
        finished_at: null,
        due: true
      })
      yield* settle(ALICE, "p2", "cancelled", 0)
      expect(yield* op.redeliver((yield* rowOf(ALICE, "p2")).delivery_id)).toMatchObject({
        _tag: "Redelivered",
        previousStatus: "cancelled"
      })
      expect((yield* rowOf(ALICE, "p2")).status).toBe("pending")
      yield* settle(ALICE, "p3", "pending", 3)
      expect(yield* op.redeliver((yield* rowOf(ALICE, "p3")).delivery_id)).toMatchObject({
        _tag: "Redelivered",
        previousStatus: "pending"
      })
      expect(yield* rowOf(ALICE, "p3")).toMatchObject({ status: "pending", attempt_count: 0, due: true })
      // a leased row is being attempted right now: untouched
      const leased = yield* rowOf(CAROL, "p1")
      yield* sql`UPDATE outbox SET status = 'leased', attempt_count = 2, lease_token = 'w:1',
                   leased_until = now() + interval '1 minute' WHERE delivery_id = ${leased.delivery_id}`
      expect(yield* op.redeliver(leased.delivery_id)).toMatchObject({ _tag: "Leased" })
      expect(yield* rowOf(CAROL, "p1")).toMatchObject({ status: "leased", attempt_count: 2, lease_token: "w:1" })
      expect(yield* op.redeliver("whd_v1_unknown")).toEqual({ _tag: "Missing" })
    }).pipe(Effect.provide(stack())))

  it.scopedLive(
    "redeliver and replay wake the workers with one NOTIFY each (none when nothing changed)",
    () =>
      Effect.gen(function*() {
        yield* seed
        yield* settle(undefined, undefined, "dead_letter")
        const pg = yield* PgClient.PgClient
        const op = yield* Operator.Operator
        const seen = yield* Ref.make<ReadonlyArray<string>>([])
        yield* pg.listen(Outbox.NOTIFY_CHANNEL).pipe(
          Stream.runForEach((payload) => Ref.update(seen, (s) => [...s, payload])),
          Effect.forkScoped
        )
        yield* Db.listening(Outbox.NOTIFY_CHANNEL)
        const waitFor = (n: number) =>
          Ref.get(seen).pipe(
            Effect.repeat({ until: (s) => s.length >= n, schedule: Schedule.spaced("20 millis") }),
            Effect.timeout("10 seconds")
          )
        expect((yield* op.redeliver((yield* rowOf(ALICE, "p1")).delivery_id))._tag).toBe("Redelivered")
        yield* waitFor(1)
        expect(yield* Ref.get(seen)).toEqual(["1"])
        expect((yield* op.replayDeadLetters({ owner: CAROL })).replayed).toBe(3)
        yield* waitFor(2)
        expect((yield* op.redeliver("whd_v1_unknown"))._tag).toBe("Missing")
        expect((yield* op.replayDeadLetters({ owner: CAROL })).replayed).toBe(0)
        // a marker of the test's own, after them: notifications come in commit order, so any NOTIFY
        // of the two calls above would come before it
        yield* pg`SELECT pg_notify(${Outbox.NOTIFY_CHANNEL}, 'marker')`
        yield* waitFor(3)
        expect(yield* Ref.get(seen)).toEqual(["1", "1", "marker"])
      }).pipe(Effect.provide(stack())),
    { timeout: 60_000 }
  )

  it.effect("status: counts by status, webhooks, owners, quarantine", () =>
    Effect.gen(function*() {
      yield* seed
      const sql = yield* SqlClient.SqlClient
      yield* settle(ALICE, "p1", "delivered", 1)
      yield* settle(ALICE, "p2", "dead_letter")
      yield* settle(CAROL, "p3", "cancelled", 0)
      // every row's next attempt time has passed, the finished rows' too: only pending rows are due
      yield* sql`UPDATE outbox SET next_attempt_at = now() - interval '1 second'`
      yield* sql`INSERT INTO quarantine (stream, relay, reason, event_hash) VALUES ('direct', 'wss://r', 'protocol', 'h')`
      yield* sql`INSERT INTO secrets (owner_did, name, envelope) VALUES (${ALICE}, 's', 'wse1.x')`
      const s = yield* Effect.flatMap(Operator.Operator, (op) => op.status)
      expect(s.deliveries).toEqual({ pending: 3, leased: 0, delivered: 1, dead_letter: 1, cancelled: 1, due: 3 })
      expect(s.webhooks).toEqual({ active: 2, total: 2, gone: 0 })
      expect(s.quarantine).toBe(1)
      expect(s.secrets).toBe(1)
      const owners = s.owners.unknown + s.owners.scanning + s.owners.complete + s.owners.failed
      expect(owners).toBeGreaterThanOrEqual(2)
      expect(JSON.stringify(s)).not.toContain("did:")
      expect(JSON.stringify(s)).not.toContain("https:")
    }).pipe(Effect.provide(stack())))

  it.effect("listPage: a next key only while older rows remain; following it lists every row once (SPEC §8.5 cursor)", () =>
    Effect.gen(function*() {
      yield* seed
      const op = yield* Operator.Operator
      const all = (yield* op.listDeliveries({})).map((d) => d.deliveryId)
      expect(all).toHaveLength(6)
      // exactly as many rows as the limit: the last page, no key for an empty one after it
      expect((yield* op.listPage({ limit: 6 })).next).toBeUndefined()
      expect((yield* op.listPage({ limit: 5 })).next).toBeDefined()
      const ids: Array<string> = []
      const nexts: Array<boolean> = []
      let before: Operator.ListKey | undefined = undefined
      for (let i = 0; i < 3; i++) {
        const page: Operator.DeliveryPage = yield* op.listPage(
          before === undefined ? { limit: 2 } : { limit: 2, before }
        )
        ids.push(...page.deliveries.map((d) => d.deliveryId))
        nexts.push(page.next !== undefined)
        before = page.next
      }
      expect(nexts).toEqual([true, true, false])
      expect(ids).toEqual(all)
    }).pipe(Effect.provide(stack())))

  it.effect("replay takes the dead letters as of its start: a row dead-lettered while it runs is left for the next replay", () =>
    Effect.gen(function*() {
      yield* seed
      const sql = yield* SqlClient.SqlClient
      // ALICE's p1 and p2 are dead letters at the start; her p3 (the newest key) is still pending
      yield* settle(ALICE, "p1", "dead_letter")
      yield* settle(ALICE, "p2", "dead_letter")
      const late = yield* rowOf(ALICE, "p3")
      // a worker dead-letters p3 just after the replay's first statement (each statement its own transaction)
      yield* sql.unsafe(`
        CREATE FUNCTION dead_letter_late() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF pg_trigger_depth() = 1 THEN
            UPDATE outbox SET status = 'dead_letter', last_error_kind = 'http_5xx', finished_at = now(),
              updated_at = now()
            WHERE delivery_id = '${late.delivery_id}' AND status = 'pending' AND attempt_count = 0;
          END IF;
          RETURN NULL;
        END $$`)
      yield* sql.unsafe(
        `CREATE TRIGGER dead_letter_late AFTER UPDATE ON outbox FOR EACH STATEMENT EXECUTE FUNCTION dead_letter_late()`
      )
      const op = yield* Operator.Operator
      expect(yield* op.replayDeadLetters({ owner: ALICE })).toEqual({
        replayed: 2,
        inactiveSubscription: 0,
        complete: true,
        truncated: false
      })
      expect((yield* rowOf(ALICE, "p3")).status).toBe("dead_letter")
      yield* sql`DROP TRIGGER dead_letter_late ON outbox`
      // the next replay takes it
      expect((yield* op.replayDeadLetters({ owner: ALICE })).replayed).toBe(1)
    }).pipe(Effect.provide(Operator.layerWith({ replayBatchSize: 1 }).pipe(Layer.provideMerge(sqlStack())))))

  it.effect("replay of a whole number of batches is complete (the statement that finds none is within its bound)", () =>
    Effect.gen(function*() {
      yield* seed
      yield* settle(undefined, undefined, "dead_letter")
      const op = yield* Operator.Operator
      expect(yield* op.replayDeadLetters({})).toEqual({
        replayed: 6,
        inactiveSubscription: 0,
        complete: true,
        truncated: false
      })
      expect((yield* rows).every((r) => r.status === "pending" && r.attempt_count === 0)).toBe(true)
    }).pipe(Effect.provide(Operator.layerWith({ replayBatchSize: 3 }).pipe(Layer.provideMerge(sqlStack())))))

  it.effect("replay with max: truncated only when dead letters of the filter remain beyond it (SPEC §8.5)", () =>
    Effect.gen(function*() {
      yield* seed
      yield* settle(undefined, undefined, "dead_letter")
      const op = yield* Operator.Operator
      // exactly max: all replayed, nothing left behind
      expect(yield* op.replayDeadLetters({ owner: ALICE }, { max: 3 })).toEqual({
        replayed: 3,
        inactiveSubscription: 0,
        complete: true,
        truncated: false
      })
      // beyond max: the oldest two, and truncated
      expect(yield* op.replayDeadLetters({ owner: CAROL }, { max: 2 })).toEqual({
        replayed: 2,
        inactiveSubscription: 0,
        complete: false,
        truncated: true
      })
      expect((yield* rowOf(CAROL, "p3")).status).toBe("dead_letter")
      expect((yield* rowOf(CAROL, "p1")).status).toBe("pending")
    }).pipe(Effect.provide(stack())))
})

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

/**
 * Parked rows (SPEC §4.3: an auto-disabled or gone webhook's rows are parked as dead letters, at
 * most 10,000 per webhook, beyond that dropped) replayed or redelivered while the webhook is still
 * disabled are parked again: the replay gives their parking room back, so none is dropped.
 */
describe("Operator: parked rows replayed while their webhook is still disabled", () => {
  const OWNER = "did:plc:ownerownerownerownerowne"
  const ROWS = 6_000
  /** Claim every due row and park it, as the worker does for a disabled webhook. */
  const parkDue = Effect.gen(function*() {
    const store = yield* DeliveryStore
    for (let i = 0; i < 20; i++) {
      const claimed = yield* store.claim("worker", 1_000, 60_000, { defaultRoom: 1_000 })
      if (claimed.rows.length === 0) return
      yield* Effect.forEach(claimed.rows, (r) => store.parkDisabled(r.deliveryId, r.leaseToken), {
        concurrency: 64,
        discard: true
      })
    }
  })
  /** The auto-disabled webhook `w` and `n` pending rows `d1`…`dn` (records `p1`…`pn`) of one event. */
  const seed = (n: number) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* insertWebhook(OWNER, "w", { state: { auto_disabled_at: "now()" } })
      yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES ('ev', '{}', 'x')`
      yield* sql`
        INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
          event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
        SELECT 'd' || g, 'ev', ${OWNER}, 'w', 'direct', ${OWNER}, 'app.bsky.feed.post', 'p' || g, 'create',
          'https://receiver.example/hook', 'secret_id', 'main', 'fp-w', 'https://receiver.example'
        FROM generate_series(1, ${n}) g`
    })
  const state = Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.all({
      statuses: sql<{ status: string; n: number }>`SELECT status, count(*)::int AS n FROM outbox GROUP BY status
        ORDER BY status`,
      parked: Effect.map(sql<{ parked: number }>`SELECT parked FROM webhooks`, (r) => r[0]?.parked)
    }))

  it.effect(
    "replay of 6,000 parked rows parks them again; none is dropped; redeliver gives its room back too",
    () =>
      Effect.gen(function*() {
        yield* seed(ROWS)
        yield* parkDue
        expect(yield* state).toEqual({ statuses: [{ status: "dead_letter", n: ROWS }], parked: ROWS })

        const op = yield* Operator.Operator
        const replayed = yield* op.replayDeadLetters({ owner: OWNER, webhook: "w" })
        expect([replayed.replayed, replayed.inactiveSubscription]).toEqual([ROWS, ROWS])
        expect((yield* state).parked).toBe(0)
        yield* parkDue
        // old code: 4,000 dead letters and 2,000 cancelled (10,000 counted)
        expect(yield* state).toEqual({ statuses: [{ status: "dead_letter", n: ROWS }], parked: ROWS })

        const one = yield* op.redeliver("d1")
        expect(one._tag).toBe("Redelivered")
        expect((yield* state).parked).toBe(ROWS - 1)
        yield* parkDue
        expect(yield* state).toEqual({ statuses: [{ status: "dead_letter", n: ROWS }], parked: ROWS })
      }).pipe(Effect.provide(Layer.mergeAll(deliveryStoreSql, Operator.layer).pipe(Layer.provideMerge(sqlStack())))),
    120_000
  )

  it.effect(
    "a row whose attempt saw the webhook disabled, settled after a resume --replay, is pending again (not parked behind the replay)",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* seed(1)
        const store = yield* DeliveryStore
        // the attempt has claimed the row and read the webhook as auto-disabled (it is in flight)
        const [row] = (yield* store.claim("worker", 1, 60_000)).rows
        expect(row).toBeDefined()
        // the owner resumes it with replay meanwhile: nothing parked yet, nothing to replay
        const resumed = yield* (yield* WebhookState.WebhookStateStore).resume(OWNER, "w", { replay: true })
        expect(Option.map(resumed, (r) => [r.cleared, r.replayed])).toEqual(Option.some([true, 0]))
        // then the attempt settles its decision: the row is due again, not a dead letter of an active webhook
        expect(yield* store.parkDisabled("d1", row?.leaseToken ?? "")).toBe(false)
        const after = yield* sql<
          { status: string; kind: string | null; finished: boolean; due: boolean; audits: number }
        >`
        SELECT status, last_error_kind AS kind, finished_at IS NOT NULL AS finished, next_attempt_at <= now() AS due,
          (SELECT count(*)::int FROM audit) AS audits
        FROM outbox`
        // old code: [{ status: 'dead_letter', kind: 'webhook_disabled', finished: true, … audits: 1 }]
        expect(after).toEqual([{ status: "pending", kind: null, finished: false, due: true, audits: 0 }])
        expect((yield* state).parked).toBe(0)
      }).pipe(
        Effect.provide(
          Layer.mergeAll(deliveryStoreSql, WebhookState.layerSql).pipe(
            Layer.provideMerge(Operator.layer),
            Layer.provideMerge(sqlStack())
          )
        )
      ),
    60_000
  )
})
