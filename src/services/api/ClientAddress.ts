/**
 * The client address of an API request (SPEC §8.2), for the failed-authentication limit: the
 * socket peer, or, only with `API_TRUST_PROXY=1`, the first hop of `X-Forwarded-For` (what the
 * operator's proxy says the client was; a header that is absent or not an IP literal falls back to
 * the peer). The rate-limit key groups IPv6 clients by their /64 (one subscriber's allocation, so
 * cycling through its addresses gains nothing); an IPv4-mapped IPv6 peer counts as its IPv4.
 *
 * @since 0.1.0
 */
import { Option } from "effect"
import { parseIpv4, parseIpv6 } from "../../schemas/Net.js"

/** The address a request comes from (an IP literal as given, or `unknown`); `forwardedFor`: the `X-Forwarded-For` header. */
export const clientAddress = (
  peer: Option.Option<string>,
  forwardedFor: string | undefined,
  trustProxy: boolean
): string => {
  if (trustProxy) {
    const xff = forwardedFor
    const first = xff === undefined ? "" : (xff.split(",")[0] ?? "").trim()
    if (first.length > 0 && first.length <= 64 && addressKey(first) !== "unknown") return first
  }
  return Option.getOrElse(peer, () => "unknown")
}

const hex = (b: Uint8Array, i: number): string => (((b[i] ?? 0) << 8) | (b[i + 1] ?? 0)).toString(16)

/** The rate-limit key of an address: the IPv4 address, or the IPv6 /64; `unknown` otherwise. */
export const addressKey = (address: string): string => {
  const bare = address.startsWith("[") && address.endsWith("]") ? address.slice(1, -1) : address
  const v4 = parseIpv4(bare)
  if (v4 !== undefined) return v4.join(".")
  const v6 = parseIpv6(bare)
  if (v6 === undefined) return "unknown"
  const mapped = v6.slice(0, 10).every((x) => x === 0) && v6[10] === 0xff && v6[11] === 0xff
  if (mapped) return [...v6.slice(12)].join(".")
  return `${hex(v6, 0)}:${hex(v6, 2)}:${hex(v6, 4)}:${hex(v6, 6)}::/64`
}
