/**
 * The Jetstream plan's reconfiguration checks take the registry stream's position (its last event
 * time, else its durable cursor) as the mark from which a registration's replay starts (SPEC §3.1:
 * "min(its durable cursor, registration time − 2 s)"). The registry stream reads its stored cursor
 * in its own fiber (a database read): a first check before that read took the mark as 0 ("no
 * position"), so a registration read in the next second (one made during the downtime) replayed
 * the direct stream from cursor 0 and started the backlink stream from cursor 0, Jetstream's whole
 * window (of the direct DIDs; of the whole network). The plan now makes no check before the
 * registry stream's cursor is loaded (`StreamRunner.cursorLoaded`). TestClock; the registry stream
 * is the real runner over an in-memory cursor store, or a stand-in whose load the test completes.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Either, Layer, Ref, Stream, TestClock } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import { runJetstream } from "../../src/services/intake/JetstreamPlan.js"
import {
  initialState,
  type StreamRunner,
  type StreamSpec,
  type StreamState
} from "../../src/services/intake/StreamModel.js"
import { makeStreamRunner } from "../../src/services/intake/StreamRunner.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { type ActiveWebhook, makeActiveWebhook, WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { plc, REV } from "../matching/fixtures.js"
import { newRecorder, recordingProcessor } from "../support/recordingProcessor.js"
import { SEC, T1, turns } from "./intake-bounds-support.js"

const URL = "wss://jetstream.test/subscribe"
const OWNER = plc(1)
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
}

/** a stand-in runner that records its restarts and never reads */
const standIn = (log: PlanLog, spec: StreamSpec, extra: Partial<StreamRunner> = {}) =>
  Effect.gen(function*() {
    const state = yield* Ref.make<StreamState>(initialState)
    const runner: StreamRunner = {
      spec,
      state,
      restart: (cursor) => Effect.sync(() => void log.restarts.push({ name: spec.name, cursor })),
      runFrom: () => Effect.never,
      run: Effect.never,
      stopReading: Effect.void,
      ...extra
    }
    return runner
  })

/** run the plan (a check a second) with `makeRunner`; the registry stream's `start` runs it */
const runPlan = (index: WebhookIndex, log: PlanLog, makeRunner: (spec: StreamSpec) => Effect.Effect<StreamRunner>) =>
  Effect.forkScoped(runJetstream({
    url: URL,
    common: { maxBytes: 1 << 20, connectTimeoutMs: 1000, allowInsecure: false },
    index,
    directDidsMax: 100,
    reconfigureDelay: Duration.seconds(1),
    makeRunner,
    start: (r, from) =>
      Effect.zipRight(
        Effect.sync(() => void log.started.push({ name: r.spec.name, from, floor: r.spec.resumeFloor })),
        r.spec.name === "registry" ? r.runFrom(from) : Effect.never
      )
  }))

const nextCheck = Effect.zipRight(TestClock.adjust("1 second"), turns(10))

describe("the Jetstream plan's first check waits for the registry stream's stored cursor", () => {
  it.scoped("a registration read in the first second after a restart replays from the registry's resume point, not from cursor 0", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const store = yield* CursorStore.CursorStore
      // the registry stream's stored cursor from the previous run
      yield* store.save("registry", URL, T1)
      const index = new WebhookIndex()
      index.upsert(hook("w1", `at://${plc(2)}`))
      const log: PlanLog = { started: [], restarts: [] }
      yield* runPlan(index, log, (spec) =>
        spec.name === "registry"
          ? makeStreamRunner(
            // the real runner; its connection stays open and silent
            {
              ...spec,
              connect: () => Stream.succeed<Intake.SourceItem>({ _tag: "opened" }).pipe(Stream.concat(Stream.never))
            },
            Intake.defaultTuning(512, 128)
          ).pipe(
            Effect.provide(Layer.mergeAll(
              recordingProcessor(rec),
              Layer.succeed(CursorStore.CursorStore, store),
              Outbox.layerMemory
            ))
          )
          : standIn(log, spec))
      yield* turns(10)
      expect(log.started.map((s) => s.name)).toEqual(["registry", "direct"])
      // in its first second, the registry stream reads registrations made during the downtime
      // (after its resume point T1 − 2 s): a new direct DID, and the first backlink webhook
      index.upsert(hook("w2", `at://${plc(3)}`))
      index.upsert(hook("b1", `at://${plc(4)}`, true))
      yield* nextCheck
      // before: the direct stream replayed from 0n and the backlink stream started from 0n
      // (floor 0n): Jetstream's whole window
      expect({
        direct: log.restarts.filter((r) => r.name === "direct"),
        backlink: log.started.filter((s) => s.name === "backlink")
      }).toEqual({
        direct: [{ name: "direct", cursor: T1 - 2n * SEC }],
        backlink: [{ name: "backlink", from: T1 - 2n * SEC, floor: T1 - 2n * SEC }]
      })
    }).pipe(Effect.provide(CursorStore.layerMemory))
  })

  it.scoped("no check runs while the registry stream's cursor is not loaded; the first runs once it is", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      index.upsert(hook("w1", `at://${plc(2)}`))
      const log: PlanLog = { started: [], restarts: [] }
      const loaded = yield* Deferred.make<void>()
      let registryState: Ref.Ref<StreamState> | undefined
      yield* runPlan(index, log, (spec) =>
        spec.name === "registry"
          ? Effect.tap(standIn(log, spec, { cursorLoaded: Deferred.await(loaded) }), (r) =>
            Effect.sync(() => {
              registryState = r.state
            }))
          : standIn(log, spec))
      yield* turns(10)
      // the database read is slow (or failing and retried): several checks' time pass
      index.upsert(hook("w2", `at://${plc(3)}`))
      yield* nextCheck
      yield* nextCheck
      yield* nextCheck
      // before: the direct stream started at once, and the registration above replayed it from 0n
      expect(log.started.map((s) => s.name)).toEqual(["registry"])
      expect(log.restarts).toEqual([])
      // the stored cursor is read: T1
      if (registryState === undefined) return expect.unreachable("the registry runner")
      yield* Ref.update(registryState, (s) => ({ ...s, durableCursor: T1, lastEventTimeUs: Number(T1) }))
      yield* Deferred.succeed(loaded, undefined)
      yield* turns(10)
      // the first check: the direct stream starts from its own cursor, at once
      expect(log.started).toEqual([
        { name: "registry", from: undefined, floor: undefined },
        { name: "direct", from: undefined, floor: undefined }
      ])
      index.upsert(hook("w3", `at://${plc(5)}`))
      yield* nextCheck
      expect(log.restarts).toEqual([{ name: "direct", cursor: T1 - 2n * SEC }])
    }))
})
