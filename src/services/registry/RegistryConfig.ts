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

/**
 * The admission limits of SPEC §2.6, by name (the `limit` label of the rejection metric), and
 * `owner_records`: the cap of an owner's stored records (active or not) that the registry stream
 * keeps, `RECONCILE_MAX_RECORDS` (what one reconciliation scan can read; SPEC §7: records per owner
 * are bounded). It refuses a live write that would store a new key for an owner at the cap, before
 * admission judges it; the index never judges it (`IndexRules.admissionIn` returns an index limit).
 */
export const ADMISSION_LIMITS = ["total", "owner", "direct_dids", "backlink_dids", "owner_records"] as const
export type AdmissionLimit = (typeof ADMISSION_LIMITS)[number]
/** The limits the in-memory index judges (SPEC §2.6). */
export type IndexLimit = Exclude<AdmissionLimit, "owner_records">

export const load: Effect.Effect<FirehookConfigShape["registry"], ConfigInvalid> = readIntVars(registry)
