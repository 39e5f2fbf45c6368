/**
 * The origin key of a target URL (SPEC §4.1, §4.3): in JavaScript for new outbox rows, in SQL for
 * rows enqueued before `outbox.origin` existed.
 */

/**
 * The origin key of a URL, the unit of the per-origin cap and of the circuit breaker (SPEC §4.1,
 * §4.3): `scheme://host[:port]` as the WHATWG URL parser normalises it (scheme and host lowercased,
 * the scheme's default port dropped, IDN hosts in punycode, IPv6 in brackets), without a trailing
 * dot on the host. So `https://H.example:443/a` and `https://h.example./b` are one origin. A string
 * the parser refuses (never a validated webhook URL) falls back to the SQL rule below. Stored with
 * each outbox row (`outbox.origin`) so the claim shares out per-origin room without parsing URLs.
 */
export const originKey = (url: string): string => {
  const cached = originCache.get(url)
  if (cached !== undefined) return cached
  const key = parseOrigin(url)
  if (originCache.size >= ORIGIN_CACHE_MAX) originCache.clear()
  originCache.set(url, key)
  return key
}

const ORIGIN_CACHE_MAX = 4096
/** target URLs repeat (one per webhook): parsed once each, while the cache holds them */
const originCache = new Map<string, string>()

const parseOrigin = (url: string): string => {
  const u = URL.canParse(url) ? new URL(url) : undefined
  if (u === undefined || u.host === "") {
    const m = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?#]*/.exec(url)
    return m === null ? "" : m[0].toLowerCase()
  }
  const host = u.hostname.endsWith(".") ? u.hostname.slice(0, -1) : u.hostname
  return `${u.protocol}//${host}${u.port === "" ? "" : `:${u.port}`}`
}

/**
 * The origin key in SQL, for rows enqueued before `outbox.origin` existed (NULL there): lowercase
 * `scheme://authority` as written (no port or trailing-dot normalisation, so such a legacy row may
 * count against a different origin key than a new row of the same receiver until it is delivered).
 */
export const ORIGIN_SQL = `COALESCE(lower(substring(target_url from '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*')), '')`
