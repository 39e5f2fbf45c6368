import { describe, expect, it } from "@effect/vitest"
import { classifyStatus, failureKinds, isRetryable, parseRetryAfter } from "../../src/services/delivery/Classify.js"

describe("classifyStatus", () => {
  it("2xx is delivered", () => {
    for (const s of [200, 201, 202, 204, 299]) expect(classifyStatus(s)).toEqual({ outcome: "delivered" })
  })

  it("5xx and 408/409/423/425 are retryable http_5xx", () => {
    for (const s of [500, 502, 503, 504, 599, 408, 409, 423, 425]) {
      expect(classifyStatus(s)).toEqual({ outcome: "failed", kind: "http_5xx", retryable: true })
    }
  })

  it("429 is retryable http_429", () => {
    expect(classifyStatus(429)).toEqual({ outcome: "failed", kind: "http_429", retryable: true })
  })

  it("410 is gone, not retried", () => {
    expect(classifyStatus(410)).toEqual({ outcome: "failed", kind: "gone", retryable: false })
  })

  it("other 4xx are http_4xx, not retried", () => {
    for (const s of [400, 401, 403, 404, 405, 406, 407, 411, 413, 415, 422, 424, 426, 431, 451, 499]) {
      expect(classifyStatus(s)).toEqual({ outcome: "failed", kind: "http_4xx", retryable: false })
    }
  })

  it("1xx and 3xx are redirect, not retried", () => {
    for (const s of [100, 101, 103, 199, 300, 301, 302, 303, 304, 307, 308, 399]) {
      expect(classifyStatus(s)).toEqual({ outcome: "failed", kind: "redirect", retryable: false })
    }
  })

  it("statuses outside 100–599 are treated as a broken server (retryable http_5xx)", () => {
    for (const s of [0, 99, 600, 999, 200.5, Number.NaN]) {
      expect(classifyStatus(s)).toEqual({ outcome: "failed", kind: "http_5xx", retryable: true })
    }
  })
})

describe("isRetryable", () => {
  it("matches the SPEC §4.3 table for every kind", () => {
    const retryable = failureKinds.filter(isRetryable)
    expect(retryable.sort()).toEqual(
      ["dns", "http_429", "http_5xx", "network", "secret_unavailable", "subscription_unavailable", "timeout"].sort()
    )
    expect(failureKinds).toHaveLength(15)
    for (
      const k of [
        "gone",
        "http_4xx",
        "redirect",
        "invalid_target",
        "blocked_target",
        "request_too_large",
        "response_too_large",
        "transform_failed"
      ] as const
    ) {
      expect(isRetryable(k)).toBe(false)
    }
  })
})

