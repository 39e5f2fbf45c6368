/**
 * The plan of a batch: registry mutations for wh-record events (applied as they come, in the
 * caller's transaction: each is visible to the next event), prior references (read once, applied
 * in memory to the shared state, so batches planned together see each other's changes as if they
 * were one batch), every event matched and its outbox rows prepared within the bounds. It writes
 * nothing else: what to write is the value it returns. Apart from the registry mutations and the
 * one read of prior references, the steps are pure functions over a draft of the plan.
 */
import { Effect, Either } from "effect"
import { parseScopeUri, type ScopeUri } from "../../schemas/AtUri.js"
import { isWellFormedRecordEvent, type RecordEvent, type StreamEvent } from "../../schemas/RecordEvent.js"
import { sanitizeWhRecordForDelivery, WH_COLLECTION } from "../../schemas/WhRecord.js"
import type { CursorWrite } from "../intake/CursorStore.js"
import type { StoreError } from "../platform/Persistence.js"
import type { RegistryShape, WhEventOutcome } from "../registry/Registry.js"
import { buildPayload, type CanonicalError, eventId } from "./Canonical.js"
import { matchEvent, type MatchResult } from "./Match.js"
import * as Outbox from "./Outbox.js"
import {
  boundRefs,
  type PriorRefIndex,
  type PriorRefLimits,
  putRow,
  removeRow,
  rowOf,
  type Shared
} from "./PriorRefIndex.js"
import type { PriorRefsStoreShape } from "./PriorRefsStore.js"
import { extractReferences } from "./References.js"
import { type ActiveWebhook, WebhookIndex, webhookKey } from "./WebhookIndex.js"

export type EventOutcome =
  | { readonly _tag: "acknowledged" }
  | { readonly _tag: "malformed" }
  | { readonly _tag: "no_match"; readonly registry?: WhEventOutcome }
  | { readonly _tag: "enqueued"; readonly deliveries: number; readonly registry?: WhEventOutcome }
  | { readonly _tag: "quarantined"; readonly reason: Outbox.QuarantineReason; readonly registry?: WhEventOutcome }

/** A batch's plan: what to write, and how to settle its outcomes once written. */
export interface Plan {
  readonly outcomes: ReadonlyArray<EventOutcome>
  /** the quarantine rows known now (`settle` adds those of corrupt items) */
  readonly quarantine: ReadonlyArray<Outbox.QuarantineRow>
  readonly prepared: Outbox.Prepared
  /** the accepted items' quarantine rows, should their stored body differ */
  readonly corruption: ReadonlyArray<Outbox.CorruptionCandidate>
  /** the outcomes once written: a corrupt item is quarantined (by the caller's write) */
  readonly settle: (enqueued: Outbox.EnqueueResult) => Outbox.EnqueueResult
  readonly batchTooComplex: number
  readonly batchRefused: number
}

/** What planning reads: the registry (and its index), prior references, the limits. */
export interface PlanContext {
  readonly registry: RegistryShape
  readonly index: WebhookIndex
  readonly isBacklinkDid: (did: string) => boolean
  readonly priorStore: PriorRefsStoreShape
  readonly priorIndex: PriorRefIndex
  readonly priorLimits: PriorRefLimits
  readonly outboxLimits: Outbox.OutboxLimits
}

// the outcomes without data, shared (one allocation per event less)
const ACKNOWLEDGED: EventOutcome = { _tag: "acknowledged" }
const MALFORMED: EventOutcome = { _tag: "malformed" }
const NO_MATCH: EventOutcome = { _tag: "no_match" }

const recordUri = (e: RecordEvent) => `at://${e.did}/${e.collection}/${e.rkey}`

const toBigInt = (s: string): bigint | undefined => (/^(0|[1-9]\d{0,18})$/.test(s) ? BigInt(s) : undefined)

/** A plan being made: per event its outcome, record URI (built once, only when needed), validity. */
class Draft {
  readonly outcomes: Array<EventOutcome>
  readonly items: Array<Outbox.EnqueueItem> = []
  readonly itemIndex: Array<number> = []
  readonly quarantine: Array<Outbox.QuarantineRow> = []
  readonly registryOutcomes: Array<WhEventOutcome | undefined>
  readonly uris: Array<string | undefined>
  readonly valid: Array<boolean>
  batchTooComplex = 0
  batchRefused = 0
  readonly priorIndex: PriorRefIndex
  readonly shared: Shared

