/**
 * The settlement of one claimed row: what an attempt decided ({@link Settlement}, a value), and the
 * settle path that writes it (guarded by the lease token), counts it and publishes terminal outcomes
 * (the Redis audit publisher, and the live tail's `DeliveryOutcomes` when the process has one).
 *
 * An attempt answers its settlement while holding a request slot; the caller runs {@link settle}
 * after freeing the slot, so a slow database never holds a request slot.
 *
 * A settle that failed through a database outage (a restart, a failover: {@link isOutage}) is
 * queued again, with backoff, until the row's lease as this worker last renewed it ends
 * ({@link settleThroughOutage}): given up sooner, the row stayed leased until that end and was then
 * claimed and sent again, although its receiver had answered. Every settle is guarded by its lease
 * token, so a settle run again after the first had in fact committed, or after another worker took
 * the row, applies nothing.
 *
 * @since 0.1.0
 */
import { Data, Duration, Effect, Option, Random } from "effect"
import { equalJitter } from "../platform/Backoff.js"
import type { StoreError } from "../platform/Persistence.js"
import { type FailureKind, isRetryable } from "./Classify.js"
import { type AttemptRecord, type ClaimedRow, SETTLE_OUTAGE_RETRY_MAX, SETTLE_RETRY_BASE } from "./DeliveryStore.js"
import type { OutgoingRequest } from "./Destinations.js"
import type { AuditEvent } from "./Publisher.js"
import { nextDelay } from "./RetryPolicy.js"
import { countAttempt, countNotAttempted, logRecurring, logStoreError } from "./Telemetry.js"
import { PARKED_KIND } from "./WebhookHealthSql.js"
import { goneKey, type WorkerEnv } from "./WorkerState.js"

/** Why an attempt failed: a failure kind, a row without its payload, or a defect. */
export type Kind = FailureKind | "payload_missing" | "internal"

const retryableKind = (kind: Kind): boolean =>
  kind === "payload_missing" ? false : kind === "internal" ? true : isRetryable(kind)

/**
 * What an attempt decided:
 * - `Defer`: come back after `delayMs` plus up to `jitterMs` at random, no attempt spent;
 * - `Cancel`: settled `cancelled` without a request;
 * - `Park`: the webhook is auto-disabled or gone (SPEC §4.3): parked as a `dead_letter` of kind
 *   `webhook_disabled` without a request, for a later replay (dropped beyond 10,000 per webhook);
 * - `Fail`: a failed attempt (rescheduled with backoff while retryable and within budget, else
 *   dead-lettered);
 * - `Deliver`: delivered (`attempt.outcome` `delivered`, or `skipped` when no request was needed);
 * - `Crashed`: a suspect whose count of crashes is over the limit (Suspects.ts): dead-lettered
 *   with kind `crashed` without a request, no attempt spent;
 * - `Send`: the request to send to `origin` (the attempt's send turns it into one of the others).
 */
export type Settlement = Data.TaggedEnum<{
  Defer: { readonly delayMs: number; readonly jitterMs: number; readonly reason: string }
  Cancel: { readonly reason: string }
  Park: {}
  Fail: {
    readonly kind: Kind
    readonly httpStatus: number | undefined
    readonly retryAfterMs: number | undefined
    readonly startedAtMs: number
    readonly durationMs: number
    readonly responseExcerpt: string | undefined
  }
  Deliver: { readonly httpStatus: number | undefined; readonly attempt: AttemptRecord }
  Crashed: { readonly crashes: number }
  Send: { readonly request: OutgoingRequest; readonly origin: string }
}>

export const Settlement = Data.taggedEnum<Settlement>()

/** A settlement the settle path writes (every case but `Send`). */
export type Settled = Exclude<Settlement, { readonly _tag: "Send" }>

// the constructors, read once (each read of the enum's proxy makes a new one)
export const { Cancel, Crashed, Defer, Deliver, Fail, Park, Send } = Settlement

/** The kind (`last_error_kind`, audit, tail, metric reason) of a row dead-lettered as `Crashed`. */
export const CRASHED_KIND = "crashed"

/** A failed attempt without a response. */
export const failure = (kind: Kind, startedAtMs: number, durationMs: number): Settled =>
  Fail({ kind, httpStatus: undefined, retryAfterMs: undefined, startedAtMs, durationMs, responseExcerpt: undefined })

// ---------------------------------------------------------------------------------------------
// The settle path

