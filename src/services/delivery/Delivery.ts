/**
 * The delivery worker (SPEC §4.1–4.3): claims due outbox rows under a lease and delivers them.
 *
 * Claiming. One loop fiber claims rows in batches through {@link DeliveryStore}. It wakes on
 * `LISTEN firehook_outbox` (a notification is sent by every enqueue transaction), on a poll timer
 * (fallback, default 1 s), at once again after a full batch, and when an attempt finishes while more
 * rows were left due. It only claims as many rows as it can hold: at most `4 × concurrency` rows per
 * process (`concurrency` in flight; the rest are a prefetch buffer, so the pool never waits for a
 * claim round trip, and rows being settled), and at most `8 × perOriginConcurrency` rows of one URL
 * origin (the claim skips the rest, so one busy origin cannot fill the pool and starve the others).
 * While a request slot is idle it always claims: once slow receivers' waiting rows fill the hold, a
 * start-only claim takes rows that start at once (origins below their cap, no more than the idle
 * slots), up to `concurrency` rows beyond the hold (Admission.claimPlan): at most `5 × concurrency`
 * rows held.
 *
 * Concurrency. Claimed rows wait in claim order; a row starts when a request slot is free
 * (`concurrency` in flight) and its origin has fewer than `perOriginConcurrency` rows in flight. The
 * admission is synchronous bookkeeping: a waiting row has no fiber and takes no semaphore; a started
 * row gets a fiber, and frees its slot before it is settled, so a slow database never holds a
 * request slot. Origin slots live in a map that holds only origins with claimed rows, so it is
 * bounded by the number of held rows.
 *
 * Leases. Lease = max(60 s, timeout + 5 s) (an option overrides it). From the claim on, one heartbeat
 * fiber renews the leases of all held rows every lease/3 (one statement per 1,000 rows); a renewal
 * that finds a lease gone (or that could not reach the database for 2/3 of a lease) interrupts that
 * row's attempt. Every write is guarded by the lease token.
 *
 * One attempt (§4.2):
 * 1. the subscription, read when the attempt starts by a query that started after it (attempts
 *    starting together share one query: {@link FreshReader}), so a change committed before the
 *    attempt starts is always seen (the claim's copy is used only if `snapshotMaxAgeMs` says so).
 *    Owner `scanning` → defer without
 *    spending an attempt; missing, inactive, gone, URL or fingerprint changed → `cancelled`
 *    (`subscription_changed`), no request; database error → transient `subscription_unavailable`;
 * 2. the secret (inline, or the server-managed one; failure → transient `secret_unavailable`,
 *    never sent unsigned);
 * 3. the destination transform (`null` → delivered without a request; failure → `transform_failed`);
 * 4. the origin's circuit breaker (open → defer without an attempt; half-open → one probe), then the
 *    SSRF-safe transport. While an origin's circuit is open, the mover (Parking.ts) moves its
 *    pending rows to the end of the cool-down in bulk and the claim skips it, so an open origin's
 *    backlog costs the other origins nothing;
 * 5. classification (§4.3) and the settle. Terminal outcomes write an audit row in the same
 *    statement and are published.
 *
 * Crash suspects (Suspects.ts): a row reclaimed from an expired lease is counted before its request;
 * at its first reclaim it runs at full concurrency, counted before it runs alone; one that was in
 * flight in three deaths of its worker is dead-lettered (`crashed`), not sent.
 *
 * Shutdown (§6.3): the Lifecycle stop at stage `delivery` stops claiming, hands rows that have not
 * started back at once, and waits up to the grace period for running attempts; then (or when the
 * shutdown deadline interrupts it) running attempts are interrupted and their rows stay leased until
 * the lease expires and another worker reclaims them.
 *
 * Time comes from Effect's `Clock`, jitter from its `Random`.
 *
 * This module holds the service (Tag, shape, `make`, layer); `make` composes the parts, each a module
 * of its own: Worker (claim loop, LISTEN, stop, health), Admission (origin slots, dispatch), Leases
 * (renewal, loss), Attempt (the decision answering a Settlement, and the send), Settlement (the
 * settle path), over the state and settings of WorkerState; Telemetry holds the metrics and logs.
 */
import { Context, Deferred, Effect, FiberSet, Layer, Queue, Random } from "effect"
import type { Scope } from "effect"
import * as Os from "node:os"
import { FirehookConfig } from "../platform/Config.js"
import { Health } from "../platform/Health.js"
import { SafeHttp } from "../platform/http/SafeHttp.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import type { StoreError } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { RegistryStore } from "../registry/RegistryStore.js"
import { HOLD_FACTOR, ORIGIN_HOLD_FACTOR } from "./Admission.js"
import { memoTransforms } from "./Attempt.js"
import { defaultCircuitBreakerConfig, makeCircuitBreaker } from "./CircuitBreaker.js"
import { DeliveryOutcomes } from "./DeliveryOutcomes.js"
import { DeliveryStore, type SubscriptionKey, type SubscriptionSnapshot } from "./DeliveryStore.js"
import { Destinations } from "./Destinations.js"
import * as FreshReader from "./FreshReader.js"
import { LEASE_MARGIN_MS, MIN_LEASE_MS } from "./Leases.js"
import { Publisher } from "./Publisher.js"
import { Secrets } from "./Secrets.js"
import * as Worker from "./Worker.js"
import type { DeliveryStats } from "./Worker.js"
import { makeState, type WorkerEnv } from "./WorkerState.js"

