/**
 * Name resolution for the transport (SafeHttp) and the checks every address passes before a
 * connection is made to it: the operator allow-list, the address policy, the canonical address text.
 *
 * @since 0.1.0
 */
import { Context, Data, Effect, Either, Layer } from "effect"
import * as Dns from "node:dns"
import { type Cidr, cidrContains, classifyHost, isLoopbackBytes, parseCidr } from "../../../schemas/Net.js"
import { ownCode } from "../ErrorCode.js"
import { MAX_ALLOW_CIDRS, MAX_CONNECT_ADDRESSES } from "./Limits.js"

/** A failed name resolution. Generic for the same reason as {@link SafeHttpError}. */
export class ResolveError extends Data.TaggedError("ResolveError")<{
  readonly reason: "not_found" | "temporary" | "failed"
}> {
  override get message(): string {
    return `name resolution failed: ${this.reason}`
  }
}

// ---------------------------------------------------------------------------------------------
// Resolver

export interface ResolvedAddress {
  readonly address: string
  readonly family: 4 | 6
}

export interface ResolverShape {
  /** All addresses of a host name, in resolver order. */
  readonly lookup: (hostname: string) => Effect.Effect<ReadonlyArray<ResolvedAddress>, ResolveError>
}

const resolveReason = (e: unknown): ResolveError["reason"] => {
  const code = ownCode(e)
  // Bun's resolver names its codes `DNS_<c-ares code>` (`DNS_ENOTFOUND`, `DNS_ETIMEOUT`)
  switch (code !== undefined && code.startsWith("DNS_") ? code.slice(4) : code) {
    case "ENOTFOUND":
    case "ENODATA":
    case "EAI_NONAME":
    case "EAI_NODATA":
    case "ENONAME":
      return "not_found"
    case "EAI_AGAIN":
    case "ETIMEOUT":
    case "ESERVFAIL":
    case "ECONNREFUSED":
      return "temporary"
    default:
      return "failed"
  }
}

/** The answers' own `address` (a string) and `family` (4 or 6); anything else is dropped. */
const toAnswers = (answers: unknown): ReadonlyArray<ResolvedAddress> => {
  const out: Array<ResolvedAddress> = []
  if (!Array.isArray(answers)) return out
  for (const a of answers) {
    if (typeof a !== "object" || a === null) continue
    const address: unknown = Reflect.get(a, "address")
    const family: unknown = Reflect.get(a, "family")
    if (typeof address === "string" && (family === 4 || family === 6)) out.push({ address, family })
  }
  return out
}

/** `lookup(hostname)` of a resolver that returns `{address, family}[]`. */
export type LookupAll = (hostname: string) => Promise<unknown>

/**
 * Under Bun: `Bun.dns.lookup(name, { backend: "c-ares" })` (the backend Bun's own `fetch` uses on
 * Linux). Like `getaddrinfo` it reads `/etc/hosts` and applies the resolv.conf search domains, but
 * it runs on the event loop: a query that is never answered costs a timer, not a thread.
 * Bun's `node:dns` `lookup` runs `getaddrinfo` on a small pool of threads, and an abandoned lookup
 * keeps its thread until the C library gives up (resolv.conf timeout × attempts × names tried), so a
 * few webhook hosts whose name servers drop queries held every thread, and every other lookup
 * (every delivery to a name, DID documents, PDS calls) waited 10 s and more behind them.
 * `undefined` when not running under Bun.
 */
export const bunLookup = (bun: unknown): LookupAll | undefined => {
  if (typeof bun !== "object" || bun === null) return undefined
  const dns: unknown = Reflect.get(bun, "dns")
  if (typeof dns !== "object" || dns === null) return undefined
  const lookup: unknown = Reflect.get(dns, "lookup")
  if (typeof lookup !== "function") return undefined
  return (hostname) => {
    const answers: unknown = Reflect.apply(lookup, dns, [hostname, { backend: "c-ares" }])
    return Promise.resolve(answers)
  }
}

/** Node: `getaddrinfo` through `dns.promises.lookup` (`/etc/hosts` and nsswitch apply). */
const nodeLookup: LookupAll = (hostname) => Dns.promises.lookup(hostname, { all: true, verbatim: true })

/**
 * A resolver over `lookup`. A lookup cannot be cancelled; callers bound it with their deadline (the
 * transport does), and an abandoned lookup only finishes in the background.
 */
export const makeLookup = (lookup: LookupAll): ResolverShape["lookup"] => (hostname) =>
  Effect.tryPromise({
    try: () => lookup(hostname),
    catch: (e) => new ResolveError({ reason: resolveReason(e) })
  }).pipe(Effect.map(toAnswers))

/** The system resolver: {@link bunLookup} under Bun, Node's `getaddrinfo` otherwise. */
const systemLookup = makeLookup(bunLookup(Reflect.get(globalThis, "Bun")) ?? nodeLookup)

/**
 * Host name resolution for the transport. Swap the layer to inject answers in tests.
 *
 * @since 0.1.0
 */
