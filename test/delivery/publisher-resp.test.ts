/**
 * The Redis publisher's protocol pieces (SPEC §4.7): parsing REDIS_URL, RESP2 encoding and parsing
 * (with the parser's bounds), the event JSON, the full-jitter backoff (on the TestClock), and a
 * RespConnection against fake TCP servers on 127.0.0.1. The publisher service itself is in
 * publisher.test.ts, its bounds and timing in publisher-timing.test.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Duration, Effect, Either, Option, Redacted, Schedule, TestClock } from "effect"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import { auditEvent } from "../support/auditEvent.js"
import { fakeRedis } from "../support/fakeRedis.js"
import { target } from "./publisher-support.js"

/** The delays a schedule asks for, read off the TestClock's pending sleeps. */
const sampleDelays = <Out>(schedule: Schedule.Schedule<Out, unknown>, n: number) =>
  Effect.gen(function*() {
    const driver = yield* Schedule.driver(schedule)
    const out: Array<number> = []
    for (let i = 0; i < n; i++) {
      const before = yield* TestClock.currentTimeMillis
      const fiber = yield* Effect.fork(driver.next(undefined))
      const pending = yield* Effect.repeat(TestClock.sleeps(), {
        until: (s) => Chunk.size(s) > 0 || fiber.unsafePoll() !== null
      })
      const wake = Chunk.head(pending).pipe(Option.getOrElse(() => before))
      out.push(wake - before)
      yield* TestClock.adjust(Duration.millis(wake - before))
      yield* fiber.await
    }
    return out
  })

describe("parseRedisUrl", () => {
  it("accepts redis:// and rediss:// URLs with credentials, port and database", () => {
    expect(Publisher.parseRedisUrl("redis://localhost")).toEqual(
      Either.right({ tls: false, host: "localhost", port: 6379, username: undefined, password: undefined, db: 0 })
    )
    const t = target("rediss://user:p%40ss@cache.example:6380/2")
    expect({ ...t, password: t.password === undefined ? undefined : Redacted.value(t.password) }).toEqual({
      tls: true,
      host: "cache.example",
      port: 6380,
      username: "user",
      password: "p@ss",
      db: 2
    })
    const v6 = target("redis://:pw@[::1]:7000/")
    expect(v6.host).toBe("::1")
    expect(v6.username).toBeUndefined()
    expect(v6.db).toBe(0)
  })

  it("rejects anything else with an error that never contains the value", () => {
    const bad = [
      "",
      "http://host:6379",
      "redis://",
      "redis://h/abc",
      "redis://h/1/2",
      "redis://h/99999999",
      "redis://h?password=hunter2",
      "redis://h#hunter2",
      "redis://u:%E0%A4%Ahunter2@h",
      "not a url hunter2",
      `redis://${"a".repeat(5000)}`
    ]
    for (const url of bad) {
      const r = Publisher.parseRedisUrl(url)
      expect(Either.isLeft(r), url).toBe(true)
      if (Either.isLeft(r)) {
        expect(r.left.message).toMatch(/^invalid REDIS_URL: /)
        expect(r.left.message).not.toContain("hunter2")
      }
    }
  })
})

