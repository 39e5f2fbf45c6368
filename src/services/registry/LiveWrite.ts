/**
 * One live write of the registry stream (`Registry.applyWhEvent`; SPEC §3.4), once its owner is
 * locked and its key read: fencing, validation, the cap of the owner's stored records, admission,
 * the store's write and the index's (see Registry's module documentation), and the writes fenced
 * by a scan in progress. The counts health reads are raised once the write commits.
 */
import { Effect, Either, Metric } from "effect"
import type { ScopeUri } from "../../schemas/AtUri.js"
import type { RecordEvent } from "../../schemas/RecordEvent.js"
import { compareTid } from "../../schemas/Tid.js"
import { validateWhRecord, type WhRecord } from "../../schemas/WhRecord.js"
import { type ActiveWebhook, makeActiveWebhook, type WebhookIndex, webhookKey } from "../matching/WebhookIndex.js"
import type { StoreError } from "../platform/Persistence.js"
import { type Rules, settlement } from "./IndexRules.js"
import type { AdmissionLimit } from "./RegistryConfig.js"
import {
  isStorableRow,
  isStorableText,
  type KeyState,
  type OwnerState,
  type RegistryStoreShape,
  type Tombstone,
  type WebhookRow
} from "./RegistryStore.js"
import { admissionReason, type RefusedVersion } from "./RejectedStore.js"

export type WhEventOutcome =
  | { readonly _tag: "stale" }
  | { readonly _tag: "deleted"; readonly existed: boolean }
  | { readonly _tag: "active" }
  | { readonly _tag: "disabled" }
  | { readonly _tag: "invalid"; readonly kind: string; readonly revoked: boolean }
  /** over an admission limit (SPEC §2.6), or (`owner_records`) a new key over the cap of the owner's stored records */
  | { readonly _tag: "rejected"; readonly limit: AdmissionLimit; readonly revoked: boolean }

/** by `limit` (`ADMISSION_LIMITS`; `owner_records`: a new key not stored, its owner at the cap of its stored records) */
export const admissionRejections = Metric.counter("firehook_registry_admission_rejected_total", {
  description: "Webhook records not activated because an admission limit was reached"
})
export const invalidRecordsMetric = Metric.counter("firehook_registry_invalid_records_total", {
  description: "place.wisp.v2.wh records that failed validation or that PostgreSQL cannot store (unstorable)"
})

/** Build the stored row of a validated record. */
export const toRow = (
  ownerDid: string,
  rkey: string,
  record: WhRecord,
  scope: ScopeUri,
  rev: string,
  generation: number,
  cid: string | undefined,
  active: boolean
): WebhookRow => {
  const w = makeActiveWebhook(ownerDid, rkey, record, scope, rev)
  return {
    ownerDid,
    rkey,
    rev,
    generation,
    cid,
    record,
    scopeUri: w.scopeUri,
    scopeDid: scope.did,
    backlinks: w.backlinks,
    url: record.url,
    events: record.events ?? [],
    enabled: record.enabled !== false,
    active,
    signingMode: w.signingMode,
    secretId: record.secretId,
    // the active form's (same inputs: url, scope, backlinks, backlinksOnly, events, enabled, secretId)
    fingerprint: w.fingerprint,
    gone: false
  }
}

/**
 * What a write fenced by a scan in progress registers in memory ({@link followDuringScan}): a valid,
 * enabled, storable version's registration; none for a delete, an invalid, paused or unstorable one.
 */
const followedRegistration = (rules: Rules, event: RecordEvent): ActiveWebhook | undefined => {
  if (event.operation === "delete") return undefined
  const validated = validateWhRecord(event.record, rules.validateOpts)
  if (Either.isLeft(validated) || validated.right.record.enabled === false) return undefined
  const { record, scope } = validated.right
  const storable = isStorableRow(toRow(event.did, event.rkey, record, scope, event.rev, 0, event.cid, true))
  return storable ? makeActiveWebhook(event.did, event.rkey, record, scope, event.rev) : undefined
}

