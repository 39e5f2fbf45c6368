/**
 * Persistence of reconciliation (SPEC §5.2–5.4): owner scan state, fenced snapshot writes, owner
 * discovery, the backfill pass continuation and the retry scheduler's queries, behind a Tag.
 *
 * Fencing (a reconciliation token = owner + the generation `begin` returned):
 * - every write of a scan runs in its own short transaction that first locks the owner row
 *   (`FOR UPDATE`) and checks that the owner is still `scanning` with `scan_generation = token`; a
 *   newer scan (a new `begin`) or a completed/failed mark fences every older scan's writes. The same
 *   row lock is taken by every live registry write (`bumpGeneration`), so a live write and a page
 *   of the snapshot never interleave for one owner;
 * - the snapshot's rev is stored with the owner as soon as it is read (`saveSnapshotRev`): from
 *   then on a live write applies only if its rev is strictly greater (`RegistryStore.bumpGeneration`,
 *   SPEC §3.4). Completion keeps it and records it as the latest completed snapshot's rev
 *   (`completed_snapshot_rev`); a scan that fails (`markFailed`, or a crashed scan marked failed by
 *   `retryCandidates`) puts that one back (NULL if the owner never completed one: no fence), since
 *   SPEC §3.4 fences by the latest completed snapshot or the one in progress, and a failed scan's
 *   rev would hold back the owner's live writes while its PDS is down (SPEC §2.2).
 *   Live writes that landed between `begin` and that moment with a rev not newer than the snapshot
 *   are restamped to a generation below the token: the PDS had them when it answered the rev, so
 *   the snapshot decides their keys (a replayed old create in that window is deleted like one that
 *   landed before `begin`);
 * - a snapshot row is written only where no live event touched the key since `begin` (stored
 *   generation ≤ token, tombstone generation ≤ token) and no newer row is stored (stored rev ≤
 *   snapshot rev), and no tombstone the stream left is newer than the snapshot (SPEC §3.4: a
 *   snapshot never undoes newer live state; a PDS the account has left may still serve its old
 *   repo); a tombstone an earlier scan left does not hold it back whatever its rev (the PDS lists
 *   the record now: one written at a scan-start TID, for an account deactivated then, may be ahead
 *   of every rev of the PDS; tombstones written before migration 0014 count as a scan's); it
 *   carries the snapshot's rev and the token as its
 *   generation; `active` = `enabled` (admission is applied in memory, at the swap);
 * - completion deletes what the snapshot did not contain: rows of older generations whose rev is
 *   not newer than the snapshot, in batches, each leaving a tombstone at the snapshot's rev.
 * - the owner's refused records (`RejectedStore`, SPEC §8.5): a page records its invalid records at
 *   the snapshot's rev under the same guard as its rows (no live write since begin, nothing newer
 *   stored for the key) and clears the entries of the keys it wrote; completion clears the
 *   entries older than the snapshot (their keys are no longer refused by it).
 *
 * The backfill pass state (SPEC §6.4) is shared by the passes of every replica: its writes are
 * fenced by the sweep's number, a page is claimed by a compare-and-swap on the frontier and taken
 * over by one on its holder and beat (BackfillStateSql.ts; BackfillPass.ts uses them).
 *
 * The PostgreSQL implementation is the only one: reconciliation is an integration concern, tested
 * against a real database; services that only need a few of these calls are tested with partial
 * fakes of the Tag.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import { Context, type Effect, Layer } from "effect"
import * as LockKeys from "../platform/LockKeys.js"
import type { StoreError } from "../platform/Persistence.js"
import type { ReconcileStatus, WebhookRow } from "../registry/RegistryStore.js"
import type { RefusedVersion } from "../registry/RejectedStore.js"
import { makeSql } from "./ReconcileStoreSql.js"

export { makeSql } from "./ReconcileStoreSql.js"

/** Advisory lock serializing reconciliation begins across replicas (next to the other keys). */
export const RECONCILE_LOCK_KEY = LockKeys.RECONCILE

/** The backfill pass name in `backfill_state`. */
export const INITIAL_PASS = "initial"

export type BeginResult =
  | {
    readonly _tag: "begun"
    readonly token: number
    /**
     * the scan's start (epoch ms) by the database's clock (`scan_started_at`), the one every
     * process shares; undefined when the store has no such clock
     */
    readonly startedAtMs?: number | undefined
  }
  /** refused: too many other owners are scanning */
  | { readonly _tag: "busy" }