describe("RESP2", () => {
  it("encodes commands as arrays of bulk strings (byte lengths)", () => {
    expect(Publisher.encodeCommand(["PUBLISH", "ch", "é"]).toString("utf8")).toBe(
      "*3\r\n$7\r\nPUBLISH\r\n$2\r\nch\r\n$2\r\né\r\n"
    )
  })

  it("parses every reply type, waits for incomplete input, rejects bad or oversized input", () => {
    const p = (s: string) => Publisher.parseReply(Buffer.from(s, "utf8"))
    expect(p("+OK\r\n")).toEqual({ _tag: "Done", reply: { _tag: "Simple", value: "OK" }, next: 5 })
    expect(p("-WRONGPASS invalid\r\n")).toMatchObject({ reply: { _tag: "Error", value: "WRONGPASS invalid" } })
    expect(p(":42\r\n")).toMatchObject({ reply: { _tag: "Integer", value: 42 } })
    expect(p("$5\r\nhello\r\n")).toMatchObject({ reply: { _tag: "Bulk", value: "hello" }, next: 11 })
    expect(p("$-1\r\n")).toMatchObject({ reply: { _tag: "Bulk", value: null } })
    expect(p("*2\r\n$1\r\na\r\n:1\r\n")).toMatchObject({
      reply: { _tag: "Array", value: [{ _tag: "Bulk", value: "a" }, { _tag: "Integer", value: 1 }] }
    })
    expect(p("*-1\r\n")).toMatchObject({ reply: { _tag: "Array", value: null } })
    for (const partial of ["", "+O", "+OK\r", ":4", "$5\r\nhel", "$5\r\nhello\r", "*2\r\n$1\r\na\r\n"]) {
      expect(p(partial), partial).toEqual({ _tag: "Incomplete" })
    }
    expect(p("?x\r\n")._tag).toBe("Invalid")
    expect(p(":x\r\n")._tag).toBe("Invalid")
    expect(p("$3\r\nabcd\r\n")._tag).toBe("Invalid")
    expect(p(`$${Publisher.RESP_LIMITS.maxBulk + 1}\r\n`)._tag).toBe("Invalid")
    expect(p(`*${Publisher.RESP_LIMITS.maxArray + 1}\r\n`)._tag).toBe("Invalid")
    expect(p("*1\r\n".repeat(Publisher.RESP_LIMITS.maxDepth + 2) + ":1\r\n")._tag).toBe("Invalid")
    expect(p("+" + "x".repeat(Publisher.RESP_LIMITS.maxLine + 1))._tag).toBe("Invalid")
    // two replies in one buffer: the second starts at `next`
    const two = Buffer.from("+OK\r\n:7\r\n")
    const first = Publisher.parseReply(two)
    expect(first._tag === "Done" && Publisher.parseReply(two, first.next)).toMatchObject({
      reply: { _tag: "Integer", value: 7 }
    })
  })

  it("the event JSON carries only the audit fields, with the URL redacted", () => {
    const withExtra = {
      ...auditEvent(),
      url: "[redacted]" as const,
      targetUrl: "https://receiver.example/hook?token=x"
    }
    const json = Publisher.encodeEvent(withExtra)
    expect(json).not.toContain("receiver.example")
    expect(JSON.parse(json)).toEqual(auditEvent())
  })

  it.effect("full-jitter backoff: the n-th delay is in [0, min(cap, base·2ⁿ))", () =>
    Effect.gen(function*() {
      const delays = yield* sampleDelays(Publisher.fullJitterBackoff("500 millis", "30 seconds"), 14)
      delays.forEach((d, n) => {
        expect(d).toBeGreaterThanOrEqual(0)
        expect(d).toBeLessThan(Math.min(30_000, 500 * 2 ** n))
      })
      // jittered, not fixed
      expect(new Set(delays).size).toBeGreaterThan(7)
    }))
})

// live clock: nothing here is timed; the deadlines only bound the waits
describe("RespConnection", () => {
  it.scopedLive("replies are matched to commands in order", () =>
    Effect.gen(function*() {
      const echo = (c: ReadonlyArray<string>) => {
        const text = c[1] ?? ""
        return c[0] === "ECHO" ? `$${text.length}\r\n${text}\r\n` : "+OK\r\n"
      }
      const fake = yield* fakeRedis(echo)
      const conn = yield* Publisher.connect(target(fake.url))
      const replies = yield* Effect.all(["a", "bb", "ccc"].map((x) => conn.command(["ECHO", x])), {
        concurrency: "unbounded"
      }).pipe(Effect.timeout("5 seconds"))
      expect(replies).toEqual([
        { _tag: "Bulk", value: "a" },
        { _tag: "Bulk", value: "bb" },
        { _tag: "Bulk", value: "ccc" }
      ])
    }))

  it.scopedLive("without onPush, a reply nobody asked for closes the connection", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => "+OK\r\n+EXTRA\r\n")
      const conn = yield* Publisher.connect(target(fake.url))
      yield* Effect.either(conn.command(["ECHO", "x"]))
      const why = yield* conn.closed.pipe(Effect.timeout("5 seconds"))
      expect(why).toMatchObject({ kind: "protocol", code: "unexpected_reply" })
      yield* fake.awaitState((x) => x.closed === 1).pipe(Effect.timeout("5 seconds"))
    }))

  it.scopedLive("commands beyond maxPending awaiting replies fail at once with busy", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const conn = yield* Publisher.connect(target(fake.url), { maxPending: 2 })
      yield* Effect.forkScoped(conn.command(["ECHO", "1"]))
      yield* Effect.forkScoped(conn.command(["ECHO", "2"]))
      yield* fake.awaitState((x) => x.commands.length === 2).pipe(Effect.timeout("5 seconds"))
      const third = yield* Effect.either(conn.command(["ECHO", "3"])).pipe(Effect.timeout("5 seconds"))
      expect(Either.isLeft(third) && third.left).toMatchObject({ kind: "busy", code: "pending" })
    }))

  it("a line or a bulk string exactly at the parser's bounds is read; one byte more is invalid", () => {
    const { maxBulk, maxLine } = Publisher.RESP_LIMITS
    const p = (b: Buffer) => Publisher.parseReply(b)
    expect(p(Buffer.from(`+${"x".repeat(maxLine)}\r\n`))._tag).toBe("Done")
    expect(p(Buffer.from(`+${"x".repeat(maxLine + 1)}\r\n`))._tag).toBe("Invalid")
    expect(p(Buffer.from(`$${maxBulk}\r\n${"x".repeat(maxBulk)}\r\n`))).toMatchObject({
      _tag: "Done",
      next: `$${maxBulk}\r\n`.length + maxBulk + 2
    })
  })
})
