/**
 * Room freed for refused records (SPEC §2.6): a record refused for an admission limit is admitted
 * once room is freed, within about a minute, not at its owner's next sweep (up to 24 h).
 *
 * - Which writes: every live write of the registry stream (`Registry.applyWhEvent`) compares the
 *   counts admission judges (total, the owner's, the Jetstream `wantedDids`, the backlink scope
 *   DIDs) before and after it. A count that went down freed room: the delete or pause of an active
 *   webhook, a version that is invalid or refused (its registration is revoked), an update whose
 *   scope frees a DID. A replayed write settled from the store writes nothing and requests nothing;
 *   neither does a reconciliation's swap (so requests never chain: a scan they cause requests
 *   nothing in turn), nor a load.
 * - The cap of an owner's stored records (`limit_owner_records`, `RECONCILE_MAX_RECORDS`): a live
 *   write that removed one of the owner's stored rows (a delete, or a refused version of a stored
 *   key, paused ones too) freed room under it (the writer tells: the index holds active rows only).
 * - Whom: for the owner's own limits, the owner, if it has a refusal for the limit freed
 *   (`limit_owner`, `limit_owner_records`); for a global limit, the owners of its oldest refusals
 *   (refused the longest first), at most
 *   {@link ROOM_REQUESTS_MAX} per unit of work (an intake batch), none already requested, scanning
 *   or failed (RejectedStore.roomRequestStatement). The request is the owners' reconcile-request
 *   stamp of `#account` events (`owners.reconcile_requested_at`, reconciliation/Reactivations.ts),
 *   written in the batch's transaction: it commits with the write that freed the room, or not at
 *   all. The reconcile role's RetryScheduler scans a stamped owner within a round (60 s); the scan
 *   stores the refused record (its tombstone at the refused rev is older than the snapshot) and the
 *   swap admits what fits, earliest-created first. For `limit_owner_records` the scan stores it only
 *   if the repo now holds at most `RECONCILE_MAX_RECORDS` records (a bigger one fails the scan,
 *   `too_many_records`): otherwise it waits until the owner writes it again, or the owner's sweep.
 * - Cost: nothing for a write that frees no room (counts read from the index); one statement for
 *   one that does (at most one per owner and unit for its own limits; a stamped owner is not
 *   stamped again).
 */
import { Effect, Metric } from "effect"
import type { WebhookIndex } from "../matching/WebhookIndex.js"
import type { StoreError } from "../platform/Persistence.js"
import type { RegistryStoreShape } from "./RegistryStore.js"
import type { GlobalLimit } from "./RejectedStore.js"

/** Other owners requested per unit of work at most, for room freed under a global limit. */
export const ROOM_REQUESTS_MAX = 16

/** What admission counts, as the index has it now (each O(1)). */
export interface Room {
  readonly total: number
  readonly owner: number
  readonly directDids: number
  /** the bytes of the direct set (IndexRules.DIRECT_DIDS_MAX_BYTES): a shorter DID frees room too */
  readonly directDidsBytes: number
  readonly backlinkDids: number
}

/** What a unit of work requested so far (reset with each unit). */
export interface RoomMemo {
  /** the owners stamped */
  readonly requested: Set<string>
  /** how many of them for a global limit, by another owner's write */
  others: number
  /**
   * the global limits whose request stamped fewer others than it could: none left to find in this
   * unit (the statement reads up to RejectedStore.ROOM_READ_MAX refusals per limit; not again for
   * each freeing write of a batch)
   */
  readonly exhausted: Set<GlobalLimit>
}

export const newMemo = (): RoomMemo => ({ requested: new Set(), others: 0, exhausted: new Set() })

export const roomOf = (index: WebhookIndex, ownerDid: string): Room => ({
  total: index.size,
  owner: index.ownerCount(ownerDid),
  directDids: index.wantedDids().size,
  directDidsBytes: index.wantedDidsBytes,
  backlinkDids: index.backlinkDids().size
})

