/**
 * The registry's rules for what the in-memory index admits (SPEC §2.6), as pure functions of the
 * rules and an index: the admission limit a registration would exceed, a stored row's active form,
 * and what a key's index entry becomes when a replayed event is its stored version. Registry.ts
 * applies them (load, swap, live writes).
 */
import { Either } from "effect"
import { validateWhRecord, type WhRecordOptions } from "../../schemas/WhRecord.js"
import { type ActiveWebhook, makeActiveWebhook, type WebhookIndex } from "../matching/WebhookIndex.js"
import type { FirehookConfigShape } from "../platform/Config.js"
import type { IndexLimit } from "./RegistryConfig.js"
import type { WebhookRow } from "./RegistryStore.js"

/**
 * The most bytes the direct set's DIDs may take in the Jetstream `options_update` message (the sum
 * of `WebhookIndex.wantedDidsBytes`: each DID, its quotes and a comma). Jetstream closes the
 * connection on an update over 10 MB (Jetstream.OPTIONS_UPDATE_MAX_BYTES); this leaves room for the
 * rest of the message. A registration that would take the set over it is refused as one that
 * would take its count over `directDidsMax` (`direct_dids`: the direct set is full).
 */
export const DIRECT_DIDS_MAX_BYTES = 9_000_000

/** What admission and the load go by: the limits, the source (Jetstream or not), the URL rules. */
export interface Rules {
  readonly limits: FirehookConfigShape["registry"]
  readonly jetstream: boolean
  readonly validateOpts: WhRecordOptions
}

/** The limit `w` would exceed in `into` (the live index, or the one a load builds), if any. */
export const admissionIn = (rules: Rules, into: WebhookIndex, w: ActiveWebhook): IndexLimit | undefined => {
  const { limits } = rules
  const p = into.projectUpsert(w)
  if (p.total > limits.activeMax) return "total"
  if (p.ownerCount > limits.ownerActiveMax) return "owner"
  // the Jetstream `wantedDids` set (SPEC §2.6): the relay firehose carries every DID, no set to bound.
  // Bounded in count and in bytes (the whole set goes in one options_update message)
  if (rules.jetstream && p.wantedDids > limits.directDidsMax) return "direct_dids"
  if (rules.jetstream && into.projectWantedDidsBytes(w) > DIRECT_DIDS_MAX_BYTES) return "direct_dids"
  if (p.backlinkDids > limits.backlinkDidsMax) return "backlink_dids"
  return undefined
}

/** The active form of a stored row, if it is still valid under the current configuration. */
export const activeFromRow = (rules: Rules, row: WebhookRow): ActiveWebhook | undefined => {
  const v = validateWhRecord(row.record, rules.validateOpts)
  if (Either.isLeft(v)) return undefined
  if (v.right.record.enabled === false) return undefined
  return makeActiveWebhook(row.ownerDid, row.rkey, v.right.record, v.right.scope, row.rev)
}

export type Settlement =
  | { readonly _tag: "keep" }
  | { readonly _tag: "set"; readonly w: ActiveWebhook }
  | { readonly _tag: "unregister" }
  | { readonly _tag: "over"; readonly limit: IndexLimit }

/**
 * What the index of `key` becomes when a replayed event is the key's stored version (`stored`: its
 * row, undefined for a tombstone). The write was committed by another process (a leader that lost
 * the intake lock while its batch was in flight, SPEC §6.4) or by this one before a restart,
 * possibly after `into` was loaded. Nothing is written (no generation bump); the index takes the
 * stored state, as a load would: an active row valid under the current configuration is
 * registered if admitted; a tombstone, a disabled or inactive row, a version no longer valid or
 * over a limit is unregistered (not counted: a load may have counted it). `keep`: already so.
 */
export const settlement = (
  rules: Rules,
  into: WebhookIndex,
  key: string,
  stored: WebhookRow | undefined
): Settlement => {
  const w = stored?.active === true ? activeFromRow(rules, stored) : undefined
  const current = into.get(key)
  if (w === undefined) return current === undefined ? { _tag: "keep" } : { _tag: "unregister" }
  if (current !== undefined && current.rev === w.rev && current.fingerprint === w.fingerprint) return { _tag: "keep" }
  const limit = admissionIn(rules, into, w)
  if (limit === undefined) return { _tag: "set", w }
  return current === undefined ? { _tag: "keep" } : { _tag: "over", limit }
}
