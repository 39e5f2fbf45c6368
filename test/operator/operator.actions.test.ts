/**
 * Operator actions (SPEC §4.8) on real PostgreSQL, with outbox rows made by the real
 * `Processor.processEvents`: list filters, show with attempts, redeliver, replay of dead letters by
 * owner / webhook / time (same delivery ids, fresh attempt budget, bounded batches), NOTIFY, status,
 * the list's pages.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Option, Ref, Schedule, Stream } from "effect"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as Operator from "../../src/services/operator/Operator.js"
import * as Db from "../support/db.js"
import { ev, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { ALICE, BOB, CAROL, invalid, POST, rowOf, rows, run, seed, settle, stack, T2, T3 } from "./operator-support.js"

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
