/**
 * The validated destination of a request (SafeHttp): what to connect to (an address or a name to
 * resolve), the `Host` header and the TLS server name. Pure: no I/O.
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import { type Cidr, cidrContains, classifyHost } from "../../../schemas/Net.js"
import { validateWebhookUrl } from "../../../schemas/WebhookUrl.js"
import { PLAN_CACHE_MAX } from "./Limits.js"
import { allowedAddress } from "./Resolver.js"

// ---------------------------------------------------------------------------------------------
// Target planning (pure)

/** A validated request target, before resolution. */
export interface Target {
  readonly protocol: "http:" | "https:"
  /** The URL host name as the URL parser normalised it (lowercase, punycode; brackets for IPv6). */
  readonly hostname: string
  /** `Host` header value: `hostname[:port]` (the port only when not the scheme default). */
  readonly hostHeader: string
  readonly port: number
  /** Path and query, percent-encoded by the URL parser. */
  readonly path: string
  /** Set when the URL host is an IP literal: the one address to connect to. */
  readonly literal: Uint8Array | undefined
  /** TLS server name for names (no trailing dot); `undefined` for IP literals and `http:`. */
  readonly servername: string | undefined
  /** `http:` (insecure development mode): every address must be loopback. */
  readonly loopbackOnly: boolean
}

const stripTrailingDots = (name: string): string => {
  let end = name.length
  while (end > 0 && name.charCodeAt(end - 1) === 46) end--
  return name.slice(0, end)
}

const parseUrl = (s: string): URL | undefined => (URL.canParse(s) ? new URL(s) : undefined)

/**
 * Validates a request URL for the transport and returns what to connect to. Pure: no I/O.
 *
 * - The webhook URL rules (SPEC §1.2) apply: syntax errors and a wrong scheme → `invalid_target`;
 *   `localhost`, `*.localhost`, `metadata.google.internal` and non-public IP literals → `blocked_target`.
 * - Decision: an IP literal inside the operator allow-list is accepted (the allow-list is the
 *   operator's statement that those networks are receivers), over `https:` only.
 * - Decision: in insecure development mode `http:` is also accepted for a host NAME (e.g.
 *   `http://receiver.test:8080`), but then every DNS answer must be loopback — "http only to loopback
 *   hosts" checked on the addresses actually connected to.
 *
 * @since 0.1.0
 */
export const planTarget = (
  input: string,
  options: {
    readonly allowInsecureDev: boolean
    readonly allowCidrs: ReadonlyArray<Cidr>
    /** longest URL accepted (default: a webhook URL's 2,048) */
    readonly maxUrlLength?: number | undefined
  }
): Either.Either<Target, "invalid_target" | "blocked_target"> => {
  const maxLength = options.maxUrlLength
  const checked = validateWebhookUrl(input, { allowInsecureDev: options.allowInsecureDev, maxLength })
  let url: URL
  let loopbackOnly = false
  if (Either.isRight(checked)) {
    url = checked.right
    loopbackOnly = url.protocol === "http:"
  } else {
    switch (checked.left) {
      case "blocked_host":
        return Either.left("blocked_target")
      case "non_public_ip": {
        // an https: literal: accepted only when the operator allow-listed it
        const parsed = parseUrl(input)
        if (parsed === undefined) return Either.left("invalid_target")
        const c = classifyHost(parsed.hostname)
        if (c.kind !== "ipv4" && c.kind !== "ipv6") return Either.left("blocked_target")
        if (!options.allowCidrs.some((cidr) => cidrContains(cidr, c.bytes))) return Either.left("blocked_target")
        url = parsed
        break
      }
      case "scheme": {
        if (!options.allowInsecureDev) return Either.left("invalid_target")
        const parsed = parseUrl(input)
        if (parsed === undefined || parsed.protocol !== "http:") return Either.left("invalid_target")
        if (classifyHost(parsed.hostname).kind !== "name") return Either.left("invalid_target")
        // every rule but the scheme, on the same URL as https:
        const again = validateWebhookUrl(`https:${parsed.href.slice("http:".length)}`, {
          allowInsecureDev: false,
          // the input's length was checked above; "https:" and the parser's normalisation add to it
          maxLength: Number.MAX_SAFE_INTEGER
        })
        if (Either.isLeft(again)) {
          return Either.left(
            again.left === "blocked_host" || again.left === "non_public_ip" ? "blocked_target" : "invalid_target"
          )
        }
        url = parsed
        loopbackOnly = true
        break
      }
      default:
        return Either.left("invalid_target")
    }
  }
  const protocol = url.protocol === "http:" ? "http:" : "https:"
  const port = url.port.length > 0 ? Number(url.port) : protocol === "http:" ? 80 : 443
  const c = classifyHost(url.hostname)
  let literal: Uint8Array | undefined
  if (c.kind === "ipv4" || c.kind === "ipv6") {
    const bare = c.kind === "ipv6" ? url.hostname.slice(1, -1) : url.hostname
    literal = allowedAddress(bare, { ...options, loopbackOnly })
    if (literal === undefined) return Either.left("blocked_target")
  } else if (c.kind === "invalid") {
    return Either.left("blocked_target")
  }
  const name = stripTrailingDots(url.hostname)
  if (literal === undefined && name.length === 0) return Either.left("invalid_target")
  return Either.right({
    protocol,
    hostname: url.hostname,
    hostHeader: url.host,
    port,
    path: `${url.pathname}${url.search}`,
    literal,
    servername: protocol === "https:" && literal === undefined ? name : undefined,
    loopbackOnly
  })
}

/** Distinct URL bounds memoised at once (the callers use two: webhooks' and services'). */
const PLAN_BOUNDS_MAX = 4

/**
 * {@link planTarget} under one fixed policy, memoised per URL bound and URL. planTarget is pure and
 * the policy is fixed, so a busy receiver's URL is not parsed and validated again on every request;
 * each bound's map is bounded ({@link PLAN_CACHE_MAX}) and emptied when full.
 */

export const makePlanner = (
  options: { readonly allowInsecureDev: boolean; readonly allowCidrs: ReadonlyArray<Cidr> }
): (url: string, maxUrlLength: number) => Either.Either<Target, "invalid_target" | "blocked_target"> => {
  type Plans = Map<string, Either.Either<Target, "invalid_target" | "blocked_target">>
  // one memo per bound (a URL may be too long for one caller and not for another; the callers use
  // two bounds), keyed by the URL itself: no key is built per request
  const byBound = new Map<number, Plans>()
  return (url, maxUrlLength) => {
    let plans = byBound.get(maxUrlLength)
    if (plans === undefined) {
      if (byBound.size >= PLAN_BOUNDS_MAX) byBound.clear()
      plans = new Map()
      byBound.set(maxUrlLength, plans)
    }
    const known = plans.get(url)
    if (known !== undefined) return known
    const planned = planTarget(url, { ...options, maxUrlLength })
    if (plans.size >= PLAN_CACHE_MAX) plans.clear()
    plans.set(url, planned)
    return planned
  }
}