/** Carry out a settlement. Store failures are logged and leave the row leased (reclaimed after the lease). */
export const settle = (env: WorkerEnv, row: ClaimedRow, s: Settled): Effect.Effect<void> => {
  switch (s._tag) {
    case "Defer":
      return s.jitterMs > 0
        ? Effect.flatMap(jitter(s.jitterMs), (j) => deferRow(env, row, s.delayMs + j, s.reason))
        : deferRow(env, row, s.delayMs, s.reason)
    case "Cancel":
      return cancelRow(env, row, s.reason)
    case "Park":
      return parkRow(env, row)
    case "Deliver":
      return delivered(env, row, s.httpStatus, s.attempt)
    case "Crashed":
      return crashedRow(env, row, s.crashes)
    case "Fail":
      // a 410 is the receiver's answer whatever became of the row: the registration is marked gone
      // even when the dead letter did not apply (the lease taken over meanwhile, or a settle retried
      // after a lost answer to a commit); the mark is idempotent, and only for this fingerprint
      return s.kind === "gone"
        ? whileMarkingGone(env, row, Effect.zipRight(failed(env, row, s), markGone(env, row)))
        : Effect.asVoid(failed(env, row, s))
  }
}

const jitter = (max: number) => Random.nextIntBetween(0, Math.max(1, max))

const publish = (
  env: WorkerEnv,
  row: ClaimedRow,
  status: AuditEvent["status"],
  httpStatus: number | undefined,
  errorKind: string | undefined
) =>
  Effect.suspend(() => {
    const atMs = env.clock.unsafeCurrentTimeMillis()
    const audit = env.publisher.publish({
      deliveryId: row.deliveryId,
      eventId: row.eventId,
      ownerDid: row.ownerDid,
      webhookRkey: row.webhookRkey,
      did: row.eventDid,
      collection: row.eventCollection,
      rkey: row.eventRkey,
      operation: row.eventOperation,
      status,
      httpStatus: httpStatus ?? null,
      errorKind: errorKind ?? null,
      url: "[redacted]",
      time: new Date(atMs).toISOString()
    })
    if (Option.isNone(env.outcomes)) return audit
    // the live tail (SPEC §8.5): never waits
    return Effect.zipRight(
      audit,
      env.outcomes.value.publish({
        id: row.deliveryId,
        owner: row.ownerDid,
        rkey: row.webhookRkey,
        event: row.eventOperation,
        status,
        httpStatus,
        errorKind,
        atMs
      })
    )
  })

// ---------------------------------------------------------------------------------------------
// Settles through a database outage

/**
 * The codes (`StoreError.code`) of a settle that failed because the database could not be reached
 * or could not answer, not because of what the statement asked: firehook's `connection_lost` and
 * `timeout` (a statement past its 15 s bound, or a connection not made within 10 s: what a failover
 * that leaves the old server silent looks like), the socket's errno, and the SQLSTATEs of a server
 * that is gone, restarting or short of resources (class 08, 57P01–57P05, class 53), read-only (a
 * standby after a failover, 25006) or that cancelled the statement (57014), and the refusals of a new
 * connection while the operator changes the database: `ALLOW_CONNECTIONS false` (55000, which a
 * settle's own statement never raises) and a role or `pg_hba.conf` refusal (28000, 28P01). Before
 * stop 59 a 55000 gave every answered row's settle up at once: each row in flight was sent again a
 * lease later.
 */
const OUTAGE_CODES: ReadonlySet<string> = new Set([
  "connection_lost",
  "timeout",
  "ECONNREFUSED",
  "ECONNRESET",
  "ECONNABORTED",
  "EPIPE",
  "ETIMEDOUT",
  "EHOSTUNREACH",
  "EHOSTDOWN",
  "ENETUNREACH",
  "ENETDOWN",
  "ENOTFOUND",
  "EAI_AGAIN",
  "25006",
  "57014",
  "55000",
  "28000",
  "28P01"
])
const OUTAGE_SQLSTATE = /^(?:08[0-9A-Z]{3}|53[0-9A-Z]{3}|57P0[1-5])$/

/**
 * Whether a settle failed through a database outage ({@link OUTAGE_CODES}). Any other failure (a
 * statement the database refused: the same statement would fail again) is not retried beyond the
 * batcher's own retries (SettleBatcher.ts), nor is a store that is shutting down (`shutdown`).
 */
export const isOutage = (e: StoreError): boolean => OUTAGE_CODES.has(e.code) || OUTAGE_SQLSTATE.test(e.code)

