/**
 * The stream runner against an in-memory source (no sockets) and the TestClock: the durable cursor
 * is read before anything else, even when the database fails at first (SPEC §3.2/§3.3: the cursor
 * never moves past an unprocessed frame), and the per-stream queue bound counts events, not frames
 * (SPEC §3.3: 512 events), which matters on the relay source, where one frame carries many operations.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Layer, Ref, Scheduler, Stream, TestClock } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { SourceError } from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { directStep } from "../../src/services/intake/JetstreamPlan.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { halfJitter } from "../support/halfJitter.js"
import { newRecorder, type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { eventsOf, type Frame, memoryRelay, RELAY, until } from "./memorySession.js"

const tuning = (queueMax: number, batchMax: number): Intake.IntakeTuning => Intake.defaultTuning(queueMax, batchMax)

/** let the other fibers run for `n` macrotask turns (no clock time passes) */
const turns = (n: number) =>
  Effect.gen(function*() {
    for (let i = 0; i < n; i++) yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
  })

const keys = (rec: Recorder) => rec.batches.flat().map((e) => (e.kind === "commit" ? e.rkey : e.kind))
const allKeys = (frames: ReadonlyArray<Frame>) =>
  frames.flatMap((f) => eventsOf(f).map((e) => (e.kind === "commit" ? e.rkey : e.kind)))

describe("durable cursor at stream start", () => {
  it.scoped("a failing cursor read is retried with backoff (never taken for 'no cursor'); the stream then resumes from the stored cursor", () => {
    const rec = newRecorder()
    const STORED = 5_000n
    const FAILURES = 6
    let loads = 0
    const flakyCursors = Layer.succeed(
      CursorStore.CursorStore,
      {
        load: () =>
          Effect.suspend(() => {
            loads++
            return loads <= FAILURES
              ? Effect.fail(new StoreError({ op: "cursors.load", code: "57P01" }))
              : Effect.succeed<bigint | undefined>(STORED)
          }),
        save: () => Effect.void
      } satisfies CursorStore.CursorStoreShape
    )
    return Effect.gen(function*() {
      const relay = memoryRelay([{ seq: STORED + 1n, ops: 1 }])
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => loads === 1, "first cursor read")
      // the read failed: nothing is read from the source (no live connection), the failure is visible
      yield* turns(20)
      expect(relay.asked).toEqual([])
      const st = yield* Ref.get(runner.state)
      expect(st.connected).toBe(false)
      expect(st.failureKind).toBe("handler")
      // the retries wait on the clock (full-jitter backoff, capped at 5 minutes): advance it
      for (let i = 0; i < 3 * FAILURES && relay.asked.length === 0; i++) {
        yield* TestClock.adjust("5 minutes")
        yield* turns(5)
      }
      yield* until(() => relay.asked.length > 0, "connected after the cursor was read")
      expect(loads).toBe(FAILURES + 1)
      // one connection, from the stored cursor (rewound a few seqs), never live
      expect(relay.asked).toEqual([STORED - 10n])
      yield* until(() => keys(rec).length === 1, "the next frame committed")
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(STORED + 1n)
    }).pipe(
      Effect.provide(Layer.mergeAll(recordingProcessor(rec), flakyCursors, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})

describe("queue bound counts events", () => {
  const stack = (rec: Recorder) => Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)

  /**
   * A runner over `frames` (a bound of 8 events, batches of 4) whose first batch is held in its
   * transaction, once the others have had 20 turns to run; `release` lets every batch through.
   */
  const startHeld = (rec: Recorder, frames: ReadonlyArray<Frame>) =>
    Effect.gen(function*() {
      const relay = memoryRelay(frames)
      const gate = yield* Deferred.make<void>()
      rec.gate = gate
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning(8, 4))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => rec.calls === 1, "first batch in its transaction")
      yield* turns(20)
      const release = Effect.andThen(Deferred.succeed(gate, undefined), () => {
        rec.gate = undefined
      })
      return { relay, runner, release }
    })

  it.scoped("relay frames with many operations: at most queueMax events are queued, then backpressure; all commit in order", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      // 6 frames of 4 operations = 24 events against a bound of 8 events
      const frames = Array.from({ length: 6 }, (_, i): Frame => ({ seq: BigInt(i + 1), ops: 4 }))
      const { relay, runner, release } = yield* startHeld(rec, frames)
      // the first batch is held: what was read is queued (or in that batch), and no more than the bound
      const held = yield* Ref.get(runner.state)
      expect(held.queued).toBe(8)
      // the bound was reached: the socket closed (backpressure), the queue is kept
      expect(held.connected).toBe(false)
      expect(relay.asked).toEqual([undefined])
      yield* release
      yield* until(() => keys(rec).length === 24, "everything committed")
      // each reconnect resumes at the last ack, exactly once per event, in order
      expect(keys(rec)).toEqual(allKeys(frames))
      expect(relay.asked).toEqual([undefined, 2n, 4n])
      expect(Math.max(...rec.batches.map((b) => b.length))).toBeLessThanOrEqual(4)
      const st = yield* Ref.get(runner.state)
      expect(st.failureKind).toBe("queue")
      expect(st.durableCursor).toBe(6n)
      expect(st.queued).toBe(0)
    }).pipe(Effect.provide(stack(rec)))
  })

  it.scoped("a frame heavier than the whole bound is admitted into an empty queue (the stream never stalls on it)", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const frames: ReadonlyArray<Frame> = [
        { seq: 1n, ops: 2 },
        { seq: 2n, ops: 20 },
        { seq: 3n, ops: 2 }
      ]
      const relay = memoryRelay(frames)
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning(8, 4))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => keys(rec).length === 24, "everything committed")
      expect(keys(rec)).toEqual(allKeys(frames))
      // behind a queued frame, the heavy one waits for the queue to drain (backpressure); in a new
      // session's empty queue it is admitted alone; the frame after it waits again
      expect(relay.asked).toEqual([undefined, 1n, 2n])
      expect(Math.max(...rec.batches.map((b) => b.length))).toBeLessThanOrEqual(4)
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(3n)
    }).pipe(Effect.provide(stack(rec)))
  })

  it.scoped("one event per frame (Jetstream): the bound is exactly queueMax frames", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const frames = Array.from({ length: 12 }, (_, i): Frame => ({ seq: BigInt(i + 1), ops: 1 }))
      const { relay, runner, release } = yield* startHeld(rec, frames)
      // (the frame count it replaces read `Queue.size`, which is −1 while the batcher waits in a
      // take, and so let one frame more in)
      expect((yield* Ref.get(runner.state)).queued).toBe(8)
      yield* release
      yield* until(() => keys(rec).length === 12, "everything committed")
      expect(keys(rec)).toEqual(allKeys(frames))
      expect(relay.asked).toEqual([undefined, 8n])
    }).pipe(Effect.provide(stack(rec)))
  })
})

