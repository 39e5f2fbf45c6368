/**
 * A stream that connected LIVE (no cursor: the relay firehose's first start, the backlink stream's
 * first start without a stored cursor, or the live connection after a relay's `FutureCursor`) and
 * ended before it committed anything reconnects from where it started reading, not live again.
 * SPEC §3.3: "A failing batch is retried in place (3 attempts ...); after that the stream fails:
 * queue dropped, socket closed, reconnect from the durable cursor"; SPEC §3.2: "the cursor never
 * moves past an unprocessed frame". Before, such a stream reconnected live: the frames of its failed
 * batch, and everything the source sent during the backoff, were never read (found by the frames
 * review); a poison frame first in such a session was skipped the same way.
 * In-memory sources (no sockets): a connection with a cursor gets every frame after it
 * (subscribeRepos semantics), a live one what its script says; TestClock for the backoffs.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Clock, Effect, Layer, Ref, Scheduler, Stream, TestClock } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { halfJitter } from "../support/halfJitter.js"
import { newRecorder, type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { eventsOf, type Frame, RELAY, until } from "./memorySession.js"

/** the relay's log: 100..103 exist when the live connection opens, 104..105 come during the backoff */
const LOG: ReadonlyArray<Frame> = [100n, 101n, 102n, 103n, 104n, 105n].map((seq) => ({ seq, ops: 1 }))
const rkeysOf = (frames: ReadonlyArray<Frame>) =>
  frames.flatMap((f) => eventsOf(f).map((e) => (e.kind === "commit" ? e.rkey : e.kind)))
const committed = (rec: Recorder) => rec.batches.flat().map((e) => (e.kind === "commit" ? e.rkey : e.kind))
const eventsItem = (f: Frame): Intake.SourceItem => ({ _tag: "events", events: eventsOf(f), cursor: f.seq })

/**
 * An in-memory source: the n-th connection gets `script(n, cursor)` (undefined: every frame of
 * {@link LOG} after its cursor), then stays open. `asked` records each connection's cursor.
 */
const scriptedSource = (
  base: Pick<Intake.StreamSpec, "name" | "initialCursor" | "rewind" | "cursorIsTime">,
  script: (n: number, cursor: bigint | undefined) => ReadonlyArray<Intake.SourceItem> | undefined
) => {
  const asked: Array<bigint | undefined> = []
  const spec: Intake.StreamSpec = {
    ...base,
    relay: RELAY,
    registryWriter: false,
    connect: (cursor) =>
      Stream.suspend(() => {
        asked.push(cursor)
        const items = script(asked.length - 1, cursor) ??
          LOG.filter((f) => cursor === undefined || f.seq > cursor).map(eventsItem)
        return Stream.succeed<Intake.SourceItem>({ _tag: "opened" }).pipe(
          Stream.concat(Stream.fromChunk(Chunk.fromIterable(items))),
          Stream.concat(Stream.never)
        )
      })
  }
  return { spec, asked }
}

const relayBase = { name: "relay", initialCursor: undefined, rewind: 10n, cursorIsTime: false } as const

/** advance the TestClock past batch retries and reconnect backoffs until `cond` holds */
const untilReconnected = (cond: () => boolean, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 50 && !cond(); i++) {
      yield* TestClock.adjust("5 minutes")
      for (let j = 0; j < 20 && !cond(); j++) yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
    }
    yield* until(cond, what)
  })

const stack = (rec: Recorder) => Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)

