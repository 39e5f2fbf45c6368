/**
 * Re-sealing (SPEC §1.3): retiring an encryption key. Keys rotate without downtime — set the new
 * key as current, move the old one to the previous keys — and `firehook secrets reseal` then
 * re-seals every envelope still under another key under the current one, so the old key can go.
 *
 * A pass reads {@link RESEAL_PAGE_SIZE} rows per statement in (owner, name) order (keyset paging)
 * and swaps their envelopes in one statement, each row only where it still holds the envelope read:
 * a concurrent rotate or delete wins (`skipped`). The token and `rotated_at` stay as they are.
 * Envelopes no key opens are counted (`unreadable`) and left in place; no row is ever deleted. At
 * most {@link MAX_RESEAL_PAGES} pages per pass (`complete: false` beyond).
 *
 * Resumable (decision): a pass that stops at its bound returns the keyset position it stopped at
 * (`next`), and a pass can start there ({@link resealAll}'s `from`). {@link resealPasses} runs
 * passes back to back, each from where the last stopped, until one completes, at most
 * {@link MAX_RESEAL_PASSES} of them. Without this every pass began at the first row, and because
 * unreadable envelopes stay in place, {@link MAX_RESEAL_PAGES} × {@link RESEAL_PAGE_SIZE} of them
 * ahead of a readable one kept it under the old key however often the pass ran. Counts and the
 * position (an owner DID and a secret name) only leave here: never a token, an envelope or a key.
 */
import { Effect, Either } from "effect"
import * as SecretBox from "./SecretBox.js"
import type { SecretsError, SecretsStoreShape } from "./Secrets.js"

/** Rows read and re-sealed per statement. */
export const RESEAL_PAGE_SIZE = 100
/** Pages per pass (100,000 rows); a larger table needs another pass, from where this one stopped. */
export const MAX_RESEAL_PAGES = 1_000
/** Passes per {@link resealPasses} (100,000,000 rows): far more than any table holds. */
export const MAX_RESEAL_PASSES = 1_000

/** One secret's key: the paging position. */
export interface SecretKey {
  readonly ownerDid: string
  readonly name: string
}

/** The position before every row: where a re-seal starts by default. */
export const RESEAL_START: SecretKey = { ownerDid: "", name: "" }

/** One stored envelope. */
export interface SealedRow extends SecretKey {
  readonly envelope: string
}

/** An envelope to replace by `to`, only where the row still holds `from`. */
export interface EnvelopeSwap extends SecretKey {
  readonly from: string
  readonly to: string
}

/**
 * What one pass did (counts only): envelopes now under the current key; envelopes no key opens
 * (left as they are); envelopes changed or deleted meanwhile; `complete` false when the pass stopped
 * at its bound of {@link MAX_RESEAL_PAGES} pages, and then `next`: the last row it read, where the
 * next pass starts (strictly after it).
 */
export interface ResealResult {
  readonly resealed: number
  readonly unreadable: number
  readonly skipped: number
  readonly complete: boolean
  readonly next?: SecretKey
}

/** What {@link resealPasses} did: the sums over its passes, and how many it ran. */
export interface ResealRun {
  readonly resealed: number
  readonly unreadable: number
  readonly skipped: number
  /** false only when the passes ran out ({@link MAX_RESEAL_PASSES}) before the end of the table */
  readonly complete: boolean
  readonly passes: number
}

/** The key id an envelope names (`wse1.<keyId>.…`), as the store's `split_part(envelope, '.', 2)`. */
const keyIdOf = (envelope: string): string => envelope.split(".")[1] ?? ""

const byKey = (a: SecretKey, b: SecretKey): number =>
  a.ownerDid !== b.ownerDid ? (a.ownerDid < b.ownerDid ? -1 : 1) : a.name < b.name ? -1 : a.name > b.name ? 1 : 0

