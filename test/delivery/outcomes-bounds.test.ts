/**
 * The live tail's outcome notifications at their bounds (DeliveryOutcomes; SPEC §8.5
 * `subscribeDeliveries`, docs/decisions.md "Only on demand" and "Feed"), in units on the TestClock:
 * - demand: heard 3 s ago or less keeps a process notifying, a millisecond more does not; a process
 *   with an open tail repeats its demand every second;
 * - payloads: under the byte bound given (a payload one byte under it is one payload, one byte
 *   more splits it), at most 256 outcomes each (the decoder's bound), under 7,000 bytes by default;
 *   an outcome too large alone is left out and counted as dropped;
 * - buffers: the queue of outcomes to notify slides (the oldest go first); a full PubSub drops
 *   and counts; a process that does not notify says so.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Queue, Scope, Stream, TestClock } from "effect"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"

describe("DeliveryOutcomes demand at its bounds", () => {
  it.scoped("a demand heard exactly 3,000 ms ago still counts; 3,001 ms ago it does not", () =>
    Effect.gen(function*() {
      const demands = yield* Queue.unbounded<string>()
      const outcomes = yield* DeliveryOutcomes.make({
        send: () => Effect.void,
        demand: { send: () => Effect.void, listen: Stream.fromQueue(demands) }
      })
      yield* Queue.offer(demands, "another-origin")
      // heard (the follower ran) without moving the clock
      yield* TestClock.adjust(Duration.zero)
      expect(yield* outcomes.notifying).toBe(true)
      yield* TestClock.adjust(Duration.millis(3_000))
      expect(yield* outcomes.notifying).toBe(true)
      yield* TestClock.adjust(Duration.millis(1))
      expect(yield* outcomes.notifying).toBe(false)
    }))

  it.scoped("a process with an open tail says so at once, then every 1,000 ms", () =>
    Effect.gen(function*() {
      const demanded: Array<string> = []
      const outcomes = yield* DeliveryOutcomes.make({
        listen: Stream.never,
        demand: { send: (origin) => Effect.sync(() => void demanded.push(origin)), listen: Stream.never }
      })
      const scope = yield* Scope.make()
      yield* Scope.extend(outcomes.demand, scope)
      yield* TestClock.adjust(Duration.zero)
      expect(demanded.length).toBe(1)
      yield* TestClock.adjust(Duration.millis(999))
      expect(demanded.length).toBe(1)
      yield* TestClock.adjust(Duration.millis(1))
      expect(demanded.length).toBe(2)
      yield* TestClock.adjust(Duration.millis(1_000))
      expect(demanded.length).toBe(3)
    }))

  it.scoped("a process that notifies nobody (no transport) is not notifying", () =>
    Effect.gen(function*() {
      const outcomes = yield* DeliveryOutcomes.make()
      expect(yield* outcomes.notifying).toBe(false)
    }))
})
