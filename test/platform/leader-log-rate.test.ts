/**
 * The leader's own log lines (SPEC §6.4, §7) on a fake lock server driven by the TestClock. A work
 * that keeps ending at once (intake's `Effect.orDie(processor.reload)` failing) takes the lock
 * again every retry interval: its `role acquired` and `role lost` lines are logged at most once a
 * minute (with `suppressed`), and `role lost` says why the work ended, by kind and code only (never
 * the cause's message). Before, each 2 s term logged both lines (60 a minute) and the cause was
 * never logged. A change of leader (a first acquisition, one after standing by, a lost connection)
 * is still logged at once, and an embedder's own `events` still see every term.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Clock, Duration, Effect, FiberId, HashMap, Logger, Ref, TestClock } from "effect"
import { type Role, runAsLeader, workEndOf } from "../../src/services/platform/Leader.js"
import { StoreError } from "../../src/services/platform/Persistence.js"

/** The lock server: who holds the lock (0: another replica), and whether pings and unlocks hang. */
interface Server {
  holder: number | undefined
  hang: boolean
}

const fakeClient = (server: Server): SqlClient.SqlClient => {
  let next = 0
  const connection = (id: number): Connection => {
    const executeValues = (sql: string) =>
      Effect.suspend((): Effect.Effect<Array<Array<unknown>>> => {
        if (sql.includes("pg_try_advisory_lock")) {
          const ok = server.holder === undefined || server.holder === id
          if (ok) server.holder = id
          return Effect.succeed([[ok]])
        }
        if (sql.includes("pg_terminate_backend") || sql.includes("tcp_keepalives")) return Effect.succeed([])
        if (server.hang) return Effect.never
        if (sql.includes("pg_advisory_unlock")) {
          const held = server.holder === id
          if (held) server.holder = undefined
          return Effect.succeed([[held]])
        }
        return Effect.succeed([[1]])
      })
    return new Proxy({} as Connection, { get: (_t, p) => (p === "executeValues" ? executeValues : undefined) })
  }
  const reserve = Effect.sync(() => connection(++next))
  return new Proxy({} as SqlClient.SqlClient, { get: (_t, p) => (p === "reserve" ? reserve : undefined) })
}

interface Line {
  readonly at: number
  readonly level: string
  readonly message: string
  readonly annotations: Record<string, unknown>
  /** the whole line as text (message, annotations, cause), to look for what must not be there */
  readonly text: string
}

/** A replica with the default events (the module's log lines), its lines captured. */
const replica = <E>(server: Server, work: Effect.Effect<void, E>) =>
  Effect.gen(function*() {
    const lines: Array<Line> = []
    const logger = Logger.make(({ annotations, cause, date, logLevel, message }) => {
      const text = Array.isArray(message) ? message.map(String).join(" ") : String(message)
      const record = Object.fromEntries(HashMap.toEntries(annotations))
      lines.push({
        at: date.getTime(),
        level: logLevel.label,
        message: text,
        annotations: record,
        text: `${text} ${JSON.stringify(record)} ${Cause.isEmpty(cause) ? "" : Cause.pretty(cause)}`
      })
    })
    const role = yield* Ref.make<Role>("standby")
    yield* runAsLeader({ key: 1, name: "intake" }, role, work).pipe(
      Effect.provideService(SqlClient.SqlClient, fakeClient(server)),
      Effect.provide(Logger.replace(Logger.defaultLogger, logger)),
      Effect.forkScoped
    )
    const named = (message: string) => lines.filter((l) => l.message === message)
    return { lines, named, role }
  })

/** a defect whose message carries what a log must never show, with a driver code */
const secretDefect = () =>
  Object.assign(new Error("registry load failed: postgres://firehook:SECRET-PW@db/prod"), { code: "57P01" })

/** a work that dies 10 ms after it starts (its reload failing) */
const diesAtOnce = Effect.sleep(Duration.millis(10)).pipe(Effect.zipRight(Effect.die(secretDefect())))

