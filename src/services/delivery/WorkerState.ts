/**
 * The delivery worker's explicit state: the mutable counters and row maps its parts share, and the
 * services and settings they read ({@link WorkerEnv}, made once by `Delivery.make` and passed to the
 * module-level functions of Admission, Leases, Attempt, Settlement and Worker).
 *
 * Fibers run one at a time on the JS thread and every mutation of the state is a synchronous step,
 * so no update can interleave with another.
 *
 * @since 0.1.0
 */
import type { Clock, Effect, Fiber, FiberSet, Option, Queue, Runtime } from "effect"
import type { SafeHttpShape } from "../platform/http/SafeHttp.js"
import type { StoreError } from "../platform/Persistence.js"
import type { RateLimitedLog } from "../platform/RateLimitedLog.js"
import type { RegistryStoreShape } from "../registry/RegistryStore.js"
import type { CircuitBreaker } from "./CircuitBreaker.js"
import type { DeliveryOutcomesShape } from "./DeliveryOutcomes.js"
import type { ClaimedRow, DeliveryStoreShape, SubscriptionKey, SubscriptionSnapshot } from "./DeliveryStore.js"
import type { Transform } from "./Destinations.js"
import type { FreshReader } from "./FreshReader.js"
import type { PublisherShape } from "./Publisher.js"
import type { RetryConfig } from "./RetryPolicy.js"
import type { SecretsShape } from "./Secrets.js"

export interface OriginSlot {
  /** rows of the origin held (waiting or started) */
  held: number
  /** rows of the origin holding a request slot (≤ perOriginConcurrency) */
  active: number
}

export interface RowEntry {
  readonly row: ClaimedRow
  /** when the claim that took the row started (its lease, age and snapshot date from then) */
  readonly claimedAtMs: number
  readonly slot: OriginSlot
  /** last successful lease renewal (the claim counts as one), on the monotonic clock (Leases.monotonicMs) */
  renewedAt: number
  /** has a request slot and runs the attempt (so an interruption must not hand the row back) */
  started: boolean
  /** settling (or given up): the heartbeat no longer renews it */
  settling: boolean
  fiber: Fiber.RuntimeFiber<void, never> | undefined
}

/** The lease's margin over the request timeout (SPEC §4.1: lease = max(60 s, timeout + 5 s)). */
export const LEASE_MARGIN_MS = 5_000

/**
 * Whether a held row's lease may be gone: not renewed for 2/3 of a lease (monotonic ms). The
 * heartbeat renews every lease/3, so only a process that could not renew (database down) or did
 * not run (frozen, starved) gets here; the lease then has at most a third left, or has expired and
 * another worker may hold the row.
 */
export const leaseStale = (leaseMs: number, renewedAt: number, nowMonotonicMs: number): boolean =>
  nowMonotonicMs - renewedAt >= (2 * leaseMs) / 3

/**
 * Whether a request may no longer start on a held row: its lease is {@link leaseStale}, or what is
 * left of it (from the last renewal's start) no longer covers a whole request plus `marginMs`. A
 * request started later could still run when the lease ends, and the heartbeat that would abort it
 * may come late (a renewal hung on the database for its statement timeout), while another worker
 * claims the row and sends it too. With the default 10 s timeout (lease 60 s) the first rule is the
 * stricter; with a 30 s timeout a request starts at most 25 s after the renewal. A lease set
 * shorter than that (`DeliveryOptions.leaseMs`, an embedding's or a test's) leaves less than a
 * heartbeat period (a third of it) to start in, so only the first rule holds for it.
 */
export const leaseTooShortToSend = (
  leaseMs: number,
  timeoutMs: number,
  marginMs: number,
  renewedAt: number,
  nowMonotonicMs: number
): boolean => {
  const covered = leaseMs - timeoutMs - marginMs
  return leaseStale(leaseMs, renewedAt, nowMonotonicMs) ||
    (covered >= leaseMs / 3 && nowMonotonicMs - renewedAt > covered)
}

