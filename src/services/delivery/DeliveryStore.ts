/**
 * The delivery side of the outbox (SPEC §4.1–4.3, §4.7): claiming due rows under a lease, renewing
 * leases, and settling rows, behind a Tag with a PostgreSQL implementation.
 *
 * Leases. `claim` moves due rows (`pending` with `next_attempt_at <= now()`, or `leased` with an
 * expired `leased_until`: the reaper) to `leased` in ONE statement, with a lease token
 * `<workerId>:<uuid>` per row and `leased_until = now() + lease`. The candidate rows are read in
 * `next_attempt_at` order; the chosen ones are then locked `FOR UPDATE SKIP LOCKED` and re-checked,
 * so any number of workers (processes) can claim from one table and never get the same row while
 * its lease is valid. Every later write (`heartbeat` and the settle operations) is guarded by
 * `status = 'leased' AND lease_token = <mine>` and answers whether it applied: a worker that lost
 * its lease (expired and reclaimed) can never overwrite the row.
 *
 * Dead workers. Each worker holds a liveness mark in PostgreSQL: a session advisory lock keyed by
 * its worker id on the store's claim connection (ClaimConnection.ts), taken before its first claim.
 * `reclaimAbandoned`, run by every worker every {@link RECLAIM_INTERVAL_MS}, expires the leases of
 * rows whose worker's mark is gone (the process died, so did its connections), so they are claimed
 * within seconds, not after a whole lease. A live worker that lost its claim connection re-takes the
 * mark on the next one within the interval; if its rows were taken meanwhile, its settles are
 * refused (the token is no longer its) and the new holder retries them under the same delivery id.
 *
 * Suspects (Suspects.ts). The claim tells, per row, whether it was taken from an expired lease
 * (`reclaimed`) and its `crash_count`, which it resets to 0 for a row taken from `pending`;
 * `reclaimRoom` bounds how many expired-lease rows counted before (`crash_count ≥ 1`) one claim
 * takes. `markSuspect` counts a
 * suspect's attempt before its request is made. Fresh rows cost no statement more.
 *
 * Per-origin fairness. The claim is told how many more rows of each URL origin the worker may hold
 * (`rooms`; `defaultRoom` for origins it holds none of) and which origins are full (`fullOrigins`,
 * skipped while reading candidates, within a bounded read of `SCAN_MAX` rows). Rows over an origin's
 * room are left pending for later claims, so one busy origin cannot fill a worker's pool. Nor can it
 * fill the bounded read: a claim left short while rows may lie beyond what it read also walks the
 * origins with pending rows (≤ {@link ORIGIN_WALK_MAX}, from where the last walk stopped) and takes
 * the oldest due rows of those it had no candidates of, each within its room.
 *
 * Open circuits (SPEC §4.3). An origin whose circuit is open costs the others nothing: the worker
 * moves its pending rows past the cool-down in bulk (`park`, an index range scan on
 * `outbox_origin_due`), so they never fill the claim's bounded candidate window, and the claim skips
 * the origins it is told are open (`openOrigins`) for the rows that became due since.
 *
 * The claim also returns, per row, the subscription and owner state it read in the same statement
 * ({@link SubscriptionSnapshot}), so a worker that attempts the row right away needs no extra
 * round trip to check that the subscription is unchanged.
 *
 * Settling. Terminal operations (`markDelivered`, `deadLetter`, `cancel`) set `finished_at` and
 * write the audit row (URL always `[redacted]`) in the same statement as the guarded update; an
 * attempt record (`delivery_attempts`, response excerpt ≤ 1 KiB) can ride along with any settle
 * operation. So either the whole settle happened or none of it did. Concurrent settles are applied
 * in batches (one statement, one commit per batch; see `runBatch`), each row still guarded by its
 * own token.
 *
 * Times stored in the database are computed by the database (`now()` + a delay in ms), so every
 * worker agrees on them whatever its own clock says; the one exception, `park`'s cool-down ends
 * (the worker's breaker, on its clock), is carried over to the database's clock by the SQL driver
 * (ParkSql.ts `makeParkClock`). Every operation has a timeout.
 */