export interface OwnerReconcileState {
  readonly did: string
  readonly generation: number
  readonly status: ReconcileStatus
  readonly scanGeneration: number | undefined
  readonly snapshotRev: string | undefined
  readonly failureCount: number
  readonly lastFailureKind: string | undefined
  readonly scanStartedAt: Date | undefined
  readonly completedAt: Date | undefined
  readonly failedAt: Date | undefined
  /** a reconciliation was requested (an `#account` or `#sync` event of the owner) and no scan has begun since */
  readonly reconcileRequested: boolean
}

/**
 * A page of owners claimed by one pass in a sweep (SPEC §6.4): only its holder scans it; it is
 * finished (its owners counted, the claim dropped) when the scan ends, given back when the pass
 * stops first, and taken over by another pass when its holder is known to have ended or its beat
 * has stopped moving.
 */
export interface PageClaim {
  /** the page's last owner DID: its key within the sweep */
  readonly last: string
  /** the frontier it was claimed from (undefined: the sweep's beginning) */
  readonly after: string | undefined
  /** its owners, as claimed */
  readonly dids: ReadonlyArray<string>
  /** the pass scanning it; undefined: given back, anyone may take it at once */
  readonly holder: string | undefined
  /** bumped by the holder while it scans, and by every take */
  readonly beat: number
}

export interface PassState {
  readonly pass: string
  /**
   * Every owner up to this DID has been scanned in the current sweep (undefined: none yet, or the
   * sweep is complete): the frontier, or where the earliest unfinished page begins.
   */
  readonly continuation: string | undefined
  /** the last owner DID of the last page claimed: the next page begins after it */
  readonly frontier: string | undefined
  /** owners of the sweep's finished pages */
  readonly ownersDone: number
  readonly startedAt: Date | undefined
  readonly completedAt: Date | undefined
  /** the sweep's number: every write of a pass is fenced by it */
  readonly sweep: number
  /** pages claimed and not finished */
  readonly claims: ReadonlyArray<PageClaim>
}

/** A sweep of a pass: what every claim write is fenced by. */
export interface SweepRef {
  readonly pass: string
  readonly sweep: number
}

/**
 * {@link PassState.continuation}: the frontier when no page is claimed, else where the earliest
 * claimed page begins (undefined when one begins at the sweep's start). Claims are kept in the
 * order they were made, and each began at the frontier of its time, which only moves forward: the
 * first one began earliest (in the database's DID order, which need not be JavaScript's).
 */
export const doneThrough = (frontier: string | undefined, claims: ReadonlyArray<PageClaim>): string | undefined => {
  const first = claims[0]
  return first === undefined ? frontier : first.after
}

export interface RetryCandidate {
  readonly did: string
  readonly status: "failed" | "scanning"
  readonly failureCount: number
}

/** What {@link ReconcileStoreShape.requestReconcile} did with the DIDs it was given. */
export interface ReconcileRequests {
  /** known owners newly marked (each once: none was pending for them) */
  readonly requested: ReadonlyArray<string>
  /** known owners without a pending request left unmarked: the pending requests were at the cap */
  readonly overCap: number
}

export interface CompletedOwners {
  readonly dids: ReadonlyArray<string>
  /** opaque keyset cursor for the next call */
  readonly cursor: string
}

export interface OwnersSummary {
  readonly counts: { readonly [K in ReconcileStatus]: number }
  readonly failed: ReadonlyArray<{
    readonly did: string
    readonly failureCount: number
    readonly lastFailureKind: string | undefined
    readonly failedAt: Date | undefined
  }>
  readonly scanning: ReadonlyArray<{ readonly did: string; readonly scanStartedAt: Date | undefined }>
  readonly pass: PassState | undefined
}

export type OwnerSource = "operator" | "discovery"

