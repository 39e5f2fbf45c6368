/**
 * The SSRF-safe HTTP transport (SPEC §4.6), used for webhook deliveries and for DID documents and
 * PDS calls (SPEC §5.1).
 *
 * Per request:
 * 1. Re-validate the URL with the webhook URL rules (SPEC §1.2).
 * 2. Bound the request: body bytes and header bytes are checked before anything touches the network.
 * 3. An IP literal is used as is; a name is resolved ONCE through the {@link Resolver}. EVERY answer
 *    must be acceptable (public; or inside the operator allow-list; or loopback in insecure
 *    development mode), otherwise the whole request is `blocked_target`.
 * 4. The connection is made to a validated address, never to the name: `host: <address>`, TLS SNI and
 *    certificate check against the name (`servername`), `Host: <name[:port]>`. Node's `net` module does
 *    not look up an IP literal, so there is no second resolution and no rebinding window.
 * 5. On a connect error, the next validated address is tried, all inside one overall deadline
 *    (`timeoutMs` covers resolve + connect + request + response + body). Deadlines are enforced by
 *    one Clock-driven ticker fiber per transport ({@link DEADLINE_TICK_MS} granularity), not by a
 *    timer race per request.
 * 6. Redirects are never followed (a 3xx is returned as a response). At most `maxResponseBytes` of
 *    the response body are read.
 *
 * Errors are generic ({@link SafeHttpError}): a kind, nothing else. They never carry the URL, the
 * host name, DNS answers, addresses, headers or an underlying error (whose message would).
 *
 * @since 0.1.0
 */
import * as Dns from "node:dns"
import * as Http from "node:http"
import * as Https from "node:https"
import type * as Net from "node:net"
import { Clock, Context, Data, Duration, Effect, Either, Layer, Queue } from "effect"
import type { Scope } from "effect"
import { type Cidr, cidrContains, classifyHost, parseCidr } from "../../../schemas/Net.js"
import { validateWebhookUrl } from "../../../schemas/WebhookUrl.js"
import { ownCode } from "../ErrorCode.js"

// ---------------------------------------------------------------------------------------------
// Limits

/** Default request body bound (SPEC §4.5: request body ≤ 512 KiB). */
export const DEFAULT_MAX_REQUEST_BYTES = 512 * 1024

/** Default keep-alive sockets per destination (address + port [+ TLS name]). */
export const DEFAULT_MAX_SOCKETS_PER_HOST = 64

/** Upper bound accepted for `maxSocketsPerHost`. */
export const MAX_SOCKETS_PER_HOST_LIMIT = 4096

/** Total bytes of request header names and values a caller may add (Host/Content-Length excluded). */
export const MAX_REQUEST_HEADER_BYTES = 64 * 1024

/**
 * An idle keep-alive socket is closed after this long. Below the 5 s keep-alive timeout of Node's
 * HTTP server (the most common short one) so we rarely write into a socket the server is closing.
 */
export const IDLE_SOCKET_TIMEOUT_MS = 4_000

/** At most this many distinct addresses of one name are tried (all answers are still validated). */
export const MAX_CONNECT_ADDRESSES = 16

/** Largest overall deadline accepted for one request (a larger `timeoutMs` is clamped). */
export const MAX_TIMEOUT_MS = 5 * 60 * 1000

/** URL plans (`planTarget` results) memoised per transport. */
export const PLAN_CACHE_MAX = 4096

/** At most this many operator allow-list entries (`parseAllowCidrs`). */
export const MAX_ALLOW_CIDRS = 256

// ---------------------------------------------------------------------------------------------
// Errors

/** Every way a transport request can fail; each maps 1:1 onto a delivery `FailureKind` (SPEC §4.3). */
export type SafeHttpErrorKind =
  | "invalid_target"
  | "blocked_target"
  | "dns"
  | "timeout"
  | "network"
  | "request_too_large"
  | "response_too_large"

/**
 * A failed transport request. Deliberately carries nothing but the kind: no URL, host name, address,
 * DNS answer, header or cause (a Node error message names the address it failed to reach).
 */
export class SafeHttpError extends Data.TaggedError("SafeHttpError")<{ readonly kind: SafeHttpErrorKind }> {
  override get message(): string {
    return `delivery failed: ${this.kind}`
  }
}

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

