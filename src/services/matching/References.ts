/**
 * References inside a record value (SPEC §2.3): the strings and @mention facets that point at a
 * DID, a collection or a record, used for backlink matching (SPEC §2.2 step 5).
 *
 * The walk treats the record as untrusted input:
 * - hard bounds on depth, nodes, string bytes, keys per object and references found; hitting any of
 *   them makes the record "too complex" (backlink matching is then skipped for the event);
 * - only OWN DATA properties are read (`Object.getOwnPropertyDescriptor` + `"value" in desc`):
 *   a getter is never invoked, an inherited property is never seen;
 * - only plain arrays (prototype `Array.prototype`) and plain objects (prototype `Object.prototype`
 *   or `null`) are descended into; anything else (Date, Map, Uint8Array, CID instances, class
 *   instances) is a leaf that counts as one node and is otherwise ignored;
 * - a container already visited (a cycle, or a shared sub-object) is skipped.
 *
 * @since 0.1.0
 */
import { isCanonicalDid, parseScopeUri, type ScopeUri } from "../../schemas/AtUri.js"

/** A reference found in a record: a parsed scope URI plus its canonical string form. */
export interface Reference extends ScopeUri {
  /** canonical `at://did[/collection[/rkey]]` */
  readonly uri: string
}

export interface ExtractedReferences {
  /** distinct (by `uri`) relevant references, in walk order; empty when `tooComplex` */
  readonly refs: ReadonlyArray<Reference>
  /** a bound was hit: the caller must skip backlink matching for this event (SPEC §2.3) */
  readonly tooComplex: boolean
}

/** Hard bounds of the walk (SPEC §2.3, §7). */
export const ReferenceLimits = {
  /** containers nested deeper than this (the record itself is level 1) → too complex */
  maxDepth: 32,
  /** values visited (containers and leaves, the record itself included) */
  maxNodes: 2048,
  /** UTF-8 bytes of all string values and object keys visited */
  maxStringBytes: 256 * 1024,
  /** own enumerable string keys of one object */
  maxKeysPerObject: 256,
  /** reference occurrences found (duplicates and irrelevant ones included) */
  maxReferences: 256,
  /** distinct relevant references kept; later ones are dropped silently (not "too complex") */
  maxRelevant: 100
} as const

export const MENTION_FACET_TYPE = "app.bsky.richtext.facet#mention"

/** The canonical string form of a scope URI: `at://did[/collection[/rkey]]`. */
export const formatScopeUri = (s: ScopeUri): string =>
  s.collection === undefined
    ? `at://${s.did}`
    : s.rkey === undefined
    ? `at://${s.did}/${s.collection}`
    : `at://${s.did}/${s.collection}/${s.rkey}`

/**
 * Exact UTF-8 byte length of a JS string, as `TextEncoder` would produce it (a lone surrogate
 * becomes U+FFFD, 3 bytes).
 */
export const utf8Length = (s: string): number => {
  const n = s.length
  let bytes = n
  for (let i = 0; i < n; i++) {
    const c = s.charCodeAt(i)
    if (c < 0x80) continue
    if (c < 0x800) {
      bytes += 1
    } else if (c >= 0xd800 && c <= 0xdbff && i + 1 < n) {
      const d = s.charCodeAt(i + 1)
      if (d >= 0xdc00 && d <= 0xdfff) {
        // a surrogate pair: 2 code units, 4 bytes
        bytes += 2
        i++
      } else {
        bytes += 2
      }
    } else {
      bytes += 2
    }
  }
  return bytes
}

/** `) , ; ! ? ] } ' " .` */
const isTrailingPunctuation = (c: number): boolean =>
  c === 41 || c === 44 || c === 59 || c === 33 || c === 63 || c === 93 || c === 125 || c === 39 ||
  c === 34 || c === 46

const NONE: ExtractedReferences = Object.freeze({ refs: Object.freeze([]), tooComplex: false })
const TOO_COMPLEX: ExtractedReferences = Object.freeze({ refs: Object.freeze([]), tooComplex: true })

/** One walk's state. A class so V8 gives it one stable shape. */
class Walk {
  nodes = 0
  /** UTF-8 bytes when `exact`, else UTF-16 code units (a lower bound; bytes ≤ 3 × units) */
  stringBytes = 0
  /** the cheap count could no longer prove the bound holds: walk again with `exact` */
  needExact = false
  found = 0
  complex = false
  refs: Array<Reference> | undefined = undefined
  readonly seen = new WeakSet<object>()

  constructor(
    readonly isRelevantDid: ((did: string) => boolean) | undefined,
    readonly exact: boolean
  ) {}

  fail(): false {
    this.complex = true
    return false
  }

  addString(s: string): boolean {
    if (this.exact) {
      this.stringBytes += utf8Length(s)
      return this.stringBytes <= ReferenceLimits.maxStringBytes || this.fail()
    }
    // counting code units is enough while even 3 bytes per unit stays within the bound
    this.stringBytes += s.length
    if (this.stringBytes * 3 <= ReferenceLimits.maxStringBytes) return true
    this.needExact = true
    return false
  }

