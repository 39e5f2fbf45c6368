/**
 * The Redis publisher (SPEC §4.7): against a real Redis (REDIS_URL, else a redis-server spawned on
 * a free port) and against fake TCP servers on 127.0.0.1 that answer what a test needs (or never
 * answer). Time-based behaviour (reply timeout, backoff) runs on the TestClock; the tests wait for
 * states and socket events, never for time.
 */
import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import {
  Chunk,
  Deferred,
  Duration,
  Effect,
  Either,
  Exit,
  Option,
  Queue,
  Redacted,
  Ref,
  Schedule,
  Scope,
  TestClock,
  TestServices
} from "effect"
import { type ChildProcess, spawn, spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import * as Net from "node:net"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { auditEvent } from "../support/auditEvent.js"
import { captureLogs } from "../support/captureLogs.js"
import { asStrings, fakeRedis } from "../support/fakeRedis.js"
import { halfJitter } from "../support/halfJitter.js"
import { seriesValue } from "../support/metricSeries.js"
import { freePort } from "../support/proc.js"

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

// ---------------------------------------------------------------------------------------------
// Helpers

const newHealth = Effect.gen(function*() {
  const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
  const health = yield* Health.make.pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
  return { lifecycle, health }
})

const publisherIn = (health: Health.HealthShape, options: Publisher.PublisherOptions) =>
  Publisher.make(options).pipe(Effect.provideService(Health.Health, health))

/** Advance the TestClock in `step`s until `done` holds (each step lets socket I/O progress). */
const driveUntil = (done: Effect.Effect<boolean>, step: Duration.DurationInput, maxSteps = 5_000) =>
  Effect.gen(function*() {
    for (let i = 0; i < maxSteps; i++) {
      if (yield* done) return i
      yield* TestClock.adjust(step)
    }
    return yield* Effect.dieMessage("condition not reached")
  })

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

/** Advance the TestClock `n` times by `step`. */
const ticks = (step: Duration.DurationInput, n: number) => Effect.repeatN(TestClock.adjust(step), n - 1)

const target = (url: string) => Either.getOrThrowWith(Publisher.parseRedisUrl(url), (e) => new Error(e.message))

/** A port nothing listens on. */
const closedPort = Effect.promise(freePort)

// ---------------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------------
// Bounds and timing the module's header promises (mutation audit, stop 34)

/**
 * A server whose behaviour a test switches: `refuse` (accept, then close before answering), `flap`
 * (answer the PING, then close), `serve` (answer the PING and keep the connection). Counts the
 * connections it accepted; `dropAll` closes every open one.
 */
const switchableServer = (initial: "refuse" | "flap" | "serve") =>
  Effect.gen(function*() {
    let mode = initial
    const connections = yield* Ref.make(0)
    const sockets = new Set<Net.Socket>()
    const server = Net.createServer((socket) => {
      sockets.add(socket)
      Effect.runSync(Ref.update(connections, (n) => n + 1))
      socket.on("error", () => {})
      socket.on("close", () => sockets.delete(socket))
      if (mode === "refuse") return void socket.destroy()
      socket.on("data", () => {
        socket.write("+PONG\r\n")
        if (mode === "flap") socket.end()
      })
    })
    const port = yield* Effect.acquireRelease(
      Effect.async<number>((resume) => {
        server.listen(0, "127.0.0.1", () => {
          const address = server.address()
          resume(Effect.succeed(typeof address === "object" && address !== null ? address.port : 0))
        })
      }),
      () =>
        Effect.async<void>((resume) => {
          for (const s of sockets) s.destroy()
          server.close(() => resume(Effect.void))
        })
    )
    return {
      url: `redis://127.0.0.1:${port}`,
      connections: Ref.get(connections),
      setMode: (m: "refuse" | "flap" | "serve") => Effect.sync(() => (mode = m)),
      dropAll: Effect.sync(() => {
        for (const s of sockets) s.destroy()
      })
    }
  })

/** The count of `firehook_redis_dropped_total{reason}` (the metric registry is global: compare deltas). */
const droppedCount = (reason: string) => seriesValue("firehook_redis_dropped_total", { reason })

/** `effect`, failing with a TimeoutException after `d` of real time (the TestClock does not move it). */
const withinReal = <A, E>(effect: Effect.Effect<A, E>, d: Duration.DurationInput) =>
  TestServices.provideLive(Effect.timeout(effect, d))

describe("Publisher: bounds and timing", () => {
  it.scoped("a message of exactly 8 KiB, counted in UTF-8 bytes, goes out; one byte more is dropped as oversize", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" })
      yield* p.awaitStats((s) => s.connected)
      const max = Publisher.DEFAULTS.maxMessageBytes
      expect(max).toBe(8 * 1024)
      // pad the collection with "é" (2 bytes, 1 UTF-16 unit) up to exactly `max` bytes
      const room = max - Buffer.byteLength(Publisher.encodeEvent(auditEvent({ collection: "" })), "utf8")
      const exact = auditEvent({ collection: "a".repeat(room % 2) + "é".repeat(Math.floor(room / 2)) })
      expect(Buffer.byteLength(Publisher.encodeEvent(exact), "utf8")).toBe(max)
      const over = auditEvent({ collection: `${exact.collection}a` })
      // far fewer characters than bytes: a bound on `.length` would let it through
      expect(Publisher.encodeEvent(over).length).toBeLessThan(max)
      const oversizeBefore = yield* droppedCount("oversize")

      yield* p.publish(exact)
      yield* p.awaitStats((s) => s.published + s.dropped === 1)
      yield* p.publish(over)
      yield* p.awaitStats((s) => s.published + s.dropped === 2)
      expect(yield* p.stats).toMatchObject({ published: 1, dropped: 1 })
      expect((yield* droppedCount("oversize")) - oversizeBefore).toBe(1)
      const sent = (yield* fake.state).commands.filter((c) => c[0] === "PUBLISH")
      expect(sent.map((c) => JSON.parse(c[2] ?? "{}").collection)).toEqual([exact.collection])
    }))

  it.scoped("each reply frees its in-flight slot: ten messages sent one after another all go out", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" })
      yield* p.awaitStats((s) => s.connected)
      for (let i = 0; i < 10; i++) {
        yield* p.publish(auditEvent({ rkey: `r${i}` }))
        yield* p.awaitStats((s) => s.published + s.dropped === i + 1)
      }
      expect(yield* p.stats).toMatchObject({ connected: true, published: 10, dropped: 0 })
    }))

  it.scoped("the reply timeout is 1 s: a message still unanswered at 999 ms is dropped (as timeout) at 1000 ms", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" })
      yield* p.awaitStats((s) => s.connected)
      const timeoutBefore = yield* droppedCount("timeout")
      yield* p.publish(auditEvent())
      yield* fake.awaitState((x) => x.commands.length === 1)
      yield* TestClock.adjust("999 millis")
      expect((yield* p.stats).dropped).toBe(0)
      yield* TestClock.adjust("1 millis")
      const after = yield* withinReal(p.awaitStats((s) => s.dropped === 1), "5 seconds")
      expect(after).toMatchObject({ dropped: 1, published: 0 })
      expect((yield* droppedCount("timeout")) - timeoutBefore).toBe(1)
    }))

  it.scoped("a server that accepts but never answers the handshake: given up after the 5 s connect timeout, logged, retried", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined, { ping: "" }) // the PING is never answered
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" }).pipe(
        Effect.provide(logs.layer)
      )
      yield* fake.awaitState((x) => x.connections === 1)
      const start = yield* TestClock.currentTimeMillis
      yield* driveUntil(Effect.map(fake.state, (x) => x.closed >= 1), "50 millis", 200)
      const elapsed = (yield* TestClock.currentTimeMillis) - start
      expect(elapsed).toBeGreaterThanOrEqual(5_000)
      expect(elapsed).toBeLessThan(6_000)
      expect((yield* p.stats).connected).toBe(false)
      const failed = (yield* logs.lines).find((l) => l.includes("redis connection failed")) ?? ""
      expect(failed).toContain("\"kind\":\"timeout\"")
      expect(failed).toContain("\"code\":\"connect\"")
      yield* driveUntil(Effect.map(fake.state, (x) => x.connections >= 2), "50 millis", 200)
    }))

  it.scoped("a server that drops each connection after the handshake: reconnects back off from 500 ms, doubling; losses logged at most once a minute", () =>
    Effect.gen(function*() {
      const server = yield* switchableServer("flap")
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      yield* publisherIn(health, { url: Redacted.make(server.url), channel: "c" }).pipe(
        Effect.provide(logs.layer),
        Effect.withRandom(halfJitter)
      )
      yield* driveUntil(Effect.map(server.connections, (n) => n >= 1), "10 millis")
      const start = yield* TestClock.currentTimeMillis
      yield* driveUntil(Effect.map(server.connections, (n) => n >= 6), "10 millis")
      const elapsed = (yield* TestClock.currentTimeMillis) - start
      // r = 0.5: delays 250, 500, 1000, 2000, 4000 ms = 7750 (a short-lived connection does not
      // reset them); `start` is read a few steps after the first connection, hence the margin
      expect(elapsed).toBeGreaterThanOrEqual(7_000)
      expect(elapsed).toBeLessThan(9_000)
      const lines = (yield* logs.lines).filter((l) => l.includes("redis connection"))
      expect(lines.length).toBe(1)
      expect(lines[0]).toContain("redis connection lost")
    }))

  it.scoped("the backoff is capped at 30 s, and starts over after a connection that stayed up for a whole cap", () =>
    Effect.gen(function*() {
      const server = yield* switchableServer("refuse")
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(server.url), channel: "c" }).pipe(
        Effect.withRandom(halfJitter)
      )
      // r = 0.5: 250, 500, …, 8000, then 15000 ms for ever (half the 30 s cap)
      yield* driveUntil(Effect.map(server.connections, (n) => n >= 10), "100 millis")
      yield* server.setMode("serve")
      const back = yield* TestClock.currentTimeMillis
      yield* driveUntil(Effect.map(p.stats, (s) => s.connected), "100 millis")
      expect((yield* TestClock.currentTimeMillis) - back).toBeLessThanOrEqual(15_500)

      // up for more than a cap, then lost: the next attempt uses the first delay again (250 ms)
      yield* TestClock.adjust("31 seconds")
      yield* server.dropAll
      yield* p.awaitStats((s) => !s.connected)
      const lost = yield* TestClock.currentTimeMillis
      yield* driveUntil(Effect.map(p.stats, (s) => s.connected), "10 millis")
      expect((yield* TestClock.currentTimeMillis) - lost).toBeLessThan(1_500)
    }))

  it.scoped("AUTH with a password and no user name is AUTH <password>", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":0\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, {
        url: Redacted.make(`redis://:s3cret@127.0.0.1:${fake.port}`),
        channel: "c"
      })
      yield* p.awaitStats((s) => s.connected)
      expect((yield* fake.state).commands[0]).toEqual(["AUTH", "s3cret"])
    }))

  it.scoped("a publish while not connected is counted under reason not_connected", () =>
    Effect.gen(function*() {
      const port = yield* closedPort
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(`redis://127.0.0.1:${port}`), channel: "c" })
      const before = yield* droppedCount("not_connected")
      yield* p.publish(auditEvent())
      expect((yield* droppedCount("not_connected")) - before).toBe(1)
    }))

  // live clock: nothing here is timed; the deadlines only bound the waits
  it.scopedLive("an error reply drops the message (reason error) and keeps the connection", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? "-ERR no such thing\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c", replyTimeout: "1 hour" })
      yield* p.awaitStats((s) => s.connected)
      const before = yield* droppedCount("error")
      yield* p.publish(auditEvent({ rkey: "one" }))
      yield* p.awaitStats((s) => s.dropped === 1)
      yield* p.publish(auditEvent({ rkey: "two" }))
      yield* p.awaitStats((s) => s.dropped === 2).pipe(Effect.timeout("5 seconds"))
      const s = yield* fake.awaitState((x) => x.commands.length === 2).pipe(Effect.timeout("5 seconds"))
      expect(s.connections).toBe(1)
      expect(s.closed).toBe(0)
      expect((yield* droppedCount("error")) - before).toBe(2)
      expect(yield* p.stats).toMatchObject({ connected: true, published: 0, dropped: 2 })
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
