/**
 * The heartbeat's renewals (Leases.renewAll) against a fake store, on the TestClock: a renewed lease
 * runs from when its statement was sent (the database's `now()`), so a slow renewal does not make
 * the worker believe its lease is younger than it is; once renewals have failed for 2/3 of a lease,
 * counted from there, the row's attempt is abandoned. Those 2/3 are measured on the monotonic clock,
 * so a step of the wall clock (NTP) cannot stretch them.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Fiber, FiberSet, TestClock } from "effect"
import type { ClaimedRow, DeliveryStoreShape } from "../../src/services/delivery/DeliveryStore.js"
import { heartbeatLoop, renewAll } from "../../src/services/delivery/Leases.js"
import { makeState, type RowEntry, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"

const LEASE_MS = 3_000

/**
 * A worker env (renewAll reads only these parts of it) over a store whose first renewal answers
 * `first` and every later one fails at once, and one held row whose attempt is running.
 */
const oneRunningRow = (first: (renewed: Set<string>) => Effect.Effect<Set<string>>, claimedAtMs: number) =>
  Effect.gen(function*() {
    const counter = { calls: 0 }
    const store = {
      heartbeatMany: (leases: ReadonlyArray<{ readonly token: string }>) => {
        counter.calls++
        return counter.calls === 1
          ? first(new Set(leases.map((l) => l.token)))
          : Effect.fail(new StoreError({ op: "delivery.heartbeat", code: "connection" }))
      }
    }
    const env = {
      state: makeState(),
      leaseMs: LEASE_MS,
      store: store as unknown as DeliveryStoreShape,
      log: RateLimitedLog.make(),
      rows: yield* FiberSet.make<void, never>()
    } as unknown as WorkerEnv
    const running = yield* Effect.fork(Effect.never)
    const entry: RowEntry = {
      row: { deliveryId: "d1", leaseToken: "t1" } as unknown as ClaimedRow,
      claimedAtMs,
      slot: { held: 1, active: 1 },
      renewedAt: 0,
      started: true,
      settling: false,
      fiber: running
    }
    env.state.entries.set("t1", entry)
    return { env, entry, running, counter }
  })

describe("Leases.renewAll", () => {
  it.scoped("a slow renewal counts from its start: failures then abandon the row 2/3 of a lease after it", () =>
    Effect.gen(function*() {
      // the first renewal answers after 1.5 s (renewed), every later one fails at once; one row, its attempt running
      const { counter, entry, env, running } = yield* oneRunningRow(
        (renewed) => Effect.as(Effect.sleep(Duration.millis(1_500)), renewed),
        0
      )

      // renewal sent at 0, answered at 1.5 s: the lease runs from 0
      const first = yield* Effect.fork(renewAll(env))
      yield* TestClock.adjust(Duration.millis(1_500))
      yield* Fiber.join(first)
      expect(entry.renewedAt).toBe(0)
      expect(entry.settling).toBe(false)

      // a failed renewal at 1.9 s: the lease (until 3 s) is not yet 2/3 spent
      yield* TestClock.adjust(Duration.millis(400))
      yield* renewAll(env)
      expect(entry.settling).toBe(false)

      // a failed renewal at 2 s: 2/3 of the lease since the last renewal was sent: abandoned
      yield* TestClock.adjust(Duration.millis(100))
      yield* renewAll(env)
      expect(entry.settling).toBe(true)
      const exit = yield* Fiber.await(running)
      expect(exit._tag).toBe("Failure")
      expect(counter.calls).toBe(3)
    }))

  it.scoped("failed renewals abandon the row 2/3 of a lease after the last renewal even when the wall clock steps back", () =>
    Effect.gen(function*() {
      // the wall clock (currentTimeMillis) and the monotonic one (currentTimeNanos) of this test
      let wallMs = 1_000_000
      let monoMs = 5_000
      const clock: Clock.Clock = {
        [Clock.ClockTypeId]: Clock.ClockTypeId,
        unsafeCurrentTimeMillis: () => wallMs,
        currentTimeMillis: Effect.sync(() => wallMs),
        unsafeCurrentTimeNanos: () => BigInt(monoMs) * 1_000_000n,
        currentTimeNanos: Effect.sync(() => BigInt(monoMs) * 1_000_000n),
        sleep: () => Effect.void
      }
      // the first renewal succeeds, every later one fails
      const { entry, env, running } = yield* oneRunningRow((renewed) => Effect.succeed(renewed), wallMs)
      // renewed now
      yield* Effect.withClock(renewAll(env), clock)
      expect(entry.settling).toBe(false)

      // 1.9 s later, with the wall clock stepped back by a minute: a failed renewal, not yet 2/3
      monoMs += 1_900
      wallMs -= 60_000
      yield* Effect.withClock(renewAll(env), clock)
      expect(entry.settling).toBe(false)

      // 2 s after the renewal (2/3 of the lease) by the monotonic clock: abandoned
      monoMs += 100
      wallMs += 100
      yield* Effect.withClock(renewAll(env), clock)
      expect(entry.settling).toBe(true)
      const exit = yield* Fiber.await(running)
      expect(exit._tag).toBe("Failure")
    }))

  it.scoped("the heartbeat renews every lease/3 (SPEC §4.1), and never a row whose settle is under way", () =>
    Effect.gen(function*() {
      const { counter, entry, env } = yield* oneRunningRow((renewed) => Effect.succeed(renewed), 0)
      const loop = yield* Effect.fork(heartbeatLoop(env))
      // lease 3 s: renewals at 1 s and 2 s
      yield* TestClock.adjust(Duration.millis(999))
      expect(counter.calls).toBe(0)
      yield* TestClock.adjust(Duration.millis(1))
      expect(counter.calls).toBe(1)
      yield* TestClock.adjust(Duration.millis(1_000))
      expect(counter.calls).toBe(2)
      // its settle under way: the row is not renewed (no statement at all with nothing else held)
      entry.settling = true
      yield* TestClock.adjust(Duration.millis(1_000))
      expect(counter.calls).toBe(2)
      yield* Fiber.interrupt(loop)
    }))
})
