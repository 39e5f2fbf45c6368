/**
 * IP literal parsing and classification (SPEC §4.6), and CIDR matching for the operator allow-list.
 *
 * Pure, allocation-light functions. Addresses are represented as raw network-order bytes:
 * a 4-byte `Uint8Array` for IPv4 and a 16-byte `Uint8Array` for IPv6.
 *
 * @since 0.1.0
 */

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
const CH_COLON = 58

const hexValue = (c: number): number => {
  if (c >= 48 && c <= 57) return c - 48
  if (c >= 97 && c <= 102) return c - 87
  if (c >= 65 && c <= 70) return c - 55
  return -1
}

/**
 * Parses `s[start, end)` as a strict dotted quad into `out[offset..offset+4)`.
 * Each part is 1–3 decimal digits, ≤ 255, with no leading zero (so no octal look-alikes).
 */
const parseIpv4Into = (s: string, start: number, end: number, out: Uint8Array, offset: number): boolean => {
  if (end - start < 7 || end - start > 15) return false
  let part = 0
  let value = 0
  let digits = 0
  let leadingZero = false
  for (let i = start; i <= end; i++) {
    const c = i === end ? CH_DOT : s.charCodeAt(i)
    if (c === CH_DOT) {
      if (digits === 0 || part > 3) return false
      out[offset + part] = value
      part++
      value = 0
      digits = 0
      leadingZero = false
      continue
    }
    if (c < CH_0 || c > CH_9) return false
    if (leadingZero) return false
    if (digits === 0 && c === CH_0) leadingZero = true
    value = value * 10 + (c - CH_0)
    digits++
    if (digits > 3 || value > 255) return false
  }
  return part === 4
}

/**
 * Parses a strict dotted-quad IPv4 literal (`a.b.c.d`, decimal, no leading zeros, no shorthand).
 * Returns 4 bytes in network order, or `undefined`.
 *
 * @since 0.1.0
 */
export const parseIpv4 = (s: string): Uint8Array | undefined => {
  const out = new Uint8Array(4)
  return parseIpv4Into(s, 0, s.length, out, 0) ? out : undefined
}

/** Parses the colon-separated hex groups of `s[start, end)`; an IPv4 tail is allowed when `allowV4Tail`. */
const parseGroups = (
  s: string,
  start: number,
  end: number,
  groups: Array<number>,
  allowV4Tail: boolean
): boolean => {
  if (start === end) return true
  let i = start
  while (i <= end) {
    let j = i
    while (j < end && s.charCodeAt(j) !== CH_COLON) j++
    if (j === i) return false // empty group
    // An IPv4 tail: only as the very last group.
    let hasDot = false
    for (let k = i; k < j; k++) {
      if (s.charCodeAt(k) === CH_DOT) {
        hasDot = true
        break
      }
    }
    if (hasDot) {
      if (!allowV4Tail || j !== end) return false
      const v4 = new Uint8Array(4)
      if (!parseIpv4Into(s, i, j, v4, 0)) return false
      groups.push(((v4[0] ?? 0) << 8) | (v4[1] ?? 0), ((v4[2] ?? 0) << 8) | (v4[3] ?? 0))
      return true
    }
    if (j - i > 4) return false
    let value = 0
    for (let k = i; k < j; k++) {
      const h = hexValue(s.charCodeAt(k))
      if (h < 0) return false
      value = (value << 4) | h
    }
    groups.push(value)
    if (groups.length > 8) return false
    i = j + 1
  }
  return true
}

/**
 * Parses an IPv6 literal (RFC 4291 text form, without brackets): hex groups, one optional `::`,
 * an optional embedded dotted-quad IPv4 tail. Zone ids (`%eth0`) are rejected.
 * Returns 16 bytes in network order, or `undefined`.
 *
 * @since 0.1.0
 */
export const parseIpv6 = (s: string): Uint8Array | undefined => {
  const len = s.length
  if (len < 2 || len > 45) return undefined
  const gap = s.indexOf("::")
  const head: Array<number> = []
  const tail: Array<number> = []
  if (gap < 0) {
    if (!parseGroups(s, 0, len, head, true) || head.length !== 8) return undefined
  } else {
    if (s.indexOf("::", gap + 1) >= 0) return undefined
    if (!parseGroups(s, 0, gap, head, false)) return undefined
    if (!parseGroups(s, gap + 2, len, tail, true)) return undefined
    // `::` stands for at least one zero group
    if (head.length + tail.length > 7) return undefined
  }
  const out = new Uint8Array(16)
  for (let g = 0; g < head.length; g++) {
    const v = head[g] ?? 0
    out[g * 2] = v >> 8
    out[g * 2 + 1] = v & 0xff
  }
  const base = 8 - tail.length
  for (let g = 0; g < tail.length; g++) {
    const v = tail[g] ?? 0
    out[(base + g) * 2] = v >> 8
    out[(base + g) * 2 + 1] = v & 0xff
  }
  return out
}

/** true if the first `prefix` bits of `a` and `b` are equal (both long enough). */
const prefixEquals = (a: Uint8Array, b: Uint8Array, prefix: number): boolean => {
  const whole = prefix >> 3
  for (let i = 0; i < whole; i++) {
    if (a[i] !== b[i]) return false
  }
  const rest = prefix & 7
  if (rest === 0) return true
  const mask = (0xff << (8 - rest)) & 0xff
  return ((a[whole] ?? 0) & mask) === ((b[whole] ?? 0) & mask)
}

const block = (family: 4 | 6, text: string, prefix: number): Cidr => {
  // Only called on the constant tables below, whose literals are valid.
  const bytes = (family === 4 ? parseIpv4(text) : parseIpv6(text)) ?? new Uint8Array(family === 4 ? 4 : 16)
  return { family, bytes, prefix }
}

