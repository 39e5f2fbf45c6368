/**
 * A LISTEN follower (ListenLoop.follow, and RegistrySync's notifications through the same
 * ListenLoop.reopen) waits full jitter 1 s → 30 s between reopenings, and a session that stayed up
 * at least the cap starts the backoff over. Before, one schedule lasted the life of the process:
 * after a few drops (a failover, a restart) every later drop, even after days of a healthy LISTEN,
 * waited the capped delay (up to 30 s) before the LISTEN was opened again. TestClock, every random
 * draw 0.5.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, Metric, Random, Stream, TestClock } from "effect"
import * as ListenLoop from "../../src/services/platform/ListenLoop.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"

describe("ListenLoop.follow: backoff after a long healthy session", () => {
  it.scoped("a LISTEN that stayed up for an hour is reopened with the first backoff step, not the cap", () =>
    Effect.gen(function*() {
      const failures = Metric.counter("firehook_test_std1_total", { incremental: true })
      let opened = 0
      const endLong = yield* Deferred.make<void>()
      const listen = Stream.suspend(() => {
        opened++
        // opens 1..6 end at once (a database failover, say); open 7 is healthy for an hour
        return opened === 7
          ? Stream.concat(Stream.make("p7"), Stream.drain(Stream.fromEffect(Deferred.await(endLong))))
          : Stream.make(`p${opened}`)
      })
      yield* Effect.forkScoped(
        ListenLoop.follow(listen, () => Effect.void, {
          failures,
          log: RateLimitedLog.make(),
          message: "test listen lost"
        })
      )
      // r = 0.5: delays 500, 1000, 2000, 4000, 8000, 15000 ms before opens 2..7
      yield* TestClock.adjust(Duration.millis(500 + 1_000 + 2_000 + 4_000 + 8_000 + 15_000))
      expect(opened).toBe(7)
      // the LISTEN works for an hour
      yield* TestClock.adjust("1 hour")
      expect(opened).toBe(7)
      // then the connection drops once
      yield* Deferred.succeed(endLong, undefined)
      yield* TestClock.adjust(0)
      // a session that had worked for an hour should start the backoff over: 1 s · 0.5 = 500 ms
      yield* TestClock.adjust("1 second")
      expect(opened, "LISTEN not reopened within 1 s after an hour-long healthy session").toBe(8)
    }).pipe(Effect.withRandom(Random.fixed([0.5]))))
})
