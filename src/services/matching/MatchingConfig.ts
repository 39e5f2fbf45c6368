/**
 * The matcher's configuration (SPEC §2.4): the prior-reference table (`PRIOR_REFS_*`; the per-row
 * bounds, 100 refs and 32 KiB, stay constants of the Processor). Each variable's name, default and
 * range live here once.
 */
import type { Effect } from "effect"
import {
  DAY_MS,
  RETENTION_MS_MAX,
  RETENTION_MS_MIN,
  RETENTION_ROWS_MAX,
  RETENTION_ROWS_MIN
} from "../operator/OperatorConfig.js"
import type { FirehookConfigShape } from "../platform/Config.js"
import { type ConfigInvalid, readIntVars } from "../platform/ConfigRead.js"

// SPEC §2.4: prior references expire after 7 days; the table holds at most 100,000 rows (the same
// ranges as the RETENTION_* durations and row bounds)
export const priorRefs = {
  /** a row expires this long after its last write (maintenance deletes it) */
  ttlMs: { env: "PRIOR_REFS_TTL_MS", default: 7 * DAY_MS, min: RETENTION_MS_MIN, max: RETENTION_MS_MAX },
  /** the table's row bound, also the bound of the in-memory key index */
  maxRows: { env: "PRIOR_REFS_MAX_ROWS", default: 100_000, min: RETENTION_ROWS_MIN, max: RETENTION_ROWS_MAX }
} as const

export const load: Effect.Effect<FirehookConfigShape["priorRefs"], ConfigInvalid> = readIntVars(priorRefs)
