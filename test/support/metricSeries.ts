/**
 * The value of a metric series as the process's registry holds it, for tests that compare it before
 * and after an action (the registry is global to the test process: compare deltas).
 */
import { Effect, Metric, MetricState } from "effect"

/**
 * The series `name` whose labels include `labels`: a counter's count or a gauge's value, summed over
 * the matching series; 0 while none exists.
 */
export const seriesValue = (name: string, labels: Readonly<Record<string, string>> = {}) =>
  Effect.map(Metric.snapshot, (pairs) => {
    const wanted = Object.entries(labels)
    let n = 0
    for (const { metricKey, metricState } of pairs) {
      if (metricKey.name !== name) continue
      if (!wanted.every(([k, v]) => metricKey.tags.some((t) => t.key === k && t.value === v))) continue
      if (MetricState.isCounterState(metricState)) n += Number(metricState.count)
      else if (MetricState.isGaugeState(metricState)) n += Number(metricState.value)
    }
    return n
  })
