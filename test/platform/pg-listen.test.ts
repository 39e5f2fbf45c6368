/**
 * firehook's own `LISTEN` (PgListen.ts, what `PgClient.listen` is on the pools Database.ts builds),
 * on a real PostgreSQL: channels share one connection, a dropped connection fails every stream so
 * that its follower opens it again (`@effect/sql-pg`'s stream stayed open and silent), and a
 * connection that stops answering is found by the liveness probe (a TCP proxy that stops
 * forwarding, the probe driven by the TestClock), as is a `LISTEN` that gets no answer. A stream's end
 * UNLISTENs only when it was its channel's last, and closes the connection only when it was the last.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { SqlError } from "@effect/sql/SqlError"
import { describe, expect, it } from "@effect/vitest"
import {
  Cause,
  Context,
  Deferred,
  Duration,
  Effect,
  Either,
  Exit,
  Fiber,
  Option,
  Queue,
  Redacted,
  Schedule,
  Stream,
  TestClock,
  TestServices
} from "effect"
import type { Scope } from "effect"
import net from "node:net"
import pg from "pg"
import * as ErrorCode from "../../src/services/platform/ErrorCode.js"
import * as PgListen from "../../src/services/platform/PgListen.js"
import * as Db from "../support/db.js"

/** Every payload of `stream` into a queue, in a fiber of the test's scope. */
const collect = (stream: Stream.Stream<string, SqlError>) =>
  Effect.gen(function*() {
    const got = yield* Queue.unbounded<string>()
    const fiber = yield* Effect.forkScoped(Stream.runForEach(stream, (p) => Queue.offer(got, p)))
    return { got, fiber }
  })

/**
 * `notify` every 100 ms (live clock) until `got` yields its first payload, which is returned: the
 * stream's LISTEN is in place from then on.
 */
const firstPayload = <R>(notify: Effect.Effect<unknown, unknown, R>, got: Queue.Queue<string>) =>
  Effect.gen(function*() {
    const offering = yield* Effect.fork(
      notify.pipe(
        Effect.orDie,
        Effect.zipRight(TestServices.provideLive(Effect.sleep("100 millis"))),
        Effect.repeat({ times: 300 })
      )
    )
    const first = yield* Queue.take(got)
    yield* Fiber.interrupt(offering)
    return first
  })

/** The payloads of `got` up to and with `last`, without the warm-up ones. */
const takeUntil = (got: Queue.Queue<string>, last: string) =>
  Effect.gen(function*() {
    const seen: Array<string> = []
    for (let i = 0; i < 1_000 && seen.at(-1) !== last; i++) seen.push(yield* Queue.take(got))
    return seen.filter((p) => p !== "w")
  })

const listenBackends = Effect.flatMap(PgClient.PgClient, (sql) =>
  sql<{ readonly pid: number }>`
    SELECT pid FROM pg_stat_activity
    WHERE datname = current_database() AND query LIKE 'LISTEN%' AND pid <> pg_backend_pid()`
    .pipe(Effect.map((rows) => rows.map((r) => r.pid))))

const notifyOn = (channel: string, payload: string) =>
  Effect.flatMap(PgClient.PgClient, (sql) => sql`SELECT pg_notify(${channel}, ${payload})`)

/** The exit of `fiber` once it ends, waiting at most 10 s of live time. */
const exitOf = <A, E>(fiber: Fiber.RuntimeFiber<A, E>) =>
  TestServices.provideLive(Fiber.await(fiber).pipe(Effect.timeoutOption("10 seconds")))

const codeOfFailure = (exit: Exit.Exit<unknown, unknown>) =>
  Option.match(Exit.isFailure(exit) ? Cause.failureOption(exit.cause) : Option.none(), {
    onNone: () => "none",
    onSome: (e) => ErrorCode.codeOr(e)
  })

const isSqlFailure = (exit: Exit.Exit<unknown, unknown>) =>
  Exit.isFailure(exit) && Option.exists(Cause.failureOption(exit.cause), (e) => e instanceof SqlError)