export { HOLD_FACTOR, ORIGIN_HOLD_FACTOR, RELEASE_TIMEOUT } from "./Admission.js"
export { CIRCUIT_MIN_DEFER_MS, DEFER_JITTER_MS, eventMeta, MAX_RESPONSE_BYTES, TRANSFORM_CACHE_MAX } from "./Attempt.js"
export { HEARTBEAT_CHUNK, LEASE_MARGIN_MS, MIN_LEASE_MS } from "./Leases.js"
export {
  CLAIM_BATCH_MAX,
  DEFAULT_POLL_INTERVAL_MS,
  type DeliveryStats,
  LISTEN_PROBE_EVERY,
  LISTEN_PROBE_TRIES,
  MIN_CLAIM_GAP_MS
} from "./Worker.js"

// ---------------------------------------------------------------------------------------------
// Constants

/** Owner under reconciliation: come back this much later (plus jitter), no attempt spent. */
export const DEFAULT_SCANNING_DEFER_MS = 5_000
/**
 * Attempts starting within this long of their claim trust the claim's subscription snapshot. 0 (the
 * default): every attempt reads the subscription when it starts (SPEC §4.2 step 1).
 */
export const DEFAULT_SNAPSHOT_MAX_AGE_MS = 0
/** Subscriptions read by one per-attempt check query at most. */
export const SUBSCRIPTION_READ_MAX = 256
/** Repeated problems (claim, listen, settle failures) are logged at most this often per kind. */
export const LOG_EVERY_MS = 60_000

/** Effect's default tracer (the one a program has when it installs none). */
const BUILT_IN_TRACER = Effect.runSync(Effect.tracer)

// ---------------------------------------------------------------------------------------------
// Service

export interface DeliveryOptions {
  /** Lease length; default max(60 s, timeout + 5 s). Tests shorten it. */
  readonly leaseMs?: number
  /** Poll fallback interval; default 1 s. */
  readonly pollIntervalMs?: number
  /**
   * How long a stop waits for running attempts; default timeout + 5 s (ending before the shutdown
   * deadline at the latest: `Worker.stopReserveMs`).
   */
  readonly graceMs?: number
  /** Default `<hostname>:<pid>:<random hex>`. */
  readonly workerId?: string
  /** Deferral while the owner is being reconciled; default 5 s (+ jitter). */
  readonly scanningDeferMs?: number
  /** Wake on LISTEN/NOTIFY (default true); false = polling only. */
  readonly listen?: boolean
  /**
   * An attempt that starts within this long of its claim uses the subscription state the claim
   * statement read (a change made after the claim is then seen only by a later attempt); any other
   * attempt reads it when it starts, in a query shared with the attempts starting at the same time.
   * Default 0: every attempt reads it.
   */
  readonly snapshotMaxAgeMs?: number
}

export interface DeliveryShape {
  readonly workerId: string
  readonly stats: Effect.Effect<DeliveryStats>
  /** Completes once LISTEN has been confirmed (never when `listen: false`). */
  readonly awaitListening: Effect.Effect<void>
  /** Stop claiming, hand back rows not started, wait the grace period, interrupt the rest. Idempotent. */
  readonly stop: Effect.Effect<void>
}

export class Delivery extends Context.Tag("firehook/Delivery")<Delivery, DeliveryShape>() {}

const defaultWorkerId = Effect.map(Random.nextIntBetween(0, 0x7fffffff), (n) => {
  const host = Os.hostname().replace(/[^A-Za-z0-9._-]/g, "_").slice(0, 64)
  return `${host.length > 0 ? host : "host"}:${process.pid}:${n.toString(16).padStart(8, "0")}`
})

/**
 * The worker, for the lifetime of the calling scope. Registers the `delivery` health section and
 * the Lifecycle stop at stage `delivery`.
 */
export const make = (
  options: DeliveryOptions = {}
): Effect.Effect<
  DeliveryShape,
  never,
  | Scope.Scope
  | FirehookConfig
  | DeliveryStore
  | RegistryStore
  | Secrets
  | SafeHttp
  | Destinations
  | Publisher
  | Health
  | Lifecycle
