/**
 * Canonical DIDs, NSIDs, record keys and scope AT-URIs (SPEC §1.1), plus collection globs.
 *
 * These run on the hot path (every firehose event), so they are hand-written character scans over
 * index ranges: no regular expressions, no intermediate strings, no allocation except the parsed
 * result.
 *
 * @since 0.1.0
 */

/** A parsed scope AT-URI: `at://<did>[/<collection>[/<rkey>]]`. */
export interface ScopeUri {
  readonly did: string
  readonly collection: string | undefined
  readonly rkey: string | undefined
}

/** Hard limit on a scope URI and on a DID (SPEC §1.1). */
export const MAX_SCOPE_URI_LENGTH = 2048
export const MAX_DID_LENGTH = 2048
export const MAX_COLLECTION_LENGTH = 253
/**
 * atproto's NSID length limit (a 253-char domain authority plus a 63-char name): the bound on an
 * EVENT's collection. A scope collection keeps the SPEC §1.1 limit, `MAX_COLLECTION_LENGTH`.
 */
export const MAX_NSID_LENGTH = 317
export const MAX_RKEY_LENGTH = 512

const PLC_PREFIX = "did:plc:"
const WEB_PREFIX = "did:web:"
const PLC_ID_LENGTH = 24

const isLowerAlpha = (c: number): boolean => c >= 97 && c <= 122
const isDigit = (c: number): boolean => c >= 48 && c <= 57
const isAlnum = (c: number): boolean => isDigit(c) || isLowerAlpha(c) || (c >= 65 && c <= 90)

/** [a-z2-7] */
const isPlcChar = (c: number): boolean => isLowerAlpha(c) || (c >= 50 && c <= 55)

/** did:plc: + 24 × [a-z2-7] in s[start, end) */
const isPlcAt = (s: string, start: number, end: number): boolean => {
  if (end - start !== PLC_PREFIX.length + PLC_ID_LENGTH) return false
  for (let i = start + PLC_PREFIX.length; i < end; i++) {
    if (!isPlcChar(s.charCodeAt(i))) return false
  }
  return true
}

/**
 * did:web: host labels ([a-z0-9-]{1,63}, no leading/trailing hyphen) separated by `.`,
 * then optional `:`-separated path segments [a-z0-9._-]+, in s[start, end).
 */
const isWebAt = (s: string, start: number, end: number): boolean => {
  let i = start + WEB_PREFIX.length
  if (i >= end) return false
  // host
  let labelLen = 0
  let prev = 46 // "." : acts as "start of label"
  for (; i < end; i++) {
    const c = s.charCodeAt(i)
    if (c === 58 /* : */) break
    if (c === 46 /* . */) {
      if (labelLen === 0 || prev === 45) return false
      labelLen = 0
    } else if (c === 45 /* - */) {
      if (labelLen === 0) return false
      if (++labelLen > 63) return false
    } else if (isLowerAlpha(c) || isDigit(c)) {
      if (++labelLen > 63) return false
    } else {
      return false
    }
    prev = c
  }
  if (labelLen === 0 || prev === 45) return false
  // path segments
  while (i < end) {
    // s[i] === ":"
    i++
    const segStart = i
    for (; i < end; i++) {
      const c = s.charCodeAt(i)
      if (c === 58) break
      if (!(isLowerAlpha(c) || isDigit(c) || c === 46 || c === 95 || c === 45)) return false
    }
    if (i === segStart) return false
  }
  return true
}

const startsWithAt = (s: string, prefix: string, at: number): boolean => s.startsWith(prefix, at)

const isCanonicalDidAt = (s: string, start: number, end: number): boolean => {
  if (end - start > MAX_DID_LENGTH) return false
  if (startsWithAt(s, PLC_PREFIX, start)) return isPlcAt(s, start, end)
  if (startsWithAt(s, WEB_PREFIX, start)) return isWebAt(s, start, end)
  return false
}

/**
 * A canonical DID (SPEC §1.1): `did:plc:` + exactly 24 × `[a-z2-7]`, or `did:web:` + lowercase host
 * labels and optional `:` path segments, ≤ 2048 chars. Handles and other methods are rejected.
 * A percent-encoded port (`did:web:localhost%3A3000`) is NOT accepted: the SPEC grammar has no `%`.
 *
 * @since 0.1.0
 */
export const isCanonicalDid = (s: string): boolean => isCanonicalDidAt(s, 0, s.length)

/**
 * atproto's DID syntax (`did:<lowercase method>:<[A-Za-z0-9._:%-]*>`, not ending in `:` or `%`,
 * ≤ 2048 chars): what a relay or Jetstream may carry. Wider than {@link isCanonicalDid}
 * (`did:web:Example.com`, `did:web:localhost%3A2583`, other methods): a frame with such a DID is
 * well-formed input whose events match nothing (SPEC §2.2 step 1), not poison that would stop the
 * stream at it for good.
 *
 * @since 0.1.0
 */
export const isAtprotoDidSyntax = (s: string): boolean => {
  if (s.length > MAX_DID_LENGTH || !s.startsWith("did:")) return false
  let i = 4
  for (; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c === 58 /* : */) break
    if (!isLowerAlpha(c)) return false
  }
  if (i === 4 || i >= s.length - 1) return false
  for (let j = i + 1; j < s.length; j++) {
    const c = s.charCodeAt(j)
    if (!(isAlnum(c) || c === 46 || c === 95 || c === 58 || c === 37 || c === 45)) return false
  }
  const last = s.charCodeAt(s.length - 1)
  return last !== 58 && last !== 37
}

