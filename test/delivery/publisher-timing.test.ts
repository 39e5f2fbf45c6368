/**
 * The Redis publisher's bounds and timing its module header promises (SPEC §4.7; mutation audit,
 * stop 34): the 8 KiB message bound in UTF-8 bytes, in-flight slots, the 1 s reply timeout, the
 * 5 s connect timeout, the reconnect backoff (from 500 ms, doubling, capped at 30 s, starting over),
 * AUTH without a user name, and the dropped counts by reason. Fake servers run on 127.0.0.1; time
 * runs on the TestClock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Redacted, Ref, TestClock, TestServices } from "effect"
import * as Net from "node:net"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import { auditEvent } from "../support/auditEvent.js"
import { captureLogs } from "../support/captureLogs.js"
import { fakeRedis } from "../support/fakeRedis.js"
import { halfJitter } from "../support/halfJitter.js"
import { seriesValue } from "../support/metricSeries.js"
import { closedPort, driveUntil, newHealth, publisherIn } from "./publisher-support.js"

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

  it.scoped("a reply timeout resets the connection: the messages still awaiting their reply on it are dropped with it, each as timeout", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" })
      yield* p.awaitStats((s) => s.connected)
      const timeoutBefore = yield* droppedCount("timeout")
      yield* p.publish(auditEvent({ rkey: "first" }))
      yield* fake.awaitState((x) => x.commands.length === 1)
      yield* TestClock.adjust("400 millis")
      yield* p.publish(auditEvent({ rkey: "second" }))
      yield* p.publish(auditEvent({ rkey: "third" }))
      yield* withinReal(fake.awaitState((x) => x.commands.length === 3), "5 seconds")
      // the first message's second ends: the two later ones (400 ms old) go with its connection
      yield* TestClock.adjust("600 millis")
      const after = yield* withinReal(p.awaitStats((s) => s.dropped === 3), "5 seconds")
      expect(after).toMatchObject({ dropped: 3, published: 0 })
      expect((yield* droppedCount("timeout")) - timeoutBefore).toBe(3)
      yield* withinReal(fake.awaitState((x) => x.closed === 1), "5 seconds")
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

  it.scoped("a user name without a password (an ACL user with nopass) is AUTH <user> \"\", not PING as default", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":0\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, {
        url: Redacted.make(`redis://alice@127.0.0.1:${fake.port}`),
        channel: "c"
      })
      yield* p.awaitStats((s) => s.connected)
      expect((yield* fake.state).commands[0]).toEqual(["AUTH", "alice", ""])
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