describe("a live session whose first batch fails all its attempts", () => {
  it.scoped("reconnects from before its first frame (seq − 1), and commits every frame once", () => {
    const rec = newRecorder()
    // the first batch fails every attempt (3): the session ends as a handler failure
    rec.failures = 3
    // live: the first connection sees 100..103 as they happen; a later live one would see nothing
    // older than its own start (106 on, none here)
    const source = scriptedSource(
      relayBase,
      (n, cursor) => cursor !== undefined ? undefined : n === 0 ? LOG.slice(0, 4).map(eventsItem) : []
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* untilReconnected(() => source.asked.length >= 2, "the reconnect after the failed batch")
      // before: [undefined, undefined], and nothing was ever committed
      expect(source.asked).toEqual([undefined, 99n])
      yield* until(() => committed(rec).length >= LOG.length, "every frame committed")
      expect(committed(rec)).toEqual(rkeysOf(LOG))
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("the live session after a FutureCursor too: its replay point wins over the stored cursor", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const store = yield* CursorStore.CursorStore
      // a relay reset: its seqs are far behind the stored cursor
      yield* store.save("relay", RELAY, 5000n)
      // 0: FutureCursor to the stored cursor; 1: live, 100..103, whose batch fails; 2: from the
      // replay point, everything after it
      const source = scriptedSource(relayBase, (n, cursor) =>
        cursor === undefined
          ? (n === 1 ? LOG.slice(0, 4).map(eventsItem) : [])
          : cursor >= 1000n
          ? [{ _tag: "relay_error", error: "FutureCursor" }]
          : undefined)
      rec.failures = 3
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* untilReconnected(() => source.asked.length >= 3, "the reconnect after the failed batch")
      // before: [4990n, undefined, 4990n, undefined]: FutureCursor again, then live again
      expect(source.asked).toEqual([4990n, undefined, 99n])
      yield* until(() => committed(rec).length >= LOG.length, "every frame committed")
      expect(committed(rec)).toEqual(rkeysOf(LOG))
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("a replay point the relay answers with FutureCursor is dropped: the stream goes live, once", () => {
    const rec = newRecorder()
    rec.failures = 3
    // 0: live, 100..103, whose batch fails; 1: FutureCursor to the replay point (the relay was
    // reset meanwhile); 2: live, 100..103 again (the reset relay's new seqs), committed
    const source = scriptedSource(
      relayBase,
      (_, cursor) =>
        cursor !== undefined ? [{ _tag: "relay_error", error: "FutureCursor" }] : LOG.slice(0, 4).map(eventsItem)
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* untilReconnected(() => committed(rec).length >= 4, "the live session's frames committed")
      // a few more backoffs: no further connection (the live session is connected and committed)
      yield* TestClock.adjust("30 minutes")
      expect(source.asked).toEqual([undefined, 99n, undefined])
      expect(committed(rec)).toEqual(rkeysOf(LOG.slice(0, 4)))
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

/** a Jetstream event at `timeUs` */
const jetstreamItem = (timeUs: bigint, rkey: string): Intake.SourceItem => {
  const e: StreamEvent = {
    kind: "commit",
    did: "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa",
    collection: "app.bsky.feed.like",
    rkey,
    operation: "create",
    rev: "3l3qo2vutsw2b",
    cid: undefined,
    record: { text: "x" },
    timeUs: Number(timeUs),
    stream: "backlink",
    relay: RELAY,
    cursor: String(timeUs)
  }
  return { _tag: "events", events: [e], cursor: timeUs }
}

describe("a live Jetstream session (time cursor) that ends before a commit", () => {
  const T0_MS = 1_800_000_000_000
  const T0_US = BigInt(T0_MS) * 1000n
  const backlinkBase = { name: "backlink", initialCursor: undefined, rewind: 2_000_000n, cursorIsTime: true } as const

  it.scoped("a poison frame first: the stream reconnects from when it connected − the rewind, and stalls there", () => {
    const rec = newRecorder()
    // every connection: a poison frame, then an event (never read: the session ends at the poison)
    const source = scriptedSource(backlinkBase, () => [
      { _tag: "poison", reason: "test" },
      jetstreamItem(T0_US + 5_000_000n, "after")
    ])
    return Effect.gen(function*() {
      yield* TestClock.setTime(T0_MS)
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* untilReconnected(() => source.asked.length >= 3, "two reconnects")
      // before: [undefined, undefined, ...]: the poison frame (and the event after it) skipped
      expect(source.asked.slice(0, 3)).toEqual([undefined, T0_US - 2_000_000n, T0_US - 2_000_000n])
      expect(rec.batches).toEqual([])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("a failed batch: the stream reconnects from the earlier of its start and its first frame − 1", () => {
    const rec = newRecorder()
    rec.failures = 3
    // Jetstream's clock is 5 s behind ours: its first frame is before our start − the rewind
    const first = T0_US - 5_000_000n
    const source = scriptedSource(
      backlinkBase,
      (n) => n === 0 ? [jetstreamItem(first, "a")] : [jetstreamItem(first, "a"), jetstreamItem(first + 1n, "b")]
    )
    return Effect.gen(function*() {
      yield* TestClock.setTime(T0_MS)
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* untilReconnected(() => rec.batches.length >= 1, "a batch committed")
      expect(source.asked).toEqual([undefined, first - 1n])
      expect(committed(rec)).toEqual(["a", "b"])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

/**
 * A relay commit may carry up to 200 operations, more than the default batch limit (128): the
 * first frame of a live session is then committed in two batches, the first of which writes no
 * cursor (no complete frame yet, `Batcher`). That batch is no progress: the session's replay point
 * is kept, and the reconnect backoff is not reset by it. Before, any batch counted: the stream
 * reconnected live after the frame's second batch failed (its other operations, and everything
 * sent during the backoff, were never read), and the backoff started again from its base at every
 * such session.
 */
describe("a live relay session whose first frame is larger than the batch limit", () => {
  /** 100 has more operations than the batch limit; 101 and 102 follow it */
  const BIG: ReadonlyArray<Frame> = [{ seq: 100n, ops: 150 }, { seq: 101n, ops: 1 }, { seq: 102n, ops: 1 }]

  /**
   * A processor that commits the calls `ok(n)` says (n from 1) and fails the others; it records
   * what it committed.
   */
  const failingProcessor = (rec: Recorder, ok: (n: number) => boolean) =>
    Layer.succeed(
      Processor,
      {
        processEvents: (batch, options) =>
          Effect.gen(function*() {
            rec.calls++
            if (!ok(rec.calls)) return yield* Effect.fail(new StoreError({ op: "test", code: "XX000" }))
            if (options.finalize !== undefined) yield* options.finalize
            rec.batches.push(batch)
            return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
          }),
        reload: Effect.void,
        stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
      } satisfies ProcessorShape
    )

  it.scoped("its frame's second batch fails all its attempts: it reconnects from before the frame, not live", () => {
    const rec = newRecorder()
    // call 1 (the frame's first 128 operations, no cursor) commits; calls 2..4 (the other 22 and
    // their two retries) fail: the session ends as a handler failure; later calls commit
    const processor = failingProcessor(rec, (n) => n === 1 || n > 4)
    // live: the first connection sees the log as it happens, a later live one nothing older
    const source = scriptedSource(
      relayBase,
      (n, cursor) =>
        cursor !== undefined
          ? BIG.filter((f) => f.seq > cursor).map(eventsItem)
          : n === 0
          ? BIG.map(eventsItem)
          : []
    )
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      yield* untilReconnected(() => source.asked.length >= 2, "the reconnect after the failed batch")
      // before: [undefined, undefined]: the frame's last 22 operations, 101 and 102 never read
      expect(source.asked).toEqual([undefined, 99n])
      yield* until(() => committed(rec).length >= 128 + rkeysOf(BIG).length, "every event committed")
      // the frame's first 128 operations twice (at least once), then all of it in order
      expect(committed(rec)).toEqual([...rkeysOf(BIG).slice(0, 128), ...rkeysOf(BIG)])
      const st = yield* Ref.get(runner.state)
      expect(st).toMatchObject({ durableCursor: 102n, position: 102n })
    }).pipe(
      Effect.provide(Layer.mergeAll(processor, CursorStore.layerMemory, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })

  it.scoped("a batch that writes no cursor does not reset the reconnect backoff", () => {
    const rec = newRecorder()
    // every session commits the frame's first 128 operations (no cursor), then the rest fails its
    // 3 attempts: calls 1, 5, 9, … commit; after four sessions, everything commits
    const processor = failingProcessor(rec, (n) => n % 4 === 1 || n > 16)
    const connectedAt: Array<number> = []
    const base = scriptedSource(
      relayBase,
      (_, cursor) => BIG.filter((f) => cursor === undefined || f.seq > cursor).map(eventsItem)
    )
    const spec: Intake.StreamSpec = {
      ...base.spec,
      connect: (cursor) =>
        Stream.unwrap(Effect.map(Clock.currentTimeMillis, (ms) => {
          connectedAt.push(ms)
          return base.spec.connect(cursor)
        }))
    }
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, Intake.defaultTuning(512, 128))
      yield* Effect.forkScoped(runner.run)
      // 250 ms steps: every wait here (batch retries 250 and 500 ms, backoffs (1 s · 2ⁿ) / 2) is
      // a multiple of it, so each connection is seen at its exact time
      for (let i = 0; i < 400 && connectedAt.length < 4; i++) {
        yield* TestClock.adjust("250 millis")
        for (let j = 0; j < 20; j++) yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
      }
      yield* until(() => connectedAt.length >= 4, "four connections")
      const gaps = connectedAt.slice(1, 4).map((t, i) => t - (connectedAt[i] ?? 0))
      // each gap: the batch's two retries (250 + 500 ms), then the backoff after 0, 1, 2 failures
      // in a row (500, 1000, 2000 ms). Before: 1250 ms each (every session "progressed")
      expect(gaps).toEqual([1250, 1750, 2750])
    }).pipe(
      Effect.provide(Layer.mergeAll(processor, CursorStore.layerMemory, Outbox.layerMemory)),
      Effect.withRandom(halfJitter)
    )
  })
})
