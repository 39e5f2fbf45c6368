/**
 * A new version of a webhook (its URL changed: another fingerprint) on a DID the direct stream
 * watches: the direct stream may read a post made after the update before the registry stream
 * reads the update, and the post matches the old version; the registration replay then matches it
 * with the new version, under the same delivery id (event + owner + rkey). Before, the outbox kept
 * the old version's row (`ON CONFLICT DO NOTHING`), which the check at delivery (SPEC §4.2) then
 * cancelled `subscription_changed`: the post, made after the update, never reached the new URL
 * (SPEC §3.1 "nothing since the registration is missed"; found by the review of 7 December 2026).
 * The untried row is now moved to the new version (matching/OutboxSql `onConflict`; the statement
 * itself in test/matching/outbox-new-version.test.ts). Real sockets against the fake Jetstream,
 * the in-memory stack.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref } from "effect"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Registry } from "../../src/services/registry/Registry.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { memoryStack, plc, testConfig, WH, whRecordValue } from "../support/stack.js"
import { fastTuning, isDirect, isOpen, isRegistry, sendTo } from "./jetstream-connections-support.js"

const POST = "app.bsky.feed.post"
const T0 = 1_750_000_000_000_000
const S = 1_000_000
const OWNER = plc(1)
const X = plc(2)
const OLD_URL = "https://old.example/hook"
const NEW_URL = "https://new.example/hook"

describe("registration replay for a new version of a webhook", () => {
  it.scopedLive(
    "an event made after a webhook's URL update, carried by the direct stream first, is enqueued for the new version after the replay",
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
          const outbox = yield* Outbox.MemoryOutboxState
          const registry = yield* Registry
          const rowsOf = (eventRkey: string) =>
            Effect.map(Ref.get(outbox), (s) => [...s.rows.values()].filter((r) => r.eventRkey === eventRkey))
          const has = (eventRkey: string, webhookRkey: string) =>
            Effect.map(rowsOf(eventRkey), (rows) => rows.some((r) => r.webhookRkey === webhookRkey))
          yield* eventually(Effect.sync(() => fake.connections.length > 0), "registry connected")

          fake.publish([
            commitFrame(OWNER, T0 + 1 * S, WH, "w1", "create", whRecordValue(`at://${X}`, { url: OLD_URL }))
          ])
          yield* eventually(Effect.sync(() => fake.connections.some((c) => isDirect(c) && isOpen(c))), "direct started")

          // T0+10 s: the owner moves w1 to a new URL (and adds w2, a witness that the replay ran);
          // T0+11 s: X posts. The direct stream reads the post before the registry stream reads the update.
          fake.paused = true
          const update = commitFrame(
            OWNER,
            T0 + 10 * S,
            WH,
            "w1",
            "update",
            whRecordValue(`at://${X}`, { url: NEW_URL })
          )
          const witness = commitFrame(
            OWNER,
            T0 + 10 * S + 1,
            WH,
            "w2",
            "create",
            whRecordValue(`at://${X}`, { url: "https://witness.example/hook" })
          )
          const post = commitFrame(X, T0 + 11 * S, POST, "p1", "create")
          fake.publish([update, witness, post])
          sendTo(fake, isDirect, post)
          yield* eventually(has("p1", "w1"), "the post matched by w1 (old version)")
          sendTo(fake, isRegistry, update)
          sendTo(fake, isRegistry, witness)
          fake.paused = false
          yield* eventually(has("p1", "w2"), "the replay ran (the witness got the post)")
          yield* eventually(
            Effect.sync(() => registry.index.get(`${OWNER}/w1`)?.url === NEW_URL),
            "w1's new version registered"
          )
          const current = registry.index.get(`${OWNER}/w1`)
          const row = (yield* rowsOf("p1")).find((r) => r.webhookRkey === "w1")
          // the post (made after the update) must be deliverable to the new version: a row the
          // delivery-time check (SPEC §4.2) accepts, i.e. the current URL and fingerprint
          expect({ url: row?.targetUrl, fingerprint: row?.fingerprint }).toEqual({
            url: NEW_URL,
            fingerprint: current?.fingerprint
          })
        }).pipe(Effect.provide(memoryStack({ config })))
      }),
    { timeout: 60_000 }
  )
})
