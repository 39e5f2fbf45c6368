/**
 * The operator's configuration (SPEC §3.4, §4.9): how often maintenance runs and what it prunes
 * (`RETENTION_*`). Each variable's name, default and range live here once.
 */
import { Effect } from "effect"
import type { FirehookConfigShape } from "../platform/Config.js"
import { type ConfigInvalid, readIntVar, readIntVars } from "../platform/ConfigRead.js"

/** Bounds of the `RETENTION_*` variables: durations 1 h .. 365 d, row bounds 1,000 .. 10,000,000 (the row-bound cut is an OFFSET scan that must fit the 30 s statement bound). */
export const RETENTION_MS_MIN = 3_600_000
export const RETENTION_MS_MAX = 31_536_000_000
export const RETENTION_ROWS_MIN = 1_000
export const RETENTION_ROWS_MAX = 10_000_000

export const DAY_MS = 86_400_000

/** A retention duration variable (ms), its default in days. */
const retentionMs = <const E extends string>(env: E, days: number) =>
  ({ env, default: days * DAY_MS, min: RETENTION_MS_MIN, max: RETENTION_MS_MAX }) as const

/** A retention row-bound variable (default 100,000 rows). */
const retentionRows = <const E extends string>(env: E) =>
  ({ env, default: 100_000, min: RETENTION_ROWS_MIN, max: RETENTION_ROWS_MAX }) as const

export const maintenanceIntervalMs = {
  env: "MAINTENANCE_INTERVAL_MS",
  default: 60000,
  min: 1000,
  max: 86_400_000
} as const

// SPEC §4.9 and §3.4
export const retention = {
  deliveredMs: retentionMs("RETENTION_DELIVERED_MS", 7),
  deadLetterMs: retentionMs("RETENTION_DEAD_LETTER_MS", 30),
  cancelledMs: retentionMs("RETENTION_CANCELLED_MS", 7),
  auditMs: retentionMs("RETENTION_AUDIT_MS", 30),
  auditMaxRows: retentionRows("RETENTION_AUDIT_MAX_ROWS"),
  tombstonesMs: retentionMs("RETENTION_TOMBSTONES_MS", 7),
  tombstonesMaxRows: retentionRows("RETENTION_TOMBSTONES_MAX_ROWS"),
  quarantineMs: retentionMs("RETENTION_QUARANTINE_MS", 30),
  quarantineMaxRows: retentionRows("RETENTION_QUARANTINE_MAX_ROWS"),
  eventBodiesMs: retentionMs("RETENTION_EVENT_BODIES_MS", 7)
} as const

export const load: Effect.Effect<Pick<FirehookConfigShape, "maintenanceIntervalMs" | "retention">, ConfigInvalid> =
  Effect.gen(function*() {
    const interval = yield* readIntVar(maintenanceIntervalMs)
    return { maintenanceIntervalMs: interval, retention: yield* readIntVars(retention) }
  })