describe("PgListen on PostgreSQL", () => {
  it.scoped("each channel's payloads reach its streams only, over one connection", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const a1 = yield* collect(sql.listen("fh_a"))
      const a2 = yield* collect(sql.listen("fh_a"))
      const b = yield* collect(sql.listen("fh_b"))
      // warm-up payloads ("w") until each stream has one: every LISTEN is in place
      yield* firstPayload(notifyOn("fh_a", "w"), a1.got)
      yield* firstPayload(notifyOn("fh_a", "w"), a2.got)
      yield* firstPayload(notifyOn("fh_b", "w"), b.got)

      yield* notifyOn("fh_a", "a1")
      yield* notifyOn("fh_b", "b1")
      yield* notifyOn("fh_a", "")
      yield* notifyOn("fh_a", "a2")
      expect(yield* takeUntil(a1.got, "a2")).toEqual(["a1", "a2"])
      expect(yield* takeUntil(a2.got, "a2")).toEqual(["a1", "a2"])
      expect(yield* takeUntil(b.got, "b1")).toEqual(["b1"])
      expect((yield* listenBackends).length).toBe(1)
    }).pipe(Effect.provide(Db.layer())))

  it.scoped("a dropped connection fails every stream, and the next LISTEN works on a new one", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const a = yield* collect(sql.listen("fh_a"))
      const b = yield* collect(sql.listen("fh_b"))
      yield* firstPayload(notifyOn("fh_a", "x"), a.got)
      yield* firstPayload(notifyOn("fh_b", "x"), b.got)
      const [before] = yield* listenBackends
      expect(before).toBeDefined()
      yield* sql`SELECT pg_terminate_backend(${before ?? 0})`

      const exits = [yield* exitOf(a.fiber), yield* exitOf(b.fiber)]
      expect(exits.map((e) => Option.map(e, isSqlFailure))).toEqual([Option.some(true), Option.some(true)])

      const again = yield* collect(sql.listen("fh_a"))
      expect(yield* firstPayload(notifyOn("fh_a", "y"), again.got)).toBe("y")
      const after = yield* listenBackends
      expect(after.length).toBe(1)
      expect(after[0]).not.toBe(before)
    }).pipe(Effect.provide(Db.layer())))

  it.scoped("a connection that stops answering is found by the probe and fails its streams", () =>
    Effect.gen(function*() {
      const { listen, proxy, notify } = yield* overProxy
      const a = yield* collect(listen("fh_a"))
      yield* firstPayload(notify("fh_a"), a.got)

      proxy.freeze()
      const exit = yield* exitAdvancing(a.fiber)
      expect(Option.map(exit, isSqlFailure)).toEqual(Option.some(true))
      // what its follower logs (ListenLoop: the code only), not `unknown`
      expect(Option.map(exit, codeOfFailure)).toEqual(Option.some("timeout"))
    }))

  it.scoped("a LISTEN that gets no answer fails within its timeout, and so does every stream on it", () =>
    Effect.gen(function*() {
      // the probe is far off: only the LISTEN's own bound can end this
      const { listen, proxy, notify } = yield* overProxy.pipe(Effect.provideService(ProbeEvery, "1 hour"))
      const a = yield* collect(listen("fh_a"))
      yield* firstPayload(notify("fh_a"), a.got)

      proxy.freeze()
      const b = yield* collect(listen("fh_b"))
      expect(Option.map(yield* exitAdvancing(b.fiber), isSqlFailure)).toEqual(Option.some(true))
      expect(Option.map(yield* exitAdvancing(a.fiber), isSqlFailure)).toEqual(Option.some(true))
    }))

  it.scoped("a stream's end leaves its channel's other streams listening; the last on a channel UNLISTENs, the last of all closes", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const a1 = yield* collect(sql.listen("fh_a"))
      const a2 = yield* collect(sql.listen("fh_a"))
      const b = yield* collect(sql.listen("fh_b"))
      yield* firstPayload(notifyOn("fh_a", "w"), a1.got)
      yield* firstPayload(notifyOn("fh_a", "w"), a2.got)
      yield* firstPayload(notifyOn("fh_b", "w"), b.got)
      const [backend] = yield* listenBackends
      const lastQuery = sql<{ readonly query: string }>`SELECT query FROM pg_stat_activity WHERE pid = ${backend ?? 0}`
        .pipe(Effect.map((rows) => rows.map((r) => r.query)))

      // a1 ends (its finalizer has run when the interrupt returns): a2 still gets fh_a
      yield* Fiber.interrupt(a1.fiber)
      yield* notifyOn("fh_a", "after")
      const next = yield* TestServices.provideLive(
        takeUntil(a2.got, "after").pipe(Effect.timeoutOption("10 seconds"))
      )
      expect(next).toEqual(Option.some(["after"]))

      // a2, the last on fh_a, ends: the shared connection (b's) UNLISTENs fh_a and stays
      yield* Fiber.interrupt(a2.fiber)
      expect(yield* lastQuery).toEqual([`UNLISTEN "fh_a"`])

      // b, the last stream of all, ends: the connection is closed
      yield* Fiber.interrupt(b.fiber)
      const gone = yield* lastQuery.pipe(
        Effect.filterOrFail((rows) => rows.length === 0),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
        Effect.either,
        TestServices.provideLive
      )
      expect(gone).toEqual(Either.right([]))
    }).pipe(Effect.provide(Db.layer())))

  it.scoped("with the defaults, a silent peer is found by the probe after 30 s, bounded by 10 s: within 40 s", () =>
    Effect.gen(function*() {
      const { listen, proxy, notify } = yield* overProxy.pipe(Effect.provideService(Defaults, true))
      expect([Duration.toMillis(PgListen.PROBE_EVERY), Duration.toMillis(PgListen.QUERY_TIMEOUT)]).toEqual([
        30_000,
        10_000
      ])
      const a = yield* collect(listen("fh_a"))
      yield* firstPayload(notify("fh_a"), a.got)

      proxy.freeze()
      // the probe is sent at 30 s of the TestClock (it has not moved yet) and times out at 40 s
      yield* TestClock.adjust("39 seconds")
      yield* Effect.yieldNow()
      expect(Option.isNone(yield* Fiber.poll(a.fiber))).toBe(true)
      yield* TestClock.adjust("1 second")
      const exit = yield* exitOf(a.fiber)
      expect(Option.map(exit, codeOfFailure)).toEqual(Option.some("timeout"))
    }))

  it.scoped("a slow reader's stream holds at most BUFFER payloads and drops the newer ones", () =>
    Effect.gen(function*() {
      const sql = yield* PgClient.PgClient
      const gate = yield* Deferred.make<void>()
      const got = yield* Queue.unbounded<string>()
      yield* Effect.forkScoped(Stream.runForEach(sql.listen("fh_a"), (p) =>
        Effect.zipRight(
          Queue.offer(got, p),
          Effect.when(Deferred.await(gate), () => p !== "w")
        )))
      const done = yield* collect(sql.listen("fh_done"))
      yield* firstPayload(notifyOn("fh_a", "w"), got)
      yield* firstPayload(notifyOn("fh_done", "w"), done.got)

      // one transaction: delivered together, in a few socket reads; the reader takes what the first
      // read brought and is held at the first of them, so the rest must wait in the buffer
      const total = PgListen.BUFFER * 4
      yield* sql`SELECT pg_notify('fh_a', g::text) FROM generate_series(1, ${total}) AS g`
      // the same connection delivers in order: once this arrives, every fh_a payload has been pushed
      yield* notifyOn("fh_done", "d")
      expect(yield* takeUntil(done.got, "d")).toEqual(["d"])
      yield* Deferred.succeed(gate, undefined)
      yield* notifyOn("fh_a", "end")
      const seen: Array<string> = []
      for (let p = yield* Queue.take(got); p !== "end" && seen.length <= total; p = yield* Queue.take(got)) seen.push(p)
      expect(seen[0]).toBe("1")
      expect(seen).not.toContain(String(total))
      expect(seen.length).toBeGreaterThanOrEqual(PgListen.BUFFER)
      expect(seen.length).toBeLessThan(total)
      expect(PgListen.BUFFER).toBe(4_096)
    }).pipe(Effect.provide(Db.layer())))

  it.scoped("a connection that never completes fails its stream at the bound, and its socket is closed at once", () =>
    Effect.gen(function*() {
      // a server that accepts and never says a word; its accepted sockets, while open
      const open = new Set<net.Socket>()
      const server = yield* Effect.acquireRelease(
        Effect.promise(() =>
          new Promise<net.Server>((resolve) => {
            const s = net.createServer((socket) => {
              open.add(socket)
              socket.on("close", () => open.delete(socket))
              // read (and ignore) what the client says, so that its end is seen
              socket.resume()
            })
            s.listen(0, "127.0.0.1", () => resolve(s))
          })
        ),
        (s) =>
          Effect.promise(() =>
            new Promise<void>((resolve) => {
              for (const socket of open) socket.destroy()
              s.close(() => resolve())
            })
          )
      )
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      // pg's own connect timer is real time: far off, so that only PgListen's bound (TestClock) ends it
      const listen = yield* PgListen.make(
        { connectionString: `postgresql://postgres@127.0.0.1:${port}/none` },
        { queryTimeout: "60 seconds" }
      )
      const a = yield* collect(listen("fh_a"))
      yield* Effect.sync(() => open.size).pipe(
        Effect.filterOrFail((n) => n === 1),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
        TestServices.provideLive
      )
      yield* TestClock.adjust("60 seconds")
      // (ending a client that never connected waits for its bound, END_TIMEOUT: advanced here)
      const exit = yield* exitAdvancing(a.fiber)
      expect(Option.map(exit, codeOfFailure)).toEqual(Option.some("timeout"))
      const closed = yield* Effect.sync(() => open.size).pipe(
        Effect.filterOrFail((n) => n === 0),
        Effect.retry({ schedule: Schedule.spaced("20 millis"), times: 250 }),
        Effect.either,
        TestServices.provideLive
      )
      expect(closed).toEqual(Either.right(0))
    }))
})