import type * as PgClient from "@effect/sql-pg/PgClient"
import type * as SqlClient from "@effect/sql/SqlClient"
import { Context, Duration, type Effect, Layer, type Stream } from "effect"
import type { OutboxRow } from "../matching/Outbox.js"
import type { SigningMode } from "../matching/WebhookIndex.js"
import type { StoreError } from "../platform/Persistence.js"
import { makeSql } from "./DeliveryStoreSql.js"

export { originKey } from "../matching/Origin.js"
export { makeSql } from "./DeliveryStoreSql.js"

// ---------------------------------------------------------------------------------------------
// Model

/** A claimed outbox row (the enqueued row's fields, `targetUrl` being the URL at enqueue time, so a
 * changed URL cancels the row) with its lease and payload body. */
export interface ClaimedRow extends OutboxRow {
  /** attempts already spent */
  readonly attemptCount: number
  /** this claim's lease token `<workerId>:<uuid>` */
  readonly leaseToken: string
  /** the origin key of `targetUrl` ({@link originKey}) */
  readonly origin: string
  /** ms since the row was enqueued (database clock) at claim time */
  readonly ageMs: number
  /**
   * no request has been made for this delivery yet (no attempt recorded): this attempt is its first.
   * False for a row replayed or redelivered after an attempt, although its `attemptCount` is 0 again
   */
  readonly firstAttempt: boolean
  /**
   * the row was claimed from an expired lease (its previous holder died, or stalled past its
   * lease, while holding it), not from `pending`: a suspect (Suspects.ts)
   */
  readonly reclaimed: boolean
  /**
   * how many times the row was attempted as a suspect (`outbox.crash_count`); 0 when claimed from
   * `pending` (the claim resets it)
   */
  readonly crashCount: number
  /** the stored canonical body; undefined if the body row is missing */
  readonly body: string | undefined
  /** the subscription and its owner as they were when the row was claimed (same statement) */
  readonly snapshot: SubscriptionSnapshot
}

/**
 * The subscription a claimed row belongs to, read by the claim statement itself (so a fresh claim
 * needs no further round trip to check it). `exists: false` = no webhook row.
 */
export interface SubscriptionSnapshot {
  readonly exists: boolean
  readonly active: boolean
  readonly enabled: boolean
  readonly gone: boolean
  /** auto-disabled (SPEC §4.3): its rows are parked, not sent */
  readonly autoDisabled: boolean
  readonly url: string
  readonly fingerprint: string
  readonly signingMode: SigningMode
  readonly secretId: string | undefined
  /** the record's inline secret (signing mode `record_secret`) */
  readonly recordSecret: string | undefined
  /** the owner's reconciliation status (`unknown` when the owner has no row) */
  readonly ownerStatus: "unknown" | "scanning" | "complete" | "failed"
}

/** A subscription's key: its owner and the record key of its `place.wisp.v2.wh` record. */
export interface SubscriptionKey {
  readonly ownerDid: string
  readonly rkey: string
}

export interface ClaimOptions {
  /** origins the worker already holds rows of, with how many more it may take (> 0) */
  readonly rooms?: ReadonlyArray<{ readonly origin: string; readonly room: number }>
  /** origins the worker may take no more rows of */
  readonly fullOrigins?: ReadonlyArray<string>
  /**
   * origins whose circuit is open (or whose probe is outstanding): none of their rows is taken.
   * Matched against the stored `outbox.origin` only: rows enqueued before it existed (NULL) are
   * claimed as before. Their pending rows are moved out of the due set in bulk by `park`.
   */
  readonly openOrigins?: ReadonlyArray<string>
  /**
   * how many rows with an expired lease (reclaimed: `ClaimedRow.reclaimed`) whose `crash_count` is
   * 1 or more (counted suspects, attempted one at a time: Suspects.ts) may be taken at most
   * (default: no limit other than the claim's); pending rows and a first reclaim (`crash_count ≤ 0`)
   * are not limited by it
   */
  readonly reclaimRoom?: number
  /** how many rows of an origin not listed above may be taken (default: no limit) */
  readonly defaultRoom?: number
  /**
   * whether the claim reads each row's subscription and owner state (`ClaimedRow.snapshot`);
   * default true. A worker that reads them when each attempt starts passes false (the snapshot is
   * then `exists: false` and must not be used).
   */
  readonly withSubscriptions?: boolean
  /**
   * asked after the claim's first statement, before its origin walk (a second statement): false
   * skips the walk (a stopping worker: the claim then ends within one statement's bound, which is
   * what the stop waits for). Default: the walk runs when it should.
   */
  readonly mayWalk?: () => boolean
}