> =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const store = yield* DeliveryStore
    const destinations = yield* Destinations
    const health = yield* Health
    const lifecycle = yield* Lifecycle

    const d = config.delivery
    const workerId = options.workerId ?? (yield* defaultWorkerId)
    const leaseMs = Math.max(1, Math.floor(options.leaseMs ?? Math.max(MIN_LEASE_MS, d.timeoutMs + LEASE_MARGIN_MS)))
    const pollIntervalMs = Math.max(1, Math.floor(options.pollIntervalMs ?? Worker.DEFAULT_POLL_INTERVAL_MS))
    const concurrency = d.concurrency
    const perOrigin = d.perOriginConcurrency
    const maxHeld = HOLD_FACTOR * concurrency
    // the per-attempt subscription check: concurrent attempts share one query, and each is answered
    // by a query that started after the attempt did (so it sees every change committed before)
    const subscriptions = yield* FreshReader.make<SubscriptionKey, SubscriptionSnapshot, StoreError>({
      lookup: store.subscriptions,
      keyOf: (k) => `${k.ownerDid} ${k.rkey}`,
      maxBatch: SUBSCRIPTION_READ_MAX
    })
    const rows = yield* FiberSet.make<void, never>()
    const env: WorkerEnv = {
      state: makeState(),
      workerId,
      leaseMs,
      pollIntervalMs,
      graceMs: Math.max(0, Math.floor(options.graceMs ?? d.timeoutMs + LEASE_MARGIN_MS)),
      scanningDeferMs: Math.max(0, Math.floor(options.scanningDeferMs ?? DEFAULT_SCANNING_DEFER_MS)),
      snapshotMaxAgeMs: Math.floor(options.snapshotMaxAgeMs ?? DEFAULT_SNAPSHOT_MAX_AGE_MS),
      concurrency,
      perOrigin,
      maxHeld,
      perOriginHold: ORIGIN_HOLD_FACTOR * perOrigin,
      // while every request slot is busy, claim only in batches of at least a quarter of the hold
      // (Admission.claimPlan)
      minBatch: Math.max(1, Math.floor(maxHeld / 4)),
      timeoutMs: d.timeoutMs,
      retryConfig: { baseMs: d.retryBaseMs, maxMs: d.retryMaxMs, maxAttempts: d.maxAttempts },
      breaker: makeCircuitBreaker({
        threshold: d.circuitThreshold,
        cooldownMs: d.circuitCooldownMs,
        // a row waiting out its own retry delay still asks for the origin when it is due
        forgetIdleAfterMs: Math.max(defaultCircuitBreakerConfig.forgetIdleAfterMs, d.retryMaxMs)
      }),
      store,
      registry: yield* RegistryStore,
      secrets: yield* Secrets,
      http: yield* SafeHttp,
      publisher: yield* Publisher,
      outcomes: yield* Effect.serviceOption(DeliveryOutcomes),
      subscriptions,
      transformFor: memoTransforms(destinations.resolve),
      clock: yield* Effect.clock,
      log: RateLimitedLog.make({ everyMs: LOG_EVERY_MS }),
      wake: yield* Queue.sliding<void>(1),
      parkWake: yield* Queue.sliding<void>(1),
      rows,
      runInRows: yield* FiberSet.runtime(rows)<never>(),
      // One span per attempt (like `Effect.fn("Delivery.attempt")`, without its per-call stack
      // capture) when a tracer has been installed (an embedder's OpenTelemetry layer, say). With
      // Effect's built-in tracer nothing reads the spans, and each one is a large share of an
      // attempt's Effect steps: it is skipped.
      traced: (yield* Effect.tracer) !== BUILT_IN_TRACER
    }

    const listened = yield* Deferred.make<void>()
    const stop = yield* Worker.start(env, {
      listen: options.listen !== false,
      listened,
      shutdownDeadline: lifecycle.deadline,
      stopReserveMs: Worker.stopReserveMs(config.shutdownTimeoutMs)
    })
    yield* lifecycle.registerStop("delivery", "delivery", stop)
    yield* health.register("delivery", yield* Worker.healthSection(env))

    yield* Effect.logInfo("delivery worker started").pipe(
      Effect.annotateLogs({ concurrency, perOrigin, leaseMs, pollIntervalMs })
    )

    const shape: DeliveryShape = { workerId, stats: Worker.stats(env), awaitListening: Deferred.await(listened), stop }
    return shape
  })

/**
 * The delivery worker as a layer: starts with the layer, stops with the Lifecycle's `delivery`
 * stage (or when the layer's scope closes).
 *
 * Requires: FirehookConfig, DeliveryStore, RegistryStore, Secrets, SafeHttp, Destinations,
 * Publisher, Health, Lifecycle.
 */
export const layer = (
  options: DeliveryOptions = {}
): Layer.Layer<
  Delivery,
  never,
  FirehookConfig | DeliveryStore | RegistryStore | Secrets | SafeHttp | Destinations | Publisher | Health | Lifecycle
> => Layer.scoped(Delivery, make(options))
