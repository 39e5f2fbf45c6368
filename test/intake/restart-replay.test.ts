/**
 * A replay point asked for is never lost (SPEC §3.1: "a newly watched DID's stream resumes from
 * min(its durable cursor, registration time − 2 s) so nothing since the registration is missed").
 * The direct stream is asked to replay (`restart(cursor)`) when DIDs join its set; if its session is
 * already ending for another reason (the socket closed while a batch commits), or the connection
 * from the replay point fails, the stream must still reconnect from that point, and keep it until a
 * session from it has committed a batch. In-memory source (no sockets), TestClock for the backoff.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Deferred, Effect, Layer, Queue, Ref, Scheduler, Stream, Take, TestClock } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import { SourceError } from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { halfJitter } from "../support/halfJitter.js"
import { newRecorder, type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { until } from "./memorySession.js"

const RELAY = "wss://jetstream.test"
const DID = "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa"
const T0 = 1_750_000_000_000_000
/** where a DID that joined the direct set asks the stream to replay from (5 s before T0) */
const REPLAY = BigInt(T0 - 5_000_000)

const frame = (timeUs: number, rkey: string): Intake.SourceItem => {
  const e: StreamEvent = {
    kind: "commit",
    did: DID,
    collection: "app.bsky.feed.post",
    rkey,
    operation: "create",
    rev: "3l3qo2vutsw2b",
    cid: undefined,
    record: { text: "x" },
    timeUs,
    stream: "direct",
    relay: RELAY,
    cursor: String(timeUs)
  }
  return { _tag: "events", events: [e], cursor: BigInt(timeUs) }
}

/**
 * A scripted Jetstream: each connection records its cursor and reads a queue the test feeds
 * (`Take.end`: the socket closes); the connections numbered in `failing` fail to open. The
 * TestClock starts at T0: a committed time cursor is held to the clock + 5 minutes.
 */
const scriptedSource = (failing: ReadonlySet<number> = new Set()) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(T0 / 1000)
    const asked: Array<bigint | undefined> = []
    const queues: Array<Queue.Queue<Take.Take<Intake.SourceItem, SourceError>>> = []
    const spec: Intake.StreamSpec = {
      name: "direct",
      relay: RELAY,
      registryWriter: false,
      initialCursor: 0n,
      rewind: 2_000_000n,
      cursorIsTime: true,
      connect: (cursor) =>
        Stream.unwrap(Effect.gen(function*() {
          const q = yield* Queue.unbounded<Take.Take<Intake.SourceItem, SourceError>>()
          queues.push(q)
          asked.push(cursor)
          if (failing.has(asked.length - 1)) return Stream.fail(new SourceError({ kind: "connect" }))
          return Stream.succeed<Intake.SourceItem>({ _tag: "opened" }).pipe(
            Stream.concat(Stream.flattenTake(Stream.fromQueue(q)))
          )
        }))
    }
    const send = (connection: number, items: ReadonlyArray<Intake.SourceItem>) =>
      Effect.suspend(() => {
        const q = queues[connection]
        return q === undefined
          ? Effect.dieMessage(`no connection ${connection}`)
          : Queue.offer(q, Take.chunk(Chunk.fromIterable(items)))
      })
    const close = (connection: number) =>
      Effect.suspend(() => {
        const q = queues[connection]
        return q === undefined ? Effect.dieMessage(`no connection ${connection}`) : Queue.offer(q, Take.end)
      })
    return { spec, asked, send, close }
  })

/** advance the TestClock past reconnect backoffs until `cond` holds */
const untilReconnected = (cond: () => boolean, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 50 && !cond(); i++) {
      yield* TestClock.adjust("5 minutes")
      for (let j = 0; j < 20 && !cond(); j++) yield* Effect.yieldNow().pipe(Effect.withScheduler(Scheduler.timer(0)))
    }
    yield* until(cond, what)
  })

const stack = (rec: Recorder) => Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)

/**
 * A stream that committed p1, whose batch of p2 is held in its commit while its socket closes
 * (the session is ending), and then is asked to replay from {@link REPLAY}.
 */
const askedWhileEnding = (rec: Recorder) =>
  Effect.gen(function*() {
    const source = yield* scriptedSource()
    const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(64, 128))
    yield* Effect.forkScoped(runner.run)
    yield* until(() => source.asked.length === 1, "first connection")
    yield* source.send(0, [frame(T0 + 1000, "p1")])
    yield* until(() => rec.batches.length === 1, "p1 committed")
    const gate = yield* Deferred.make<void>()
    rec.gate = gate
    yield* source.send(0, [frame(T0 + 2000, "p2")])
    yield* until(() => rec.calls === 2, "p2 in its commit")
    // the socket closes meanwhile: the reader has ended the session, the batcher still drains
    yield* source.close(0)
    yield* until(() => !Effect.runSync(Ref.get(runner.state)).connected, "the session's reader ended")
    yield* runner.restart(REPLAY)
    rec.gate = undefined
    yield* Deferred.succeed(gate, undefined)
    yield* until(() => rec.batches.length === 2, "p2 committed")
    return { source, runner }
  })

