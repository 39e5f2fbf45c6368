/**
 * IP literal parsing and classification (SPEC §4.6), and CIDR matching for the operator allow-list.
 *
 * Pure functions. Addresses are represented as raw network-order bytes: a 4-byte `Uint8Array` for
 * IPv4 and a 16-byte `Uint8Array` for IPv6. What an address is and whether it lies in a block is
 * decided by ipaddr.js (the library atproto's own SSRF guard, `@atproto-labs/fetch-node`, uses);
 * firehook's code around it only refuses notations the library would accept (non-canonical IPv4
 * numbers, zone ids, leading zeros in a prefix length), so it can refuse more, never admit more.
 *
 * @since 0.1.0
 */
import ipaddr from "ipaddr.js"

/** A parsed CIDR block. `bytes` has every host bit cleared. */
export interface Cidr {
  readonly family: 4 | 6
  readonly bytes: Uint8Array
  readonly prefix: number
}

/** The classification of a host string (a URL hostname or a DNS answer). */
export type HostClass =
  | {
    readonly kind: "ipv4" | "ipv6"
    readonly bytes: Uint8Array
    /** true only if the address is public per SPEC §4.6 */
    readonly public: boolean
  }
  /** a DNS name: must be resolved, and every answer classified, before connecting */
  | { readonly kind: "name" }
  /**
   * Looks like an IP literal but is not an acceptable one: an IPv6 literal with a zone id
   * (`fe80::1%eth0`), an unparseable bracketed literal, or a non-canonical IPv4 number such as
   * `127.1` or `0x7f.0.0.1` (which some resolvers would still turn into an address).
   * Callers must reject it.
   */
  | { readonly kind: "invalid" }

const CH_0 = 48
const CH_9 = 57
const CH_DOT = 46

/** The longest IPv6 text form (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`). */
const MAX_IPV6_TEXT = 45

/** Runs one of ipaddr.js's parsers, which throw on input they refuse: a throw means "not an address". */
const attempt = <A>(f: () => A): A | undefined => {
  try {
    return f()
  } catch {
    return undefined
  }
}

const toBytes = (addr: ipaddr.IPv4 | ipaddr.IPv6): Uint8Array => Uint8Array.from(addr.toByteArray())

const toAddress = (bytes: Uint8Array): ipaddr.IPv4 | ipaddr.IPv6 => ipaddr.fromByteArray(Array.from(bytes))

/**
 * Parses a strict dotted-quad IPv4 literal (`a.b.c.d`, decimal, no leading zeros, no shorthand).
 * Returns 4 bytes in network order, or `undefined`. ipaddr.js decides (its four-part decimal form);
 * its other notations (`127.1`, `0x7f.0.0.1`, `2130706433`, octal parts) are refused.
 *
 * @since 0.1.0
 */
export const parseIpv4 = (s: string): Uint8Array | undefined => {
  const addr = ipv4Address(s)
  return addr === undefined ? undefined : toBytes(addr)
}

/**
 * {@link parseIpv4} as the library's address (`isIPv4` first: a name costs no thrown error). Every
 * call is inside `attempt`: `isIPv4` itself throws on a part such as `09` (not octal).
 */
const ipv4Address = (s: string): ipaddr.IPv4 | undefined =>
  attempt(() => ipaddr.IPv4.isIPv4(s) && ipaddr.IPv4.isValidFourPartDecimal(s) ? ipaddr.IPv4.parse(s) : undefined)

/**
 * Parses an IPv6 literal (RFC 4291 text form, without brackets): hex groups, one optional `::`,
 * an optional embedded dotted-quad IPv4 tail. Zone ids (`%eth0`) are rejected.
 * Returns 16 bytes in network order, or `undefined`.
 *
 * ipaddr.js parses the hex form. An IPv4 tail must be a strict dotted quad (above), and is handed
 * to the library as its two hex groups: the library's own tail parsing takes octal and hex parts
 * and reads `::a.b.c.d` as the mapped `::ffff:a.b.c.d`, where RFC 4291 (and WHATWG URL) read the
 * compatible form `::a.b:c.d`.
 *
 * @since 0.1.0
 */
