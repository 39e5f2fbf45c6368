/**
 * The Jetstream plan's reconfiguration (SPEC §3.1) on the TestClock, with stand-in runners whose
 * state the test sets: where each stream starts, and the replay floor of an added DID.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Either, Ref, TestClock } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import { runJetstream } from "../../src/services/intake/JetstreamPlan.js"
import {
  initialState,
  type StreamRunner,
  type StreamSpec,
  type StreamState
} from "../../src/services/intake/StreamModel.js"
import { type ActiveWebhook, makeActiveWebhook, WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { plc, REV } from "../matching/fixtures.js"
import { SEC, T1, turns } from "./intake-bounds-support.js"

// ---------------------------------------------------------------------------------------------
// The Jetstream plan's reconfiguration (SPEC §3.1), with stand-in runners whose state the test sets

const OWNER = plc(1)

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

  it.scoped("the backlink stream started at startup has no floor; started again after its set emptied, it starts from the registry's previous mark − 2 s", () =>
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
        { name: "backlink", from: T1 + 48n * SEC, floor: T1 + 48n * SEC }
      ])
    }))

  it.scoped("the first backlink webhook of a process that started without one starts the stream from the registry's previous mark − 2 s, not its stored cursor nor live", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      index.upsert(hook("w1", `at://${plc(2)}`))
      // a stored backlink cursor from an earlier run, long before (a day)
      const log = yield* runPlan(index, {
        registry: { lastEventTimeUs: Number(T1) },
        backlink: { durableCursor: T1 - 86_400n * SEC }
      })
      expect(log.started.filter((s) => s.name === "backlink")).toEqual([])
      yield* nextCheck
      const registry = log.states.get("registry")
      if (registry === undefined) return expect.unreachable("the registry stream")
      yield* Ref.update(registry, (s) => ({ ...s, lastEventTimeUs: Number(T1 + 30n * SEC) }))
      yield* nextCheck
      index.upsert(hook("b1", `at://${plc(3)}`, true))
      yield* nextCheck
      expect(log.started.filter((s) => s.name === "backlink")).toEqual([
        { name: "backlink", from: T1 + 28n * SEC, floor: T1 + 28n * SEC }
      ])
    }))

  it.scoped("while the registry stream has no position yet (a fresh install), a registration from a scan starts the backlink stream live and replays nothing from cursor 0", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      index.upsert(hook("w1", `at://${plc(2)}`))
      // no event read and no stored cursor: the registry's mark is 0, which is no position
      const log = yield* runPlan(index, { registry: {} })
      yield* nextCheck
      // a backfill scan registers a backlink webhook and a new direct DID
      index.upsert(hook("b1", `at://${plc(3)}`, true))
      index.upsert(hook("w2", `at://${plc(4)}`))
      yield* nextCheck
      // before: the backlink stream (the whole network) started from cursor 0, the direct
      // stream replayed from 0
      expect(log.started.filter((s) => s.name === "backlink")).toEqual([
        { name: "backlink", from: undefined, floor: undefined }
      ])
      expect(log.restarts).toEqual([{ name: "direct", cursor: undefined }])
    }))

  it.scoped("the registry stream's first events read since the previous check (mark 0 then): a DID registered from one is replayed from where that stream started", () =>
    Effect.gen(function*() {
      const index = new WebhookIndex()
      // a scan registered w1: the direct stream runs; the registry stream has read nothing yet
      index.upsert(hook("w1", `at://${plc(2)}`))
      const log = yield* runPlan(index, { registry: {} })
      yield* nextCheck
      // the registry stream reads its first events (Jetstream's window, from cursor 0) and
      // registers a webhook on a new DID from one of them, at T1
      const registry = log.states.get("registry")
      if (registry === undefined) return expect.unreachable("the registry stream")
      yield* Ref.update(registry, (s) => ({ ...s, lastEventTimeUs: Number(T1) }))
      index.upsert(hook("w2", `at://${plc(3)}`))
      yield* nextCheck
      expect(log.restarts).toEqual([{ name: "direct", cursor: 0n }])
    }))
})
