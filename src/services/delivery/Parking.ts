/**
 * The mover (SPEC §4.3): an origin whose circuit is open costs the other origins nothing. While an
 * origin's circuit is open (or its probe is outstanding), this worker's mover reschedules all of the
 * origin's pending rows due before the cool-down's end (the probe's deadline) to exactly that time,
 * in bulk (`DeliveryStore.park`: one statement for every such origin, at most `PARK_CHUNK` rows each,
 * repeated a bounded number of times per pass), without spending an attempt. The claim skips the
 * same origins (`openOrigins`, Admission.ts) for the rows enqueued since the last pass. So an open
 * origin's backlog never enters the claim's bounded candidate window, and is never claimed and
 * deferred row by row.
 *
 * A pass runs when the breaker trips (or grants a probe, or closes an origin this worker parked:
 * `nudge`, from the attempt) and every {@link PARK_INTERVAL_MS} while any origin is held or parked.
 * When the cool-down ends the rows are due again on their own; when an origin recovers before the
 * time its rows were parked to (its probe, or an attempt started before the trip, succeeded), the
 * rows at exactly that time are made due now (`unpark`), and so are they when it is held again
 * until an earlier time (then parked to that time in the same pass).
 *
 * Each pass first has the breaker forget the open origins idle for 30 min past their cool-down
 * (`CircuitBreaker.forgetIdle`): nothing waits for them any more.
 *
 * Each process has its own breaker; parking is idempotent (a row already at or after the time is not
 * touched), so several workers parking one origin do not fight.
 *
 * @since 0.1.0
 */
import { Clock, Duration, Effect, Either, Queue } from "effect"
import type { Admission } from "./CircuitBreaker.js"
import { PARK_CHUNK, PARK_ORIGINS_MAX, type ParkedOrigin } from "./DeliveryStore.js"
import { logStoreError, setOpenCircuits } from "./Telemetry.js"
import type { WorkerEnv } from "./WorkerState.js"

/** A pass runs at least this often while an origin is held or parked. */
export const PARK_INTERVAL_MS = 1_000
/** `park` statements per pass at most (× PARK_CHUNK rows); the next pass goes on. */
export const PARK_CHUNKS_PER_PASS = 20

/** What one pass did. */
export interface ParkPass {
  readonly parked: number
  readonly unparked: number
}

/**
 * One pass: park the held origins' pending rows, unpark those of origins that recovered early, and
 * wake the claim loop when rows moved.
 */
export const parkPass = (env: WorkerEnv) =>
  Effect.gen(function*() {
    const state = env.state
    const now = yield* Clock.currentTimeMillis
    // origins with no traffic left (their webhook was deleted or moved) leave the breaker, so the
    // open-circuit count is of origins something still waits for (CircuitBreaker.forgetIdle)
    if (env.breaker.forgetIdle(now) > 0) setOpenCircuits(env.breaker.openCount(now))
    const held = env.breaker.held(now).slice(0, PARK_ORIGINS_MAX)
    if (held.length === 0 && state.parked.size === 0) return { parked: 0, unparked: 0 }
    const wanted = new Set(held.map((h) => h.origin))
    const recovered: Array<ParkedOrigin> = []
    const released: Array<string> = []
    for (const [origin, untilMs] of state.parked) {
      if (wanted.has(origin)) continue
      released.push(origin)
      if (untilMs > now) recovered.push({ origin, untilMs })
    }
    // held again until an earlier time than its rows were parked to (a failed probe re-opened it with
    // a cool-down shorter than the probe's deadline): those rows come back, then are parked anew
    for (const h of held) {
      const before = state.parked.get(h.origin)
      if (before !== undefined && before > h.untilMs) recovered.push({ origin: h.origin, untilMs: before })
    }
    // every row parked at those times is made due (one statement moves at most PARK_CHUNK); the
    // origins are forgotten only then, so a failed or unfinished unpark goes on at the next pass
    // (before, one statement's 10,000 rows came back and the rest waited for the cool-down's end)
    let unparked = 0
    let unparkDone = true
    if (recovered.length > 0) {
      unparkDone = false
      for (let i = 0; i < PARK_CHUNKS_PER_PASS && !unparkDone; i++) {
        const n = yield* env.store.unpark(recovered)
        unparked += n
        unparkDone = n < PARK_CHUNK
      }
    }
    if (unparkDone) { for (const origin of released) state.parked.delete(origin) }
    // the held origins are recorded BEFORE their rows are parked: a statement that moved rows and a
    // later one that failed leave them recorded, so the origin's early recovery unparks them (before,
    // they were recorded only after every statement succeeded, and the rows moved waited out the
    // cool-down); unparking a time nothing was parked to moves no row. An origin held again until an
    // earlier time keeps its later time until every row parked there is back (the next pass goes on)
    for (const h of held) {
      const before = state.parked.get(h.origin)
      if (unparkDone || before === undefined || before <= h.untilMs) state.parked.set(h.origin, h.untilMs)
    }
    let parked = 0
    if (held.length > 0) {
      for (let i = 0; i < PARK_CHUNKS_PER_PASS; i++) {
        const n = yield* env.store.park(held)
        parked += n
        if (n < PARK_CHUNK) break
      }
    }
    if (parked > 0 || unparked > 0) {
      state.parkedRows += parked
      state.unparkedRows += unparked
      // the window the parked rows held is free (or unparked rows are due): claim now
      state.notified = true
      yield* Queue.offer(env.wake, undefined)
    }
    const pass: ParkPass = { parked, unparked }
    return pass
  })

/** The mover's loop, for the lifetime of the worker's scope. */
export const parkLoop = (env: WorkerEnv) =>
  Effect.gen(function*() {
    while (!env.state.stopping) {
      const result = yield* Effect.either(parkPass(env))
      if (Either.isLeft(result)) yield* logStoreError(env, result.left)
      yield* Queue.take(env.parkWake).pipe(Effect.timeoutOption(Duration.millis(PARK_INTERVAL_MS)))
    }
  })

/**
 * After the breaker answered (`admission`) or was told an attempt's outcome: wake the mover when
 * what it parked no longer matches the origin's state (tripped, a probe granted, or closed again).
 */
export const nudge = (env: WorkerEnv, origin: string, nowMs: number, admission?: Admission): void => {
  const s = env.breaker.get(origin)
  const parkedUntil = env.state.parked.get(origin)
  const cooling = s !== undefined && nowMs < s.openUntilMs
  const stale = admission === "probe" ||
    (cooling ? parkedUntil !== s.openUntilMs : parkedUntil !== undefined && (s === undefined || s.openUntilMs === 0))
  if (stale) env.parkWake.unsafeOffer(undefined)
}
