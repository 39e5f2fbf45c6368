/**
 * The PDS hosts that asked for time: a page answered 429 or 503 with `Retry-After` cools its host
 * (scheme, host and port of the PDS's URL) down for that long (at most {@link COOLDOWN_MAX_MS}).
 * Until then the reconciler asks that host nothing for any owner: a scan that would read it fails
 * at once as `pds_cooling`, carrying the time left, which the retry scheduler waits before the
 * owner's next try. Without it, a pass over the many owners of one rate-limited PDS would send each
 * of them a request the PDS has already said it will refuse.
 *
 * The same bounded memory of hosts also holds those whose `getLatestCommit` timed out
 * ({@link COMMIT_STALL_HOLD_MS}): while held, a scan of another owner on such a host does not ask
 * for the latest commit (another timeout) and takes the scan-start TID at once, the fallback SPEC
 * §5.3 step 2 gives a PDS that does not answer it.
 *
 * Identity keeps a memory of its own of the same kind for the hosts of DID documents (the PLC
 * directory, did:web hosts) that answered 429 or 503 with `Retry-After`: their DIDs are not looked
 * up until it has passed (the owner fails as `identity_cooling`, with the time left).
 *
 * Per process and in memory: another replica (or the CLI) meets the 429 itself once. Bounded: at
 * most {@link COOLDOWN_HOSTS_MAX} hosts; when full, expired entries go first, then the one that ends
 * soonest.
 */

/** The longest cool-down a PDS gets (the retry scheduler's cap on an owner's wait, SPEC §5.4). */
export const COOLDOWN_MAX_MS = 3_600_000
/** How long a host whose `getLatestCommit` timed out is not asked for it again. */
export const COMMIT_STALL_HOLD_MS = 300_000
/** Hosts remembered at most. */
export const COOLDOWN_HOSTS_MAX = 1_024

export interface PdsCooldown {
  /** Milliseconds left of `pds`'s cool-down at `nowMs`; undefined when it has none. */
  readonly remaining: (pds: string, nowMs: number) => number | undefined
  /** `pds` asked, at `nowMs`, not to be asked again for `ms` (a longer cool-down it has is kept). */
  readonly note: (pds: string, nowMs: number, ms: number) => void
  /** Hosts held (expired ones included until they are dropped). */
  readonly size: () => number
}

const AUTHORITY = /^[a-z][a-z0-9+.-]*:\/\/[^/?#]+/i

/** The host a PDS URL names: its scheme and authority, lower-cased (the whole string if it has none). */
export const hostKey = (pds: string): string => (AUTHORITY.exec(pds)?.[0] ?? pds).toLowerCase()

export const make = (maxHosts: number = COOLDOWN_HOSTS_MAX): PdsCooldown => {
  const until = new Map<string, number>()

  const makeRoom = (nowMs: number) => {
    for (const [host, end] of until) if (end <= nowMs) until.delete(host)
    if (until.size < maxHosts) return
    let soonest: string | undefined
    let soonestEnd = Infinity
    for (const [host, end] of until) {
      if (end < soonestEnd) {
        soonest = host
        soonestEnd = end
      }
    }
    if (soonest !== undefined) until.delete(soonest)
  }

  return {
    remaining: (pds, nowMs) => {
      const key = hostKey(pds)
      const end = until.get(key)
      if (end === undefined) return undefined
      if (end > nowMs) return end - nowMs
      until.delete(key)
      return undefined
    },
    note: (pds, nowMs, ms) => {
      if (!(ms > 0) || maxHosts < 1) return
      const key = hostKey(pds)
      const end = nowMs + Math.min(ms, COOLDOWN_MAX_MS)
      const held = until.get(key)
      if (held !== undefined) {
        if (end > held) until.set(key, end)
        return
      }
      if (until.size >= maxHosts) makeRoom(nowMs)
      until.set(key, end)
    },
    size: () => until.size
  }
}
