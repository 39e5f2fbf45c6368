/**
 * One bad receiver must not stall the others (SPEC §4.1, §4.3), on real PostgreSQL:
 * - `park` moves an open origin's pending rows to the end of its cool-down in ONE statement,
 *   spends no attempt, leaves other rows alone and is idempotent; `unpark` makes them due again;
 * - with 10,000 due rows of an open-circuit origin ahead of them, a healthy origin's due rows are
 *   taken by the next claim;
 * - a worker with real HTTP receivers: once a hanging origin's circuit opens, no claim takes its rows
 *   any more, the healthy origins' rows enqueued after it are taken by the next claim and delivered,
 *   and the hanging origin's rows wait, pending, with their next attempt in the future;
 * - an origin that recovers: the rows parked while its probe ran are due again as soon as the probe
 *   succeeds (not at the probe's deadline), and are delivered without any attempt spent meanwhile.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Layer } from "effect"
import {
  DeliveryStore,
  layerSql as deliveryStoreSql,
  makeSql,
  PARK_CHUNK
} from "../../src/services/delivery/DeliveryStore.js"
import { shiftedClock } from "../support/shiftedClock.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { copyDueRows, countWhere, eventually, receiver, run, startWorker } from "./worker-support.js"

const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"
const NOISY = "https://noisy.example"
const HEALTHY = "https://healthy.example"

/** Outbox rows of one stored origin matching `where`. */
const originCount = (origin: string, where: string) => countWhere("outbox", `origin = '${origin}' AND ${where}`)

const onStoreStack = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  eff.pipe(Effect.scoped, Effect.provide(Layer.provideMerge(deliveryStoreSql, sqlStack())))

/** A noisy webhook (rkey `noisy`, watching BOB) and a healthy one (rkey `healthy`, watching CAROL). */
const twoWebhooks = (noisyUrl: string, healthyUrl: string) =>
  run([
    whEv(plc(1), "noisy", whRecordValue(`at://${BOB}`, { url: noisyUrl }), { rev: rev(1) }),
    whEv(plc(1), "healthy", whRecordValue(`at://${CAROL}`, { url: healthyUrl }), { rev: rev(1) })
  ])

