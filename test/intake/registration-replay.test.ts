/**
 * A second webhook on a DID the direct stream already watches (SPEC §3.1: "nothing since the
 * registration is missed"). The registry and direct streams are separate Jetstream connections, so
 * the direct stream may carry an event made after a webhook's registration before the registry
 * stream has registered it; the event then matched only the webhooks registered before. The direct
 * stream now replays from the registry's previous position (− 2 s) when a webhook (or a new version
 * of one) was registered, as it does when a DID joins its set. Before, only a new DID replayed: the
 * post below reached `w1` and never `w2` (found by the audit of 6 December 2026). The backlink
 * stream (the whole network) likewise replays when a backlink webhook is registered while it runs.
 * Real sockets against the fake Jetstream, the in-memory stack.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { memoryStack, plc, testConfig, WH, whRecordValue } from "../support/stack.js"
import { fastTuning, isBacklink, isDirect, isOpen, isRegistry, sendTo } from "./jetstream-connections-support.js"

const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const STRANGER = plc(9)
const likeOf = (did: string) => ({ $type: LIKE, subject: { uri: `at://${did}/${POST}/3kpost`, cid: "bafyx" } })
const T0 = 1_750_000_000_000_000
const S = 1_000_000
const OWNER = plc(1)
const X = plc(2)

interface Running {
  readonly fake: FakeJetstream
  /** whether the event `eventRkey` was enqueued for the webhook `webhookRkey` */
  readonly enqueued: (eventRkey: string, webhookRkey: string) => Effect.Effect<boolean>
  /** the webhooks the event `eventRkey` was enqueued for */
  readonly webhooksOf: (eventRkey: string) => Effect.Effect<ReadonlyArray<string>>
}

/** The intake on the in-memory stack against a fake Jetstream, for the lifetime of the scope. */
const withIntake = (body: (r: Running) => Effect.Effect<void>) =>
  Effect.gen(function*() {
    const fake = yield* Effect.acquireRelease(
      Effect.promise(() => startFakeJetstream()),
      (f) => Effect.promise(() => f.close())
    )
    const config = testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url })
    yield* Effect.gen(function*() {
      const intake = yield* Intake.make({ reconfigureDelay: "20 millis", tuning: fastTuning })
      yield* Effect.forkScoped(intake.run)
      const outbox = yield* Outbox.MemoryOutboxState
      const rowsOf = (eventRkey: string) =>
        Effect.map(Ref.get(outbox), (s) => [...s.rows.values()].filter((r) => r.eventRkey === eventRkey))
      yield* eventually(Effect.sync(() => fake.connections.length > 0), "registry connected")
      yield* body({
        fake,
        enqueued: (eventRkey, webhookRkey) =>
          Effect.map(rowsOf(eventRkey), (rows) => rows.some((r) => r.webhookRkey === webhookRkey)),
        webhooksOf: (eventRkey) => Effect.map(rowsOf(eventRkey), (rows) => rows.map((r) => r.webhookRkey).sort())
      })
    }).pipe(Effect.provide(memoryStack({ config })))
  })

describe("a webhook registered on a DID the direct stream already watches", () => {
  it.scopedLive(
    "gets the DID's events made after its registration, although the direct stream carried them first",
    () =>
      withIntake(({ enqueued, fake, webhooksOf }) =>
        Effect.gen(function*() {
          fake.publish([commitFrame(OWNER, T0 + 1 * S, WH, "w1", "create", whRecordValue(`at://${X}`))])
          yield* eventually(Effect.sync(() => fake.connections.some((c) => isDirect(c) && isOpen(c))), "direct started")
          fake.publish([commitFrame(X, T0 + 2 * S, POST, "p0", "create")])
          yield* eventually(enqueued("p0", "w1"), "the first webhook's match")

          // w2 on X registered at T0+10 s, X posts at T0+11 s; the direct stream gets the post
          // before the registry stream gets w2
          fake.paused = true
          const w2 = commitFrame(
            OWNER,
            T0 + 10 * S,
            WH,
            "w2",
            "create",
            whRecordValue(`at://${X}`, { url: "https://second.example/hook" })
          )
          const post = commitFrame(X, T0 + 11 * S, POST, "p1", "create")
          fake.publish([w2, post])
          sendTo(fake, isDirect, post)
          yield* eventually(enqueued("p1", "w1"), "the post matched by the first webhook")
          expect(yield* enqueued("p1", "w2")).toBe(false)
          sendTo(fake, isRegistry, w2)
          fake.paused = false
          yield* eventually(enqueued("p1", "w2"), "the post matched by the second webhook after its registration")
          // the replay made no second row for the first webhook (delivery ids)
          expect(yield* webhooksOf("p1")).toEqual(["w1", "w2"])
        })
      ),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "a backlink webhook gets the references the backlink stream read before the registry stream registered it",
    () =>
      withIntake(({ enqueued, fake }) =>
        Effect.gen(function*() {
          fake.publish([
            commitFrame(OWNER, T0 + 1 * S, WH, "b1", "create", whRecordValue(`at://${X}`, { backlinks: true }))
          ])
          yield* eventually(
            Effect.sync(() => fake.connections.some((c) => isBacklink(c) && isOpen(c))),
            "backlink started"
          )
          fake.publish([commitFrame(STRANGER, T0 + 2 * S, LIKE, "l0", "create", likeOf(X))])
          yield* eventually(enqueued("l0", "b1"), "the first backlink webhook's match")

          // b2 (backlinks on X too) registered at T0+10 s, a stranger likes X's post at T0+11 s; the
          // backlink stream reads the like before the registry stream reads b2
          fake.paused = true
          const b2 = commitFrame(
            OWNER,
            T0 + 10 * S,
            WH,
            "b2",
            "create",
            whRecordValue(`at://${X}`, { backlinks: true, url: "https://second.example/hook" })
          )
          const like = commitFrame(STRANGER, T0 + 11 * S, LIKE, "l1", "create", likeOf(X))
          fake.publish([b2, like])
          sendTo(fake, isBacklink, like)
          yield* eventually(enqueued("l1", "b1"), "the like matched by the first webhook")
          expect(yield* enqueued("l1", "b2")).toBe(false)
          sendTo(fake, isRegistry, b2)
          fake.paused = false
          yield* eventually(enqueued("l1", "b2"), "the like matched by the second webhook after its registration")
        })
      ),
    { timeout: 60_000 }
  )
})