/**
 * Sets an own enumerable property, even for a name such as `__proto__` (header names are data).
 * Plain assignment creates an own data property for every other name; `defineProperty` on every
 * header turned the objects into slow dictionaries that node:http then copies (measured on Bun).
 */
const setOwn = (target: Record<string, string>, name: string, value: string): void => {
  if (name === "__proto__") {
    Object.defineProperty(target, name, { value, enumerable: true, writable: true, configurable: true })
  } else {
    target[name] = value
  }
}

const resolveReason = (e: unknown): ResolveError["reason"] => {
  switch (ownCode(e)) {
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

/**
 * The system resolver (`getaddrinfo` through `dns.promises.lookup`, so `/etc/hosts` and nsswitch
 * apply). A lookup cannot be cancelled; callers bound it with their deadline (the transport does),
 * and an abandoned lookup only finishes in the background.
 */
const systemLookup = (hostname: string): Effect.Effect<ReadonlyArray<ResolvedAddress>, ResolveError> =>
  Effect.tryPromise({
    try: () => Dns.promises.lookup(hostname, { all: true, verbatim: true }),
    catch: (e) => new ResolveError({ reason: resolveReason(e) })
  }).pipe(
    Effect.map((answers) => {
      const out: Array<ResolvedAddress> = []
      for (const a of answers) {
        if (a.family === 4 || a.family === 6) out.push({ address: a.address, family: a.family })
      }
      return out
    })
  )

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

const isLoopbackBytes = (bytes: Uint8Array): boolean => {
  if (bytes.length === 4) return bytes[0] === 127
  if (bytes.length !== 16) return false
  for (let i = 0; i < 15; i++) if (bytes[i] !== 0) return false
  return bytes[15] === 1
}

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
const formatAddress = (bytes: Uint8Array): string => {
  if (bytes.length === 4) return `${bytes[0]}.${bytes[1]}.${bytes[2]}.${bytes[3]}`
  const groups: Array<string> = []
  for (let i = 0; i < 16; i += 2) groups.push((((bytes[i] ?? 0) << 8) | (bytes[i + 1] ?? 0)).toString(16))
  return groups.join(":")
}

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
  options: { readonly allowInsecureDev: boolean; readonly allowCidrs: ReadonlyArray<Cidr> }
): Either.Either<Target, "invalid_target" | "blocked_target"> => {
  const checked = validateWebhookUrl(input, { allowInsecureDev: options.allowInsecureDev })
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
        const again = validateWebhookUrl(`https:${parsed.href.slice("http:".length)}`, { allowInsecureDev: false })
        if (Either.isLeft(again)) {
          return Either.left(again.left === "blocked_host" || again.left === "non_public_ip" ? "blocked_target" : "invalid_target")
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

// ---------------------------------------------------------------------------------------------
// Request headers

/** RFC 9110 token. */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/** What Node accepts in a header value (it throws on anything else). */
const HEADER_VALUE_INVALID = /[^\t\x20-\x7e\x80-\xff]/

/** Framing and hop-by-hop headers owned by the transport: a caller's value is dropped. */
const TRANSPORT_HEADERS: ReadonlySet<string> = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "proxy-connection",
  "upgrade",
  "te",
  "trailer",
  "expect",
  "http2-settings"
])

const buildHeaders = (
  headers: Readonly<Record<string, string>>,
  hostHeader: string,
  contentLength: number | undefined
): Either.Either<Record<string, string>, "invalid_target" | "request_too_large"> => {
  const out: Record<string, string> = {}
  let bytes = 0
  for (const name of Object.keys(headers)) {
    const value: unknown = Object.getOwnPropertyDescriptor(headers, name)?.value
    if (typeof value !== "string") return Either.left("invalid_target")
    if (!HEADER_NAME.test(name) || HEADER_VALUE_INVALID.test(value)) return Either.left("invalid_target")
    bytes += name.length + value.length + 4
    if (bytes > MAX_REQUEST_HEADER_BYTES) return Either.left("request_too_large")
    if (TRANSPORT_HEADERS.has(name.toLowerCase())) continue
    setOwn(out, name, value)
  }
  setOwn(out, "Host", hostHeader)
  if (contentLength !== undefined) setOwn(out, "Content-Length", String(contentLength))
  return Either.right(out)
}

// ---------------------------------------------------------------------------------------------
// The service

export interface SafeRequest {
  readonly url: string
  readonly method: "GET" | "POST"
  /** Caller headers. `Host`, `Content-Length` and hop-by-hop headers are set by the transport. */
  readonly headers: Readonly<Record<string, string>>
  /** Sent as UTF-8, byte for byte. */
  readonly body?: string | undefined
  /** Overall deadline: resolve + connect + request + response + body. */
  readonly timeoutMs: number
  /** Response body bytes to read at most. */
  readonly maxResponseBytes: number
  /** Request body bound (default {@link DEFAULT_MAX_REQUEST_BYTES}). */
  readonly maxRequestBytes?: number | undefined
  /**
   * What a response body larger than `maxResponseBytes` is: `"fail"` (default) →
   * `response_too_large`; `"truncate"` → the first `maxResponseBytes` bytes are returned with
   * `truncated: true` and the connection is closed (SPEC §4.5: a webhook response body is only
   * logged, "read at most 64 KiB, then cancel").
   */
  readonly onResponseOverflow?: "fail" | "truncate" | undefined
}

export interface SafeResponse {
  readonly status: number
  /** Lowercased names; repeated headers joined with `, `. */
  readonly headers: Readonly<Record<string, string>>
  readonly body: Uint8Array
  /** true only with `onResponseOverflow: "truncate"` when more than `maxResponseBytes` arrived. */
  readonly truncated: boolean
}

export interface SafeHttpShape {
  readonly request: (req: SafeRequest) => Effect.Effect<SafeResponse, SafeHttpError>
}

export interface SafeHttpOptions {
  /** Insecure development mode (`WEBHOOK_ALLOW_INSECURE_DEV`): `http:` and loopback targets. */
  readonly allowInsecureDev: boolean
  /** Operator allow-list (`DELIVERY_ALLOW_CIDRS`): addresses accepted although not public. */
  readonly allowCidrs: ReadonlyArray<Cidr>
  /** Keep-alive sockets per destination (default {@link DEFAULT_MAX_SOCKETS_PER_HOST}). */
  readonly maxSocketsPerHost?: number | undefined
  /**
   * TLS trust: `ca` REPLACES the system roots (PEM). For tests and private PKIs; certificate
   * verification itself can never be turned off.
   */
  readonly tls?: { readonly ca?: string | undefined } | undefined
}

interface Agents {
  readonly http: Http.Agent
  readonly https: Https.Agent
}

const fail = (kind: SafeHttpErrorKind) => Effect.fail(new SafeHttpError({ kind }))

/** Connect-phase errors after which the next address is tried. */
const CONNECT_ERRORS: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EHOSTDOWN",
  "ENETDOWN",
  "ETIMEDOUT",
  "EADDRNOTAVAIL",
  "EAFNOSUPPORT",
  "EACCES",
  "EPERM"
])

