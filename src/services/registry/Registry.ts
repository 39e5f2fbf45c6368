/**
 * The registry (SPEC §2.5, §2.6, §3.4): the stored webhook records and the in-memory index of the
 * active ones that the matcher reads.
 *
 * - `load` fills the index at startup from the store, re-validating every record under the current
 *   configuration and applying the admission limits; whatever does not fit is counted (health),
 *   never a crash. It reads the store's load order (oldest first) in bounded pages, each owner's
 *   first `ownerActiveMax` active rows only, until the index is full or the rows run out, so that
 *   what it admits never depends on how many rows other owners hold beyond their limit; `swapOwner`
 *   takes an owner's candidates by the same rule.
 * - `applyWhEvent` is the serialized, fenced live mutation of one `place.wisp.v2.wh` event: a write
 *   applies only if its rev is strictly greater than the stored row's and the tombstone's, and than
 *   the owner's snapshot rev (checked by the generation bump's own statement); each applied write
 *   bumps the owner's generation and stamps the row/tombstone with it; an invalid record, a valid
 *   one PostgreSQL cannot store (`unstorable`: a NUL or a lone surrogate, as reconciliation refuses
 *   it) or one over an admission limit revokes the previous registration and is remembered among
 *   the owner's refused records (its cid, rev and reason; `RejectedStore`), which a valid version or
 *   a delete clears. A write that would store a new key for an owner who already has
 *   `RECONCILE_MAX_RECORDS` stored records (active or not: what one scan can read) is refused the same
 *   way, `limit_owner_records`, before admission judges it (an update or a delete of a stored key
 *   always passes; the count, bounded by the cap, is read under the owner's lock with the key:
 *   `RegistryStore.get`). A write fenced only by the snapshot of the scan in progress (newer than the
 *   owner's last completed snapshot) is applied as usual but stamped below the scan's token
 *   (`LiveWrite.heldBackGeneration`): the snapshot decides its key when the scan completes, and a scan
 *   that fails leaves the store with what the owner wrote. A fenced write (`stale`) changes nothing
 *   in the store; in memory, a replay of the key's stored version (same rev: committed by another
 *   leader, or by this process before a restart) makes the index take the stored state of that key
 *   (`settle`), a write fenced while a scan runs is followed by the index until the scan's swap
 *   (`followDuringScan`), and a write older than the scan's own version of its key (a page's row or
 *   a step 4 tombstone) makes the index take that version (`followScanVersion`); other fenced
 *   writes change nothing.
 *   A write that frees room under an admission limit (or removes a stored row of an owner) requests,
 *   in its transaction, the reconciliation of the owners whose records were refused for that limit
 *   (RoomRequests). The write itself, once the owner is locked and the key read: LiveWrite.
 * - `transactional` wraps a unit of work (one intake batch): index changes are visible to the next
 *   event at once, and undone if the transaction fails, so memory never runs ahead of the database.
 *   A failure may hide a commit (the connection dropped after the server committed), so the owners
 *   the unit touched are then reloaded from the store, before the next unit at the latest. Swaps of
 *   other owners do not wait for a unit (the owner lock orders one owner only): one that ran while a
 *   failed unit was open was judged against the unit's changes, which the undo takes back (room it
 *   freed, then used by the swap, is taken again; room it used is freed). So after such a failure
 *   the swapped owners' registrations are judged again at once, in memory (what no longer fits
 *   leaves the index: no limit is exceeded, even while the store does not answer), and the unit's
 *   owners, then the swapped ones, are reloaded from the store together (`swapOwners`): the
 *   registrations the unit left as they were keep their room, and the swapped owners' records are
 *   admitted into what is left, like every other record that would become active (SPEC §2.6).
 * - `swapOwner` replaces one owner's registrations in one step (reconciliation completion). While an
 *   owner is scanning or failed, nothing here removes its registrations: they keep matching. The
 *   rows it refuses for an admission limit are remembered among the owner's refused records, and
 *   the keys it admits leave them (SwapRefusals); the counters count a refusal only when it is new
 *   (the key was registered, or that version was not already refused for that limit: SwapRefusals).
 * - `syncOwner` follows a change another process made to an owner (RegistrySync: the intake leader
 *   of a deployment whose roles are split over several processes).
 */
