/**
 * Shared pieces of the stream loop's tests (intake-bounds.*.test.ts): the default tuning, the
 * TestClock driven in macrotask turns, scripted and recording in-memory sources (no sockets) and
 * the in-memory stores they run over.
 */
import { Clock, Effect, Layer, Scheduler, Stream, TestClock } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { SourceError } from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { eventsOf, memoryRelay } from "./memorySession.js"

/** the default tuning (SPEC §3.3: 1 s base, 5 min cap; 10 s poison backoff) */
export const tuning = Intake.defaultTuning(512, 128)

/** let the other fibers run for `n` macrotask turns (no clock time passes) */
export const turns = (n: number) =>
  Effect.gen(function*() {
    for (let i = 0; i < n; i++) yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
  })

/** advance the TestClock in `stepMs` steps until `count()` reaches `n` (bounded) */
export const advanceUntil = (count: () => number, n: number, stepMs: number, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 5_000 && count() < n; i++) {
      yield* turns(3)
      if (count() >= n) break
      yield* TestClock.adjust(stepMs)
    }
    yield* turns(3)
    if (count() < n) return yield* Effect.dieMessage(`never happened: ${what}`)
  })

/** the gaps between the first `n` times */
export const gaps = (times: ReadonlyArray<number>, n: number) => times.slice(1, n).map((t, i) => t - (times[i] ?? 0))

export const stack = (rec: Recorder) =>
  Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)

/** a stream whose connection `n` (from 1) is `script(n)`; `at` holds the Clock time of each connect */
export const scripted = (script: (n: number) => Stream.Stream<Intake.SourceItem, SourceError>) => {
  const at: Array<number> = []
  const spec: Intake.StreamSpec = {
    ...memoryRelay([]).spec,
    connect: () =>
      Stream.unwrap(Effect.map(Clock.currentTimeMillis, (now) => {
        at.push(now)
        return script(at.length)
      }))
  }
  return { spec, at }
}

export const refused = Stream.fail(new SourceError({ kind: "connect" }))
export const opened: Intake.SourceItem = { _tag: "opened" }

/** a relay-like source: connection `n` (from 1) records its cursor and gets `script(n, cursor)`, then stays open */
export const recording = (script: (n: number, cursor: bigint | undefined) => ReadonlyArray<Intake.SourceItem>) => {
  const asked: Array<bigint | undefined> = []
  const spec: Intake.StreamSpec = {
    ...memoryRelay([]).spec,
    connect: (cursor) =>
      Stream.suspend(() => {
        asked.push(cursor)
        return Stream.fromIterable<Intake.SourceItem>([opened, ...script(asked.length, cursor)]).pipe(
          Stream.concat(Stream.never)
        )
      })
  }
  return { spec, asked }
}

export const frameAt = (seq: bigint): Intake.SourceItem => ({
  _tag: "events",
  events: eventsOf({ seq, ops: 1 }),
  cursor: seq
})

/** a relay's URL and cursors (µs): T1 a source time, SEC one second */
export const RELAY_URL = "wss://relay.test"
export const T1 = 1_750_000_000_000_000n
export const SEC = 1_000_000n