/** Why one attempt against one address failed. */
type AttemptFailure =
  /** before the connection was established: try the next address */
  | { readonly _tag: "ConnectFailed"; readonly kind: "network" | "timeout" }
  /** a reused keep-alive socket was closed by the server before any response: retry once */
  | { readonly _tag: "Stale" }
  | { readonly _tag: "Final"; readonly kind: SafeHttpErrorKind }

const connectFailed = (kind: "network" | "timeout"): AttemptFailure => ({ _tag: "ConnectFailed", kind })
const STALE: AttemptFailure = { _tag: "Stale" }
const final = (kind: SafeHttpErrorKind): AttemptFailure => ({ _tag: "Final", kind })

const lowerHeaders = (headers: Http.IncomingHttpHeaders): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const name of Object.keys(headers)) {
    const v = headers[name]
    if (v === undefined) continue
    setOwn(out, name.toLowerCase(), typeof v === "string" ? v : v.join(", "))
  }
  return out
}

const DECIMAL = /^\d{1,15}$/

/** The outcome of one exchange against one address. */
type ExchangeOutcome =
  | { readonly _tag: "Ok"; readonly response: SafeResponse }
  | { readonly _tag: "Failed"; readonly failure: AttemptFailure }

interface ExchangeHooks {
  /** The connection is established (socket connected, or a response arrived). At most once. */
  readonly connected: () => void
  /** The exchange ended. Exactly once (possibly synchronously from {@link startExchange}). */
  readonly settle: (outcome: ExchangeOutcome) => void
}