export class Resolver extends Context.Tag("firehook/Resolver")<Resolver, ResolverShape>() {
  /** The system resolver. */
  static readonly layer: Layer.Layer<Resolver> = Layer.succeed(this, { lookup: systemLookup })
}

// ---------------------------------------------------------------------------------------------
// Operator allow-list

/**
 * Parses `DELIVERY_ALLOW_CIDRS`: comma-separated CIDR blocks (`10.0.0.0/8, fd00::/8`), whitespace
 * around entries ignored, an empty or blank string = none. Strict: an empty entry (`a,,b`, a trailing
 * comma), a block with host bits set, or more than {@link MAX_ALLOW_CIDRS} entries is `invalid_cidr`.
 *
 * @since 0.1.0
 */
export const parseAllowCidrs = (s: string): Either.Either<ReadonlyArray<Cidr>, "invalid_cidr"> => {
  if (s.trim().length === 0) return Either.right([])
  const parts = s.split(",")
  if (parts.length > MAX_ALLOW_CIDRS) return Either.left("invalid_cidr")
  const out: Array<Cidr> = []
  for (const part of parts) {
    const cidr = parseCidr(part.trim())
    if (cidr === undefined) return Either.left("invalid_cidr")
    out.push(cidr)
  }
  return Either.right(out)
}

// ---------------------------------------------------------------------------------------------
// Address policy

/** What a connection target may be. */
export interface AddressPolicy {
  readonly allowInsecureDev: boolean
  readonly allowCidrs: ReadonlyArray<Cidr>
  /** `http:` targets (insecure development mode only): every address must be loopback. */
  readonly loopbackOnly: boolean
}

export { isLoopbackBytes } from "../../../schemas/Net.js"

/**
 * The decision for one address (an IP literal of the URL or one DNS answer), as a bare address string
 * (`203.0.113.7`, `2001:db8::1`; no brackets, no zone id). Returns the address bytes when a
 * connection to it is allowed:
 * - `loopbackOnly` (an `http:` target in insecure development mode): 127.0.0.0/8 or ::1 only;
 * - otherwise: a public address (SPEC §4.6), an address inside an operator allow-list CIDR, or, in
 *   insecure development mode, a loopback address.
 * Anything that does not parse as a strict IP literal (zone ids, `127.1`, names) is refused.
 *
 * @since 0.1.0
 */
export const allowedAddress = (address: string, policy: AddressPolicy): Uint8Array | undefined => {
  if (address.charCodeAt(0) === 91 /* [ */) return undefined
  const c = classifyHost(address)
  if (c.kind !== "ipv4" && c.kind !== "ipv6") return undefined
  if (policy.loopbackOnly) return policy.allowInsecureDev && isLoopbackBytes(c.bytes) ? c.bytes : undefined
  if (c.public) return c.bytes
  if (policy.allowInsecureDev && isLoopbackBytes(c.bytes)) return c.bytes
  for (const cidr of policy.allowCidrs) {
    if (cidrContains(cidr, c.bytes)) return c.bytes
  }
  return undefined
}

/** The canonical text of validated address bytes, so the socket connects to exactly what was checked. */
export const formatAddress = (bytes: Uint8Array): string => {
  if (bytes.length === 4) return `${bytes[0]}.${bytes[1]}.${bytes[2]}.${bytes[3]}`
  const groups: Array<string> = []
  for (let i = 0; i < 16; i += 2) groups.push((((bytes[i] ?? 0) << 8) | (bytes[i + 1] ?? 0)).toString(16))
  return groups.join(":")
}

/** A validated address to connect to. */
export type Address = { readonly address: string; readonly family: 4 | 6 }

/**
 * The validated addresses of a name's DNS answers (every answer must pass `policy`; with
 * `loopbackOnly`, an `http:` name, every one must be loopback), deduplicated, at most
 * {@link MAX_CONNECT_ADDRESSES}.
 */
export const validateAnswers = (
  answers: ReadonlyArray<ResolvedAddress>,
  policy: AddressPolicy,
  loopbackOnly: boolean
): Either.Either<ReadonlyArray<Address>, "dns" | "blocked_target" | "invalid_target"> => {
  if (answers.length === 0) return Either.left("dns")
  const addresses: Array<Address> = []
  const seen = new Set<string>()
  for (const answer of answers) {
    const bytes = allowedAddress(answer.address, policy)
    if (bytes === undefined) return Either.left("blocked_target")
    // an http: name (development mode) resolving anywhere but loopback breaks the scheme rule
    if (loopbackOnly && !isLoopbackBytes(bytes)) return Either.left("invalid_target")
    const address = formatAddress(bytes)
    if (seen.has(address)) continue
    seen.add(address)
    if (addresses.length < MAX_CONNECT_ADDRESSES) addresses.push({ address, family: bytes.length === 4 ? 4 : 6 })
  }
  return Either.right(addresses)
}

/** {@link Resolver.layer} (the system resolver) at module level. */
export const layer = Resolver.layer