describe("a crash of the stream runner", () => {
  it.scoped("a defect restarts the runner after a backoff from where it was (the stream never gives up)", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const frames: ReadonlyArray<Frame> = [
        { seq: 1n, ops: 1 },
        { seq: 2n, ops: 1 }
      ]
      const relay = memoryRelay(frames)
      let connects = 0
      // the first connection is a bug (a defect thrown while opening the source)
      const spec: Intake.StreamSpec = {
        ...relay.spec,
        connect: (cursor) => (++connects === 1 ? Stream.dieMessage("a bug in the source") : relay.spec.connect(cursor))
      }
      const runner = yield* Intake.makeStreamRunner(spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => connects === 1, "first connection")
      yield* turns(20)
      // crashed: not connected, nothing committed, waiting on the clock
      expect(connects).toBe(1)
      expect((yield* Ref.get(runner.state)).failureKind).toBe("handler")
      expect(rec.batches).toEqual([])
      for (let i = 0; i < 5 && connects === 1; i++) {
        yield* TestClock.adjust("5 minutes")
        yield* turns(5)
      }
      yield* until(() => keys(rec).length === 2, "everything committed after the restart")
      expect(connects).toBe(2)
      expect(keys(rec)).toEqual(allKeys(frames))
    }).pipe(
      Effect.provide(Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })

  it.scoped("a defect in the batch handler is a handler failure: the stream backs off and resumes from the durable cursor", () => {
    const rec = newRecorder()
    let calls = 0
    const dyingOnce = Layer.succeed(
      Processor,
      {
        processEvents: (batch, options) =>
          Effect.suspend(() => {
            calls++
            if (calls === 1) return Effect.dieMessage("a bug in the handler")
            return Effect.gen(function*() {
              if (options.finalize !== undefined) yield* options.finalize
              rec.batches.push(batch)
              return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
            })
          }),
        reload: Effect.void,
        stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
      } satisfies ProcessorShape
    )
    return Effect.gen(function*() {
      const frames: ReadonlyArray<Frame> = [
        { seq: 1n, ops: 1 },
        { seq: 2n, ops: 1 }
      ]
      const relay = memoryRelay(frames)
      const runner = yield* Intake.makeStreamRunner(relay.spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => calls === 1, "the first batch handled (and died)")
      yield* turns(20)
      expect(rec.batches).toEqual([])
      expect((yield* Ref.get(runner.state)).failureKind).toBe("handler")
      for (let i = 0; i < 5 && rec.batches.length === 0; i++) {
        yield* TestClock.adjust("5 minutes")
        yield* turns(5)
      }
      yield* until(() => keys(rec).length === 2, "everything committed after the restart")
      expect(keys(rec)).toEqual(allKeys(frames))
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(2n)
    }).pipe(
      Effect.provide(Layer.mergeAll(dyingOnce, CursorStore.layerMemory, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})

describe("directReplayFrom (Jetstream direct stream after DIDs were added)", () => {
  const S = 1_000_000n // one second of time_us
  it("the registry mark − 2 s when no backlink stream runs, or when it is ahead", () => {
    expect(Intake.directReplayFrom(1000n * S, undefined, 2n * S, 300n * S)).toBe(998n * S)
    expect(Intake.directReplayFrom(1000n * S, 1005n * S, 2n * S, 300n * S)).toBe(998n * S)
  })
  it("a lagging backlink stream: from its position − 2 s (it skipped the new DIDs' events from there on)", () => {
    expect(Intake.directReplayFrom(1000n * S, 940n * S, 2n * S, 300n * S)).toBe(938n * S)
  })
  it("at most 5 minutes further back than the registry mark, and never below 0", () => {
    expect(Intake.directReplayFrom(1000n * S, 10n * S, 2n * S, 300n * S)).toBe(698n * S)
    expect(Intake.directReplayFrom(1n * S, undefined, 2n * S, 300n * S)).toBe(0n)
  })
})

describe("directStep (the direct stream when the direct DID set changed, SPEC §3.1)", () => {
  const A = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
  const B = "did:plc:bbbbbbbbbbbbbbbbbbbbbbbb"
  it("DIDs that only left the set: the running stream reconnects with the smaller filter (no replay)", () => {
    expect(directStep(new Set([A, B]), new Set([A]), true, 10)).toEqual({ _tag: "restart" })
  })
  it("an added DID replays; the same set keeps the stream; an emptied set stops it; a set over the limit changes nothing", () => {
    expect(directStep(new Set([A]), new Set([A, B]), true, 10)).toEqual({ _tag: "replay" })
    expect(directStep(new Set([A]), new Set([B]), true, 10)).toEqual({ _tag: "replay" })
    expect(directStep(new Set([A, B]), new Set([B, A]), true, 10)).toEqual({ _tag: "keep" })
    expect(directStep(new Set([A]), new Set(), true, 10)).toEqual({ _tag: "stop" })
    expect(directStep(new Set(), new Set([A]), false, 10)).toEqual({ _tag: "start" })
    expect(directStep(new Set([A]), new Set([A, B]), true, 1)).toEqual({ _tag: "over_limit" })
  })
})

describe("a connection closed for silence (idle)", () => {
  it.scoped("reconnects at once from the last ack, without backoff and without a failure kind", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const frames: ReadonlyArray<Frame> = [{ seq: 1n, ops: 1 }, { seq: 2n, ops: 1 }]
      const relay = memoryRelay(frames)
      let connects = 0
      // the first session delivers frame 1, then the source reports it went idle
      const spec: Intake.StreamSpec = {
        ...relay.spec,
        connect: (cursor) =>
          ++connects === 1
            ? Stream.fromIterable<Intake.SourceItem>([
              { _tag: "opened" },
              { _tag: "events", events: eventsOf({ seq: 1n, ops: 1 }), cursor: 1n }
            ]).pipe(Stream.concat(Stream.fail(new SourceError({ kind: "idle" }))))
            : relay.spec.connect(cursor)
      }
      const runner = yield* Intake.makeStreamRunner(spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      // no clock time passes: the reconnect does not wait for a backoff
      yield* until(() => connects === 2 && keys(rec).length === 2, "reconnected and committed")
      expect(relay.asked).toEqual([1n])
      const st = yield* Ref.get(runner.state)
      expect(st.failureKind).toBeUndefined()
      expect(st.reconnects).toBe(1)
    }).pipe(Effect.provide(Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)))
  })
})

describe("health: cursor age of a stream that has committed nothing yet", () => {
  it.scoped("is the age of its loaded time cursor (a Jetstream stream stalled on a poison frame since startup is not 'fresh')", () => {
    const rec = newRecorder()
    // the stored cursor: a Jetstream time_us one hour before now
    const STORED = 1_750_000_000_000_000n
    let connects = 0
    const spec: Intake.StreamSpec = {
      name: "registry",
      relay: RELAY,
      registryWriter: true,
      initialCursor: 0n,
      rewind: 2_000_000n,
      cursorIsTime: true,
      // every connection meets the same poison frame right after the cursor: nothing ever commits
      connect: () =>
        Stream.suspend(() => {
          connects++
          return Stream.fromIterable<Intake.SourceItem>([{ _tag: "opened" }, { _tag: "poison", reason: "did" }])
        })
    }
    return Effect.gen(function*() {
      yield* TestClock.setTime(Number(STORED / 1000n) + 3_600_000)
      const cursors = yield* CursorStore.CursorStore
      yield* cursors.save("registry", RELAY, STORED)
      const runner = yield* Intake.makeStreamRunner(spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => connects === 1, "connected once")
      yield* turns(20)
      expect(rec.batches).toEqual([])
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(STORED)
      const intake: Intake.IntakeShape = {
        run: Effect.never,
        stats: Effect.map(
          Ref.get(runner.state),
          (state) => ({ running: true, streams: [{ name: "registry", state }] })
        ),
        stopAccepting: Effect.void
      }
      const h = yield* Intake.healthSection(intake, Effect.succeed("leader" as const), Effect.succeed({ rejected: {} }))
      expect(h.body.streams["registry"]).toMatchObject({ quarantined: true, cursorAgeSeconds: 3600 })
    }).pipe(Effect.provide(Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)))
  })
})

