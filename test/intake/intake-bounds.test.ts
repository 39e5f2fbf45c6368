/**
 * The stream loop's promised waits, on the TestClock with every random draw 0.5 (so the n-th
 * full-jitter delay is exactly min(cap, base · 2ⁿ) / 2): SPEC §3.3 "full-jitter exponential backoff,
 * 1 s base, 5 min cap, never gives up; counters reset after a durable ack", the slower backoff after
 * a poison frame (SPEC §3.2), the 30 s cap of a wait caused by firehook's own store (StreamRunner's
 * `STORE_BACKOFF_CAP`, for a failed batch and a failed cursor read), and the growing backoff of a
 * crashed loop. Each connection (or cursor read) notes the TestClock time it happened at; the test
 * checks the gaps between them. In-memory source and stores (no sockets).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import {
  Clock,
  Deferred,
  Duration,
  Effect,
  Either,
  Fiber,
  Layer,
  Logger,
  Queue,
  Ref,
  Scheduler,
  Stream,
  TestClock
} from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { relayUrl, SourceError } from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { runJetstream } from "../../src/services/intake/JetstreamPlan.js"
import {
  initialState,
  type StreamRunner,
  type StreamSpec,
  type StreamState
} from "../../src/services/intake/StreamModel.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { type ActiveWebhook, makeActiveWebhook, WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { plc, REV } from "../matching/fixtures.js"
import { halfJitter } from "../support/halfJitter.js"
import { seriesValue } from "../support/metricSeries.js"
import { newRecorder, type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { sqlStack } from "../support/stack.js"
import { eventsOf, memoryRelay, until } from "./memorySession.js"

/** the default tuning (SPEC §3.3: 1 s base, 5 min cap; 10 s poison backoff) */
const tuning = Intake.defaultTuning(512, 128)

/** let the other fibers run for `n` macrotask turns (no clock time passes) */
const turns = (n: number) =>
  Effect.gen(function*() {
    for (let i = 0; i < n; i++) yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
  })

/** advance the TestClock in `stepMs` steps until `count()` reaches `n` (bounded) */
const advanceUntil = (count: () => number, n: number, stepMs: number, what: string) =>
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
const gaps = (times: ReadonlyArray<number>, n: number) => times.slice(1, n).map((t, i) => t - (times[i] ?? 0))

const stack = (rec: Recorder) => Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)

