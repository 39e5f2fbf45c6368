/**
 * Re-sealing (SPEC §1.3): retiring an encryption key. Keys rotate without downtime — set the new
 * key as current, move the old one to the previous keys — and `firehook secrets reseal` then
 * re-seals every envelope still under another key under the current one, so the old key can go.
 *
 * A pass reads {@link RESEAL_PAGE_SIZE} rows per statement in (owner, name) order (keyset paging)
 * and swaps their envelopes in one statement, each row only where it still holds the envelope read:
 * a concurrent rotate or delete wins (`skipped`). The token and `rotated_at` stay as they are.
 * Envelopes no key opens are counted (`unreadable`) and left in place; no row is ever deleted. At
 * most {@link MAX_RESEAL_PAGES} pages per pass (`complete: false` beyond). Counts only leave here:
 * never a token, an envelope or a key.
 */
import { Effect, Either } from "effect"
import * as SecretBox from "./SecretBox.js"
import type { SecretsError, SecretsStoreShape } from "./Secrets.js"

/** Rows read and re-sealed per statement. */
export const RESEAL_PAGE_SIZE = 100
/** Pages per pass (100,000 rows); a larger table needs another pass. */
export const MAX_RESEAL_PAGES = 1_000

/** One secret's key: the paging position. */
export interface SecretKey {
  readonly ownerDid: string
  readonly name: string
}

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
 * at its bound of {@link MAX_RESEAL_PAGES} pages (run it again).
 */
export interface ResealResult {
  readonly resealed: number
  readonly unreadable: number
  readonly skipped: number
  readonly complete: boolean
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

/** One pass over every owner's secrets: envelopes not under `currentId` re-sealed under the keyring's current key. */
export const resealAll = (
  store: Pick<SecretsStoreShape, "sealedElsewhere" | "swap">,
  keyring: SecretBox.Keyring,
  currentId: string
): Effect.Effect<ResealResult, SecretsError> =>
  Effect.gen(function*() {
    let after: SecretKey = { ownerDid: "", name: "" }
    let resealed = 0
    let unreadable = 0
    let skipped = 0
    for (let page = 0; page < MAX_RESEAL_PAGES; page++) {
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
    return { resealed, unreadable, skipped, complete: false }
  }).pipe(Effect.withSpan("Secrets.reseal"))