export const parseIpv6 = (s: string): Uint8Array | undefined => {
  const addr = ipv6Address(s)
  return addr === undefined ? undefined : toBytes(addr)
}

/** {@link parseIpv6} as the library's address; its parser throws on what it refuses. */
const ipv6Address = (s: string): ipaddr.IPv6 | undefined => {
  if (s.length < 2 || s.length > MAX_IPV6_TEXT || s.indexOf("%") >= 0) return undefined
  let text = s
  if (s.indexOf(".") >= 0) {
    const lastColon = s.lastIndexOf(":")
    const tail = lastColon < 0 ? undefined : ipv4Address(s.slice(lastColon + 1))?.octets
    if (tail === undefined) return undefined
    const high = (((tail[0] ?? 0) << 8) | (tail[1] ?? 0)).toString(16)
    const low = (((tail[2] ?? 0) << 8) | (tail[3] ?? 0)).toString(16)
    text = `${s.slice(0, lastColon + 1)}${high}:${low}`
  }
  return attempt(() => ipaddr.IPv6.parse(text))
}

const INVALID: HostClass = { kind: "invalid" }
const NAME: HostClass = { kind: "name" }

/**
 * true if `s` would be read as an IPv4 number by a WHATWG URL parser or by `inet_aton`:
 * its last dot-separated label (ignoring one trailing dot) is all decimal digits or `0x` hex.
 */
const endsInNumber = (s: string): boolean => {
  let end = s.length
  if (end > 0 && s.charCodeAt(end - 1) === CH_DOT) end--
  let start = s.lastIndexOf(".", end - 1) + 1
  if (start >= end) return false
  const c0 = s.charCodeAt(start)
  const c1 = s.charCodeAt(start + 1)
  if (c0 === CH_0 && (c1 === 120 || c1 === 88) && end - start >= 2) {
    start += 2
    return /^[0-9a-fA-F]*$/.test(s.slice(start, end))
  }
  for (let i = start; i < end; i++) {
    const c = s.charCodeAt(i)
    if (c < CH_0 || c > CH_9) return false
  }
  return true
}

const classifyIpv6 = (addr: ipaddr.IPv6 | undefined): HostClass =>
  addr === undefined ? INVALID : { kind: "ipv6", bytes: toBytes(addr), public: publicIpv6(addr) }

/**
 * Classifies a host string: a URL hostname (IPv6 in brackets, `[::1]`) or a bare address
 * (a DNS answer, `::1`). See {@link HostClass}.
 *
 * @since 0.1.0
 */
export const classifyHost = (host: string): HostClass => {
  const known = classified.get(host)
  if (known !== undefined) return known
  const c = classifyUncached(host)
  if (host.length <= CLASSIFY_MEMO_KEY_MAX) {
    if (classified.size >= CLASSIFY_MEMO_MAX) classified.clear()
    classified.set(host, c)
  }
  return c
}

/**
 * Recent classifications. Every delivery attempt classifies its URL's host and each DNS answer,
 * the same few strings again and again, and the library's parsers cost 1–2 µs a string; a
 * classification is a pure function of the string, so it is kept (at most 1,024 strings of at most
 * 255 characters: a DNS name or a bracketed IPv6 literal; the map starts over when full). The
 * bytes of a kept answer are shared: callers read them, never write.
 */
const classified = new Map<string, HostClass>()
const CLASSIFY_MEMO_MAX = 1_024
const CLASSIFY_MEMO_KEY_MAX = 255

const classifyUncached = (host: string): HostClass => {
  const len = host.length
  if (len === 0) return INVALID
  if (host.charCodeAt(0) === 91 /* [ */) {
    if (len < 2 || host.charCodeAt(len - 1) !== 93 /* ] */) return INVALID
    return classifyIpv6(ipv6Address(host.slice(1, len - 1)))
  }
  if (host.indexOf(":") >= 0) return classifyIpv6(ipv6Address(host))
  const v4 = ipv4Address(host)
  if (v4 !== undefined) return { kind: "ipv4", bytes: toBytes(v4), public: publicIpv4(v4) }
  if (endsInNumber(host)) return INVALID
  return NAME
}