/** Mutable worker state. */
export interface WorkerState {
  stopping: boolean
  stopStarted: boolean
  /** a claim statement is running (stop lets it finish so its rows can be handed back) */
  claiming: boolean
  held: number
  inFlight: number
  /** held rows that are counted suspects (Suspects.isSerialSuspect) */
  suspectsHeld: number
  /** a counted suspect holds the worker's one suspect slot (from its start until its outcome is known) */
  suspectActive: boolean
  /**
   * a statement on the claim connection failed since the last mark confirmation: the connection
   * (and the liveness mark it held) may have been lost for a moment, and other workers may have
   * taken this worker's rows over meanwhile
   */
  markInDoubt: boolean
  notified: boolean
  freed: boolean
  listening: boolean
  claims: number
  claimMs: number
  attempts: number
  /** origin slots: only origins with claimed rows (bounded by the number of held rows) */
  readonly origins: Map<string, OriginSlot>
  /** held rows by lease token */
  readonly entries: Map<string, RowEntry>
  /** held rows not started yet, in claim order */
  readonly waiting: Array<RowEntry>
  /** origins whose pending rows the mover parked, with the time they were parked to (Parking.ts) */
  readonly parked: Map<string, number>
  /** rows the mover rescheduled in bulk since start */
  parkedRows: number
  /** parked rows the mover made due again because their origin recovered early */
  unparkedRows: number
  /**
   * Registrations (`goneKey`) this process got a 410 for and is marking gone, with how many such
   * marks are running: their attempts are parked meanwhile, without a request (an entry lives from
   * the 410's settle until its mark ends, so there are at most as many as attempts in flight).
   */
  readonly markingGone: Map<string, number>
}

/** The registration of a row as {@link WorkerState.markingGone} keys it (its fingerprint included). */
export const goneKey = (
  row: { readonly ownerDid: string; readonly webhookRkey: string; readonly fingerprint: string }
) => `${row.ownerDid} ${row.webhookRkey} ${row.fingerprint}`

export const makeState = (): WorkerState => ({
  stopping: false,
  stopStarted: false,
  claiming: false,
  held: 0,
  inFlight: 0,
  suspectsHeld: 0,
  suspectActive: false,
  markInDoubt: false,
  notified: false,
  freed: false,
  listening: false,
  claims: 0,
  claimMs: 0,
  attempts: 0,
  origins: new Map(),
  entries: new Map(),
  waiting: [],
  parked: new Map(),
  parkedRows: 0,
  unparkedRows: 0,
  markingGone: new Map()
})

/** The services, settings and state of one worker. */
export interface WorkerEnv {
  readonly state: WorkerState
  readonly workerId: string
  readonly leaseMs: number
  readonly pollIntervalMs: number
  readonly graceMs: number
  readonly scanningDeferMs: number
  readonly snapshotMaxAgeMs: number
  /** request slots */
  readonly concurrency: number
  /** request slots per origin */
  readonly perOrigin: number
  /**
   * rows held per process at most, but for start-only claims (rows that start at once in idle request
   * slots, up to START_HOLD_FACTOR × concurrency more: Admission.claimPlan)
   */
  readonly maxHeld: number
  /** rows of one origin held per process at most */
  readonly perOriginHold: number
  /** while every request slot is busy, claim only in batches of at least this many rows */
  readonly minBatch: number
  /** the request timeout, ms */
  readonly timeoutMs: number
  readonly retryConfig: RetryConfig
  readonly breaker: CircuitBreaker
  readonly store: DeliveryStoreShape
  readonly registry: RegistryStoreShape
  readonly secrets: SecretsShape
  readonly http: SafeHttpShape
  readonly publisher: PublisherShape
  /** the live tail's feed of terminal outcomes, when the process has one (never waited for) */
  readonly outcomes: Option.Option<DeliveryOutcomesShape>
  /** the per-attempt subscription check (concurrent attempts share one query) */
  readonly subscriptions: FreshReader<SubscriptionKey, SubscriptionSnapshot, StoreError>
  /** the destination transform of a URL (memoised), undefined when it has none */
  readonly transformFor: (url: string) => Transform | undefined
  readonly clock: Clock.Clock
  /** recurring problems are logged at most once a minute per key */
  readonly log: RateLimitedLog
  /** wakes the claim loop */
  readonly wake: Queue.Queue<void>
  /** wakes the mover (Parking.ts) */
  readonly parkWake: Queue.Queue<void>
  /** the fibers of started rows (and rows being handed back) */
  readonly rows: FiberSet.FiberSet<void, never>
  /** forks a row's fiber into `rows` synchronously (no Effect steps in the caller) */
  readonly runInRows: (effect: Effect.Effect<void>, options?: Runtime.RunForkOptions) => Fiber.RuntimeFiber<void, never>
  /** one span per attempt (a tracer other than Effect's built-in one is installed) */
  readonly traced: boolean
}