/** a stream whose connection `n` (from 1) is `script(n)`; `at` holds the Clock time of each connect */
const scripted = (script: (n: number) => Stream.Stream<Intake.SourceItem, SourceError>) => {
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

const refused = Stream.fail(new SourceError({ kind: "connect" }))
const opened: Intake.SourceItem = { _tag: "opened" }

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

/** a relay-like source: connection `n` (from 1) records its cursor and gets `script(n, cursor)`, then stays open */
const recording = (script: (n: number, cursor: bigint | undefined) => ReadonlyArray<Intake.SourceItem>) => {
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

const frameAt = (seq: bigint): Intake.SourceItem => ({ _tag: "events", events: eventsOf({ seq, ops: 1 }), cursor: seq })

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

// ---------------------------------------------------------------------------------------------
// The Jetstream plan's reconfiguration (SPEC §3.1), with stand-in runners whose state the test sets

const OWNER = plc(1)
const RELAY_URL = "wss://relay.test"
const T1 = 1_800_000_000_000_000n
const SEC = 1_000_000n

/** an active webhook of OWNER on `aturi` */
const hook = (rkey: string, aturi: string, backlinks = false): ActiveWebhook => {
  const v = validateWhRecord({
    $type: "place.wisp.v2.wh",
    scope: backlinks ? { aturi, backlinks: true } : { aturi },
    url: "https://example.com/hook",
    createdAt: "2024-01-01T00:00:00Z"
  }, { allowInsecureDev: false })
  if (Either.isLeft(v)) return expect.unreachable("a valid record")
  return makeActiveWebhook(OWNER, rkey, v.right.record, v.right.scope, REV)
}

interface PlanLog {
  readonly started: Array<
    { readonly name: string; readonly from: bigint | undefined; readonly floor: bigint | undefined }
  >
  readonly restarts: Array<{ readonly name: string; readonly cursor: bigint | undefined }>
  readonly states: Map<string, Ref.Ref<StreamState>>
}

/** run the plan over `index` (checks every second); each stream's state starts as `initial[name]` */
const runPlan = (index: WebhookIndex, initial: Readonly<Record<string, Partial<StreamState>>>) =>
  Effect.gen(function*() {
    const log: PlanLog = { started: [], restarts: [], states: new Map() }
    const makeRunner = (spec: StreamSpec) =>
      Effect.gen(function*() {
        const state = yield* Ref.make<StreamState>({ ...initialState, ...initial[spec.name] })
        log.states.set(spec.name, state)
        const runner: StreamRunner = {
          spec,
          state,
          restart: (cursor) => Effect.sync(() => void log.restarts.push({ name: spec.name, cursor })),
          runFrom: () => Effect.never,
          run: Effect.never,
          stopReading: Effect.void
        }
        return runner
      })
    const start = (r: StreamRunner, from: bigint | undefined) =>
      Effect.zipRight(
        Effect.sync(() => void log.started.push({ name: r.spec.name, from, floor: r.spec.resumeFloor })),
        Effect.never
      )
    yield* Effect.forkScoped(runJetstream({
      url: "wss://jetstream.test/subscribe",
      common: { maxBytes: 1 << 20, connectTimeoutMs: 1000, allowInsecure: false },
      index,
      directDidsMax: 100,
      reconfigureDelay: Duration.seconds(1),
      makeRunner,
      start
    }))
    yield* turns(10)
    return log
  })

/** one reconfiguration check later */
const nextCheck = Effect.zipRight(TestClock.adjust("1 second"), turns(10))

describe("the Jetstream plan's reconfiguration (SPEC §3.1)", () => {
  it.scoped("the direct stream's first start is from its own cursor; an added DID replays from the registry's event position at the previous check − 2 s", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      index.upsert(hook("w1", `at://${plc(2)}`))
      // the registry stream's last event is at T1; its durable cursor lags behind (a batch of
      // frames without events commits no event time): the event time is the mark
      const log = yield* runPlan(index, { registry: { lastEventTimeUs: Number(T1), durableCursor: T1 - 5n * SEC } })
      expect(log.started.filter((s) => s.name === "direct")).toEqual([{
        name: "direct",
        from: undefined,
        floor: undefined
      }])
      index.upsert(hook("w2", `at://${plc(3)}`))
      yield* nextCheck
      expect(log.restarts).toEqual([{ name: "direct", cursor: T1 - 2n * SEC }])
    }))

  it.scoped("with a backlink stream lagging behind the registry, an added DID replays from the backlink's position − 2 s", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      index.upsert(hook("w1", `at://${plc(2)}`, true))
      const log = yield* runPlan(index, {
        registry: { lastEventTimeUs: Number(T1) },
        backlink: { position: T1 - 60n * SEC }
      })
      // the backlink stream's position is taken at a check after it started
      yield* nextCheck
      index.upsert(hook("w2", `at://${plc(3)}`))
      yield* nextCheck
      expect(log.restarts).toEqual([{ name: "direct", cursor: T1 - 62n * SEC }])
    }))

  it.scoped("the backlink stream's first start has no floor; started again after its set emptied, its floor is the registry's previous mark − 2 s", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      index.upsert(hook("b1", `at://${plc(2)}`, true))
      const log = yield* runPlan(index, { registry: { lastEventTimeUs: Number(T1) } })
      expect(log.started.filter((s) => s.name === "backlink")).toEqual([{
        name: "backlink",
        from: undefined,
        floor: undefined
      }])
      index.remove(hook("b1", `at://${plc(2)}`, true).key)
      yield* nextCheck
      // the registry reads on; the plan sees it at T1 + 50 s, then a backlink webhook is registered
      const registry = log.states.get("registry")
      if (registry === undefined) return expect.unreachable("the registry stream")
      yield* Ref.update(registry, (s) => ({ ...s, lastEventTimeUs: Number(T1 + 50n * SEC) }))
      yield* nextCheck
      index.upsert(hook("b2", `at://${plc(2)}`, true))
      yield* nextCheck
      expect(log.started.filter((s) => s.name === "backlink")).toEqual([
        { name: "backlink", from: undefined, floor: undefined },
        { name: "backlink", from: undefined, floor: T1 + 48n * SEC }
      ])
    }))
})

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
