/**
 * The live tail's bounds at their defaults (SPEC §8.5 `subscribeDeliveries`; docs/decisions.md,
 * "Owners' API: live tail and replicas"), in units on the TestClock: the hub built with no options
 * keeps 256 frames per connection and opens at most 1,000 connections in the process; its drops are
 * counted (the `#info` frame, `stats.dropped`, `firehook_tail_frames_dropped_total`) and its open
 * connections are the gauge `firehook_tail_connections`. `TailSocket.room` with its defaults: 64 KiB,
 * polled at most 250 ms apart, `SlowReader` after 30 s; a socket drained down to exactly its bound
 * has room.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Fiber, Metric, MetricState, Ref, Scope, TestClock } from "effect"
import * as TailHub from "../../src/services/api/Tail.js"
import * as TailSocket from "../../src/services/api/TailSocket.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import { outcome } from "./tailClient.js"

const A = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const B = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"

/** The current value of the process's counter or gauge `name` (0 when it has none yet). */
const metricValue = (name: string) =>
  Effect.map(Metric.snapshot, (pairs) => {
    for (const pair of pairs) {
      if (pair.metricKey.name !== name) continue
      const state = pair.metricState
      if (MetricState.isCounterState(state)) return Number(state.count)
      if (MetricState.isGaugeState(state)) return Number(state.value)
    }
    return 0
  })

/** A hub with its defaults over an in-process outcome feed. */
const defaultHub = Effect.gen(function*() {
  const outcomes = yield* DeliveryOutcomes.make()
  const tail = yield* TailHub.make().pipe(Effect.provideService(DeliveryOutcomes.DeliveryOutcomes, outcomes))
  return { outcomes, tail }
})

/** A DID of its own for each `i` (the hub does not check DIDs). */
const didOf = (i: number) => `did:plc:${String(i).padStart(24, "a")}`

describe("Tail hub at its defaults", () => {
  it.scoped("a connection keeps 256 frames, then one #info frame counts the others (stats and metric too)", () =>
    Effect.gen(function*() {
      const { outcomes, tail } = yield* defaultHub
      const reader = yield* tail.connect(A)
      // B's connection is read once every one of A's outcomes has reached A's queue (one feed, in order)
      const marker = yield* tail.connect(B)
      const droppedBefore = yield* metricValue("firehook_tail_frames_dropped_total")
      const burst = Array.from({ length: 300 }, () => outcome(A))
      for (const o of burst) yield* outcomes.publish(o)
      yield* outcomes.publish(outcome(B, { id: "01TAILBOUNDSMARK" }))
      expect((yield* marker.take).map((f) => f.$type === TailHub.OUTCOME_TYPE ? f.id : f.$type)).toEqual([
        "01TAILBOUNDSMARK"
      ])

      const frames = yield* reader.take
      const kept = frames.flatMap((f) => f.$type === TailHub.OUTCOME_TYPE ? [f.id] : [])
      expect(kept).toEqual(burst.slice(0, 256).map((o) => o.id))
      expect(frames.length).toBe(257)
      expect(frames.at(-1)).toEqual({
        $type: TailHub.INFO_TYPE,
        name: "DeliveriesDropped",
        message: "the connection's buffer was full",
        dropped: 44
      })
      expect((yield* tail.stats).dropped).toBe(44)
      expect((yield* metricValue("firehook_tail_frames_dropped_total")) - droppedBefore).toBe(44)
    }))

  it.scoped("at most 1,000 open connections in the process: the 1,001st is refused (limit process)", () =>
    Effect.gen(function*() {
      const { tail } = yield* defaultHub
      const first = yield* Scope.make()
      yield* tail.connect(didOf(0)).pipe(Scope.extend(first))
      // 4 per DID, as many DIDs as it takes
      for (let i = 1; i < 1_000; i++) yield* tail.connect(didOf(1 + Math.floor(i / 4)))
      expect((yield* tail.stats).connections).toBe(1_000)
      expect(yield* Effect.flip(tail.connect(didOf(100_000)))).toMatchObject({
        _tag: "TooManyConnections",
        limit: "process"
      })
      yield* Scope.close(first, Exit.void)
      yield* tail.connect(didOf(100_000))
      expect((yield* tail.stats).connections).toBe(1_000)
    }))

  it.scoped("the open connections are the gauge firehook_tail_connections", () =>
    Effect.gen(function*() {
      const { tail } = yield* defaultHub
      // the gauge is set to the hub's count of open connections at each open and close
      const gauge = metricValue("firehook_tail_connections")
      const one = yield* Scope.make()
      const two = yield* Scope.make()
      yield* tail.connect(A).pipe(Scope.extend(one))
      yield* tail.connect(A).pipe(Scope.extend(two))
      yield* tail.connect(B).pipe(Scope.extend(two))
      expect(yield* gauge).toBe(3)
      yield* Scope.close(two, Exit.void)
      expect(yield* gauge).toBe(1)
      yield* Scope.close(one, Exit.void)
      expect(yield* gauge).toBe(0)
    }))
})

/** Whether `fiber` has ended with a success (without waiting for it). */
const succeeded = (fiber: Fiber.RuntimeFiber<void, TailSocket.SlowReader>) => {
  const exit = fiber.unsafePoll()
  return exit !== null && Exit.isSuccess(exit)
}

describe("TailSocket.room at its defaults", () => {
  it.effect("64 KiB: at the bound at once, one byte over waits; drained, it has room within 250 ms; SlowReader at 30 s", () =>
    Effect.gen(function*() {
      const bytes = yield* Ref.make(64 * 1024)
      const room = TailSocket.room(Ref.get(bytes))
      yield* room
      yield* Ref.set(bytes, 64 * 1024 + 1)
      const waiting = yield* Effect.fork(room)
      yield* TestClock.adjust(Duration.seconds(29))
      expect(waiting.unsafePoll()).toBeNull()
      // drained: the next look (at most 250 ms later) sees it
      yield* Ref.set(bytes, 0)
      yield* TestClock.adjust(Duration.millis(250))
      expect(succeeded(waiting)).toBe(true)

      yield* Ref.set(bytes, 64 * 1024 + 1)
      const stuck = yield* Effect.fork(room)
      yield* TestClock.adjust(Duration.millis(29_999))
      expect(stuck.unsafePoll()).toBeNull()
      yield* TestClock.adjust(Duration.millis(1))
      expect(stuck.unsafePoll()).not.toBeNull()
      expect((yield* Effect.flip(Fiber.join(stuck)))._tag).toBe("SlowReader")
    }))

  it.effect("a socket drained down to exactly its bound has room", () =>
    Effect.gen(function*() {
      const bytes = yield* Ref.make(1_001)
      const waiting = yield* Effect.fork(TailSocket.room(Ref.get(bytes), 1_000, "30 seconds"))
      yield* TestClock.adjust(Duration.seconds(1))
      expect(waiting.unsafePoll()).toBeNull()
      yield* Ref.set(bytes, 1_000)
      yield* TestClock.adjust(TailSocket.DRAIN_POLL_MAX)
      expect(succeeded(waiting)).toBe(true)
    }))
})
