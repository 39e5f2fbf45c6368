/**
 * The stream loop's promised waits, on the TestClock with every random draw 0.5 (so the n-th
 * full-jitter delay is exactly min(cap, base · 2ⁿ) / 2): SPEC §3.3 "full-jitter exponential backoff,
 * 1 s base, 5 min cap, never gives up; counters reset after a durable ack", the slower backoff after
 * a poison frame (SPEC §3.2), the 30 s cap of a wait caused by firehook's own store (StreamRunner's
 * `STORE_BACKOFF_CAP`, for a failed batch and a failed cursor read), and the growing backoff of a
 * crashed loop. Each connection (or cursor read) notes the TestClock time it happened at; the test
 * checks the gaps between them. Then where a session connects from (its resume cursor, a replay
 * point, a FutureCursor error frame) and frames without events. In-memory source and stores (no
 * sockets).
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Layer, Queue, Ref, Stream } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { halfJitter } from "../support/halfJitter.js"
import { newRecorder, recordingProcessor } from "../support/recordingProcessor.js"
import {
  advanceUntil,
  frameAt,
  gaps,
  opened,
  recording,
  refused,
  scripted,
  stack,
  tuning,
  turns
} from "./intake-bounds-support.js"
import { eventsOf, memoryRelay, until } from "./memorySession.js"

describe("reconnect backoff (SPEC §3.3)", () => {
  it.scoped("doubles from 1 s up to the 5 min cap (full jitter), never giving up", () => {
    const rec = newRecorder()
    const { at, spec } = scripted(() => refused)
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => at.length, 12, 60_000, "12 connections")
      // half of min(5 min, 1 s · 2ⁿ) after the n-th failure in a row
      expect(gaps(at, 12)).toEqual([500, 1000, 2000, 4000, 8000, 16_000, 32_000, 64_000, 128_000, 150_000, 150_000])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("starts again from 1 s after a session that committed a batch (a durable ack)", () => {
    const rec = newRecorder()
    const { at, spec } = scripted((n) =>
      n === 4
        // the 4th connection commits a frame, then the source closes it
        ? Stream.fromIterable<Intake.SourceItem>([opened, {
          _tag: "events",
          events: eventsOf({ seq: 1n, ops: 1 }),
          cursor: 1n
        }])
        : refused
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => at.length, 7, 60_000, "7 connections")
      expect(rec.batches).toHaveLength(1)
      // 3 failures (0.5, 1, 2 s), the committing session: its close waits the base again
      expect(gaps(at, 7)).toEqual([500, 1000, 2000, 500, 1000, 2000])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("after a poison frame, waits at least the poison backoff (10 s), then the backoff once it is longer", () => {
    const rec = newRecorder()
    const { at, spec } = scripted(() =>
      Stream.fromIterable<Intake.SourceItem>([opened, { _tag: "poison", reason: "did" }])
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => at.length, 8, 60_000, "8 connections")
      expect(gaps(at, 8)).toEqual([10_000, 10_000, 10_000, 10_000, 10_000, 16_000, 32_000])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("after batches that could not be committed (firehook's store), waits at most 30 s", () => {
    const rec = newRecorder()
    // every batch fails (3 attempts, 250 ms × attempt between them: 750 ms per session)
    rec.failures = Number.MAX_SAFE_INTEGER
    const { at, spec } = scripted(() =>
      Stream.fromIterable<Intake.SourceItem>([opened, {
        _tag: "events",
        events: eventsOf({ seq: 1n, ops: 1 }),
        cursor: 1n
      }]).pipe(Stream.concat(Stream.never))
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => at.length, 9, 60_000, "9 connections")
      expect(gaps(at, 9).map((g) => g - 750)).toEqual([500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000])
      expect(rec.batches).toEqual([])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("the durable cursor's failed reads", () => {
  it.scoped("are retried with the reconnect backoff capped at 30 s (a database outage, not the relay's)", () => {
    const rec = newRecorder()
    const reads: Array<number> = []
    const failing = Layer.succeed(
      CursorStore.CursorStore,
      {
        load: () =>
          Effect.flatMap(Clock.currentTimeMillis, (now) => {
            reads.push(now)
            return Effect.fail(new StoreError({ op: "cursors.load", code: "57P01" }))
          }),
        save: () => Effect.void
      } satisfies CursorStore.CursorStoreShape
    )
    return Effect.gen(function*() {
      const relay = memoryRelay([])
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => reads.length, 9, 60_000, "9 reads")
      expect(gaps(reads, 9)).toEqual([500, 1000, 2000, 4000, 8000, 15_000, 15_000, 15_000])
      expect(relay.asked).toEqual([])
    }).pipe(
      Effect.provide(Layer.mergeAll(recordingProcessor(rec), failing, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})

describe("a crashed stream loop (a defect outside a session)", () => {
  it.scoped("restarts after a full-jitter backoff that grows with each crash in a row", () => {
    const rec = newRecorder()
    const reads: Array<number> = []
    const CRASHES = 5
    // the cursor read dies (a bug): the loop crashes before any session
    const dying = Layer.succeed(
      CursorStore.CursorStore,
      {
        load: () =>
          Effect.flatMap(Clock.currentTimeMillis, (now) => {
            reads.push(now)
            return reads.length <= CRASHES ? Effect.dieMessage("a bug") : Effect.succeed<bigint | undefined>(undefined)
          }),
        save: () => Effect.void
      } satisfies CursorStore.CursorStoreShape
    )
    return Effect.gen(function*() {
      const relay = memoryRelay([{ seq: 1n, ops: 1 }])
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => reads.length, CRASHES + 1, 60_000, "the reads")
      expect(gaps(reads, CRASHES + 1)).toEqual([500, 1000, 2000, 4000, 8000])
      yield* advanceUntil(() => rec.batches.length, 1, 250, "the stream committed")
      expect(relay.asked).toEqual([undefined])
    }).pipe(
      Effect.provide(Layer.mergeAll(recordingProcessor(rec), dying, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})

describe("resuming from a stored cursor lower than the rewind", () => {
  it.scoped("connects from 0, never from a negative cursor (which a source takes for a live tail)", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      // a relay stream (rewind 10 seqs) whose stored cursor is 3
      const relay = memoryRelay([{ seq: 1n, ops: 1 }, { seq: 4n, ops: 1 }])
      yield* (yield* CursorStore.CursorStore).save(relay.spec.name, relay.spec.relay, 3n)
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => rec.batches.flat().length, 2, 250, "the replay committed")
      expect(relay.asked).toEqual([0n])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("where a session connects from (resumeCursor, SPEC §3.1/§3.3)", () => {
  it.scoped("a replay point later than the stream's position is not taken: it resumes from its position", () => {
    const rec = newRecorder()
    const source = recording((n) => (n === 1 ? [frameAt(10n)] : []))
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(source.spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => rec.batches.length, 1, 250, "frame 10 committed")
      // a replay asked from 20: the events after 10 and up to 20 would never be read
      yield* runner.restart(20n)
      yield* advanceUntil(() => source.asked.length, 2, 250, "reconnected")
      expect(source.asked).toEqual([undefined, 10n])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("the earliest of two replay points asked for wins, whichever was asked first", () => {
    const rec = newRecorder()
    const source = recording((n) => (n === 1 ? [frameAt(100n)] : []))
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(source.spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => rec.batches.length, 1, 250, "frame 100 committed")
      yield* runner.restart(50n)
      yield* runner.restart(40n)
      yield* advanceUntil(() => source.asked.length, 2, 250, "reconnected")
      expect(source.asked).toEqual([undefined, 40n])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("with no stored cursor, the first connection of runFrom(from) starts at from, not live", () => {
    const rec = newRecorder()
    const source = recording(() => [])
    return Effect.gen(function*() {
      // a stream whose initial cursor is live (the relay's, the backlink's)
      expect(source.spec.initialCursor).toBeUndefined()
      const runner = yield* Intake.makeStreamRunner(source.spec, tuning)
      yield* Effect.forkScoped(runner.runFrom(5n))
      yield* advanceUntil(() => source.asked.length, 1, 250, "connected")
      expect(source.asked).toEqual([5n])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("a replay point the source says is in its future (FutureCursor) is dropped: the stream goes live, once", () => {
    const rec = newRecorder()
    // the relay's seq space is behind any cursor: it answers FutureCursor to every cursor
    const source = recording((_, cursor) =>
      cursor === undefined ? [frameAt(7n)] : [{ _tag: "relay_error", error: "FutureCursor" }]
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(source.spec, tuning)
      yield* Effect.forkScoped(runner.runFrom(900n))
      yield* advanceUntil(() => source.asked.length, 2, 250, "reconnected")
      expect(source.asked.slice(0, 2)).toEqual([900n, undefined])
      yield* advanceUntil(() => rec.batches.length, 1, 250, "the live session committed")
      expect(source.asked).toEqual([900n, undefined])
      const st = yield* Ref.get(runner.state)
      expect(st).toMatchObject({ quarantined: false, durableCursor: 7n })
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("a relay error frame FutureCursor (SPEC §3.1 error frames)", () => {
  it.scoped("to the stored cursor: the stream goes live at once; to a live connection too: it backs off, never quarantined", () => {
    const rec = newRecorder()
    const source = recording(() => [{ _tag: "relay_error", error: "FutureCursor" }])
    return Effect.gen(function*() {
      yield* (yield* CursorStore.CursorStore).save(source.spec.name, source.spec.relay, 1000n)
      const runner = yield* Intake.makeStreamRunner(source.spec, tuning)
      yield* Effect.forkScoped(runner.run)
      // no clock time passes: the live connection does not wait for a backoff
      yield* until(() => source.asked.length === 2, "reconnected live")
      yield* turns(20)
      // the stored cursor rewound, then live at once; a broken relay that says so to a live
      // connection too waits with the backoff (no clock time has passed)
      expect(source.asked).toEqual([990n, undefined])
      expect(yield* Ref.get(runner.state)).toMatchObject({ quarantined: false, failureKind: "protocol" })
      yield* advanceUntil(() => source.asked.length, 3, 250, "reconnected after the backoff")
      // still live (the relay keeps saying the cursor is in its future)
      expect(source.asked).toEqual([990n, undefined, undefined])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("frames without events (a relay commit with no operations, a tooBig commit)", () => {
  it.scoped("still advance the durable cursor, each committed when it arrives after the stream's last commit", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const q = yield* Queue.unbounded<Intake.SourceItem>()
      const spec: Intake.StreamSpec = {
        ...memoryRelay([]).spec,
        connect: () => Stream.concat(Stream.succeed(opened), Stream.fromQueue(q))
      }
      const cursors = yield* CursorStore.CursorStore
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* Queue.offer(q, frameAt(1n))
      yield* until(() => rec.batches.length === 1, "frame 1 committed")
      yield* Queue.offer(q, { _tag: "events", events: [], cursor: 2n })
      yield* until(() => rec.batches.length === 2, "frame 2's cursor committed")
      yield* Queue.offer(q, { _tag: "events", events: [], cursor: 3n })
      yield* until(() => rec.batches.length === 3, "frame 3's cursor committed")
      expect(rec.batches.map((b) => b.length)).toEqual([1, 0, 0])
      expect(yield* cursors.load(spec.name, spec.relay)).toBe(3n)
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(3n)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})
