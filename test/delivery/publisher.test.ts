/**
 * The Redis publisher (SPEC §4.7): against a real Redis (REDIS_URL, else a redis-server spawned on
 * a free port) and against fake TCP servers on 127.0.0.1 that answer what a test needs (or never
 * answer). Time-based behaviour (reply timeout, backoff) runs on the TestClock; the tests wait for
 * states and socket events, never for time. The URL and RESP pieces are in publisher-resp.test.ts,
 * the bounds and timing in publisher-timing.test.ts, further edges in publisher-edges.test.ts.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Either, Exit, Queue, Redacted, Scope, TestClock } from "effect"
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import { auditEvent } from "../support/auditEvent.js"
import { captureLogs } from "../support/captureLogs.js"
import { asStrings, fakeRedis } from "../support/fakeRedis.js"
import { freePort } from "../support/proc.js"
import { closedPort, driveUntil, newHealth, publisherIn, target } from "./publisher-support.js"

// ---------------------------------------------------------------------------------------------
// A real Redis

let redisUrl: string | undefined = undefined
let redisChild: ChildProcess | undefined = undefined

beforeAll(async () => {
  const fromEnv = process.env["REDIS_URL"]
  if (fromEnv !== undefined && fromEnv.length > 0) {
    redisUrl = fromEnv
    return
  }
  if (spawnSync("sh", ["-c", "command -v redis-server"]).status !== 0) {
    console.log("Redis tests not run: no REDIS_URL and no redis-server binary")
    return
  }
  const port = await freePort()
  const child = spawn(
    "redis-server",
    ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    { stdio: ["ignore", "pipe", "pipe"] }
  )
  redisChild = child
  await new Promise<void>((resolve, reject) => {
    let out = ""
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString()
      if (out.includes("Ready to accept connections")) resolve()
    })
    child.once("exit", (code) => reject(new Error(`redis-server exited (${code})`)))
  })
  redisUrl = `redis://127.0.0.1:${port}`
}, 30_000)

afterAll(() => {
  redisChild?.kill("SIGTERM")
})

/** Advance the TestClock `n` times by `step`. */
const ticks = (step: Duration.DurationInput, n: number) => Effect.repeatN(TestClock.adjust(step), n - 1)

describe("Publisher against a real Redis", () => {
  it.scoped("a subscriber on the channel receives the event JSON; an oversize event is dropped and counted", () =>
    Effect.gen(function*() {
      if (redisUrl === undefined) {
        console.log("Redis tests not run: no REDIS_URL and no redis-server binary")
        return
      }
      const channel = `webhook:events:test:${randomBytes(6).toString("hex")}`
      const messages = yield* Queue.unbounded<string>()
      const subscriber = yield* Publisher.connect(target(redisUrl), {
        onPush: (reply) => {
          const parts = asStrings(reply)
          if (parts[0] === "message" && parts[1] === channel && parts[2] !== undefined) {
            Queue.unsafeOffer(messages, parts[2])
          }
        }
      })
      yield* subscriber.command(["SUBSCRIBE", channel])

      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(redisUrl), channel })
      yield* p.awaitStats((s) => s.connected)

      const big = auditEvent({ collection: "x".repeat(9000) })
      yield* p.publish(big)
      expect(yield* p.stats).toMatchObject({ dropped: 1, published: 0 })
      const e = auditEvent({ status: "dead_letter", httpStatus: null, errorKind: "timeout" })
      yield* p.publish(e)
      const received = yield* Queue.take(messages)
      expect(JSON.parse(received)).toEqual(e)
      expect(received.length).toBeLessThanOrEqual(8 * 1024)
      yield* p.awaitStats((s) => s.published === 1)
      expect(yield* p.stats).toEqual({ configured: true, connected: true, dropped: 1, published: 1 })
      const report = yield* health.report
      expect(report.body["redis"]).toEqual({ configured: true, connected: true, dropped: 1 })
      // only one message arrived: the oversize one never went out
      yield* p.publish(auditEvent({ rkey: "second" }))
      expect(JSON.parse(yield* Queue.take(messages)).rkey).toBe("second")
      expect(yield* Queue.size(messages)).toBe(0)
    }))
})

