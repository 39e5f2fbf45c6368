/**
 * The reconciliation room's metrics (ReconcileMetrics) as operators meet them on `/metrics`
 * (docs/operations.md, "Metrics reference", reconcile and intake): each exported metric counts
 * under its own documented name and labels. test/platform/metrics-docs.test.ts checks that every
 * declared name is documented; this checks that each one is the name of what it counts (two
 * counters swapping names pass that check).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Metric } from "effect"
import type { MetricPair } from "effect"
import * as Metrics from "../../src/services/platform/Metrics.js"
import * as R from "../../src/services/reconciliation/ReconcileMetrics.js"
import { checkExposition } from "../support/promText.js"

const CASES: ReadonlyArray<readonly [string, Metric.Metric.Counter<number>, string]> = [
  ["identityLookups", R.identityLookups({ result: "hit" }), "firehook_identity_lookups_total{result=\"hit\"}"],
  ["identityFailures", R.identityFailures({ kind: "timeout" }), "firehook_identity_failures_total{kind=\"timeout\"}"],
  [
    "reconcileOwners",
    R.reconcileOwners({ outcome: "complete" }),
    "firehook_reconcile_owners_total{outcome=\"complete\"}"
  ],
  [
    "reconcileFailures",
    R.reconcileFailures({ kind: "pds_unreachable" }),
    "firehook_reconcile_failures_total{kind=\"pds_unreachable\"}"
  ],
  ["reconcileInvalidRecords", R.reconcileInvalidRecords, "firehook_reconcile_invalid_records_total"],
  ["reconcilePages", R.reconcilePages, "firehook_reconcile_pages_total"],
  ["backfillOwners", R.backfillOwners({ result: "ok" }), "firehook_backfill_owners_total{result=\"ok\"}"],
  ["backfillPasses", R.backfillPasses({ result: "completed" }), "firehook_backfill_passes_total{result=\"completed\"}"],
  [
    "backfillPageTakeovers",
    R.backfillPageTakeovers({ reason: "abandoned" }),
    "firehook_backfill_page_takeovers_total{reason=\"abandoned\"}"
  ],
  [
    "retrySchedulerAttempts",
    R.retrySchedulerAttempts({ result: "recovered" }),
    "firehook_retry_scheduler_attempts_total{result=\"recovered\"}"
  ],
  ["reactivationRequests", R.reactivationRequests, "firehook_reconcile_reactivation_requests_total"],
  [
    "reactivationDropped",
    R.reactivationDropped({ reason: "queue" }),
    "firehook_reconcile_reactivation_dropped_total{reason=\"queue\"}"
  ]
]

/** The value of the sample `series` (`name{labels}` as rendered, or `name`) in `pairs`' exposition; 0 when absent. */
const value = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>, series: string): number => {
  const line = Metrics.render(pairs).split("\n").find((l) => l.startsWith(`${series} `))
  return line === undefined ? 0 : Number(line.slice(series.length + 1))
}

describe("ReconcileMetrics: each metric counts under its own name", () => {
  it.effect("one increment of each moves its own series by 1 and no other's", () =>
    Effect.gen(function*() {
      for (const [what, counter, series] of CASES) {
        const before = yield* Metric.snapshot
        yield* Metric.increment(counter)
        const after = yield* Metric.snapshot
        const moved = CASES.filter(([, , s]) => value(after, s) !== value(before, s)).map(([w]) => w)
        expect({ what, moved, delta: value(after, series) - value(before, series) }).toEqual({
          what,
          moved: [what],
          delta: 1
        })
      }
      // every one of them a counter, each with its help
      const { families } = checkExposition(Metrics.render(yield* Metric.snapshot))
      for (const [what, , series] of CASES) {
        const family = families.get(series.replace(/\{.*$/, ""))
        expect({ what, type: family?.type }).toEqual({ what, type: "counter" })
        expect(family?.help).not.toBe(series.replace(/\{.*$/, ""))
      }
    }))
})
