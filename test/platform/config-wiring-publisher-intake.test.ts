/**
 * The configuration knobs of the event path reach their services through the same construction
 * the App uses: `REDIS_PUBLISH_*` (the publisher, via `App.publisherOptions`) and `WEBHOOK_INTAKE_*`
 * tuning (read by `Intake.make` from the configuration). Each test sets values other than the
 * defaults and observes the behaviour they change.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Layer, TestClock } from "effect"
import * as App from "../../src/layers/App.js"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { Processor, type ProcessorShape } from "../../src/services/matching/Processor.js"
import * as Health from "../../src/services/platform/Health.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import { auditEvent } from "../support/auditEvent.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { fakeRedis } from "../support/fakeRedis.js"
import { settle } from "../support/settle.js"
import { memoryStack, plc, testConfig, WH, whRecordValue } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// Publisher: REDIS_PUBLISH_*

describe("REDIS_PUBLISH_* reach the publisher (App.publisherOptions)", () => {
  it.scoped("max bytes, max in flight and the reply timeout are the configured ones (TestClock)", () =>
    Effect.gen(function*() {
      const redis = yield* fakeRedis(() => undefined) // never answers
      const config = testConfig({
        REDIS_URL: redis.url,
        REDIS_PUBLISH_MAX_BYTES: "1024",
        REDIS_PUBLISH_MAX_IN_FLIGHT: "2",
        REDIS_PUBLISH_TIMEOUT_MS: "100"
      })
      const lifecycle = yield* Lifecycle.make({ shutdownTimeout: "5 seconds" })
      const health = yield* Health.make.pipe(Effect.provideService(Lifecycle.Lifecycle, lifecycle))
      const p = yield* Publisher.make(App.publisherOptions(config)).pipe(Effect.provideService(Health.Health, health))
      yield* p.awaitStats((s) => s.connected)
      // ~1.2 KB of JSON: within the default 8 KiB, over the configured 1024 bytes
      const big = auditEvent({ rkey: "x".repeat(1_000) })
      expect(Buffer.byteLength(Publisher.encodeEvent(big))).toBeGreaterThan(1024)
      expect(Buffer.byteLength(Publisher.encodeEvent(big))).toBeLessThan(Publisher.DEFAULTS.maxMessageBytes)
      yield* p.publish(big)
      expect(yield* p.stats).toMatchObject({ dropped: 1, published: 0 })
      // three small ones: two in flight, the third dropped (the default allows four)
      for (const rkey of ["r0", "r1", "r2"]) yield* p.publish(auditEvent({ rkey }))
      expect(yield* p.stats).toMatchObject({ dropped: 2, published: 0 })
      yield* redis.awaitState((x) => x.commands.length >= 2)
      const { commands } = yield* redis.state
      expect(commands.map((c) => [c[0], JSON.parse(c[2] ?? "{}").rkey])).toEqual([
        ["PUBLISH", "r0"],
        ["PUBLISH", "r1"]
      ])
      // the reply timeout is 100 ms (the default is 1 s)
      yield* settle
      yield* TestClock.adjust("99 millis")
      yield* settle
      expect((yield* p.stats).dropped).toBe(2)
      yield* TestClock.adjust("1 millis")
      const after = yield* p.awaitStats((s) => s.dropped === 4)
      expect(after.published).toBe(0)
    }))
})

// ---------------------------------------------------------------------------------------------
// Intake: WEBHOOK_INTAKE_* tuning

describe("WEBHOOK_INTAKE_* reach intake (Intake.make reads them from the configuration)", () => {
  it("the tuning of a configuration maps each variable to its field", () => {
    const c = testConfig({
      WEBHOOK_INTAKE_BATCH_ATTEMPTS: "7",
      WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS: "11",
      WEBHOOK_INTAKE_BACKOFF_BASE_MS: "1300",
      WEBHOOK_INTAKE_BACKOFF_MAX_MS: "1700",
      WEBHOOK_INTAKE_POISON_BACKOFF_MS: "1900",
      WEBHOOK_INTAKE_QUEUE_MAX: "64",
      WEBHOOK_INTAKE_BATCH_MAX: "8"
    })
    expect(Intake.tuningFromConfig(c.intake)).toEqual({
      queueMax: 64,
      batchMax: 8,
      batchAttempts: 7,
      batchRetryBase: Duration.millis(11),
      backoffBase: Duration.millis(1300),
      backoffCap: Duration.millis(1700),
      poisonBackoff: Duration.millis(1900)
    })
  })

  it.scopedLive(
    "WEBHOOK_INTAKE_BATCH_ATTEMPTS=2: a failing batch is tried twice, then the stream reconnects",
    () =>
      Effect.gen(function*() {
        const fake = yield* Effect.acquireRelease(
          Effect.promise(() => startFakeJetstream()),
          (f) => Effect.promise(() => f.close())
        )
        const config = testConfig({
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          JETSTREAM_URL: fake.url,
          WEBHOOK_INTAKE_BATCH_ATTEMPTS: "2",
          WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS: "1",
          WEBHOOK_INTAKE_BACKOFF_BASE_MS: "100",
          WEBHOOK_INTAKE_BACKOFF_MAX_MS: "100"
        })
        // the processor fails its first two calls; each call notes how many connections there were
        const seen: Array<number> = []
        const committed = yield* Deferred.make<void>()
        const processor = Layer.succeed(
          Processor,
          {
            processEvents: (batch, options) =>
              Effect.gen(function*() {
                if (batch.length === 0) return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
                seen.push(fake.connections.length)
                if (seen.length <= 2) return yield* Effect.fail(new StoreError({ op: "test", code: "XX000" }))
                if (options.finalize !== undefined) yield* options.finalize
                yield* Deferred.succeed(committed, undefined)
                return { outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }
              }),
            reload: Effect.void,
            stats: Effect.succeed({ tooComplex: 0, priorRefsRefused: 0, priorRefKeys: 0, priorRefIndexComplete: true })
          } satisfies ProcessorShape
        )
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make()
          yield* Effect.forkScoped(intake.run)
          for (let i = 0; i < 400 && !fake.connections.some((c) => c.options.length > 0); i++) {
            yield* Effect.sleep("25 millis")
          }
          fake.publish([
            commitFrame(plc(1), 1_750_000_000_000_000, WH, "w1", "create", whRecordValue(`at://${plc(2)}`))
          ])
          yield* Deferred.await(committed).pipe(
            Effect.timeoutFail({ duration: "20 seconds", onTimeout: () => "never committed" })
          )
          // two attempts on the first connection (the default, 3, would have committed there), the
          // third on the next one
          expect(seen).toHaveLength(3)
          expect(seen[0]).toBe(seen[1])
          expect(seen[2]).toBeGreaterThan(seen[1] ?? 0)
        }).pipe(Effect.provide(processor), Effect.provide(memoryStack({ config })))
      }),
    { timeout: 30_000 }
  )
})