interface Exchange {
  /** Destroys the request, response and socket unless the exchange finished cleanly. */
  readonly release: () => void
}

interface ExchangeSpec {
  readonly agents: Agents
  readonly target: Target
  readonly address: string
  readonly family: 4 | 6
  readonly method: "GET" | "POST"
  readonly headers: Record<string, string>
  /** sent as UTF-8 (Content-Length is its UTF-8 length) */
  readonly body: string | undefined
  readonly maxResponseBytes: number
  readonly truncate: boolean
}

const NOOP_EXCHANGE: Exchange = { release: () => undefined }

/**
 * Starts one HTTP exchange against one address. Node callbacks only call the two hooks (each at most
 * once); every listener stays attached for the life of the objects, so a late error can never go
 * unhandled.
 */
const startExchange = (spec: ExchangeSpec, hooks: ExchangeHooks): Exchange => {
  let isConnected = false
  let responded = false
  let finished = false
  let clean = false
  let req: Http.ClientRequest | undefined
  let res: Http.IncomingMessage | undefined

  const markConnected = (): void => {
    if (isConnected || finished) return
    isConnected = true
    hooks.connected()
  }
  const settle = (outcome: ExchangeOutcome): void => {
    if (finished) return
    finished = true
    isConnected = true
    hooks.settle(outcome)
  }
  const failWith = (failure: AttemptFailure): void => settle({ _tag: "Failed", failure })
  const destroy = (): void => {
    res?.destroy()
    req?.destroy()
  }

  const onError = (err: unknown): void => {
    const code = ownCode(err)
    if (!isConnected) {
      failWith(
        code !== undefined && CONNECT_ERRORS.has(code)
          ? connectFailed(code === "ETIMEDOUT" ? "timeout" : "network")
          : final("network")
      )
      return
    }
    if (!responded && req?.reusedSocket === true && (code === "ECONNRESET" || code === "EPIPE")) {
      failWith(STALE)
      return
    }
    failWith(final(code === "ETIMEDOUT" ? "timeout" : "network"))
  }

  const onResponse = (response: Http.IncomingMessage): void => {
    res = response
    responded = true
    markConnected()
    response.on("error", () => failWith(final("network")))
    const max = spec.maxResponseBytes
    const declared = response.headers["content-length"]
    if (!spec.truncate && declared !== undefined && DECIMAL.test(declared) && Number(declared) > max) {
      failWith(final("response_too_large"))
      destroy()
      return
    }
    const status = response.statusCode ?? 0
    const headers = lowerHeaders(response.headers)
    const chunks: Array<Uint8Array> = []
    let total = 0
    const succeed = (truncated: boolean): void => {
      const body = new Uint8Array(total)
      let at = 0
      for (const c of chunks) {
        body.set(c, at)
        at += c.length
      }
      settle({ _tag: "Ok", response: { status, headers, body, truncated } })
    }
    response.on("data", (chunk: Uint8Array | string) => {
      if (finished) return
      const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk
      const room = max - total
      if (bytes.length > room) {
        if (spec.truncate) {
          if (room > 0) chunks.push(bytes.subarray(0, room))
          total = max
          succeed(true)
        } else {
          failWith(final("response_too_large"))
        }
        destroy()
        return
      }
      chunks.push(bytes)
      total += bytes.length
    })
    response.on("end", () => {
      if (finished) return
      clean = true
      succeed(false)
    })
    response.on("close", () => failWith(final("network")))
  }

  const mod = spec.target.protocol === "https:" ? Https : Http
  const options: Https.RequestOptions = {
    agent: spec.target.protocol === "https:" ? spec.agents.https : spec.agents.http,
    host: spec.address,
    family: spec.family,
    port: spec.target.port,
    path: spec.target.path,
    method: spec.method,
    headers: spec.headers,
    setHost: false,
    insecureHTTPParser: false
  }
  if (spec.target.servername !== undefined) options.servername = spec.target.servername
  try {
    req = mod.request(options)
  } catch {
    // option validation (headers and path were validated before; this is a last resort)
    failWith(final("network"))
    return NOOP_EXCHANGE
  }
  req.on("error", onError)
  req.on("response", onResponse)
  req.once("socket", (socket: Net.Socket) => {
    if (!socket.connecting) markConnected()
    else socket.once("connect", markConnected)
  })
  req.on("close", () => {
    if (!responded) failWith(final("network"))
  })
  if (spec.body === undefined) req.end()
  else req.end(spec.body, "utf8")

  return {
    release: () => {
      if (!clean) destroy()
    }
  }
}