describe("parseRetryAfter", () => {
  const now = Date.UTC(2026, 0, 15, 12, 0, 0) // Thu, 15 Jan 2026 12:00:00 GMT

  it("delta-seconds", () => {
    expect(parseRetryAfter("0", now)).toBe(0)
    expect(parseRetryAfter("120", now)).toBe(120_000)
    expect(parseRetryAfter(" 7 ", now)).toBe(7_000)
    expect(parseRetryAfter("0042", now)).toBe(42_000)
    expect(parseRetryAfter("9".repeat(400), now)).toBe(Number.MAX_SAFE_INTEGER)
  })

  it("IMF-fixdate", () => {
    expect(parseRetryAfter("Thu, 15 Jan 2026 12:01:30 GMT", now)).toBe(90_000)
    expect(parseRetryAfter("Sat, 29 Feb 2028 00:00:00 GMT", now)).toBe(Date.UTC(2028, 1, 29) - now)
  })

  it("obsolete RFC 850 and asctime forms", () => {
    expect(parseRetryAfter("Thursday, 15-Jan-26 12:00:10 GMT", now)).toBe(10_000)
    expect(parseRetryAfter("Thu Jan 15 12:00:05 2026", now)).toBe(5_000)
    expect(parseRetryAfter("Sun Feb  1 12:00:00 2026", now)).toBe(17 * 86_400_000)
  })

  it("RFC 850 two-digit years more than 50 years ahead are in the past century (→ 0)", () => {
    expect(parseRetryAfter("Sunday, 06-Nov-94 08:49:37 GMT", now)).toBe(0)
  })

  it("RFC 850: exactly 50 years ahead is still the future (only MORE than 50 years ahead is the past century)", () => {
    expect(parseRetryAfter("Wednesday, 15-Jan-76 12:00:00 GMT", now)).toBe(Date.UTC(2076, 0, 15, 12, 0, 0) - now)
    expect(parseRetryAfter("Friday, 15-Jan-77 12:00:00 GMT", now)).toBe(0)
  })

  it("a leap second (:60) is accepted and lands on the next minute", () => {
    expect(parseRetryAfter("Thu, 15 Jan 2026 12:00:60 GMT", now)).toBe(60_000)
  })

  it("a date in the past is 0, never negative", () => {
    expect(parseRetryAfter("Thu, 15 Jan 2026 11:59:59 GMT", now)).toBe(0)
    expect(parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", now)).toBe(0)
  })

  it("absent or unparseable is undefined", () => {
    for (
      const v of [
        undefined,
        "",
        "   ",
        "-5",
        "1.5",
        "+10",
        "soon",
        "10s",
        "Thu, 15 Jan 2026 12:01:30 UTC",
        "Thu, 15 Jan 2026 12:01:30",
        "Thu, 32 Jan 2026 12:00:00 GMT",
        "Thu, 29 Feb 2026 12:00:00 GMT",
        "Thu, 15 Foo 2026 12:00:00 GMT",
        "Thu, 15 Jan 2026 24:00:00 GMT",
        "Xyz, 15 Jan 2026 12:00:00 GMT",
        "2026-01-15T12:01:30Z"
      ]
    ) {
      expect(parseRetryAfter(v, now)).toBeUndefined()
    }
  })
})

describe("parseRetryAfter: calendar edges (policy audit)", () => {
  const now = Date.UTC(2026, 0, 15, 12, 0, 0)

  it("29 February exists in a year divisible by 400 (2000), not in one divisible by 100 only (2100)", () => {
    expect(parseRetryAfter("Tue, 29 Feb 2000 12:00:00 GMT", now)).toBe(0)
    expect(parseRetryAfter("Mon, 29 Feb 2100 12:00:00 GMT", now)).toBeUndefined()
  })

  it("day 00, 31 April and minute 60 are not dates", () => {
    expect(parseRetryAfter("Thu, 30 Apr 2026 12:00:00 GMT", now)).toBe(Date.UTC(2026, 3, 30, 12) - now)
    expect(parseRetryAfter("Fri, 31 Apr 2026 12:00:00 GMT", now)).toBeUndefined()
    expect(parseRetryAfter("Thu, 00 Jan 2026 12:00:00 GMT", now)).toBeUndefined()
    expect(parseRetryAfter("Thu, 15 Jan 2026 12:60:00 GMT", now)).toBeUndefined()
  })

  it("RFC 850 late in a century: a two-digit year exactly 50 years back is read 50 years ahead (RFC 9110)", () => {
    // in 2080, "30" is 2030 or 2130: only a year MORE than 50 years ahead goes to the past, so 2130
    const in2080 = Date.UTC(2080, 0, 15, 12, 0, 0)
    expect(parseRetryAfter("Tuesday, 15-Jan-30 12:00:00 GMT", in2080)).toBe(
      Date.UTC(2130, 0, 15, 12, 0, 0) - in2080
    )
    // "31": 2131 would be 51 years ahead, so it is 2031, in the past
    expect(parseRetryAfter("Wednesday, 15-Jan-31 12:00:00 GMT", in2080)).toBe(0)
  })
})