describe("a replay point asked for while the session is already ending", () => {
  it.scoped("the stream reconnects from it, not from its own position", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const { source } = yield* askedWhileEnding(rec)
      yield* untilReconnected(() => source.asked.length >= 2, "reconnected")
      // the first connection started from the initial cursor; the second from the replay point
      // (its own position was T0 + 2000)
      expect(source.asked).toEqual([0n, REPLAY])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

describe("a replay point is kept until a session from it has committed a batch", () => {
  it.scoped("a connection from it that fails is retried from it; once replayed, the stream resumes from its position", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      // the second connection (the first from the replay point) fails to open
      const source = yield* scriptedSource(new Set([1]))
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(64, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => source.asked.length === 1, "first connection")
      yield* source.send(0, [frame(T0 + 1000, "p1")])
      yield* until(() => rec.batches.length === 1, "p1 committed")
      // a DID joined the direct set while the session runs: it ends, and reconnects at once
      yield* runner.restart(REPLAY)
      yield* until(() => source.asked.length === 2, "reconnected from the replay point")
      expect(source.asked).toEqual([0n, REPLAY])
      // that connection failed: after the backoff, the stream connects from the replay point again
      yield* untilReconnected(() => source.asked.length === 3, "connected again")
      expect(source.asked).toEqual([0n, REPLAY, REPLAY])
      // the replayed session commits a batch, then its socket closes: the replay point is spent,
      // the stream resumes from its own position
      yield* source.send(2, [frame(T0 - 4_000_000, "p0")])
      yield* until(() => rec.batches.length === 2, "p0 committed")
      yield* source.close(2)
      yield* untilReconnected(() => source.asked.length === 4, "reconnected after the replay")
      expect(source.asked).toEqual([0n, REPLAY, REPLAY, BigInt(T0 - 4_000_000)])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})

/**
 * A stream with no stored cursor starts from its initial cursor (the direct stream: 0, Jetstream's
 * whole window). A replay asked for before its first commit (a DID joined the direct set: replay
 * from its registration − 2 s) must not move that start forward: SPEC §3.1 resumes from
 * min(durable cursor, registration − 2 s), and with none stored the stream has read nothing yet.
 * Before, it reconnected at the replay point, and the already-watched DIDs' events before it were
 * never read.
 */
describe("a replay asked for before the first commit of a stream with no stored cursor", () => {
  it.scoped("reconnects from the earlier of its initial cursor and the replay point", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const source = yield* scriptedSource()
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(64, 128))
      yield* Effect.forkScoped(runner.run)
      // Jetstream is still reading its window: nothing committed yet
      yield* until(() => source.asked.length === 1, "first connection")
      expect(source.asked).toEqual([0n])
      yield* runner.restart(REPLAY)
      yield* until(() => source.asked.length === 2, "reconnected for the replay")
      // before: [0n, REPLAY]: "old" (before REPLAY, never committed) was never read
      expect(source.asked).toEqual([0n, 0n])
      yield* source.send(1, [frame(T0 - 60_000_000, "old"), frame(T0, "new")])
      yield* until(() => rec.batches.length >= 1, "committed")
      expect(rec.batches.flat().map((e) => (e.kind === "commit" ? e.rkey : e.kind))).toEqual(["old", "new"])
      // committed: the point is spent, the stream resumes from its own position
      yield* source.close(1)
      yield* untilReconnected(() => source.asked.length === 3, "reconnected after the commit")
      expect(source.asked).toEqual([0n, 0n, BigInt(T0)])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })

  it.scoped("a replay point earlier than the initial cursor still wins", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const made = yield* scriptedSource()
      // a stream whose initial cursor is later than the replay asked for
      const source = { ...made, spec: { ...made.spec, initialCursor: BigInt(T0) } }
      const runner = yield* Intake.makeStreamRunner(source.spec, Intake.defaultTuning(64, 128))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => made.asked.length === 1, "first connection")
      yield* runner.restart(REPLAY)
      yield* until(() => made.asked.length === 2, "reconnected for the replay")
      expect(made.asked).toEqual([BigInt(T0), REPLAY])
    }).pipe(Effect.provide(stack(rec)), Effect.withRandom(halfJitter))
  })
})