/**
 * true if the 4 or 16 bytes are a loopback address: IPv4 127.0.0.0/8 or IPv6 `::1` (an
 * IPv4-mapped `::ffff:127.0.0.1` is not: it is refused like every mapped form).
 *
 * @since 0.1.0
 */
export const isLoopbackBytes = (bytes: Uint8Array): boolean =>
  (bytes.length === 4 || bytes.length === 16) && toAddress(bytes).range() === "loopback"

/**
 * true if a URL hostname is a loopback host (insecure development mode, SPEC §1.2 and §6.5):
 * exactly `localhost`, an IPv4 literal in 127.0.0.0/8, or `[::1]` (`::1`). Never a DNS name that
 * merely starts with `127.` (`127.evil.example`) or ends in `.localhost`: those resolve anywhere.
 * A WHATWG URL's hostname is already lowercased and its IPv4 forms normalized (`127.1` →
 * `127.0.0.1`).
 *
 * @since 0.1.0
 */
export const isLoopbackHost = (hostname: string): boolean => {
  if (hostname === "localhost") return true
  const c = classifyHost(hostname)
  return (c.kind === "ipv4" || c.kind === "ipv6") && isLoopbackBytes(c.bytes)
}

/**
 * Parses a CIDR block: `10.0.0.0/8`, `fd00::/8`. The prefix length is required, decimal without
 * leading zeros, ≤ 32 (IPv4) or ≤ 128 (IPv6). Host bits must be zero (`10.1.0.0/8` is rejected
 * as ambiguous). IPv6 zone ids are rejected.
 *
 * @since 0.1.0
 */
export const parseCidr = (s: string): Cidr | undefined => {
  const slash = s.indexOf("/")
  if (slash <= 0 || slash !== s.lastIndexOf("/")) return undefined
  const lenText = s.slice(slash + 1)
  if (lenText.length === 0 || lenText.length > 3) return undefined
  if (lenText.length > 1 && lenText.charCodeAt(0) === CH_0) return undefined
  let prefix = 0
  for (let i = 0; i < lenText.length; i++) {
    const c = lenText.charCodeAt(i)
    if (c < CH_0 || c > CH_9) return undefined
    prefix = prefix * 10 + (c - CH_0)
  }
  const bytes = parseIpv4(s.slice(0, slash)) ?? parseIpv6(s.slice(0, slash))
  if (bytes === undefined || prefix > bytes.length * 8) return undefined
  const family: 4 | 6 = bytes.length === 4 ? 4 : 6
  // host bits must be zero: the address is its own network address
  const address = toAddress(bytes)
  const network = attempt(() =>
    family === 4
      ? ipaddr.IPv4.networkAddressFromCIDR(`${address.toString()}/${prefix}`)
      : ipaddr.IPv6.networkAddressFromCIDR(`${address.toString()}/${prefix}`)
  )
  if (network === undefined || network.toNormalizedString() !== address.toNormalizedString()) return undefined
  return { family, bytes, prefix }
}

/**
 * The blocks of a list whose every entry the configuration already checked (`DELIVERY_ALLOW_CIDRS`);
 * an entry that does not parse is left out.
 *
 * @since 0.1.0
 */
export const parseCidrs = (list: ReadonlyArray<string>): ReadonlyArray<Cidr> =>
  list.flatMap((c) => {
    const parsed = parseCidr(c)
    return parsed === undefined ? [] : [parsed]
  })

/**
 * true if the address bytes lie inside the block. Families never mix: an IPv4 block does not
 * contain an IPv4-mapped IPv6 address.
 *
 * @since 0.1.0
 */
export const cidrContains = (cidr: Cidr, bytes: Uint8Array): boolean =>
  bytes.length === cidr.bytes.length && (bytes.length === 4 || bytes.length === 16) &&
  inRange(toAddress(bytes), rangeOf(cidr))

/**
 * A block's range as the library matches it, built once per block: the operator's allow-list is
 * checked on every attempt to a non-public address.
 */
const rangeOf = (cidr: Cidr): Range => {
  const known = ranges.get(cidr)
  if (known !== undefined) return known
  const range = toRange(cidr)
  ranges.set(cidr, range)
  return range
}
const ranges = new WeakMap<Cidr, Range>()

