/**
 * Policy audit (SPEC §4.3 auto-disable and parking), on PostgreSQL: the edges of the webhook
 * state recorder (WebhookHealthSql.ts) driven directly with settle batches, as in
 * worker.auto-disable.test.ts ("a 2xx and later failures in one settle batch"):
 * - a 2xx ends the failure streak: the period restarts at the first failure after it;
 * - a batch holding a 2xx never auto-disables, whatever the streak before it;
 * - the streak starts at the earliest failure of a batch, whatever the batch order;
 * - the success throttle never hides a 2xx that follows a failure;
 * - firehook's own failures do not feed the streak;
 * - auto-disable is a one-time transition: later failures keep its time;
 * - parked and dropped rows are counted apart;
 * - the latest 2xx and the latest failure are kept when another process reports older ones.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Queue } from "effect"
import * as Admission from "../../src/services/delivery/Admission.js"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import * as DeliveryStore from "../../src/services/delivery/DeliveryStore.js"
import type { AttemptRecord, ClaimedRow } from "../../src/services/delivery/DeliveryStore.js"
import { makeParkClock } from "../../src/services/delivery/ParkSql.js"
import { Crashed } from "../../src/services/delivery/Settlement.js"
import { CRASH_LIMIT, judgeSuspect, SUSPECTS_HELD } from "../../src/services/delivery/Suspects.js"
import { AUTO_DISABLE_MIN_FAILURES, makeRecorder } from "../../src/services/delivery/WebhookHealthSql.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import { shiftedClock } from "../support/shiftedClock.js"
import { plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { run } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const RKEY = "hook"
const DAY = 86_400_000
const AFTER_MS = 5 * DAY
const T0 = Date.UTC(2026, 0, 1)

/** The webhook's state columns as epoch ms (null when unset). */
interface State {
  readonly auto_ms: number | null
  readonly failing_ms: number | null
  readonly failed_attempts: number
  readonly success_ms: number | null
  readonly failure_ms: number | null
  readonly failure_kind: string | null
  readonly failure_http: number | null
  readonly parked: number
  readonly parked_dropped: number
}

const epochMs = (column: string) => `(extract(epoch FROM ${column}) * 1000)::float8`

const readState = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<State>`
    SELECT ${sql.literal(epochMs("auto_disabled_at"))} AS auto_ms, ${
    sql.literal(epochMs("failing_since"))
  } AS failing_ms,
      failed_attempts, ${sql.literal(epochMs("last_success_at"))} AS success_ms,
      ${sql.literal(epochMs("last_failure_at"))} AS failure_ms, last_failure_kind AS failure_kind,
      last_failure_http AS failure_http, parked, parked_dropped::int AS parked_dropped
    FROM webhooks WHERE owner_did = ${OWNER} AND rkey = ${RKEY}`).pipe(
    Effect.map((rows) => rows[0]),
    Effect.orDie
  )

/** What one settled row reports: an HTTP status, a firehook failure kind, or a park. */
type Report =
  | { readonly at: number; readonly status: number }
  | { readonly at: number; readonly kind: string }
  | { readonly park: "dead_letter" | "cancelled" }

let tokens = 0

/**
 * Registers the webhook and answers a function that records one settle batch through `recorder`
 * (one per process: each has its own success throttle), the attempts taking no time.
 */
const setup = Effect.gen(function*() {
  yield* run([whEv(OWNER, RKEY, whRecordValue(`at://${BOB}`, { url: "https://hook.example/h" }), { rev: rev(1) })])
  const sql = yield* SqlClient.SqlClient
  const [hook] = yield* sql<{ fingerprint: string }>`
    SELECT fingerprint FROM webhooks WHERE owner_did = ${OWNER} AND rkey = ${RKEY}`
  const fingerprint = hook?.fingerprint ?? ""
  expect(fingerprint).not.toBe("")
  const recorder = () => {
    const record = makeRecorder(sql, AFTER_MS)
    return (reports: ReadonlyArray<Report>) => {
      const items = reports.map((r) => {
        const token = `t${++tokens}`
        if ("park" in r) return { token, park: true, attempt: undefined, status: r.park }
        const ok = "status" in r && r.status < 300
        const attempt: AttemptRecord = {
          startedAtMs: r.at,
          durationMs: 0,
          outcome: ok ? "delivered" : "retry",
          errorKind: "status" in r ? (ok ? undefined : r.status >= 500 ? "http_5xx" : "http_4xx") : r.kind,
          httpStatus: "status" in r ? r.status : undefined,
          responseExcerpt: undefined
        }
        return { token, park: false, attempt, status: "pending" }
      })
      const applied = items.map((i) => ({
        lease_token: i.token,
        owner_did: OWNER,
        webhook_rkey: RKEY,
        fingerprint,
        status: i.status
      }))
      return record(items, applied)
    }
  }
  return recorder
})

