/**
 * The Jetstream backlink stream (the whole network) runs only while backlink scopes exist (SPEC
 * §3.1). When it starts again after its set was empty, the events since it stopped matched no
 * backlink webhook that exists now: it resumes from the registry's position before the new
 * registration (− 2 s), like the direct stream's replay for added DIDs. Before, it resumed from
 * its old durable cursor: up to Jetstream's whole retained window (24–36 h) of the network was
 * read again, and the new webhook received backlink events from before it existed.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { memoryStack, plc, testConfig, whRecordValue } from "../support/stack.js"
import { fastTuning, isBacklink, isDirect, optionsOf } from "./jetstream-connections-support.js"

const WH = "place.wisp.v2.wh"
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const T0 = 1_750_000_000_000_000
const S = 1_000_000
const OWNER = plc(1)
const SCOPE = plc(2)
const STRANGER = plc(9)
const likeOfScope = {
  $type: LIKE,
  subject: { uri: `at://${SCOPE}/${POST}/3kpost`, cid: "bafyx" },
  createdAt: "2026-01-01T00:00:00Z"
}

describe("the backlink stream started again after its set was empty", () => {
  it.scopedLive(
    "resumes from the registry's position before the new registration, not from its old cursor",
    () =>
      Effect.gen(function*() {
        const fake = yield* Effect.acquireRelease(
          Effect.promise(() => startFakeJetstream()),
          (f) => Effect.promise(() => f.close())
        )
        const config = testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url })
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make({ reconfigureDelay: "20 millis", tuning: fastTuning })
          yield* Effect.forkScoped(intake.run)
          const cursors = yield* CursorStore.CursorStore
          const outbox = yield* Outbox.MemoryOutboxState
          const relay = fake.url.replace(/\/+$/, "")
          const delivered = (eventRkey: string, webhookRkey: string) =>
            Effect.map(
              Ref.get(outbox),
              (s) => [...s.rows.values()].some((r) => r.eventRkey === eventRkey && r.webhookRkey === webhookRkey)
            )
          const registryTime = Effect.map(
            intake.stats,
            (s) => s.streams.find((x) => x.name === "registry")?.state.lastEventTimeUs
          )
          yield* eventually(Effect.sync(() => fake.connections.length > 0), "registry connected")

          // a first backlink webhook: the backlink stream starts (live) and commits a post
          fake.publish([
            commitFrame(OWNER, T0 + 1 * S, WH, "w1", "create", whRecordValue(`at://${SCOPE}`, { backlinks: true }))
          ])
          yield* eventually(Effect.sync(() => fake.connections.some(isBacklink)), "backlink started")
          fake.publish([commitFrame(STRANGER, T0 + 2 * S, POST, "p1", "create")])
          yield* eventually(
            Effect.map(cursors.load("backlink", relay), (c) => c === BigInt(T0 + 2 * S)),
            "backlink committed"
          )
          // it is deleted: the backlink stream stops
          fake.publish([commitFrame(OWNER, T0 + 3 * S, WH, "w1", "delete")])
          yield* eventually(
            Effect.map(intake.stats, (s) => !s.streams.some((x) => x.name === "backlink")),
            "backlink stopped"
          )
          // meanwhile the network goes on (nobody watches backlinks now); the registry stream reads on
          fake.publish([commitFrame(STRANGER, T0 + 10 * S, LIKE, "old", "create", likeOfScope)])
          fake.publish([commitFrame(plc(7), T0 + 50 * S, WH, "w3", "create", whRecordValue(`at://${plc(6)}`))])
          // the plan has seen the registry at T0 + 50 s (the direct stream started for w3)
          yield* eventually(Effect.map(registryTime, (t) => t === T0 + 50 * S), "registry at T0 + 50 s")
          yield* eventually(
            Effect.sync(() =>
              fake.connections.some((c) =>
                isDirect(c) && (optionsOf(c)?.["wantedDids"] as Array<string>).includes(plc(6))
              )
            ),
            "direct started for w3"
          )

          // a new backlink webhook on the same scope, at T0 + 100 s, and a like right after it
          const before = fake.connections.filter(isBacklink).length
          fake.publish([
            commitFrame(OWNER, T0 + 100 * S, WH, "w2", "create", whRecordValue(`at://${SCOPE}`, { backlinks: true }))
          ])
          yield* eventually(
            Effect.sync(() => fake.connections.filter(isBacklink).length > before),
            "backlink restarted"
          )
          const restarted = fake.connections.filter(isBacklink).at(-1)!
          fake.publish([commitFrame(STRANGER, T0 + 101 * S, LIKE, "new", "create", likeOfScope)])
          yield* eventually(delivered("new", "w2"), "the like after the registration delivered")
          // not from the old cursor (T0 + 2 s − 2 s): from the registry's position before w2 (− 2 s)
          expect(restarted.cursor).toBeDefined()
          expect(restarted.cursor! >= BigInt(T0 + 48 * S)).toBe(true)
          expect(restarted.cursor! <= BigInt(T0 + 100 * S)).toBe(true)
          // the like from before w2 existed is not delivered to it
          expect(yield* delivered("old", "w2")).toBe(false)
        }).pipe(Effect.provide(memoryStack({ config })))
      }),
    { timeout: 60_000 }
  )
})

describe("the first backlink webhook of a process that started without one", () => {
  const firstBacklinkWebhook = (storedCursor: boolean) =>
    Effect.gen(function*() {
      const fake = yield* Effect.acquireRelease(
        Effect.promise(() => startFakeJetstream()),
        (f) => Effect.promise(() => f.close())
      )
      const config = testConfig({ NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1", JETSTREAM_URL: fake.url })
      yield* Effect.gen(function*() {
        const relay = fake.url.replace(/\/+$/, "")
        const cursors = yield* CursorStore.CursorStore
        // an earlier run's backlink stream stopped at T0 + 2 s (its last backlink webhook went)
        if (storedCursor) yield* cursors.save("backlink", relay, BigInt(T0 + 2 * S))
        const outbox = yield* Outbox.MemoryOutboxState
        const delivered = (eventRkey: string) =>
          Effect.map(
            Ref.get(outbox),
            (s) => [...s.rows.values()].some((r) => r.eventRkey === eventRkey && r.webhookRkey === "w1")
          )
        // the network went on while nobody watched backlinks: a like of the scope at T0 + 10 s,
        // and a webhook elsewhere (the registry reads on to T0 + 50 s)
        fake.publish([commitFrame(STRANGER, T0 + 10 * S, LIKE, "old", "create", likeOfScope)])
        fake.publish([commitFrame(plc(7), T0 + 50 * S, WH, "w3", "create", whRecordValue(`at://${plc(6)}`))])
        const intake = yield* Intake.make({ reconfigureDelay: "20 millis", tuning: fastTuning })
        yield* Effect.forkScoped(intake.run)
        yield* eventually(
          Effect.map(
            intake.stats,
            (s) => s.streams.find((x) => x.name === "registry")?.state.lastEventTimeUs === T0 + 50 * S
          ),
          "registry at T0 + 50 s"
        )
        yield* eventually(Effect.sync(() => fake.connections.some(isDirect)), "direct started for w3")
        expect(fake.connections.some(isBacklink)).toBe(false)

        // the first backlink webhook, at T0 + 100 s, and a like right after it, published at once
        // (before the plan's next check sees the registration)
        fake.publish([
          commitFrame(OWNER, T0 + 100 * S, WH, "w1", "create", whRecordValue(`at://${SCOPE}`, { backlinks: true })),
          commitFrame(STRANGER, T0 + 100 * S + 300_000, LIKE, "right-after", "create", likeOfScope)
        ])
        yield* eventually(Effect.sync(() => fake.connections.some(isBacklink)), "backlink started")
        const started = fake.connections.filter(isBacklink)[0]!
        // the like made right after the registration is delivered (a live start lost it)
        yield* eventually(delivered("right-after"), "the like right after the registration delivered")
        // from the registry's position before w1 (− 2 s), not the stored T0 + 2 s − 2 s
        expect(started.cursor).toBeDefined()
        expect(started.cursor! >= BigInt(T0 + 48 * S)).toBe(true)
        expect(started.cursor! <= BigInt(T0 + 100 * S)).toBe(true)
        // the like from before w1 existed is not delivered to it
        expect(yield* delivered("old")).toBe(false)
      }).pipe(Effect.provide(memoryStack({ config })))
    })

  it.scopedLive(
    "with an old stored cursor: starts from the registry's position before it (− 2 s), not from that cursor",
    () => firstBacklinkWebhook(true),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "with no stored cursor: starts from the registry's position before it (− 2 s), not live",
    () => firstBacklinkWebhook(false),
    { timeout: 60_000 }
  )
})