describe("leader log lines (fake lock server, TestClock)", () => {
  it.scoped("a work that dies at once: `role acquired`/`role lost` at most once a minute, with the work's kind and code", () =>
    Effect.gen(function*() {
      const server: Server = { holder: undefined, hang: false }
      const { lines, named } = yield* replica(server, diesAtOnce)
      yield* TestClock.adjust(Duration.minutes(1))
      // 30 terms in this minute (one each 2010 ms): the first acquisition, the first loss, and the
      // first re-acquisition are logged; the rest are held back
      expect(named("role acquired").map((l) => [l.at, l.annotations])).toEqual([
        [0, { role: "intake" }],
        [2010, { role: "intake", suppressed: 0 }]
      ])
      expect(named("role lost").map((l) => [l.at, l.level, l.annotations])).toEqual([
        [10, "WARN", { role: "intake", reason: "worker-ended", kind: "defect", code: "57P01", suppressed: 0 }]
      ])
      yield* TestClock.adjust(Duration.minutes(2))
      // three minutes, about 90 terms: then one line of each a minute, each counting those held back
      const acquired = named("role acquired")
      const lost = named("role lost")
      expect(acquired.map((l) => l.at)).toEqual([0, 2010, 62_310, 122_610])
      expect(lost.map((l) => l.at)).toEqual([10, 60_310, 120_610])
      expect(lost[1]).toMatchObject({
        at: 60_310,
        annotations: { reason: "worker-ended", kind: "defect", code: "57P01", suppressed: 29 }
      })
      expect(acquired[2]).toMatchObject({ at: 62_310, annotations: { suppressed: 29 } })
      // kinds and codes only: never the cause's message, nor the cause itself
      expect(lines.some((l) => l.text.includes("SECRET") || l.text.includes("postgres://"))).toBe(false)
    }))

  it.scoped("a work that fails (a typed error) or returns: its kind and code, or neither", () =>
    Effect.gen(function*() {
      const failing = yield* replica(
        { holder: undefined, hang: false },
        Effect.sleep(Duration.millis(10)).pipe(
          Effect.zipRight(Effect.fail(new StoreError({ op: "registry-load", code: "57014" })))
        )
      )
      const returning = yield* replica({ holder: undefined, hang: false }, Effect.sleep(Duration.millis(10)))
      yield* TestClock.adjust(Duration.millis(10))
      expect(failing.named("role lost").map((l) => l.annotations)).toEqual([
        { role: "intake", reason: "worker-ended", kind: "failure", code: "57014", suppressed: 0 }
      ])
      expect(returning.named("role lost").map((l) => l.annotations)).toEqual([
        { role: "intake", reason: "worker-ended", suppressed: 0 }
      ])
      expect(workEndOf(Cause.interrupt(FiberId.none))).toEqual({ kind: "interrupted" })
      expect(workEndOf(undefined)).toBeUndefined()
    }))

  it.scoped("a change of leader is logged at once: an acquisition after standing by, a lost connection and the one after it", () =>
    Effect.gen(function*() {
      const server: Server = { holder: undefined, hang: false }
      const terms = yield* Ref.make(0)
      // the first term's work dies at once; the later ones run until their term ends
      const work = Effect.flatMap(Ref.getAndUpdate(terms, (n) => n + 1), (n) => (n === 0 ? diesAtOnce : Effect.never))
      const { named } = yield* replica(server, work)
      yield* TestClock.adjust(Duration.millis(10))
      // another replica takes the lock during the pause: this one stands by at 2010 ms
      server.holder = 0
      yield* TestClock.adjust(Duration.seconds(2))
      server.holder = undefined
      // and leads again at 4010 ms: a takeover, logged at once (not held back by the first one)
      yield* TestClock.adjust(Duration.seconds(2))
      expect(named("role acquired").map((l) => [l.at, l.annotations])).toEqual([
        [0, { role: "intake" }],
        [4010, { role: "intake" }]
      ])
      // its lock connection stops answering: the ping at 6010 ms times out at 8010 ms
      server.hang = true
      yield* TestClock.adjust(Duration.seconds(4))
      expect(named("role lost").map((l) => [l.at, l.annotations])).toEqual([
        [10, { role: "intake", reason: "worker-ended", kind: "defect", code: "57P01", suppressed: 0 }],
        [8010, { role: "intake", reason: "connection", code: "timeout" }]
      ])
      // the unlock's bound (2 s), then the next election: the lock is free, taken and logged at once
      server.hang = false
      server.holder = undefined
      yield* TestClock.adjust(Duration.seconds(2))
      expect(named("role acquired").map((l) => [l.at, l.annotations])).toEqual([
        [0, { role: "intake" }],
        [4010, { role: "intake" }],
        [10010, { role: "intake" }]
      ])
    }))

  it.scoped("an embedder's events see every term, and the work's cause", () =>
    Effect.gen(function*() {
      const server: Server = { holder: undefined, hang: false }
      const seen: Array<string> = []
      const at = (what: string) =>
        Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => void seen.push(`${t} ${what}`)))
      const role = yield* Ref.make<Role>("standby")
      yield* runAsLeader(
        {
          key: 1,
          name: "custom",
          events: {
            acquired: at("acquired"),
            lost: (reason, error) => {
              const end = workEndOf(Cause.isCause(error) ? error : undefined)
              return at(`lost ${reason} ${end?.kind} ${end?.code}`)
            }
          }
        },
        role,
        diesAtOnce
      ).pipe(Effect.provideService(SqlClient.SqlClient, fakeClient(server)), Effect.forkScoped)
      yield* TestClock.adjust(Duration.minutes(1))
      expect(seen.filter((s) => s.endsWith("acquired"))).toHaveLength(30)
      expect(seen.filter((s) => s.endsWith("lost worker-ended defect 57P01"))).toHaveLength(30)
      expect(seen.slice(0, 3)).toEqual(["0 acquired", "10 lost worker-ended defect 57P01", "2010 acquired"])
    }))
})
