/**
 * The transport's deadline ticker (SafeHttp, SPEC §4.6: `timeoutMs` is one overall deadline): a
 * request in progress is expired at most DEADLINE_TICK_MS (20 ms) after its deadline or its address's connect
 * deadline, never before, and never once it is removed. Driven by TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import { makeDeadlines, type Pending } from "../../../src/services/platform/http/Deadlines.js"

/** the granularity the transport documents (DEADLINE_TICK_MS): a request times out at most 20 ms late */
const TICK = 20

/** lets the ticker fiber run up to its next sleep */
const settle = Effect.repeatN(Effect.yieldNow(), 10)

const pending = (deadline: number, connectDeadline?: number) => {
  const expired: Array<number> = []
  const p: Pending = { deadline, connectDeadline, expire: (now) => void expired.push(now) }
  return { p, expired }
}

describe("SafeHttp deadlines (one ticker fiber, TestClock)", () => {
  it.scoped("a request is expired within one tick after its deadline, not before", () =>
    Effect.gen(function*() {
      const deadlines = yield* makeDeadlines
      const { expired, p } = pending(100)
      deadlines.add(p)
      yield* settle
      yield* TestClock.adjust(99)
      yield* settle
      expect(expired).toEqual([])
      yield* TestClock.adjust(TICK)
      yield* settle
      expect(expired.length).toBeGreaterThanOrEqual(1)
      expect(expired[0]).toBeGreaterThanOrEqual(100)
      expect(expired[0]).toBeLessThanOrEqual(100 + TICK)
    }))

  it.scoped("an address's connect deadline expires it before the overall deadline", () =>
    Effect.gen(function*() {
      const deadlines = yield* makeDeadlines
      const { expired, p } = pending(1_000, 40)
      deadlines.add(p)
      yield* settle
      yield* TestClock.adjust(40 + TICK)
      yield* settle
      expect(expired.length).toBeGreaterThanOrEqual(1)
      expect(expired.every((now) => now >= 40 && now < 1_000)).toBe(true)
    }))

  it.scoped("a removed request is never expired; a request added after the ticker went idle is", () =>
    Effect.gen(function*() {
      const deadlines = yield* makeDeadlines
      const first = pending(50)
      deadlines.add(first.p)
      yield* settle
      deadlines.remove(first.p)
      yield* TestClock.adjust(200)
      yield* settle
      expect(first.expired).toEqual([])
      // nothing pending: the ticker waits for the next add, then ticks again
      const second = pending(300)
      deadlines.add(second.p)
      yield* settle
      yield* TestClock.adjust(100 + TICK)
      yield* settle
      expect(second.expired[0]).toBeGreaterThanOrEqual(300)
      expect(second.expired[0]).toBeLessThanOrEqual(300 + TICK)
    }))
})
