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
 *    SSRF-safe transport;
 * 5. classification (§4.3) and the settle. Terminal outcomes write an audit row in the same
 *    statement and are published.
 *
 * Shutdown (§6.3): the Lifecycle stop at stage `delivery` stops claiming, hands rows that have not
 * started back at once, and waits up to the grace period for running attempts; then (or when the
 * shutdown deadline interrupts it) running attempts are interrupted and their rows stay leased until
 * the lease expires and another worker reclaims them.
 *
 * Time comes from Effect's `Clock`, jitter from its `Random`.
 */
import { USER_AGENT } from "../platform/Version.js"
import * as Os from "node:os"
import {
  Clock,
  Context,
  Deferred,
  Duration,
  Effect,
  Either,
  Fiber,
  FiberSet,
  Layer,
  Metric,
  MetricBoundaries,
  Option,
  Queue,
  Random,
  Stream
} from "effect"
import type { MetricLabel, Scope } from "effect"
import { makeCircuitBreaker } from "./CircuitBreaker.js"
import * as FreshReader from "./FreshReader.js"
import { classifyStatus, type FailureKind, isRetryable, parseRetryAfter } from "./Classify.js"
import { type DeliveryInput, Destinations } from "./Destinations.js"
import { nextDelay, type RetryConfig } from "./RetryPolicy.js"
import { FirehookConfig } from "../platform/Config.js"
import {
  type AttemptRecord,
  type ClaimedRow,
  type DeliveryCounts,
  DeliveryStore,
  excerpt,
  originKey,
  STATEMENT_TIMEOUT,
  type SubscriptionKey,
  type SubscriptionSnapshot
} from "./DeliveryStore.js"
import { Health } from "../platform/Health.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import { labelledCounter } from "../platform/Metrics.js"
import { type AuditEvent, Publisher } from "./Publisher.js"
import { Registry } from "../registry/Registry.js"
import { RegistryStore } from "../registry/RegistryStore.js"
import { SafeHttp, type SafeHttpErrorKind } from "../platform/http/SafeHttp.js"
import { Secrets } from "./Secrets.js"
import type { StoreError } from "../platform/Persistence.js"

// ---------------------------------------------------------------------------------------------
// Constants

/** `User-Agent` of every request. */
/** Response bytes read at most (SPEC §4.5); more is `response_too_large`. */
export const MAX_RESPONSE_BYTES = 64 * 1024
/** Lease floor and margin over the request timeout (SPEC §4.1). */
export const MIN_LEASE_MS = 60_000
export const LEASE_MARGIN_MS = 5_000
/** Poll fallback when no notification arrives. */
export const DEFAULT_POLL_INTERVAL_MS = 1_000
/** Owner under reconciliation: come back this much later (plus jitter), no attempt spent. */
export const DEFAULT_SCANNING_DEFER_MS = 5_000
/** Random extra delay added to deferrals, so deferred rows do not come back in one burst. */
export const DEFER_JITTER_MS = 1_000
/** Shortest deferral while an origin's circuit is open or its probe is outstanding. */
export const CIRCUIT_MIN_DEFER_MS = 1_000
/**
 * Attempts starting within this long of their claim trust the claim's subscription snapshot. 0 (the
 * default): every attempt reads the subscription when it starts (SPEC §4.2 step 1).
 */
export const DEFAULT_SNAPSHOT_MAX_AGE_MS = 0
/** Subscriptions read by one per-attempt check query at most. */
export const SUBSCRIPTION_READ_MAX = 256
/** Rows held per process = HOLD_FACTOR × concurrency (in flight + prefetch + settling). */
export const HOLD_FACTOR = 4
/** Rows of one origin held per process = ORIGIN_HOLD_FACTOR × perOriginConcurrency. */
export const ORIGIN_HOLD_FACTOR = 8
/** Largest claim. */
export const CLAIM_BATCH_MAX = 256
/** Minimum time between two claims when the previous one was not full. */
export const MIN_CLAIM_GAP_MS = 10
/** Handing a row back (stop, interruption before it started) is abandoned after this long. */
export const RELEASE_TIMEOUT = Duration.seconds(2)
/** Leases renewed per heartbeat statement. */
export const HEARTBEAT_CHUNK = 1_000
/** Repeated problems (claim, listen, settle failures) are logged at most this often per kind. */
export const LOG_EVERY_MS = 60_000
/** URLs whose destination transform is memoised by one worker. */
export const TRANSFORM_CACHE_MAX = 4096
/** LISTEN is confirmed by notifying ourselves up to this many times, this often. */
export const LISTEN_PROBE_TRIES = 50
export const LISTEN_PROBE_EVERY = Duration.millis(100)

// ---------------------------------------------------------------------------------------------
// Metrics

