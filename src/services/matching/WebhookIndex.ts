/**
 * The in-memory index of ACTIVE webhooks (SPEC §2.5): every lookup the matcher and intake need is a
 * Map lookup keyed by DID or key, never a scan.
 *
 * Maintained incrementally:
 * - `key → webhook`, `owner → webhooks`, `scope DID → webhooks` (those that match directly: all but
 *   `backlinksOnly` ones), `backlink scope DID → webhooks`; the last two also split by scope
 *   shape within the DID (`ScopeShapes`), which is what the matcher looks up;
 * - `wantedDids` = owners ∪ scope DIDs (the Jetstream `direct` stream's `wantedDids`), refcounted,
 *   with the bytes its members take in an `options_update` message ({@link wantedDidsBytes});
 * - `backlinkDids` = scope DIDs of backlink webhooks, refcounted.
 *
 * Every mutation is synchronous, so a reader (the matcher) always sees the state before or after a
 * whole mutation, never half of one, and the next event processed sees it (SPEC §2.5).
 * The index is not itself an Effect service: the Registry service owns one and serializes writes.
 *
 * @since 0.1.0
 */
import { compileCollectionGlob, type ScopeUri } from "../../schemas/AtUri.js"
import type { Operation } from "../../schemas/RecordEvent.js"
import type { WhRecord } from "../../schemas/WhRecord.js"
import { subscriptionFingerprint } from "./Canonical.js"
import { formatScopeUri } from "./References.js"

export type SigningMode = "none" | "record_secret" | "secret_id"

/**
 * An active (valid, enabled, admitted) webhook, as the matcher and the outbox need it.
 * Holds no secret value: an inline secret is read from the stored record at delivery time.
 */
export interface ActiveWebhook {
  readonly ownerDid: string
  readonly rkey: string
  /** `${ownerDid}/${rkey}` */
  readonly key: string
  readonly scope: ScopeUri
  /** canonical `at://did[/collection[/rkey]]` */
  readonly scopeUri: string
  /** backlink matches are made: `scope.backlinks` or `scope.backlinksOnly` (which implies it) */
  readonly backlinks: boolean
  /**
   * `scope.backlinksOnly`: never a direct match (SPEC §2.2 step 4). Such a webhook is not in the
   * scope DID → webhooks map, so the direct loop of the matcher never sees it.
   */
  readonly backlinksOnly: boolean
  /** undefined = all operations */
  readonly events: ReadonlySet<Operation> | undefined
  readonly url: string
  readonly signingMode: SigningMode
  readonly secretId: string | undefined
  readonly fingerprint: string
  /** the repo revision of the wh record this registration reflects */
  readonly rev: string
  /** the scope's collection glob (always true for a DID-only scope) */
  readonly matchesCollection: (collection: string) => boolean
}

/** `${ownerDid}/${rkey}` */
export const webhookKey = (ownerDid: string, rkey: string): string => `${ownerDid}/${rkey}`

const always = (): boolean => true

/**
 * Builds the active form of a validated wh record. The caller has validated the record (and its
 * scope) and decided it is active: `enabled === false` records must not be indexed.
 * An `events` list that is empty or names all three operations becomes `undefined` (all).
 *
 * @since 0.1.0
 */
export const makeActiveWebhook = (
  ownerDid: string,
  rkey: string,
  record: WhRecord,
  scope: ScopeUri,
  rev: string
): ActiveWebhook => {
  const scopeUri = formatScopeUri(scope)
  const backlinksOnly = record.scope.backlinksOnly === true
  const backlinks = backlinksOnly || record.scope.backlinks === true
  const eventList = record.events
  const events: ReadonlySet<Operation> | undefined = eventList === undefined || eventList.length === 0
    ? undefined
    : new Set(eventList)
  const hasInlineSecret = record.secret !== undefined
  const secretId = record.secretId
  return {
    ownerDid,
    rkey,
    key: webhookKey(ownerDid, rkey),
    scope,
    scopeUri,
    backlinks,
    backlinksOnly,
    events: events !== undefined && events.size >= 3 ? undefined : events,
    url: record.url,
    signingMode: hasInlineSecret ? "record_secret" : secretId !== undefined ? "secret_id" : "none",
    secretId,
    fingerprint: subscriptionFingerprint({
      url: record.url,
      scope: scopeUri,
      backlinks,
      backlinksOnly,
      events: eventList,
      enabled: record.enabled !== false,
      secretId,
      hasInlineSecret
    }),
    rev,
    matchesCollection: scope.collection === undefined ? always : compileCollectionGlob(scope.collection)
  }
}

