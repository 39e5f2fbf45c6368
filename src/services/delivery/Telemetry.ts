/**
 * What the delivery worker reports: its metrics, and its recurring warnings (rate-limited).
 *
 * Metric updates on the delivery path are synchronous `unsafeUpdate`s inside the worker's own steps
 * (each `Metric.update` is two or three more Effect steps per call, per delivery). No metric here is
 * updated with fiber-local labels (`Effect.labelMetrics` is not used by firehook).
 *
 * @since 0.1.0
 */
import { Effect, Metric, MetricBoundaries } from "effect"
import type { MetricLabel } from "effect"
import { labelledCounterFamily } from "../platform/Metrics.js"
import type { StoreError } from "../platform/Persistence.js"
import type { AttemptRecord } from "./DeliveryStore.js"
import type { WorkerEnv } from "./WorkerState.js"

// ---------------------------------------------------------------------------------------------
// Metrics

const NO_TAGS: ReadonlyArray<MetricLabel.MetricLabel> = []

// labelled counters, made once per label set (a bounded set: outcomes × failure kinds)
const attemptsTotal = labelledCounterFamily("firehook_delivery_attempts_total", {
  description: "Delivery attempts, by outcome (delivered, retry, dead_letter, skipped) and failure kind",
  incremental: true
})
const notAttemptedTotal = labelledCounterFamily("firehook_delivery_not_attempted_total", {
  description:
    "Claimed rows settled without an attempt, by reason (subscription_changed, owner_scanning, circuit_open, lease_lost, released, webhook_disabled, crashed)",
  incremental: true
})

export const countAttempt = (outcome: AttemptRecord["outcome"], kind: string): void =>
  attemptsTotal({ outcome, kind }).unsafeUpdate(1, NO_TAGS)

export const countNotAttempted = (reason: string): void => notAttemptedTotal({ reason }).unsafeUpdate(1, NO_TAGS)

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

export const recordFirstAttemptLatency = (ms: number): void => firstAttemptLatency.unsafeUpdate(ms, NO_TAGS)
export const recordAttemptDuration = (ms: number): void => attemptDuration.unsafeUpdate(ms, NO_TAGS)
export const setInFlight = (env: WorkerEnv): void => inFlightGauge.unsafeUpdate(env.state.inFlight, NO_TAGS)
export const updateOpenCircuits = (env: WorkerEnv): void =>
  setOpenCircuits(env.breaker.openCount(env.clock.unsafeCurrentTimeMillis()))
export const setOpenCircuits = (n: number): void => openCircuitsGauge.unsafeUpdate(n, NO_TAGS)

// ---------------------------------------------------------------------------------------------
// Recurring warnings

/** Log a recurring problem at most once a minute per key (kind and code only, never values). */
export const logRecurring = (
  env: Pick<WorkerEnv, "log">,
  key: string,
  message: string,
  annotations: Record<string, string | number>
): Effect.Effect<void> => env.log.run(key, () => Effect.logWarning(message).pipe(Effect.annotateLogs(annotations)))

export const logStoreError = (env: Pick<WorkerEnv, "log">, e: StoreError): Effect.Effect<void> =>
  logRecurring(env, `store:${e.op}`, "delivery store operation failed", { op: e.op, code: e.code })