class ProbeEvery extends Context.Tag("test/ProbeEvery")<ProbeEvery, Duration.DurationInput>() {}
/** {@link overProxy} with PgListen's own probe interval and timeout. */
class Defaults extends Context.Tag("test/Defaults")<Defaults, true>() {}

/**
 * A fresh database reached through {@link frozenProxy}, a `listen` on it (probe every second, or
 * {@link ProbeEvery}; every command bounded by 2 s), and a `notify` sent directly, not through the proxy.
 */
const overProxy = Effect.gen(function*() {
  const { url } = yield* Db.freshDatabase
  const proxy = yield* frozenProxy(new URL(Redacted.value(url)))
  const target = new URL(Redacted.value(url))
  target.host = `127.0.0.1:${proxy.port}`
  const probeEvery = yield* Effect.serviceOption(ProbeEvery)
  const defaults = yield* Effect.serviceOption(Defaults)
  const listen = yield* PgListen.make(
    { connectionString: target.toString() },
    Option.isSome(defaults) ? {} : {
      probeEvery: Option.getOrElse(probeEvery, () => "1 second"),
      queryTimeout: "2 seconds"
    }
  )
  const direct = yield* Effect.acquireRelease(
    Effect.promise(async () => {
      const c = new pg.Client({ connectionString: Redacted.value(url) })
      await c.connect()
      return c
    }),
    (c) => Effect.promise(() => c.end())
  )
  const notify = (channel: string) => Effect.promise(() => direct.query(`SELECT pg_notify($1, 'x')`, [channel]))
  return { listen, proxy, notify }
})