  constructor(n: number, priorIndex: PriorRefIndex, shared: Shared) {
    this.outcomes = new Array(n)
    this.registryOutcomes = new Array(n)
    this.uris = new Array(n)
    this.valid = new Array(n)
    this.priorIndex = priorIndex
    this.shared = shared
  }

  quarantineEvent(i: number, e: RecordEvent, reason: Outbox.QuarantineReason): void {
    this.quarantine.push({
      stream: e.stream,
      relay: e.relay,
      reason,
      eventHash: eventId(e),
      cursor: toBigInt(e.cursor)
    })
    const registryOutcome = this.registryOutcomes[i]
    this.outcomes[i] = registryOutcome === undefined
      ? { _tag: "quarantined", reason }
      : { _tag: "quarantined", reason, registry: registryOutcome }
  }

  /** event i's record URI, built once and only when needed */
  uriAt(i: number, e: RecordEvent): string {
    const u = this.uris[i]
    if (u !== undefined) return u
    const v = recordUri(e)
    this.uris[i] = v
    return v
  }

  // (DID tests first: most events are from DIDs with no stored key, whose record URI is then
  // neither built nor hashed)
  mayHavePrior(i: number, e: RecordEvent): boolean {
    const x = this.priorIndex
    return !x.complete || (x.keyDids.has(e.did) && x.keys.has(this.uriAt(i, e)))
  }

  mayHave(i: number, e: RecordEvent): boolean {
    const s = this.shared
    return (s.writtenDids.has(e.did) && s.batchWritten.has(this.uriAt(i, e))) || this.mayHavePrior(i, e)
  }
}

/**
 * Prior references, a batch at a time: one read of every stored row this batch may touch (the key
 * index says which may exist), then the batch's puts and removes are applied to those rows in
 * memory, in order (the store's rules: monotonic on rev, an expired row counts as absent), and
 * each touched key's final state is written in one statement at the end. A key the index says is
 * absent is written with the store's own rev condition instead. Returns the keys to read (and marks
 * the well-formed commits valid).
 */
const priorReadsOf = (d: Draft, batch: ReadonlyArray<StreamEvent>): Array<string> => {
  const { read, current } = d.shared
  const toRead: Array<string> = []
  for (let i = 0; i < batch.length; i++) {
    const e = batch[i]
    if (e === undefined || e.kind !== "commit" || !isWellFormedRecordEvent(e)) continue
    d.valid[i] = true
    if (d.mayHavePrior(i, e)) {
      const uri = d.uriAt(i, e)
      if (!read.has(uri) && !current.has(uri)) {
        read.add(uri)
        toRead.push(uri)
      }
    }
  }
  return toRead
}

/** `matches` and those of `more` whose webhook is not among them */
const withRestored = (
  matches: ReadonlyArray<MatchResult>,
  more: ReadonlyArray<MatchResult>
): ReadonlyArray<MatchResult> => {
  if (more.length === 0) return matches
  const keys = new Set(matches.map((m) => m.webhook.key))
  return [...matches, ...more.filter((m) => !keys.has(m.webhook.key))]
}

/**
 * One valid commit event, after its registry mutation: references, matching, prior references.
 * `restored`: the registrations a delete or pause listed after the event in its commit removed
 * ahead of it (see `plan`), which the event still matches; undefined (nearly always) when none.
 */
