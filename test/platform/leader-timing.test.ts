/**
 * Leadership timing (SPEC §6.4) on a fake lock server driven by the TestClock: when a standby
 * retries, when a leader gives the role up (its work ended, its ping timed out) and competes again,
 * what it does with a lock query that answered too late, and that after a shutdown that was not
 * clean the lock's connection is ended without an unlock. The same module on real PostgreSQL is
 * test/platform/leader.test.ts.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import { describe, expect, it } from "@effect/vitest"
import { Clock, Duration, Effect, Fiber, Ref, TestClock } from "effect"
import { type Role, runAsLeader } from "../../src/services/platform/Leader.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"

/** The lock server: who holds the lock, and how its connections answer. */
interface Server {
  /** the connection holding the lock (0: another replica) */
  holder: number | undefined
  /** pings and unlocks of the connections never answer */
  hang: boolean
  /** the lock query is granted at once but answered after this long */
  lockAnswerDelay: Duration.Duration
  /** every statement, as `<ms> <conn> <statement>` */
  readonly log: Array<string>
}

const newServer = (): Server => ({ holder: undefined, hang: false, lockAnswerDelay: Duration.zero, log: [] })

/** A SqlClient whose reserved connections talk to `server` (no pid: no terminate from another connection). */
const fakeClient = (server: Server): SqlClient.SqlClient => {
  let next = 0
  const connection = (id: number): Connection => {
    const executeValues = (sql: string, params: ReadonlyArray<unknown>) =>
      Effect.gen(function*() {
        const name = sql.includes("pg_try_advisory_lock")
          ? "lock"
          : sql.includes("pg_advisory_unlock")
          ? "unlock"
          : sql.includes("tcp_keepalives")
          ? "keepalive"
          : sql.includes("pg_terminate_backend")
          ? "end-stale"
          : "ping"
        server.log.push(`${yield* Clock.currentTimeMillis} ${id} ${name}`)
        if (name === "lock") {
          const ok = server.holder === undefined || server.holder === id
          if (ok) server.holder = id
          if (Duration.greaterThan(server.lockAnswerDelay, Duration.zero)) yield* Effect.sleep(server.lockAnswerDelay)
          return [[ok]]
        }
        if (server.hang && (name === "ping" || name === "unlock")) return yield* Effect.never
        // a standby's check for a frozen holder: this server's holders are never idle for long
        if (name === "end-stale") return []
        if (name === "unlock") {
          const held = server.holder === id
          if (held) server.holder = undefined
          return [[held]]
        }
        return [[params.length === 0 ? 1 : null]]
      })
    return new Proxy({} as Connection, { get: (_t, p) => (p === "executeValues" ? executeValues : undefined) })
  }
  const reserve = Effect.sync(() => connection(++next))
  return new Proxy({} as SqlClient.SqlClient, { get: (_t, p) => (p === "reserve" ? reserve : undefined) })
}

/** Run a replica on `server` with `work`, recording `<ms> <event>` of each step of its terms. */
const replica = (server: Server, work: Effect.Effect<void>, events: Array<string>) =>
  Effect.gen(function*() {
    const at = (what: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => void events.push(`${t} ${what}`)))
    const role = yield* Ref.make<Role>("standby")
    const fiber = yield* runAsLeader(
      {
        key: 1,
        name: "test",
        onElection: (o) => at(o),
        events: { acquired: at("acquired"), lost: (reason) => at(`lost ${reason}`), ended: at("ended") }
      },
      role,
      work
    ).pipe(Effect.provideService(SqlClient.SqlClient, fakeClient(server)), Effect.fork)
    return { fiber, role }
  })