/**
 * What a member takes in a JSON list of strings: its characters, its two quotes and a comma (a DID
 * is ASCII: one byte a character, nothing escaped).
 */
export const listEntryBytes = (s: string): number => s.length + 3

/** A set of strings with a reference count per member; `members` is a live view. */
class RefCountedSet {
  readonly counts = new Map<string, number>()
  readonly members = new Set<string>()
  /** bumped whenever membership changes */
  version = 0
  /** the sum of {@link listEntryBytes} over the members */
  bytes = 0

  inc(s: string): void {
    const n = this.counts.get(s)
    if (n === undefined) {
      this.counts.set(s, 1)
      this.members.add(s)
      this.bytes += listEntryBytes(s)
      this.version++
    } else {
      this.counts.set(s, n + 1)
    }
  }

  dec(s: string): void {
    const n = this.counts.get(s)
    if (n === undefined) return
    if (n <= 1) {
      this.counts.delete(s)
      this.members.delete(s)
      this.bytes -= listEntryBytes(s)
      this.version++
    } else {
      this.counts.set(s, n - 1)
    }
  }

  count(s: string): number {
    return this.counts.get(s) ?? 0
  }
}

type Bucket = Map<string, ActiveWebhook>

const addTo = (m: Map<string, Bucket>, did: string, w: ActiveWebhook): void => {
  const b = m.get(did)
  if (b === undefined) m.set(did, new Map([[w.key, w]]))
  else b.set(w.key, w)
}

const removeFrom = (m: Map<string, Bucket>, did: string, w: ActiveWebhook): void => {
  const b = m.get(did)
  if (b === undefined) return
  // only remove the exact entry (a newer registration of the same key may already be there)
  if (b.get(w.key) !== w) return
  b.delete(w.key)
  if (b.size === 0) m.delete(did)
}

const EMPTY: ReadonlyArray<ActiveWebhook> = Object.freeze([])

/**
 * One scope DID's webhooks split by the shape of their scope (SPEC §2.5), so that an event or a
 * reference looks up only the webhooks that can match it, not every webhook on the DID: a DID-only
 * scope; an exact collection (no `*`) or a glob, each with or without an rkey. Each distinct glob
 * pattern on the DID is tested once against the collection (not once per webhook).
 */
class ScopeShapes {
  size = 0
  readonly didOnly: Bucket = new Map()
  /** exact collection → rkey (`""`: the collection-only scopes; an rkey is never empty) → webhooks */
  readonly exact = new Map<string, Map<string, Bucket>>()
  /** glob pattern → its test, and rkey (`""`: no rkey) → webhooks */
  readonly globs = new Map<string, GlobGroup>()

  #byRkeyOf(w: ActiveWebhook, create: boolean): Map<string, Bucket> | undefined {
    const collection = w.scope.collection
    if (collection === undefined) return undefined
    if (collection.includes("*")) {
      let g = this.globs.get(collection)
      if (g === undefined && create) {
        g = { test: w.matchesCollection, byRkey: new Map() }
        this.globs.set(collection, g)
      }
      return g?.byRkey
    }
    let m = this.exact.get(collection)
    if (m === undefined && create) {
      m = new Map()
      this.exact.set(collection, m)
    }
    return m
  }

  add(w: ActiveWebhook): void {
    let b: Bucket | undefined = this.didOnly
    if (w.scope.collection !== undefined) {
      const byRkey = this.#byRkeyOf(w, true)
      if (byRkey === undefined) return // (never: created on demand)
      const r = w.scope.rkey ?? ""
      b = byRkey.get(r)
      if (b === undefined) {
        b = new Map()
        byRkey.set(r, b)
      }
    }
    if (!b.has(w.key)) this.size++
    b.set(w.key, w)
  }

  /** removes exactly `w` (a newer registration of the same key may be there instead) */
  remove(w: ActiveWebhook): void {
    const collection = w.scope.collection
    const byRkey = collection === undefined ? undefined : this.#byRkeyOf(w, false)
    const r = w.scope.rkey ?? ""
    const b = collection === undefined ? this.didOnly : byRkey?.get(r)
    if (b === undefined || b.get(w.key) !== w) return
    b.delete(w.key)
    this.size--
    if (b.size > 0 || byRkey === undefined || collection === undefined) return
    byRkey.delete(r)
    if (byRkey.size > 0) return
    if (collection.includes("*")) this.globs.delete(collection)
    else this.exact.delete(collection)
  }

  /**
   * The buckets whose webhooks can match a record or reference of this collection and rkey
   * (either may be absent for a reference): a superset of the matches, tested by the caller.
   */
  candidates(collection: string | undefined, rkey: string | undefined): ReadonlyArray<Bucket> {
    const out: Array<Bucket> = []
    if (this.didOnly.size > 0) out.push(this.didOnly)
    if (collection === undefined) return out
    const exact = this.exact.get(collection)
    if (exact !== undefined) pushRkeyBuckets(out, exact, rkey)
    for (const g of this.globs.values()) if (g.test(collection)) pushRkeyBuckets(out, g.byRkey, rkey)
    return out
  }
}