export interface ReconcileStoreShape {
  /**
   * SPEC §5.3 step 1, under the advisory lock: capacity check, bump the generation, mark scanning;
   * a pending reconciliation request of the owner is satisfied (cleared) by the scan begun.
   */
  readonly begin: (
    did: string,
    options: { readonly maxOtherScanning: number; readonly staleScanMs: number }
  ) => Effect.Effect<BeginResult, StoreError>
  /**
   * Step 2: store the snapshot's rev with the owner (the live-write fence), and hand the keys live
   * writes touched since `begin` with a rev not newer than it to the snapshot (see above).
   * false = fenced (nothing done).
   */
  readonly saveSnapshotRev: (did: string, token: number, snapshotRev: string) => Effect.Effect<boolean, StoreError>
  /**
   * Step 3: write one page of the snapshot (fenced): its rows, and the records it omitted as
   * `refused`. `written` = rows inserted or replaced.
   */
  readonly applyPage: (
    did: string,
    token: number,
    snapshotRev: string,
    rows: ReadonlyArray<WebhookRow>,
    refused: ReadonlyArray<RefusedVersion>
  ) => Effect.Effect<{ readonly fenced: boolean; readonly written: number }, StoreError>
  /** Step 4: delete ≤ `limit` rows the snapshot did not contain, leaving tombstones (fenced). */
  readonly deleteOlder: (
    did: string,
    token: number,
    snapshotRev: string,
    limit: number
  ) => Effect.Effect<{ readonly fenced: boolean; readonly deleted: number }, StoreError>
  /**
   * Step 4: delete ≤ `limit` of the owner's tombstones that are older than the snapshot, were not
   * written by this scan and are past the retention (no replay can still carry their records).
   */
  readonly pruneTombstones: (
    did: string,
    token: number,
    snapshotRev: string,
    retentionMs: number,
    limit: number
  ) => Effect.Effect<{ readonly fenced: boolean; readonly pruned: number }, StoreError>
  /**
   * Step 4–5: mark `complete`, delete once more the rows a live write held back by this scan stored
   * below its token since step 4's last transaction, clear the owner's refused-record entries older
   * than the snapshot, and run `whileLocked` (the in-memory swap) inside the same transaction,
   * holding the owner row lock so no live write of this owner interleaves.
   * false = fenced (nothing done).
   */
  readonly complete: (
    did: string,
    token: number,
    snapshotRev: string,
    whileLocked: Effect.Effect<void, StoreError>
  ) => Effect.Effect<boolean, StoreError>
  /**
   * Run `eff` in a transaction holding the owner row lock (`FOR UPDATE`), so that no live write of
   * the owner interleaves (used to swap an owner completed elsewhere into this process's memory).
   */
  readonly withOwnerLock: <A>(did: string, eff: Effect.Effect<A, StoreError>) => Effect.Effect<A, StoreError>
  /** Mark the scan `token` failed (only if it is still the owner's scan). */
  readonly markFailed: (did: string, token: number, kind: string) => Effect.Effect<boolean, StoreError>
  /** Mark an owner that is not scanning as failed (e.g. it could not be begun); true if marked. */
  readonly markFailedIdle: (did: string, kind: string) => Effect.Effect<boolean, StoreError>
  readonly ownerState: (did: string) => Effect.Effect<OwnerReconcileState | undefined, StoreError>
  /** Record owners as known (operator list / relay discovery). */
  readonly addOwners: (dids: ReadonlyArray<string>, source: OwnerSource) => Effect.Effect<void, StoreError>
  /**
   * Known owners (stored records ∪ seen on the stream ∪ discovered ∪ operator) with a DID greater
   * than `after`, ascending, at most `limit`.
   */
  readonly ownersPage: (after: string | undefined, limit: number) => Effect.Effect<ReadonlyArray<string>, StoreError>
  readonly passState: (pass: string) => Effect.Effect<PassState | undefined, StoreError>
  /**
   * Start sweep `seen + 1` when sweep `seen` is complete, or when there is none (`seen` = 0): no
   * frontier, nothing done, no claims. A no-op when another pass started it first (the
   * compare-and-swap on `seen`). Returns the state after, and whether this call started it.
   */
  readonly startPass: (
    pass: string,
    seen: number
  ) => Effect.Effect<{ readonly started: boolean; readonly state: PassState }, StoreError>
  /**
   * Claim `dids`, the page after `after`, for `holder`: the frontier moves to the page's last DID.
   * A compare-and-swap: only while the sweep is `ref`, unfinished, with its frontier at `after`
   * (so the frontier only moves forward and no two passes claim one page); false = not claimed.
   */
  readonly claimPage: (
    ref: SweepRef,
    after: string | undefined,
    dids: ReadonlyArray<string>,
    holder: string
  ) => Effect.Effect<boolean, StoreError>
  /** The holder's heartbeat on its page `last`; false: the page is no longer its own. */
  readonly beatClaim: (ref: SweepRef, last: string, holder: string) => Effect.Effect<boolean, StoreError>
  /**
   * Take over the page `seen.last` for `holder`: only while its holder and beat are still those
   * seen (a compare-and-swap); false = not taken.
   */
  readonly takeClaim: (ref: SweepRef, seen: PageClaim, holder: string) => Effect.Effect<boolean, StoreError>
  /**
   * The holder scanned its page `last`: the claim is dropped and its owners counted. False (nothing
   * done): the page was taken over, or the sweep is no longer `ref`.
   */
  readonly finishPage: (ref: SweepRef, last: string, holder: string) => Effect.Effect<boolean, StoreError>
  /** The holder stops before finishing its page `last`: another pass may take it at once. */
  readonly releaseClaim: (ref: SweepRef, last: string, holder: string) => Effect.Effect<boolean, StoreError>
  /**
   * Complete the sweep `ref`: only while it is unfinished, its frontier is still `frontier` (the
   * caller found no owner after it) and no page is claimed; false = not completed.
   */
  readonly completePass: (ref: SweepRef, frontier: string | undefined) => Effect.Effect<boolean, StoreError>
  /**
   * SPEC §5.4: failed owners (oldest failure first), then owners scanning for longer than
   * `staleScanMs` (crashed scans). A crashed scan is also marked `failed` (kind `scan_crashed`)
   * first: while it stays `scanning` the owner's deliveries are deferred, and with as many failing
   * owners as there are slots it would never be listed (failed first); as a failure it ends the
   * deferral and joins the rotation of failed owners.
   */
  readonly retryCandidates: (options: {
    readonly limit: number
    readonly staleScanMs: number
    readonly exclude: ReadonlyArray<string>
  }) => Effect.Effect<ReadonlyArray<RetryCandidate>, StoreError>
  /**
   * Request a reconciliation of each known owner among `dids` (an `#account` or `#sync` event): stamps
   * `reconcile_requested_at` where none is pending (a repeat is coalesced), while fewer than
   * `pendingMax` are pending. DIDs of no known owner are ignored. The stamp is cleared by the next
   * `begin` of the owner.
   */
  readonly requestReconcile: (
    dids: ReadonlyArray<string>,
    pendingMax: number
  ) => Effect.Effect<ReconcileRequests, StoreError>
  /**
   * Owners with a pending reconciliation request that are not scanning (or scanning for longer
   * than `staleScanMs`: crashed), oldest request first, at most `limit`, `exclude` left out; with
   * `only`, none but those among `only` (the RetryScheduler's owners tracked as failed, to wake).
   */
  readonly reconcileRequests: (options: {
    readonly limit: number
    readonly staleScanMs: number
    readonly exclude: ReadonlyArray<string>
    readonly only?: ReadonlyArray<string> | undefined
  }) => Effect.Effect<ReadonlyArray<string>, StoreError>
  /** A cursor `marginMs` before the database's now (for `completedSince`). */
  readonly completedCursor: (marginMs: number) => Effect.Effect<string, StoreError>
  /**
   * Owners completed after `cursor` (keyset on completion time and DID), at most `limit`, and only
   * those completed at least `settleMs` (default {@link COMPLETION_SETTLE_MS}) before the database's
   * now: `completed_at` is the completing transaction's start, and a transaction that started
   * earlier than a row already read may commit later; the cursor must never pass it.
   */
  readonly completedSince: (
    cursor: string,
    limit: number,
    settleMs?: number
  ) => Effect.Effect<CompletedOwners, StoreError>
  /** For `owners status`: counts, failed and scanning owners (≤ `limit` each), the pass. */
  readonly summary: (limit: number) => Effect.Effect<OwnersSummary, StoreError>
}

export class ReconcileStore extends Context.Tag("firehook/ReconcileStore")<ReconcileStore, ReconcileStoreShape>() {}

/**
 * How long after its `completed_at` a completion is read by `completedSince`: longer than any
 * completing transaction can take (every store call is bounded by `STORE_TIMEOUT`, 60 s), so no
 * completion with an earlier `completed_at` can still commit once the cursor has passed it.
 */
export const COMPLETION_SETTLE_MS = 90_000

/** The PostgreSQL store. Requires a `SqlClient`. */
export const layerSql: Layer.Layer<ReconcileStore, never, SqlClient.SqlClient> = Layer.effect(ReconcileStore, makeSql)
