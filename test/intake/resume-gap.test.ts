/**
 * A Jetstream asked for a cursor older than its retained window starts at its oldest event without
 * saying so (v1 `/subscribe`; shared/reference/atproto.md §1.2–1.3): the events in between are
 * never read. firehook compares the first event of every connection that sent a cursor with that
 * cursor: the gap is a gauge (`firehook_intake_resume_gap_seconds{stream}`), and on a stream a live
 * network never leaves 10 minutes without an event (registry, backlink), a gap over 10 minutes whose
 * first event is itself over 10 minutes old (a replayed event, not a live one) is warned about and
 * counted (`firehook_intake_resume_gaps_total{stream}`). Real sockets (the local Jetstream of
 * test/support), the memory stack, real time (frames are placed relative to now).
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, HashMap, Layer, Logger, Ref } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { jetstreamSpecs } from "../../src/services/intake/JetstreamPlan.js"
import { RESUME_GAP_WARN_US, resumeGap } from "../../src/services/intake/ResumeGap.js"
import { WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { eventually } from "../support/eventually.js"
import { accountFrame, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { seriesValue } from "../support/metricSeries.js"
import { memoryStack, plc, testConfig } from "../support/stack.js"

const S = 1_000_000
const HOUR = 3600 * S
/** firehook's rewind of a loaded cursor (2 s of `time_us`) */
const REWIND = 2 * S

const tuning: Partial<Intake.IntakeTuning> = {
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
}

interface Line {
  readonly message: string
  readonly level: string
  readonly annotations: Record<string, unknown>
}

/** the registry stream's series of `name`, as exported (0 while it does not exist) */
const registrySeries = (name: string) => seriesValue(name, { stream: "registry" })
const gaps = registrySeries("firehook_intake_resume_gaps_total")
const gapGauge = registrySeries("firehook_intake_resume_gap_seconds")

/**
 * Run intake against a local Jetstream whose registry cursor is stored at `stored` (µs), with the
 * log lines captured; `body` gets the fake, the lines and the stream's committed cursor.
 */
const withIntake = <A>(
  stored: number | undefined,
  body: (
    fake: FakeJetstream,
    lines: Effect.Effect<ReadonlyArray<Line>>,
    committed: Effect.Effect<bigint | undefined>
  ) => Effect.Effect<A, never, CursorStore.CursorStore>
) =>
  Effect.gen(function*() {
    const fake = yield* Effect.acquireRelease(
      Effect.promise(() => startFakeJetstream()),
      (f) => Effect.promise(() => f.close())
    )
    const relay = fake.url.replace(/\/+$/, "")
    const lines = yield* Ref.make<ReadonlyArray<Line>>([])
    const logger = Logger.make(({ annotations, logLevel, message }) => {
      const record: Record<string, unknown> = {}
      for (const [k, v] of HashMap.toEntries(annotations)) record[k] = v
      Effect.runSync(
        Ref.update(lines, (xs) => [...xs, { message: String(message), level: logLevel.label, annotations: record }])
      )
    })
    const config = testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url })
    return yield* Effect.gen(function*() {
      const cursors = yield* CursorStore.CursorStore
      if (stored !== undefined) yield* Effect.orDie(cursors.save("registry", relay, BigInt(stored)))
      const intake = yield* Intake.make({ tuning })
      yield* Effect.forkScoped(intake.run)
      return yield* body(fake, Ref.get(lines), Effect.orDie(cursors.load("registry", relay)))
    }).pipe(
      Effect.provide(Layer.merge(memoryStack({ config }), Logger.replace(Logger.defaultLogger, logger)))
    )
  })

const gapWarnings = (lines: ReadonlyArray<Line>) => lines.filter((l) => l.message.includes("resumed after a gap"))

