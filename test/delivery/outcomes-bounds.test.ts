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
import { Deferred, Duration, Effect, Metric, MetricState, Queue, Scope, Stream, TestClock } from "effect"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import type { Outcome } from "../../src/services/delivery/DeliveryOutcomes.js"
import { outcome } from "../api/tailClient.js"

const OWNER = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

const droppedTotal = Effect.map(Metric.snapshot, (pairs) => {
  for (const pair of pairs) {
    if (pair.metricKey.name !== "firehook_outcomes_dropped_total") continue
    if (MetricState.isCounterState(pair.metricState)) return Number(pair.metricState.count)
  }
  return 0
})

/** The ids a payload carries. */
const idsOf = (payload: string) => DeliveryOutcomes.decode(payload)?.outcomes.map((o) => o.id) ?? []

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

describe("DeliveryOutcomes payloads at their bounds", () => {
  it.effect("two outcomes whose payload is one byte under the bound are one payload; one byte less of bound: two", () =>
    Effect.sync(() => {
      const pair = [outcome(OWNER), outcome(OWNER)]
      const whole = DeliveryOutcomes.encodePayloads("origin", pair, 1_000_000).payloads
      expect(whole.map((p) => p.count)).toEqual([2])
      const size = Buffer.byteLength(whole[0]!.text)
      const fits = DeliveryOutcomes.encodePayloads("origin", pair, size + 1)
      expect(fits.payloads.map((p) => [p.count, p.text])).toEqual([[2, whole[0]!.text]])
      const split = DeliveryOutcomes.encodePayloads("origin", pair, size)
      expect(split.payloads.map((p) => idsOf(p.text))).toEqual([[pair[0]!.id], [pair[1]!.id]])
      expect(split.skipped).toBe(0)
    }))

  it.effect("an outcome too large on its own is left out (skipped), the others are sent", () =>
    Effect.sync(() => {
      const small = outcome(OWNER)
      const alone = DeliveryOutcomes.encodePayloads("origin", [small], 1_000_000).payloads[0]!.text
      const big = outcome(OWNER, { rkey: "r".repeat(200) })
      const r = DeliveryOutcomes.encodePayloads("origin", [small, big, small], Buffer.byteLength(alone) + 100)
      expect(r.skipped).toBe(1)
      expect(r.payloads.flatMap((p) => idsOf(p.text))).toEqual([small.id, small.id])
      for (const p of r.payloads) expect(Buffer.byteLength(p.text)).toBeLessThan(Buffer.byteLength(alone) + 100)
    }))

  it.effect("at most 256 outcomes a payload, each payload decodable", () =>
    Effect.sync(() => {
      const many = Array.from({ length: 300 }, () => outcome(OWNER))
      const r = DeliveryOutcomes.encodePayloads("origin", many, 1_000_000)
      expect(r.payloads.map((p) => p.count)).toEqual([256, 44])
      expect(r.payloads.flatMap((p) => idsOf(p.text))).toEqual(many.map((o) => o.id))
    }))

  it.effect("by default each payload is under 7,000 bytes (PostgreSQL's NOTIFY takes 8,000)", () =>
    Effect.sync(() => {
      const many = Array.from({ length: 256 }, () => outcome(OWNER, { errorKind: "http_5xx", httpStatus: 503 }))
      const r = DeliveryOutcomes.encodePayloads("origin", many)
      expect(r.payloads.length).toBeGreaterThan(1)
      const sizes = r.payloads.map((p) => Buffer.byteLength(p.text))
      expect(Math.max(...sizes)).toBeLessThan(7_000)
      // filled up to the bound, not split early
      expect(sizes[0]).toBeGreaterThan(7_000 - 200)
      expect(r.payloads.flatMap((p) => idsOf(p.text))).toEqual(many.map((o) => o.id))
    }))

  it.scoped("an outcome too large to notify is counted as dropped and not sent", () =>
    Effect.gen(function*() {
      const sent: Array<string> = []
      const outcomes = yield* DeliveryOutcomes.make({ send: (p) => Effect.sync(() => void sent.push(p)) })
      const before = yield* droppedTotal
      yield* outcomes.publish(outcome(OWNER, { rkey: "r".repeat(7_000) }))
      const marker = outcome(OWNER)
      yield* outcomes.publish(marker)
      yield* TestClock.adjust(Duration.zero)
      expect(sent.flatMap(idsOf)).toEqual([marker.id])
      expect((yield* droppedTotal) - before).toBe(1)
    }))
})

describe("DeliveryOutcomes buffers", () => {
  it.scoped("outcomes waiting to be notified: past 4,096 the oldest go first", () =>
    Effect.gen(function*() {
      const sent: Array<string> = []
      const release = yield* Deferred.make<void>()
      const outcomes = yield* DeliveryOutcomes.make({
        send: (p) => Effect.zipRight(Deferred.await(release), Effect.sync(() => void sent.push(p)))
      })
      // the first is taken by the sender, which then waits
      const first = outcome(OWNER)
      yield* outcomes.publish(first)
      yield* TestClock.adjust(Duration.zero)
      const waiting: Array<Outcome> = Array.from({ length: DeliveryOutcomes.QUEUE_MAX + 10 }, () => outcome(OWNER))
      for (const o of waiting) yield* outcomes.publish(o)
      yield* Deferred.succeed(release, undefined)
      const expected = [first, ...waiting.slice(10)].map((o) => o.id)
      for (let i = 0; i < 100 && sent.flatMap(idsOf).length < expected.length; i++) {
        yield* TestClock.adjust(Duration.zero)
      }
      expect(sent.flatMap(idsOf)).toEqual(expected)
    }))

  it.scoped("a subscriber that does not take: past 4,096 outcomes are dropped and counted", () =>
    Effect.gen(function*() {
      const outcomes = yield* DeliveryOutcomes.make()
      const feed = yield* outcomes.subscribe
      const before = yield* droppedTotal
      const all = Array.from({ length: DeliveryOutcomes.PUBSUB_CAPACITY + 3 }, () => outcome(OWNER))
      for (const o of all) yield* outcomes.publish(o)
      expect((yield* droppedTotal) - before).toBe(3)
      const held = yield* Queue.takeAll(feed)
      expect([...held].map((o) => o.id)).toEqual(all.slice(0, DeliveryOutcomes.PUBSUB_CAPACITY).map((o) => o.id))
    }))
})
