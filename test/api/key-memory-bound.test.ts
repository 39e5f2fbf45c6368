/**
 * The API's bounded in-memory maps bound bytes, not only keys: the per-caller rate limiters (keyed
 * by the caller's DID) and the replay cache (keyed by `(iss, jti)`) hold a key of more than 64
 * characters as a fixed-size digest. A verified caller DID may have 2,048 characters (SPEC §1.1: a
 * did:web path, any number of them for anyone with a domain), and limiters keyed by the DID as is
 * held ~214 MB each at their 100,000-key bound (~12 MB for did:plc callers). Short keys are held as
 * they are; distinct long keys keep distinct buckets and entries.
 */
import * as V8 from "node:v8"
import * as Vm from "node:vm"
import { describe, expect, it } from "vitest"
import { compactKey, DEFAULT_LIMITS, makeBuckets, MAX_PLAIN_KEY_LENGTH } from "../../src/services/api/RateLimiter.js"
import { DEFAULT_REPLAY_CAPACITY, makeReplayCache } from "../../src/services/api/ReplayCache.js"

V8.setFlagsFromString("--expose-gc")
const gc = Vm.runInNewContext("gc") as () => void

const plcDid = (i: number) => `did:plc:${String(i).padStart(24, "a")}`
/** a 2,048-character did:web (SPEC §1.1's bound), distinct per `i` */
const longDid = (i: number) => `did:web:evil.example:${String(i).padStart(8, "0")}:${"a".repeat(2048 - 30)}`
/** a fresh copy of `s` (as decoded from a token), not a string the test keeps */
const fresh = (s: string) => JSON.parse(JSON.stringify(s)) as string

/** The heap bytes that what `fill` builds still holds after it returns (it must return the structure). */
const heldBy = (fill: () => unknown): number => {
  gc()
  const before = process.memoryUsage().heapUsed
  const kept = fill()
  gc()
  const held = process.memoryUsage().heapUsed - before
  expect(kept).toBeDefined()
  return held
}

describe("a per-caller limiter at its 100,000-key bound", () => {
  const filled = (did: (i: number) => string) => () => {
    const limiter = makeBuckets(DEFAULT_LIMITS.callsPerCaller, DEFAULT_LIMITS.maxKeys)
    for (let i = 0; i < DEFAULT_LIMITS.maxKeys; i++) limiter.take(fresh(did(i)), 0)
    expect(limiter.size()).toBe(DEFAULT_LIMITS.maxKeys)
    return limiter
  }

  it("holds about as much for 2,048-character DIDs as for did:plc ones (not ~214 MB)", () => {
    const plc = heldBy(filled(plcDid))
    const long = heldBy(filled(longDid))
    expect(long).toBeLessThan(2 * plc)
    expect(long).toBeLessThan(40e6)
  }, 120_000)
})

describe("the replay cache at its 100,000-entry bound", () => {
  const filled = (did: (i: number) => string) => () => {
    const cache = makeReplayCache(DEFAULT_REPLAY_CAPACITY)
    for (let i = 0; i < DEFAULT_REPLAY_CAPACITY; i++) {
      expect(cache.check(fresh(did(i)), `jti-${i}`, 3_600_000, 0)).toBe("fresh")
    }
    return cache
  }

  it("holds about as much for 2,048-character issuers as for did:plc ones", () => {
    const plc = heldBy(filled(plcDid))
    const long = heldBy(filled(longDid))
    expect(long).toBeLessThan(2 * plc)
    expect(long).toBeLessThan(60e6)
  }, 120_000)
})

describe("keys as held", () => {
  it("short keys as they are; longer than 64 characters a fixed-size digest, distinct per key", () => {
    expect(MAX_PLAIN_KEY_LENGTH).toBe(64)
    expect(compactKey(plcDid(1))).toBe(plcDid(1))
    expect(compactKey("203.0.113.5")).toBe("203.0.113.5")
    expect(compactKey("x".repeat(64))).toBe("x".repeat(64))
    const a = compactKey(longDid(1))
    expect(a).toHaveLength(23)
    expect(compactKey(fresh(longDid(1)))).toBe(a)
    expect(compactKey(longDid(2))).not.toBe(a)
    expect(compactKey("x".repeat(65))).toHaveLength(23)
  })

  it("long DIDs keep their own buckets", () => {
    const limiter = makeBuckets({ limit: 2, perMs: 60_000 }, 10)
    for (let i = 0; i < 2; i++) expect(limiter.take(longDid(1), 0).allowed).toBe(true)
    expect(limiter.take(longDid(1), 0)).toEqual({ allowed: false, retryAfterMs: 30_000 })
    expect(limiter.peek(longDid(1), 0).allowed).toBe(false)
    expect(limiter.take(longDid(2), 0).allowed).toBe(true)
    limiter.give(longDid(1), 0)
    expect(limiter.take(longDid(1), 0).allowed).toBe(true)
    expect(limiter.size()).toBe(2)
  })

  it("a long issuer's token is refused when replayed, forgotten on request, and other tokens are not affected", () => {
    const cache = makeReplayCache(10)
    expect(cache.check(longDid(1), "j", 60_000, 0)).toBe("fresh")
    expect(cache.check(fresh(longDid(1)), "j", 60_000, 0)).toBe("replayed")
    expect(cache.check(longDid(1), "k", 60_000, 0)).toBe("fresh")
    expect(cache.check(longDid(2), "j", 60_000, 0)).toBe("fresh")
    cache.forget(longDid(1), "j")
    expect([cache.size(), cache.indexed()]).toEqual([2, 2])
    expect(cache.check(longDid(1), "j", 60_000, 0)).toBe("fresh")
  })
})