describe("a Jetstream resume that skipped events (a cursor clamped to the source's window)", () => {
  it.scopedLive(
    "a first start from cursor 0 (the whole retained window, SPEC §3.1) is no resume: a day-old first event is neither warned about nor counted",
    () =>
      Effect.gen(function*() {
        const first = Date.now() * 1000 - 24 * HOUR
        const gapsBefore = yield* gaps
        yield* withIntake(undefined, (fake, lines, committed) =>
          Effect.gen(function*() {
            fake.publish([accountFrame(plc(1), first, true)])
            yield* eventually(Effect.map(committed, (c) => c === BigInt(first)), "the event committed")
            expect(fake.connections[0]?.cursor).toBe(0n)
            expect(gapWarnings(yield* lines)).toHaveLength(0)
            expect((yield* gaps) - gapsBefore).toBe(0)
          }))
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "first event 6 h after the cursor sent, a day old: one warning, counted, the gauge set; the stream goes on",
    () =>
      Effect.gen(function*() {
        const now = Date.now() * 1000
        const stored = now - 30 * HOUR
        // the source kept only its last 24 h: the oldest event it still has is 6 h after the cursor
        const first = now - 24 * HOUR
        const gapsBefore = yield* gaps
        yield* withIntake(stored, (fake, lines, committed) =>
          Effect.gen(function*() {
            fake.publish([accountFrame(plc(1), first, true), accountFrame(plc(2), first + S, true)])
            yield* eventually(Effect.map(committed, (c) => c === BigInt(first + S)), "both events committed")
            expect(fake.connections[0]?.cursor).toBe(BigInt(stored - REWIND))
            const warned = gapWarnings(yield* lines)
            expect(warned).toHaveLength(1)
            expect(warned[0]).toMatchObject({
              level: "WARN",
              annotations: { stream: "registry", gapSeconds: 6 * 3600 + 2, suppressed: 0 }
            })
            // counts and seconds only: no cursor, no URL
            expect(JSON.stringify(warned[0])).not.toContain(String(stored - REWIND))
            expect(JSON.stringify(warned[0])).not.toContain("127.0.0.1")
            expect((yield* gaps) - gapsBefore).toBe(1)
            expect(yield* gapGauge).toBe((first - (stored - REWIND)) / S)

            // observation only: the next connection resumes where this process got to, as before,
            // with no gap; nothing more is warned about or counted, and the gauge says so
            fake.dropAll()
            yield* eventually(Effect.sync(() => fake.connections.length === 2), "reconnected")
            expect(fake.connections[1]?.cursor).toBe(BigInt(first + S))
            yield* eventually(Effect.map(gapGauge, (g) => g === 0), "the gauge of the second connection")
            expect(gapWarnings(yield* lines)).toHaveLength(1)
            expect((yield* gaps) - gapsBefore).toBe(1)
          }))
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "first event 5 s after a day-old cursor: the gauge says 7 s, nothing is warned about or counted",
    () =>
      Effect.gen(function*() {
        const now = Date.now() * 1000
        const stored = now - 24 * HOUR
        const gapsBefore = yield* gaps
        yield* withIntake(stored, (fake, lines, committed) =>
          Effect.gen(function*() {
            fake.publish([accountFrame(plc(1), stored + 5 * S, true)])
            yield* eventually(Effect.map(committed, (c) => c === BigInt(stored + 5 * S)), "the event committed")
            expect(yield* gapGauge).toBe(7)
            expect(gapWarnings(yield* lines)).toEqual([])
            expect((yield* gaps) - gapsBefore).toBe(0)
          }))
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "a quiet network: the first event after the resume is live, an hour after the cursor: gauge only",
    () =>
      Effect.gen(function*() {
        const stored = Date.now() * 1000 - HOUR
        const gapsBefore = yield* gaps
        yield* withIntake(stored, (fake, lines, committed) =>
          Effect.gen(function*() {
            // nothing happened since the cursor: the source has nothing to replay, then a live event
            yield* eventually(
              Effect.sync(() => (fake.connections[0]?.options.length ?? 0) > 0),
              "connected, hello sent"
            )
            const live = Date.now() * 1000
            fake.publish([accountFrame(plc(1), live, true)])
            yield* eventually(Effect.map(committed, (c) => c === BigInt(live)), "the live event committed")
            expect(yield* gapGauge).toBe((live - (stored - REWIND)) / S)
            expect(gapWarnings(yield* lines)).toEqual([])
            expect((yield* gaps) - gapsBefore).toBe(0)
          }))
      }),
    { timeout: 60_000 }
  )
})

describe("the resume-gap rule", () => {
  const T = 1_750_000_000_000_000n
  const W = RESUME_GAP_WARN_US
  it("warns only above the threshold, for a first event itself older than it, on a stream with one", () => {
    // a clamp: 6 h after the cursor, a day old
    expect(resumeGap(T, T + 6n * 3600n * 1_000_000n, T + 30n * 3600n * 1_000_000n, W)).toEqual({
      gapUs: 6n * 3600n * 1_000_000n,
      warn: true
    })
    // exactly the threshold: no warning
    expect(resumeGap(T, T + W, T + 2n * W + 1n, W).warn).toBe(false)
    expect(resumeGap(T, T + W + 1n, T + 2n * W + 2n, W).warn).toBe(true)
    // the first event is live (a quiet network): no warning, whatever the gap
    expect(resumeGap(T, T + 5n * W, T + 5n * W + W, W).warn).toBe(false)
    // the direct stream (no threshold): measured only
    expect(resumeGap(T, T + 100n * W, T + 200n * W, undefined)).toEqual({ gapUs: 100n * W, warn: false })
    // a source that sent an event before the cursor: a negative gap, nothing to warn about
    expect(resumeGap(T, T - 1n, T + W * 3n, W)).toEqual({ gapUs: -1n, warn: false })
  })

  it("the registry and backlink streams have the threshold (never quiet on a live network), the direct stream not", () => {
    const specs = jetstreamSpecs({
      url: "wss://jetstream.example/subscribe",
      common: { maxBytes: 1 << 20, connectTimeoutMs: 1000, allowInsecure: false },
      index: new WebhookIndex(),
      directDidsMax: 10,
      reconfigureDelay: Duration.seconds(1),
      makeRunner: () => Effect.dieMessage("unused"),
      start: () => Effect.dieMessage("unused")
    })
    expect(specs.registry.resumeGapWarnUs).toBe(RESUME_GAP_WARN_US)
    expect(specs.backlink.resumeGapWarnUs).toBe(RESUME_GAP_WARN_US)
    expect(specs.direct.resumeGapWarnUs).toBeUndefined()
    expect(RESUME_GAP_WARN_US).toBe(600_000_000n)
  })
})