/** [A-Za-z0-9.-]{1,max} plus `*` when `glob` */
const isCollectionAt = (s: string, start: number, end: number, glob: boolean, max: number): boolean => {
  const len = end - start
  if (len < 1 || len > max) return false
  for (let i = start; i < end; i++) {
    const c = s.charCodeAt(i)
    if (isAlnum(c) || c === 46 || c === 45) continue
    if (glob && c === 42 /* * */) continue
    return false
  }
  return true
}

/**
 * A scope collection: `[A-Za-z0-9.*-]{1,253}`; `*` is a glob.
 *
 * @since 0.1.0
 */
export const isCollection = (s: string): boolean => isCollectionAt(s, 0, s.length, true, MAX_COLLECTION_LENGTH)

/**
 * An event collection: `[A-Za-z0-9.-]{1,317}` (the scope charset without `*`, up to atproto's NSID
 * length). Only the character set and length are checked, not the NSID segment structure, so every
 * valid atproto NSID passes: a frame carrying one must never be rejected (a rejected frame stalls
 * its stream, SPEC §3.2). A collection longer than a scope's 253 simply matches no collection scope.
 *
 * @since 0.1.0
 */
export const isNsidStrict = (s: string): boolean => isCollectionAt(s, 0, s.length, false, MAX_NSID_LENGTH)

/** [A-Za-z0-9._~:%@+-] */
const isRkeyChar = (c: number): boolean =>
  isAlnum(c) || c === 46 || c === 95 || c === 126 || c === 58 || c === 37 || c === 64 || c === 43 ||
  c === 45

const isRkeyAt = (s: string, start: number, end: number): boolean => {
  const len = end - start
  if (len < 1 || len > MAX_RKEY_LENGTH) return false
  for (let i = start; i < end; i++) {
    if (!isRkeyChar(s.charCodeAt(i))) return false
  }
  // "." and ".." are not record keys
  if (s.charCodeAt(start) === 46 && (len === 1 || (len === 2 && s.charCodeAt(start + 1) === 46))) {
    return false
  }
  return true
}

/**
 * A record key: `[A-Za-z0-9._~:%@+-]{1,512}`, and not `.` or `..`.
 *
 * @since 0.1.0
 */
export const isRkey = (s: string): boolean => isRkeyAt(s, 0, s.length)

/**
 * Parses a canonical scope AT-URI (SPEC §1.1): ≤ 2048 chars, `at://<did>[/<collection>[/<rkey>]]`,
 * no empty segments, at most 3 segments, canonical DID authority. `?`, `#`, `\` and whitespace are
 * rejected (none of them is in any segment's character set).
 *
 * @since 0.1.0
 */
export const parseScopeUri = (s: string): ScopeUri | undefined => {
  const len = s.length
  if (len > MAX_SCOPE_URI_LENGTH || !s.startsWith("at://")) return undefined
  const didStart = 5
  const s1 = s.indexOf("/", didStart)
  const didEnd = s1 < 0 ? len : s1
  if (!isCanonicalDidAt(s, didStart, didEnd)) return undefined
  if (s1 < 0) return { did: s.slice(didStart, didEnd), collection: undefined, rkey: undefined }
  const colStart = s1 + 1
  const s2 = s.indexOf("/", colStart)
  const colEnd = s2 < 0 ? len : s2
  if (!isCollectionAt(s, colStart, colEnd, true, MAX_COLLECTION_LENGTH)) return undefined
  if (s2 < 0) {
    return { did: s.slice(didStart, didEnd), collection: s.slice(colStart, colEnd), rkey: undefined }
  }
  const rkeyStart = s2 + 1
  // the rkey charset has no "/", so a fourth segment fails here
  if (!isRkeyAt(s, rkeyStart, len)) return undefined
  return {
    did: s.slice(didStart, didEnd),
    collection: s.slice(colStart, colEnd),
    rkey: s.slice(rkeyStart, len)
  }
}

/**
 * Compiles a scope collection glob into a matcher. `*` matches any run of characters (dots
 * included, possibly empty). A pattern without `*` is an equality test. Matching is linear-ish and
 * backtracking-free: the literal pieces between stars are matched as prefix, suffix, and leftmost
 * in-order occurrences (which is exact for `*`-only globs), so a hostile pattern cannot cause
 * catastrophic backtracking.
 *
 * @since 0.1.0
 */
export const compileCollectionGlob = (pattern: string): (collection: string) => boolean => {
  const firstStar = pattern.indexOf("*")
  if (firstStar < 0) return (collection) => collection === pattern
  const pieces = pattern.split("*")
  const prefix = pieces[0] ?? ""
  const suffix = pieces[pieces.length - 1] ?? ""
  const middle = pieces.slice(1, -1).filter((p) => p.length > 0)
  const minLength = prefix.length + suffix.length + middle.reduce((n, p) => n + p.length, 0)
  if (middle.length === 0) {
    if (suffix.length === 0) {
      if (prefix.length === 0) return () => true
      return (collection) => collection.startsWith(prefix)
    }
    if (prefix.length === 0) return (collection) => collection.endsWith(suffix)
    return (collection) =>
      collection.length >= minLength && collection.startsWith(prefix) && collection.endsWith(suffix)
  }
  return (collection) => {
    if (collection.length < minLength) return false
    if (!collection.startsWith(prefix) || !collection.endsWith(suffix)) return false
    let pos = prefix.length
    const limit = collection.length - suffix.length
    for (const piece of middle) {
      const at = collection.indexOf(piece, pos)
      if (at < 0 || at + piece.length > limit) return false
      pos = at + piece.length
    }
    return true
  }
}