/**
 * SPEC §4.6: IPv4 ranges that are never public.
 *
 * @since 0.1.0
 */
export const NON_PUBLIC_IPV4: ReadonlyArray<Cidr> = [
  block(4, "0.0.0.0", 8),
  block(4, "10.0.0.0", 8),
  block(4, "100.64.0.0", 10),
  block(4, "127.0.0.0", 8),
  block(4, "169.254.0.0", 16),
  block(4, "172.16.0.0", 12),
  block(4, "192.0.0.0", 24),
  block(4, "192.0.2.0", 24),
  block(4, "192.31.196.0", 24),
  block(4, "192.52.193.0", 24),
  block(4, "192.88.99.0", 24),
  block(4, "192.168.0.0", 16),
  block(4, "192.175.48.0", 24),
  block(4, "198.18.0.0", 15),
  block(4, "198.51.100.0", 24),
  block(4, "203.0.113.0", 24),
  block(4, "224.0.0.0", 4),
  block(4, "240.0.0.0", 4)
]

/**
 * SPEC §4.6: IPv6 is public only inside 2000::/3 ...
 *
 * @since 0.1.0
 */
export const GLOBAL_UNICAST_IPV6: Cidr = block(6, "2000::", 3)

/**
 * ... excluding these blocks (some lie outside 2000::/3 anyway; they are listed as the SPEC lists them),
 * plus, explicitly, the IPv4-mapped (::ffff:0:0/96) and IPv4-compatible (::/96) forms.
 *
 * @since 0.1.0
 */
export const NON_PUBLIC_IPV6: ReadonlyArray<Cidr> = [
  block(6, "::ffff:0:0", 96),
  block(6, "::", 96),
  block(6, "64:ff9b::", 96),
  block(6, "64:ff9b:1::", 48),
  block(6, "100::", 64),
  block(6, "2001::", 23),
  block(6, "2001:db8::", 32),
  block(6, "2002::", 16),
  block(6, "2620:4f:8000::", 48),
  block(6, "3fff::", 20),
  block(6, "5f00::", 16)
]

/**
 * true if the 4 bytes are a public IPv4 address per SPEC §4.6. Any other length → false.
 *
 * @since 0.1.0
 */
export const isPublicIpv4 = (bytes: Uint8Array): boolean => {
  if (bytes.length !== 4) return false
  for (const c of NON_PUBLIC_IPV4) {
    if (prefixEquals(bytes, c.bytes, c.prefix)) return false
  }
  return true
}

/**
 * true if the 16 bytes are a public IPv6 address per SPEC §4.6. Any other length → false.
 * IPv4-mapped and IPv4-compatible addresses are never public, whatever IPv4 address they embed.
 *
 * @since 0.1.0
 */
export const isPublicIpv6 = (bytes: Uint8Array): boolean => {
  if (bytes.length !== 16) return false
  if (!prefixEquals(bytes, GLOBAL_UNICAST_IPV6.bytes, GLOBAL_UNICAST_IPV6.prefix)) return false
  for (const c of NON_PUBLIC_IPV6) {
    if (prefixEquals(bytes, c.bytes, c.prefix)) return false
  }
  return true
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
    for (let i = start; i < end; i++) if (hexValue(s.charCodeAt(i)) < 0) return false
    return true
  }
  for (let i = start; i < end; i++) {
    const c = s.charCodeAt(i)
    if (c < CH_0 || c > CH_9) return false
  }
  return true
}

/**
 * Classifies a host string: a URL hostname (IPv6 in brackets, `[::1]`) or a bare address
 * (a DNS answer, `::1`). See {@link HostClass}.
 *
 * @since 0.1.0
 */
export const classifyHost = (host: string): HostClass => {
  const len = host.length
  if (len === 0) return INVALID
  if (host.charCodeAt(0) === 91 /* [ */) {
    if (len < 2 || host.charCodeAt(len - 1) !== 93 /* ] */) return INVALID
    const bytes = parseIpv6(host.slice(1, len - 1))
    return bytes === undefined ? INVALID : { kind: "ipv6", bytes, public: isPublicIpv6(bytes) }
  }
  if (host.indexOf(":") >= 0) {
    const bytes = parseIpv6(host)
    return bytes === undefined ? INVALID : { kind: "ipv6", bytes, public: isPublicIpv6(bytes) }
  }
  const v4 = parseIpv4(host)
  if (v4 !== undefined) return { kind: "ipv4", bytes: v4, public: isPublicIpv4(v4) }
  if (endsInNumber(host)) return INVALID
  return NAME
}

/**
 * true if the 4 or 16 bytes are a loopback address: IPv4 127.0.0.0/8 or IPv6 `::1` (an
 * IPv4-mapped `::ffff:127.0.0.1` is not: it is refused like every mapped form).
 *
 * @since 0.1.0
 */
export const isLoopbackBytes = (bytes: Uint8Array): boolean => {
  if (bytes.length === 4) return bytes[0] === 127
  if (bytes.length !== 16) return false
  for (let i = 0; i < 15; i++) if (bytes[i] !== 0) return false
  return bytes[15] === 1
}

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
  const addr = s.slice(0, slash)
  const family: 4 | 6 = addr.indexOf(":") >= 0 ? 6 : 4
  const bytes = family === 4 ? parseIpv4(addr) : parseIpv6(addr)
  if (bytes === undefined) return undefined
  if (prefix > bytes.length * 8) return undefined
  // host bits must be zero
  for (let bit = prefix; bit < bytes.length * 8; bit++) {
    if (((bytes[bit >> 3] ?? 0) & (0x80 >> (bit & 7))) !== 0) return undefined
  }
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
  bytes.length === cidr.bytes.length && prefixEquals(bytes, cidr.bytes, cidr.prefix)
