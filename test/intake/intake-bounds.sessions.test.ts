/**
 * A session of the stream loop, on the TestClock with every random draw 0.5: the queue bound, how a
 * connection's end or failure ends the session (health's failure kind, the backoff it waits),
 * intake health (progressing, cursor age), the reader and the batcher, the stream's lag, and the
 * durable cursor on PostgreSQL (SPEC §3.1, §3.3). In-memory source and stores (no sockets), but for
 * the PostgreSQL cursor.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Logger, Queue, Ref, Stream, TestClock } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { relayUrl, SourceError } from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { initialState, type StreamState } from "../../src/services/intake/StreamModel.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { halfJitter } from "../support/halfJitter.js"
import { seriesValue } from "../support/metricSeries.js"
import { newRecorder } from "../support/recordingProcessor.js"
import { sqlStack } from "../support/stack.js"
import {
  advanceUntil,
  frameAt,
  gaps,
  opened,
  refused,
  RELAY_URL,
  scripted,
  SEC,
  stack,
  T1,
  tuning,
  turns
} from "./intake-bounds-support.js"
import { eventsOf, memoryRelay, until } from "./memorySession.js"

describe("the queue bound and frames without events (SPEC §3.3)", () => {
  it.scoped("a frame without events still takes a place in the bound: a full queue of them closes the socket", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      // a frame with an event, then 10 without (relay commits with no operations), against a bound of 4
      const frames = [{ seq: 1n, ops: 1 }, ...Array.from({ length: 10 }, (_, i) => ({ seq: BigInt(i + 2), ops: 0 }))]
      const relay = memoryRelay(frames)
      const gate = yield* Deferred.make<void>()
      rec.gate = gate
      const runner = yield* Intake.makeStreamRunner(relay.spec, Intake.defaultTuning(4, 4))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => rec.calls === 1, "the first batch in its transaction")
      yield* turns(20)
      // the bound was reached: the session ended (backpressure), the queue is kept
      expect((yield* Ref.get(runner.state)).connected).toBe(false)
      rec.gate = undefined
      yield* Deferred.succeed(gate, undefined)
      yield* until(() => Effect.runSync(Ref.get(runner.state)).durableCursor === 11n, "every cursor committed")
      expect(relay.asked.length).toBeGreaterThan(1)
      expect(relay.asked[0]).toBeUndefined()
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("a source that closes the connection after the stream made progress", () => {
  it.scoped("is routine (a relay's deploy): no warning, unlike a close before any commit", () => {
    const rec = newRecorder()
    const messages: Array<string> = []
    const logger = Logger.make(({ message }) => void messages.push(String(message)))
    // connection 1 commits a frame, then the source closes it; the next one stays open
    const { at, spec } = scripted((n) =>
      n === 1
        ? Stream.fromIterable<Intake.SourceItem>([opened, frameAt(1n)])
        : Stream.concat(Stream.succeed(opened), Stream.never)
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => at.length, 2, 250, "reconnected")
      expect(rec.batches).toHaveLength(1)
      expect(messages.filter((m) => m.includes("closed"))).toEqual([])
    }).pipe(
      Effect.provide(Layer.merge(stack(rec), Logger.replace(Logger.defaultLogger, logger))),
      Effect.withRandom(halfJitter)
    )
  })
})

describe("a stream run again by this process (the direct stream after its set emptied and filled)", () => {
  it.scoped("keeps the source time of its last committed event for health's cursor age, not the stored cursor's", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const relay = memoryRelay([{ seq: 1n, ops: 1 }])
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning)
      const first = yield* Effect.fork(runner.run)
      yield* until(() => rec.batches.length === 1, "frame 1 committed")
      const committed = (yield* Ref.get(runner.state)).lastEventTimeUs
      expect(committed).toBe(eventsOf({ seq: 1n, ops: 1 })[0]?.timeUs)
      yield* Fiber.interrupt(first)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => relay.asked.length === 2, "connected again")
      // a relay seq is no time: the stored cursor's age would count from its write
      expect((yield* Ref.get(runner.state)).lastEventTimeUs).toBe(committed)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("intake health: progressing (SPEC §3.3: connected, or a durable ack in the last 60 s)", () => {
  const progressing = (state: Partial<StreamState>) =>
    Effect.map(
      Intake.healthSection(
        {
          run: Effect.never,
          stats: Effect.succeed({ running: true, streams: [{ name: "relay", state: { ...initialState, ...state } }] }),
          stopAccepting: Effect.void
        },
        Effect.succeed("leader" as const),
        Effect.succeed({ rejected: {} })
      ),
      (h) => ({ ready: h.ready, progressing: h.body.progressing })
    )

  it.effect("a connected stream that has not committed yet, or a stream that committed up to 60 s ago", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(1_000_000)
      expect(yield* progressing({ connected: true })).toEqual({ ready: true, progressing: true })
      expect(yield* progressing({ connected: false, lastAckAt: 1_000_000 - 60_000 })).toEqual({
        ready: true,
        progressing: true
      })
      expect(yield* progressing({ connected: false, lastAckAt: 1_000_000 - 60_001 })).toEqual({
        ready: false,
        progressing: false
      })
      expect(yield* progressing({ connected: false })).toEqual({ ready: false, progressing: false })
    }))
})

describe("the relay URL (SPEC §3.1: cursor = relay seq)", () => {
  it("carries cursor 0 (the relay's oldest retained event, not a live tail); none without a cursor", () => {
    const base = new URL("wss://relay.test/base/?x=1")
    expect(relayUrl(base, { cursor: 0n })).toBe("wss://relay.test/base/xrpc/com.atproto.sync.subscribeRepos?cursor=0")
    expect(relayUrl(base, { cursor: 42n })).toBe("wss://relay.test/base/xrpc/com.atproto.sync.subscribeRepos?cursor=42")
    expect(relayUrl(base, { cursor: undefined })).toBe("wss://relay.test/base/xrpc/com.atproto.sync.subscribeRepos")
  })
})

describe("how a failed connection ends the session (health's failure kind, SPEC §3.3)", () => {
  it.scoped("the source's receive buffer overflowing is backpressure: failure kind queue, reconnect at once from the last ack", () => {
    const rec = newRecorder()
    const { at, spec } = scripted((n) =>
      n === 1
        ? Stream.fromIterable<Intake.SourceItem>([opened, frameAt(1n)]).pipe(
          Stream.concat(Stream.fail(new SourceError({ kind: "overflow" })))
        )
        : Stream.concat(Stream.succeed(opened), Stream.never)
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      // no clock time passes
      yield* until(() => at.length === 2, "reconnected")
      expect(rec.batches).toHaveLength(1)
      expect((yield* Ref.get(runner.state)).failureKind).toBe("queue")
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("a connection that cannot be opened: failure kind connect", () => {
    const rec = newRecorder()
    const { at, spec } = scripted(() => refused)
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => at.length === 1, "connected once")
      yield* turns(10)
      expect(yield* Ref.get(runner.state)).toMatchObject({ failureKind: "connect", connected: false })
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("the reader of a session", () => {
  it.scoped("measures the resume gap once per connection, at its first frame (ResumeGap)", () => {
    const rec = newRecorder()
    const NAME = "gap-once"
    return Effect.gen(function*() {
      const q = yield* Queue.unbounded<Intake.SourceItem>()
      const spec: Intake.StreamSpec = {
        ...memoryRelay([]).spec,
        name: NAME,
        cursorIsTime: true,
        rewind: 0n,
        connect: () => Stream.concat(Stream.succeed(opened), Stream.fromQueue(q))
      }
      // the clock at the second frame's time (a time cursor is committed at most 5 min ahead of it)
      yield* TestClock.setTime(Number((T1 + 3600n * SEC) / 1000n))
      yield* (yield* CursorStore.CursorStore).save(NAME, spec.relay, T1)
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      const gauge = seriesValue("firehook_intake_resume_gap_seconds", { stream: NAME })
      // the first frame, 5 s after the cursor sent; then one an hour later, in a chunk of its own
      yield* Queue.offer(q, { _tag: "events", events: [], cursor: T1 + 5n * SEC })
      yield* until(() => Effect.runSync(Ref.get(runner.state)).durableCursor === T1 + 5n * SEC, "first committed")
      expect(yield* gauge).toBe(5)
      yield* Queue.offer(q, { _tag: "events", events: [], cursor: T1 + 3600n * SEC })
      yield* until(() => Effect.runSync(Ref.get(runner.state)).durableCursor === T1 + 3600n * SEC, "second committed")
      expect(yield* gauge).toBe(5)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("stops reading when the stream stops (shutdown): the connection is closed and not opened again", () => {
    const rec = newRecorder()
    let closed = 0
    const { at, spec } = scripted(() =>
      Stream.concat(Stream.succeed(opened), Stream.never).pipe(Stream.ensuring(Effect.sync(() => void closed++)))
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => Effect.runSync(Ref.get(runner.state)).connected, "connected")
      yield* runner.stopReading
      yield* until(() => closed === 1, "the connection closed")
      yield* TestClock.adjust("10 minutes")
      yield* turns(10)
      expect(at).toHaveLength(1)
      expect((yield* Ref.get(runner.state)).connected).toBe(false)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("a defect while reading (a bug in a decoder) is counted as a runner crash and ends the session", () => {
    const rec = newRecorder()
    const NAME = "reader-defect"
    const { at, spec } = scripted((n) =>
      n === 1 ? Stream.dieMessage("a bug in the source") : Stream.concat(Stream.succeed(opened), Stream.never)
    )
    return Effect.gen(function*() {
      const crashes = seriesValue("firehook_intake_runner_crashes_total", { stream: NAME })
      const before = yield* crashes
      const runner = yield* Intake.makeStreamRunner({ ...spec, name: NAME }, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* advanceUntil(() => at.length, 2, 250, "reconnected")
      expect((yield* crashes) - before).toBe(1)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("a relay error frame other than FutureCursor (ConsumerTooSlow)", () => {
  it.scoped("ends the session like a close: no quarantine, no failure kind, the reconnect backoff (not the poison one)", () => {
    const rec = newRecorder()
    const { at, spec } = scripted((n) =>
      n === 1
        ? Stream.fromIterable<Intake.SourceItem>([opened, frameAt(1n), {
          _tag: "relay_error",
          error: "ConsumerTooSlow"
        }])
        : Stream.concat(Stream.succeed(opened), Stream.never)
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => rec.batches.length === 1, "frame 1 committed")
      yield* turns(10)
      expect(yield* Ref.get(runner.state)).toMatchObject({ quarantined: false, failureKind: undefined })
      yield* advanceUntil(() => at.length, 2, 250, "reconnected")
      expect(gaps(at, 2)).toEqual([500])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("the batcher", () => {
  it.scoped("does not process the events its stream's spec skips (another stream handles them); their cursor still commits", () => {
    const rec = newRecorder()
    const relay = memoryRelay([{ seq: 1n, ops: 3 }])
    const spec: Intake.StreamSpec = { ...relay.spec, skip: (e) => e.kind === "commit" && e.rkey === "s1o1" }
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => rec.batches.length === 1, "the batch committed")
      expect(rec.batches[0]?.map((e) => (e.kind === "commit" ? e.rkey : e.kind))).toEqual(["s1o0", "s1o2"])
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(1n)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("counts a poison frame's quarantine (firehook_intake_quarantines_total)", () => {
    const rec = newRecorder()
    const NAME = "poison-count"
    const { at, spec } = scripted(() =>
      Stream.fromIterable<Intake.SourceItem>([opened, { _tag: "poison", reason: "did" }])
    )
    return Effect.gen(function*() {
      const quarantines = seriesValue("firehook_intake_quarantines_total", { stream: NAME })
      const before = yield* quarantines
      const runner = yield* Intake.makeStreamRunner({ ...spec, name: NAME }, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => at.length === 1, "connected")
      yield* turns(10)
      expect((yield* quarantines) - before).toBe(1)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("the durable cursor on PostgreSQL (SPEC §3.3)", () => {
  it.effect(
    "never goes back (GREATEST); a write stamps its time (a relay cursor's age counts from it)",
    () =>
      Effect.gen(function*() {
        const cursors = yield* CursorStore.CursorStore
        const sql = yield* SqlClient.SqlClient
        const loadEntry = cursors.loadEntry
        if (loadEntry === undefined) return expect.unreachable("the SQL store gives the write time")
        const STREAM = "cursor-bounds"
        yield* cursors.save(STREAM, RELAY_URL, 100n)
        yield* sql`UPDATE cursors SET updated_at = now() - interval '1 hour' WHERE stream = ${STREAM}`
        yield* cursors.save(STREAM, RELAY_URL, 150n)
        yield* cursors.save(STREAM, RELAY_URL, 120n)
        const entry = yield* loadEntry(STREAM, RELAY_URL)
        expect(entry?.cursor).toBe(150n)
        const [now] = yield* sql<{ ms: number }>`SELECT (extract(epoch FROM now()) * 1000)::float8 AS ms`
        expect(Number(now?.ms) - (entry?.savedAtMs ?? 0)).toBeLessThan(60_000)
      }).pipe(Effect.provide(sqlStack())),
    30_000
  )
})

describe("after a commit, the stream's lag", () => {
  it.scoped("is now minus the source time of the last committed event (firehook_intake_lag_seconds)", () => {
    const rec = newRecorder()
    const NAME = "lag-gauge"
    const relay = memoryRelay([{ seq: 1n, ops: 1 }])
    return Effect.gen(function*() {
      const eventUs = eventsOf({ seq: 1n, ops: 1 })[0]?.timeUs ?? 0
      // 90 s after the event
      yield* TestClock.setTime(Math.floor(eventUs / 1000) + 90_000)
      const runner = yield* Intake.makeStreamRunner({ ...relay.spec, name: NAME }, tuning)
      yield* Effect.forkScoped(runner.run)
      yield* until(() => rec.batches.length === 1, "committed")
      expect(Math.round(yield* seriesValue("firehook_intake_lag_seconds", { stream: NAME }))).toBe(90)
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("intake health: cursor age", () => {
  it.effect("is never negative (an event time ahead of this clock), SPEC §6.2 numbers clamped to 0..", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(1_000_000)
      const h = yield* Intake.healthSection(
        {
          run: Effect.never,
          stats: Effect.succeed({
            running: true,
            streams: [{ name: "relay", state: { ...initialState, connected: true, lastEventTimeUs: 5_000_000_000 } }]
          }),
          stopAccepting: Effect.void
        },
        Effect.succeed("leader" as const),
        Effect.succeed({ rejected: {} })
      )
      expect(h.body.streams["relay"]?.cursorAgeSeconds).toBe(0)
    }))
})

describe("a batch that reaches the batch limit with the end of a frame", () => {
  it.scoped("commits at once with that frame's cursor (never a full batch behind the frames it completes)", () => {
    const committed: Array<{ readonly events: number; readonly cursor: bigint | undefined }> = []
    let gate: Deferred.Deferred<void> | undefined
    const recording = Layer.succeed(
      Processor,
      {
        processEvents: (batch, options) =>
          Effect.gen(function*() {
            if (gate !== undefined) yield* Deferred.await(gate)
            if (options.finalize !== undefined) yield* options.finalize
            committed.push({ events: batch.length, cursor: options.cursor?.cursor })
            return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
          }),
        reload: Effect.void,
        stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
      } satisfies ProcessorShape
    )
    const frame = (seq: bigint, ops: number): Intake.SourceItem => ({
      _tag: "events",
      events: eventsOf({ seq, ops }),
      cursor: seq
    })
    return Effect.gen(function*() {
      const q = yield* Queue.unbounded<Intake.SourceItem>()
      const spec: Intake.StreamSpec = {
        ...memoryRelay([]).spec,
        connect: () => Stream.concat(Stream.succeed(opened), Stream.fromQueue(q))
      }
      gate = yield* Deferred.make<void>()
      const held = gate
      const runner = yield* Intake.makeStreamRunner(spec, Intake.defaultTuning(512, 4))
      yield* Effect.forkScoped(runner.run)
      // frame 1's batch is held in its commit while frames 2–4 (2 operations each) queue up
      yield* Queue.offer(q, frame(1n, 1))
      yield* turns(20)
      yield* Queue.offerAll(q, [frame(2n, 2), frame(3n, 2), frame(4n, 2)])
      yield* turns(20)
      gate = undefined
      yield* Deferred.succeed(held, undefined)
      yield* until(() => committed.length === 3, "the batches committed")
      // frames 2 and 3 fill a batch: it commits with frame 3's cursor
      expect(committed).toEqual([{ events: 1, cursor: 1n }, { events: 4, cursor: 3n }, { events: 2, cursor: 4n }])
    }).pipe(
      Effect.provide(Layer.mergeAll(recording, CursorStore.layerMemory, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})
