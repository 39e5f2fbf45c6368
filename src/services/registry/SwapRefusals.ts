/**
 * What a registry swap (`Registry.swapOwner`: a reconciliation's completion, a sync, a reload of an
 * owner) decided about the owner's stored active rows, remembered among the owner's refused records
 * (SPEC §8.5 `rejected`, source `reconciliation`): the rows it refused for an admission limit (over
 * a global limit, or beyond the owner's first `ownerActiveMax`: `limit_owner`) are recorded at the
 * row's rev with its cid, and the entries of the keys it admitted are cleared. Without this, a scan
 * (which stores every valid record as active and clears the entries of the keys it stored) would
 * hide such a refusal from the owner, and RoomRequests would not find the owner when room is freed.
 *
 * - One statement per swap (`RegistryStore.recordSwap`), after the swap's synchronous step; bounded
 *   by the owner's active rows, and by the owner's entry bound for the refusals.
 * - Idempotent: several processes may swap the same owner; a repeat changes only the sighting time.
 *   Processes whose indexes differ may decide differently; the last swap's view stays.
 * - A failure never fails the swap (the index is already swapped): it is logged at warning, at most
 *   once a minute, and the owner's next swap records it again. The statement runs under its own
 *   savepoint, so the transaction it may run in (the completion's) stays usable.
 *
 * The counters (health's `rejected`, `firehook_registry_admission_rejected_total`) count a swap's
 * refusal only when it is new ({@link countNew}): the key was registered before the swap (a
 * registration revoked), or its version was not already refused for that limit in this process
 * (by a swap, a live write or the load: {@link Counted}). A swap runs whenever the owner's rows
 * change in any way (a gone mark set or cleared, a new rev from a scan, a second process's sync of
 * the same completion), so counting every refusal of every swap counted one record again and again.
 */
import { Effect } from "effect"
import type { ActiveWebhook } from "../matching/WebhookIndex.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import type { AdmissionLimit } from "./RegistryConfig.js"
import type { RegistryStoreShape, WebhookRow } from "./RegistryStore.js"
import { admissionReason, type SwapAdmission, type SwapOutcome, type SwapRefusal } from "./RejectedStore.js"

/** A swap's decisions, as it makes them (the row each is about). */
export interface SwapDecisions {
  readonly refused: Array<SwapRefusal>
  /** the limit of each of `refused`, in the same order */
  readonly limits: Array<AdmissionLimit>
  readonly admitted: Array<SwapAdmission>
}

export const newDecisions = (): SwapDecisions => ({ refused: [], limits: [], admitted: [] })

/** `row` refused for `limit`. */
export const refuse = (d: SwapDecisions, row: Pick<WebhookRow, "rkey" | "rev" | "cid">, limit: AdmissionLimit) => {
  d.refused.push({ rkey: row.rkey, rev: row.rev, cid: row.cid, reason: admissionReason(limit) })
  d.limits.push(limit)
}

/** `w` admitted (its rev is the stored row's). */
export const admit = (d: SwapDecisions, w: Pick<ActiveWebhook, "rkey" | "rev">) =>
  void d.admitted.push({ rkey: w.rkey, rev: w.rev })

/** The recorder of one registry: records a swap's decisions, never failing. */
export const makeRecorder = (store: Pick<RegistryStoreShape, "recordSwap">) => {
  const log = RateLimitedLog.make()
  return (ownerDid: string, outcome: SwapOutcome): Effect.Effect<void> =>
    store.recordSwap(ownerDid, { refused: outcome.refused, admitted: outcome.admitted }).pipe(
      Effect.catchAll((e) =>
        log.run(
          "recordSwap",
          (suppressed) =>
            Effect.logWarning("registry: a swap's refused records were not stored; the owner's next swap stores them")
              .pipe(Effect.annotateLogs({ op: e.op, code: e.code, suppressed }))
        )
      )
    )
}

/** Refusals remembered at most, all owners together (beyond, a refusal may be counted again). */
export const COUNTED_MAX = 100_000

/**
 * What this process has counted as refused, by owner and key: the limit and the version refused
 * ({@link refusalTag}). Each owner's swap replaces the owner's entries with its own refusals; a
 * live write's refusal is added once its unit commits, and any other live write of the key forgets
 * it; the load adds the refusals it makes (counted as `notLoaded`, not as `rejected`). Bounded by
 * {@link COUNTED_MAX} entries: a refusal that does not fit is not remembered, so a later swap may
 * count it again (the counters may then run ahead, never behind).
 */
export interface Counted {
  /** whether `tag` is the key's remembered refusal */
  readonly has: (ownerDid: string, rkey: string, tag: string) => boolean
  /** remember `tag` as the key's refusal, or forget the key's (`undefined`) */
  readonly set: (ownerDid: string, rkey: string, tag: string | undefined) => void
  /** the owner's remembered refusals become `entries` (rkey, tag) */
  readonly replaceOwner: (ownerDid: string, entries: ReadonlyArray<readonly [string, string]>) => void
  /** entries remembered, all owners together */
  readonly size: () => number
}

/** A refusal as remembered: the limit and the version (its cid, else its rev). */
export const refusalTag = (limit: AdmissionLimit, cid: string | undefined, rev: string): string =>
  cid === undefined ? `${limit} rev ${rev}` : `${limit} cid ${cid}`

export const makeCounted = (max: number = COUNTED_MAX): Counted => {
  const byOwner = new Map<string, Map<string, string>>()
  let size = 0
  const set = (ownerDid: string, rkey: string, tag: string | undefined) => {
    const entries = byOwner.get(ownerDid)
    const had = entries?.has(rkey) === true
    if (tag === undefined) {
      if (entries === undefined || !had) return
      entries.delete(rkey)
      size--
      if (entries.size === 0) byOwner.delete(ownerDid)
      return
    }
    if (!had && size >= max) return
    if (entries === undefined) byOwner.set(ownerDid, new Map([[rkey, tag]]))
    else entries.set(rkey, tag)
    if (!had) size++
  }
  return {
    has: (ownerDid, rkey, tag) => byOwner.get(ownerDid)?.get(rkey) === tag,
    set,
    replaceOwner: (ownerDid, entries) => {
      size -= byOwner.get(ownerDid)?.size ?? 0
      byOwner.delete(ownerDid)
      for (const [rkey, tag] of entries) set(ownerDid, rkey, tag)
    },
    size: () => size
  }
}

/**
 * The limits of the swap's refusals that are new (see the module's documentation): the key was
 * registered before the swap (`registered`), or the version was not already refused for that limit
 * (`counted`). Then the owner's remembered refusals are the swap's.
 */
export const countNew = (
  counted: Counted,
  ownerDid: string,
  d: SwapDecisions,
  registered: (rkey: string) => boolean
): Array<AdmissionLimit> => {
  const fresh: Array<AdmissionLimit> = []
  const entries: Array<readonly [string, string]> = []
  d.refused.forEach((r, i) => {
    const limit = d.limits[i]
    if (limit === undefined) return
    const tag = refusalTag(limit, r.cid, r.rev)
    if (registered(r.rkey) || !counted.has(ownerDid, r.rkey, tag)) fresh.push(limit)
    entries.push([r.rkey, tag])
  })
  counted.replaceOwner(ownerDid, entries)
  return fresh
}