describe("Publisher", () => {
  it.scoped("without a URL: a no-op publisher, configured false, ready", () =>
    Effect.gen(function*() {
      const { health, lifecycle } = yield* newHealth
      yield* lifecycle.setPhase("live")
      const p = yield* publisherIn(health, { url: undefined, channel: "webhook:events" })
      yield* p.publish(auditEvent())
      expect(yield* p.stats).toEqual({ configured: false, connected: false, dropped: 0, published: 0 })
      const report = yield* health.report
      expect(report.ready).toBe(true)
      expect(report.body["redis"]).toEqual({ configured: false, connected: false, dropped: 0 })
    }))

  it.scoped("an invalid URL fails the layer with a value-free error", () =>
    Effect.gen(function*() {
      const { health } = yield* newHealth
      const r = yield* Effect.either(
        publisherIn(health, { url: Redacted.make("http://:hunter2@h"), channel: "c" })
      )
      expect(Either.isLeft(r) && r.left._tag).toBe("RedisUrlInvalid")
      expect(Either.isLeft(r) && r.left.message).not.toContain("hunter2")
    }))

  it.scoped("unreachable Redis: publish returns at once and counts a drop; health connected false, still ready", () =>
    Effect.gen(function*() {
      const port = yield* closedPort
      const { health, lifecycle } = yield* newHealth
      yield* lifecycle.setPhase("live")
      const p = yield* publisherIn(health, { url: Redacted.make(`redis://127.0.0.1:${port}`), channel: "c" })
      for (let i = 0; i < 3; i++) yield* p.publish(auditEvent())
      expect(yield* p.stats).toEqual({ configured: true, connected: false, dropped: 3, published: 0 })
      // let it try (and fail) a few connections: still nothing connected, nothing buffered
      yield* ticks("1 second", 20)
      yield* p.publish(auditEvent())
      expect(yield* p.stats).toEqual({ configured: true, connected: false, dropped: 4, published: 0 })
      const report = yield* health.report
      expect(report.ready).toBe(true)
      expect(report.body["redis"]).toEqual({ configured: true, connected: false, dropped: 4 })
    }))

  it.scoped("over 4 in flight → dropped; a reply slower than 1 s → dropped and the connection reset", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" })
      yield* p.awaitStats((s) => s.connected)
      for (let i = 0; i < 6; i++) yield* p.publish(auditEvent({ rkey: `r${i}` })) // each returns at once
      expect(yield* p.stats).toMatchObject({ connected: true, dropped: 2, published: 0 })
      const s = yield* fake.awaitState((x) => x.commands.length === 4)
      expect(s.commands.map((c) => c[0])).toEqual(["PUBLISH", "PUBLISH", "PUBLISH", "PUBLISH"])
      expect(s.commands.map((c) => JSON.parse(c[2] ?? "{}").rkey)).toEqual(["r0", "r1", "r2", "r3"])
      // the four are waiting for replies; a fifth is still refused
      yield* p.publish(auditEvent())
      expect((yield* p.stats).dropped).toBe(3)
      yield* TestClock.adjust("999 millis")
      expect((yield* p.stats).dropped).toBe(3)
      yield* driveUntil(Effect.map(p.stats, (x) => x.dropped === 7), "1 millis")
      // the silent server's connection was reset
      yield* fake.awaitState((x) => x.closed >= 1)
      expect((yield* p.stats).published).toBe(0)
    }))

  it.scoped("a server that stops answering (a hung or SIGSTOPped Redis) is logged as a reply timeout, not a local close", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" }).pipe(
        Effect.provide(logs.layer)
      )
      yield* p.awaitStats((s) => s.connected)
      yield* p.publish(auditEvent())
      yield* fake.awaitState((x) => x.commands.length === 1)
      yield* driveUntil(
        Effect.map(logs.lines, (ls) => ls.some((l) => l.includes("redis connection lost"))),
        "10 millis"
      )
      const lost = (yield* logs.lines).find((l) => l.includes("redis connection lost")) ?? ""
      expect(lost).toContain("\"kind\":\"timeout\"")
      expect(lost).toContain("\"code\":\"reply\"")
    }))

  // live clock: nothing here is timed; the deadline only bounds the wait for the 40 commands
  it.scopedLive("REDIS_PUBLISH_MAX_IN_FLIGHT above 16: that many messages await their replies on the connection", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, {
        url: Redacted.make(fake.url),
        channel: "c",
        maxInFlight: 40,
        replyTimeout: "1 hour"
      })
      yield* p.awaitStats((s) => s.connected)
      for (let i = 0; i < 41; i++) yield* p.publish(auditEvent({ rkey: `r${i}` }))
      yield* fake.awaitState((x) => x.commands.length >= 40).pipe(Effect.timeout("10 seconds"), Effect.ignore)
      const rkeys = (yield* fake.state).commands.map((c) => JSON.parse(c[2] ?? "{}").rkey)
      expect(rkeys).toEqual(Array.from({ length: 40 }, (_, i) => `r${i}`))
      // only the 41st was dropped (in flight); none on a bound of the connection's own
      expect(yield* p.stats).toMatchObject({ connected: true, dropped: 1, published: 0 })
    }))

  it.scoped("reconnects with backoff after the server comes back", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "chan" })
      yield* p.awaitStats((s) => s.connected)
      yield* p.publish(auditEvent({ rkey: "before" }))
      yield* p.awaitStats((s) => s.published === 1)

      yield* fake.stop
      yield* p.awaitStats((s) => !s.connected)
      yield* p.publish(auditEvent())
      expect(yield* p.stats).toMatchObject({ connected: false, dropped: 1, published: 1 })
      expect((yield* health.report).body["redis"]).toEqual({ configured: true, connected: false, dropped: 1 })
      // while it is down, attempts fail and back off; nothing is buffered
      yield* ticks("1 second", 10)
      yield* fake.start
      yield* driveUntil(Effect.map(p.stats, (s) => s.connected), "100 millis")
      yield* p.publish(auditEvent({ rkey: "after" }))
      yield* p.awaitStats((s) => s.published === 2)
      const commands = (yield* fake.state).commands.filter((c) => c[0] === "PUBLISH")
      expect(commands.map((c) => [c[1], JSON.parse(c[2] ?? "{}").rkey])).toEqual([
        ["chan", "before"],
        ["chan", "after"]
      ])
      expect((yield* fake.state).connections).toBeGreaterThanOrEqual(2)
    }))

  it.scoped("AUTH and SELECT come from the URL", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":0\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const url = `redis://alice:s3cret@127.0.0.1:${fake.port}/3`
      const p = yield* publisherIn(health, { url: Redacted.make(url), channel: "c" })
      yield* p.awaitStats((s) => s.connected)
      yield* p.publish(auditEvent())
      yield* p.awaitStats((s) => s.published === 1)
      const commands = (yield* fake.state).commands
      expect(commands.slice(0, 2)).toEqual([["AUTH", "alice", "s3cret"], ["SELECT", "3"]])
      expect(commands[2]?.[0]).toBe("PUBLISH")
    }))

  it.scoped("a rejected password: retried with backoff, logged at most once a minute, never with the URL or password", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((
        c
      ) => (c[0] === "AUTH" ? "-WRONGPASS invalid username-password pair\r\n" : "+OK\r\n"))
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      const url = `redis://bob:hunter2@127.0.0.1:${fake.port}`
      const p = yield* publisherIn(health, { url: Redacted.make(url), channel: "c" }).pipe(Effect.provide(logs.layer))
      const start = yield* TestClock.currentTimeMillis
      yield* driveUntil(Effect.map(fake.state, (s) => s.connections >= 6), "100 millis")
      const elapsed = (yield* TestClock.currentTimeMillis) - start
      expect((yield* p.stats).connected).toBe(false)
      const lines = (yield* logs.lines).filter((l) => l.includes("redis connection"))
      expect(lines.length).toBeGreaterThanOrEqual(1)
      expect(lines.length).toBeLessThanOrEqual(Math.floor(elapsed / 60_000) + 1)
      expect(lines[0]).toContain("\"kind\":\"auth\"")
      expect(lines[0]).toContain("\"code\":\"WRONGPASS\"")
      for (const line of yield* logs.lines) {
        expect(line).not.toContain("hunter2")
        expect(line).not.toContain("bob")
        expect(line).not.toContain(String(fake.port))
        expect(line).not.toContain("redis://")
      }
    }))

  it.scoped("no password in the URL but the server requires one: not connected, logged as auth NOAUTH, retried", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => "-NOAUTH Authentication required.\r\n", {
        ping: "-NOAUTH Authentication required.\r\n"
      })
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" }).pipe(
        Effect.provide(logs.layer)
      )
      yield* driveUntil(Effect.map(fake.state, (s) => s.connections >= 3), "100 millis")
      yield* p.publish(auditEvent())
      expect(yield* p.stats).toEqual({ configured: true, connected: false, dropped: 1, published: 0 })
      expect((yield* fake.state).commands).toEqual([])
      const lines = (yield* logs.lines).filter((l) => l.includes("redis connection failed"))
      expect(lines.length).toBe(1)
      expect(lines[0]).toContain("\"kind\":\"auth\"")
      expect(lines[0]).toContain("\"code\":\"NOAUTH\"")
    }))

  it.scoped("closing the scope closes the socket", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => "+OK\r\n")
      const { health } = yield* newHealth
      const scope = yield* Scope.make()
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" }).pipe(Scope.extend(scope))
      yield* p.awaitStats((s) => s.connected)
      yield* fake.awaitState((s) => s.connections === 1)
      yield* Scope.close(scope, Exit.void)
      yield* fake.awaitState((s) => s.closed === 1)
      expect((yield* health.report).body["redis"]).toBeUndefined()
    }))

  it.scoped("a reply that overflows the read buffer closes the connection", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => `$${200_000}\r\n${"x".repeat(100_000)}`)
      const closed = yield* Deferred.make<Publisher.RedisError>()
      const conn = yield* Publisher.connect(target(fake.url))
      yield* Effect.fork(Effect.flatMap(conn.closed, (e) => Deferred.succeed(closed, e)))
      const r = yield* Effect.either(conn.command(["ECHO", "x"]))
      expect(Either.isLeft(r) && r.left).toMatchObject({ kind: "protocol", code: "read_buffer" })
      expect(yield* Deferred.await(closed)).toMatchObject({ kind: "protocol" })
    }))
})
