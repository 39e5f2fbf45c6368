/**
 * Shutdown (SPEC §6.3: stop intake from accepting, then drain): once intake stops accepting, no
 * stream starts reading again. Before, `stopAccepting` stopped only the streams running at that
 * moment: a registration committed while the queue drained (a backlink scope, a first direct DID)
 * made the Jetstream plan start the backlink or direct stream, which connected and read the
 * network during the shutdown (the backlink stream, the whole network, kept the drain waiting for
 * an empty queue until its bound). And a session whose batch fails after the stop (a database blip
 * during the shutdown) leaves no queued events behind: its queue is gone with it, so the drain does
 * not wait for them until the shutdown deadline.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, HashMap, Layer, Logger, Option, Ref } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { memoryStack, plc, testConfig, whRecordValue } from "../support/stack.js"

const WH = "place.wisp.v2.wh"
const T0 = 1_750_000_000_000_000

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
}

const isRegistry = (c: FakeJetstream["connections"][number]) => {
  const cols = c.options.at(-1)?.["wantedCollections"]
  return Array.isArray(cols) && cols.includes(WH)
}

/** A fake Jetstream for the test's scope, and a configuration that reads it. */
const fakeSource = Effect.gen(function*() {
  const fake = yield* Effect.acquireRelease(
    Effect.promise(() => startFakeJetstream()),
    (f) => Effect.promise(() => f.close())
  )
  return { fake, config: testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url }) }
})

/**
 * `real`, but a batch that holds a webhook record waits at `gate` (`entered` once it does), then
 * runs `then` instead.
 */
const gatedProcessor = (real: ProcessorShape, then: ProcessorShape["processEvents"]) =>
  Effect.gen(function*() {
    const gate = yield* Deferred.make<void>()
    const entered = yield* Deferred.make<void>()
    const processor: ProcessorShape = {
      ...real,
      processEvents: (batch, options) =>
        batch.some((e) => e.kind === "commit" && e.collection === WH)
          ? Effect.zipRight(
            Effect.zipRight(Deferred.succeed(entered, undefined), Deferred.await(gate)),
            then(batch, options)
          )
          : real.processEvents(batch, options)
    }
    return { processor, gate, entered }
  })

describe("intake that has stopped accepting", () => {
  it.scopedLive(
    "starts no stream, even when a registration committed during the drain asks for the backlink and direct streams",
    () =>
      Effect.gen(function*() {
        const { config, fake } = yield* fakeSource
        const refused = yield* Ref.make<ReadonlyArray<unknown>>([])
        const logger = Logger.make(({ annotations, message }) => {
          if (String(message).includes("not started")) {
            Effect.runSync(
              Ref.update(refused, (xs) => [...xs, HashMap.get(annotations, "stream").pipe(Option.getOrUndefined)])
            )
          }
        })
        yield* Effect.gen(function*() {
          const real = yield* Processor
          const registry = yield* Registry
          // the registry stream's batch with the webhook is held until intake has stopped accepting
          const { entered, gate, processor: gated } = yield* gatedProcessor(real, real.processEvents)
          const intake = yield* Intake.make({ reconfigureDelay: "20 millis", tuning }).pipe(
            Effect.provideService(Processor, gated)
          )
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => fake.connections.some((c) => c.options.length > 0)), "registry")
          // a backlink webhook (its owner and scope DID also join the direct set)
          fake.publish([
            commitFrame(plc(1), T0, WH, "bl", "create", whRecordValue(`at://${plc(2)}`, { backlinks: true }))
          ])
          yield* Deferred.await(entered)
          yield* intake.stopAccepting
          yield* Deferred.succeed(gate, undefined)
          yield* eventually(Effect.map(registry.stats, () => registry.index.backlinkDids().size === 1), "registered")
          // the plan asks for both streams; neither starts
          yield* eventually(
            Effect.map(Ref.get(refused), (xs) => xs.includes("backlink") && xs.includes("direct")),
            "the backlink and direct streams refused"
          )
          expect(fake.connections.filter((c) => !isRegistry(c))).toEqual([])
          expect((yield* intake.stats).streams.map((s) => s.name)).toEqual(["registry"])
        }).pipe(
          Effect.provide(Layer.merge(memoryStack({ config }), Logger.replace(Logger.defaultLogger, logger)))
        )
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "a session whose batch fails after the stop reports no queued events: the drain has nothing to wait for",
    () =>
      Effect.gen(function*() {
        const { config, fake } = yield* fakeSource
        yield* Effect.gen(function*() {
          const real = yield* Processor
          // the registry stream's batch is held until intake has stopped accepting, then fails
          // every attempt (the database went away as the shutdown began)
          const { entered, gate, processor: failing } = yield* gatedProcessor(
            real,
            () => Effect.fail(new StoreError({ op: "intake.commit", code: "57P01" }))
          )
          const intake = yield* Intake.make({ tuning }).pipe(Effect.provideService(Processor, failing))
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => fake.connections.some((c) => c.options.length > 0)), "registry")
          fake.publish([commitFrame(plc(1), T0, WH, "a", "create", whRecordValue(`at://${plc(2)}`))])
          yield* Deferred.await(entered)
          expect((yield* intake.stats).streams.map((s) => s.state.queued)).toEqual([1])
          yield* intake.stopAccepting
          yield* Deferred.succeed(gate, undefined)
          // the batch fails its attempts, the session ends and no new one starts
          yield* eventually(
            Effect.map(intake.stats, (s) => s.streams.every((x) => x.state.queued === 0 && !x.state.connected)),
            "no queued events left"
          )
          expect(fake.connections.length).toBe(1)
        }).pipe(Effect.provide(memoryStack({ config })))
      }),
    { timeout: 60_000 }
  )
})