describe("leader timing (fake lock server, TestClock)", () => {
  it.scoped("a standby retries every 2 s (not faster) and leads at the first election after the lock is free", () =>
    Effect.gen(function*() {
      const server = newServer()
      server.holder = 0
      const events: Array<string> = []
      const { role } = yield* replica(server, Effect.never, events)
      yield* TestClock.adjust(Duration.millis(1_999))
      expect(events).toEqual(["0 standby", "0 ended"])
      yield* TestClock.adjust(Duration.millis(1))
      expect(events).toEqual(["0 standby", "0 ended", "2000 standby", "2000 ended"])
      // the other replica goes away
      server.holder = undefined
      yield* TestClock.adjust(Duration.seconds(2))
      expect(events.slice(4)).toEqual(["4000 leader", "4000 acquired"])
      expect(yield* Ref.get(role)).toBe("leader")
    }))

  it.scoped("a leader whose work ends gives the role up (unlocked) and competes again after the retry interval (2 s)", () =>
    Effect.gen(function*() {
      const server = newServer()
      const events: Array<string> = []
      yield* replica(server, Effect.sleep(Duration.seconds(5)), events)
      yield* TestClock.adjust(Duration.seconds(1))
      expect(events).toEqual(["0 leader", "0 acquired"])
      yield* TestClock.adjust(Duration.seconds(4))
      expect(events).toEqual(["0 leader", "0 acquired", "5000 lost worker-ended", "5000 ended"])
      expect(server.holder).toBeUndefined()
      yield* TestClock.adjust(Duration.millis(1_999))
      expect(events).toHaveLength(4)
      yield* TestClock.adjust(Duration.millis(1))
      expect(events.slice(4)).toEqual(["7000 leader", "7000 acquired"])
      // the first term's connection gave the lock back before the second asked for it
      expect(server.log.filter((l) => l.endsWith("unlock") || l.endsWith("lock"))).toEqual([
        "0 1 lock",
        "5000 1 unlock",
        "7000 2 lock"
      ])
    }))

  it.scoped("a work that keeps ending at once takes the lock once per retry interval, not in a loop, and a standby can lead in between", () =>
    Effect.gen(function*() {
      const server = newServer()
      const events: Array<string> = []
      // (a work that ends without waiting at all made the old code loop without ever yielding to
      // the clock; 10 ms keeps this test bounded on it)
      yield* replica(server, Effect.sleep(Duration.millis(10)), events)
      yield* TestClock.adjust(Duration.millis(10))
      expect(events).toEqual(["0 leader", "0 acquired", "10 lost worker-ended", "10 ended"])
      expect(server.log.filter((l) => l.endsWith(" lock"))).toEqual(["0 1 lock"])
      // another replica takes the free lock during the pause; this one then stands by
      server.holder = 0
      yield* TestClock.adjust(Duration.seconds(2))
      expect(server.log.filter((l) => l.endsWith(" lock"))).toEqual(["0 1 lock", "2010 2 lock"])
      expect(events.slice(4)).toEqual(["2010 standby", "2010 ended"])
    }))

  it.scoped("a leader whose lock connection stops answering gives the role up when a ping times out (2 s)", () =>
    Effect.gen(function*() {
      const server = newServer()
      const events: Array<string> = []
      const { role } = yield* replica(server, Effect.never, events)
      yield* TestClock.adjust(Duration.millis(500))
      expect(events).toEqual(["0 leader", "0 acquired"])
      server.hang = true
      // the next ping (at 2 s) never answers: given up at 4 s, not before
      yield* TestClock.adjust(Duration.millis(3_499))
      expect(events).toEqual(["0 leader", "0 acquired"])
      yield* TestClock.adjust(Duration.millis(1))
      expect(events).toEqual(["0 leader", "0 acquired", "4000 lost connection", "4000 ended"])
      expect(yield* Ref.get(role)).toBe("standby")
      // its unlock never answers either: after the unlock's bound (2 s) it competes again, a standby
      // (the fake server still counts the discarded connection as the holder)
      yield* TestClock.adjust(Duration.millis(1_999))
      expect(events).toHaveLength(4)
      yield* TestClock.adjust(Duration.millis(1))
      expect(events.slice(4)).toEqual(["6000 standby", "6000 ended"])
    }))

  it.scoped("a lock query answered after the election's bound is a failed election whose lock is given back", () =>
    Effect.gen(function*() {
      const server = newServer()
      server.lockAnswerDelay = Duration.seconds(11)
      const events: Array<string> = []
      yield* replica(server, Effect.never, events)
      yield* TestClock.adjust(Duration.seconds(10))
      expect(events).toEqual(["10000 failed", "10000 ended"])
      // granted on the server, released on the same connection: nobody holds the role
      expect(server.holder).toBeUndefined()
      expect(server.log.filter((l) => l.endsWith("unlock"))).toEqual(["10000 1 unlock"])
    }))

  it.scoped("after a shutdown that was not clean the lock's connection is ended without an unlock", () =>
    Effect.gen(function*() {
      const run = (clean: boolean) =>
        Effect.gen(function*() {
          const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "1 second" })
          if (!clean) yield* lifecycle.registerStop("delivery", "broken", Effect.fail("boom"))
          const server = newServer()
          const events: Array<string> = []
          const { fiber } = yield* replica(server, Effect.never, events).pipe(
            Effect.provideService(Lifecycle.Lifecycle, lifecycle)
          )
          yield* TestClock.adjust(Duration.millis(100))
          expect(events.map((e) => e.split(" ")[1])).toEqual(["leader", "acquired"])
          yield* lifecycle.shutdown
          yield* Fiber.interrupt(fiber)
          return server.log.filter((l) => l.endsWith("unlock")).length
        })
      expect(yield* run(true)).toBe(1)
      expect(yield* run(false)).toBe(0)
    }))
})
