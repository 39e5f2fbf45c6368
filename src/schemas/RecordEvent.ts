/**
 * Stream events (SPEC §2.1) as the matcher and the outbox see them, whatever the source
 * (Jetstream or the relay firehose).
 *
 * @since 0.1.0
 */
import { isCanonicalDid, isNsidStrict, isRkey } from "./AtUri.js"
import { isTid } from "./Tid.js"

export type Operation = "create" | "update" | "delete"

export interface RecordEvent {
  readonly kind: "commit"
  readonly did: string
  readonly collection: string
  readonly rkey: string
  readonly operation: Operation
  /** the repo revision (a TID) */
  readonly rev: string
  /** absent on delete */
  readonly cid: string | undefined
  /** the record value; undefined on delete */
  readonly record: unknown
  /** source time, microseconds since the Unix epoch */
  readonly timeUs: number
  readonly stream: string
  /** canonical relay URL */
  readonly relay: string
  readonly cursor: string
}

export interface IdentityEvent {
  /**
   * `identity` and `account` (both sources), `sync` (the relay's `#sync`: a repo state reset);
   * each invalidates the DID's identity caches; `account` and `sync` request a known owner's
   * reconciliation
   */
  readonly kind: "identity" | "account" | "sync"
  readonly did: string
  /**
   * `account` events only: the account's `active` flag when the frame carries a boolean one;
   * undefined when it is absent or malformed (the event is still an account event)
   */
  readonly active?: boolean | undefined
  readonly timeUs: number
  readonly stream: string
  readonly relay: string
  readonly cursor: string
}

export type StreamEvent = RecordEvent | IdentityEvent

export const MAX_CID_LENGTH = 512

/**
 * SPEC §2.2 step 1: an event that is not well-formed matches nothing.
 * Checks: canonical DID, collection `isNsidStrict` (≤ 317 chars, atproto's NSID length), `isRkey`
 * rkey, a known operation, `isTid` rev, `cid` 1–512 chars when present, `record` present (not undefined) unless the operation is a delete.
 * A delete may carry neither `cid` nor `record`; if it does carry them they are not inspected beyond
 * the `cid` length rule.
 *
 * @since 0.1.0
 */
export const isWellFormedRecordEvent = (e: RecordEvent): boolean => {
  const op = e.operation
  if (op !== "create" && op !== "update" && op !== "delete") return false
  if (!isCanonicalDid(e.did) || !isNsidStrict(e.collection) || !isRkey(e.rkey) || !isTid(e.rev)) {
    return false
  }
  const cid = e.cid
  if (cid !== undefined && (typeof cid !== "string" || cid.length < 1 || cid.length > MAX_CID_LENGTH)) {
    return false
  }
  return op === "delete" || e.record !== undefined
}
