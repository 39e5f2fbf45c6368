/**
 * Settles through a database outage (Settlement.ts over the settle batcher, SettleBatcher.ts), on
 * the TestClock: a settle that failed because the database could not be reached is queued again,
 * with a backoff capped at 2 s, until the row's lease (as the worker last renewed it) ends; before
 * this, one that still failed after the batcher's retries (0.7 s) left its row leased, and the row
 * was sent again once the lease expired although its receiver had answered. A timed-out statement
 * is run again too; a statement the database refused is not; a store that closes ends it at once.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Exit, Fiber, Option, Scope, TestClock } from "effect"
import type { ClaimedRow, DeliveryStoreShape } from "../../src/services/delivery/DeliveryStore.js"
import { SETTLE_RETRIES } from "../../src/services/delivery/DeliveryStore.js"
import type { AuditEvent, PublisherShape } from "../../src/services/delivery/Publisher.js"
import { makeSettleBatcher } from "../../src/services/delivery/SettleBatcher.js"
import { Deliver, isOutage, settle } from "../../src/services/delivery/Settlement.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"
import { captureLogs } from "../support/captureLogs.js"
import { settle as letFibersRun } from "../support/settle.js"

const LEASE_MS = 60_000
const TOKEN = "worker-1:lease-1"

/** How the fake settle statement answers one run started at `atMs` (TestClock ms). */
type Answer = "apply" | { readonly code: string; readonly afterMs?: number }

/**
 * A settle statement behind the real batcher: each run answers `answer(start)` (failing with its
 * code, after `afterMs` when given, or applying every settle of its batch); records each run's start.
 */
const statement = (answer: (atMs: number) => Answer) => {
  const starts: Array<number> = []
  const appliedAt: Array<number> = []
  const run = (items: ReadonlyArray<{ readonly token: string }>) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      starts.push(now)
      const a = answer(now)
      if (a === "apply") {
        appliedAt.push(now)
        return Effect.succeed(items.map((i) => ({ lease_token: i.token })))
      }
      const fail = Effect.fail(new StoreError({ op: "delivery.settle", code: a.code }))
      return a.afterMs === undefined ? fail : Effect.zipRight(Effect.sleep(Duration.millis(a.afterMs)), fail)
    })
  return { run, starts, appliedAt }
}

const row = {
  deliveryId: "d1",
  eventId: "e1",
  ownerDid: "did:plc:owner",
  webhookRkey: "w",
  eventDid: "did:plc:author",
  eventCollection: "app.bsky.feed.post",
  eventRkey: "p1",
  eventOperation: "create",
  leaseToken: TOKEN,
  attemptCount: 0,
  origin: "https://receiver.example"
} as unknown as ClaimedRow

/**
 * A worker env (the settle path reads only these parts of it) whose store settles through a batcher
 * over `run` (in the scope given), holding `row` with its lease last renewed at `renewedAt`
 * (monotonic ms, the TestClock's).
 */
const envWith = (
  run: ReturnType<typeof statement>["run"],
  renewedAt: number,
  scope: Scope.Scope
) =>
  Effect.gen(function*() {
    const settleOne = yield* Scope.extend(makeSettleBatcher(run), scope)
    const published: Array<AuditEvent["status"]> = []
    const publisher: PublisherShape = {
      publish: (e) => Effect.sync(() => void published.push(e.status)),
      stats: Effect.succeed({ configured: false, connected: false, dropped: 0, published: 0 })
    }
    const store = {
      markDelivered: (_: string, token: string) => settleOne({ token })
    } as unknown as DeliveryStoreShape
    const env = {
      state: makeState(),
      leaseMs: LEASE_MS,
      store,
      publisher,
      outcomes: Option.none(),
      clock: yield* Effect.clock,
      log: RateLimitedLog.make()
    } as unknown as WorkerEnv
    env.state.entries.set(TOKEN, {
      row,
      claimedAtMs: renewedAt,
      slot: { held: 1, active: 0 },
      renewedAt,
      started: true,
      settling: true,
      fiber: undefined
    })
    return { env, published }
  })

const delivered = Deliver({
  httpStatus: 200,
  attempt: {
    startedAtMs: 0,
    durationMs: 5,
    outcome: "delivered",
    errorKind: undefined,
    httpStatus: 200,
    responseExcerpt: undefined
  }
})

/** Move the TestClock 100 ms, and let the fibers run up to their next wait. */
const tick = Effect.zipRight(TestClock.adjust(Duration.millis(100)), letFibersRun)

/**
 * Settle the row as delivered in a fiber; move the TestClock 100 ms at a time for `forMs`. Answers
 * the fiber and when (TestClock ms, to the tick) it was seen done.
 */
const settleFor = (env: WorkerEnv, forMs: number) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.fork(settle(env, row, delivered))
    yield* letFibersRun
    let doneAt: number | undefined
    for (let t = 0; t < forMs; t += 100) {
      if (doneAt === undefined && Option.isSome(yield* Fiber.poll(fiber))) doneAt = yield* Clock.currentTimeMillis
      yield* tick
    }
    if (doneAt === undefined && Option.isSome(yield* Fiber.poll(fiber))) doneAt = yield* Clock.currentTimeMillis
    return { fiber, doneAt }
  })

/** The largest gap between two consecutive runs of the statement, ms. */
const largestGap = (starts: ReadonlyArray<number>): number =>
  starts.reduce((gap, t, i) => (i === 0 ? 0 : Math.max(gap, t - (starts[i - 1] ?? t))), 0)