/**
 * One request in progress, as the deadline ticker sees it: the overall deadline and, while the
 * connection to one of several addresses is being made, that address's connect deadline.
 */
interface Pending {
  readonly deadline: number
  connectDeadline: number | undefined
  /** Called by the ticker when a deadline has passed. */
  readonly expire: (now: number) => void
}

/**
 * Deadlines of the requests in progress, enforced by ONE fiber per transport instead of a timer
 * race per request (`Effect.timeout` forks two fibers per call). While any request is in progress,
 * the fiber wakes every {@link DEADLINE_TICK_MS} (Effect `Clock`, so `TestClock` drives it) and
 * expires the requests whose deadline has passed; while none is, it sleeps until one starts.
 */
interface Deadlines {
  readonly add: (p: Pending) => void
  readonly remove: (p: Pending) => void
}

/** Granularity of request deadlines: a request times out at most this much after its deadline. */
export const DEADLINE_TICK_MS = 20

const makeDeadlines: Effect.Effect<Deadlines, never, Scope.Scope> = Effect.gen(function*() {
  const pending = new Set<Pending>()
  const wake = yield* Queue.sliding<void>(1)
  const tick = Effect.gen(function*() {
    if (pending.size === 0) {
      yield* Queue.take(wake)
      return
    }
    yield* Effect.sleep(Duration.millis(DEADLINE_TICK_MS))
    const now = yield* Clock.currentTimeMillis
    for (const p of pending) {
      if (now >= p.deadline || (p.connectDeadline !== undefined && now >= p.connectDeadline)) p.expire(now)
    }
  })
  yield* Effect.forkScoped(Effect.forever(tick))
  return {
    add: (p) => {
      pending.add(p)
      if (pending.size === 1) Queue.unsafeOffer(wake, undefined)
    },
    remove: (p) => {
      pending.delete(p)
    }
  }
})

/**
 * Tries the validated addresses in order (SPEC §4.6) inside one deadline. The connect phase of every
 * address but the last gets an equal share of the time left, so one black-holed address cannot use
 * up the whole deadline; a reused keep-alive socket the server had closed is retried once.
 *
 * One `Effect.async` for the whole exchange: no fibers, no Deferreds. Interruption destroys the
 * request in progress.
 */
const exchangeAll = (
  deadlines: Deadlines,
  clock: Clock.Clock,
  addresses: ReadonlyArray<{ readonly address: string; readonly family: 4 | 6 }>,
  base: Omit<ExchangeSpec, "address" | "family">,
  deadline: number
): Effect.Effect<SafeResponse, SafeHttpError> =>
  Effect.async<SafeResponse, SafeHttpError>((resume) => {
    let index = 0
    let staleRetried = false
    let lastKind: SafeHttpErrorKind = "network"
    let current: Exchange | undefined
    /** bumped per exchange, so a late hook of an abandoned exchange is ignored */
    let generation = 0
    let done = false

    const finish = (result: Effect.Effect<SafeResponse, SafeHttpError>): void => {
      if (done) return
      done = true
      deadlines.remove(entry)
      const ex = current
      current = undefined
      ex?.release()
      resume(result)
    }
    const failKind = (kind: SafeHttpErrorKind): void => finish(Effect.fail(new SafeHttpError({ kind })))

    /** The current exchange failed before it was connected (or its connect budget ran out). */
    const nextAddress = (kind: "network" | "timeout"): void => {
      lastKind = kind
      const ex = current
      current = undefined
      ex?.release()
      index++
      start()
    }

    const start = (): void => {
      if (done) return
      const target = addresses[index]
      if (target === undefined) return failKind(lastKind)
      const remaining = addresses.length - index
      const now = clock.unsafeCurrentTimeMillis()
      if (now >= deadline) return failKind("timeout")
      entry.connectDeadline = remaining > 1 ? now + Math.max(0, Math.floor((deadline - now) / remaining)) : undefined
      const gen = ++generation
      const spec: ExchangeSpec = { ...base, address: target.address, family: target.family }
      const ex = startExchange(spec, {
        connected: () => {
          if (gen === generation) entry.connectDeadline = undefined
        },
        settle: (outcome) => {
          if (gen !== generation || done) return
          if (outcome._tag === "Ok") return finish(Effect.succeed(outcome.response))
          const failure = outcome.failure
          switch (failure._tag) {
            case "ConnectFailed":
              return nextAddress(failure.kind)
            case "Stale": {
              if (staleRetried) return failKind("network")
              staleRetried = true
              const old = current
              current = undefined
              old?.release()
              return start()
            }
            case "Final":
              return failKind(failure.kind)
          }
        }
      })
      // the hooks may have run synchronously (and moved on); only keep a live exchange
      if (gen === generation && !done) current = ex
      else ex.release()
    }

    const entry: Pending = {
      deadline,
      connectDeadline: undefined,
      expire: (now) => {
        if (done) return
        if (now >= deadline) return failKind("timeout")
        // the connect budget of this address ran out: next address
        generation++
        nextAddress("timeout")
      }
    }
    deadlines.add(entry)
    start()
    return Effect.sync(() => {
      if (done) return
      done = true
      deadlines.remove(entry)
      generation++
      const ex = current
      current = undefined
      ex?.release()
    })
  })

