/**
 * A claimed row's times count from the start of its claim, as the database's do (its lease runs from
 * the claim transaction's `now()`, and its age and the claim's subscription snapshot were read then),
 * on real PostgreSQL with a claim whose answer is held back:
 * - the enqueue → first attempt histogram includes the time the claim took;
 * - a claim snapshot that was read longer than `snapshotMaxAgeMs` ago is not trusted: the attempt
 *   reads the subscription again and sees a change made while the claim was answering.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Layer } from "effect"
import { DeliveryStore, makeSql } from "../../src/services/delivery/DeliveryStore.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { eventually, firstAttemptLatency, outboxRows, receiver, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const POST = "app.bsky.feed.post"
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1", DELIVERY_RETRY_BASE_MS: "600000", DELIVERY_RETRY_MAX_MS: "3600000" }
/** how long the claim's answer is held back */
const HOLD_MS = 400

/**
 * The PostgreSQL store, whose claims that took rows answer only after `before` has run and
 * `HOLD_MS` more have passed.
 */
const slowClaims = (before: Effect.Effect<void>) =>
  Layer.scoped(
    DeliveryStore,
    Effect.map(makeSql, (s) => ({
      ...s,
      claim: (...args: Parameters<typeof s.claim>) =>
        Effect.tap(
          s.claim(...args),
          (r) => r.rows.length === 0 ? Effect.void : Effect.zipRight(before, Effect.sleep(Duration.millis(HOLD_MS)))
        )
    }))
  )

describe("a claimed row's times count from its claim's start", () => {
  it.scopedLive("the first-attempt latency includes the claim's own time", () =>
    Effect.gen(function*() {
      const rx = yield* receiver()
      yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/ok` }), { rev: rev(1) })])
      const before = yield* firstAttemptLatency
      yield* startWorker({ options: { pollIntervalMs: 50 }, store: slowClaims(Effect.void) })
      yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
      yield* eventually("delivered", outboxRows, (rs) => rs[0]?.status === "delivered")
      expect(rx.received.length).toBe(1)
      const after = yield* firstAttemptLatency
      expect(after.count - before.count).toBe(1)
      // the row was at least HOLD_MS old when its request went out
      expect(after.sum - before.sum).toBeGreaterThanOrEqual(HOLD_MS)
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))

  it.scopedLive("a claim snapshot older than snapshotMaxAgeMs is read again: a change made meanwhile is seen", () =>
    Effect.gen(function*() {
      const rx = yield* receiver()
      yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/old` }), { rev: rev(1) })])
      yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
      const claimed = yield* Deferred.make<void>()
      const changed = yield* Deferred.make<void>()
      const store = slowClaims(Effect.zipRight(Deferred.succeed(claimed, undefined), Deferred.await(changed)))
      // the claim's snapshot is trusted for 300 ms from when it was read; the claim answers 400 ms later
      yield* startWorker({ options: { pollIntervalMs: 50, snapshotMaxAgeMs: 300 }, store })
      yield* Deferred.await(claimed).pipe(Effect.timeout(Duration.seconds(10)))
      // the record's URL changes after the claim read it
      yield* run([
        whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/new` }), { rev: rev(2) })
      ])
      yield* Deferred.succeed(changed, undefined)
      const [row] = yield* eventually("cancelled", outboxRows, (rs) => rs[0]?.status === "cancelled")
      expect(row).toMatchObject({ last_error_kind: "subscription_changed", attempt_count: 0 })
      expect(rx.received.length).toBe(0)
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))))
})