const ATTEMPTS_TOTAL = "firehook_delivery_attempts_total"
const ATTEMPTS_TOTAL_OPTIONS = {
  description: "Delivery attempts, by outcome (delivered, retry, dead_letter, skipped) and failure kind",
  incremental: true
}
const NOT_ATTEMPTED_TOTAL = "firehook_delivery_not_attempted_total"
const NOT_ATTEMPTED_TOTAL_OPTIONS = {
  description:
    "Claimed rows settled without an attempt, by reason (subscription_changed, owner_scanning, circuit_open, lease_lost, released)",
  incremental: true
}
const latencyBoundaries = MetricBoundaries.exponential({ start: 1, factor: 2, count: 22 })
const firstAttemptLatency = Metric.histogram(
  "firehook_delivery_first_attempt_latency_ms",
  latencyBoundaries,
  "Time from enqueue to the first request of a delivery, ms"
)
const attemptDuration = Metric.histogram(
  "firehook_delivery_attempt_duration_ms",
  latencyBoundaries,
  "Duration of one delivery request (connect to response), ms"
)
const inFlightGauge = Metric.gauge("firehook_delivery_in_flight", { description: "Delivery attempts in flight" })
const openCircuitsGauge = Metric.gauge("firehook_delivery_open_circuits", {
  description: "URL origins whose circuit breaker is open or half-open"
})

/**
 * Metric updates on the delivery path are synchronous `unsafeUpdate`s inside the worker's own steps
 * (each `Metric.update` is two or three more Effect steps per call, per delivery). No metric here is
 * updated with fiber-local labels (`Effect.labelMetrics` is not used by firehook).
 */
const NO_TAGS: ReadonlyArray<MetricLabel.MetricLabel> = []

/** Effect's default tracer (the one a program has when it installs none). */
const BUILT_IN_TRACER = Effect.runSync(Effect.tracer)

// labelled counters, made once per label set (a bounded set: outcomes × failure kinds)
const taggedAttempts = new Map<string, Metric.Metric.Counter<number>>()
const countAttempt = (outcome: AttemptRecord["outcome"], kind: string) => {
  const key = `${outcome}/${kind}`
  let counter = taggedAttempts.get(key)
  if (counter === undefined) {
    counter = labelledCounter(ATTEMPTS_TOTAL, ATTEMPTS_TOTAL_OPTIONS, { outcome, kind })
    taggedAttempts.set(key, counter)
  }
  counter.unsafeUpdate(1, NO_TAGS)
}
const taggedNotAttempted = new Map<string, Metric.Metric.Counter<number>>()
const countNotAttempted = (reason: string) => {
  let counter = taggedNotAttempted.get(reason)
  if (counter === undefined) {
    counter = labelledCounter(NOT_ATTEMPTED_TOTAL, NOT_ATTEMPTED_TOTAL_OPTIONS, { reason })
    taggedNotAttempted.set(reason, counter)
  }
  counter.unsafeUpdate(1, NO_TAGS)
}

// ---------------------------------------------------------------------------------------------
// Service

export interface DeliveryOptions {
  /** Lease length; default max(60 s, timeout + 5 s). Tests shorten it. */
  readonly leaseMs?: number
  /** Poll fallback interval; default 1 s. */
  readonly pollIntervalMs?: number
  /** How long a stop waits for running attempts; default timeout + 5 s (bounded by the shutdown deadline). */
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

export interface DeliveryStats {
  readonly workerId: string
  /** LISTEN is established (a notification has been received on the current connection) */
  readonly listening: boolean
  readonly stopping: boolean
  /** rows claimed and not yet settled (in flight + waiting for a permit) */
  readonly held: number
  readonly inFlight: number
  readonly openCircuits: number
  readonly claims: number
  /** total time spent in claim statements, ms */
  readonly claimMs: number
  /** requests sent */
  readonly attempts: number
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

type Kind = FailureKind | "payload_missing" | "internal"

const retryableKind = (kind: Kind): boolean =>
  kind === "payload_missing" ? false : kind === "internal" ? true : isRetryable(kind)

/** Transport failures that say the origin is unhealthy (they feed the circuit breaker). */
const TRANSIENT_TRANSPORT: ReadonlySet<SafeHttpErrorKind> = new Set(["dns", "timeout", "network"])

interface RowEntry {
  readonly row: ClaimedRow
  readonly claimedAtMs: number
  readonly slot: OriginSlot
  /** last successful lease renewal (the claim counts as one) */
  renewedAt: number
  /** has a request slot and runs the attempt (so an interruption must not hand the row back) */
  started: boolean
  /** settling (or given up): the heartbeat no longer renews it */
  settling: boolean
  fiber: Fiber.RuntimeFiber<void, never> | undefined
}

interface OriginSlot {
  /** rows of the origin held (waiting or started) */
  held: number
  /** rows of the origin holding a request slot (≤ perOriginConcurrency) */
  active: number
}

/** The first key of a canonical body that has a `cid` (keys are sorted, `cid` sorts first). */
const CANONICAL_CID = /^\{"cid":"([^"\\]*)"/
/** The last key of every canonical body (`timestamp` sorts after every other top-level key). */
const CANONICAL_TIMESTAMP = /"timestamp":"([^"\\]*)"\}$/

/**
 * cid and source time from the stored canonical body (for destination transforms). The canonical
 * form (SPEC §3.5: keys sorted recursively) puts `cid` first and `timestamp` last, so both are read
 * from the ends of the body without parsing it (a body can be 512 KiB); anything else is parsed.
 */