/**
 * Runs `settle`; while it fails through an outage ({@link isOutage}), runs it again (queued again, it
 * joins the next settle batch), after delay n (n = 0, 1, …) of equal jitter below
 * `min(SETTLE_OUTAGE_RETRY_MAX, SETTLE_RETRY_BASE · 2ⁿ)` (50 ms to 2 s), as long as that next run
 * starts before `untilMs` on the monotonic clock `nowMs` (the end of the row's lease). Bounded: every
 * delay is at least 50 ms. `onFailure` sees every failure (each run's).
 */
export const settleThroughOutage = <A>(
  settle: Effect.Effect<A, StoreError>,
  untilMs: number,
  nowMs: () => number,
  onFailure: (e: StoreError) => Effect.Effect<void>
): Effect.Effect<A, StoreError> =>
  Effect.catchAll(settle, (e) => throughOutageAfter(settle, e, untilMs, nowMs, onFailure))

/** {@link settleThroughOutage} once `settle`'s first run has failed with `first`. */
const throughOutageAfter = <A>(
  settle: Effect.Effect<A, StoreError>,
  first: StoreError,
  untilMs: number,
  nowMs: () => number,
  onFailure: (e: StoreError) => Effect.Effect<void>
): Effect.Effect<A, StoreError> => {
  const after = (e: StoreError, n: number): Effect.Effect<A, StoreError> =>
    Effect.gen(function*() {
      yield* onFailure(e)
      if (!isOutage(e)) return yield* Effect.fail(e)
      const delay = yield* equalJitter(SETTLE_RETRY_BASE, SETTLE_OUTAGE_RETRY_MAX, n)
      if (nowMs() + Duration.toMillis(delay) >= untilMs) return yield* Effect.fail(e)
      yield* Effect.sleep(delay)
      return yield* Effect.catchAll(settle, (next) => after(next, n + 1))
    })
  return after(first, 0)
}

/** The worker's monotonic clock, ms (as Leases.monotonicMs reads it). */
const monotonicNow = (env: WorkerEnv) => (): number => Number(env.clock.unsafeCurrentTimeNanos() / 1_000_000n)

/**
 * Run a guarded settle of `row`, through an outage until its lease ends: the lease as this worker
 * last renewed it (the heartbeat no longer renews a row being settled), or a whole lease from now
 * for a row the worker does not hold. A settle that still failed is logged and leaves the row
 * leased (reclaimed after the lease, and sent again).
 */
const guarded = (env: WorkerEnv, row: ClaimedRow, eff: Effect.Effect<boolean, StoreError>) =>
  // nothing more than the settle on its success path: the outage handling is built on a failure
  Effect.catchAll(eff, (first) =>
    Effect.suspend(() => {
      const now = monotonicNow(env)
      // a settling row's renewal time is frozen (the heartbeat skips it)
      const renewedAt = env.state.entries.get(row.leaseToken)?.renewedAt ?? now()
      return throughOutageAfter(eff, first, renewedAt + env.leaseMs, now, (e) => logStoreError(env, e))
    }).pipe(
      Effect.catchAll((e) =>
        Effect.as(
          isOutage(e)
            ? logRecurring(
              env,
              "settle_given_up",
              "delivery settle given up: its row is attempted again after its lease",
              {
                deliveryId: row.deliveryId,
                code: e.code
              }
            )
            : Effect.void,
          false
        )
      )
    ))

const deferRow = (env: WorkerEnv, row: ClaimedRow, delayMs: number, reason: string) =>
  Effect.gen(function*() {
    yield* guarded(env, row, env.store.defer(row.deliveryId, row.leaseToken, delayMs))
    countNotAttempted(reason)
  })

const cancelRow = (env: WorkerEnv, row: ClaimedRow, reason: string) =>
  Effect.gen(function*() {
    const applied = yield* guarded(env, row, env.store.cancel(row.deliveryId, row.leaseToken, reason))
    countNotAttempted(reason)
    if (applied) yield* publish(env, row, "cancelled", undefined, reason)
  })

const parkRow = (env: WorkerEnv, row: ClaimedRow) =>
  Effect.gen(function*() {
    const applied = yield* guarded(env, row, env.store.parkDisabled(row.deliveryId, row.leaseToken))
    countNotAttempted(PARKED_KIND)
    if (applied) yield* publish(env, row, "dead_letter", undefined, PARKED_KIND)
  })