import { Cause, Context, Effect, Layer, Metric, Option } from "effect"
import { parseCidrs } from "../../schemas/Net.js"
import type { RecordEvent } from "../../schemas/RecordEvent.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import { type ActiveWebhook, WebhookIndex, webhookKey } from "../matching/WebhookIndex.js"
import { FirehookConfig } from "../platform/Config.js"
import { Health, statsSection } from "../platform/Health.js"
import { StoreError } from "../platform/Persistence.js"
import { activeFromRow, admissionIn, type Rules } from "./IndexRules.js"
import * as LiveWrite from "./LiveWrite.js"
import type { WhEventOutcome } from "./LiveWrite.js"
import type { AdmissionLimit } from "./RegistryConfig.js"
import {
  type LoadedRow,
  type LoadPosition,
  RegistryStore,
  type RegistryStoreShape,
  type WebhookRow
} from "./RegistryStore.js"
import type { SyncOutcome, SyncOwnerOptions } from "./RegistrySync.js"
import * as RoomRequests from "./RoomRequests.js"
import * as SwapRefusals from "./SwapRefusals.js"

export type { AdmissionLimit }
export type { WhEventOutcome } from "./LiveWrite.js"
export { heldBackGeneration, toRow } from "./LiveWrite.js"
export { ROOM_REQUESTS_MAX } from "./RoomRequests.js"

export interface RegistryStats {
  readonly active: number
  readonly owners: number
  readonly directDids: number
  readonly backlinkDids: number
  /** active rows in the store that were not loaded at startup (over a limit or no longer valid) */
  readonly notLoaded: number
  readonly rejected: { readonly [K in AdmissionLimit]: number }
  readonly invalidRecords: number
}

export interface RegistryShape {
  readonly index: WebhookIndex
  readonly load: Effect.Effect<void, StoreError>
  /** drop the in-memory index and load it again from the store (a replica taking the intake role) */
  readonly reload: Effect.Effect<void, StoreError>
  readonly applyWhEvent: (event: RecordEvent) => Effect.Effect<WhEventOutcome, StoreError>
  /**
   * Run a unit of work: its index changes are undone if it fails, and when the failure may have
   * come after the commit ({@link mayHaveCommitted}), or when other owners were swapped while it
   * ran (judged against what was undone: judged again at once in memory), the owners it touched,
   * then the swapped ones, are reloaded from the store. A reload that fails is retried before the
   * next unit, which fails with it (nothing goes on before memory matches the database again).
   */
  readonly transactional: <A, E, R>(eff: Effect.Effect<A, E, R>) => Effect.Effect<A, E | StoreError, R>
  readonly swapOwner: (ownerDid: string) => Effect.Effect<void, StoreError>
  /**
   * Another process changed this owner's registrations in the store (its reconciliation completed,
   * a delivery marked one gone or it was resumed; SPEC §6.4): follow it. Run it holding the owner's
   * row lock (see RegistrySync). An owner that is scanning or failed keeps its pre-scan
   * registrations (SPEC §5.3); any other owner's are swapped for the store's ({@link swapOwner}).
   * A gone registration stays indexed: gone only affects delivery (its new matches are enqueued and
   * the worker parks them as `webhook_disabled`, SPEC §4.3), so a replay after `resume` recovers them.
   * `afterScan` (a change of the owner was found while it was scanning, and that scan has ended):
   * a failed owner is swapped too, since its last completion may never have been swapped in here
   * (the store's rows, as a load takes them). Answers what it did.
   */
  readonly syncOwner: (ownerDid: string, options?: SyncOwnerOptions) => Effect.Effect<SyncOutcome, StoreError>
  readonly stats: Effect.Effect<RegistryStats>
}