  found1(did: string, collection: string | undefined, rkey: string | undefined, uri: string): boolean {
    if (++this.found > ReferenceLimits.maxReferences) return this.fail()
    let refs = this.refs
    if (refs !== undefined) {
      const n = refs.length
      if (n >= ReferenceLimits.maxRelevant) return true
      // linear dedup: at most 100 kept, usually 1–3
      for (let i = 0; i < n; i++) if ((refs[i] as Reference).uri === uri) return true
    }
    if (this.isRelevantDid !== undefined && !this.isRelevantDid(did)) return true
    const ref: Reference = { did, collection, rkey, uri }
    if (refs === undefined) {
      refs = [ref]
      this.refs = refs
    } else {
      refs.push(ref)
    }
    return true
  }

  /** A string value: a reference only if the whole (trimmed, de-punctuated) string is a scope URI. */
  str(s: string): boolean {
    if (!this.addString(s)) return false
    if (s.length < 5) return true
    const c = s.charCodeAt(0)
    let t: string
    if (c === 97 /* a */) {
      if (!s.startsWith("at://")) return true
      t = s.trim()
    } else if (c <= 32 || c >= 0x80) {
      // possibly leading whitespace (String.prototype.trim's definition, Unicode included)
      t = s.trim()
      if (!t.startsWith("at://")) return true
    } else {
      return true
    }
    let end = t.length
    while (end > 0 && isTrailingPunctuation(t.charCodeAt(end - 1))) end--
    if (end !== t.length) t = t.slice(0, end)
    const p = parseScopeUri(t)
    if (p === undefined) return true
    // parseScopeUri accepts only the canonical spelling, so `t` is `formatScopeUri(p)`
    return this.found1(p.did, p.collection, p.rkey, t)
  }

  visit(v: unknown, depth: number): boolean {
    if (++this.nodes > ReferenceLimits.maxNodes) return this.fail()
    if (typeof v === "string") return this.str(v)
    if (typeof v !== "object" || v === null) return true
    if (this.seen.has(v)) return true
    if (Array.isArray(v)) {
      if (Object.getPrototypeOf(v) !== Array.prototype) return true
      if (depth > ReferenceLimits.maxDepth) return this.fail()
      this.seen.add(v)
      const arr: ReadonlyArray<unknown> = v
      const n = arr.length
      // each element slot counts (holes included): fail before walking a huge array
      if (this.nodes + n > ReferenceLimits.maxNodes) return this.fail()
      for (let i = 0; i < n; i++) {
        const d = Object.getOwnPropertyDescriptor(arr, i)
        if (d === undefined || !("value" in d)) continue // hole or accessor
        if (!this.visit(d.value, depth + 1)) return false
      }
      return true
    }
    const proto: unknown = Object.getPrototypeOf(v)
    if (proto !== Object.prototype && proto !== null) return true
    if (depth > ReferenceLimits.maxDepth) return this.fail()
    this.seen.add(v)
    const keys = Object.keys(v)
    const n = keys.length
    if (n > ReferenceLimits.maxKeysPerObject) return this.fail()
    let type: unknown = undefined
    let did: unknown = undefined
    for (let i = 0; i < n; i++) {
      const k = keys[i] as string
      const d = Object.getOwnPropertyDescriptor(v, k)
      if (d === undefined || !("value" in d)) continue // accessor: never invoked
      if (!this.addString(k)) return false
      const value: unknown = d.value
      if (k === "$type") type = value
      else if (k === "did") did = value
      if (!this.visit(value, depth + 1)) return false
    }
    if (type === MENTION_FACET_TYPE && typeof did === "string" && isCanonicalDid(did)) {
      return this.found1(did, undefined, undefined, `at://${did}`)
    }
    return true
  }
}

/**
 * Extracts the references of a record value (SPEC §2.3).
 *
 * - A string is a reference only if the WHOLE string, trimmed and with trailing
 *   `) , ; ! ? ] } ' " .` removed (repeatedly), parses as a canonical scope AT-URI. Prose that
 *   contains a URI is not a reference. Object keys are never references.
 * - A plain object with `$type === "app.bsky.richtext.facet#mention"` and a canonical `did` is a
 *   reference to `at://<did>`. Other `did` fields are not references.
 * - `isRelevantDid` (default: every DID is relevant) filters the references KEPT: at most 100
 *   distinct relevant references are returned, later ones are dropped. Every reference found,
 *   relevant or not, counts toward the 256-reference bound.
 * - When a bound is hit the result is `{ refs: [], tooComplex: true }`: no partial reference set is
 *   returned, so a caller cannot backlink-match on half a record by mistake.
 *
 * Records with no reference share one frozen result object (no allocation beyond the walk).
 *
 * @since 0.1.0
 */
export const extractReferences = (
  record: unknown,
  isRelevantDid?: (did: string) => boolean
): ExtractedReferences => {
  if (typeof record !== "object" || record === null) {
    if (typeof record !== "string") return NONE
  }
  let walk = new Walk(isRelevantDid, false)
  if (!walk.visit(record, 1)) {
    if (!walk.needExact) return TOO_COMPLEX
    // more than ~85 KiB of text: walk again counting exact UTF-8 bytes (rare, bounded work)
    walk = new Walk(isRelevantDid, true)
    if (!walk.visit(record, 1)) return TOO_COMPLEX
  }
  const refs = walk.refs
  return refs === undefined ? NONE : { refs, tooComplex: false }
}
