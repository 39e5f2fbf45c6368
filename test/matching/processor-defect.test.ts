/**
 * The processor's one worker fiber survives a defect (a bug) in a unit of work: batches written
 * together whose statement dies are retried one by one, and a dying expiry check is logged and
 * skipped. Before, such a defect ended the worker: every request it had taken or had queued was
 * never answered, and every later `processEvents` waited for ever (intake hung silently). Once the
 * worker has ended all the same, a call fails at once with its cause. In
 * memory, with a store whose call dies; a hang is detected by a timeout on the TestClock (it only
 * moves once every fiber is suspended).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Context, Deferred, Effect, Exit, Fiber, Layer, Scope, TestClock } from "effect"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../../src/services/matching/PriorRefsStore.js"
import * as Processor from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { ev, plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"

/** which calls of the faked store die (1-based), and how many were made */
interface Faults {
  readonly dieOn: ReadonlySet<number>
  calls: number
}

/** a one-statement store over the memory outbox: no rows (the events match nothing), dies on the calls asked */
const outboxWithCommitBatch = (faults: Faults) =>
  Layer.effect(
    Outbox.OutboxStore,
    Effect.map(Outbox.OutboxStore, (real): Outbox.OutboxStoreShape => ({
      ...real,
      commitBatch: (c) =>
        Effect.suspend(() => {
          faults.calls++
          if (faults.dieOn.has(faults.calls)) return Effect.die(new TypeError("commitBatch bug"))
          expect(c.rows).toEqual([])
          return Effect.succeed({ existing: new Map(), inserted: 0, insertedIds: new Set(), priorWritten: new Set() })
        })
    }))
  ).pipe(Layer.provideMerge(Outbox.layerMemory))

/** the memory prior-reference store whose `expire` (the expiry check) dies */
const priorRefsExpireDies = Layer.effect(
  PriorRefsStore.PriorRefsStore,
  Effect.map(PriorRefsStore.makeMemory(), (real): PriorRefsStore.PriorRefsStoreShape => ({
    ...real,
    expire: () => Effect.die(new TypeError("expire bug"))
  }))
)

const stack = (
  outbox: Layer.Layer<Outbox.OutboxStore>,
  priorRefs: Layer.Layer<PriorRefsStore.PriorRefsStore> = PriorRefsStore.layerMemory(),
  priorLimits?: Partial<Processor.PriorRefLimits>
) =>
  Processor.layer(priorLimits).pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(RegistryStore.layerMemory, priorRefs, outbox, Tx.layerMemory, CursorStore.layerMemory)
    ),
    Layer.provideMerge(Config.layerValue(testConfig()))
  )

const at = (stream: string, cursor: bigint): Processor.ProcessOptions => ({
  registryWriter: false,
  cursor: { stream, relay: "wss://relay.test", cursor }
})

/**
 * The exit of `effect`, or a test failure if it has not completed once every fiber is suspended
 * (the TestClock moves only then): it would wait for ever.
 */
const settled = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const fiber = yield* Effect.fork(
      Effect.exit(effect).pipe(Effect.timeoutFail({
        duration: "1 minute",
        onTimeout: () => "never completed (the matching worker is gone)" as const
      }))
    )
    yield* TestClock.adjust("1 minute")
    const result = yield* Effect.either(Fiber.join(fiber))
    if (result._tag === "Left") return expect.fail(result.left)
    return result.right
  })

const noMatch = (stream: string, rkey: string, n: number) =>
  Effect.flatMap(
    Processor.Processor,
    (p) => p.processEvents([ev(BOB, POST, rkey, { rev: rev(n) })], at(stream, BigInt(n)))
  )

describe("the matching worker survives a defect", () => {
  it.effect("batches written together whose statement dies are retried one by one; later batches are processed", () => {
    const faults: Faults = { dieOn: new Set([1, 5]), calls: 0 }
    return Effect.gen(function*() {
      const processor = yield* Processor.Processor
      // a batch in a transaction (a finalize without cursor data) holds the worker until the two
      // one-statement batches below are queued behind it, so they are written together
      const gate = yield* Deferred.make<void>()
      const first = yield* Effect.fork(
        processor.processEvents([ev(CAROL, POST, "t", { rev: rev(1) })], {
          registryWriter: false,
          finalize: Deferred.await(gate)
        })
      )
      yield* Effect.yieldNow()
      const a = yield* Effect.fork(noMatch("direct", "g1", 10))
      const b = yield* Effect.fork(noMatch("backlink", "g2", 11))
      yield* Effect.yieldNow()
      yield* Deferred.succeed(gate, undefined)
      expect((yield* Fiber.join(first)).outcomes.map((o) => o._tag)).toEqual(["no_match"])
      // the statement of the two together died (call 1); each alone was written (calls 2 and 3)
      const both = yield* settled(Effect.all([Fiber.join(a), Fiber.join(b)]))
      expect(Exit.isSuccess(both)).toBe(true)
      expect(faults.calls).toBe(3)
      // the worker is still there
      const later = yield* settled(noMatch("direct", "g3", 12))
      expect(Exit.isSuccess(later)).toBe(true)
      expect(faults.calls).toBe(4)
      // a batch alone whose statement dies: its caller gets the defect, the worker goes on
      const died = yield* settled(noMatch("direct", "g4", 13))
      expect(Exit.isFailure(died) && Cause.isDie(died.cause)).toBe(true)
      expect(Exit.isSuccess(yield* settled(noMatch("direct", "g5", 14)))).toBe(true)
      expect(faults.calls).toBe(6)
    }).pipe(Effect.provide(stack(outboxWithCommitBatch(faults))))
  })

  it.effect("an expiry check that dies is skipped; the batch behind it is processed", () =>
    Effect.gen(function*() {
      // a backlink webhook: its own record references BOB, so one prior-reference key (TTL 60 s)
      const register: ReadonlyArray<StreamEvent> = [
        whEv(ALICE, "bl", whRecordValue(`at://${BOB}`, { backlinks: true }), { rev: rev(1) })
      ]
      const processor = yield* Processor.Processor
      yield* processor.processEvents(register, { registryWriter: true })
      expect((yield* processor.stats).priorRefKeys).toBe(1)
      // past the key's expiry: the next unit asks the table (`expire`), which dies
      yield* TestClock.adjust("2 minutes")
      const later = yield* settled(
        processor.processEvents([ev(CAROL, POST, "p", { rev: rev(2) })], { registryWriter: true })
      )
      expect(Exit.isSuccess(later)).toBe(true)
    }).pipe(Effect.provide(stack(Outbox.layerMemory, priorRefsExpireDies, { ttlSeconds: 60 }))))

  it.effect("once the worker has ended (its scope closed), a call fails at once with its cause instead of waiting", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(stack(Outbox.layerMemory), scope)
      const processor = Context.get(context, Processor.Processor)
      yield* Scope.close(scope, Exit.void)
      const batch = yield* settled(
        processor.processEvents([ev(CAROL, POST, "p", { rev: rev(1) })], { registryWriter: false })
      )
      expect(Exit.isFailure(batch) && Cause.isInterruptedOnly(batch.cause)).toBe(true)
      const reload = yield* settled(processor.reload)
      expect(Exit.isFailure(reload) && Cause.isInterruptedOnly(reload.cause)).toBe(true)
    }))
})