export class Registry extends Context.Tag("firehook/Registry")<Registry, RegistryShape>() {}

const activeGauge = Metric.gauge("firehook_registry_active_webhooks", { description: "Active webhooks in memory" })

/**
 * Whether a unit of work that failed with `cause` may have been committed all the same: anything
 * but the server's own answer to a statement (a SQLSTATE outside the classes of a lost connection
 * or a server going away: 08, 57, 58, XX), after which PostgreSQL has rolled the transaction
 * back. A dropped connection, a timeout, an interruption or a defect leave the outcome unknown.
 */
export const mayHaveCommitted = (cause: Cause.Cause<unknown>): boolean => {
  if (Cause.isInterrupted(cause) || Cause.isDie(cause)) return true
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure) || !(failure.value instanceof StoreError)) return true
  const code = failure.value.code
  return !/^[0-9A-DF-Z][0-9A-Z]{4}$/.test(code) || /^(08|57|58|XX)/.test(code)
}

interface Journal {
  readonly undo: Array<() => void>
  readonly commit: Array<Effect.Effect<void>>
  /** the owners whose registrations the unit may have changed */
  readonly owners: Set<string>
  /** the reconciliations the unit requested for room it freed (RoomRequests) */
  readonly room: RoomRequests.RoomMemo
  /**
   * the owners swapped (`swapOwners`) while the unit was open: admitted against its index changes,
   * which an undo takes back
   */
  readonly swapped: Set<string>
}

/**
 * The registrations a load admits, in a new index: the store's active rows in the load order
 * (oldest first), each owner's first `ownerActiveMax` only, admitted one by one; read in pages of
 * a full index and one row more (one page in the common case) until the index is full (a full
 * index admits nothing more) or the rows run out. Memory: one page and the index. The refusals it
 * makes are remembered in `counted`.
 */
const loadIndex = (store: RegistryStoreShape, rules: Rules, counted: SwapRefusals.Counted) =>
  Effect.gen(function*() {
    const page = rules.limits.activeMax + 1
    const loaded = new WebhookIndex()
    let after: LoadPosition | undefined = undefined
    for (;;) {
      const rows: ReadonlyArray<LoadedRow> = yield* store.loadActive(page, {
        ownerMax: rules.limits.ownerActiveMax,
        after
      })
      for (const row of rows) {
        const w = activeFromRow(rules, row)
        if (w === undefined) continue
        const limit = admissionIn(rules, loaded, w)
        // a refusal of the load counts as not loaded; remembered, so a swap does not count it again
        if (limit === undefined) loaded.upsert(w)
        else counted.set(row.ownerDid, row.rkey, SwapRefusals.refusalTag(limit, row.cid, row.rev))
      }
      const last = rows[rows.length - 1]
      if (last === undefined || rows.length < page || loaded.size >= rules.limits.activeMax) return loaded
      after = last.position
    }
  })

/**
 * An owner's swap candidates, as the load takes them: its first `ownerActiveMax` active rows that
 * are still valid, each with its row; the active rows beyond are refused for the owner's limit.
 */
const swapCandidates = (
  rules: Rules,
  rows: ReadonlyArray<WebhookRow>,
  decisions: SwapRefusals.SwapDecisions
): Array<readonly [ActiveWebhook, WebhookRow]> => {
  const active = rows.filter((r) => r.active)
  const max = rules.limits.ownerActiveMax
  for (const row of active.slice(max)) SwapRefusals.refuse(decisions, row, "owner")
  const next: Array<readonly [ActiveWebhook, WebhookRow]> = []
  for (const row of active.slice(0, max)) {
    const w = activeFromRow(rules, row)
    if (w !== undefined) next.push([w, row])
  }
  return next
}