export interface ClaimResult {
  readonly rows: ReadonlyArray<ClaimedRow>
  /**
   * true when more due rows were probably left behind: the claim was full, the candidate window
   * was full, or rows were skipped because of an origin's room.
   */
  readonly moreDue: boolean
  /**
   * The claim's second statement (the origin walk) failed after its first had leased `rows`: they
   * are returned all the same, and the failure is reported here (the claim connection, which holds
   * the worker's liveness mark, may have been lost).
   */
  readonly failure?: StoreError
}

/** One row of `delivery_attempts`. The sequence number is assigned by the store. */
export interface AttemptRecord {
  /** epoch ms (the worker's Clock) */
  readonly startedAtMs: number
  readonly durationMs: number
  /** `delivered` · `retry` · `dead_letter` · `skipped` (transform answered no request) */
  readonly outcome: "delivered" | "retry" | "dead_letter" | "skipped"
  readonly errorKind: string | undefined
  readonly httpStatus: number | undefined
  /** at most {@link RESPONSE_EXCERPT_BYTES} bytes of the response body; truncated by the store */
  readonly responseExcerpt: string | undefined
}

/** How a delivered row is settled (`markDelivered`). `attemptCount` is the new total. */
export interface DeliveredAttempt {
  readonly attemptCount: number
  readonly httpStatus: number | undefined
  readonly attempt?: AttemptRecord | undefined
}

/** How a failed attempt is settled (`reschedule`, `deadLetter`). `attemptCount` is the new total. */
export interface FailedAttempt {
  readonly attemptCount: number
  readonly errorKind: string
  readonly httpStatus: number | undefined
  readonly attempt?: AttemptRecord | undefined
}

/** An origin whose pending rows are (to be) parked until `untilMs` (epoch ms). */
export interface ParkedOrigin {
  readonly origin: string
  readonly untilMs: number
}

export interface DeliveryCounts {
  readonly pending: number
  readonly leased: number
  readonly deadLetter: number
  /** webhooks auto-disabled (SPEC §4.3) */
  readonly autoDisabledWebhooks: number
  /** webhooks marked gone (410) */
  readonly goneWebhooks: number
}