interface GlobGroup {
  readonly test: (collection: string) => boolean
  readonly byRkey: Map<string, Bucket>
}

/** the collection-only bucket and, for an rkey, that rkey's */
const pushRkeyBuckets = (out: Array<Bucket>, byRkey: Map<string, Bucket>, rkey: string | undefined): void => {
  const any = byRkey.get("")
  if (any !== undefined) out.push(any)
  const one = rkey === undefined ? undefined : byRkey.get(rkey)
  if (one !== undefined) out.push(one)
}

const NO_BUCKETS: ReadonlyArray<Bucket> = Object.freeze([])

const addShape = (m: Map<string, ScopeShapes>, w: ActiveWebhook): void => {
  let s = m.get(w.scope.did)
  if (s === undefined) {
    s = new ScopeShapes()
    m.set(w.scope.did, s)
  }
  s.add(w)
}

const removeShape = (m: Map<string, ScopeShapes>, w: ActiveWebhook): void => {
  const s = m.get(w.scope.did)
  if (s === undefined) return
  s.remove(w)
  if (s.size === 0) m.delete(w.scope.did)
}

/** Counts after a hypothetical upsert: what admission limits (SPEC §2.6) are checked against. */
export interface IndexProjection {
  readonly total: number
  readonly ownerCount: number
  readonly wantedDids: number
  readonly backlinkDids: number
}

/**
 * The in-memory index of active webhooks.
 *
 * @since 0.1.0
 */
export class WebhookIndex {
  readonly #byKey = new Map<string, ActiveWebhook>()
  readonly #byOwner = new Map<string, Bucket>()
  readonly #byScopeDid = new Map<string, Bucket>()
  readonly #byBacklinkDid = new Map<string, Bucket>()
  // the same webhooks as the two maps above, split by scope shape (what the matcher looks up)
  readonly #directShapes = new Map<string, ScopeShapes>()
  readonly #backlinkShapes = new Map<string, ScopeShapes>()
  readonly #wanted = new RefCountedSet()
  readonly #backlink = new RefCountedSet()
  #registrations = 0
  #backlinkRegistrations = 0

  // refcounts are updated separately from the buckets so that a replacement adds the new
  // references before releasing the old ones: a DID kept by both never leaves the sets, and the
  // set versions change only when membership really changes.

