/**
 * The Redis publisher (SPEC §4.7) at edges the main suites (publisher.test.ts, publisher-resp,
 * publisher-timing) leave open: the parser's bounds exactly at their limits, replies split across
 * TCP chunks, a connection closed under pending commands, the state after a connection is lost, the
 * published metric, what a refused connection logs, and a PUBLISH the server refuses. Fake servers run on 127.0.0.1; nothing
 * sleeps.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Redacted, Schedule } from "effect"
import * as Net from "node:net"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import { auditEvent } from "../support/auditEvent.js"
import { captureLogs } from "../support/captureLogs.js"
import { fakeRedis } from "../support/fakeRedis.js"
import { seriesValue } from "../support/metricSeries.js"
import { freePort } from "../support/proc.js"
import { newHealth, publisherIn, target } from "./publisher-support.js"

/**
 * A server that answers every command `+OK`, written in two TCP segments some milliseconds apart
 * (so the client sees a partial reply first).
 */
const splittingServer = Effect.acquireRelease(
  Effect.async<{ readonly server: Net.Server; readonly sockets: Set<Net.Socket>; readonly port: number }>(
    (resume) => {
      const sockets = new Set<Net.Socket>()
      const server = Net.createServer((socket) => {
        sockets.add(socket)
        socket.setNoDelay(true)
        socket.on("error", () => {})
        socket.on("close", () => sockets.delete(socket))
        socket.on("data", () => {
          socket.write("+O")
          setTimeout(() => socket.write("K\r\n"), 30)
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const address = server.address()
        resume(Effect.succeed({
          server,
          sockets,
          port: typeof address === "object" && address !== null ? address.port : 0
        }))
      })
    }
  ),
  ({ server, sockets }) =>
    Effect.async<void>((resume) => {
      for (const s of sockets) s.destroy()
      server.close(() => resume(Effect.void))
    })
)

describe("RESP2 parser bounds", () => {
  it("a reply nested exactly maxDepth deep is read; one level more is invalid", () => {
    const { maxDepth } = Publisher.RESP_LIMITS
    const p = (s: string) => Publisher.parseReply(Buffer.from(s, "latin1"))
    expect(p("*1\r\n".repeat(maxDepth) + ":1\r\n")._tag).toBe("Done")
    expect(p("*1\r\n".repeat(maxDepth + 1) + ":1\r\n")._tag).toBe("Invalid")
  })

  it("an array of exactly maxArray items is read, and the next reply starts after its last item", () => {
    const { maxArray } = Publisher.RESP_LIMITS
    const text = `*${maxArray}\r\n` + ":1\r\n".repeat(maxArray)
    const buf = Buffer.from(text + "+NEXT\r\n", "latin1")
    const r = Publisher.parseReply(buf)
    expect(r).toMatchObject({ _tag: "Done", next: text.length })
    expect(r._tag === "Done" && r.reply._tag === "Array" && r.reply.value?.length).toBe(maxArray)
    expect(r._tag === "Done" && Publisher.parseReply(buf, r.next)).toMatchObject({
      reply: { _tag: "Simple", value: "NEXT" }
    })
  })

  it("the event JSON says [redacted] even when a caller's object carries a real URL in `url`", () => {
    const leaky = { ...auditEvent(), url: "https://receiver.example/hook?token=x" }
    // a caller that bypasses the type (a cast, a spread of a delivery row) must not leak the URL
    const json = Publisher.encodeEvent(leaky as unknown as Publisher.AuditEvent)
    expect(json).not.toContain("receiver.example")
    expect(JSON.parse(json).url).toBe("[redacted]")
  })
})

// live clock: nothing here is timed; the deadlines only bound the waits
describe("RespConnection edges", () => {
  it.scopedLive("a reply split across TCP segments is reassembled (the handshake and a command)", () =>
    Effect.gen(function*() {
      const { port } = yield* splittingServer
      const conn = yield* Publisher.connect(target(`redis://127.0.0.1:${port}`)).pipe(Effect.timeout("5 seconds"))
      const reply = yield* conn.command(["ECHO", "x"]).pipe(Effect.timeout("5 seconds"))
      expect(reply).toEqual({ _tag: "Simple", value: "OK" })
    }))

  it.scopedLive("a reply exactly the size of the read buffer is read; one byte more closes the connection", () =>
    Effect.gen(function*() {
      // "+" + 13 × "x" + CRLF = 16 bytes; 14 × "x" = 17
      const fake = yield* fakeRedis((c) => (c[0] === "ECHO" ? `+${"x".repeat(Number(c[1]))}\r\n` : undefined))
      const conn = yield* Publisher.connect(target(fake.url), { maxReadBuffer: 16 })
      const ok = yield* conn.command(["ECHO", "13"]).pipe(Effect.timeout("5 seconds"))
      expect(ok).toEqual({ _tag: "Simple", value: "x".repeat(13) })
      const over = yield* Effect.either(conn.command(["ECHO", "14"])).pipe(Effect.timeout("5 seconds"))
      expect(Either.isLeft(over) && over.left).toMatchObject({ kind: "protocol", code: "read_buffer" })
    }))

  it.scopedLive("the server closing the connection fails the commands awaiting replies at once", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined) // never answers
      const conn = yield* Publisher.connect(target(fake.url))
      const waiting = yield* Effect.forkScoped(Effect.either(conn.command(["ECHO", "1"])))
      yield* fake.awaitState((x) => x.commands.length === 1).pipe(Effect.timeout("5 seconds"))
      yield* fake.stop
      const r = yield* waiting.await.pipe(Effect.flatten, Effect.timeout("5 seconds"))
      expect(Either.isLeft(r) && ["closed", "connect"].includes(r.left.kind)).toBe(true)
    }))

  it.scopedLive("after destroy, a command fails at once with closed (nothing is written or awaited)", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => "+OK\r\n")
      const conn = yield* Publisher.connect(target(fake.url))
      yield* conn.destroy
      const r = yield* Effect.either(conn.command(["ECHO", "x"])).pipe(Effect.timeout("5 seconds"))
      expect(Either.isLeft(r) && r.left).toMatchObject({ kind: "closed", code: "local" })
      expect(yield* conn.closed).toMatchObject({ kind: "closed", code: "local" })
    }))

  it.scopedLive("a handshake that times out destroys the socket at once, not when the caller's scope closes", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(() => undefined, { ping: "" }) // the PING is never answered
      const r = yield* Effect.either(Publisher.connect(target(fake.url), { connectTimeout: "50 millis" }))
      expect(Either.isLeft(r) && r.left).toMatchObject({ kind: "timeout", code: "connect" })
      yield* fake.awaitState((x) => x.closed === 1).pipe(Effect.timeout("5 seconds"))
    }))
})