export const make = Effect.gen(function*() {
  const config = yield* FirehookConfig
  const store = yield* RegistryStore
  const limits = config.registry
  const jetstream = config.intake.source === "jetstream"
  const index = new WebhookIndex()
  let journal: Journal | undefined
  /**
   * Owners whose in-memory registrations may differ from the store: a unit of work that touched
   * them failed with an outcome unknown to this process (at most the owners of such units' wh
   * events; emptied by a reload).
   */
  const unsynced = new Set<string>()
  let notLoaded = 0
  const counts = LiveWrite.noCounts()
  const rejected = counts.rejected
  /** the refusals counted (or, the load's, counted as not loaded): a swap counts only new ones */
  const counted = SwapRefusals.makeCounted()
  /** the cap of an owner's stored records a live write of a new key must stay under (what a scan reads) */
  const ownerRecordsMax = config.reconcile.maxRecords

  /** run after the enclosing transaction commits (at once outside one) */
  const onCommit = (f: Effect.Effect<void>): Effect.Effect<void> =>
    journal === undefined ? f : Effect.sync(() => void journal?.commit.push(f))

  const setInIndex = (w: ActiveWebhook) => {
    const prev = index.upsert(w)
    journal?.undo.push(() => (prev === undefined ? index.remove(w.key) : index.upsert(prev)))
  }
  const removeFromIndex = (key: string) => {
    const prev = index.remove(key)
    if (prev !== undefined) journal?.undo.push(() => index.upsert(prev))
    return prev
  }

  const validateOpts = { allowInsecureDev: config.allowInsecureDev, allowCidrs: parseCidrs(config.delivery.allowCidrs) }
  const rules: Rules = { limits, jetstream, validateOpts }
  const admission = (w: ActiveWebhook) => admissionIn(rules, index, w)

  const reload = Effect.gen(function*() {
    const total = yield* store.countActive
    // built aside, then swapped in one synchronous step: readers never see an empty or partial index
    const loaded = yield* loadIndex(store, rules, counted)
    for (const w of [...index.all()]) index.remove(w.key)
    for (const w of loaded.all()) index.upsert(w)
    notLoaded = Math.max(0, total - loaded.size)
    // every owner is as the store has it now
    unsynced.clear()
    yield* Metric.set(activeGauge, index.size)
    yield* Effect.logInfo("registry loaded").pipe(Effect.annotateLogs({ active: index.size, notLoaded }))
  }).pipe(Effect.withSpan("Registry.load"))
  const load = reload

  const writer: LiveWrite.IndexWriter = { rules, index, admission, set: setInIndex, remove: removeFromIndex }
  const live: LiveWrite.LiveWriteContext = { store, writer, onCommit, ownerRecordsMax, counts }

  const room: RoomRequests.RoomContext = { store, index, jetstream, memo: () => journal?.room, onCommit }
  /** a live write, then the reconciliations the room it freed may admit, in its transaction */
  const applyWhEvent = (event: RecordEvent): Effect.Effect<WhEventOutcome, StoreError> =>
    RoomRequests.afterWrite(room, event.did, applyWrite(event)).pipe(Effect.withSpan("Registry.applyWhEvent"))

  /** a live write, and whether it removed a stored row of the owner (RoomRequests) */
  const applyWrite = (event: RecordEvent): Effect.Effect<RoomRequests.Written<WhEventOutcome>, StoreError> =>
    Effect.gen(function*() {
      const ownerDid = event.did
      const rkey = event.rkey
      journal?.owners.add(ownerDid)
      yield* store.lockOwner(ownerDid)
      // with the owner's stored rows up to the cap when the key has none (a write would add one)
      const state = yield* store.get(ownerDid, rkey, event.operation === "delete" ? undefined : ownerRecordsMax)
      const outcome = yield* LiveWrite.writeKey(live, event, state)
      // counted (once committed): a swap of the owner refusing this version for that limit counts nothing
      if (outcome._tag === "rejected") {
        const tag = SwapRefusals.refusalTag(outcome.limit, event.cid, event.rev)
        yield* onCommit(Effect.sync(() => counted.set(ownerDid, rkey, tag)))
      } else if (outcome._tag !== "stale") counted.set(ownerDid, rkey, undefined)
      // a delete or a refused version of a stored key removed its row (a version stored replaces it)
      const removed = outcome._tag === "deleted" || outcome._tag === "invalid" || outcome._tag === "rejected"
      return { outcome, rowRemoved: state.row !== undefined && removed }
    })

  /**
   * reload the unsynced owners from the store, together and in the order they were added (a failed
   * unit's owners first, then the owners swapped while it ran); they leave the set once reloaded
   */
  const resync = Effect.suspend(() => {
    const owners = [...unsynced]
    return Effect.zipRight(swapOwners(owners), Effect.sync(() => owners.forEach((did) => unsynced.delete(did))))
  }).pipe(Effect.withSpan("Registry.resync"))

  /**
   * Judge the registrations of `owners` again, in memory, in one synchronous step: each owner's are
   * cleared, then admitted again (owner after owner, each in its order) against everyone else's;
   * what no longer fits leaves the index. After a failed unit's undo, for the owners swapped while
   * it ran (what the undo put back keeps its room; the resync that follows reads them from the store).
   */
  const rejudge = (owners: ReadonlyArray<string>) => {
    const held = owners.map((did) => index.byOwner(did))
    for (const did of owners) index.replaceOwner(did, [])
    for (const ws of held) {
      for (const w of ws) if (admission(w) === undefined) index.upsert(w, w.fingerprint)
    }
  }

  const transactional = <A, E, R>(eff: Effect.Effect<A, E, R>): Effect.Effect<A, E | StoreError, R> =>
    Effect.suspend(() => {
      const j: Journal = { undo: [], commit: [], owners: new Set(), room: RoomRequests.newMemo(), swapped: new Set() }
      const unit = Effect.suspend(() => {
        journal = j
        return eff
      }).pipe(
        Effect.onExit((exit) =>
          Effect.gen(function*() {
            journal = undefined
            if (exit._tag === "Success") {
              for (const f of j.commit) yield* f
            } else {
              for (let i = j.undo.length - 1; i >= 0; i--) j.undo[i]?.()
              // swaps that ran meanwhile were judged against what was just undone: judge them again
              const raced = j.undo.length > 0 && j.swapped.size > 0
              if (raced) rejudge([...j.swapped])
              // the store may have kept what was undone here: reload those owners now (or, if the
              // store does not answer, before the next unit), and after them the swapped ones
              if (raced || mayHaveCommitted(exit.cause)) { for (const did of j.owners) unsynced.add(did) }
              if (raced) { for (const did of j.swapped) unsynced.add(did) }
            }
            yield* Metric.set(activeGauge, index.size)
          })
        ),
        // outside the finalizer, so an interruption (shutdown) does not wait for the store
        Effect.tapErrorCause(() =>
          unsynced.size === 0 ? Effect.void : resync.pipe(
            Effect.catchAll((e) =>
              Effect.logWarning("registry owners not reloaded after a failed batch").pipe(
                Effect.annotateLogs({ owners: unsynced.size, code: e.code })
              )
            )
          )
        )
      )
      return unsynced.size === 0 ? unit : Effect.zipRight(resync, unit)
    })

  const recordSwap = SwapRefusals.makeRecorder(store)
  /**
   * Replace the registrations of `owners` with their stored rows: the rows read, then one
   * synchronous step (no fiber can observe a half-swapped owner): every one of them cleared, then
   * each owner's candidates admitted, owner after owner in the order given, against everyone else's
   * registrations (and those just admitted).
   */
  const swapOwners = (owners: ReadonlyArray<string>) =>
    Effect.gen(function*() {
      const read = yield* Effect.forEach(
        [...new Set(owners)],
        (did) => Effect.map(store.ownerRows(did), (rows) => ({ did, rows }))
      )
      const swaps = read.map(({ did, rows }) => {
        const decisions = SwapRefusals.newDecisions()
        const next = swapCandidates(rules, rows, decisions)
        // a registration the swap keeps as it was is not a new one (the streams replay for new ones)
        const previous = index.byOwner(did)
        return { did, decisions, next, before: new Map(previous.map((w) => [w.key, w.fingerprint])) }
      })
      for (const { did } of swaps) {
        index.replaceOwner(did, [])
        journal?.swapped.add(did)
      }
      const fresh: Array<AdmissionLimit> = []
      for (const { before, decisions, did, next } of swaps) {
        for (const [w, row] of next) {
          const limit = admission(w)
          if (limit !== undefined) {
            SwapRefusals.refuse(decisions, row, limit)
            continue
          }
          index.upsert(w, before.get(w.key))
          SwapRefusals.admit(decisions, w)
        }
        const registered = (rkey: string) => before.has(webhookKey(did, rkey))
        for (const limit of SwapRefusals.countNew(counted, did, decisions, registered)) {
          rejected[limit]++
          fresh.push(limit)
        }
      }
      // the metric counts what health counts (after the synchronous swap)
      for (const limit of fresh) yield* Metric.increment(Metric.tagged(LiveWrite.admissionRejections, "limit", limit))
      yield* Metric.set(activeGauge, index.size)
      for (const { before, decisions, did } of swaps) {
        // the refusals (limit_* entries, which RoomRequests reads) and the admissions, remembered
        yield* recordSwap(did, decisions)
        yield* Effect.logDebug("owner registrations swapped").pipe(
          Effect.annotateLogs({ before: before.size, after: decisions.admitted.length })
        )
      }
    }).pipe(Effect.withSpan("Registry.swapOwners"))

  const swapOwner = (ownerDid: string) => swapOwners([ownerDid]).pipe(Effect.withSpan("Registry.swapOwner"))

  const syncOwner = (ownerDid: string, options?: SyncOwnerOptions) =>
    Effect.gen(function*() {
      const owner = yield* store.owner(ownerDid)
      // snapshot pages of a scan stay in the store until it completes (a gone mark changes no matching)
      if (owner?.status === "scanning") return "scanning" as const
      if (owner?.status === "failed" && options?.afterScan !== true) return "failed" as const
      yield* swapOwner(ownerDid)
      return "swapped" as const
    }).pipe(Effect.withSpan("Registry.syncOwner"))

  const stats = Effect.sync(
    (): RegistryStats => ({
      active: index.size,
      owners: index.ownerTotal,
      directDids: index.wantedDids().size,
      backlinkDids: index.backlinkDids().size,
      notLoaded,
      rejected: { ...rejected },
      invalidRecords: counts.invalidRecords
    })
  )

  const shape: RegistryShape = {
    index,
    load,
    reload,
    applyWhEvent,
    transactional,
    swapOwner,
    syncOwner,
    stats
  }
  return shape
})

export const isWhEvent = (e: RecordEvent): boolean => e.collection === WH_COLLECTION

/** The admission part of a health section (the registry's, the intake's): rejections by limit. */
export const admissionSection = (rejected: { readonly [K in AdmissionLimit]?: number }) => ({
  rejectedTotal: rejected.total ?? 0,
  rejectedOwner: rejected.owner ?? 0,
  rejectedDirectDids: rejected.direct_dids ?? 0,
  rejectedBacklinkDids: rejected.backlink_dids ?? 0,
  rejectedOwnerRecords: rejected.owner_records ?? 0
})

/** The registry, loaded, with its health section. */
export const layer = Layer.scoped(
  Registry,
  Effect.gen(function*() {
    const registry = yield* make
    yield* registry.load
    const health = yield* Effect.serviceOption(Health)
    if (Option.isSome(health)) {
      yield* health.value.register(
        "registry",
        statsSection(
          Effect.map(registry.stats, (s) => ({ ...s, admission: admissionSection(s.rejected) })),
          ["active", "owners", "directDids", "backlinkDids", "notLoaded", "invalidRecords", "admission"]
        )
      )
    }
    return registry
  })
)
