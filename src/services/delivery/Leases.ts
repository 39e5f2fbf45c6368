/**
 * Leases (SPEC §4.1): lease = max(60 s, timeout + 5 s) (an option overrides it). From the claim on,
 * one heartbeat fiber renews the leases of all held rows (in flight or waiting) every lease/3, in
 * one statement per {@link HEARTBEAT_CHUNK} rows. A row whose lease is gone, or that could not be
 * renewed for 2/3 of a lease, has its attempt interrupted (the row is someone else's now, or soon
 * will be). Those 2/3 are measured on the monotonic clock ({@link monotonicMs}), so a step of the
 * wall clock (NTP) cannot stretch them. Every write is guarded by the lease token.
 *
 * @since 0.1.0
 */
import { Clock, Duration, Effect, Either, Fiber, FiberSet } from "effect"
import { forget, release } from "./Admission.js"
import { countNotAttempted, logRecurring, logStoreError } from "./Telemetry.js"
import { LEASE_MARGIN_MS, leaseStale, type RowEntry, type WorkerEnv } from "./WorkerState.js"

/** Lease floor (SPEC §4.1); its margin over the request timeout is {@link LEASE_MARGIN_MS}. */
export const MIN_LEASE_MS = 60_000
export { LEASE_MARGIN_MS }
/** Leases renewed per heartbeat statement. */
export const HEARTBEAT_CHUNK = 1_000

/**
 * Milliseconds on the monotonic clock (Effect's `currentTimeNanos`: `process.hrtime` from a fixed
 * origin), for durations that a step of the wall clock must not change. Not a date.
 */
export const monotonicMs: Effect.Effect<number> = Effect.map(Clock.currentTimeNanos, (n) => Number(n / 1_000_000n))

/** The lease of a row held by this worker is gone (or could not be renewed for too long). */
export const leaseLost = (env: WorkerEnv, entry: RowEntry) =>
  Effect.gen(function*() {
    if (entry.settling) return
    if (entry.started && entry.fiber === undefined) return
    entry.settling = true
    countNotAttempted("lease_lost")
    yield* logRecurring(env, "lease_lost", "delivery lease lost; attempt abandoned", {
      deliveryId: entry.row.deliveryId
    })
    if (entry.fiber !== undefined) {
      yield* Fiber.interruptFork(entry.fiber)
      return
    }
    // not started: stop waiting; hand it back in case the lease is still ours (renewals failed)
    const waiting = env.state.waiting
    const at = waiting.indexOf(entry)
    if (at >= 0) waiting.splice(at, 1)
    // in the worker's row set (owned by its scope, like every attempt), not a daemon fiber
    yield* FiberSet.run(env.rows, Effect.ensuring(release(env, entry.row), forget(env, entry)))
  })

/** Renews the leases of every held row that is not settling. */
export const renewAll = (env: WorkerEnv) =>
  Effect.gen(function*() {
    const leaseMs = env.leaseMs
    const held = [...env.state.entries.values()].filter((e) => !e.settling)
    for (let i = 0; i < held.length; i += HEARTBEAT_CHUNK) {
      const chunk = held.slice(i, i + HEARTBEAT_CHUNK)
      // a renewed lease runs from the statement's start (its now()), not from its answer
      const sentAt = yield* monotonicMs
      const result = yield* Effect.either(
        env.store.heartbeatMany(chunk.map((e) => ({ deliveryId: e.row.deliveryId, token: e.row.leaseToken })), leaseMs)
      )
      const now = yield* monotonicMs
      if (Either.isRight(result)) {
        for (const e of chunk) {
          if (result.right.has(e.row.leaseToken)) e.renewedAt = sentAt
          else yield* leaseLost(env, e)
        }
      } else {
        yield* logStoreError(env, result.left)
        for (const e of chunk) if (leaseStale(leaseMs, e.renewedAt, now)) yield* leaseLost(env, e)
      }
    }
  })

/** The heartbeat: renews every lease/3, forever. */
export const heartbeatLoop = (env: WorkerEnv) =>
  Effect.forever(
    Effect.zipRight(Effect.sleep(Duration.millis(Math.max(1, Math.floor(env.leaseMs / 3)))), renewAll(env))
  )