describe("intake health of a standby", () => {
  it.effect(`is ready until ${Intake.STANDBY_FAILED_ELECTIONS_MAX} elections in a row failed (it could not take over)`, () =>
    Effect.gen(function*() {
      const intake: Intake.IntakeShape = {
        run: Effect.never,
        stats: Effect.succeed({ running: false, streams: [] }),
        stopAccepting: Effect.void
      }
      const standby = (failed: number) =>
        Intake.healthSection(
          intake,
          Effect.succeed("standby" as const),
          Effect.succeed({ rejected: {} }),
          undefined,
          Effect.succeed(failed)
        )
      expect((yield* standby(0)).ready).toBe(true)
      expect((yield* standby(Intake.STANDBY_FAILED_ELECTIONS_MAX - 1)).ready).toBe(true)
      expect((yield* standby(Intake.STANDBY_FAILED_ELECTIONS_MAX)).ready).toBe(false)
    }))
})

describe("a session ended by a poison frame", () => {
  it.scoped("leaves the stream not connected while it waits to reconnect (health: not progressing, not ready)", () => {
    const rec = newRecorder()
    let connects = 0
    const spec: Intake.StreamSpec = {
      ...memoryRelay([]).spec,
      // every connection meets a poison frame first: nothing ever commits
      connect: () =>
        Stream.suspend(() => {
          connects++
          return Stream.fromIterable<Intake.SourceItem>([{ _tag: "opened" }, { _tag: "poison", reason: "json" }])
        })
    }
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => connects === 1, "connected once")
      yield* turns(20)
      const st = yield* Ref.get(runner.state)
      // the loop waits for its (poison) backoff on the TestClock: no second connection yet
      expect(connects).toBe(1)
      expect(st).toMatchObject({ quarantined: true, failureKind: "protocol", connected: false, batches: 0 })
      const intake: Intake.IntakeShape = {
        run: Effect.never,
        stats: Effect.map(Ref.get(runner.state), (state) => ({ running: true, streams: [{ name: "relay", state }] })),
        stopAccepting: Effect.void
      }
      const h = yield* Intake.healthSection(intake, Effect.succeed("leader" as const), Effect.succeed({ rejected: {} }))
      expect(h.body).toMatchObject({ connected: false, progressing: false })
      expect(h.ready).toBe(false)
    }).pipe(Effect.provide(Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)))
  })
})

