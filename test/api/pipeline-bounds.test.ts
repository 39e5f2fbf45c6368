/**
 * The owners' API request pipeline's bounds as pure state (time passed in), pinned where a mutation
 * audit found them untested: Retry-After rounded up (SPEC §8.2), the buckets' recency, the longest
 * wait of several limits, the replay cache's pruning at its seconds' edges and after a `forget`
 * (SPEC §8.2: a `jti` accepted once while the token lives), the client address's IPv4-mapped rule,
 * the query string's length bound, and the API's recurring warnings (once a minute per message and
 * code).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Logger, TestClock } from "effect"
import { ApiLog, recurringWarning } from "../../src/services/api/ApiLog.js"
import { addressKey } from "../../src/services/api/ClientAddress.js"
import { DEFAULT_LIMITS, makeBuckets, retryAfterSeconds, takeAll } from "../../src/services/api/RateLimiter.js"
import { makeReplayCache } from "../../src/services/api/ReplayCache.js"
import { MAX_QUERY_LENGTH, queryParams } from "../../src/services/api/Xrpc.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"

const MIN = 60_000

describe("rate limits", () => {
  it("Retry-After is the wait rounded up to whole seconds: a call sent then is allowed", () => {
    // 7/min: a token every 8,571.43 ms, so the header says 9, not 8 (8 s later there is none yet)
    const b = makeBuckets({ limit: 7, perMs: MIN }, 10)
    for (let i = 0; i < 7; i++) expect(b.take("a", 0).allowed).toBe(true)
    const refused = b.take("a", 0)
    expect(refused.retryAfterMs).toBe(8572)
    expect(retryAfterSeconds(refused.retryAfterMs)).toBe(9)
    expect(b.take("a", 8000).allowed).toBe(false)
    expect(b.take("a", 9000).allowed).toBe(true)
    expect(retryAfterSeconds(1001)).toBe(2)
  })

  it("an allowed take makes its key the most recently used: the bound forgets another", () => {
    const b = makeBuckets({ limit: 2, perMs: MIN }, 3)
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("b", 0).allowed).toBe(true)
    // a is used again: b is now the least recently used
    expect(b.take("a", 0).allowed).toBe(true)
    expect(b.take("c", 0).allowed).toBe(true)
    // at the bound, d evicts b, not a
    expect(b.take("d", 0).allowed).toBe(true)
    expect(b.size()).toBe(3)
    // a kept its state (both tokens taken): refused; b was forgotten (full again)
    expect(b.take("a", 0).allowed).toBe(false)
    expect(b.take("b", 0).allowed).toBe(true)
    expect(b.take("b", 0).allowed).toBe(true)
  })

  it("each limiter tracks at most 100,000 keys (RateLimiter's documented bound)", () => {
    expect(DEFAULT_LIMITS.maxKeys).toBe(100_000)
  })

  it("takeAll waits for the longest of its refusals, whichever limit comes first", () => {
    const slow = makeBuckets({ limit: 1, perMs: MIN }, 10)
    const fast = makeBuckets({ limit: 60, perMs: MIN }, 10)
    expect(slow.take("d", 0).allowed).toBe(true)
    for (let i = 0; i < 60; i++) expect(fast.take("d", 0).allowed).toBe(true)
    expect(takeAll([[slow, "d"], [fast, "d"]], 0)).toEqual({ allowed: false, retryAfterMs: MIN })
    expect(takeAll([[fast, "d"], [slow, "d"]], 0)).toEqual({ allowed: false, retryAfterMs: MIN })
  })
})

describe("replay cache", () => {
  it("a token expiring later in the current second is recorded: its second use is a replay", () => {
    const c = makeReplayCache(10)
    expect(c.check("did:a", "j", 1_900, 1_200)).toBe("fresh")
    expect(c.check("did:a", "j", 1_900, 1_300)).toBe("replayed")
    expect(c.size()).toBe(1)
  })

  it("the seconds that ended are dropped, never the current one (many seconds indexed)", () => {
    const c = makeReplayCache(100)
    // entries in seconds 1..10, checked at second 0
    for (let s = 1; s <= 10; s++) expect(c.check("did:a", `j${s}`, s * 1000 + 200, 0)).toBe("fresh")
    // at 5.5 s: seconds 0..4 are over (j1..j4 forgotten), second 5 is not (j5 is kept)
    expect(c.check("did:a", "j5", 5_200, 5_500)).toBe("replayed")
    expect(c.check("did:a", "j4", 60_000, 5_500)).toBe("fresh")
    expect(c.check("did:a", "j6", 6_200, 5_500)).toBe("replayed")
  })

  it("a token forgotten and recorded again with a later expiry stays until that expiry", () => {
    const c = makeReplayCache(10)
    expect(c.check("did:a", "j", 1_500, 0)).toBe("fresh")
    // its check could not be completed: forgotten; the same jti comes back with a later expiry
    c.forget("did:a", "j")
    expect(c.check("did:a", "j", 5_500, 100)).toBe("fresh")
    // the first expiry's second ends: the entry of the second expiry is still there
    expect(c.check("did:a", "j", 5_500, 2_500)).toBe("replayed")
    expect(c.check("did:a", "j", 5_500, 5_900)).toBe("replayed")
    expect(c.check("did:a", "j", 5_500, 6_000)).toBe("fresh")
  })

  it("a token refused again and again (the shared store full or down) leaves nothing behind", () => {
    const c = makeReplayCache(10)
    // one valid 1 h token sent 10,000 times in one second: each check recorded, then forgotten
    for (let i = 0; i < 10_000; i++) {
      expect(c.check("did:a", "j", 3_600_000, 500)).toBe("fresh")
      c.forget("did:a", "j")
    }
    expect(c.size()).toBe(0)
    expect(c.indexed()).toBe(0)
    // forgetting what is not there changes nothing; the index follows the entries
    c.forget("did:a", "never")
    expect(c.check("did:a", "k", 2_500, 600)).toBe("fresh")
    expect(c.check("did:b", "k", 2_500, 600)).toBe("fresh")
    c.forget("did:a", "k")
    expect([c.size(), c.indexed()]).toEqual([1, 1])
    expect(c.check("did:a", "x", 60_000, 3_000)).toBe("fresh")
    expect([c.size(), c.indexed()]).toEqual([1, 1])
  })
})

describe("client address", () => {
  it("only ::ffff:a.b.c.d is IPv4-mapped: ::1 and ::a.b.c.d (IPv4-compatible) are IPv6 /64s", () => {
    expect(addressKey("::1")).toBe("0:0:0:0::/64")
    expect(addressKey("::7f00:1")).toBe("0:0:0:0::/64")
    expect(addressKey("::ffff:7f00:1")).toBe("127.0.0.1")
  })
})

describe("query strings", () => {
  it(`at most ${MAX_QUERY_LENGTH} characters are read; one more is InvalidRequest`, () => {
    const at = `/xrpc/x?p=${"v".repeat(MAX_QUERY_LENGTH - 2)}`
    const read = queryParams(at)
    expect(read._tag === "Right" ? String(read.right["p"]).length : "refused").toBe(MAX_QUERY_LENGTH - 2)
    const over = queryParams(`${at}v`)
    expect(over._tag === "Left" ? [over.left.status, over.left.error] : "read").toEqual([400, "InvalidRequest"])
    expect(MAX_QUERY_LENGTH).toBe(8192)
  })
})

describe("recurring warnings (ApiLog)", () => {
  const captured = () => {
    const lines: Array<{ message: string; annotations: Record<string, unknown> }> = []
    const logger = Logger.make(({ annotations, message }) =>
      void lines.push({
        message: Array.isArray(message) ? message.join(" ") : String(message),
        annotations: Object.fromEntries(annotations)
      })
    )
    return { lines, logger }
  }

  it.effect("once a minute per message and code, with the number held back", () =>
    Effect.gen(function*() {
      const { lines, logger } = captured()
      const log = RateLimitedLog.make()
      const under = (code: string) =>
        recurringWarning("api: the store failed", { code, reason: "x" }).pipe(
          Effect.provideService(ApiLog, log),
          Effect.provide(Logger.replace(Logger.defaultLogger, logger))
        )
      yield* under("08006")
      yield* under("08006")
      yield* under("08006")
      // another code is another warning
      yield* under("42P01")
      expect(lines.map((l) => [l.message, l.annotations["code"], l.annotations["suppressed"]])).toEqual([
        ["api: the store failed", "08006", 0],
        ["api: the store failed", "42P01", 0]
      ])
      yield* TestClock.adjust("1 minute")
      yield* under("08006")
      expect(lines[2]?.annotations).toEqual({ code: "08006", reason: "x", suppressed: 2 })
      // outside the API (no ApiLog): every time
      yield* recurringWarning("api: the store failed", { code: "08006" }).pipe(
        Effect.provide(Logger.replace(Logger.defaultLogger, logger))
      )
      expect(lines).toHaveLength(4)
    }))
})