/** The in-memory store's page: rows after `after`, not under `keyId`, in (owner, name) order. */
export const pageOf = (
  rows: ReadonlyArray<SealedRow>,
  keyId: string,
  after: SecretKey,
  limit: number
): ReadonlyArray<SealedRow> =>
  rows
    .filter((r) => byKey(r, after) > 0 && keyIdOf(r.envelope) !== keyId)
    .sort(byKey)
    .slice(0, limit)
    .map((r) => ({ ownerDid: r.ownerDid, name: r.name, envelope: r.envelope }))

/** The in-memory store's swap: how many of `swaps` `apply` made. */
export const applySwaps = (swaps: ReadonlyArray<EnvelopeSwap>, apply: (s: EnvelopeSwap) => boolean): number => {
  let n = 0
  for (const s of swaps) if (apply(s)) n++
  return n
}

/**
 * One pass over the owners' secrets after `from` (default: all of them): envelopes not under
 * `currentId` re-sealed under the keyring's current key, at most `maxPages` pages (default
 * {@link MAX_RESEAL_PAGES}; smaller in tests).
 */
export const resealAll = (
  store: Pick<SecretsStoreShape, "sealedElsewhere" | "swap">,
  keyring: SecretBox.Keyring,
  currentId: string,
  from: SecretKey = RESEAL_START,
  maxPages: number = MAX_RESEAL_PAGES
): Effect.Effect<ResealResult, SecretsError> =>
  Effect.gen(function*() {
    let after: SecretKey = { ownerDid: from.ownerDid, name: from.name }
    let resealed = 0
    let unreadable = 0
    let skipped = 0
    for (let page = 0; page < maxPages; page++) {
      const rows = yield* store.sealedElsewhere(currentId, after, RESEAL_PAGE_SIZE)
      const swaps: Array<EnvelopeSwap> = []
      for (const r of rows) {
        const to = Either.flatMap(SecretBox.open(keyring, r.envelope), (token) => SecretBox.sealRandom(keyring, token))
        if (Either.isLeft(to)) unreadable++
        else swaps.push({ ownerDid: r.ownerDid, name: r.name, from: r.envelope, to: to.right })
      }
      const swapped = yield* store.swap(swaps)
      resealed += swapped
      skipped += swaps.length - swapped
      const last = rows[rows.length - 1]
      if (last === undefined || rows.length < RESEAL_PAGE_SIZE) return { resealed, unreadable, skipped, complete: true }
      after = { ownerDid: last.ownerDid, name: last.name }
    }
    return { resealed, unreadable, skipped, complete: false, next: after }
  }).pipe(Effect.withSpan("Secrets.reseal"))

/**
 * Passes of `pass` back to back, the first from the start, each next one from where the last
 * stopped, until one completes: the sums of their counts. Bounded: at most `maxPasses`, and it stops
 * (`complete: false`) if a pass that did not complete gave no position, or the one it started from
 * (it could never get further). The store's keyset read (`>`, in the database's collation) moves the
 * position forward on every page, so the check is equality, not this module's (owner, name) order.
 */
export const resealPasses = <E, R>(
  pass: (from: SecretKey) => Effect.Effect<ResealResult, E, R>,
  maxPasses: number = MAX_RESEAL_PASSES
): Effect.Effect<ResealRun, E, R> =>
  Effect.gen(function*() {
    let from = RESEAL_START
    let resealed = 0
    let unreadable = 0
    let skipped = 0
    for (let passes = 1; passes <= maxPasses; passes++) {
      const r = yield* pass(from)
      resealed += r.resealed
      unreadable += r.unreadable
      skipped += r.skipped
      if (r.complete) return { resealed, unreadable, skipped, complete: true, passes }
      const next = r.next
      if (next === undefined || (next.ownerDid === from.ownerDid && next.name === from.name) || passes === maxPasses) {
        return { resealed, unreadable, skipped, complete: false, passes }
      }
      from = next
    }
    return { resealed, unreadable, skipped, complete: false, passes: 0 }
  })
