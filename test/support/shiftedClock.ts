/**
 * A Clock for tests of several machines on one database: the wall clock shifted by a fixed offset
 * (a machine whose NTP is broken), provided with `Effect.withClock`.
 */
import { Clock, Effect } from "effect"

/** The wall clock shifted by `offsetMs` (a machine whose NTP is broken). */
export const shiftedClock = (offsetMs: number): Clock.Clock => {
  const wall = Clock.make()
  return {
    [Clock.ClockTypeId]: Clock.ClockTypeId,
    unsafeCurrentTimeMillis: () => wall.unsafeCurrentTimeMillis() + offsetMs,
    currentTimeMillis: Effect.sync(() => wall.unsafeCurrentTimeMillis() + offsetMs),
    unsafeCurrentTimeNanos: () => wall.unsafeCurrentTimeNanos() + BigInt(offsetMs) * 1_000_000n,
    currentTimeNanos: Effect.sync(() => wall.unsafeCurrentTimeNanos() + BigInt(offsetMs) * 1_000_000n),
    sleep: (d) => wall.sleep(d)
  }
}
