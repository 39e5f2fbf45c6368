/**
 * A `Random` whose every draw is 0.5, for tests of backoffs: the n-th full-jitter delay is then
 * exactly min(cap, base·2ⁿ) / 2. Tests that count connections or reads need it too: a real draw
 * below 0.001 makes a full-jitter wait 0 ms, which passes without any TestClock time, so a runner
 * reconnects at once and a wait for "exactly one connection" never sees it (1 run in 1,000).
 */
import { Random } from "effect"

export const halfJitter = Random.fixed([0.5])
