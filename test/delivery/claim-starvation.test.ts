/**
 * One origin's backlog cannot hide every other origin's rows from the claim (SPEC §4.1, "one slow
 * receiver cannot starve the others"), on real PostgreSQL. The claim reads a bounded window of the
 * oldest due rows (`SCAN_MAX`); when that window holds nothing it may take (the origin is full, or
 * has no room left) while rows lie beyond it, the claim walks the origins with pending rows and takes
 * theirs. Before that walk existed, 5,000 older rows of one full origin left every claim empty, and
 * a worker whose slow receiver held its fill of that origin delivered nothing to anyone else.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import {
  DeliveryStore,
  layerSql as deliveryStoreSql,
  ORIGIN_WALK_MAX,
  SCAN_MAX
} from "../../src/services/delivery/DeliveryStore.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { copyDueRows, countWhere, eventually, receiver, run, startWorker } from "./worker-support.js"

const A = "https://a.example"
const B = "https://b.example"

/**
 * `count` pending rows of `origin`, due `ageSeconds` ago (the i-th a millisecond later than the
 * one before), with ids `<prefix><i>`. Straight into the table: the claim reads nothing else.
 */
const insertDue = (prefix: string, origin: string, count: number, ageSeconds: number) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
    INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
      event_rkey, event_operation, target_url, signing_mode, fingerprint, origin, next_attempt_at)
    SELECT ${prefix} || g, 'ev' || ${prefix} || g, 'did:plc:owner', 'wh', 'direct', 'did:plc:author',
      'app.bsky.feed.post', 'r' || g, 'create', ${origin} || '/hook', 'none', 'fp', ${origin},
      now() - ${ageSeconds}::int * interval '1 second' + g * interval '1 millisecond'
    FROM generate_series(1, ${count}::int) g`)

const onStore = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  eff.pipe(Effect.scoped, Effect.provide(Layer.provideMerge(deliveryStoreSql, sqlStack())))

const originsOf = (rows: ReadonlyArray<{ readonly origin: string }>) => {
  const counts = new Map<string, number>()
  for (const r of rows) counts.set(r.origin, (counts.get(r.origin) ?? 0) + 1)
  return Object.fromEntries([...counts].sort(([a], [b]) => (a < b ? -1 : 1)))
}

describe("the claim under one origin's backlog (PostgreSQL)", () => {
  it.scopedLive(
    "more than SCAN_MAX older rows of a full origin: another origin's newer rows are claimed at once",
    () =>
      Effect.gen(function*() {
        yield* insertDue("a", A, SCAN_MAX + 1_000, 3_600)
        yield* insertDue("b", B, 5, 60)
        const store = yield* DeliveryStore
        const claim = yield* store.claim("w", 10, 60_000, { fullOrigins: [A], defaultRoom: 10 })
        expect(originsOf(claim.rows)).toEqual({ [B]: 5 })
        // B's rows are gone from the due set: the next claim walks, finds nothing to take, and says so
        const again = yield* store.claim("w", 10, 60_000, { fullOrigins: [A], defaultRoom: 10 })
        expect(again).toMatchObject({ rows: [], moreDue: false })
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "an origin with no room left and more rows than the candidate limit: the others get the rest of the claim, each within its room",
    () =>
      Effect.gen(function*() {
        yield* insertDue("a", A, 3_000, 3_600)
        yield* insertDue("b", B, 20, 60)
        yield* insertDue("c", "https://c.example", 2, 30)
        const store = yield* DeliveryStore
        const claim = yield* store.claim("w", 10, 60_000, {
          rooms: [{ origin: A, room: 2 }, { origin: B, room: 3 }],
          defaultRoom: 4
        })
        // A's two oldest, B's three (its room), C's two (under the default room of 4)
        expect(originsOf(claim.rows)).toEqual({ [A]: 2, [B]: 3, "https://c.example": 2 })
        expect(claim.rows.filter((r) => r.origin === A).map((r) => r.deliveryId)).toEqual(["a1", "a2"])
        expect(claim.rows.filter((r) => r.origin === B).map((r) => r.deliveryId).sort()).toEqual(["b1", "b2", "b3"])
        expect(claim.moreDue).toBe(true)
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "the walk never takes rows of an open origin, and reaches every origin in turn when there are more than it walks at once",
    () =>
      Effect.gen(function*() {
        yield* insertDue("a", A, SCAN_MAX + 500, 3_600)
        const others = ORIGIN_WALK_MAX + 16
        for (let i = 0; i < others; i++) {
          yield* insertDue(`o${i}_`, `https://o${String(i).padStart(3, "0")}.example`, 1, 60)
        }
        yield* insertDue("x", "https://open.example", 3, 60)
        const store = yield* DeliveryStore
        const options = { fullOrigins: [A], openOrigins: ["https://open.example"], defaultRoom: 10 }
        const seen = new Set<string>()
        let claims = 0
        while (seen.size < others && claims < 4) {
          claims++
          const claim = yield* store.claim("w", 1_000, 60_000, options)
          for (const r of claim.rows) {
            expect(r.origin).not.toBe(A)
            expect(r.origin).not.toBe("https://open.example")
            seen.add(r.origin)
          }
        }
        // the first walk stops after ORIGIN_WALK_MAX origins, the next goes on from there
        expect(seen.size).toBe(others)
        expect(claims).toBe(2)
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "a claim that is not short does not walk: the oldest rows are taken as before",
    () =>
      Effect.gen(function*() {
        yield* insertDue("a", A, 3, 3_600)
        yield* insertDue("b", B, 3, 60)
        const store = yield* DeliveryStore
        const claim = yield* store.claim("w", 4, 60_000, { defaultRoom: 10 })
        expect(claim.rows.map((r) => r.deliveryId)).toEqual(["a1", "a2", "a3", "b1"])
        expect(claim.moreDue).toBe(true)
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "one full origin and one other with room: every short claim walks to the other (the origin it walked last is walked again)",
    () =>
      Effect.gen(function*() {
        yield* insertDue("a", A, SCAN_MAX + 1_000, 3_600)
        yield* insertDue("b", B, 20, 60)
        const store = yield* DeliveryStore
        const got: Array<number> = []
        for (let i = 0; i < 4; i++) {
          const claim = yield* store.claim("w", 10, 60_000, { fullOrigins: [A], defaultRoom: 5 })
          got.push(claim.rows.length)
          for (const r of claim.rows) expect(r.origin).toBe(B)
        }
        // B has 20 due rows and a room of 5 at every claim (before: 5, 0, 5, 0)
        expect(got).toEqual([5, 5, 5, 5])
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "a claim whose mayWalk answers false (a stopping worker) ends after its first statement",
    () =>
      Effect.gen(function*() {
        yield* insertDue("a", A, SCAN_MAX + 1_000, 3_600)
        yield* insertDue("b", B, 5, 60)
        const store = yield* DeliveryStore
        const claim = yield* store.claim("w", 10, 60_000, { fullOrigins: [A], defaultRoom: 10, mayWalk: () => false })
        expect(claim.rows).toEqual([])
        // the same claim allowed to walk takes B's rows
        const walked = yield* store.claim("w", 10, 60_000, { fullOrigins: [A], defaultRoom: 10, mayWalk: () => true })
        expect(originsOf(walked.rows)).toEqual({ [B]: 5 })
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "a walk that fails after the window's rows were leased: those rows are returned with the failure, not left leased to nobody",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* insertDue("a", A, 3_000, 3_600)
        yield* insertDue("b", B, 20, 60)
        // only the walk takes B's rows (the window's candidates are A's): make leasing them fail
        yield* sql.unsafe(`CREATE FUNCTION claim_walk_fails() RETURNS trigger LANGUAGE plpgsql AS $$
          BEGIN
            IF NEW.origin = '${B}' AND NEW.status = 'leased' THEN RAISE EXCEPTION 'the walk fails'; END IF;
            RETURN NEW;
          END $$`)
        yield* sql.unsafe(
          `CREATE TRIGGER claim_walk_fails BEFORE UPDATE ON outbox FOR EACH ROW EXECUTE FUNCTION claim_walk_fails()`
        )
        const store = yield* DeliveryStore
        const options = { rooms: [{ origin: A, room: 2 }], defaultRoom: 4 }
        const claim = yield* store.claim("w", 10, 60_000, options)
        expect(claim.rows.map((r) => r.deliveryId)).toEqual(["a1", "a2"])
        expect(claim.failure?.op).toBe("delivery.claim")
        const leased = yield* sql<{ delivery_id: string; lease_token: string }>`
          SELECT delivery_id, lease_token FROM outbox WHERE status = 'leased' ORDER BY delivery_id`
        // the rows leased are exactly those handed over, under their returned tokens
        expect(leased.map((r) => [r.delivery_id, r.lease_token])).toEqual(
          claim.rows.map((r) => [r.deliveryId, r.leaseToken])
        )
        // the walk works again: the next claim takes B's rows
        yield* sql.unsafe(`DROP TRIGGER claim_walk_fails ON outbox`)
        const next = yield* store.claim("w", 10, 60_000, options)
        expect(next.failure).toBeUndefined()
        expect(originsOf(next.rows)).toEqual({ [A]: 2, [B]: 4 })
      }).pipe(onStore),
    60_000
  )

  it.scopedLive(
    "a worker: while a slow receiver holds its fill and 5,000 of its rows wait, other receivers' new rows are delivered",
    () =>
      Effect.gen(function*() {
        const slow = yield* receiver({ reply: () => "hang" })
        const healthy = yield* Effect.all(Array.from({ length: 5 }, () => receiver()))
        yield* run([
          whEv(plc(1), "slow", whRecordValue(`at://${plc(2)}`, { url: `${slow.url}/in` }), { rev: rev(1) }),
          ...healthy.map((rx, i) =>
            whEv(plc(1), `healthy${i}`, whRecordValue(`at://${plc(3)}`, { url: `${rx.url}/in` }), { rev: rev(1) })
          )
        ])
        yield* run([ev(plc(2), "app.bsky.feed.post", "s0", { rev: rev(10) })])
        yield* copyDueRows("slow", SCAN_MAX + 1_000)
        yield* startWorker()
        // the slow origin's four slots (DELIVERY_PER_ORIGIN_CONCURRENCY) hang on their requests
        yield* eventually("slow origin full", Effect.sync(() => slow.received.length), (n) => n === 4, 30_000)
        yield* run(
          Array.from({ length: 4 }, (_, i) => ev(plc(3), "app.bsky.feed.post", `h${i}`, { rev: rev(100 + i) }))
        )
        const wanted = 4 * healthy.length
        yield* eventually(
          "healthy rows delivered",
          countWhere("outbox", "webhook_rkey LIKE 'healthy%' AND status = 'delivered'"),
          (n) => n === wanted,
          20_000
        )
        expect(healthy.reduce((n, rx) => n + rx.received.length, 0)).toBe(wanted)
        // the slow origin was never given more than its fill
        expect(slow.received.length).toBe(4)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              DELIVERY_PER_ORIGIN_CONCURRENCY: "4",
              // the slow receiver's requests stay in flight for the whole test (30 s, the longest timeout)
              DELIVERY_TIMEOUT_MS: "30000",
              DELIVERY_CIRCUIT_THRESHOLD: "100"
            }
          })
        )
      ),
    120_000
  )
})