/** The blocks of SPEC §4.6, written as CIDR text; only called on the constant tables below. */
const block = (text: string): Cidr => {
  const parsed = parseCidr(text)
  return parsed ?? { family: text.indexOf(":") >= 0 ? 6 : 4, bytes: new Uint8Array(0), prefix: 0 }
}

/**
 * SPEC §4.6: IPv4 ranges that are never public.
 *
 * @since 0.1.0
 */
export const NON_PUBLIC_IPV4: ReadonlyArray<Cidr> = [
  "0.0.0.0/8",
  "10.0.0.0/8",
  "100.64.0.0/10",
  "127.0.0.0/8",
  "169.254.0.0/16",
  "172.16.0.0/12",
  "192.0.0.0/24",
  "192.0.2.0/24",
  "192.31.196.0/24",
  "192.52.193.0/24",
  "192.88.99.0/24",
  "192.168.0.0/16",
  "192.175.48.0/24",
  "198.18.0.0/15",
  "198.51.100.0/24",
  "203.0.113.0/24",
  "224.0.0.0/4",
  "240.0.0.0/4"
].map(block)

/**
 * SPEC §4.6: IPv6 is public only inside 2000::/3 ...
 *
 * @since 0.1.0
 */
export const GLOBAL_UNICAST_IPV6: Cidr = block("2000::/3")

/**
 * ... excluding these blocks (some lie outside 2000::/3 anyway; they are listed as the SPEC lists them),
 * plus, explicitly, the IPv4-mapped (::ffff:0:0/96) and IPv4-compatible (::/96) forms.
 *
 * @since 0.1.0
 */
export const NON_PUBLIC_IPV6: ReadonlyArray<Cidr> = [
  "::ffff:0:0/96",
  "::/96",
  "64:ff9b::/96",
  "64:ff9b:1::/48",
  "100::/64",
  "2001::/23",
  "2001:db8::/32",
  "2002::/16",
  "2620:4f:8000::/48",
  "3fff::/20",
  "5f00::/16"
].map(block)

/** A block as ipaddr.js matches it. */
type Range = readonly [ipaddr.IPv4 | ipaddr.IPv6, number]

const toRange = (cidr: Cidr): Range => [toAddress(cidr.bytes), cidr.prefix]

const NON_PUBLIC_IPV4_RANGES: ReadonlyArray<Range> = NON_PUBLIC_IPV4.map(toRange)
const GLOBAL_UNICAST_IPV6_RANGE: Range = toRange(GLOBAL_UNICAST_IPV6)
const NON_PUBLIC_IPV6_RANGES: ReadonlyArray<Range> = NON_PUBLIC_IPV6.map(toRange)

/** true if the address lies in the range; ipaddr.js refuses (throws) to match across families. */
const inRange = (addr: ipaddr.IPv4 | ipaddr.IPv6, range: Range): boolean =>
  addr.kind() === range[0].kind() && addr.match(range[0], range[1])

/**
 * true if the 4 bytes are a public IPv4 address per SPEC §4.6. Any other length → false.
 *
 * @since 0.1.0
 */
export const isPublicIpv4 = (bytes: Uint8Array): boolean => bytes.length === 4 && publicIpv4(toAddress(bytes))

const publicIpv4 = (addr: ipaddr.IPv4 | ipaddr.IPv6): boolean =>
  !NON_PUBLIC_IPV4_RANGES.some((range) => inRange(addr, range))

/**
 * true if the 16 bytes are a public IPv6 address per SPEC §4.6. Any other length → false.
 * IPv4-mapped and IPv4-compatible addresses are never public, whatever IPv4 address they embed.
 *
 * @since 0.1.0
 */
export const isPublicIpv6 = (bytes: Uint8Array): boolean => bytes.length === 16 && publicIpv6(toAddress(bytes))

const publicIpv6 = (addr: ipaddr.IPv4 | ipaddr.IPv6): boolean =>
  inRange(addr, GLOBAL_UNICAST_IPV6_RANGE) && !NON_PUBLIC_IPV6_RANGES.some((range) => inRange(addr, range))