const requestsMetric = Metric.counter("firehook_registry_room_reconcile_requests_total", {
  description: "Owner reconciliations requested because a live write freed room under an admission limit"
})

/** A live write's outcome, and whether it removed a stored row of its owner (a row, active or not). */
export interface Written<A> {
  readonly outcome: A
  readonly rowRemoved: boolean
}

/** What requesting reads and writes: the registry's store, index and unit of work. */
export interface RoomContext {
  readonly store: Pick<RegistryStoreShape, "requestRoomReconciles">
  readonly index: WebhookIndex
  /** Jetstream intake (the `direct_dids` limit applies) */
  readonly jetstream: boolean
  /** the current unit's memo (none outside a unit: each write requests on its own) */
  readonly memo: () => RoomMemo | undefined
  /** run after the unit commits */
  readonly onCommit: (f: Effect.Effect<void>) => Effect.Effect<void>
}

/**
 * Run `write` (a live write of `ownerDid`), then request the owners whose refused records the room
 * it freed may admit, in the same transaction; the metric and the log lines once it commits. A
 * `stale` write (fenced; a replay settled from the store) requests nothing.
 */
export const afterWrite = <A extends { readonly _tag: string }>(
  ctx: RoomContext,
  ownerDid: string,
  write: Effect.Effect<Written<A>, StoreError>
): Effect.Effect<A, StoreError> =>
  Effect.gen(function*() {
    const before = roomOf(ctx.index, ownerDid)
    const { outcome, rowRemoved } = yield* write
    if (outcome._tag !== "stale") yield* ctx.onCommit(yield* request(ctx, ownerDid, before, rowRemoved))
    return outcome
  })

/**
 * After a live write of `ownerDid` that changed the index from `before` (and removed one of the
 * owner's stored rows if `rowRemoved`): stamp the owners (see the module's doc); what to run once
 * the transaction commits.
 */
const request = (
  ctx: RoomContext,
  ownerDid: string,
  before: Room,
  rowRemoved: boolean
): Effect.Effect<Effect.Effect<void>, StoreError> =>
  Effect.gen(function*() {
    const { index, jetstream, store } = ctx
    const memo = ctx.memo()
    const after = roomOf(index, ownerDid)
    const freed: Array<GlobalLimit> = []
    if (after.total < before.total) freed.push("total")
    // the Jetstream `wantedDids` set only (as admission: the relay firehose has no such limit)
    if (jetstream && (after.directDids < before.directDids || after.directDidsBytes < before.directDidsBytes)) {
      freed.push("direct_dids")
    }
    if (after.backlinkDids < before.backlinkDids) freed.push("backlink_dids")
    const global = memo === undefined ? freed : freed.filter((limit) => !memo.exhausted.has(limit))
    const self = memo?.requested.has(ownerDid) !== true
    const owner = after.owner < before.owner && self
    const ownerRecords = rowRemoved && self
    const othersMax = global.length === 0 ? 0 : ROOM_REQUESTS_MAX - (memo?.others ?? 0)
    if (!owner && !ownerRecords && othersMax <= 0) return Effect.void
    const stamped = yield* store.requestRoomReconciles({ ownerDid, owner, ownerRecords, global, othersMax })
    const others = stamped.filter((did) => did !== ownerDid).length
    if (memo !== undefined && others < othersMax) { for (const limit of global) memo.exhausted.add(limit) }
    if (stamped.length === 0) return Effect.void
    if (memo !== undefined) {
      for (const did of stamped) memo.requested.add(did)
      memo.others += others
    }
    return Effect.gen(function*() {
      yield* Metric.incrementBy(requestsMetric, stamped.length)
      for (const did of stamped) {
        yield* Effect.logInfo("owner reconciliation requested (admission room freed)").pipe(
          Effect.annotateLogs({ did, by: ownerDid })
        )
      }
    })
  })
