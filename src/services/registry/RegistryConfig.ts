/**
 * The registry's configuration (SPEC §6.5): the admission bounds of active subscriptions. Each
 * variable's name, default and range live here once.
 */
import type { Effect } from "effect"
import type { FirehookConfigShape } from "../platform/Config.js"
import { type ConfigInvalid, readIntVars } from "../platform/ConfigRead.js"

export const registry = {
  activeMax: { env: "REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX", default: 10000, min: 1, max: 1000000 },
  ownerActiveMax: { env: "REGISTRY_OWNER_ACTIVE_RECORDS_MAX", default: 100, min: 1, max: 10000 },
  directDidsMax: { env: "REGISTRY_DIRECT_SCOPE_DIDS_MAX", default: 10000, min: 1, max: 10000 },
  backlinkDidsMax: { env: "REGISTRY_BACKLINK_SCOPE_DIDS_MAX", default: 1024, min: 1, max: 10000 }
} as const

/** The admission limits of SPEC §2.6, by name (the `limit` label of the rejection metric). */
export const ADMISSION_LIMITS = ["total", "owner", "direct_dids", "backlink_dids"] as const
export type AdmissionLimit = (typeof ADMISSION_LIMITS)[number]

export const load: Effect.Effect<FirehookConfigShape["registry"], ConfigInvalid> = readIntVars(registry)