const failures = (n: number, at: number, status = 503): ReadonlyArray<Report> =>
  Array.from({ length: n }, (_, i) => ({ at: at + i, status }))

/** The store's SQL layer on a fresh migrated database, as worker.auto-disable.test.ts runs it. */
const onPostgres = <A, E, R>(eff: Effect.Effect<A, E, R>) =>
  eff.pipe(Effect.provide(DeliveryStore.layerSql), Effect.provide(sqlStack()))

describe("webhook state recorder: the edges of the auto-disable rule (SPEC §4.3)", () => {
  it.scoped(
    "a 2xx ends the streak: the period restarts at the first failure after it",
    () =>
      onPostgres(Effect.gen(function*() {
        const record = (yield* setup)()
        yield* record([{ at: T0, status: 503 }])
        yield* record([{ at: T0 + DAY, status: 200 }])
        expect(yield* readState).toMatchObject({ failing_ms: null, failed_attempts: 0, success_ms: T0 + DAY })
        // 5 days after the first failure, but only 20 failures after the 2xx, all within a second
        const late = T0 + AFTER_MS + 3_600_000
        yield* record(failures(AUTO_DISABLE_MIN_FAILURES, late))
        expect(yield* readState).toMatchObject({ auto_ms: null, failing_ms: late, failed_attempts: 20 })
      })),
    60_000
  )

  it.scoped(
    "a batch that holds a 2xx never auto-disables, whatever the streak before it",
    () =>
      onPostgres(Effect.gen(function*() {
        const record = (yield* setup)()
        yield* record(failures(AUTO_DISABLE_MIN_FAILURES - 1, T0))
        const later = T0 + AFTER_MS + DAY
        yield* record([{ at: later, status: 503 }, { at: later + 1, status: 200 }, { at: later + 2, status: 503 }])
        expect(yield* readState).toMatchObject({ auto_ms: null, failing_ms: later + 2, failed_attempts: 1 })
      })),
    60_000
  )

  it.scoped(
    "the streak starts at the earliest failure of a batch, whatever the batch order",
    () =>
      onPostgres(Effect.gen(function*() {
        const record = (yield* setup)()
        yield* record([{ at: T0 + 5_000, status: 503 }, { at: T0, status: 502 }, { at: T0 + 2_000, status: 504 }])
        expect(yield* readState).toMatchObject({
          failing_ms: T0,
          failed_attempts: 3,
          failure_ms: T0 + 5_000,
          failure_http: 503
        })
      })),
    60_000
  )

  it.scoped("the success throttle never hides a 2xx that follows a failure", () =>
    onPostgres(Effect.gen(function*() {
      const record = (yield* setup)()
      yield* record([{ at: T0, status: 200 }])
      yield* record([{ at: T0 + 10_000, status: 503 }])
      // within the minute of the last written 2xx, but after a failure: written, the streak ends
      yield* record([{ at: T0 + 20_000, status: 200 }])
      expect(yield* readState).toMatchObject({ failing_ms: null, failed_attempts: 0, success_ms: T0 + 20_000 })
    })), 60_000)

  it.scoped(
    "firehook's own failures (secret, subscription, transform) do not feed the streak",
    () =>
      onPostgres(Effect.gen(function*() {
        const record = (yield* setup)()
        yield* record([
          { at: T0, kind: "secret_unavailable" },
          { at: T0 + 1, kind: "subscription_unavailable" },
          { at: T0 + 2, kind: "transform_failed" }
        ])
        expect(yield* readState).toMatchObject({ failing_ms: null, failed_attempts: 0, failure_kind: null })
        yield* record([{ at: T0 + 3, kind: "timeout" }])
        expect(yield* readState).toMatchObject({ failing_ms: T0 + 3, failed_attempts: 1, failure_kind: "timeout" })
      })),
    60_000
  )

  it.scoped(
    "auto-disable is a one-time transition: later failures keep its time",
    () =>
      onPostgres(Effect.gen(function*() {
        const record = (yield* setup)()
        yield* record([{ at: T0, status: 503 }])
        yield* record(failures(AUTO_DISABLE_MIN_FAILURES - 1, T0 + AFTER_MS))
        const disabledAt = T0 + AFTER_MS + AUTO_DISABLE_MIN_FAILURES - 2
        expect(yield* readState).toMatchObject({ auto_ms: disabledAt, failed_attempts: 20 })
        yield* record([{ at: T0 + AFTER_MS + DAY, status: 503 }])
        expect(yield* readState).toMatchObject({ auto_ms: disabledAt, failed_attempts: 21 })
      })),
    60_000
  )

  it.scoped("parked rows and rows dropped beyond the bound are counted apart", () =>
    onPostgres(Effect.gen(function*() {
      const record = (yield* setup)()
      yield* record([{ park: "dead_letter" }, { park: "dead_letter" }, { park: "cancelled" }])
      expect(yield* readState).toMatchObject({ parked: 2, parked_dropped: 1, failed_attempts: 0 })
    })), 60_000)

  it.scoped(
    "another process's older 2xx or failure never replaces the latest one",
    () =>
      onPostgres(Effect.gen(function*() {
        const recorder = yield* setup
        const a = recorder()
        const b = recorder()
        yield* a([{ at: T0 + 120_000, status: 200 }])
        yield* b([{ at: T0, status: 200 }])
        expect(yield* readState).toMatchObject({ success_ms: T0 + 120_000 })
        yield* a([{ at: T0 + 200_000, status: 404 }])
        yield* b([{ at: T0 + 150_000, status: 503 }])
        expect(yield* readState).toMatchObject({
          failure_ms: T0 + 200_000,
          failure_kind: "http_4xx",
          failure_http: 404
        })
      })),
    60_000
  )
})