export const eventMeta = (body: string): { readonly cid: string | undefined; readonly timestamp: string } => {
  const ts = CANONICAL_TIMESTAMP.exec(body.length > 256 ? body.slice(-256) : body)
  if (ts !== null) {
    const cid = body.startsWith('{"cid":') ? CANONICAL_CID.exec(body.slice(0, 256)) : null
    if (cid !== null || !body.startsWith('{"cid":')) return { cid: cid?.[1], timestamp: ts[1] ?? "" }
  }
  const parsed = Either.try(() => JSON.parse(body) as unknown)
  if (Either.isLeft(parsed) || typeof parsed.right !== "object" || parsed.right === null) {
    return { cid: undefined, timestamp: "" }
  }
  const cid: unknown = Reflect.get(parsed.right, "cid")
  const timestamp: unknown = Reflect.get(parsed.right, "timestamp")
  return {
    cid: typeof cid === "string" ? cid : undefined,
    timestamp: typeof timestamp === "string" ? timestamp : ""
  }
}

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
  Effect.gen(function* () {
    const config = yield* FirehookConfig
    const store = yield* DeliveryStore
    const registry = yield* RegistryStore
    // the in-memory registry of this process, when it has one (the service does; a worker embedded
    // on its own may not): a 410 drops the registration from matching as well as marking it gone
    const memoryRegistry = yield* Effect.serviceOption(Registry)
    const secrets = yield* Secrets
    const http = yield* SafeHttp
    const destinations = yield* Destinations
    // The transform of a URL (presets are chosen by URL, SPEC §4.4), memoised per URL string (a
    // bounded map, emptied when full): a busy subscription's URL is not parsed on every attempt.
    const transforms = new Map<string, ReturnType<typeof destinations.resolve> | null>()
    const transformFor = (url: string) => {
      const known = transforms.get(url)
      if (known !== undefined) return known ?? undefined
      const made = URL.canParse(url) ? destinations.resolve(new URL(url)) : null
      if (transforms.size >= TRANSFORM_CACHE_MAX) transforms.clear()
      transforms.set(url, made)
      return made ?? undefined
    }
    const publisher = yield* Publisher
    const health = yield* Health
    const lifecycle = yield* Lifecycle

    const d = config.delivery
    const workerId = options.workerId ?? (yield* defaultWorkerId)
    const leaseMs = Math.max(1, Math.floor(options.leaseMs ?? Math.max(MIN_LEASE_MS, d.timeoutMs + LEASE_MARGIN_MS)))
    const pollIntervalMs = Math.max(1, Math.floor(options.pollIntervalMs ?? DEFAULT_POLL_INTERVAL_MS))
    const graceMs = Math.max(0, Math.floor(options.graceMs ?? d.timeoutMs + LEASE_MARGIN_MS))
    const scanningDeferMs = Math.max(0, Math.floor(options.scanningDeferMs ?? DEFAULT_SCANNING_DEFER_MS))
    const snapshotMaxAgeMs = Math.floor(options.snapshotMaxAgeMs ?? DEFAULT_SNAPSHOT_MAX_AGE_MS)
    // the per-attempt subscription check: concurrent attempts share one query, and each is answered
    // by a query that started after the attempt did (so it sees every change committed before)
    const subscriptions = yield* FreshReader.make<SubscriptionKey, SubscriptionSnapshot, StoreError>({
      lookup: store.subscriptions,
      keyOf: (k) => `${k.ownerDid} ${k.rkey}`,
      maxBatch: SUBSCRIPTION_READ_MAX
    })
    const concurrency = d.concurrency
    const perOrigin = d.perOriginConcurrency
    const maxHeld = HOLD_FACTOR * concurrency
    const perOriginHold = ORIGIN_HOLD_FACTOR * perOrigin
    // while every request slot is busy, claim only in batches of at least a quarter of the hold
    const minBatch = Math.max(1, Math.floor(maxHeld / 4))
    const retryConfig: RetryConfig = { baseMs: d.retryBaseMs, maxMs: d.retryMaxMs, maxAttempts: d.maxAttempts }
    const breaker = makeCircuitBreaker({ threshold: d.circuitThreshold, cooldownMs: d.circuitCooldownMs })

    const wake = yield* Queue.sliding<void>(1)
    const rows = yield* FiberSet.make<void, never>()
    // forks a row's fiber into `rows` synchronously (no Effect steps in the caller)
    const runInRows = yield* FiberSet.runtime(rows)<never>()
    const listened = yield* Deferred.make<void>()
    const stopped = yield* Deferred.make<void>()

    // Mutable worker state. Fibers run one at a time on the JS thread and every mutation below is a
    // synchronous step, so no update can interleave with another.
    const state = {
      stopping: false,
      stopStarted: false,
      /** a claim statement is running (stop lets it finish so its rows can be handed back) */
      claiming: false,
      held: 0,
      inFlight: 0,
      notified: false,
      freed: false,
      listening: false,
      claims: 0,
      claimMs: 0,
      attempts: 0
    }
    const origins = new Map<string, OriginSlot>()
    const entries = new Map<string, RowEntry>()
    /** held rows not started yet, in claim order */
    const waiting: Array<RowEntry> = []
    const lastLogged = new Map<string, number>()

    /** Log a recurring problem at most once a minute per key (kind and code only, never values). */
    const logRateLimited = (key: string, message: string, annotations: Record<string, string | number>) =>
      Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const last = lastLogged.get(key)
        if (last !== undefined && now - last < LOG_EVERY_MS) return
        if (lastLogged.size > 64) lastLogged.clear()
        lastLogged.set(key, now)
        yield* Effect.logWarning(message).pipe(Effect.annotateLogs(annotations))
      })

    const logStoreError = (e: StoreError) =>
      logRateLimited(`store:${e.op}`, "delivery store operation failed", { op: e.op, code: e.code })

    const signal = Queue.offer(wake, undefined)
    const clock = yield* Effect.clock
    const setInFlight = (): void => inFlightGauge.unsafeUpdate(state.inFlight, NO_TAGS)
    const updateOpenCircuits = (): void =>
      openCircuitsGauge.unsafeUpdate(breaker.openCount(clock.unsafeCurrentTimeMillis()), NO_TAGS)
    const jitter = (max: number) => Random.nextIntBetween(0, Math.max(1, max))

    // -------------------------------------------------------------------------------------------
    // Settling

    const publish = (row: ClaimedRow, status: AuditEvent["status"], httpStatus: number | undefined, errorKind: string | undefined) =>
      Effect.suspend(() =>
        publisher.publish({
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
          time: new Date(clock.unsafeCurrentTimeMillis()).toISOString()
        })
      )

    /** Run a guarded settle; a store failure leaves the row leased (reclaimed after the lease). */
    const guarded = (eff: Effect.Effect<boolean, StoreError>) =>
      eff.pipe(
        Effect.catchAll((e) => Effect.as(logStoreError(e), false))
      )

    const deferRow = (row: ClaimedRow, delayMs: number, reason: string) =>
      Effect.gen(function* () {
        yield* guarded(store.defer(row.deliveryId, row.leaseToken, delayMs))
        countNotAttempted(reason)
      })

    const cancelRow = (row: ClaimedRow, reason: string) =>
      Effect.gen(function* () {
        const applied = yield* guarded(store.cancel(row.deliveryId, row.leaseToken, reason))
        countNotAttempted(reason)
        if (applied) yield* publish(row, "cancelled", undefined, reason)
      })

    const delivered = (
      row: ClaimedRow,
      httpStatus: number | undefined,
      attempt: AttemptRecord
    ) =>
      Effect.flatMap(
        guarded(store.markDelivered(row.deliveryId, row.leaseToken, { attemptCount: row.attemptCount + 1, httpStatus, attempt })),
        (applied) => {
          countAttempt(attempt.outcome, "none")
          return applied ? publish(row, "delivered", httpStatus, undefined) : Effect.void
        }
      )

    /** A failed attempt: reschedule with backoff while retryable and within budget, else dead-letter. */
    const failed = (
      row: ClaimedRow,
      kind: Kind,
      httpStatus: number | undefined,
      retryAfterMs: number | undefined,
      timing: { readonly startedAtMs: number; readonly durationMs: number },
      responseExcerpt: string | undefined
    ) =>
      Effect.gen(function* () {
        const attemptCount = row.attemptCount + 1
        const delay = retryableKind(kind) ? yield* nextDelay(retryConfig, attemptCount, retryAfterMs) : Option.none()
        const record = (outcome: AttemptRecord["outcome"]): AttemptRecord => ({
          startedAtMs: timing.startedAtMs,
          durationMs: timing.durationMs,
          outcome,
          errorKind: kind,
          httpStatus,
          responseExcerpt
        })
        if (Option.isSome(delay)) {
          yield* guarded(
            store.reschedule(row.deliveryId, row.leaseToken, {
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
          store.deadLetter(row.deliveryId, row.leaseToken, {
            attemptCount,
            errorKind: kind,
            httpStatus,
            attempt: record("dead_letter")
          })
        )
        countAttempt("dead_letter", kind)
        if (applied) yield* publish(row, "dead_letter", httpStatus, kind)
        return applied
      })

    // -------------------------------------------------------------------------------------------
    // One attempt (§4.2). It runs while holding the permits and answers its settlement, which the
    // caller runs after releasing them: a slow database never holds a request slot.

    const settleWith = (eff: Effect.Effect<unknown>): Effect.Effect<void> => Effect.asVoid(eff)

    // One span per attempt (like `Effect.fn("Delivery.attempt")`, without its per-call stack
    // capture) when a tracer has been installed (an embedder's OpenTelemetry layer, say). With
    // Effect's built-in tracer nothing reads the spans, and one costs about 30 Effect steps per
    // attempt (a third of an attempt's steps, measured): it is skipped.
    const traced = (yield* Effect.tracer) !== BUILT_IN_TRACER
    const attempt = (row: ClaimedRow, claimedAtMs: number, guard: { settling: boolean }) =>
      traced
        ? Effect.withSpan(attemptBody(row, claimedAtMs, guard), "Delivery.attempt", { captureStackTrace: false })
        : attemptBody(row, claimedAtMs, guard)

    const attemptBody = (row: ClaimedRow, claimedAtMs: number, guard: { settling: boolean }) => Effect.gen(function* () {
      const startedAtMs = clock.unsafeCurrentTimeMillis()
      const elapsed = Effect.sync(() => ({ startedAtMs, durationMs: Math.max(0, clock.unsafeCurrentTimeMillis() - startedAtMs) }))

      // 1. the current subscription, read by a query that starts after this attempt did (shared
      //    with the attempts starting at the same time); the claim statement's copy only when the
      //    options allow trusting it for a while
      let sub: SubscriptionSnapshot
      if (startedAtMs - claimedAtMs < snapshotMaxAgeMs) {
        sub = row.snapshot
      } else {
        const current = yield* Effect.either(subscriptions.get({ ownerDid: row.ownerDid, rkey: row.webhookRkey }))
        if (Either.isLeft(current)) {
          yield* logStoreError(current.left)
          guard.settling = true
          return settleWith(failed(row, "subscription_unavailable", undefined, undefined, yield* elapsed, undefined))
        }
        sub = current.right
      }
      if (sub.ownerStatus === "scanning") {
        guard.settling = true
        return settleWith(deferRow(row, scanningDeferMs + (yield* jitter(DEFER_JITTER_MS)), "owner_scanning"))
      }
      if (
        !sub.exists ||
        !sub.active ||
        !sub.enabled ||
        sub.gone ||
        sub.url !== row.targetUrl ||
        sub.fingerprint !== row.fingerprint
      ) {
        guard.settling = true
        return settleWith(cancelRow(row, "subscription_changed"))
      }
      if (row.body === undefined) {
        guard.settling = true
        return settleWith(failed(row, "payload_missing", undefined, undefined, yield* elapsed, undefined))
      }
      const body = row.body

      // 2. the secret (never send unsigned when the subscription has one)
      let secret: string | undefined = undefined
      if (sub.signingMode === "record_secret") {
        secret = sub.recordSecret
      } else if (sub.signingMode === "secret_id") {
        const name = sub.secretId
        const resolved = name === undefined ? undefined : yield* Effect.option(secrets.resolve(row.ownerDid, name))
        secret = resolved === undefined ? undefined : Option.getOrUndefined(resolved)
      }
      if (sub.signingMode !== "none" && secret === undefined) {
        guard.settling = true
        return settleWith(failed(row, "secret_unavailable", undefined, undefined, yield* elapsed, undefined))
      }

      // 3. the destination transform
      const transform = transformFor(sub.url)
      if (transform === undefined) {
        guard.settling = true
        return settleWith(failed(row, "invalid_target", undefined, undefined, yield* elapsed, undefined))
      }
      const meta = eventMeta(body)
      const input: DeliveryInput = {
        deliveryId: row.deliveryId,
        eventId: row.eventId,
        body,
        event: {
          did: row.eventDid,
          collection: row.eventCollection,
          rkey: row.eventRkey,
          operation: row.eventOperation,
          ...(meta.cid === undefined ? {} : { cid: meta.cid }),
          timestamp: meta.timestamp
        },
        subscription: { ownerDid: row.ownerDid, rkey: row.webhookRkey, url: sub.url, match: row.matchKind },
        secret,
        timestampSeconds: Math.floor(startedAtMs / 1000),
        userAgent: USER_AGENT
      }
      const outgoing = transform(input)
      if (Either.isLeft(outgoing)) {
        guard.settling = true
        return settleWith(failed(row, "transform_failed", undefined, undefined, yield* elapsed, undefined))
      }
      const request = outgoing.right
      if (request === null) {
        guard.settling = true
        const timing = yield* elapsed
        return settleWith(delivered(row, undefined, {
          ...timing,
          outcome: "skipped",
          errorKind: undefined,
          httpStatus: undefined,
          responseExcerpt: undefined
        }))
      }

      // the origin's circuit breaker
      const origin = originKey(request.url)
      const admission = breaker.canAttempt(origin, startedAtMs)
      if (admission === "open") {
        const openUntil = breaker.get(origin)?.openUntilMs ?? 0
        const wait = Math.max(CIRCUIT_MIN_DEFER_MS, openUntil - startedAtMs) + (yield* jitter(DEFER_JITTER_MS))
        guard.settling = true
        updateOpenCircuits()
        return settleWith(deferRow(row, wait, "circuit_open"))
      }

      // 4. send
      const sendStart = clock.unsafeCurrentTimeMillis()
      if (row.attemptCount === 0) {
        firstAttemptLatency.unsafeUpdate(row.ageMs + Math.max(0, sendStart - claimedAtMs), NO_TAGS)
      }
      state.attempts++
      const response = yield* Effect.either(
        http.request({
          url: request.url,
          method: request.method,
          headers: request.headers,
          body: request.body,
          timeoutMs: d.timeoutMs,
          maxResponseBytes: MAX_RESPONSE_BYTES
        })
      )
      const sendEnd = clock.unsafeCurrentTimeMillis()
      attemptDuration.unsafeUpdate(Math.max(0, sendEnd - sendStart), NO_TAGS)
      const timing = { startedAtMs, durationMs: Math.max(0, sendEnd - startedAtMs) }
      guard.settling = true

      // 5. classify and settle
      if (Either.isLeft(response)) {
        const kind = response.left.kind
        if (TRANSIENT_TRANSPORT.has(kind)) breaker.onTransientFailure(origin, sendEnd)
        else if (kind === "response_too_large") breaker.onSuccess(origin)
        updateOpenCircuits()
        return settleWith(failed(row, kind, undefined, undefined, timing, undefined))
      }
      const res = response.right
      const text = res.body.length > 0 ? excerpt(res.body) : undefined
      const isSuccess = request.isSuccess ?? ((s: number) => s >= 200 && s <= 299)
      if (Either.getOrElse(Either.try(() => isSuccess(res.status)), () => false)) {
        breaker.onSuccess(origin)
        updateOpenCircuits()
        return settleWith(delivered(row, res.status, {
          ...timing,
          outcome: "delivered",
          errorKind: undefined,
          httpStatus: res.status,
          responseExcerpt: text
        }))
      }
      const cls = classifyStatus(res.status)
      // a 2xx that a custom destination does not accept: permanent (retrying would only duplicate)
      const kind: FailureKind = cls.outcome === "failed" ? cls.kind : "http_4xx"
      if (kind === "http_5xx" || kind === "http_429") breaker.onTransientFailure(origin, sendEnd)
      else breaker.onSuccess(origin)
      updateOpenCircuits()
      const retryAfter = kind === "http_5xx" || kind === "http_429" ? parseRetryAfter(res.headers["retry-after"], sendEnd) : undefined
      return settleWith(
        Effect.flatMap(failed(row, kind, res.status, retryAfter, timing, text), (dead) =>
          dead && kind === "gone"
            ? registry.markGone(row.ownerDid, row.webhookRkey, row.fingerprint).pipe(
              Effect.flatMap((marked) =>
                marked && Option.isSome(memoryRegistry)
                  ? memoryRegistry.value.forgetGone(row.ownerDid, row.webhookRkey, row.fingerprint)
                  : Effect.void
              ),
              Effect.catchAll(logStoreError)
            )
            : Effect.void
        )
      )
    })

    /** An unexpected defect in the attempt spends an attempt (`internal`), so a bug cannot loop forever. */
    const attemptSafe = (row: ClaimedRow, claimedAtMs: number, guard: { settling: boolean }) =>
      attempt(row, claimedAtMs, guard).pipe(
        Effect.catchAllDefect(() =>
          Effect.gen(function* () {
            yield* logRateLimited("defect", "delivery attempt failed unexpectedly", { deliveryId: row.deliveryId })
            guard.settling = true
            const now = yield* Clock.currentTimeMillis
            return settleWith(failed(row, "internal", undefined, undefined, { startedAtMs: now, durationMs: 0 }, undefined))
          })
        )
      )

    // -------------------------------------------------------------------------------------------
    // One claimed row: permits, attempt

    const release = (row: ClaimedRow) =>
      store.defer(row.deliveryId, row.leaseToken, 0).pipe(
        Effect.timeout(RELEASE_TIMEOUT),
        Effect.zipRight(Effect.sync(() => countNotAttempted("released"))),
        Effect.ignore
      )

    /** The row is no longer held (settled, handed back or given up). */
    const forgetNow = (entry: RowEntry): void => {
      const slot = entry.slot
      entries.delete(entry.row.leaseToken)
      state.held--
      slot.held--
      if (slot.held <= 0) origins.delete(entry.row.origin)
      state.freed = true
      wake.unsafeOffer(undefined)
    }
    const forget = (entry: RowEntry) => Effect.sync(() => forgetNow(entry))

    /** A started row: the attempt holds a request slot; the settlement runs after it is freed. */
    const runRow = (entry: RowEntry): Effect.Effect<void> => {
      const row = entry.row
      let holding = true
      /** Gives the request slot back (once) and starts the next waiting rows. */
      const freeSlot = (): void => {
        if (!holding) return
        holding = false
        state.inFlight--
        entry.slot.active--
        setInFlight()
        pumpNow()
      }
      return attemptSafe(row, entry.claimedAtMs, entry).pipe(
        // the settlement runs after the request slot is freed
        Effect.flatMap((settlement) => {
          freeSlot()
          return settlement
        }),
        Effect.catchAllDefect(() =>
          logRateLimited("defect", "delivery settlement failed unexpectedly", { deliveryId: row.deliveryId })
        ),
        // however it ended (interrupted when its lease was lost, or at shutdown): not held any more
        Effect.onExit(() =>
          Effect.sync(() => {
            forgetNow(entry)
            freeSlot()
          })
        )
      )
    }

    /**
     * Starts waiting rows while request slots are free: the first waiting row (claim order) whose
     * origin is under its cap. Admission is synchronous bookkeeping (no semaphore, and no fiber for
     * a row until it starts), so a held row costs nothing while it waits.
     */
    const pumpNow = (): void => {
      if (state.stopping || waiting.length === 0 || state.inFlight >= concurrency) return
      let started = false
      let i = 0
      while (state.inFlight < concurrency && i < waiting.length) {
        const entry = waiting[i]
        if (entry === undefined) break
        if (entry.slot.active >= perOrigin) {
          i++
          continue
        }
        waiting.splice(i, 1)
        entry.started = true
        entry.slot.active++
        state.inFlight++
        started = true
        // scheduled like a fork (not run inside this loop, which it could re-enter)
        entry.fiber = runInRows(runRow(entry), { immediate: false })
      }
      if (started) setInFlight()
    }
    const pump: Effect.Effect<void> = Effect.sync(pumpNow)

    /** Hands back rows that have not started (stop, scope close). */
    const releaseWaiting = Effect.suspend(() => {
      const back = waiting.splice(0, waiting.length)
      for (const e of back) e.settling = true
      return Effect.forEach(back, (e) => Effect.ensuring(release(e.row), forget(e)), {
        concurrency: "unbounded",
        discard: true
      })
    })

    const dispatch = (row: ClaimedRow, claimedAtMs: number): void => {
      let slot = origins.get(row.origin)
      if (slot === undefined) {
        slot = { held: 0, active: 0 }
        origins.set(row.origin, slot)
      }
      slot.held++
      state.held++
      const entry: RowEntry = {
        row,
        claimedAtMs,
        slot,
        renewedAt: claimedAtMs,
        started: false,
        settling: false,
        fiber: undefined
      }
      entries.set(row.leaseToken, entry)
      waiting.push(entry)
    }

    // -------------------------------------------------------------------------------------------
    // Leases: one heartbeat fiber renews every held row (in flight or waiting) every lease/3, in
    // one statement per chunk. A row whose lease is gone, or that could not be renewed for 2/3 of a
    // lease, has its attempt interrupted (the row is someone else's now, or soon will be).

    const leaseLost = (entry: RowEntry) =>
      Effect.gen(function* () {
        if (entry.settling) return
        if (entry.started && entry.fiber === undefined) return
        entry.settling = true
        countNotAttempted("lease_lost")
        yield* logRateLimited("lease_lost", "delivery lease lost; attempt abandoned", {
          deliveryId: entry.row.deliveryId
        })
        if (entry.fiber !== undefined) {
          yield* Fiber.interruptFork(entry.fiber)
          return
        }
        // not started: stop waiting; hand it back in case the lease is still ours (renewals failed)
        const at = waiting.indexOf(entry)
        if (at >= 0) waiting.splice(at, 1)
        // in the worker's row set (owned by its scope, like every attempt), not a daemon fiber
        yield* FiberSet.run(rows, Effect.ensuring(release(entry.row), forget(entry)))
      })

    const renewAll = Effect.gen(function* () {
      const held = [...entries.values()].filter((e) => !e.settling)
      for (let i = 0; i < held.length; i += HEARTBEAT_CHUNK) {
        const chunk = held.slice(i, i + HEARTBEAT_CHUNK)
        const result = yield* Effect.either(
          store.heartbeatMany(chunk.map((e) => ({ deliveryId: e.row.deliveryId, token: e.row.leaseToken })), leaseMs)
        )
        const now = yield* Clock.currentTimeMillis
        if (Either.isRight(result)) {
          for (const e of chunk) {
            if (result.right.has(e.row.leaseToken)) e.renewedAt = now
            else yield* leaseLost(e)
          }
        } else {
          yield* logStoreError(result.left)
          for (const e of chunk) if (now - e.renewedAt >= (2 * leaseMs) / 3) yield* leaseLost(e)
        }
      }
    })

    const heartbeatLoop = Effect.forever(
      Effect.zipRight(Effect.sleep(Duration.millis(Math.max(1, Math.floor(leaseMs / 3)))), renewAll)
    )

    const claimOptions = () => {
      const rooms: Array<{ origin: string; room: number }> = []
      const fullOrigins: Array<string> = []
      for (const [origin, slot] of origins) {
        const room = perOriginHold - slot.held
        if (room > 0) rooms.push({ origin, room })
        else fullOrigins.push(origin)
      }
      return { rooms, fullOrigins, defaultRoom: perOriginHold, withSubscriptions: snapshotMaxAgeMs > 0 }
    }

    // -------------------------------------------------------------------------------------------
    // The claim loop

    const claimLoop = Effect.gen(function* () {
      let nextPollAt = 0
      let lastClaimAt = Number.NEGATIVE_INFINITY
      let lastFull = false
      let moreDue = false
      let failures = 0
      while (!state.stopping) {
        const now = yield* Clock.currentTimeMillis
        const capacity = maxHeld - state.held
        const due = state.notified || now >= nextPollAt || lastFull || (moreDue && state.freed)
        const canClaim = capacity > 0 && (capacity >= minBatch || state.held < concurrency)
        if (due && canClaim) {
          const gap = lastFull ? 0 : lastClaimAt + MIN_CLAIM_GAP_MS - now
          if (gap > 0) {
            yield* Effect.sleep(Duration.millis(gap))
            continue
          }
          state.notified = false
          state.freed = false
          const limit = Math.min(capacity, CLAIM_BATCH_MAX)
          state.claiming = true
          const result = yield* Effect.either(store.claim(workerId, limit, leaseMs, claimOptions()))
          state.claiming = false
          const claimedAt = yield* Clock.currentTimeMillis
          state.claimMs += Math.max(0, claimedAt - now)
          state.claims++
          lastClaimAt = claimedAt
          nextPollAt = claimedAt + pollIntervalMs
          if (Either.isLeft(result)) {
            failures++
            lastFull = false
            moreDue = false
            yield* logStoreError(result.left)
            yield* Effect.sleep(Duration.millis(Math.min(5_000, 100 * 2 ** Math.min(failures, 6))))
            continue
          }
          failures = 0
          for (const row of result.right.rows) dispatch(row, claimedAt)
          yield* pump
          lastFull = result.right.rows.length >= limit
          moreDue = result.right.moreDue
          if (lastFull) continue
        }
        const after = yield* Clock.currentTimeMillis
        const wait = canClaim ? Math.max(1, nextPollAt - after) : pollIntervalMs
        yield* Queue.take(wake).pipe(Effect.timeoutOption(Duration.millis(wait)))
      }
    })

    // -------------------------------------------------------------------------------------------
    // LISTEN

    const onNotification = Effect.gen(function* () {
      state.notified = true
      if (!state.listening) {
        state.listening = true
        yield* Deferred.succeed(listened, undefined)
      }
      yield* signal
    })

    /** Notify ourselves until the first notification arrives on this LISTEN session. */
    const probe = Effect.gen(function* () {
      for (let i = 0; i < LISTEN_PROBE_TRIES && !state.listening; i++) {
        yield* store.notify.pipe(Effect.ignore)
        yield* Effect.sleep(LISTEN_PROBE_EVERY)
      }
    })

    const listenLoop = Effect.gen(function* () {
      let failures = 0
      while (!state.stopping) {
        const session = Effect.scoped(
          Effect.gen(function* () {
            yield* Effect.forkScoped(probe)
            yield* store.wakeups.pipe(Stream.runForEach(() => onNotification))
          })
        )
        const result = yield* Effect.either(session)
        // a session that had worked starts the backoff over
        failures = state.listening ? 1 : failures + 1
        state.listening = false
        if (Either.isLeft(result)) yield* logStoreError(result.left)
        yield* Effect.sleep(Duration.millis(Math.min(30_000, 250 * 2 ** Math.min(failures, 7))))
      }
    })

    // -------------------------------------------------------------------------------------------
    // Start, stop, health

    const loopFiber = yield* Effect.forkScoped(claimLoop)
    yield* Effect.forkScoped(heartbeatLoop)
    const listenFiber = options.listen === false ? undefined : yield* Effect.forkScoped(listenLoop)
    // runs first when the scope closes (before the fibers above are interrupted): nothing new
    // starts, and rows that have not started are handed back
    yield* Effect.addFinalizer(() =>
      Effect.zipRight(
        Effect.sync(() => {
          state.stopping = true
        }),
        releaseWaiting
      )
    )

    const stop: Effect.Effect<void> = Effect.suspend(() => {
      if (state.stopStarted) return Deferred.await(stopped)
      state.stopStarted = true
      return Effect.gen(function* () {
        state.stopping = true
        // a claim in progress is let finish: its rows are dispatched, see `stopping` and go back
        if (state.claiming) {
          yield* signal
          yield* Fiber.await(loopFiber).pipe(Effect.timeoutOption(Duration.sum(STATEMENT_TIMEOUT, Duration.seconds(1))))
        }
        yield* Fiber.interrupt(loopFiber)
        if (listenFiber !== undefined) yield* Fiber.interrupt(listenFiber)
        // rows waiting for a request slot go back at once
        yield* releaseWaiting
        const drained = yield* FiberSet.awaitEmpty(rows).pipe(Effect.timeoutOption(Duration.millis(graceMs)))
        if (Option.isNone(drained)) {
          yield* Effect.logWarning("delivery grace period over; interrupting running attempts").pipe(
            Effect.annotateLogs({ inFlight: state.inFlight })
          )
          yield* FiberSet.clear(rows)
        }
      }).pipe(
        // the shutdown deadline interrupts the drain: interrupt running attempts too (rows stay leased)
        Effect.onInterrupt(() => FiberSet.clear(rows)),
        Effect.ensuring(Deferred.succeed(stopped, undefined))
      )
    })

    yield* lifecycle.registerStop("delivery", "delivery", stop)

    let lastCounts: DeliveryCounts = { pending: 0, leased: 0, deadLetter: 0 }

    yield* health.register(
      "delivery",
      Effect.gen(function* () {
        // a failed count keeps the last known figures (health never fails because of the backlog)
        const counts = yield* Effect.option(store.counts)
        if (Option.isSome(counts)) lastCounts = counts.value
        const now = yield* Clock.currentTimeMillis
        const c = lastCounts
        return {
          ready: true,
          body: {
            pending: c.pending,
            leased: c.leased,
            deadLetter: c.deadLetter,
            inFlight: state.inFlight,
            openCircuits: breaker.openCount(now)
          }
        }
      })
    )

    const stats = Effect.map(Clock.currentTimeMillis, (now): DeliveryStats => ({
      workerId,
      listening: state.listening,
      stopping: state.stopping,
      held: state.held,
      inFlight: state.inFlight,
      openCircuits: breaker.openCount(now),
      claims: state.claims,
      claimMs: state.claimMs,
      attempts: state.attempts
    }))

    yield* Effect.logInfo("delivery worker started").pipe(
      Effect.annotateLogs({ concurrency, perOrigin, leaseMs, pollIntervalMs })
    )

    const shape: DeliveryShape = { workerId, stats, awaitListening: Deferred.await(listened), stop }
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
