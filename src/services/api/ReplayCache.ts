/**
 * The replay cache of service tokens (SPEC §8.2): each `(iss, jti)` is accepted once while the
 * token lives. An entry is kept until its expiry (the token's `exp` plus the clock leeway, when
 * the verifier would refuse the token anyway) and never forgotten earlier: at `capacity` entries
 * (100,000 by default) a new token is refused as `full` instead of evicting a live entry, which
 * would let that token be replayed; the API then checks it against the replicas' shared store alone
 * (`JtiStore`), or answers 503 when it has none (`ServiceAuth`).
 *
 * Expired entries are dropped as time passes: entries are indexed by the second they expire in,
 * and every check first drops the seconds that have ended (amortized O(1) per entry). Time is
 * passed in (the service reads the Effect `Clock`).
 *
 * An `(iss, jti)` of more than 64 characters (a did:web issuer may have 2,048) is held as a
 * fixed-size digest (`RateLimiter.compactKey`), so the entry bound bounds bytes too.
 *
 * @since 0.1.0
 */
import { compactKey } from "./RateLimiter.js"

export type ReplayVerdict = "fresh" | "replayed" | "full"

export interface ReplayCache {
  /** Record `(iss, jti)` until `expiresAtMs`, unless it is already there (or the cache is full). */
  readonly check: (iss: string, jti: string, expiresAtMs: number, now: number) => ReplayVerdict
  /** Forget `(iss, jti)` (its check could not be completed: the token was not accepted). */
  readonly forget: (iss: string, jti: string) => void
  readonly size: () => number
  /** keys in the expiry index: always {@link size} (a forgotten key leaves it at once) */
  readonly indexed: () => number
}

export const DEFAULT_REPLAY_CAPACITY = 100_000

export const makeReplayCache = (capacity: number = DEFAULT_REPLAY_CAPACITY): ReplayCache => {
  /** key → expiry (ms) */
  const entries = new Map<string, number>()
  /** expiry second → keys expiring in it (each key of `entries` is in exactly one, its own) */
  const bySecond = new Map<number, Set<string>>()
  let indexed = 0
  /** every second before this one has been dropped */
  let prunedTo = Number.NEGATIVE_INFINITY

  const dropSecond = (s: number) => {
    const keys = bySecond.get(s)
    if (keys === undefined) return
    bySecond.delete(s)
    indexed -= keys.size
    for (const k of keys) entries.delete(k)
  }

  /** Drop every second that ended before `now` (an entry expiring at t is gone once now ≥ its second's end). */
  const prune = (now: number) => {
    const nowSec = Math.floor(now / 1000)
    if (nowSec <= prunedTo) return
    if (bySecond.size > 0) {
      if (nowSec - prunedTo <= bySecond.size) {
        for (let s = prunedTo; s < nowSec; s++) dropSecond(s)
      } else {
        for (const s of [...bySecond.keys()]) if (s < nowSec) dropSecond(s)
      }
    }
    prunedTo = nowSec
  }

  return {
    check: (iss, jti, expiresAtMs, now) => {
      prune(now)
      const key = compactKey(`${iss}\u0000${jti}`)
      if (entries.has(key)) return "replayed"
      // already past its expiry: the verifier refuses the token whatever the cache says
      if (Math.floor(expiresAtMs / 1000) < Math.floor(now / 1000)) return "fresh"
      if (entries.size >= capacity) return "full"
      entries.set(key, expiresAtMs)
      const s = Math.floor(expiresAtMs / 1000)
      const keys = bySecond.get(s)
      if (keys === undefined) bySecond.set(s, new Set([key]))
      else keys.add(key)
      indexed++
      return "fresh"
    },
    // out of the index too: a token refused again and again (the shared store full or down) must
    // not leave one index entry per call until its expiry, up to an hour later
    forget: (iss, jti) => {
      const key = compactKey(`${iss}\u0000${jti}`)
      const exp = entries.get(key)
      if (exp === undefined) return
      entries.delete(key)
      const s = Math.floor(exp / 1000)
      const keys = bySecond.get(s)
      if (keys?.delete(key) === true) {
        indexed--
        if (keys.size === 0) bySecond.delete(s)
      }
    },
    size: () => entries.size,
    indexed: () => indexed
  }
}
