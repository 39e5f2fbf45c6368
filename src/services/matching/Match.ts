/**
 * The per-event matcher (SPEC §2.2) as a pure function over the active-webhook index.
 *
 * Candidates come only from the index maps (scope DID → webhooks for direct matches, backlink
 * scope DID → webhooks for each reference), and within a DID only the webhooks whose scope shape
 * can match (DID-only, the exact collection, the collection and rkey, the glob patterns that match
 * the collection: `WebhookIndex.directCandidates` / `backlinkCandidates`), so the cost per event
 * is a couple of Map lookups when nothing matches, whatever the number of webhooks on the DID
 * (distinct glob patterns on one DID are each tested once).
 *
 * @since 0.1.0
 */
import type { ScopeUri } from "../../schemas/AtUri.js"
import { isWellFormedRecordEvent, type RecordEvent } from "../../schemas/RecordEvent.js"
import { WH_COLLECTION } from "../../schemas/WhRecord.js"
import type { ActiveWebhook, WebhookIndex } from "./WebhookIndex.js"

export type MatchKind = "direct" | "backlink"

export interface MatchResult {
  readonly webhook: ActiveWebhook
  readonly match: MatchKind
}

const NO_MATCHES: ReadonlyArray<MatchResult> = Object.freeze([])

/** SPEC §2.2 step 6: a webhook never receives the event of its own wh record. */
const isOwnRecord = (w: ActiveWebhook, e: RecordEvent): boolean =>
  e.rkey === w.rkey && e.did === w.ownerDid && e.collection === WH_COLLECTION

const wantsOperation = (w: ActiveWebhook, e: RecordEvent): boolean =>
  w.events === undefined || w.events.has(e.operation)

/** SPEC §2.2 step 4. */
const isDirect = (w: ActiveWebhook, e: RecordEvent): boolean => {
  const s = w.scope
  return (
    s.did === e.did &&
    (s.collection === undefined || w.matchesCollection(e.collection)) &&
    (s.rkey === undefined || s.rkey === e.rkey)
  )
}

/**
 * SPEC §2.2 step 5 for one reference: same DID; if the scope has a collection, the reference has
 * one and the glob matches it; if the scope has an rkey, the reference's rkey equals it. So a
 * DID-only reference matches only a DID-only scope, and a DID-only scope matches any reference to
 * its DID.
 */
export const referenceMatchesScope = (w: ActiveWebhook, ref: ScopeUri): boolean => {
  const s = w.scope
  if (ref.did !== s.did) return false
  if (s.collection !== undefined) {
    if (ref.collection === undefined || !w.matchesCollection(ref.collection)) return false
  }
  return s.rkey === undefined || s.rkey === ref.rkey
}

/**
 * Matches one record event against the active webhooks (SPEC §2.2). `refs` are the references to
 * use for backlink matching: the record's previously stored references ∪ its new ones (SPEC §2.4),
 * computed by the caller; pass an empty array when the record was too complex (SPEC §2.3).
 *
 * - A malformed event (SPEC §2.2 step 1) matches nothing; this is checked only once a candidate
 *   exists, so events nobody watches cost no validation.
 * - Disabled and invalid webhooks are never in the index.
 * - `backlinksOnly` webhooks (SPEC §2.2 step 4) are not among the scope DID's candidates, so they
 *   get backlink matches only, and the direct loop costs the others nothing more.
 * - One result per webhook: a direct match wins over a backlink match. Results list direct matches
 *   first (by scope shape, then registration order), then backlink matches in reference order.
 *
 * @since 0.1.0
 */
export const matchEvent = (
  index: WebhookIndex,
  event: RecordEvent,
  refs: ReadonlyArray<ScopeUri>
): ReadonlyArray<MatchResult> => {
  let out: Array<MatchResult> | undefined = undefined
  let checked = false

  for (const bucket of index.directCandidates(event.did, event.collection, event.rkey)) {
    for (const w of bucket.values()) {
      if (!wantsOperation(w, event) || !isDirect(w, event) || isOwnRecord(w, event)) continue
      if (!checked) {
        if (!isWellFormedRecordEvent(event)) return NO_MATCHES
        checked = true
      }
      const r: MatchResult = { webhook: w, match: "direct" }
      if (out === undefined) out = [r]
      else out.push(r)
    }
  }

  const nRefs = refs.length
  if (nRefs === 0) return out ?? NO_MATCHES

  // webhooks already in `out` (created only when a backlink candidate needs the check)
  let taken: Set<ActiveWebhook> | undefined = undefined
  for (let i = 0; i < nRefs; i++) {
    const ref = refs[i] as ScopeUri
    for (const bucket of index.backlinkCandidates(ref)) {
      for (const w of bucket.values()) {
        if (!w.backlinks || !wantsOperation(w, event) || !referenceMatchesScope(w, ref)) continue
        if (isOwnRecord(w, event)) continue
        if (out !== undefined) {
          if (taken === undefined) taken = new Set(out.map((m) => m.webhook))
          if (taken.has(w)) continue
        }
        if (!checked) {
          if (!isWellFormedRecordEvent(event)) return NO_MATCHES
          checked = true
        }
        const r: MatchResult = { webhook: w, match: "backlink" }
        if (out === undefined) out = [r]
        else out.push(r)
        if (taken !== undefined) taken.add(w)
        else taken = new Set([w])
      }
    }
  }
  return out ?? NO_MATCHES
}
