/**
 * The cursor a batch commits (SPEC §3.2/§3.3): a batch is the unit of durability and its cursor is
 * written last in its transaction, so a relay frame whose operations span several batches moves the
 * cursor only with the batch that commits its last operation. A batch that commits part of a frame
 * never carries that frame's cursor: a failure after it must replay the frame's other operations.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Layer, Ref, Stream } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { eventsOf, type Frame, memoryRelay, RELAY, until } from "./memorySession.js"

/** each committed batch: its events' keys and the cursor written in its transaction */
interface Committed {
  readonly keys: ReadonlyArray<string>
  readonly cursor: bigint | undefined
}

/** a Processor that records each committed batch; `before` runs inside the batch's transaction first */
const recordingCursors = (committed: Array<Committed>, before: Effect.Effect<void> = Effect.void) =>
  Layer.succeed(
    Processor,
    {
      processEvents: (batch, options) =>
        Effect.gen(function*() {
          yield* before
          if (options.finalize !== undefined) yield* options.finalize
          committed.push({
            keys: batch.map((e) => (e.kind === "commit" ? e.rkey : e.kind)),
            cursor: options.cursor?.cursor
          })
          return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
        }),
      reload: Effect.void,
      stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
    } satisfies ProcessorShape
  )

describe("the cursor of a batch that commits part of a relay frame", () => {
  it.scoped("a frame whose operations span batches: only the batch with its last operation carries its cursor", () => {
    const committed: Array<Committed> = []
    // batches of at most 4 events: frame 1 (2 ops) and frame 2 (10 ops) commit as 4 + 4 + 4
    const frames: ReadonlyArray<Frame> = [{ seq: 1n, ops: 2 }, { seq: 2n, ops: 10 }]
    const allKeys = frames.flatMap((f) => eventsOf(f).map((e) => (e.kind === "commit" ? e.rkey : e.kind)))
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(memoryRelay(frames).spec, Intake.defaultTuning(64, 4))
      yield* Effect.forkScoped(runner.run)
      yield* until(() => committed.flatMap((c) => c.keys).length === allKeys.length, "everything committed")
      expect(committed.flatMap((c) => c.keys)).toEqual(allKeys)
      expect(Math.max(...committed.map((c) => c.keys.length))).toBeLessThanOrEqual(4)
      // whenever a batch writes cursor c, every operation of every frame up to c has committed
      // (in that batch or before): a failure after it never skips an operation
      for (let i = 0; i < committed.length; i++) {
        const c = committed[i]?.cursor
        if (c === undefined) continue
        const done = new Set(committed.slice(0, i + 1).flatMap((b) => b.keys))
        const owed = frames.filter((f) => f.seq <= c).flatMap((f) => eventsOf(f))
          .map((e) => (e.kind === "commit" ? e.rkey : e.kind))
        expect(owed.filter((k) => !done.has(k)), `batch ${i} wrote cursor ${c}`).toEqual([])
      }
      // and the last batch moves the cursor through the whole frame
      expect(committed[committed.length - 1]?.cursor).toBe(2n)
    }).pipe(Effect.provide(Layer.mergeAll(recordingCursors(committed), CursorStore.layerMemory, Outbox.layerMemory)))
  })
})

describe("after a batch commits: the identity hooks", () => {
  it.scoped("every #identity, #account and #sync event invalidates its DID's identity; only #account and #sync request a reconciliation", () => {
    const committed: Array<Committed> = []
    const identity: Array<string> = []
    const reactivated: Array<string> = []
    const did = (n: number) => `did:plc:${String(n).repeat(24)}`.slice(0, 32)
    const event = (kind: "identity" | "account" | "sync", n: number, seq: bigint): StreamEvent => ({
      kind,
      did: did(n),
      ...(kind === "account" ? { active: true } : {}),
      timeUs: 1_750_000_000_000_000 + Number(seq),
      stream: "relay",
      relay: RELAY,
      cursor: String(seq)
    })
    const items: ReadonlyArray<Intake.SourceItem> = [
      { _tag: "events", events: [event("identity", 2, 1n)], cursor: 1n },
      { _tag: "events", events: [event("account", 3, 2n)], cursor: 2n },
      { _tag: "events", events: [event("sync", 4, 3n)], cursor: 3n },
      { _tag: "events", events: eventsOf({ seq: 4n, ops: 1 }), cursor: 4n }
    ]
    const spec: Intake.StreamSpec = {
      ...memoryRelay([]).spec,
      connect: () =>
        Stream.succeed<Intake.SourceItem>({ _tag: "opened" }).pipe(
          Stream.concat(Stream.fromIterable(items)),
          Stream.concat(Stream.never)
        )
    }
    return Effect.gen(function*() {
      const runner = yield* Intake.makeStreamRunner(spec, Intake.defaultTuning(64, 4), {
        onIdentity: (d) => Effect.sync(() => void identity.push(d)),
        onReactivated: (d) => Effect.sync(() => void reactivated.push(d))
      })
      yield* Effect.forkScoped(runner.run)
      yield* until(() => committed.flatMap((c) => c.keys).length === 4, "everything committed")
      expect(identity).toEqual([did(2), did(3), did(4)])
      expect(reactivated).toEqual([did(3), did(4)])
    }).pipe(Effect.provide(Layer.mergeAll(recordingCursors(committed), CursorStore.layerMemory, Outbox.layerMemory)))
  })
})

describe("a replay from an older cursor", () => {
  it.scoped("committing replayed batches never moves the durable cursor back (SPEC §3.3: cursors never go backwards)", () => {
    const committed: Array<Committed> = []
    const frames: ReadonlyArray<Frame> = [{ seq: 1n, ops: 1 }, { seq: 2n, ops: 1 }, { seq: 3n, ops: 1 }]
    return Effect.gen(function*() {
      const hold = yield* Deferred.make<void>()
      // the 5th batch (the replay's second) is held in its transaction
      const processor = recordingCursors(
        committed,
        Effect.suspend(() => (committed.length === 4 ? Deferred.await(hold) : Effect.void))
      )
      yield* Effect.gen(function*() {
        const runner = yield* Intake.makeStreamRunner(memoryRelay(frames).spec, Intake.defaultTuning(64, 1))
        yield* Effect.forkScoped(runner.run)
        yield* until(() => committed.length === 3, "the three frames committed")
        expect((yield* Ref.get(runner.state)).durableCursor).toBe(3n)
        // replay from the start (as the direct stream does for newly watched DIDs)
        yield* runner.restart(0n)
        yield* until(() => committed.length === 4, "the replay's first batch committed")
        expect(committed[3]?.cursor).toBe(1n)
        expect((yield* Ref.get(runner.state)).durableCursor).toBe(3n)
        yield* Deferred.succeed(hold, undefined)
        yield* until(() => committed.length === 6, "the replay committed")
        expect((yield* Ref.get(runner.state)).durableCursor).toBe(3n)
      }).pipe(Effect.provide(Layer.mergeAll(processor, CursorStore.layerMemory, Outbox.layerMemory)))
    })
  })
})