/** The exit of `fiber`, advancing the TestClock a second at a time (30 at most) until it ends. */
const exitAdvancing = <A, E>(fiber: Fiber.RuntimeFiber<A, E>) =>
  Effect.gen(function*() {
    let exit = Option.none<Exit.Exit<A, E>>()
    for (let i = 0; i < 30 && Option.isNone(exit); i++) {
      yield* TestClock.adjust("1 second")
      exit = yield* Fiber.poll(fiber)
    }
    return Option.isNone(exit) ? yield* exitOf(fiber) : exit
  })

/**
 * A TCP proxy to `target`'s host and port on a free loopback port; `freeze()` stops it forwarding
 * in both directions without closing anything (a peer that stopped answering). Closed with the scope.
 */
const frozenProxy = (target: URL): Effect.Effect<{ port: number; freeze: () => void }, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.promise(() =>
      new Promise<{ server: net.Server; sockets: Array<net.Socket>; port: number }>((resolve) => {
        const sockets: Array<net.Socket> = []
        const server = net.createServer((client) => {
          const upstream = net.connect(Number(target.port || 5432), target.hostname)
          sockets.push(client, upstream)
          client.pipe(upstream)
          upstream.pipe(client)
          client.on("error", () => upstream.destroy())
          upstream.on("error", () => client.destroy())
        })
        server.listen(0, "127.0.0.1", () => {
          const address = server.address()
          resolve({ server, sockets, port: typeof address === "object" && address !== null ? address.port : 0 })
        })
      })
    ),
    ({ server, sockets }) =>
      Effect.promise(() =>
        new Promise<void>((resolve) => {
          for (const s of sockets) s.destroy()
          server.close(() => resolve())
        })
      )
  ).pipe(Effect.map(({ port, sockets }) => ({
    port,
    freeze: () => {
      for (const s of sockets) {
        s.unpipe()
        s.pause()
      }
    }
  })))

describe("Db.listening (test support) on PostgreSQL", () => {
  it.scoped("returns at its first poll when the LISTEN is already in place, and dies when none comes", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // a session whose last statement is the LISTEN, before the first poll (released before the pool ends)
      yield* Effect.scoped(Effect.flatMap(sql.reserve, (conn) =>
        conn.executeRaw(`LISTEN "fh_support_ready"`, []).pipe(
          // before the fix this died: `repeat` with a schedule returned its count, 0 after one poll
          Effect.zipRight(Effect.exit(Db.listening("fh_support_ready"))),
          Effect.map((ready) => expect(Exit.isSuccess(ready)).toBe(true))
        )))
      // and with nobody listening it passed: the count after the last poll was not 0
      const none = yield* Effect.exit(Db.listening("fh_support_nobody", 3))
      expect(Exit.isFailure(none) && Cause.isDie(none.cause)).toBe(true)
      if (Exit.isFailure(none)) {
        expect(Cause.pretty(none.cause)).toContain("no LISTEN on fh_support_nobody after 3 polls")
      }
    }).pipe(Effect.provide(Db.layer())))
})