const planEvent = (
  ctx: PlanContext,
  d: Draft,
  i: number,
  e: RecordEvent,
  isWh: boolean,
  restored: WebhookIndex | undefined
): void => {
  const { index, priorLimits } = ctx
  const shared = d.shared
  const record = e.operation === "delete" ? undefined : isWh ? sanitizeWhRecordForDelivery(e.record) : e.record

  // references: only worth walking when some backlink scope exists
  let newRefs: ReadonlyArray<{ readonly uri: string } & ScopeUri> = []
  let eventTooComplex = false
  const restoredBacklinks = restored !== undefined && restored.backlinkDids().size > 0
  if (record !== undefined && (index.backlinkDids().size > 0 || restoredBacklinks)) {
    const extracted = extractReferences(
      record,
      restoredBacklinks ? (did) => ctx.isBacklinkDid(did) || restored.isBacklinkDid(did) : ctx.isBacklinkDid
    )
    if (extracted.tooComplex) {
      d.batchTooComplex++
      eventTooComplex = true
    } else newRefs = extracted.refs
  }
  // a too-complex event is matched with no references at all, not even its stored prior
  // ones (SPEC §2.3: backlink matching is skipped); its row is still cleared below (its
  // new references are the empty set, SPEC §2.4), so a later update or delete does not
  // match on references the record may no longer hold. Only a stored row older than the event
  // is the version it replaced (SPEC §2.4's "old stored refs"): a replayed older event (a rewind,
  // a direct-stream replay) must not match on the references of a version written after it
  let refs: ReadonlyArray<ScopeUri> = newRefs
  if (!eventTooComplex && e.operation !== "create" && d.mayHave(i, e)) {
    const prior = rowOf(shared, d.uriAt(i, e))
    if (prior !== null && prior.live && prior.rev < e.rev && prior.refs.length > 0) {
      const merged: Array<ScopeUri> = [...newRefs]
      const seen = new Set(newRefs.map((r) => r.uri))
      for (const p of prior.refs) {
        if (seen.has(p)) continue
        const parsed = parseScopeUri(p)
        if (parsed !== undefined) merged.push(parsed)
      }
      refs = merged
    }
  }

  const matches = restored === undefined
    ? matchEvent(index, e, refs)
    : withRestored(matchEvent(index, e, refs), matchEvent(restored, e, refs))
  if (matches.length > 0) {
    const payload = buildPayload(e, record)
    if (Either.isLeft(payload)) {
      d.quarantineEvent(i, e, payload.left satisfies CanonicalError)
    } else {
      d.items.push({ event: e, payload: payload.right, matches })
      d.itemIndex.push(i)
    }
  } else if (d.outcomes[i] === undefined) {
    const r = d.registryOutcomes[i]
    d.outcomes[i] = r === undefined ? NO_MATCH : { _tag: "no_match", registry: r }
  }

  // prior references: monotonic on the record's rev; irrelevant records touch nothing
  const { addedKeys, batchWritten, removedIndexed, writtenDids } = shared
  if (e.operation === "delete" || newRefs.length === 0) {
    // a row removed frees its place: a new key of this batch no longer counts, nor does a key of the
    // index (read, so its row is deleted whatever its rev, in the same statement as the batch's puts)
    const uri = d.mayHave(i, e) ? d.uriAt(i, e) : undefined
    if (uri !== undefined && removeRow(shared, uri, e.rev)) {
      batchWritten.delete(uri)
      if (!addedKeys.delete(uri) && d.priorIndex.keys.has(uri)) removedIndexed.add(uri)
    }
  } else {
    // the table's bound (SPEC §2.4): the index holds a key for every row (see `PriorRefIndex`);
    // an incomplete one does not, and admits no new key until a reload finds the table within it;
    // a key it lacks whose row was read (an incomplete index reads every candidate) is not new:
    // the table's existing keys stay updatable. The rows once the batch is written: the index's,
    // less those the batch removed, plus its new keys; a key of the index the batch removed takes
    // a place again when written again (an incomplete index admits it: no key is new there)
    const { keys, complete } = d.priorIndex
    const uri = d.uriAt(i, e)
    const isNew = !keys.has(uri) && !batchWritten.has(uri) && !shared.stored.has(uri)
    const full = keys.size - removedIndexed.size + addedKeys.size >= priorLimits.maxRows
    if (complete ? (isNew || removedIndexed.has(uri)) && full : isNew) {
      d.batchRefused++
    } else {
      const { refs: kept, bytes } = boundRefs(
        newRefs.map((r) => r.uri),
        priorLimits
      )
      if (putRow(shared, uri, e.rev, kept, bytes, priorLimits.ttlSeconds > 0)) {
        if (isNew) addedKeys.add(uri)
        removedIndexed.delete(uri)
        batchWritten.add(uri)
        writtenDids.add(e.did)
      }
    }
  }
}

/** The plan of a draft: outbox rows within the bounds; an item over them is quarantined (known before writing). */
const finish = (ctx: PlanContext, d: Draft): Plan => {
  const { outcomes, items, itemIndex, quarantine, registryOutcomes } = d
  const prepared = Outbox.prepare(items, ctx.outboxLimits)
  const accepted = new Set<number>()
  for (const x of prepared.accepted) accepted.add(x.index)
  for (let j = 0; j < items.length; j++) {
    const i = itemIndex[j]
    const item = items[j]
    if (i !== undefined && item !== undefined && !accepted.has(j)) d.quarantineEvent(i, item.event, "fanout_limit")
  }
  /** the outcomes once written: a corrupt item is quarantined (by the caller's write) */
  const settle = (enqueued: Outbox.EnqueueResult) => {
    for (const x of prepared.accepted) {
      const i = itemIndex[x.index]
      const item = items[x.index]
      const o = enqueued.outcomes[x.index]
      if (i === undefined || item === undefined || o === undefined) continue
      if (o._tag === "enqueued") {
        if (outcomes[i] === undefined) {
          const r = registryOutcomes[i]
          outcomes[i] = r === undefined
            ? { _tag: "enqueued", deliveries: o.rows }
            : { _tag: "enqueued", deliveries: o.rows, registry: r }
        }
      } else {
        d.quarantineEvent(i, item.event, o._tag)
      }
    }
    return enqueued
  }
  const corruption: Array<Outbox.CorruptionCandidate> = []
  for (const x of prepared.accepted) {
    const e = items[x.index]?.event
    if (e === undefined) continue
    corruption.push({
      eventId: x.body.eventId,
      row: { stream: e.stream, relay: e.relay, reason: "corruption", eventHash: eventId(e), cursor: toBigInt(e.cursor) }
    })
  }
  return {
    outcomes,
    quarantine,
    prepared,
    corruption,
    settle,
    batchTooComplex: d.batchTooComplex,
    batchRefused: d.batchRefused
  }
}

