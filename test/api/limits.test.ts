/**
 * The owners' API limits as pure state machines (time passed in): token buckets (SPEC §8.2 rate
 * limits), the bounded jti replay cache, and the client address rules.
 */
import { describe, expect, it } from "@effect/vitest"
import { Option } from "effect"
import { addressKey, clientAddress } from "../../src/services/api/ClientAddress.js"
import { makeBuckets, retryAfterSeconds, takeAll } from "../../src/services/api/RateLimiter.js"
import { makeReplayCache } from "../../src/services/api/ReplayCache.js"

const MIN = 60_000

describe("token buckets", () => {
  it("30/min: a burst of 30, then one every 2 s; Retry-After is the wait for the next token", () => {
    const b = makeBuckets({ limit: 30, perMs: MIN }, 100)
    for (let i = 0; i < 30; i++) expect(b.take("a", 0).allowed).toBe(true)
    const refused = b.take("a", 0)
    expect(refused).toEqual({ allowed: false, retryAfterMs: 2000 })
    expect(retryAfterSeconds(refused.retryAfterMs)).toBe(2)
    expect(b.take("a", 1999).allowed).toBe(false)
    expect(b.take("a", 2000).allowed).toBe(true)
    expect(b.take("a", 2000).allowed).toBe(false)
    // other keys are not affected; a minute later the bucket is full again
    expect(b.take("b", 2000).allowed).toBe(true)
    for (let i = 0; i < 30; i++) expect(b.take("a", 2000 + MIN).allowed).toBe(true)
    expect(b.take("a", 2000 + MIN).allowed).toBe(false)
  })

  it("an idle bucket refills to its limit, never beyond: a long pause gives a burst of 30, not more", () => {
    const b = makeBuckets({ limit: 30, perMs: MIN }, 100)
    expect(b.take("a", 0).allowed).toBe(true)
    // ten minutes idle: still a burst of 30 only
    for (let i = 0; i < 30; i++) expect(b.take("a", 10 * MIN).allowed).toBe(true)
    expect(b.take("a", 10 * MIN)).toEqual({ allowed: false, retryAfterMs: 2000 })
  })

  it("a clock that steps back neither drains nor refills a bucket", () => {
    const b = makeBuckets({ limit: 30, perMs: MIN }, 100)
    for (let i = 0; i < 29; i++) expect(b.take("a", 10_000).allowed).toBe(true)
    // one token left: an earlier time does not take it away
    expect(b.take("a", 8_000).allowed).toBe(true)
    expect(b.take("a", 0).allowed).toBe(false)
    // nor does the step back count as time passed once the clock is back where it was
    expect(b.take("a", 10_000).allowed).toBe(false)
    expect(b.take("a", 12_000).allowed).toBe(true)
  })

  it("a call made once retryAfterMs has passed is allowed (the wait is rounded up, never down)", () => {
    // 7/min: one token every 8,571.43 ms
    const b = makeBuckets({ limit: 7, perMs: MIN }, 100)
    for (let i = 0; i < 7; i++) expect(b.take("a", 0).allowed).toBe(true)
    const refused = b.take("a", 0)
    expect(refused.allowed).toBe(false)
    expect(b.peek("a", refused.retryAfterMs - 1).allowed).toBe(false)
    expect(b.take("a", refused.retryAfterMs).allowed).toBe(true)
  })

  it("peek changes nothing", () => {
    const b = makeBuckets({ limit: 1, perMs: MIN }, 10)
    expect(b.peek("a", 0).allowed).toBe(true)
    expect(b.peek("a", 0).allowed).toBe(true)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.peek("a", 0)).toEqual({ allowed: false, retryAfterMs: MIN })
    expect(retryAfterSeconds(1)).toBe(1)
  })

  it("give returns a taken token, never above the limit; an untracked key stays full", () => {
    const b = makeBuckets({ limit: 2, perMs: MIN }, 10)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("a", 0).allowed).toBe(false)
    b.give("a", 0)
    expect(b.take("a", 0).allowed).toBe(true)
    b.give("a", 0)
    b.give("a", 0)
    b.give("a", 0)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("a", 0).allowed).toBe(false)
    b.give("z", 0)
    expect(b.size()).toBe(1)
  })

  it("bounded: at maxKeys the least recently used key is forgotten (its bucket full again)", () => {
    const b = makeBuckets({ limit: 1, perMs: MIN }, 2)
    b.take("a", 0)
    b.take("b", 0)
    b.take("a", 0) // refused: a refusal does not touch the key's recency
    b.take("c", 0) // evicts a, the least recently used
    expect(b.size()).toBe(2)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("c", 0).allowed).toBe(false)
  })

  it("takeAll counts a call against every limit only when all allow it", () => {
    const all = makeBuckets({ limit: 3, perMs: MIN }, 10)
    const test = makeBuckets({ limit: 1, perMs: MIN }, 10)
    expect(takeAll([[all, "d"], [test, "d"]], 0).allowed).toBe(true)
    const refused = takeAll([[all, "d"], [test, "d"]], 0)
    expect(refused).toEqual({ allowed: false, retryAfterMs: MIN })
    // the refused call took nothing from the general limit: two more plain calls fit
    expect(takeAll([[all, "d"]], 0).allowed).toBe(true)
    expect(takeAll([[all, "d"]], 0).allowed).toBe(true)
    expect(takeAll([[all, "d"]], 0)).toEqual({ allowed: false, retryAfterMs: 20_000 })
  })
})