describe("Publisher edges", () => {
  it.scopedLive("once the connection is lost, a publish is dropped as not_connected (not sent on the dead one)", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c", backoffBase: "1 hour" })
      yield* p.awaitStats((s) => s.connected).pipe(Effect.timeout("5 seconds"))
      yield* fake.stop
      yield* p.awaitStats((s) => !s.connected).pipe(Effect.timeout("5 seconds"))
      const notConnected = yield* seriesValue("firehook_redis_dropped_total", { reason: "not_connected" })
      const error = yield* seriesValue("firehook_redis_dropped_total", { reason: "error" })
      yield* p.publish(auditEvent())
      expect(yield* seriesValue("firehook_redis_dropped_total", { reason: "not_connected" })).toBe(notConnected + 1)
      expect(yield* seriesValue("firehook_redis_dropped_total", { reason: "error" })).toBe(error)
    }))

  it.scopedLive("database 1 in the URL is selected (only database 0 skips SELECT)", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(`${fake.url}/1`), channel: "c" })
      yield* p.awaitStats((s) => s.connected).pipe(Effect.timeout("5 seconds"))
      expect((yield* fake.state).commands[0]).toEqual(["SELECT", "1"])
    }))

  it.scopedLive("each message published counts in firehook_redis_published_total", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n"))
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "c" })
      yield* p.awaitStats((s) => s.connected).pipe(Effect.timeout("5 seconds"))
      const before = yield* seriesValue("firehook_redis_published_total")
      yield* p.publish(auditEvent({ rkey: "a" }))
      yield* p.awaitStats((s) => s.published === 1).pipe(Effect.timeout("5 seconds"))
      yield* p.publish(auditEvent({ rkey: "b" }))
      yield* p.awaitStats((s) => s.published === 2).pipe(Effect.timeout("5 seconds"))
      expect((yield* seriesValue("firehook_redis_published_total")) - before).toBe(2)
    }))

  it.scopedLive("a PUBLISH the server refuses (an ACL's NOPERM) is dropped as error and logged once, its code only", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis((c) =>
        c[0] === "PUBLISH"
          ? "-NOPERM this user has no permissions to access the 'secret-channel' channel\r\n"
          : "+OK\r\n"
      )
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      const p = yield* publisherIn(health, { url: Redacted.make(fake.url), channel: "secret-channel" }).pipe(
        Effect.provide(logs.layer)
      )
      yield* p.awaitStats((s) => s.connected).pipe(Effect.timeout("5 seconds"))
      const error = yield* seriesValue("firehook_redis_dropped_total", { reason: "error" })
      for (const rkey of ["a", "b", "c"]) {
        yield* p.publish(auditEvent({ rkey })).pipe(Effect.provide(logs.layer))
        yield* p.awaitStats((s) => s.dropped === ["a", "b", "c"].indexOf(rkey) + 1).pipe(Effect.timeout("5 seconds"))
      }
      expect((yield* seriesValue("firehook_redis_dropped_total", { reason: "error" })) - error).toBe(3)
      // the connection stays up (health shows connected): the log line is the operator's sign
      expect((yield* p.stats).connected).toBe(true)
      const refused = (yield* logs.lines).filter((l) => l.includes("redis refused a publish"))
      expect(refused).toHaveLength(1)
      expect(refused[0]).toContain("\"code\":\"NOPERM\"")
      expect(refused[0]).not.toContain("secret-channel")
    }))

  it.scopedLive("a refused connection is logged with its errno code only, never the host or port", () =>
    Effect.gen(function*() {
      const port = yield* Effect.promise(freePort)
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      yield* publisherIn(health, { url: Redacted.make(`redis://127.0.0.1:${port}`), channel: "c" }).pipe(
        Effect.provide(logs.layer)
      )
      const failed = (ls: ReadonlyArray<string>) => ls.find((l) => l.includes("redis connection failed"))
      yield* logs.lines.pipe(
        Effect.repeat({ until: (ls) => failed(ls) !== undefined, schedule: Schedule.spaced("10 millis") }),
        Effect.timeout("5 seconds")
      )
      const line = failed(yield* logs.lines) ?? ""
      expect(line).toContain("\"kind\":\"connect\"")
      expect(line).toContain("\"code\":\"ECONNREFUSED\"")
      expect(line).not.toContain(String(port))
      expect(line).not.toContain("127.0.0.1")
    }))
})
