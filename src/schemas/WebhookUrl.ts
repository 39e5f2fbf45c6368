/**
 * Webhook URL syntax rules (SPEC §1.2), checked at registration and again on every delivery attempt
 * (SPEC §4.6). DNS answers are checked separately, at delivery time.
 *
 * Errors are bare kinds: they never carry the URL.
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import { type Cidr, cidrContains, classifyHost, isLoopbackHost } from "./Net.js"

export type UrlErrorKind =
  | "not_string"
  | "too_long"
  | "unparseable"
  | "no_host"
  | "credentials"
  | "fragment"
  | "scheme"
  | "blocked_host"
  | "non_public_ip"

export interface WebhookUrlOptions {
  /**
   * Insecure development mode (operator config, never on by default): allows loopback receivers
   * (`localhost`, 127.0.0.0/8, `[::1]`) over `http:` as well as `https:`.
   */
  readonly allowInsecureDev: boolean
  /**
   * Longest input accepted, in UTF-16 units (default {@link MAX_WEBHOOK_URL_LENGTH}, the bound of a
   * webhook's `url`). The transport raises it for its own calls to PDSes, PLC and relays, whose
   * URLs carry a DID and a cursor of up to 2,048 characters (SPEC §1.1, §5.3).
   */
  readonly maxLength?: number | undefined
  /**
   * The operator's allow-list (`DELIVERY_ALLOW_CIDRS`, SPEC §4.6: "for self-hosters with internal
   * receivers"): an `https:` IP literal inside one of these blocks is accepted although it is not
   * public. Absent or empty: none is.
   */
  readonly allowCidrs?: ReadonlyArray<Cidr>
}

export const MAX_WEBHOOK_URL_LENGTH = 2048

/** true if the string contains ASCII whitespace, a C0 control or DEL (which WHATWG URL silently strips). */
const hasControlOrSpace = (s: string): boolean => {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i)
    if (c <= 0x20 || c === 0x7f) return true
  }
  return false
}

/** `name` without trailing dots (hostnames are already lowercased by the URL parser). */
const stripTrailingDot = (name: string): string => {
  let end = name.length
  while (end > 0 && name.charCodeAt(end - 1) === 46) end--
  return end === name.length ? name : name.slice(0, end)
}

/** {@link isLoopbackHost}, where `localhost.` (a trailing dot) is `localhost` too. */
const isLoopback = (hostname: string): boolean => isLoopbackHost(stripTrailingDot(hostname))

const parseUrl = (s: string): URL | undefined => {
  try {
    return new URL(s)
  } catch {
    return undefined
  }
}

/**
 * Validates a webhook URL (SPEC §1.2). Returns the parsed WHATWG `URL` or an error kind.
 *
 * Order of checks (the first failure wins): `not_string`, `too_long` (> 2048 UTF-16 units),
 * `unparseable` (also for whitespace or a control character anywhere in the input), `no_host` (also
 * for a host of dots only),
 * `credentials`, `fragment` (any `#`, even an empty trailing one), `scheme`, `blocked_host`,
 * `non_public_ip`.
 *
 * @since 0.1.0
 */
export const validateWebhookUrl = (
  input: unknown,
  opts: WebhookUrlOptions
): Either.Either<URL, UrlErrorKind> => {
  if (typeof input !== "string") return Either.left("not_string")
  if (input.length > (opts.maxLength ?? MAX_WEBHOOK_URL_LENGTH)) return Either.left("too_long")
  if (input.length === 0 || hasControlOrSpace(input)) return Either.left("unparseable")
  const url = parseUrl(input)
  if (url === undefined) return Either.left("unparseable")
  const hostname = url.hostname
  // a host of dots only (`https://./`, `https://%2e%2e/`) names nothing: the transport refuses it
  if (stripTrailingDot(hostname).length === 0) return Either.left("no_host")
  if (url.username.length > 0 || url.password.length > 0) return Either.left("credentials")
  // `#` can only start a fragment; URL drops an empty one ("https://x/#"), so look at the input
  if (url.hash.length > 0 || input.indexOf("#") >= 0) return Either.left("fragment")
  const protocol = url.protocol
  const loopbackDev = opts.allowInsecureDev && isLoopback(hostname)
  if (protocol !== "https:" && !(protocol === "http:" && loopbackDev)) return Either.left("scheme")
  if (loopbackDev) return Either.right(url)
  const host = classifyHost(hostname)
  switch (host.kind) {
    case "ipv4":
    case "ipv6":
      return host.public || (opts.allowCidrs ?? []).some((cidr) => cidrContains(cidr, host.bytes))
        ? Either.right(url)
        : Either.left("non_public_ip")
    case "invalid":
      return Either.left("non_public_ip")
    case "name": {
      const name = stripTrailingDot(hostname)
      if (name === "localhost" || name.endsWith(".localhost") || name === "metadata.google.internal") {
        return Either.left("blocked_host")
      }
      return Either.right(url)
    }
  }
}
