import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, TestClock } from "effect"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"

const O = "https://receiver.example"
const fail = (cb: ReturnType<typeof makeCircuitBreaker>, origin: string, times: number, nowMs: number) => {
  for (let i = 0; i < times; i++) cb.onTransientFailure(origin, nowMs)
}

describe("CircuitBreaker", () => {
  it("stays closed below the threshold and opens at exactly N consecutive transient failures", () => {
    const cb = makeCircuitBreaker()
    fail(cb, O, 19, 1_000)
    expect(cb.canAttempt(O, 1_000)).toBe("closed")
    expect(cb.openCount(1_000)).toBe(0)
    cb.onTransientFailure(O, 1_000)
    expect(cb.canAttempt(O, 1_000)).toBe("open")
    expect(cb.openCount(1_000)).toBe(1)
    expect(cb.get(O)).toEqual({
      consecutiveFailures: 20,
      openUntilMs: 61_000,
      cooldownMs: 60_000,
      probing: false,
      probeStartedMs: 0
    })
    // other origins are unaffected
    expect(cb.canAttempt("https://other.example", 1_000)).toBe("closed")
  })

  it("held: open origins until the cool-down's end, probing ones until the probe's deadline, not the others", () => {
    const cb = makeCircuitBreaker({ threshold: 2, cooldownMs: 10_000, probeTimeoutMs: 5_000 })
    fail(cb, O, 2, 1_000)
    fail(cb, "https://counting.example", 1, 1_000)
    expect(cb.held(1_000)).toEqual([{ origin: O, untilMs: 11_000 }])
    // cool-down over, no probe yet: its next row is the probe, so it is not held
    expect(cb.held(11_000)).toEqual([])
    expect(cb.canAttempt(O, 12_000)).toBe("probe")
    expect(cb.held(12_000)).toEqual([{ origin: O, untilMs: 17_000 }])
    // a probe that never reports back is forgotten at its deadline
    expect(cb.held(17_000)).toEqual([])
    // the probe's failure re-opens it for twice the cool-down
    cb.onTransientFailure(O, 13_000)
    expect(cb.held(13_000)).toEqual([{ origin: O, untilMs: 33_000 }])
    cb.onSuccess(O)
    expect(cb.held(13_000)).toEqual([])
  })

  it("a success resets the consecutive count", () => {
    const cb = makeCircuitBreaker({ threshold: 3 })
    fail(cb, O, 2, 0)
    cb.onSuccess(O)
    expect(cb.get(O)).toBeUndefined()
    fail(cb, O, 2, 0)
    expect(cb.canAttempt(O, 0)).toBe("closed")
    cb.onTransientFailure(O, 0)
    expect(cb.canAttempt(O, 0)).toBe("open")
  })

  it.effect("open → probe after the cool-down (TestClock); only one probe at a time; probe success closes", () =>
    Effect.gen(function*() {
      const cb = makeCircuitBreaker()
      const now = () => Clock.currentTimeMillis
      fail(cb, O, 20, yield* now())
      yield* TestClock.adjust(Duration.millis(59_999))
      expect(cb.canAttempt(O, yield* now())).toBe("open")
      yield* TestClock.adjust(Duration.millis(1))
      expect(cb.canAttempt(O, yield* now())).toBe("probe")
      expect(cb.canAttempt(O, yield* now())).toBe("open")
      expect(cb.stats(yield* now())).toEqual({ tracked: 1, open: 0, halfOpen: 1 })
      expect(cb.openCount(yield* now())).toBe(1)
      cb.onSuccess(O)
      expect(cb.canAttempt(O, yield* now())).toBe("closed")
      expect(cb.openCount(yield* now())).toBe(0)
      // fully reset: it takes N failures again, and the cool-down is back to the base
      fail(cb, O, 19, yield* now())
      expect(cb.canAttempt(O, yield* now())).toBe("closed")
      cb.onTransientFailure(O, yield* now())
      expect(cb.get(O)?.cooldownMs).toBe(60_000)
    }))

  it.effect("a failed probe re-opens with the cool-down doubled, up to 30 min", () =>
    Effect.gen(function*() {
      const cb = makeCircuitBreaker()
      fail(cb, O, 20, yield* Clock.currentTimeMillis)
      const seen: Array<number> = []
      for (let i = 0; i < 8; i++) {
        const cooldown = cb.get(O)?.cooldownMs ?? -1
        seen.push(cooldown)
        yield* TestClock.adjust(Duration.millis(cooldown - 1))
        expect(cb.canAttempt(O, yield* Clock.currentTimeMillis)).toBe("open")
        yield* TestClock.adjust(Duration.millis(1))
        expect(cb.canAttempt(O, yield* Clock.currentTimeMillis)).toBe("probe")
        cb.onTransientFailure(O, yield* Clock.currentTimeMillis)
        expect(cb.canAttempt(O, yield* Clock.currentTimeMillis)).toBe("open")
      }
      expect(seen).toEqual([60_000, 120_000, 240_000, 480_000, 960_000, 1_800_000, 1_800_000, 1_800_000])
    }))

  it("a failure reported while still cooling down (an in-flight straggler) does not extend the cool-down", () => {
    const cb = makeCircuitBreaker({ threshold: 2 })
    fail(cb, O, 2, 0)
    cb.onTransientFailure(O, 30_000)
    expect(cb.get(O)?.openUntilMs).toBe(60_000)
    expect(cb.get(O)?.cooldownMs).toBe(60_000)
    expect(cb.canAttempt(O, 60_000)).toBe("probe")
  })

  it("a probe that never reports is replaced after the probe timeout", () => {
    const cb = makeCircuitBreaker({ threshold: 1, probeTimeoutMs: 10_000 })
    cb.onTransientFailure(O, 0)
    expect(cb.canAttempt(O, 60_000)).toBe("probe")
    expect(cb.canAttempt(O, 69_999)).toBe("open")
    expect(cb.canAttempt(O, 70_000)).toBe("probe")
  })

  it("configurable threshold and cool-downs", () => {
    const cb = makeCircuitBreaker({ threshold: 1, cooldownMs: 1_000, maxCooldownMs: 3_000 })
    cb.onTransientFailure(O, 0)
    expect(cb.canAttempt(O, 999)).toBe("open")
    expect(cb.canAttempt(O, 1_000)).toBe("probe")
    cb.onTransientFailure(O, 1_000)
    expect(cb.get(O)?.openUntilMs).toBe(3_000)
    expect(cb.canAttempt(O, 3_000)).toBe("probe")
    cb.onTransientFailure(O, 3_000)
    expect(cb.get(O)?.openUntilMs).toBe(6_000) // 4 s capped at 3 s
  })

  it("stats separate open from half-open", () => {
    const cb = makeCircuitBreaker({ threshold: 1 })
    cb.onTransientFailure("a", 0)
    cb.onTransientFailure("b", 30_000)
    cb.onTransientFailure("c", 0)
    // a and c cooled down at 60 s (half-open), b is open until 90 s
    expect(cb.stats(60_000)).toEqual({ tracked: 3, open: 1, halfOpen: 2 })
    expect(cb.openCount(60_000)).toBe(3)
  })

  it("is bounded: evicts closed (counting) entries first, least recently updated first", () => {
    const cb = makeCircuitBreaker({ threshold: 3, maxOrigins: 3 })
    fail(cb, "open1", 3, 0) // open
    cb.onTransientFailure("c1", 0) // counting
    cb.onTransientFailure("c2", 0) // counting
    cb.onTransientFailure("c1", 1) // c1 is now more recently updated than c2
    cb.onTransientFailure("c3", 2) // full: evicts c2, not the open origin
    expect(cb.get("c2")).toBeUndefined()
    expect(cb.get("c1")?.consecutiveFailures).toBe(2)
    expect(cb.get("c3")?.consecutiveFailures).toBe(1)
    expect(cb.get("open1")?.openUntilMs).toBe(60_000)
    cb.onTransientFailure("c4", 3) // full again: evicts c1 (older than c3)
    expect(cb.get("c1")).toBeUndefined()
    expect(cb.get("c3")?.consecutiveFailures).toBe(1)
    expect(cb.canAttempt("open1", 3)).toBe("open")
    expect(cb.stats(3).tracked).toBe(3)
  })

  it("is bounded: when every entry is open, the least recently updated open one goes", () => {
    const cb = makeCircuitBreaker({ threshold: 1, maxOrigins: 2 })
    cb.onTransientFailure("a", 0)
    cb.onTransientFailure("b", 1)
    cb.onTransientFailure("c", 2)
    expect(cb.get("a")).toBeUndefined()
    expect(cb.canAttempt("a", 3)).toBe("closed")
    expect(cb.canAttempt("b", 3)).toBe("open")
    expect(cb.canAttempt("c", 3)).toBe("open")
    expect(cb.stats(3).tracked).toBe(2)
  })

  it("stays within the bound under many origins (default 10,000)", () => {
    const cb = makeCircuitBreaker()
    for (let i = 0; i < 25_000; i++) cb.onTransientFailure(`https://o${i}.example`, i)
    expect(cb.stats(25_000).tracked).toBe(10_000)
  })

  it("forgets open origins idle for 30 min past their cool-down; keeps those cooling, probing or asked for", () => {
    const cb = makeCircuitBreaker({ threshold: 2, cooldownMs: 1_000, probeTimeoutMs: 5_000 })
    const MIN = 60_000
    fail(cb, "idle", 2, 0) // cool-down ends at 1 s; nothing asks for it again
    fail(cb, "probing", 2, 0)
    // a failing origin whose cool-down grows: open until 30 min + 2 s
    fail(cb, "cooling", 2, 0)
    expect(cb.canAttempt("cooling", 1_000)).toBe("probe")
    cb.onTransientFailure("cooling", 30 * MIN)
    // asked for at 29 min (its probe is its last attempt, deadline 29 min + 5 s)
    expect(cb.canAttempt("probing", 29 * MIN)).toBe("probe")
    cb.onTransientFailure("counting-only", 0) // closed origins are not open circuits
    expect(cb.openCount(30 * MIN)).toBe(3)
    // 30 min after "idle"'s cool-down ended (at 1 s): only it goes
    expect(cb.forgetIdle(30 * MIN + 999)).toBe(0)
    expect(cb.forgetIdle(30 * MIN + 1_000)).toBe(1)
    expect(cb.get("idle")).toBeUndefined()
    expect(cb.canAttempt("idle", 30 * MIN + 1_000)).toBe("closed")
    expect(cb.openCount(30 * MIN + 1_000)).toBe(2)
    expect(cb.get("probing")?.probing).toBe(true)
    expect(cb.get("cooling")?.openUntilMs).toBe(30 * MIN + 2_000)
    // the probe never reported: idle from its deadline (29 min + 5 s) on
    expect(cb.forgetIdle(59 * MIN + 4_999)).toBe(0)
    expect(cb.forgetIdle(59 * MIN + 5_000)).toBe(1)
    expect(cb.held(59 * MIN + 5_000)).toEqual([])
    expect(cb.openCount(59 * MIN + 5_000)).toBe(1)
  })
})

describe("CircuitBreaker: configuration edges (policy audit)", () => {
  it("a cool-down ceiling below the first cool-down is raised to it: a failed probe never shortens the cool-down", () => {
    const cb = makeCircuitBreaker({ threshold: 1, cooldownMs: 10_000, maxCooldownMs: 1_000 })
    cb.onTransientFailure(O, 0)
    expect(cb.get(O)?.openUntilMs).toBe(10_000)
    expect(cb.canAttempt(O, 10_000)).toBe("probe")
    cb.onTransientFailure(O, 10_000)
    expect(cb.get(O)).toMatchObject({ openUntilMs: 20_000, cooldownMs: 10_000 })
  })
})