/** The index's writes that a transaction can undo (`Registry.make`'s journal), and its rules. */
export type IndexWriter = Readonly<{
  rules: Rules
  index: WebhookIndex
  admission: (w: ActiveWebhook) => AdmissionLimit | undefined
  set: (w: ActiveWebhook) => void
  /** the registration removed, if the index held one */
  remove: (key: string) => ActiveWebhook | undefined
}>

/**
 * The index takes the key's stored state ({@link settlement}): a replay of the key's stored version,
 * or a write older than the version the owner's scan in progress stored ({@link followScanVersion})
 */
const settle = (
  writer: IndexWriter,
  key: string,
  stored: WebhookRow | undefined,
  why = "registry: replayed write committed elsewhere, index follows the store"
): Effect.Effect<void> =>
  Effect.suspend(() => {
    const s = settlement(writer.rules, writer.index, key, stored)
    if (s._tag === "keep") return Effect.void
    if (s._tag === "set") writer.set(s.w)
    else writer.remove(key)
    return Effect.logInfo(why).pipe(
      Effect.annotateLogs({ key, result: s._tag === "over" ? `over ${s.limit} limit` : s._tag })
    )
  })

/**
 * A live write fenced while a scan is in progress, not stored ({@link heldBackGeneration} found it
 * no newer than the owner's last completed snapshot, or the scan's token unknown): the index
 * follows it until the scan's swap (SPEC §5.3 step 5), so that the events
 * after it match what the owner wrote, not the pre-scan registration (before, a webhook created or
 * moved just before its owner's snapshot lost them: the audit of 6 December 2026). Rows matched so
 * wait while the owner is `scanning`, then face the snapshot's subscription (SPEC §4.2): a version
 * the snapshot does not confirm (a replayed create of a webhook deleted since) is cancelled, unsent.
 */
const followDuringScan = (writer: IndexWriter, event: RecordEvent, key: string): Effect.Effect<void> =>
  Effect.suspend(() => {
    const candidate = followedRegistration(writer.rules, event)
    const admitted = candidate !== undefined && writer.admission(candidate) === undefined ? candidate : undefined
    if (admitted !== undefined) writer.set(admitted)
    else writer.remove(key)
    return Effect.logDebug("registry: a write older than the owner's scan in progress, followed in memory only")
      .pipe(Effect.annotateLogs({ key, result: admitted === undefined ? "removed" : "set" }))
  })

/**
 * The generation a live write fenced by the snapshot of the owner's scan in progress is stored at:
 * one below the scan's token, as the scan stamps the writes that landed before it read its rev
 * (`ReconcileStore.saveSnapshotRev`). The scan's pages then overwrite the key, or its completion
 * deletes it (tombstone at the snapshot's rev), so the snapshot still decides the key (SPEC §3.4);
 * and if the scan fails, the store holds what the index follows (SPEC §5.3 step 5: the owner keeps
 * its last known registrations; before, such a write lived in memory only and was lost to the
 * store for good, the stream having moved past it: the audit of 6 December 2026). Only a write
 * newer than the owner's last completed snapshot (the fence a failed scan gives back): an older one
 * is stale whatever the scan. Undefined: not stored.
 */
export const heldBackGeneration = (owner: OwnerState | undefined, rev: string): number | undefined =>
  owner?.status === "scanning" && owner.scanGeneration !== undefined &&
    (owner.completedSnapshotRev === undefined || compareTid(rev, owner.completedSnapshotRev) > 0)
    ? owner.scanGeneration - 1
    : undefined

/**
 * A write the owner's snapshot rev fenced: the generation it is stored at while the owner's scan
 * runs ({@link heldBackGeneration}), or undefined (stale; while a snapshot is being taken, the index
 * follows it: {@link followDuringScan}).
 */