describe("replay cache", () => {
  it("a (iss, jti) is accepted once while it lives, then forgotten", () => {
    const c = makeReplayCache(10)
    expect(c.check("did:a", "j1", 60_500, 0)).toBe("fresh")
    expect(c.check("did:a", "j1", 60_500, 1000)).toBe("replayed")
    // per issuer
    expect(c.check("did:b", "j1", 60_500, 1000)).toBe("fresh")
    // still within its expiry second: kept
    expect(c.check("did:a", "j1", 60_500, 60_999)).toBe("replayed")
    expect(c.check("did:a", "j1", 60_500, 61_000)).toBe("fresh")
  })

  it("full: a new token is refused, never an entry forgotten early; space comes back as entries expire", () => {
    const c = makeReplayCache(2)
    expect(c.check("did:a", "1", 10_000, 0)).toBe("fresh")
    expect(c.check("did:a", "2", 20_000, 0)).toBe("fresh")
    expect(c.check("did:a", "3", 20_000, 0)).toBe("full")
    expect(c.check("did:a", "1", 10_000, 5_000)).toBe("replayed")
    expect(c.check("did:a", "3", 20_000, 11_000)).toBe("fresh")
    expect(c.size()).toBe(2)
    expect(c.check("did:a", "2", 20_000, 11_000)).toBe("replayed")
    // a long jump prunes everything at once
    expect(c.check("did:a", "4", 10_000_000, 9_000_000)).toBe("fresh")
    expect(c.size()).toBe(1)
  })
})

describe("client address", () => {
  const peer = Option.some("10.0.0.9")
  it("the socket peer, or the first X-Forwarded-For hop only when the proxy is trusted", () => {
    const xff = " 203.0.113.7 , 10.0.0.1"
    expect(clientAddress(peer, xff, false)).toBe("10.0.0.9")
    expect(clientAddress(peer, xff, true)).toBe("203.0.113.7")
    expect(clientAddress(peer, "junk, 1.2.3.4", true)).toBe("10.0.0.9")
    expect(clientAddress(peer, undefined, true)).toBe("10.0.0.9")
    expect(clientAddress(Option.none(), undefined, false)).toBe("unknown")
  })

  it("keys: IPv4 as is, IPv4-mapped as IPv4, IPv6 by /64", () => {
    expect(addressKey("203.0.113.7")).toBe("203.0.113.7")
    expect(addressKey("::ffff:127.0.0.1")).toBe("127.0.0.1")
    expect(addressKey("2001:db8:1:2:3:4:5:6")).toBe("2001:db8:1:2::/64")
    expect(addressKey("[2001:db8:1:2::99]")).toBe("2001:db8:1:2::/64")
    // only ::ffff:a.b.c.d is IPv4-mapped: another IPv6 address ending in ffff:<v4> is its own /64
    expect(addressKey("::1:ffff:7f00:1")).toBe("0:0:0:0::/64")
    expect(addressKey("1::ffff:7f00:1")).toBe("1:0:0:0::/64")
    expect(addressKey("nonsense")).toBe("unknown")
  })
})