/** A record written with `enabled: false` (an own data property, as validation reads it): it takes no capacity. */
const pauses = (record: unknown): boolean =>
  typeof record === "object" && record !== null &&
  Object.getOwnPropertyDescriptor(record, "enabled")?.value === false

/**
 * The valid wh-record deletes and writes of paused records (`enabled: false`) listed after the
 * write at `i` in the same commit (the run of consecutive events of its repo with its rev; on the
 * relay a commit's operations on other collections sit among them), when `i` is not itself a
 * delete. A commit is atomic: an owner at its admission limit that creates a webhook and deletes
 * another in one commit (`applyWrites` lists operations in the client's order, and the streams keep
 * it) ends within the limit, so its deletes and pauses (neither is subject to admission) are
 * applied first. Matching still runs in the listed order: the events listed before a delete or pause
 * still match the registration it removed (`plan` keeps it aside for them).
 */
const commitReleasesAfter = (
  batch: ReadonlyArray<StreamEvent>,
  d: Draft,
  i: number
): { readonly releases: ReadonlyArray<number>; readonly end: number } => {
  const e = batch[i]
  if (e === undefined || e.kind !== "commit" || e.operation === "delete") return { releases: [], end: i }
  const releases: Array<number> = []
  let j = i + 1
  for (; j < batch.length; j++) {
    const o = batch[j]
    if (o === undefined || o.kind !== "commit" || o.did !== e.did || o.rev !== e.rev) break
    if (o.collection !== WH_COLLECTION || d.valid[j] !== true) continue
    if (o.operation === "delete" || pauses(o.record)) releases.push(j)
  }
  return { releases, end: j - 1 }
}

/**
 * Plan a batch: registry mutations (applied here, in the caller's transaction), prior
 * references (read once, applied in memory to `shared`: batches planned together see each
 * other's changes as if they were one batch), outbox rows prepared. Writes nothing else.
 */
export const plan = (
  ctx: PlanContext,
  batch: ReadonlyArray<StreamEvent>,
  registryWriter: boolean,
  shared: Shared
): Effect.Effect<Plan, StoreError> =>
  Effect.gen(function*() {
    const d = new Draft(batch.length, ctx.priorIndex, shared)
    const toRead = priorReadsOf(d, batch)
    if (toRead.length > 0) { for (const [k, v] of yield* ctx.priorStore.read(toRead)) shared.stored.set(k, v) }
    /** registry outcomes of deletes and pauses applied ahead of their commit's earlier operations */
    const appliedEarly = new Map<number, WhEventOutcome>()
    /** the last event of the commit run whose deletes were looked for */
    let commitScannedTo = -1
    /**
     * The registrations that run's deletes and pauses removed ahead of it, as an index of their own
     * (matched besides the registry's: SPEC §2.5, a mutation is visible to the next event only),
     * each until the position of its delete or pause; undefined when there are none.
     */
    let restored: WebhookIndex | undefined = undefined
    const removedAt: Array<{ readonly at: number; readonly key: string }> = []
    for (let i = 0; i < batch.length; i++) {
      const e = batch[i]
      if (e === undefined) continue
      if (e.kind !== "commit") {
        d.outcomes[i] = ACKNOWLEDGED
        continue
      }
      if (d.valid[i] !== true) {
        d.outcomes[i] = MALFORMED
        continue
      }
      const isWh = e.collection === WH_COLLECTION
      if (isWh && registryWriter) {
        let r = appliedEarly.get(i)
        if (r === undefined) {
          // this commit's deletes and pauses first: admission judges what the commit leaves (SPEC §2.6)
          if (i > commitScannedTo) {
            const run = commitReleasesAfter(batch, d, i)
            commitScannedTo = run.end
            restored = undefined
            removedAt.length = 0
            for (const j of run.releases) {
              const del = batch[j]
              if (del !== undefined && del.kind === "commit") {
                const key = webhookKey(del.did, del.rkey)
                const before: ActiveWebhook | undefined = ctx.index.get(key)
                appliedEarly.set(j, yield* ctx.registry.applyWhEvent(del))
                if (before !== undefined && ctx.index.get(key) === undefined) {
                  restored ??= new WebhookIndex()
                  restored.upsert(before)
                  removedAt.push({ at: j, key })
                }
              }
            }
          }
          r = yield* ctx.registry.applyWhEvent(e)
        }
        d.registryOutcomes[i] = r
        if (r._tag === "rejected") {
          d.quarantineEvent(i, e, "invalid_subscription")
          // the record is still an event other webhooks may watch: fall through to matching
        }
      }
      if (restored !== undefined) {
        // past the commit run: none is kept; at a delete or pause: its registration is gone from here on
        if (i > commitScannedTo) restored = undefined
        else for (const x of removedAt) if (x.at <= i) restored.remove(x.key)
      }
      planEvent(ctx, d, i, e, isWh, restored)
    }
    return finish(ctx, d)
  })