  #retain(w: ActiveWebhook): void {
    this.#wanted.inc(w.ownerDid)
    this.#wanted.inc(w.scope.did)
    if (w.backlinks) this.#backlink.inc(w.scope.did)
  }

  #release(w: ActiveWebhook): void {
    this.#wanted.dec(w.ownerDid)
    this.#wanted.dec(w.scope.did)
    if (w.backlinks) this.#backlink.dec(w.scope.did)
  }

  #link(w: ActiveWebhook): void {
    this.#byKey.set(w.key, w)
    addTo(this.#byOwner, w.ownerDid, w)
    if (!w.backlinksOnly) {
      addTo(this.#byScopeDid, w.scope.did, w)
      addShape(this.#directShapes, w)
    }
    if (w.backlinks) {
      addTo(this.#byBacklinkDid, w.scope.did, w)
      addShape(this.#backlinkShapes, w)
    }
  }

  #unlink(w: ActiveWebhook): void {
    if (this.#byKey.get(w.key) === w) this.#byKey.delete(w.key)
    removeFrom(this.#byOwner, w.ownerDid, w)
    if (!w.backlinksOnly) {
      removeFrom(this.#byScopeDid, w.scope.did, w)
      removeShape(this.#directShapes, w)
    }
    if (w.backlinks) {
      removeFrom(this.#byBacklinkDid, w.scope.did, w)
      removeShape(this.#backlinkShapes, w)
    }
  }

  /**
   * Adds or replaces (by key) a webhook; returns the replaced one. `before`: the fingerprint the key
   * had before it was removed in the same step (a swap clears its owner first), so that a version
   * already registered is not counted as a new registration.
   */
  upsert(w: ActiveWebhook, before?: string): ActiveWebhook | undefined {
    const old = this.#byKey.get(w.key)
    if ((old?.fingerprint ?? before) !== w.fingerprint) {
      this.#registrations++
      if (w.backlinks) this.#backlinkRegistrations++
    }
    this.#retain(w)
    if (old !== undefined) {
      this.#release(old)
      this.#unlink(old)
    }
    this.#link(w)
    return old
  }

  /** Removes a webhook by key; returns it. */
  remove(key: string): ActiveWebhook | undefined {
    const old = this.#byKey.get(key)
    if (old === undefined) return undefined
    this.#release(old)
    this.#unlink(old)
    return old
  }

  get(key: string): ActiveWebhook | undefined {
    return this.#byKey.get(key)
  }

  /**
   * Replaces every webhook of one owner with `ws` in one synchronous step (used after reconciling
   * the owner, SPEC §5.3). Returns false and changes nothing if any of `ws` belongs to another
   * owner. Duplicate keys in `ws`: the last one wins.
   */
  replaceOwner(ownerDid: string, ws: ReadonlyArray<ActiveWebhook>): boolean {
    for (const w of ws) if (w.ownerDid !== ownerDid) return false
    const next = new Map<string, ActiveWebhook>()
    for (const w of ws) next.set(w.key, w)
    const old = this.#byOwner.get(ownerDid)
    const oldList = old === undefined ? EMPTY : Array.from(old.values())
    for (const w of next.values()) this.#retain(w)
    for (const w of oldList) this.#release(w)
    for (const w of oldList) this.#unlink(w)
    for (const w of next.values()) this.#link(w)
    return true
  }

  /** A snapshot of one owner's active webhooks. */
  byOwner(ownerDid: string): ReadonlyArray<ActiveWebhook> {
    const b = this.#byOwner.get(ownerDid)
    return b === undefined ? EMPTY : Array.from(b.values())
  }

  /** owners with at least one active webhook */
  get ownerTotal(): number {
    return this.#byOwner.size
  }

  get size(): number {
    return this.#byKey.size
  }

  ownerCount(ownerDid: string): number {
    return this.#byOwner.get(ownerDid)?.size ?? 0
  }

  /** Owners ∪ scope DIDs of active webhooks. A live view: copy it to keep a snapshot. */
  wantedDids(): ReadonlySet<string> {
    return this.#wanted.members
  }

  /**
   * What the `wantedDids()` members take in an `options_update` message: the sum of their
   * {@link listEntryBytes} (O(1): kept as members join and leave).
   */
  get wantedDidsBytes(): number {
    return this.#wanted.bytes
  }

  /** Bumped whenever `wantedDids()` membership changes (to coalesce stream reconfiguration). */
  get wantedDidsVersion(): number {
    return this.#wanted.version
  }

  /**
   * Bumped whenever `upsert` adds a webhook or a new version of one (another fingerprint): it may
   * match events that no registration matched before (the intake's direct stream replays for it).
   */
  get registrationsVersion(): number {
    return this.#registrations
  }

  /** The part of {@link registrationsVersion} that makes backlink matches (the backlink stream replays for it). */
  get backlinkRegistrationsVersion(): number {
    return this.#backlinkRegistrations
  }

  /** Scope DIDs of active backlink webhooks. A live view: copy it to keep a snapshot. */
  backlinkDids(): ReadonlySet<string> {
    return this.#backlink.members
  }

  /** Bumped whenever `backlinkDids()` membership changes. */
  get backlinkDidsVersion(): number {
    return this.#backlink.version
  }

  isBacklinkDid(did: string): boolean {
    return this.#byBacklinkDid.has(did)
  }

  hasDirectScopeDid(did: string): boolean {
    return this.#byScopeDid.has(did)
  }

  /**
   * Active webhooks whose scope DID is `did` and that can match directly: all of them, backlink
   * or not, except `backlinksOnly` ones (SPEC §2.2 step 4).
   */
  candidatesByScopeDid(did: string): Iterable<ActiveWebhook> {
    return this.#byScopeDid.get(did)?.values() ?? EMPTY
  }

  /** Active webhooks with backlink matching (`backlinks` or `backlinksOnly`) whose scope DID is `did`. */
  candidatesByBacklinkDid(did: string): Iterable<ActiveWebhook> {
    return this.#byBacklinkDid.get(did)?.values() ?? EMPTY
  }

  /**
   * The direct candidates of a record event (SPEC §2.5): of the webhooks `candidatesByScopeDid`
   * gives, only the buckets whose scope shape can match this collection and rkey (every DID-only
   * and glob scope, the exact collection's, the exact collection-and-rkey's). A superset of the
   * direct matches: the matcher tests each.
   */
  directCandidates(did: string, collection: string, rkey: string): ReadonlyArray<ReadonlyMap<string, ActiveWebhook>> {
    return this.#directShapes.get(did)?.candidates(collection, rkey) ?? NO_BUCKETS
  }

  /**
   * The backlink candidates of a reference (SPEC §2.5), as `directCandidates` for
   * `candidatesByBacklinkDid`: a DID-only reference gets only the DID-only scopes.
   */
  backlinkCandidates(ref: ScopeUri): ReadonlyArray<ReadonlyMap<string, ActiveWebhook>> {
    return this.#backlinkShapes.get(ref.did)?.candidates(ref.collection, ref.rkey) ?? NO_BUCKETS
  }

  /** Every active webhook (a live iterator: do not mutate the index while iterating). */
  all(): Iterable<ActiveWebhook> {
    return this.#byKey.values()
  }

  /**
   * The counts the index would have after `upsert(w)`, without changing anything: what the
   * admission limits of SPEC §2.6 are checked against (a replacement of the same key frees what the
   * old registration held).
   */
  projectUpsert(w: ActiveWebhook): IndexProjection {
    const old = this.#byKey.get(w.key)
    const replacing = old !== undefined
    return {
      total: this.#byKey.size + (replacing ? 0 : 1),
      ownerCount: this.ownerCount(w.ownerDid) + (replacing ? 0 : 1),
      wantedDids: this.#projectWanted(w).size,
      backlinkDids: projectSize(
        this.#backlink,
        w.backlinks ? [w.scope.did] : [],
        old !== undefined && old.backlinks ? [old.scope.did] : []
      ).size
    }
  }

  /**
   * The {@link wantedDidsBytes} the index would have after `upsert(w)`, without changing anything
   * (the admission limit on the bytes of the direct set, SPEC §2.6).
   */
  projectWantedDidsBytes(w: ActiveWebhook): number {
    return this.#projectWanted(w).bytes
  }

  #projectWanted(w: ActiveWebhook): { readonly size: number; readonly bytes: number } {
    const old = this.#byKey.get(w.key)
    return projectSize(
      this.#wanted,
      [w.ownerDid, w.scope.did],
      old === undefined ? [] : [old.ownerDid, old.scope.did]
    )
  }
}

/** a set's size and bytes after adding and removing references (at most two each) */
const projectSize = (
  set: RefCountedSet,
  added: ReadonlyArray<string>,
  removed: ReadonlyArray<string>
): { readonly size: number; readonly bytes: number } => {
  const delta = new Map<string, number>()
  for (const d of added) delta.set(d, (delta.get(d) ?? 0) + 1)
  for (const d of removed) delta.set(d, (delta.get(d) ?? 0) - 1)
  let size = set.members.size
  let bytes = set.bytes
  for (const [d, n] of delta) {
    const before = set.count(d)
    const after = before + n
    if (before === 0 && after > 0) {
      size++
      bytes += listEntryBytes(d)
    } else if (before > 0 && after <= 0) {
      size--
      bytes -= listEntryBytes(d)
    }
  }
  return { size, bytes }
}
