/**
 * The live tail's demand (DeliveryOutcomes): a process that settles deliveries notifies its
 * outcomes to the other processes only while another process has an open tail connection and has
 * said so within DEMAND_TTL_MS; a process with open connections sends its demand at once and every
 * DEMAND_EVERY_MS, and stops when the last one closes. In-memory transport, on the TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Exit, Queue, Scope, Stream, TestClock } from "effect"
import * as TailHub from "../../src/services/api/Tail.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import { outcome } from "../api/tailClient.js"

const OWNER = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"

/** A notifying process whose demand channel is `demands` (what the others say). */
const settler = Effect.gen(function*() {
  const sent: Array<string> = []
  const demands = yield* Queue.unbounded<string>()
  const outcomes = yield* DeliveryOutcomes.make({
    send: (payload) => Effect.sync(() => void sent.push(payload)),
    demand: { send: () => Effect.void, listen: Stream.fromQueue(demands) }
  })
  return { outcomes, sent, demands }
})

/** A listening process (it serves tails): its demands are recorded. */
const server = Effect.gen(function*() {
  const demanded: Array<string> = []
  const outcomes = yield* DeliveryOutcomes.make({
    listen: Stream.never,
    demand: { send: (origin) => Effect.sync(() => void demanded.push(origin)), listen: Stream.never }
  })
  return { outcomes, demanded }
})

describe("DeliveryOutcomes demand", () => {
  it.scoped("no demand: nothing is notified; a fresh demand from another process: notified; stale after the TTL", () =>
    Effect.gen(function*() {
      const { outcomes, sent, demands } = yield* settler
      yield* outcomes.publish(outcome(OWNER))
      yield* TestClock.adjust(Duration.millis(10))
      expect(sent).toEqual([])
      expect(yield* outcomes.notifying).toBe(false)

      yield* Queue.offer(demands, "another-origin")
      yield* TestClock.adjust(Duration.millis(10))
      expect(yield* outcomes.notifying).toBe(true)
      const wanted = outcome(OWNER)
      yield* outcomes.publish(wanted)
      yield* TestClock.adjust(Duration.millis(10))
      expect(sent.length).toBe(1)
      expect(sent[0]).toContain(wanted.id)

      // no demand repeated: DEMAND_TTL_MS after the last one, nothing more is sent
      yield* TestClock.adjust(Duration.millis(DeliveryOutcomes.DEMAND_TTL_MS))
      expect(yield* outcomes.notifying).toBe(false)
      yield* outcomes.publish(outcome(OWNER))
      yield* TestClock.adjust(Duration.millis(10))
      expect(sent.length).toBe(1)
    }))

  it.scoped("the process's own demand (its origin) does not make it notify", () =>
    Effect.gen(function*() {
      // one process that both settles and serves: its own tails get its outcomes in process
      const demands = yield* Queue.unbounded<string>()
      const sent: Array<string> = []
      const own: Array<string> = []
      const outcomes = yield* DeliveryOutcomes.make({
        send: (payload) => Effect.sync(() => void sent.push(payload)),
        listen: Stream.never,
        demand: {
          send: (origin) => Effect.zipRight(Effect.sync(() => void own.push(origin)), Queue.offer(demands, origin)),
          listen: Stream.fromQueue(demands)
        }
      })
      const scope = yield* Scope.make()
      yield* Scope.extend(outcomes.demand, scope)
      yield* TestClock.adjust(Duration.millis(10))
      expect(own.length).toBe(1)
      expect(yield* outcomes.notifying).toBe(false)
      yield* outcomes.publish(outcome(OWNER))
      yield* TestClock.adjust(Duration.millis(10))
      expect(sent).toEqual([])
    }))

  it.scoped("a tail connection sends the demand at once and every DEMAND_EVERY_MS; none once it closes", () =>
    Effect.gen(function*() {
      const { outcomes, demanded } = yield* server
      const tail = yield* TailHub.make().pipe(Effect.provideService(DeliveryOutcomes.DeliveryOutcomes, outcomes))
      yield* TestClock.adjust(Duration.seconds(5))
      expect(demanded).toEqual([])

      const connection = yield* Scope.make()
      yield* Scope.extend(tail.connect(OWNER), connection)
      yield* TestClock.adjust(Duration.millis(1))
      expect(demanded.length).toBe(1)
      yield* TestClock.adjust(Duration.millis(DeliveryOutcomes.DEMAND_EVERY_MS))
      expect(demanded.length).toBe(2)
      // a second connection does not add demands of its own
      const second = yield* Scope.make()
      yield* Scope.extend(tail.connect(OWNER), second)
      yield* TestClock.adjust(Duration.millis(DeliveryOutcomes.DEMAND_EVERY_MS))
      expect(demanded.length).toBe(3)

      yield* Scope.close(connection, Exit.void)
      yield* TestClock.adjust(Duration.millis(DeliveryOutcomes.DEMAND_EVERY_MS))
      expect(demanded.length).toBe(4)
      yield* Scope.close(second, Exit.void)
      yield* TestClock.adjust(Duration.millis(DeliveryOutcomes.DEMAND_EVERY_MS * 5))
      expect(demanded.length).toBe(4)
      // every demand names the same origin (the process's)
      expect(new Set(demanded).size).toBe(1)
    }))

  it.scoped("without a demand transport every outcome is notified (an embedder's transport, as before)", () =>
    Effect.gen(function*() {
      const sent: Array<string> = []
      const outcomes = yield* DeliveryOutcomes.make({ send: (payload) => Effect.sync(() => void sent.push(payload)) })
      expect(yield* outcomes.notifying).toBe(true)
      yield* outcomes.publish(outcome(OWNER))
      yield* TestClock.adjust(Duration.millis(10))
      expect(sent.length).toBe(1)
    }))
})