const clampInt = (n: number, min: number, max: number, def: number): number =>
  Number.isFinite(n) ? Math.min(Math.max(Math.floor(n), min), max) : def

const makeAgents = (options: SafeHttpOptions): Agents => {
  const maxSockets = clampInt(
    options.maxSocketsPerHost ?? DEFAULT_MAX_SOCKETS_PER_HOST,
    1,
    MAX_SOCKETS_PER_HOST_LIMIT,
    DEFAULT_MAX_SOCKETS_PER_HOST
  )
  const common = {
    keepAlive: true,
    keepAliveMsecs: 1_000,
    maxSockets,
    maxFreeSockets: maxSockets,
    scheduling: "lifo" as const,
    // applies to idle (pooled) sockets: Node destroys a free socket on timeout; an in-use socket only
    // emits 'timeout', which nothing here listens to (the request deadline is enforced by Effect)
    timeout: IDLE_SOCKET_TIMEOUT_MS
  }
  const ca = options.tls?.ca
  return {
    http: new Http.Agent(common),
    https: new Https.Agent({
      ...common,
      // explicit, so NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment cannot turn verification off
      rejectUnauthorized: true,
      ...(ca !== undefined ? { ca } : {})
    })
  }
}

type Address = { readonly address: string; readonly family: 4 | 6 }