/**
 * Admission (SPEC §4.1) as synchronous bookkeeping, in process: rows dispatched into a fresh worker
 * state, started by `pumpNow` with a `runInRows` that only counts the started rows (their attempt
 * never runs), and the room the next claim is given.
 */
describe("admission: slots, origin caps and the suspects' room", () => {
  const admissionEnv = (o: { concurrency: number; perOrigin: number; perOriginHold: number }) =>
    Effect.gen(function*() {
      const base = {
        ...o,
        state: makeState(),
        breaker: makeCircuitBreaker(),
        clock: yield* Effect.clock,
        snapshotMaxAgeMs: 0,
        traced: false,
        wake: yield* Queue.sliding<void>(1),
        runInRows: () => Effect.runFork(Effect.void)
      }
      const env = base as unknown as WorkerEnv
      /** a fresh row, or a reclaimed one (a suspect: counted before unless `crashCount` says 0) */
      const row = (token: string, origin: string, reclaimed = false, crashCount = reclaimed ? 1 : 0) => {
        const r = { deliveryId: token, leaseToken: token, origin, reclaimed, crashCount } as unknown as ClaimedRow
        Admission.dispatch(env, r, 0, 0)
        return r
      }
      /** starts what may start; answers every started row, in claim order */
      const pump = () => {
        Admission.pumpNow(env)
        return [...env.state.entries.values()].filter((e) => e.started).map((e) => e.row.leaseToken)
      }
      return { env, row, pump }
    })

  it.effect("an origin never gets more than its cap of request slots; other origins' rows start meanwhile", () =>
    Effect.gen(function*() {
      const { pump, row } = yield* admissionEnv({ concurrency: 10, perOrigin: 2, perOriginHold: 8 })
      row("a1", "https://a.example")
      row("a2", "https://a.example")
      row("a3", "https://a.example")
      row("b1", "https://b.example")
      expect(pump()).toEqual(["a1", "a2", "b1"])
    }))

  it.effect("no more rows start than there are request slots", () =>
    Effect.gen(function*() {
      const { env, pump, row } = yield* admissionEnv({ concurrency: 2, perOrigin: 4, perOriginHold: 8 })
      row("a1", "https://a.example")
      row("b1", "https://b.example")
      row("c1", "https://c.example")
      expect(pump()).toEqual(["a1", "b1"])
      expect(env.state.inFlight).toBe(2)
    }))

  it.effect("a first reclaim's suspects (not counted yet) start at full concurrency and take none of the suspects' room", () =>
    Effect.gen(function*() {
      const { env, pump, row } = yield* admissionEnv({ concurrency: 10, perOrigin: 4, perOriginHold: 8 })
      row("s1", "https://a.example", true, 0)
      row("s2", "https://b.example", true, 0)
      row("s3", "https://c.example", true, -1)
      row("c1", "https://d.example", true, 1)
      row("c2", "https://e.example", true, 2)
      expect(pump()).toEqual(["s1", "s2", "s3", "c1"])
      expect(env.state.suspectsHeld).toBe(2)
      expect(Admission.claimOptions(env).reclaimRoom).toBe(SUSPECTS_HELD - 2)
    }))

  it.effect("suspects start one at a time; fresh rows are not held up by a waiting suspect", () =>
    Effect.gen(function*() {
      const { pump, row } = yield* admissionEnv({ concurrency: 10, perOrigin: 4, perOriginHold: 8 })
      row("s1", "https://a.example", true)
      row("s2", "https://b.example", true)
      row("f1", "https://c.example")
      expect(pump()).toEqual(["s1", "f1"])
    }))

  it.effect("the claim's room: per origin held, full origins apart, and the suspects' room freed as they go", () =>
    Effect.gen(function*() {
      const { env, row } = yield* admissionEnv({ concurrency: 10, perOrigin: 4, perOriginHold: 2 })
      row("a1", "https://a.example")
      row("a2", "https://a.example")
      row("b1", "https://b.example")
      const suspects = Array.from({ length: SUSPECTS_HELD }, (_, i) => row(`s${i}`, "https://s.example", true))
      const options = Admission.claimOptions(env)
      expect(options.fullOrigins).toEqual(["https://a.example", "https://s.example"])
      expect(options.rooms).toEqual([{ origin: "https://b.example", room: 1 }])
      expect(options.reclaimRoom).toBe(0)
      // one suspect settled: room for one more, and the origin's rows held go down
      const entry = env.state.entries.get(suspects[0]?.leaseToken ?? "")
      if (entry === undefined) return expect.fail("held")
      Admission.forgetNow(env, entry)
      expect(Admission.claimOptions(env).reclaimRoom).toBe(1)
      expect(env.state.held).toBe(2 + 1 + SUSPECTS_HELD - 1)
      // an origin's last row gone: the origin is not kept (the map holds only origins with rows)
      const b1 = env.state.entries.get("b1")
      if (b1 === undefined) return expect.fail("held")
      Admission.forgetNow(env, b1)
      expect([...env.state.origins.keys()]).toEqual(["https://a.example", "https://s.example"])
    }))
})