export interface DeliveryStoreShape {
  /** Lease up to `limit` due rows for `leaseMs` (see the module documentation). */
  readonly claim: (
    workerId: string,
    limit: number,
    leaseMs: number,
    options?: ClaimOptions
  ) => Effect.Effect<ClaimResult, StoreError>
  /**
   * Holds (takes, or confirms) the liveness mark of `workerId`, then expires the leases of rows
   * whose worker holds no mark (it is dead: SPEC §4.1), so that they are claimed at once, and
   * wakes the claims when it freed any. `held`: whether this store holds the worker's mark (false:
   * another session holds one under the same hash). Run every few seconds by each worker.
   */
  readonly reclaimAbandoned: (
    workerId: string
  ) => Effect.Effect<{ readonly held: boolean; readonly freed: number }, StoreError>
  /**
   * Counts one more attempt of a reclaimed row as a suspect (`crash_count + 1`, one guarded
   * statement, committed before the request is made) and answers the new count; undefined when the
   * lease is no longer mine.
   */
  readonly markSuspect: (deliveryId: string, token: string) => Effect.Effect<number | undefined, StoreError>
  /**
   * The attempts under these leases were cut off by an orderly stop: their rows stay leased, and
   * the suspect count their reclaim will add is taken back first (an orderly stop is no death).
   * Answers how many rows were still under these leases.
   */
  readonly cutShort: (tokens: ReadonlyArray<string>) => Effect.Effect<number, StoreError>
  /** Extend my lease to now + `leaseMs`; false when the lease is no longer mine. */
  readonly heartbeat: (deliveryId: string, token: string, leaseMs: number) => Effect.Effect<boolean, StoreError>
  /** `heartbeat` for many rows in one statement; answers the tokens whose lease was extended. */
  readonly heartbeatMany: (
    leases: ReadonlyArray<{ readonly deliveryId: string; readonly token: string }>,
    leaseMs: number
  ) => Effect.Effect<ReadonlySet<string>, StoreError>
  /** → `delivered` (+ audit). `attemptCount` is the new total. */
  readonly markDelivered: (
    deliveryId: string,
    token: string,
    outcome: DeliveredAttempt
  ) => Effect.Effect<boolean, StoreError>
  /** → `pending` again after `delayMs`, attempt spent, lease cleared. */
  readonly reschedule: (
    deliveryId: string,
    token: string,
    retry: FailedAttempt & { readonly delayMs: number }
  ) => Effect.Effect<boolean, StoreError>
  /** → `pending` again after `delayMs` WITHOUT spending an attempt (owner scanning, circuit open, release). */
  readonly defer: (deliveryId: string, token: string, delayMs: number) => Effect.Effect<boolean, StoreError>
  /**
   * Reschedules, without an attempt and in ONE statement, the pending rows of each origin whose
   * `next_attempt_at` is before the origin's `untilMs` (epoch ms, the worker's clock) to exactly
   * `untilMs` (SPEC §4.3: an open circuit's rows go to the end of its cool-down in bulk, never
   * claimed and deferred row by row). At most {@link PARK_CHUNK} rows per call; answers how many
   * moved (the caller repeats while a call moves a whole chunk). Idempotent: a row already at or
   * after `untilMs` is not touched. Rows with no stored origin (enqueued before 0002) are not moved.
   */
  readonly park: (origins: ReadonlyArray<ParkedOrigin>) => Effect.Effect<number, StoreError>
  /**
   * Undoes `park` for origins that recovered before `untilMs` (a probe or a late attempt
   * succeeded): their pending rows at exactly `untilMs` are due now. At most {@link PARK_CHUNK}
   * rows per call; answers how many.
   */
  readonly unpark: (origins: ReadonlyArray<ParkedOrigin>) => Effect.Effect<number, StoreError>
  /** → `dead_letter` (+ audit). */
  readonly deadLetter: (deliveryId: string, token: string, failure: FailedAttempt) => Effect.Effect<boolean, StoreError>
  /**
   * Parks the row of a disabled or gone webhook (SPEC §4.3): → `dead_letter` with kind
   * `webhook_disabled`, no attempt spent (+ audit), while the webhook has fewer than 10,000 parked
   * rows; beyond, → `cancelled` (dropped, counted). Answers whether it applied. A webhook that is
   * no longer gone or auto-disabled (same fingerprint) when this runs (resumed since the attempt read
   * it) gets the row back as `pending`, due now, and the answer is false: parked after a resume, it
   * would stay a dead letter that the resume's replay had already passed.
   */
  readonly parkDisabled: (deliveryId: string, token: string) => Effect.Effect<boolean, StoreError>
  /** → `cancelled` with `reason` as `last_error_kind` (+ audit). */
  readonly cancel: (deliveryId: string, token: string, reason: string) => Effect.Effect<boolean, StoreError>
  /**
   * The current subscription and owner state of each key, in the order of `keys` (one statement
   * for all of them): the per-attempt check of SPEC §4.2 step 1, batched across attempts.
   */
  readonly subscriptions: (
    keys: ReadonlyArray<SubscriptionKey>
  ) => Effect.Effect<ReadonlyArray<SubscriptionSnapshot>, StoreError>
  /**
   * Row counts for health: one statement bounded by {@link COUNTS_TIMEOUT}, each count stopping at
   * 1,000,001. Not cached here: the worker's health section reads them in the background
   * (CountsCache.ts), so a health request never waits on this.
   */
  readonly counts: Effect.Effect<DeliveryCounts, StoreError>
  /** One element per outbox notification (`LISTEN firehook_outbox`). */
  readonly wakeups: Stream.Stream<void, StoreError>
  /** Send one outbox notification (used to confirm that LISTEN is established). */
  readonly notify: Effect.Effect<void, StoreError>
}

export class DeliveryStore extends Context.Tag("firehook/DeliveryStore")<DeliveryStore, DeliveryStoreShape>() {}

// ---------------------------------------------------------------------------------------------
// Limits