/**
 * A suspect over the crash limit: a dead letter of kind `crashed`, no request and no attempt spent
 * (the HTTP status of an earlier attempt would not belong to this error: cleared), and one warning.
 */
const crashedRow = (env: WorkerEnv, row: ClaimedRow, crashes: number) =>
  Effect.gen(function*() {
    const applied = yield* guarded(
      env,
      row,
      env.store.deadLetter(row.deliveryId, row.leaseToken, {
        attemptCount: row.attemptCount,
        errorKind: CRASHED_KIND,
        httpStatus: undefined
      })
    )
    countNotAttempted(CRASHED_KIND)
    if (!applied) return
    yield* Effect.logWarning("delivery dead-lettered: its worker died or stalled while attempting it, too often").pipe(
      Effect.annotateLogs({ deliveryId: row.deliveryId, ownerDid: row.ownerDid, rkey: row.webhookRkey, crashes })
    )
    yield* publish(env, row, "dead_letter", undefined, CRASHED_KIND)
  })

const delivered = (
  env: WorkerEnv,
  row: ClaimedRow,
  httpStatus: number | undefined,
  attempt: AttemptRecord
) =>
  Effect.flatMap(
    guarded(
      env,
      row,
      env.store.markDelivered(row.deliveryId, row.leaseToken, {
        attemptCount: row.attemptCount + 1,
        httpStatus,
        attempt
      })
    ),
    (applied) => {
      countAttempt(attempt.outcome, "none")
      return applied ? publish(env, row, "delivered", httpStatus, undefined) : Effect.void
    }
  )

/**
 * A failed attempt: reschedule with backoff while retryable and within budget, else dead-letter.
 * Answers whether it was dead-lettered.
 */
const failed = (env: WorkerEnv, row: ClaimedRow, f: Data.TaggedEnum.Value<Settlement, "Fail">) =>
  Effect.gen(function*() {
    const { kind, httpStatus } = f
    const attemptCount = row.attemptCount + 1
    const delay = retryableKind(kind) ? yield* nextDelay(env.retryConfig, attemptCount, f.retryAfterMs) : Option.none()
    const record = (outcome: AttemptRecord["outcome"]): AttemptRecord => ({
      startedAtMs: f.startedAtMs,
      durationMs: f.durationMs,
      outcome,
      errorKind: kind,
      httpStatus,
      responseExcerpt: f.responseExcerpt
    })
    if (Option.isSome(delay)) {
      yield* guarded(
        env,
        row,
        env.store.reschedule(row.deliveryId, row.leaseToken, {
          attemptCount,
          delayMs: Duration.toMillis(delay.value),
          errorKind: kind,
          httpStatus,
          attempt: record("retry")
        })
      )
      countAttempt("retry", kind)
      return false
    }
    const applied = yield* guarded(
      env,
      row,
      env.store.deadLetter(row.deliveryId, row.leaseToken, {
        attemptCount,
        errorKind: kind,
        httpStatus,
        attempt: record("dead_letter")
      })
    )
    countAttempt("dead_letter", kind)
    if (applied) yield* publish(env, row, "dead_letter", httpStatus, kind)
    return applied
  })

/**
 * Runs a 410's settle and gone mark with its registration in `markingGone`: until the mark is
 * written, this process's attempts of the registration are parked (Attempt.ts), instead of reading
 * a subscription that is not gone yet and sending (a backlog sent on for the 65–311 ms the settle
 * and the mark took, found by the audit of 6 December 2026). Other processes see the mark once it
 * is written.
 */
const whileMarkingGone = (env: WorkerEnv, row: ClaimedRow, mark: Effect.Effect<void>): Effect.Effect<void> => {
  const marks = env.state.markingGone
  const key = goneKey(row)
  return Effect.acquireUseRelease(
    Effect.sync(() => marks.set(key, (marks.get(key) ?? 0) + 1)),
    () => mark,
    () =>
      Effect.sync(() => {
        const n = (marks.get(key) ?? 1) - 1
        if (n > 0) marks.set(key, n)
        else marks.delete(key)
      })
  )
}

/**
 * A dead-lettered 410: the registration is marked gone. It stays in matching (SPEC §4.3): its new
 * matches are enqueued and parked by the worker (`webhook_disabled`) until it is resumed.
 */
const markGone = (env: WorkerEnv, row: ClaimedRow) =>
  env.registry.markGone(row.ownerDid, row.webhookRkey, row.fingerprint).pipe(
    Effect.asVoid,
    Effect.catchAll((e) => logStoreError(env, e))
  )