describe("the park clock: cool-down ends carried to the database's clock (ParkSql.makeParkClock)", () => {
  const origins = [{ origin: "https://a.example", untilMs: T0 }]

  it.scoped("an offset under the 1 s tolerance is taken as none: the ends are passed unchanged", () =>
    onPostgres(Effect.gen(function*() {
      const clock = makeParkClock(yield* SqlClient.SqlClient)
      // a machine 500 ms behind the database: measurement noise, not a skew to correct
      expect(yield* Effect.withClock(clock.shift(origins), shiftedClock(-500))).toEqual(origins)
    })))

  it.scoped("a machine 5 s behind the database: the ends move 5 s later", () =>
    onPostgres(Effect.gen(function*() {
      const clock = makeParkClock(yield* SqlClient.SqlClient)
      const [shifted] = yield* Effect.withClock(clock.shift(origins), shiftedClock(-5_000))
      expect(Math.abs((shifted?.untilMs ?? 0) - T0 - 5_000)).toBeLessThan(500)
    })))
})

describe("crash suspects: the limit (Suspects.judgeSuspect)", () => {
  it("a suspect is attempted up to CRASH_LIMIT counts and dead-lettered `crashed` only beyond", () => {
    expect(CRASH_LIMIT).toBe(2)
    expect(judgeSuspect(1)).toBeUndefined()
    expect(judgeSuspect(CRASH_LIMIT)).toBeUndefined()
    expect(judgeSuspect(CRASH_LIMIT + 1)).toEqual(Crashed({ crashes: CRASH_LIMIT + 1 }))
  })
})
