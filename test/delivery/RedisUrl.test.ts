/**
 * `REDIS_URL` parsing (SPEC §4.7, RedisUrl.ts) at its edges: the database and port bounds, the
 * length bound, canonical database numbers and percent-decoded credentials. The common cases and
 * the value-free errors are in publisher-resp.test.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Either, Redacted } from "effect"
import { parseRedisUrl } from "../../src/services/delivery/RedisUrl.js"

const ruleOf = (url: string): string | undefined => {
  const r = parseRedisUrl(url)
  return Either.isLeft(r) ? r.left.rule : undefined
}

const parsed = (url: string) => Either.getOrThrowWith(parseRedisUrl(url), (e) => new Error(e.message))

describe("parseRedisUrl: the edges", () => {
  it("database 65535 is the last one accepted; 65536 is out of range", () => {
    expect(parsed("redis://h/65535").db).toBe(65_535)
    expect(ruleOf("redis://h/65536")).toBe("database number must be in 0..65535")
  })

  it("a database number is written without leading zeros", () => {
    expect(parsed("redis://h/0").db).toBe(0)
    expect(parsed("redis://h/10").db).toBe(10)
    for (const url of ["redis://h/01", "redis://h/00", "redis://h/007"]) {
      expect(ruleOf(url), url).toBe("path must be empty or /<database number>")
    }
  })

  it("port 0 is rejected; ports 1 and 65535 are accepted", () => {
    expect(ruleOf("redis://h:0")).toBe("port must be in 1..65535")
    expect(parsed("redis://h:1").port).toBe(1)
    expect(parsed("rediss://h:65535").port).toBe(65_535)
  })

  it("a URL of exactly 2048 characters is accepted; one more is not", () => {
    const base = "redis://"
    const at = (n: number) => base + "a".repeat(n - base.length)
    expect(parsed(at(2048)).host).toHaveLength(2048 - base.length)
    expect(ruleOf(at(2049))).toBe("must be 1..2048 characters")
  })

  it("percent-encoded user names are decoded like passwords", () => {
    const t = parsed("redis://ops%40team:s%3Acret@cache.example/1")
    expect(t.username).toBe("ops@team")
    expect(t.password === undefined ? undefined : Redacted.value(t.password)).toBe("s:cret")
    expect(ruleOf("redis://%E0%A4%A@h")).toBe("has badly percent-encoded credentials")
  })
})