const fencedWrite = (
  store: RegistryStoreShape,
  writer: IndexWriter,
  event: RecordEvent,
  key: string
): Effect.Effect<number | undefined, StoreError> =>
  Effect.gen(function*() {
    const owner = yield* store.owner(event.did)
    const held = heldBackGeneration(owner, event.rev)
    if (held === undefined && owner?.status === "scanning") yield* followDuringScan(writer, event, key)
    return held
  })

/** A key's stored version: its rev and generation, and its row (undefined: a tombstone). */
interface StoredVersion {
  readonly rev: string
  readonly generation: number
  readonly row: WebhookRow | undefined
}

/** The key's stored version: the newer of its row and its tombstone (the tombstone on a tie). */
const storedVersion = (row: WebhookRow | undefined, tombstone: Tombstone | undefined): StoredVersion | undefined => {
  if (row !== undefined && (tombstone === undefined || compareTid(row.rev, tombstone.rev) > 0)) {
    return { rev: row.rev, generation: row.generation, row }
  }
  return tombstone === undefined ? undefined : { ...tombstone, row: undefined }
}

/**
 * A write older than the key's stored version (`stale` by the row or tombstone rev), when that
 * version is the owner's scan in progress's own (stamped with its token: a page's row, or step 4's
 * tombstone, both at the snapshot's rev; no live write gets that generation, SPEC §3.4): the index
 * takes it ({@link settle}). It is newer than the write and is what the scan's swap will register
 * (or drop); before, the index kept the pre-scan registration until then, which a write reaching
 * intake before the page would have replaced ({@link followDuringScan}): a webhook created or moved
 * just before the snapshot missed its events, and a deleted one kept its admission slot, refusing a
 * new record of its owner (`limit_owner`) until the owner's next sweep. One owner read, on this
 * path only (an older replay of a stored key).
 */
const followScanVersion = (
  store: RegistryStoreShape,
  writer: IndexWriter,
  ownerDid: string,
  key: string,
  stored: StoredVersion
): Effect.Effect<void, StoreError> =>
  Effect.gen(function*() {
    const owner = yield* store.owner(ownerDid)
    if (owner?.status !== "scanning" || owner.scanGeneration !== stored.generation) return
    yield* settle(
      writer,
      key,
      stored.row,
      "registry: a write older than its owner's scan's version, index follows the scan"
    )
  })

/** The refusals counted for health (raised once the write commits). */
export interface LiveCounts {
  readonly rejected: { [K in AdmissionLimit]: number }
  invalidRecords: number
}

/** No refusal counted yet. */
export const noCounts = (): LiveCounts => ({
  rejected: { total: 0, owner: 0, direct_dids: 0, backlink_dids: 0, owner_records: 0 },
  invalidRecords: 0
})

/** What a live write reads and writes besides its event and key. */
export interface LiveWriteContext {
  readonly store: RegistryStoreShape
  readonly writer: IndexWriter
  /** run after the enclosing transaction commits (at once outside one) */
  readonly onCommit: (f: Effect.Effect<void>) => Effect.Effect<void>
  /** the cap of an owner's stored records (`RECONCILE_MAX_RECORDS`) a new key must stay under */
  readonly ownerRecordsMax: number
  readonly counts: LiveCounts
}

/**
 * The live write of `event`, whose key's stored state is `state` (`RegistryStore.get`, read holding
 * the owner's lock, with the owner's stored rows counted up to the cap when the key has none): see
 * Registry's module documentation.
 */