describe("the quarantine row of a poison frame met first in a session", () => {
  it.scoped("carries the cursor the stream had committed through (not null), so an operator can see where it is stalled", () => {
    const rec = newRecorder()
    const STORED = 7_000n
    let connects = 0
    const spec: Intake.StreamSpec = {
      ...memoryRelay([]).spec,
      connect: () =>
        Stream.suspend(() => {
          connects++
          return Stream.fromIterable<Intake.SourceItem>([{ _tag: "opened" }, { _tag: "poison", reason: "did" }])
        })
    }
    return Effect.gen(function*() {
      const cursors = yield* CursorStore.CursorStore
      yield* cursors.save("relay", RELAY, STORED)
      const runner = yield* Intake.makeStreamRunner(spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      const outbox = yield* Outbox.MemoryOutboxState
      yield* until(() => connects === 1, "connected once")
      yield* turns(20)
      const rows = (yield* Ref.get(outbox)).quarantine
      expect(rows).toHaveLength(1)
      expect(rows[0]).toMatchObject({ stream: "relay", reason: "protocol", cursor: STORED })
    }).pipe(Effect.provide(Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)))
  })

  it.scoped("after a replay, carries where the replay had got to (its position), not the higher durable cursor", () => {
    const rec = newRecorder()
    const asked: Array<bigint | undefined> = []
    const frame = (seq: bigint): Intake.SourceItem => ({
      _tag: "events",
      events: eventsOf({ seq, ops: 1 }),
      cursor: seq
    })
    const spec: Intake.StreamSpec = {
      ...memoryRelay([]).spec,
      connect: (cursor) =>
        Stream.suspend(() => {
          asked.push(cursor)
          const opened: Intake.SourceItem = { _tag: "opened" }
          switch (asked.length) {
            case 1: // frames 1–3 commit: durable cursor 3
              return Stream.fromIterable([opened, frame(1n), frame(2n), frame(3n)]).pipe(Stream.concat(Stream.never))
            case 2: // the replay from 0 commits frame 1, then the relay closes the session
              return Stream.fromIterable<Intake.SourceItem>([opened, frame(1n), {
                _tag: "relay_error",
                error: "ConsumerTooSlow"
              }])
            default: // the reconnection meets a poison frame first
              return Stream.fromIterable<Intake.SourceItem>([opened, { _tag: "poison", reason: "did" }])
          }
        })
    }
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, tuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      const outbox = yield* Outbox.MemoryOutboxState
      yield* until(() => keys(rec).length === 3, "frames 1–3 committed")
      yield* runner.restart(0n)
      yield* until(() => keys(rec).length === 4, "the replay's frame 1 committed")
      expect(yield* Ref.get(runner.state)).toMatchObject({ durableCursor: 3n, position: 1n })
      // past any reconnection backoff
      for (let i = 0; i < 20 && asked.length < 3; i++) {
        yield* TestClock.adjust("10 seconds")
        yield* turns(20)
      }
      expect(asked).toEqual([undefined, 0n, 1n])
      yield* until(() => Ref.get(outbox).pipe(Effect.runSync).quarantine.length === 1, "the quarantine row")
      expect((yield* Ref.get(outbox)).quarantine[0]).toMatchObject({ stream: "relay", reason: "protocol", cursor: 1n })
    }).pipe(Effect.provide(Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)))
  })
})
