/**
 * The metrics of the reconciliation room (identity, reconciler, backfill, retry scheduler), in one
 * list. A labelled counter is a family ({@link labelledCounterFamily}): `family({ label: value })`
 * is the counter of those labels, made once; the series are those `Metric.tagged` would export.
 *
 * @since 0.1.0
 */
import { Metric } from "effect"
import { labelledCounterFamily } from "../platform/Metrics.js"

// ---------------------------------------------------------------------------------------------
// Identity

/** `{ result }`: hit, stale, miss */
export const identityLookups = labelledCounterFamily("firehook_identity_lookups_total", {
  description: "DID document lookups (DID → PDS, DID → signing key), by result (hit, stale, miss)"
})
/** `{ kind }`: an identity error kind */
export const identityFailures = labelledCounterFamily("firehook_identity_failures_total", {
  description: "DID document fetches that failed, by kind"
})

// ---------------------------------------------------------------------------------------------
// Reconciler

/** `{ outcome }`: complete, failed, busy, superseded */
export const reconcileOwners = labelledCounterFamily("firehook_reconcile_owners_total", {
  description: "Owner reconciliations, by outcome (complete, failed, busy, superseded)"
})
/** `{ kind }`: an owner failure kind */
export const reconcileFailures = labelledCounterFamily("firehook_reconcile_failures_total", {
  description: "Failed owner reconciliations, by failure kind"
})
export const reconcileInvalidRecords = Metric.counter("firehook_reconcile_invalid_records_total", {
  description: "Records omitted from PDS snapshots because they failed validation"
})
export const reconcilePages = Metric.counter("firehook_reconcile_pages_total", {
  description: "listRecords pages fetched"
})

// ---------------------------------------------------------------------------------------------
// Backfill

/** `{ result }`: ok, failed */
export const backfillOwners = labelledCounterFamily("firehook_backfill_owners_total", {
  description: "Owners handled by backfill passes, by result (ok, failed)"
})
/** `{ result }`: capped, completed, infrastructure_failure */
export const backfillPasses = labelledCounterFamily("firehook_backfill_passes_total", {
  description: "Backfill passes finished, by result (capped, completed, infrastructure_failure)"
})
/** `{ reason }`: given_back, own, abandoned */
export const backfillPageTakeovers = labelledCounterFamily("firehook_backfill_page_takeovers_total", {
  description: "Claimed backfill pages taken over by another pass, by reason (given_back, own, abandoned)"
})

// ---------------------------------------------------------------------------------------------
// Retry scheduler

/** `{ result }`: recovered, failed, skipped */
export const retrySchedulerAttempts = labelledCounterFamily("firehook_retry_scheduler_attempts_total", {
  description: "Reconciliation retries, by result (recovered, failed, skipped)"
})

// ---------------------------------------------------------------------------------------------
// Reactivations (Reactivations.ts)

export const reactivationRequests = Metric.counter("firehook_reconcile_reactivation_requests_total", {
  description:
    "Owner reconciliations requested by an account's status change (#account of a known owner: reactivated, deactivated, taken down, suspended, deleted; or its relay #sync)"
})
/** `{ reason }`: queue, cap, store */
export const reactivationDropped = labelledCounterFamily("firehook_reconcile_reactivation_dropped_total", {
  description:
    "Account-status reconciliation requests dropped (queue full, pending requests at the cap, database write failed)"
})