export const writeKey = (
  ctx: LiveWriteContext,
  event: RecordEvent,
  state: KeyState
): Effect.Effect<WhEventOutcome, StoreError> =>
  Effect.gen(function*() {
    const { counts, onCommit, ownerRecordsMax, store, writer } = ctx
    const ownerDid = event.did
    const rkey = event.rkey
    const key = webhookKey(ownerDid, rkey)
    const { ownerRecords, row, tombstone } = state
    // fencing: strictly greater than both the row's and the tombstone's rev
    const stored = storedVersion(row, tombstone)
    if (stored !== undefined && compareTid(event.rev, stored.rev) <= 0) {
      // this very version, committed elsewhere (another leader, this process before a restart)
      if (compareTid(event.rev, stored.rev) === 0) yield* settle(writer, key, stored.row)
      // an older one, the stored version being the scan in progress's
      else yield* followScanVersion(store, writer, ownerDid, key, stored)
      return { _tag: "stale" } as const
    }
    // and strictly greater than the owner's snapshot rev (SPEC §3.4): the snapshot already holds
    // the owner's records as of that rev; nothing is written, but for a write newer than the last
    // completed snapshot while a scan runs, stored below the scan's token ({@link fencedWrite})
    const generation = (yield* store.bumpGeneration(ownerDid, event.rev)) ??
      (yield* fencedWrite(store, writer, event, key))
    if (generation === undefined) return { _tag: "stale" } as const
    // a refusal keeps the version's cid only if it can be stored (Jetstream's is any string)
    const cid = event.cid !== undefined && isStorableText(event.cid) ? event.cid : undefined
    /**
     * revoke the key (a row, if any, and its registration) for a refused version, leaving a
     * tombstone (an invalid or refused version also fences older replays of valid ones) and the
     * refusal; true when a registration was revoked: a stored active row's (a paused one has
     * none), or one the index held (followed in memory only while the owner's scan runs:
     * {@link followDuringScan})
     */
    const refuse = (reason: RefusedVersion["reason"]) =>
      Effect.gen(function*() {
        yield* store.remove(ownerDid, rkey, { rev: event.rev, generation }, { cid, reason })
        const followed = writer.remove(key)
        return row?.active === true || followed !== undefined
      })
    if (event.operation === "delete") {
      yield* store.remove(ownerDid, rkey, { rev: event.rev, generation })
      writer.remove(key)
      return { _tag: "deleted", existed: row !== undefined } as const
    }
    const invalid = (kind: RefusedVersion["reason"]) =>
      Effect.gen(function*() {
        const revoked = yield* refuse(kind)
        yield* onCommit(
          Effect.sync(() => counts.invalidRecords++).pipe(Effect.zipRight(Metric.increment(invalidRecordsMetric)))
        )
        return { _tag: "invalid", kind, revoked } as const
      })
    const overLimit = (limit: AdmissionLimit) =>
      Effect.gen(function*() {
        const revoked = yield* refuse(admissionReason(limit))
        yield* onCommit(
          Effect.sync(() => counts.rejected[limit]++).pipe(
            Effect.zipRight(Metric.increment(Metric.tagged(admissionRejections, "limit", limit)))
          )
        )
        return { _tag: "rejected", limit, revoked } as const
      })
    const validated = validateWhRecord(event.record, writer.rules.validateOpts)
    if (Either.isLeft(validated)) return yield* invalid(validated.left)
    const { record, scope } = validated.right
    const enabled = record.enabled !== false
    const version = toRow(ownerDid, rkey, record, scope, event.rev, generation, event.cid, enabled)
    // valid, but PostgreSQL cannot store it: refused like an invalid version (as reconciliation does)
    if (!isStorableRow(version)) return yield* invalid("unstorable")
    // a new key of an owner at the cap of its stored records (enabled or not, before admission)
    if (row === undefined && ownerRecords !== undefined && ownerRecords >= ownerRecordsMax) {
      return yield* overLimit("owner_records")
    }
    if (!enabled) {
      yield* store.upsert(version)
      writer.remove(key)
      return { _tag: "disabled" } as const
    }
    const candidate = makeActiveWebhook(ownerDid, rkey, record, scope, event.rev)
    const limit = writer.admission(candidate)
    if (limit !== undefined) return yield* overLimit(limit)
    yield* store.upsert(version)
    writer.set(candidate)
    return { _tag: "active" } as const
  })