// ---------------------------------------------------------------------------------------------
// Plans written together by one statement

/** a plan and what writing it did */
export interface Done {
  readonly plan: Plan
  readonly enqueued: Outbox.EnqueueResult
}

/**
 * The one statement's contents for consecutive plans (their bodies once per event id, their rows,
 * corruption candidates, the quarantine rows known now, the streams' cursors), without the prior
 * references.
 */
export const combine = (plans: ReadonlyArray<Plan>, cursorOf: (k: number) => CursorWrite | undefined) => {
  const bodies = new Map<string, Outbox.EventBody>()
  const rows: Array<Outbox.OutboxRow> = []
  const corruption: Array<Outbox.CorruptionCandidate> = []
  const quarantine: Array<Outbox.QuarantineRow> = []
  const cursors: Array<CursorWrite> = []
  for (let k = 0; k < plans.length; k++) {
    const p = plans[k]
    const cursor = cursorOf(k)
    if (p === undefined) continue
    for (const b of p.prepared.bodies) if (!bodies.has(b.eventId)) bodies.set(b.eventId, b)
    for (const r of p.prepared.rows) rows.push(r)
    for (const c of p.corruption) corruption.push(c)
    // the quarantine rows known now; corrupt items' rows are inserted by the statement
    for (const q of p.quarantine) quarantine.push(q)
    if (cursor !== undefined) cursors.push(cursor)
  }
  return { bodies: [...bodies.values()], rows, corruption, quarantine, cursors }
}

/** Settle plans written by one statement: rows inserted, by plan in order (a row two plans share counts for the first). */
export const settleTogether = (
  plans: ReadonlyArray<Plan>,
  r: { readonly insertedIds: ReadonlySet<string>; readonly existing: ReadonlyMap<string, string> }
): Array<Done> => {
  const counted = new Set<string>()
  const done: Array<Done> = []
  for (const p of plans) {
    let inserted = 0
    for (const row of p.prepared.rows) {
      if (r.insertedIds.has(row.deliveryId) && !counted.has(row.deliveryId)) {
        counted.add(row.deliveryId)
        inserted++
      }
    }
    done.push({ plan: p, enqueued: p.settle(Outbox.finish(p.prepared, { existing: r.existing, inserted })) })
  }
  return done
}

/** What a unit of work's plans add up to (for counters and metrics after commit). */
export const tally = (done: ReadonlyArray<Done>) => {
  let batchRefused = 0
  let inserted = 0
  let duplicates = 0
  let batchTooComplex = 0
  const byReason = new Map<string, number>()
  const byOutcome = new Map<EventOutcome["_tag"], number>()
  for (const { enqueued, plan: p } of done) {
    batchTooComplex += p.batchTooComplex
    batchRefused += p.batchRefused
    inserted += enqueued.inserted
    duplicates += enqueued.duplicates
    for (const q of p.quarantine) byReason.set(q.reason, (byReason.get(q.reason) ?? 0) + 1)
    for (const o of p.outcomes) if (o !== undefined) byOutcome.set(o._tag, (byOutcome.get(o._tag) ?? 0) + 1)
  }
  return { batchRefused, inserted, duplicates, batchTooComplex, byReason, byOutcome }
}