/** Builds the transport over a resolver, a pair of agents and the deadline ticker. */
const makeWith = (
  resolver: ResolverShape,
  agents: Agents,
  deadlines: Deadlines,
  clock: Clock.Clock,
  options: SafeHttpOptions
): SafeHttpShape => {
  const policy = { allowInsecureDev: options.allowInsecureDev, allowCidrs: options.allowCidrs }
  const addressPolicy = { ...policy, loopbackOnly: false }

  /** The validated addresses of a name's DNS answers (every answer must pass). */
  const validateAnswers = (
    target: Target,
    answers: ReadonlyArray<ResolvedAddress>
  ): Either.Either<ReadonlyArray<Address>, SafeHttpErrorKind> => {
    if (answers.length === 0) return Either.left("dns")
    const addresses: Array<Address> = []
    const seen = new Set<string>()
    for (const answer of answers) {
      const bytes = allowedAddress(answer.address, addressPolicy)
      if (bytes === undefined) return Either.left("blocked_target")
      // an http: name (development mode) resolving anywhere but loopback breaks the scheme rule
      if (target.loopbackOnly && !isLoopbackBytes(bytes)) return Either.left("invalid_target")
      const address = formatAddress(bytes)
      if (seen.has(address)) continue
      seen.add(address)
      if (addresses.length < MAX_CONNECT_ADDRESSES) addresses.push({ address, family: bytes.length === 4 ? 4 : 6 })
    }
    return Either.right(addresses)
  }

  // planTarget is pure and the policy is fixed: plans are memoised per URL (a bounded map, emptied
  // when full), so a busy receiver's URL is not parsed and validated again on every request
  const plans = new Map<string, Either.Either<Target, "invalid_target" | "blocked_target">>()
  const plan = (url: string) => {
    const known = plans.get(url)
    if (known !== undefined) return known
    const planned = planTarget(url, policy)
    if (plans.size >= PLAN_CACHE_MAX) plans.clear()
    plans.set(url, planned)
    return planned
  }

  const send = (req: SafeRequest, timeoutMs: number): Effect.Effect<SafeResponse, SafeHttpError> => {
    const planned = plan(req.url)
    if (Either.isLeft(planned)) return fail(planned.left)
    const target = planned.right

    const maxRequestBytes = clampInt(req.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES, 0, Number.MAX_SAFE_INTEGER, DEFAULT_MAX_REQUEST_BYTES)
    // The body stays a string: node:http then writes the head and the body in ONE write (a Buffer
    // body costs a copy here and a two-buffer writev there). Its UTF-8 length is measured without
    // encoding it; Node encodes it exactly so (lone surrogates as U+FFFD, like Buffer.from).
    const body = req.body
    const contentLength = body !== undefined
      ? Buffer.byteLength(body, "utf8")
      : req.method === "POST" ? 0 : undefined
    if (contentLength !== undefined && contentLength > maxRequestBytes) return fail("request_too_large")
    const headers = buildHeaders(req.headers, target.hostHeader, contentLength)
    if (Either.isLeft(headers)) return fail(headers.left)
    const base: Omit<ExchangeSpec, "address" | "family"> = {
      agents,
      target,
      method: req.method,
      headers: headers.right,
      body,
      maxResponseBytes: clampInt(req.maxResponseBytes, 0, Number.MAX_SAFE_INTEGER, 0),
      truncate: req.onResponseOverflow === "truncate"
    }

    // `send` runs when the request effect runs (inside `request`'s suspend): the deadline starts now
    const deadline = clock.unsafeCurrentTimeMillis() + timeoutMs
    if (target.literal !== undefined) {
      const literal = target.literal
      return exchangeAll(deadlines, clock, [{ address: formatAddress(literal), family: literal.length === 4 ? 4 : 6 }], base, deadline)
    }
    // a name: resolved ONCE, within the same deadline
    return resolver.lookup(target.hostname).pipe(
      Effect.mapError(() => new SafeHttpError({ kind: "dns" })),
      Effect.timeoutFail({
        duration: Duration.millis(timeoutMs),
        onTimeout: () => new SafeHttpError({ kind: "timeout" })
      }),
      Effect.flatMap((answers) => {
        const addresses = validateAnswers(target, answers)
        if (Either.isLeft(addresses)) return fail(addresses.left)
        return exchangeAll(deadlines, clock, addresses.right, base, deadline)
      })
    )
  }

  // Decision: no span of its own. A span costs about as much CPU as the rest of the transport's
  // Effect work per request; every caller runs it inside its own span (`Delivery.attempt`,
  // `Identity.fetch`, …), which covers the request.
  const request = (req: SafeRequest): Effect.Effect<SafeResponse, SafeHttpError> =>
    Effect.suspend(() => {
      const timeoutMs = clampInt(req.timeoutMs, 0, MAX_TIMEOUT_MS, 0)
      if (timeoutMs <= 0) return fail("timeout")
      return send(req, timeoutMs)
    })

  return { request }
}

/**
 * The SSRF-safe HTTP transport. See the module documentation.
 *
 * @since 0.1.0
 */
export class SafeHttp extends Context.Tag("firehook/SafeHttp")<SafeHttp, SafeHttpShape>() {
  /**
   * The transport, with keep-alive agents owned by the layer's scope (destroyed when it closes).
   * Requires a {@link Resolver}.
   */
  static readonly layer = (options: SafeHttpOptions): Layer.Layer<SafeHttp, never, Resolver> =>
    Layer.scoped(
      this,
      Effect.gen(function*() {
        const resolver = yield* Resolver
        const agents = yield* Effect.acquireRelease(
          Effect.sync(() => makeAgents(options)),
          (a) =>
            Effect.sync(() => {
              a.http.destroy()
              a.https.destroy()
            })
        )
        const deadlines = yield* makeDeadlines
        // the layer's clock (a TestClock in tests), read directly on every request
        const clock = yield* Effect.clock
        return makeWith(resolver, agents, deadlines, clock, options)
      })
    )

  /** {@link SafeHttp.layer} with the system resolver. */
  static readonly layerDefault = (options: SafeHttpOptions): Layer.Layer<SafeHttp> =>
    SafeHttp.layer(options).pipe(Layer.provide(Resolver.layer))
}