/** Bytes of response body kept in `delivery_attempts.response_excerpt`. */
export const RESPONSE_EXCERPT_BYTES = 1024
/** Largest `limit` one claim accepts. */
export const CLAIM_MAX = 1000
/**
 * Candidate rows read per claim: `CANDIDATE_FACTOR × limit`, at most `CANDIDATE_MAX`. Rows of full
 * origins are skipped while reading (they never count), so the window only has to absorb origins
 * whose room is smaller than their due rows; 2 read half as many rows per claim as 4 did (less
 * database work per delivery; figures in docs/benchmarks.md), and a claim that filled its window
 * reports `moreDue`, so the worker claims again at once.
 */
export const CANDIDATE_FACTOR = 2
export const CANDIDATE_MAX = 2000
/** Rows read at most, per branch, while skipping the rows of full origins. */
export const SCAN_MAX = 4000
/**
 * Origins a short claim walks at most (one index probe each, and one for each origin's due rows)
 * when its window may hide other origins' rows (DeliveryStoreSql.ts, the claim).
 */
export const ORIGIN_WALK_MAX = 64
/** Rows one `park` / `unpark` statement moves at most. */
export const PARK_CHUNK = 10_000
/** Origins one `park` / `unpark` statement covers at most (the caller passes the rest next time). */
export const PARK_ORIGINS_MAX = 1_000
/** Settles applied by one statement at most. */
export const SETTLE_BATCH_MAX = 256
/**
 * Settle statements in flight at once. One: settles that arrive while a statement runs wait for the
 * next one (group commit), so batches grow with the load: larger batches than with four flushers,
 * and less database work per delivery (figures in docs/benchmarks.md).
 */
export const SETTLE_FLUSHERS = 1
/**
 * A settle statement that failed (not by its timeout) is run again this many times at most, the
 * first after {@link SETTLE_RETRY_BASE}, doubling (0.1 + 0.2 + 0.4 s): a reset connection costs
 * the batch under a second instead of a lease (settles are guarded by their lease tokens, so a
 * statement run again after it had in fact committed changes nothing).
 */
export const SETTLE_RETRIES = 3
export const SETTLE_RETRY_BASE = Duration.millis(100)
/**
 * A settle that still failed through a database outage (after the retries above) is queued again
 * by the settle path (Settlement.ts) while the row's lease may still be this worker's: the first
 * time after about {@link SETTLE_RETRY_BASE}, doubling up to this (equal jitter: each delay is half
 * to all of it), so a database back from a restart or a failover gets the settle within about 2 s.
 */
export const SETTLE_OUTAGE_RETRY_MAX = Duration.seconds(2)
/** Health counts stop counting here (health clamps at 1,000,000 anyway). */
export const COUNT_CAP = 1_000_001
/** SPEC §6.2: health counts older than this (from the start of their query) are marked stale. */
export const COUNTS_TTL_MS = 5_000
/** The counts statement is abandoned after this long (its query is cancelled). */
export const COUNTS_TIMEOUT = Duration.millis(2_500)
/** Rows whose lease one reclaim statement expires at most. */
export const RECLAIM_MAX = 5_000
/** The bound on one reclaim statement (it runs every {@link RECLAIM_INTERVAL_MS}). */
export const RECLAIM_TIMEOUT = Duration.seconds(5)
/** How often a worker confirms its liveness mark and reclaims the rows of dead workers. */
export const RECLAIM_INTERVAL_MS = 2_000
/** Every statement of this store is abandoned after this long. */
export const STATEMENT_TIMEOUT = Duration.seconds(15)

/**
 * UTF-8 text of at most `RESPONSE_EXCERPT_BYTES` bytes, without NULs (PostgreSQL text refuses
 * them), invalid bytes replaced (SPEC §4.5). A body cut at the limit loses only the character the
 * cut split (decoded as a stream, whose incomplete tail is held back); invalid bytes the receiver
 * sent stay as U+FFFD, at the end too.
 */
export const excerpt = (bytes: Uint8Array): string =>
  new TextDecoder("utf-8", { fatal: false })
    .decode(bytes.subarray(0, RESPONSE_EXCERPT_BYTES), { stream: bytes.length > RESPONSE_EXCERPT_BYTES })
    .replace(/\u0000/g, "")

/** The PostgreSQL store. Requires the `PgClient` (for LISTEN) and its `SqlClient`. */
export const layerSql: Layer.Layer<DeliveryStore, never, SqlClient.SqlClient | PgClient.PgClient> = Layer.scoped(
  DeliveryStore,
  makeSql
)
