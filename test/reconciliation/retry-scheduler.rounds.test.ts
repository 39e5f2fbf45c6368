/**
 * RetryScheduler (SPEC §5.4) under TestClock with a fixed Random: the backoff Schedule's exact
 * delays and cap, the first round at start, owners with a reconciliation request (their own
 * budget; kept across a refused scan), attempt timing, the tracking bound, and success forgetting
 * the attempt count.
 * The store and the reconciler are fakes of their Tags (./retry-scheduler-support.ts).
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Clock, Deferred, Duration, Effect, Random, Schedule } from "effect"
import * as RetryScheduler from "../../src/services/reconciliation/RetryScheduler.js"
import { halfJitter } from "../support/halfJitter.js"
import { settle } from "../support/settle.js"
import { plc } from "../support/stack.js"
import { advance, callTimes, deps, fail, newWorld, scheduler } from "./retry-scheduler-support.js"

describe("retryBackoff (the Schedule)", () => {
  const delays = (random: Random.Random, n: number) =>
    Schedule.run(
      Schedule.delays(RetryScheduler.retryBackoff({ base: "5 seconds", cap: "1 hour" })),
      0,
      Array.from({ length: n }, () => undefined)
    ).pipe(
      Effect.map((c) => Chunk.toReadonlyArray(c).map(Duration.toMillis)),
      Effect.withRandom(random)
    )

  it.effect("full jitter: random × min(cap, 5 s × 2^n), exact with a fixed Random", () =>
    Effect.gen(function*() {
      expect(yield* delays(halfJitter, 14)).toEqual([
        2_500,
        5_000,
        10_000,
        20_000,
        40_000,
        80_000,
        160_000,
        320_000,
        640_000,
        1_280_000,
        // 5 s × 2^10 = 5,120 s > the 1 h cap: 0.5 × 3,600 s
        1_800_000,
        1_800_000,
        1_800_000,
        1_800_000
      ])
      expect(yield* delays(Random.fixed([0.999]), 12)).toEqual([
        4_995,
        9_990,
        19_980,
        39_960,
        79_920,
        159_840,
        319_680,
        639_360,
        1_278_720,
        2_557_440,
        3_596_400,
        3_596_400
      ])
    }))

  it.effect("at least 100 ms", () =>
    Effect.gen(function*() {
      expect(yield* delays(Random.fixed([0]), 3)).toEqual([100, 100, 100])
      expect(yield* delays(Random.fixed([0.01]), 3)).toEqual([100, 100, 200])
    }))
})

describe("RetryScheduler", () => {
  it.scoped("the first round runs at start: an owner failed before start is retried without waiting an interval", () => {
    const world = newWorld()
    const A = plc(1)
    fail(world, A)
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      // no clock adjustment: the round at start has tracked it
      expect(yield* Clock.currentTimeMillis).toBe(0)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      yield* advance(2_499)
      expect(callTimes(world, A)).toEqual([])
      yield* advance(1)
      expect(callTimes(world, A)).toEqual([2_500])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner with a reconciliation request is reconciled from attempt 0 though complete; a refused scan keeps the request and is retried; a complete owner without one is not tracked", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nothing requested yet
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.owners.set(B, { status: "complete", failureCount: 0, failedSeq: 0 })
      world.behaviour.set(A, "busy")
      yield* advance(60_000)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      yield* advance(2_500)
      expect(callTimes(world, A)).toEqual([62_500])
      // too many scans elsewhere: not begun, still requested, retried on the backoff
      expect(world.owners.get(A)?.requested).toBe(true)
      world.behaviour.set(A, "succeed")
      yield* advance(5_000)
      expect(callTimes(world, A)).toEqual([62_500, 67_500])
      expect(world.owners.get(A)?.requested).toBe(false)
      expect(yield* s.tracked).toEqual([])
      yield* advance(60_000)
      expect(yield* s.tracked).toEqual([])
      expect(callTimes(world, B)).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("a request taken up by a scan begun elsewhere before the attempt is done: that scan is not superseded by a second one", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      const s = yield* scheduler(world)
      world.owners.set(A, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(A, "succeed")
      yield* advance(60_000)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      // before this process's attempt (at 62.5 s), another process (its scheduler, a sweep, the CLI)
      // begins a scan of A: its begin clears the request and A is scanning
      world.owners.set(A, { status: "scanning", failureCount: 0, failedSeq: 0, requested: false })
      yield* advance(2_500)
      // a begin here would bump A's generation and supersede the scan running elsewhere
      expect(callTimes(world, A)).toEqual([])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("owners with a request have their own budget: failing owners holding every slot do not hold them back", () => {
    const world = newWorld()
    const failing = [plc(10), plc(11), plc(12)]
    const R = plc(20)
    return Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      for (const did of failing) {
        world.behaviour.set(did, gate)
        fail(world, did)
      }
      world.owners.set(R, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      world.behaviour.set(R, "succeed")
      const s = yield* scheduler(world, { trackedMax: 2 })
      expect((yield* s.tracked).map((t) => t.did).sort()).toEqual([R, ...failing.slice(0, 2)].sort())
    }).pipe(
      Effect.provide(deps(world, { RETRY_SCHEDULER_CONCURRENCY: "2" })),
      Effect.withRandom(halfJitter)
    )
  })

  it.scoped("a request for an owner already tracked as failed brings its next attempt to the next round, outside the requests' budget", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      // A has failed 10 times: tracked from attempt 9, its next attempt at 0.5 × min(1 h, 5 s × 2^9)
      fail(world, A, 10)
      const s = yield* scheduler(world, { trackedMax: 1 })
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 9, inFlight: false }])
      // A's account is reactivated (stamped), and so is B's; one round later
      world.behaviour.set(A, "succeed")
      world.behaviour.set(B, "succeed")
      const a = world.owners.get(A)
      if (a !== undefined) a.requested = true
      world.owners.set(B, { status: "complete", failureCount: 0, failedSeq: 0, requested: true })
      yield* advance(60_000)
      // A at once (not at 1,280,000 ms), its request cleared; B tracked in the requests' budget of 1
      expect(callTimes(world, A)).toEqual([60_000])
      expect(world.owners.get(A)).toMatchObject({ status: "complete", requested: false })
      yield* advance(2_500) // B's attempt 0
      expect(callTimes(world, B)).toEqual([62_500])
      expect(yield* s.tracked).toEqual([])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("lists failed owners every interval and retries each on the exact backoff", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nobody has failed yet
      fail(world, A)
      yield* advance(59_999)
      expect(yield* s.tracked).toEqual([])
      yield* advance(1) // the next round, at 60 s
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 0, inFlight: false }])
      // attempts 0..4 at +2.5 s, +5 s, +10 s, +20 s, +40 s after the previous one
      const expected = [62_500, 67_500, 77_500, 97_500, 137_500]
      for (const [i, at] of expected.entries()) {
        const prev = i === 0 ? 60_000 : (expected[i - 1] ?? 0)
        yield* advance(at - prev - 1)
        expect(callTimes(world, A)).toHaveLength(i)
        yield* advance(1)
        expect(callTimes(world, A)).toEqual(expected.slice(0, i + 1))
      }
      expect((yield* s.tracked)[0]?.attempt).toBe(5)
      expect((yield* s.stats).attempts).toBe(5)
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })

  it.scoped("an owner that failed often starts at its failure count; released after an attempt at the cap", () => {
    const world = newWorld()
    const A = plc(1)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nobody has failed yet
      fail(world, A, 12) // attempt index 11: 5 s × 2^11 > 1 h
      yield* advance(70_000) // rounds every 70 s here, so no round coincides with an attempt
      expect((yield* s.tracked)[0]?.attempt).toBe(11)
      yield* advance(1_800_000 - 1)
      expect(callTimes(world, A)).toEqual([])
      yield* advance(1)
      expect(callTimes(world, A)).toEqual([1_870_000])
      // released at the cap (others may take the slot) and rediscovered by the next round
      expect(yield* s.tracked).toEqual([])
      yield* advance(20_000)
      expect(yield* s.tracked).toEqual([{ did: A, attempt: 12, inFlight: false }])
      yield* advance(1_800_000)
      expect(callTimes(world, A)).toEqual([1_870_000, 3_690_000])
    }).pipe(Effect.provide(deps(world, { RETRY_SCHEDULER_INTERVAL_MS: "70000" })), Effect.withRandom(halfJitter))
  })

  for (const concurrency of [1, 2]) {
    it.scoped(`at most 16 owners are tracked (oldest failure first); ${concurrency} attempt(s) at a time`, () => {
      const world = newWorld()
      const owners = Array.from({ length: 20 }, (_, i) => plc(100 + i))
      return Effect.gen(function*() {
        const gate = yield* Deferred.make<void>()
        for (const did of owners) world.behaviour.set(did, gate)
        const s = yield* scheduler(world) // the round at start: nobody has failed yet
        for (const did of owners) fail(world, did)
        yield* advance(60_000)
        const tracked = yield* s.tracked
        expect(tracked.map((t) => t.did)).toEqual(owners.slice(0, 16))
        expect((yield* s.stats).tracked).toBe(16)
        // all 16 are due at +2.5 s; only `concurrency` run, the others wait for a permit
        yield* advance(2_500)
        expect(world.calls).toHaveLength(concurrency)
        expect((yield* s.stats).inFlight).toBe(concurrency)
        // the next round admits nobody: all 16 slots are taken
        yield* advance(60_000 - 2_500)
        expect((yield* s.tracked).map((t) => t.did)).toEqual(owners.slice(0, 16))
        // they all succeed (one permit at a time) and are forgotten; the next round takes the rest
        yield* Deferred.succeed(gate, undefined)
        yield* settle
        expect(world.calls).toHaveLength(16)
        expect(world.maxActive).toBe(concurrency)
        expect(yield* s.tracked).toEqual([])
        yield* advance(60_000)
        expect((yield* s.tracked).map((t) => t.did)).toEqual(owners.slice(16))
      }).pipe(
        Effect.provide(deps(world, { RETRY_SCHEDULER_CONCURRENCY: String(concurrency) })),
        Effect.withRandom(halfJitter)
      )
    })
  }

  it.scoped("success forgets the owner and its attempt count; a new failure starts over", () => {
    const world = newWorld()
    const A = plc(1)
    const B = plc(2)
    return Effect.gen(function*() {
      const s = yield* scheduler(world) // the round at start: nobody has failed yet
      fail(world, A)
      yield* advance(60_000) // tracked
      yield* advance(2_500) // attempt 0 fails
      yield* advance(5_000) // attempt 1 fails
      expect((yield* s.tracked)[0]?.attempt).toBe(2)
      world.behaviour.set(A, "succeed")
      yield* advance(10_000) // attempt 2 succeeds
      expect(callTimes(world, A)).toEqual([62_500, 67_500, 77_500])
      expect(yield* s.tracked).toEqual([])
      expect((yield* s.stats).recovered).toBe(1)
      // a slot freed: another owner can be tracked, and A failing again starts at attempt 0
      world.behaviour.set(A, "fail")
      fail(world, A)
      fail(world, B)
      yield* advance(120_000 - 77_500)
      expect(yield* s.tracked).toEqual([
        { did: A, attempt: 0, inFlight: false },
        { did: B, attempt: 0, inFlight: false }
      ])
      yield* advance(2_500)
      expect(callTimes(world, A)).toEqual([62_500, 67_500, 77_500, 122_500])
    }).pipe(Effect.provide(deps(world)), Effect.withRandom(halfJitter))
  })
})
