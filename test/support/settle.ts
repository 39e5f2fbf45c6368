/**
 * Let the forked fibers run without moving the clock: 50 yields, enough for the fibers a test's
 * service forks to reach their next wait under TestClock (no time passes).
 */
import { Effect } from "effect"

export const settle = Effect.gen(function*() {
  for (let i = 0; i < 50; i++) yield* Effect.yieldNow()
})
