/**
 * A time cursor (Jetstream `time_us`) is committed at most 5 minutes ahead of the local clock
 * (`Batcher.CURSOR_LEAD_US`): a frame stamped far in the future (a clock glitch on the source's
 * host) would otherwise become the stored cursor for good, since a cursor is never lowered, and
 * every later resume would skip its downtime. A relay `seq` is no time: never held. TestClock,
 * in-memory source, the cursors on PostgreSQL.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Ref, Stream, TestClock } from "effect"
import { WH_COLLECTION } from "../../src/schemas/WhRecord.js"
import { CURSOR_LEAD_US, heldCursor } from "../../src/services/intake/Batcher.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { captureLogs } from "../support/captureLogs.js"
import * as Db from "../support/db.js"
import { halfJitter } from "../support/halfJitter.js"
import { newRecorder, type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { opened, RELAY_URL, SEC, T1, tuning, turns } from "./intake-bounds-support.js"
import { eventsOf, memoryRelay, until } from "./memorySession.js"

const CENTURY = 100n * 365n * 24n * 3600n * SEC

const sqlCursors = (rec: Recorder) =>
  Layer.mergeAll(recordingProcessor(rec), Outbox.layerMemory, CursorStore.layerSql).pipe(
    Layer.provideMerge(Db.layer())
  )

/** connection `n` (from 1) records its cursor and reads `script(n)`, then stays open */
const source = (name: string, cursorIsTime: boolean, script: (n: number) => ReadonlyArray<Intake.SourceItem>) => {
  const asked: Array<bigint | undefined> = []
  const spec: Intake.StreamSpec = {
    ...memoryRelay([]).spec,
    name,
    cursorIsTime,
    rewind: 2n * SEC,
    connect: (cursor) =>
      Stream.suspend(() => {
        asked.push(cursor)
        return Stream.fromIterable<Intake.SourceItem>([opened, ...script(asked.length)]).pipe(
          Stream.concat(Stream.never)
        )
      })
  }
  return { spec, asked }
}

const frame = (cursor: bigint): Intake.SourceItem => ({ _tag: "events", events: [], cursor })

describe("heldCursor", () => {
  it("holds a time cursor to the clock + 5 minutes, and leaves one within it and a relay seq alone", () => {
    const nowMs = Number(T1 / 1000n)
    const time = { cursorIsTime: true }
    expect(heldCursor(time, T1 + CENTURY, nowMs)).toBe(T1 + CURSOR_LEAD_US)
    expect(heldCursor(time, T1 + CURSOR_LEAD_US, nowMs)).toBe(T1 + CURSOR_LEAD_US)
    expect(heldCursor(time, T1 + 60n * SEC, nowMs)).toBe(T1 + 60n * SEC)
    expect(heldCursor(time, undefined, nowMs)).toBeUndefined()
    expect(heldCursor({ cursorIsTime: false }, T1 + CENTURY, nowMs)).toBe(T1 + CENTURY)
  })
})

describe("a Jetstream frame stamped far in the future", () => {
  it.scoped(
    "is committed as the clock + 5 min (warned once, no cursor in the log); the stream resumes from there, not from the future",
    () => {
      const rec = newRecorder()
      const NAME = "cursor-ahead"
      const { asked, spec } = source(
        NAME,
        true,
        (n) =>
          n === 1
            ? [frame(T1 + SEC), frame(T1 + CENTURY)]
            : [{ _tag: "events", events: eventsOf({ seq: 2n, ops: 1 }), cursor: T1 + 2n * SEC }]
      )
      return Effect.gen(function*() {
        const logs = yield* captureLogs
        yield* TestClock.setTime(Number(T1 / 1000n))
        const cursors = yield* CursorStore.CursorStore
        const runner = yield* Intake.makeStreamRunner(spec, tuning)
        yield* Effect.forkScoped(runner.run.pipe(Effect.provide(logs.layer)))
        yield* until(() => rec.batches.length >= 1 && asked.length === 1, "connected and committed")
        yield* until(
          () => Effect.runSync(Ref.get(runner.state)).durableCursor === T1 + CURSOR_LEAD_US,
          "the held cursor committed"
        )
        // stored: the clock + 5 min, not the year 2125
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ cursor: string }>`SELECT cursor::text AS cursor FROM cursors WHERE stream = ${NAME}`
        expect(rows.map((r) => BigInt(r.cursor))).toEqual([T1 + CURSOR_LEAD_US])
        expect(yield* cursors.load(NAME, spec.relay)).toBe(T1 + CURSOR_LEAD_US)
        const lines = (yield* logs.lines).filter((l) => l.includes("ahead of the local clock"))
        expect(lines).toHaveLength(1)
        expect(lines[0]).toContain(`"stream":"${NAME}"`)
        expect(lines[0]).toContain(`"aheadSeconds":${String(CENTURY / SEC)}`)
        expect(lines[0]).not.toContain(String(T1 + CENTURY))
        expect(lines[0]).not.toContain(String(T1 + CURSOR_LEAD_US))
        // a reconnect resumes from there: 5 min ahead at most; a frame in the present then does not
        // lower the cursor
        yield* runner.restart(undefined)
        yield* until(() => asked.length === 2, "reconnected")
        expect(asked[1]).toBe(T1 + CURSOR_LEAD_US)
        yield* until(() => Effect.runSync(Ref.get(runner.state)).position === T1 + 2n * SEC, "the present frame read")
        expect(yield* cursors.load(NAME, spec.relay)).toBe(T1 + CURSOR_LEAD_US)
        // the next process loads it and resumes from it − the rewind
        const next = source(NAME, true, () => [])
        yield* Effect.forkScoped((yield* Intake.makeStreamRunner(next.spec, tuning)).run)
        yield* until(() => next.asked.length === 1, "the next process connected")
        expect(next.asked[0]).toBe(T1 + CURSOR_LEAD_US - 2n * SEC)
      }).pipe(Effect.provide(sqlCursors(rec)), Effect.withRandom(halfJitter))
    },
    30_000
  )

  it.scoped("a relay seq is no time: a large one is committed as it is", () => {
    const rec = newRecorder()
    const NAME = "seq-not-held"
    const BIG = T1 + CENTURY
    const { spec } = source(NAME, false, (n) => n === 1 ? [frame(BIG)] : [])
    return Effect.gen(function*() {
      yield* TestClock.setTime(Number(T1 / 1000n))
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => Effect.runSync(Ref.get(runner.state)).durableCursor === BIG, "the seq committed")
      expect(yield* (yield* CursorStore.CursorStore).load(NAME, RELAY_URL)).toBe(BIG)
    }).pipe(Effect.provide(sqlCursors(rec)), Effect.withRandom(halfJitter))
  }, 30_000)
})

