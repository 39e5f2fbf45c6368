/**
 * Rate limits of the owners' API (SPEC §8.2) as token buckets, one per key (a client address or a
 * caller DID): a bucket holds up to `limit` tokens and refills continuously at `limit` per `perMs`,
 * so "30/min" allows a burst of 30 and then one every 2 s. A call takes one token; with less than
 * one it is refused, and `retryAfterMs` says when the next token arrives.
 *
 * Bounded: at most `maxKeys` keys per limiter. A key's bucket is touched on every use (most
 * recently used last); when a new key arrives at the bound, the least recently used is forgotten,
 * which is the same as that key's bucket being full again (the most lenient state, never a
 * refusal of a key nobody limited). A key longer than {@link MAX_PLAIN_KEY_LENGTH} characters (a
 * did:web may have 2,048, and anyone with a domain mints any number of them) is held as a
 * fixed-size digest ({@link compactKey}), so the key bound bounds bytes too. The state is plain
 * data driven by the time passed in (the service reads it from the Effect `Clock`), so tests run
 * under `TestClock`.
 *
 * @since 0.1.0
 */
import { createHash } from "node:crypto"

/** Keys up to this many characters are held as they are; longer ones as a digest. */
export const MAX_PLAIN_KEY_LENGTH = 64

/**
 * The key a bounded map holds for `key`: itself when it has at most {@link MAX_PLAIN_KEY_LENGTH}
 * characters, else NUL and the first 16 bytes of its SHA-256 in base64url (23 characters; a hash
 * for keying, not for security: no DID, address or replay key starts with NUL, so a digest never
 * meets a plain key).
 */
export const compactKey = (key: string): string =>
  key.length <= MAX_PLAIN_KEY_LENGTH
    ? key
    : "\u0000" + createHash("sha256").update(key, "utf8").digest().subarray(0, 16).toString("base64url")

/** `limit` calls per `perMs` milliseconds. */
export interface Rate {
  readonly limit: number
  readonly perMs: number
}

export interface Decision {
  readonly allowed: boolean
  /** when refused: the wait until the next token, in ms (≥ 1) */
  readonly retryAfterMs: number
}

interface Bucket {
  tokens: number
  at: number
}

export interface Buckets {
  /** Whether one more call of `key` would be allowed at `now` (nothing changes). */
  readonly peek: (key: string, now: number) => Decision
  /** Take one token of `key` if one is there. */
  readonly take: (key: string, now: number) => Decision
  /** Give back one token taken from `key` (a reservation that was not used); never above `limit`. */
  readonly give: (key: string, now: number) => void
  readonly size: () => number
}

const ALLOWED: Decision = { allowed: true, retryAfterMs: 0 }

/** The Retry-After header value (whole seconds, at least 1) of a refusal. */
export const retryAfterSeconds = (ms: number): number => Math.max(1, Math.ceil(ms / 1000))

export const makeBuckets = (rate: Rate, maxKeys: number): Buckets => {
  const buckets = new Map<string, Bucket>()
  const perToken = rate.perMs / rate.limit

  /** The bucket of `key` refilled up to `now` (undefined: a full one). */
  const current = (key: string, now: number): Bucket | undefined => {
    const b = buckets.get(key)
    if (b === undefined) return undefined
    const elapsed = Math.max(0, now - b.at)
    b.tokens = Math.min(rate.limit, b.tokens + elapsed / perToken)
    b.at = Math.max(b.at, now)
    return b
  }

  const decide = (b: Bucket | undefined): Decision =>
    b === undefined || b.tokens >= 1
      ? ALLOWED
      : { allowed: false, retryAfterMs: Math.max(1, Math.ceil((1 - b.tokens) * perToken)) }

  return {
    peek: (key, now) => decide(current(compactKey(key), now)),
    take: (caller, now) => {
      const key = compactKey(caller)
      const b = current(key, now)
      const d = decide(b)
      if (!d.allowed) return d
      const next: Bucket = b ?? { tokens: rate.limit, at: now }
      next.tokens -= 1
      buckets.delete(key)
      while (buckets.size >= maxKeys) {
        const oldest = buckets.keys().next()
        if (oldest.done === true) break
        buckets.delete(oldest.value)
      }
      buckets.set(key, next)
      return d
    },
    give: (key, now) => {
      // a key no longer tracked is a full bucket already
      const b = current(compactKey(key), now)
      if (b !== undefined) b.tokens = Math.min(rate.limit, b.tokens + 1)
    },
    size: () => buckets.size
  }
}

/**
 * Take one token from each `(buckets, key)` pair, or none: a call counts against all of its limits
 * only when every one of them allows it; refused, `retryAfterMs` is the longest wait among them.
 */
export const takeAll = (
  pairs: ReadonlyArray<readonly [Buckets, string]>,
  now: number
): Decision => {
  let wait = 0
  for (const [b, key] of pairs) {
    const d = b.peek(key, now)
    if (!d.allowed) wait = Math.max(wait, d.retryAfterMs)
  }
  if (wait > 0) return { allowed: false, retryAfterMs: wait }
  for (const [b, key] of pairs) b.take(key, now)
  return ALLOWED
}

// ---------------------------------------------------------------------------------------------
// The limits of SPEC §8.2

const MINUTE = 60_000

export interface ApiLimits {
  /** failed authentications per client address — 30/min */
  readonly failedAuthPerAddress: Rate
  /** calls per caller DID — 120/min */
  readonly callsPerCaller: Rate
  /** extra per-caller limits of single methods, by NSID — `test` 10/min, `replay` 2/min */
  readonly methodRates: { readonly [nsid: string]: Rate }
  /** keys tracked per limiter — 100,000 */
  readonly maxKeys: number
}

export const DEFAULT_LIMITS: ApiLimits = {
  failedAuthPerAddress: { limit: 30, perMs: MINUTE },
  callsPerCaller: { limit: 120, perMs: MINUTE },
  methodRates: {
    "dev.firehook.webhook.test": { limit: 10, perMs: MINUTE },
    "dev.firehook.webhook.replay": { limit: 2, perMs: MINUTE }
  },
  maxKeys: 100_000
}