describe("settles through a database outage", () => {
  it.scoped("a settle failing through a 5 s outage is run again and applied once the database is back", () =>
    Effect.gen(function*() {
      const stmt = statement((t) => (t < 5_000 ? { code: "connection_lost" } : "apply"))
      const { env, published } = yield* envWith(stmt.run, 0, yield* Effect.scope)
      const { doneAt } = yield* settleFor(env, 10_000)
      // applied by the first run after the outage, within the backoff's cap (2 s) of its end
      expect(stmt.appliedAt.length).toBe(1)
      expect(stmt.appliedAt[0]).toBeGreaterThanOrEqual(5_000)
      expect(stmt.appliedAt[0]).toBeLessThan(7_000)
      expect(doneAt).toBe(Math.ceil((stmt.appliedAt[0] ?? 0) / 100) * 100)
      // the outcome is published once, as for a settle that applied at once
      expect(published).toEqual(["delivered"])
      // run again many times, never more than 2 s apart (backoff doubling from 0.1 s, capped)
      expect(stmt.starts.length).toBeGreaterThan(1 + SETTLE_RETRIES)
      expect(largestGap(stmt.starts)).toBeLessThanOrEqual(2_000)
    }))

  it.scoped("it gives up when the row's lease, as last renewed, ends: the settle fails, its outcome unpublished", () =>
    Effect.gen(function*() {
      const { layer, lines } = yield* captureLogs
      const stmt = statement(() => ({ code: "ECONNREFUSED" }))
      // renewed 50 s before the settle: 10 s of the lease left
      const { env, published } = yield* envWith(stmt.run, -50_000, yield* Effect.scope)
      const { doneAt } = yield* settleFor(env, 15_000).pipe(Effect.provide(layer))
      expect(stmt.appliedAt).toEqual([])
      expect(published).toEqual([])
      // retried until close to the lease's end, and no run starts a new try after it
      const last = stmt.starts[stmt.starts.length - 1] ?? 0
      expect(last).toBeGreaterThan(8_000)
      expect(last).toBeLessThan(10_000 + 700)
      expect(doneAt).toBeDefined()
      expect(doneAt ?? Infinity).toBeLessThanOrEqual(11_000)
      // one warning that it was given up, with the delivery id and the code only
      const given = (yield* lines).filter((l) => l.includes("settle given up"))
      expect(given.length).toBe(1)
      expect(JSON.parse(given[0] ?? "{}")).toEqual({
        message: ["delivery settle given up: its row is attempted again after its lease"],
        annotations: { deliveryId: "d1", code: "ECONNREFUSED" }
      })
    }))

  it.scoped("a statement that timed out (15 s) is run again within the lease, and applies", () =>
    Effect.gen(function*() {
      // a failover that leaves the old server silent: the statement hangs until its bound
      const stmt = statement((t) => (t < 10_000 ? { code: "timeout", afterMs: 15_000 } : "apply"))
      const { env, published } = yield* envWith(stmt.run, 0, yield* Effect.scope)
      yield* settleFor(env, 20_000)
      // the batcher does not run a timed-out statement again; the settle path does, once
      expect(stmt.starts.length).toBe(2)
      expect(stmt.appliedAt.length).toBe(1)
      expect(stmt.appliedAt[0]).toBeGreaterThanOrEqual(15_000)
      expect(stmt.appliedAt[0]).toBeLessThan(15_200)
      expect(published).toEqual(["delivered"])
    }))

  it.scoped("a statement the database refused is not run again beyond the batcher's retries", () =>
    Effect.gen(function*() {
      const stmt = statement(() => ({ code: "22P02" }))
      const { env, published } = yield* envWith(stmt.run, 0, yield* Effect.scope)
      const { doneAt } = yield* settleFor(env, 5_000)
      expect(stmt.starts.length).toBe(1 + SETTLE_RETRIES)
      expect(doneAt).toBe(700)
      expect(published).toEqual([])
    }))

  it.scoped("a settle still retrying when the store closes ends at once (shutdown), with no more statements", () =>
    Effect.gen(function*() {
      const stmt = statement(() => ({ code: "57P01" }))
      const storeScope = yield* Scope.make()
      const { env, published } = yield* envWith(stmt.run, 0, storeScope)
      const fiber = yield* Effect.fork(settle(env, row, delivered))
      yield* letFibersRun
      for (let t = 0; t < 3_000; t += 100) yield* tick
      expect(Option.isNone(yield* Fiber.poll(fiber))).toBe(true)
      yield* Scope.close(storeScope, Exit.void)
      const runs = stmt.starts.length
      for (let t = 0; t < 2_100; t += 100) yield* tick
      // ended by the store's close (the next try is answered `shutdown`), not by the lease (60 s)
      expect(Option.isSome(yield* Fiber.poll(fiber))).toBe(true)
      expect(stmt.starts.length).toBe(runs)
      expect(published).toEqual([])
    }))

  it("what counts as an outage", () => {
    const outage = (code: string) => isOutage(new StoreError({ op: "delivery.settle", code }))
    for (
      const code of [
        "connection_lost",
        "timeout",
        "ECONNREFUSED",
        "ECONNRESET",
        "57P01",
        "57P03",
        "08006",
        "53300",
        "25006",
        // new connections refused while the operator changes the database (ALLOW_CONNECTIONS false,
        // a role or pg_hba.conf change): before stop 59 a 55000 gave the settle up at once
        "55000",
        "28000",
        "28P01"
      ]
    ) {
      expect([code, outage(code)]).toEqual([code, true])
    }
    for (
      const code of [
        "22P02",
        "23505",
        "40P01",
        "42P01",
        "55P03",
        "55006",
        "unknown",
        "defect",
        "shutdown",
        "connection_closed",
        "08"
      ]
    ) {
      expect([code, outage(code)]).toEqual([code, false])
    }
  })
})
