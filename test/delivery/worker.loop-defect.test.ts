/**
 * The delivery worker's loops survive a defect (a bug) of their own. Each loop handles its typed
 * errors, but a defect ended its fiber silently: a worker whose claim loop had died stayed ready
 * (a delivery-only process, say) and delivered nothing again. Now the defect is logged at error
 * (by loop and class name, never its message) and the loop starts again after a backoff.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Exit, Fiber, Layer, Ref, TestClock } from "effect"
import { DeliveryStore, makeSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Worker from "../../src/services/delivery/Worker.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"
import { captureLogs } from "../support/captureLogs.js"
import { ev, plc, rev, sqlStack, whEv, whRecordValue } from "../support/stack.js"
import { eventually, receiver, run, startWorker } from "./worker-support.js"

const OWNER = plc(1)
const BOB = plc(2)
const ENV = { WEBHOOK_ALLOW_INSECURE_DEV: "1" }

describe("a defect in a delivery worker loop", () => {
  it.scopedLive(
    "a claim that dies does not end the claim loop: it is logged at error and the row is delivered after the restart",
    () =>
      Effect.gen(function*() {
        const logs = yield* captureLogs
        const rx = yield* receiver({})
        yield* run([whEv(OWNER, "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in` }), { rev: rev(1) })])
        let claims = 0
        const store = Layer.scoped(
          DeliveryStore,
          Effect.map(makeSql, (s) => ({
            ...s,
            claim: (...args: Parameters<typeof s.claim>) =>
              Effect.suspend(
                () => (++claims === 1 ? Effect.die(new TypeError("claim bug secret-value")) : s.claim(...args))
              )
          }))
        )
        yield* run([ev(BOB, "app.bsky.feed.post", "p1", { rev: rev(10) })])
        yield* Effect.gen(function*() {
          yield* startWorker({ options: { pollIntervalMs: 50 }, store })
          yield* eventually("sent", Effect.sync(() => rx.received.length), (n) => n === 1)
        }).pipe(Effect.provide(logs.layer))
        expect(claims).toBeGreaterThan(1)
        const lines = (yield* logs.lines).filter((l) => l.includes("loop survived a defect"))
        expect(lines).toHaveLength(1)
        expect(JSON.parse(lines[0] ?? "{}")).toMatchObject({
          annotations: { loop: "claim", kind: "defect", defect: "TypeError", restartInMs: 1000 }
        })
        expect(lines[0]).not.toContain("secret-value")
      }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: ENV }))),
    30_000
  )

  it.scoped("a loop that keeps dying restarts after 1 s, 2 s, 4 s …; its return and an interruption are passed on", () =>
    Effect.gen(function*() {
      const env = { log: RateLimitedLog.make() }
      const starts = yield* Ref.make<ReadonlyArray<number>>([])
      const dying = Effect.zipRight(
        Clock.currentTimeMillis.pipe(Effect.flatMap((t) => Ref.update(starts, (xs) => [...xs, t]))),
        Effect.die(new RangeError("bug"))
      )
      const fiber = yield* Effect.fork(Worker.surviving(env, "heartbeat", dying))
      yield* TestClock.adjust("7 seconds")
      expect(yield* Ref.get(starts)).toEqual([0, 1_000, 3_000, 7_000])
      yield* Fiber.interrupt(fiber)
      expect(yield* Ref.get(starts)).toHaveLength(4)
      // a loop that returns (the claim loop once the worker stops) ends the guard
      expect(yield* Effect.exit(Worker.surviving(env, "claim", Effect.void))).toEqual(Exit.void)
      // a loop interrupted from inside is not restarted
      const interrupted = yield* Effect.exit(Worker.surviving(env, "reclaim", Effect.interrupt))
      expect(Exit.isInterrupted(interrupted)).toBe(true)
    }))
})