describe("an open circuit costs the other origins nothing", () => {
  it.scopedLive(
    "park: all of an origin's due rows go to the cool-down end in one statement, no attempt spent",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const store = yield* DeliveryStore
        yield* twoWebhooks(`${NOISY}/hook`, `${HEALTHY}/hook`)
        yield* run([ev(BOB, POST, "n0", { rev: rev(10) }), ev(CAROL, POST, "h0", { rev: rev(11) })])
        yield* copyDueRows("noisy", PARK_CHUNK - 1)
        // rows that must not move: one leased, one already due after the cool-down, one of another origin
        yield* sql`UPDATE outbox SET attempt_count = 3, last_error_kind = 'timeout' WHERE delivery_id LIKE '%c7'`
        // (ids `…_z1`, `…_z2` sort after the others)
        yield* copyDueRows("noisy", 2, "z")
        yield* sql`UPDATE outbox SET status = 'leased', lease_token = 'x:y', leased_until = now() + interval '1 hour'
          WHERE delivery_id = (SELECT delivery_id FROM outbox WHERE origin = ${NOISY} ORDER BY delivery_id DESC LIMIT 1)`
        yield* sql`UPDATE outbox SET next_attempt_at = now() + interval '2 hours'
          WHERE delivery_id = (SELECT delivery_id FROM outbox WHERE origin = ${NOISY} AND status = 'pending'
            ORDER BY delivery_id DESC LIMIT 1)`
        expect(yield* originCount(NOISY, "status = 'pending' AND next_attempt_at <= now()")).toBe(PARK_CHUNK)
        const attemptsBefore = yield* originCount(NOISY, "attempt_count = 3 AND last_error_kind = 'timeout'")
        expect(attemptsBefore).toBeGreaterThan(0)

        const untilMs = (yield* Clock.currentTimeMillis) + 60_000
        // ONE statement moves them all
        expect(yield* store.park([{ origin: NOISY, untilMs }])).toBe(PARK_CHUNK)
        expect(yield* originCount(NOISY, "status = 'pending' AND next_attempt_at <= now()")).toBe(0)
        // exactly to the cool-down end (the worker's clock, ms), with no attempt spent
        expect(
          yield* originCount(
            NOISY,
            `status = 'pending' AND next_attempt_at = to_timestamp(${untilMs}::float8 / 1000)`
          )
        ).toBe(PARK_CHUNK)
        expect(yield* countWhere("delivery_attempts", "true")).toBe(0)
        expect(yield* originCount(NOISY, "attempt_count = 3 AND last_error_kind = 'timeout'")).toBe(attemptsBefore)
        expect(yield* originCount(NOISY, "attempt_count = 0 AND last_error_kind IS NULL")).toBe(
          PARK_CHUNK + 2 - attemptsBefore
        )
        // the others did not move
        expect(yield* originCount(NOISY, "status = 'leased' AND lease_token = 'x:y'")).toBe(1)
        expect(yield* originCount(NOISY, "next_attempt_at > now() + interval '90 minutes'")).toBe(1)
        expect(yield* originCount(HEALTHY, "status = 'pending' AND next_attempt_at <= now()")).toBe(1)
        // idempotent: a second pass (another worker's, say) moves nothing
        expect(yield* store.park([{ origin: NOISY, untilMs }])).toBe(0)
        // a later cool-down end moves them again; unpark (the origin recovered) makes them due now
        expect(yield* store.park([{ origin: NOISY, untilMs: untilMs + 1_000 }])).toBe(PARK_CHUNK)
        expect(yield* store.unpark([{ origin: NOISY, untilMs }])).toBe(0)
        expect(yield* store.unpark([{ origin: NOISY, untilMs: untilMs + 1_000 }])).toBe(PARK_CHUNK)
        expect(yield* originCount(NOISY, "status = 'pending' AND next_attempt_at <= now()")).toBe(PARK_CHUNK)
        expect(yield* originCount(NOISY, "next_attempt_at > now() + interval '90 minutes'")).toBe(1)
      }).pipe(onStoreStack),
    120_000
  )

  it.scopedLive(
    "park under a machine clock 2 min behind or ahead of the database's: the rows go to the cool-down end by the database's clock",
    () =>
      Effect.gen(function*() {
        yield* twoWebhooks(`${NOISY}/hook`, `${HEALTHY}/hook`)
        yield* run([ev(BOB, POST, "n0", { rev: rev(10) })])
        yield* copyDueRows("noisy", 99)
        const due = originCount(NOISY, "status = 'pending' AND next_attempt_at <= now()")
        expect(yield* due).toBe(100)
        for (const skewMs of [-120_000, 120_000]) {
          // a worker process (its own store) whose machine clock is off by skewMs
          const store = yield* makeSql
          const onItsClock = <A, E, R>(eff: Effect.Effect<A, E, R>) => Effect.withClock(eff, shiftedClock(skewMs))
          const untilMs = yield* onItsClock(Effect.map(Clock.currentTimeMillis, (now) => now + 60_000))
          expect([skewMs, yield* onItsClock(store.park([{ origin: NOISY, untilMs }]))]).toEqual([skewMs, 100])
          // out of the due set, for the 60 s of the cool-down by the database's clock (not 60 s − skew)
          expect([skewMs, yield* due]).toEqual([skewMs, 0])
          expect([
            skewMs,
            yield* originCount(
              NOISY,
              "next_attempt_at BETWEEN now() + interval '50 seconds' AND now() + interval '70 seconds'"
            )
          ]).toEqual([skewMs, 100])
          // the origin recovered: unpark (the same worker, the same clock) makes them due now
          expect([skewMs, yield* onItsClock(store.unpark([{ origin: NOISY, untilMs }]))]).toEqual([skewMs, 100])
          expect([skewMs, yield* due]).toEqual([skewMs, 100])
        }
      }).pipe(onStoreStack),
    120_000
  )

  it.scopedLive(
    "with 10,000 due rows of an open-circuit origin ahead of them, the next claim takes the healthy rows",
    () =>
      Effect.gen(function*() {
        const store = yield* DeliveryStore
        yield* twoWebhooks(`${NOISY}/hook`, `${HEALTHY}/hook`)
        yield* run([ev(BOB, POST, "n0", { rev: rev(10) })])
        yield* copyDueRows("noisy", 9_999)
        yield* run(Array.from({ length: 20 }, (_, i) => ev(CAROL, POST, `h${i}`, { rev: rev(100 + i) })))
        expect(yield* originCount(NOISY, "status = 'pending' AND next_attempt_at <= now()")).toBe(10_000)
        // what the worker does when the circuit opens: park the origin, and claim without it
        const untilMs = (yield* Clock.currentTimeMillis) + 60_000
        expect(yield* store.park([{ origin: NOISY, untilMs }])).toBe(10_000)
        const claimed = yield* store.claim("w", 256, 60_000, { defaultRoom: 32, openOrigins: [NOISY] })
        expect(claimed.rows.map((r) => r.origin)).toEqual(Array.from({ length: 20 }, () => HEALTHY))
        // rows of the open origin that became due since the park are not claimed either
        yield* run([ev(BOB, POST, "n1", { rev: rev(200) })])
        const again = yield* store.claim("w", 256, 60_000, { defaultRoom: 32, openOrigins: [NOISY] })
        expect(again.rows).toEqual([])
        expect(yield* originCount(NOISY, "status = 'leased'")).toBe(0)
      }).pipe(onStoreStack),
    120_000
  )

  it.scopedLive(
    "a worker: once a hanging origin's circuit opens, healthy rows are taken by the next claim and delivered",
    () =>
      Effect.gen(function*() {
        const hanging = yield* receiver({ reply: () => "hang" })
        const healthy = yield* Effect.all(Array.from({ length: 5 }, () => receiver()))
        yield* run([
          whEv(plc(1), "noisy", whRecordValue(`at://${BOB}`, { url: `${hanging.url}/in` }), { rev: rev(1) }),
          ...healthy.map((rx, i) =>
            whEv(plc(1), `healthy${i}`, whRecordValue(`at://${CAROL}`, { url: `${rx.url}/in` }), { rev: rev(1) })
          )
        ])
        yield* run([ev(BOB, POST, "n0", { rev: rev(10) })])
        yield* copyDueRows("noisy", 9_999)
        const noisyOrigin = hanging.url

        // every claim, with whether it started after the circuit was seen open
        const state = { open: false }
        const claims: Array<{ readonly afterOpen: boolean; readonly origins: ReadonlyArray<string> }> = []
        const recording = Layer.scoped(
          DeliveryStore,
          Effect.map(makeSql, (s) => ({
            ...s,
            claim: (...args: Parameters<typeof s.claim>) => {
              const afterOpen = state.open
              return Effect.tap(s.claim(...args), (r) =>
                Effect.sync(() => {
                  claims.push({ afterOpen, origins: r.rows.map((row) => row.origin) })
                }))
            }
          }))
        )
        const worker = yield* startWorker({ store: recording })
        // the hanging origin's requests time out (3 s) until its circuit opens (3 in a row)
        yield* eventually("circuit open", worker.delivery.stats, (s) => s.openCircuits === 1, 60_000)
        state.open = true
        const before = claims.length
        yield* run(Array.from({ length: 4 }, (_, i) => ev(CAROL, POST, `h${i}`, { rev: rev(100 + i) })))
        const wanted = 4 * healthy.length
        // the first claim after the enqueue that took anything took all the healthy rows, and only them
        const firstTaking = () => claims.slice(before).find((c) => c.afterOpen && c.origins.length > 0)
        yield* eventually("a claim took rows", Effect.sync(firstTaking), (c) => c !== undefined, 60_000)
        const first = firstTaking()?.origins ?? []
        expect(first.filter((o) => o === noisyOrigin)).toEqual([])
        expect(first.length).toBe(wanted)
        yield* eventually(
          "healthy rows delivered",
          countWhere("outbox", "webhook_rkey LIKE 'healthy%' AND status = 'delivered'"),
          (n) => n === wanted,
          60_000
        )
        // every healthy delivery reached its receiver; a request is repeated (same id) only when a
        // stall of the loaded test process outlasts its timeout while the in-process receiver
        // answers (at-least-once; the transport reads an answer already waiting before it expires)
        const ids = healthy.flatMap((rx, i) => rx.received.map((r) => `${i}:${r.headers["idempotency-key"]}`))
        expect(new Set(ids).size).toBe(wanted)
        // its 10,000 rows left the due set in bulk (the timed-out ones once their retry was due)
        yield* eventually(
          "noisy rows parked",
          originCount(noisyOrigin, "status = 'pending' AND next_attempt_at <= now()"),
          (n) => n === 0,
          60_000
        )
        // no claim that started after the circuit opened took a row of the open origin
        const late = claims.filter((c) => c.afterOpen)
        expect(late.flatMap((c) => c.origins).filter((o) => o === noisyOrigin)).toEqual([])
        // the hanging origin's rows wait, pending, due at the end of the cool-down
        expect(yield* originCount(noisyOrigin, "true")).toBe(10_000)
        expect(yield* originCount(noisyOrigin, "status = 'pending' AND next_attempt_at > now() + interval '5 minutes'"))
          .toBe(10_000 - (yield* originCount(noisyOrigin, "status = 'leased'")))
        expect(yield* originCount(noisyOrigin, "status = 'leased'")).toBeLessThanOrEqual(4)
        const stats = yield* worker.delivery.stats
        // all but the rows the worker held when it opened (8 × 4 per origin: deferred one by one)
        expect(stats.parkedRows).toBeGreaterThanOrEqual(10_000 - 32)
        // attempts were spent only by the requests sent before the circuit opened (counted once the
        // ones still hanging when it opened have timed out and settled: received, not yet counted)
        yield* eventually("in-flight attempts settled", originCount(noisyOrigin, "status = 'leased'"), (n) =>
          n === 0, 60_000)
        expect(yield* originCount(noisyOrigin, "attempt_count > 0")).toBe(hanging.received.length)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              DELIVERY_PER_ORIGIN_CONCURRENCY: "4",
              // short enough for the hanging origin to open soon, long enough for a healthy receiver
              // on a loaded machine not to time out 3 times in a row
              DELIVERY_TIMEOUT_MS: "3000",
              DELIVERY_RETRY_BASE_MS: "100",
              DELIVERY_CIRCUIT_THRESHOLD: "3",
              DELIVERY_CIRCUIT_COOLDOWN_MS: "600000"
            }
          })
        )
      ),
    180_000
  )

  it.scopedLive(
    "an origin that recovers: rows parked during its probe are delivered as soon as the probe succeeds",
    () =>
      Effect.gen(function*() {
        let requests = 0
        // three 503s open the circuit (threshold 3); the probe after the 1 s cool-down answers 200
        // after 3 s (the mover parks the rest until the probe's deadline meanwhile); then 200s
        const rx = yield* receiver({
          reply: () => {
            requests++
            return requests <= 3 ? { status: 503 } : requests === 4 ? { status: 200, delayMs: 3_000 } : { status: 200 }
          }
        })
        yield* run([whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        yield* run(Array.from({ length: 50 }, (_, i) => ev(BOB, POST, `p${i}`, { rev: rev(10 + i) })))
        const worker = yield* startWorker()
        // the probe's deadline is 60 s away: the rows parked to it are delivered well before
        yield* eventually("all delivered", countWhere("outbox", "status = 'delivered'"), (n) => n === 50, 40_000)
        const stats = yield* worker.delivery.stats
        expect(stats.parkedRows).toBeGreaterThan(0)
        expect(stats.unparkedRows).toBeGreaterThan(0)
        expect(stats.openCircuits).toBe(0)
        // attempts were spent only by requests: none while parked
        const spent = yield* Effect.flatMap(
          SqlClient.SqlClient,
          (sql) => sql<{ n: number }>`SELECT sum(attempt_count)::int AS n FROM outbox`
        ).pipe(Effect.orDie)
        expect(Number(spent[0]?.n)).toBe(rx.received.length)
        expect(rx.received.length).toBe(53)
      }).pipe(
        Effect.scoped,
        Effect.provide(
          sqlStack({
            env: {
              WEBHOOK_ALLOW_INSECURE_DEV: "1",
              DELIVERY_PER_ORIGIN_CONCURRENCY: "1",
              DELIVERY_TIMEOUT_MS: "10000",
              DELIVERY_RETRY_BASE_MS: "100",
              DELIVERY_CIRCUIT_THRESHOLD: "3",
              DELIVERY_CIRCUIT_COOLDOWN_MS: "1000"
            }
          })
        )
      ),
    120_000
  )
})
