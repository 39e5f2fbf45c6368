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
  readonly admitted: Array<SwapAdmission>
}

export const newDecisions = (): SwapDecisions => ({ refused: [], admitted: [] })

/** `row` refused for `limit`. */
export const refuse = (d: SwapDecisions, row: Pick<WebhookRow, "rkey" | "rev" | "cid">, limit: AdmissionLimit) =>
  void d.refused.push({ rkey: row.rkey, rev: row.rev, cid: row.cid, reason: admissionReason(limit) })

/** `w` admitted (its rev is the stored row's). */
export const admit = (d: SwapDecisions, w: Pick<ActiveWebhook, "rkey" | "rev">) =>
  void d.admitted.push({ rkey: w.rkey, rev: w.rev })

/** The recorder of one registry: records a swap's decisions, never failing. */
export const makeRecorder = (store: Pick<RegistryStoreShape, "recordSwap">) => {
  const log = RateLimitedLog.make()
  return (ownerDid: string, outcome: SwapOutcome): Effect.Effect<void> =>
    store.recordSwap(ownerDid, outcome).pipe(
      Effect.catchAll((e) =>
        log.run("recordSwap", (suppressed) =>
          Effect.logWarning("registry: a swap's refused records were not stored; the owner's next swap stores them")
            .pipe(Effect.annotateLogs({ op: e.op, code: e.code, suppressed })))
      )
    )
}