/** a processor that takes `commitMs` of the TestClock per batch and runs the registration hook as a registry batch would */
const timedProcessor = (batches: Array<number>, commitMs: number) =>
  Layer.succeed(
    Processor,
    {
      processEvents: (batch, options) =>
        Effect.gen(function*() {
          yield* TestClock.adjust(commitMs)
          if (options.onRegistered !== undefined) yield* options.onRegistered({ backlink: true })
          if (options.finalize !== undefined) yield* options.finalize
          batches.push(batch.length)
          return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
        }),
      reload: Effect.void,
      stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
    } satisfies ProcessorShape
  )

describe("a source stamped ahead of the local clock (review of the fix)", () => {
  it.scoped("a registration's replay mark creating the backlink stream's row holds its cursor too", () => {
    const batches: Array<number> = []
    const base = memoryRelay([]).spec
    const REG = "ahead-registry"
    const BACK = "ahead-backlink"
    const ahead = T1 + CENTURY
    const [event] = eventsOf({ seq: 1n, ops: 1 })
    if (event?.kind !== "commit") return Effect.die("no commit event")
    const spec: Intake.StreamSpec = {
      ...base,
      name: REG,
      cursorIsTime: true,
      rewind: 2n * SEC,
      registrationReplay: { direct: "ahead-direct", backlink: BACK, margin: 2n * SEC },
      connect: () =>
        Stream.fromIterable<Intake.SourceItem>([opened, {
          _tag: "events",
          cursor: ahead,
          events: [{ ...event, collection: WH_COLLECTION, timeUs: Number(ahead), stream: REG }]
        }]).pipe(Stream.concat(Stream.never))
    }
    return Effect.gen(function*() {
      yield* TestClock.setTime(Number(T1 / 1000n))
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => Effect.runSync(Ref.get(runner.state)).durableCursor !== undefined, "committed")
      const sql = yield* SqlClient.SqlClient
      const rows = yield* sql<{ stream: string; cursor: string }>`
        SELECT stream, cursor::text AS cursor FROM cursors WHERE stream IN (${REG}, ${BACK}) ORDER BY stream`
      // the batch took 1 ms of the clock; the mark is held like the cursor, less the margin
      expect(rows.map((r) => [r.stream, BigInt(r.cursor)])).toEqual([
        [BACK, T1 + CURSOR_LEAD_US - 2n * SEC],
        [REG, T1 + CURSOR_LEAD_US]
      ])
    }).pipe(
      Effect.provide(
        Layer.mergeAll(timedProcessor(batches, 0), Outbox.layerMemory, CursorStore.layerSql).pipe(
          Layer.provideMerge(Db.layer())
        )
      ),
      Effect.withRandom(halfJitter)
    )
  }, 30_000)

  it.scoped("a frame held to the clock is committed once (the empty-frame path does not commit it again)", () => {
    const batches: Array<number> = []
    const spec: Intake.StreamSpec = {
      ...memoryRelay([]).spec,
      name: "ahead-once",
      cursorIsTime: true,
      rewind: 2n * SEC,
      connect: () =>
        Stream.fromIterable<Intake.SourceItem>([opened, {
          _tag: "events",
          events: eventsOf({ seq: 1n, ops: 1 }),
          cursor: T1 + 3600n * SEC
        }]).pipe(Stream.concat(Stream.never))
    }
    return Effect.gen(function*() {
      yield* TestClock.setTime(Number(T1 / 1000n))
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => batches.length >= 1, "committed")
      yield* turns(50)
      // a commit takes 5 ms of the clock: the cursor held after it is 5 ms later than the one written
      expect(batches).toEqual([1])
      expect((yield* Ref.get(runner.state)).batches).toBe(1)
    }).pipe(
      Effect.provide(Layer.mergeAll(timedProcessor(batches, 5), Outbox.layerMemory, CursorStore.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})
