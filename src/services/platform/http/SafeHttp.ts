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
 *    the response body are read; more is `response_too_large`, or, with `onResponseOverflow:
 *    "truncate"` (deliveries), the response as read so far with the rest cancelled.
 *
 * Errors are generic ({@link SafeHttpError}): a kind, nothing else. They never carry the URL, the
 * host name, DNS answers, addresses, headers or an underlying error (whose message would).
 *
 * @since 0.1.0
 */
import { type Clock, Context, Duration, Effect, Either, Layer } from "effect"
import type { Cidr } from "../../../schemas/Net.js"
import { MAX_WEBHOOK_URL_LENGTH } from "../../../schemas/WebhookUrl.js"
import { type Agents, makeAgents } from "./Agents.js"
import { deadlineNow, type Deadlines, makeDeadlines } from "./Deadlines.js"
import { fail, SafeHttpError } from "./Errors.js"
import { exchangeAll, type ExchangeSpec } from "./Exchange.js"
import { buildHeaders } from "./Headers.js"
import { clampInt, DEFAULT_MAX_REQUEST_BYTES, MAX_SERVICE_URL_LENGTH, MAX_TIMEOUT_MS } from "./Limits.js"
import { formatAddress, Resolver, type ResolverShape, validateAnswers } from "./Resolver.js"
import { makePlanner } from "./TargetPlan.js"

export { DEADLINE_TICK_MS } from "./Deadlines.js"
export { SafeHttpError, type SafeHttpErrorKind, safeHttpErrorKinds } from "./Errors.js"
export {
  DEFAULT_MAX_REQUEST_BYTES,
  DEFAULT_MAX_SOCKETS_PER_HOST,
  IDLE_SOCKET_TIMEOUT_MS,
  MAX_ALLOW_CIDRS,
  MAX_CONNECT_ADDRESSES,
  MAX_REQUEST_HEADER_BYTES,
  MAX_SERVICE_URL_LENGTH,
  MAX_SOCKETS_PER_HOST_LIMIT,
  MAX_TIMEOUT_MS,
  PLAN_CACHE_MAX
} from "./Limits.js"
export {
  type AddressPolicy,
  allowedAddress,
  parseAllowCidrs,
  type ResolvedAddress,
  ResolveError,
  Resolver,
  type ResolverShape
} from "./Resolver.js"
export { planTarget, type Target } from "./TargetPlan.js"

// ---------------------------------------------------------------------------------------------
// The service

export interface SafeRequest {
  readonly url: string
  readonly method: "GET" | "POST"
  /** Caller headers. `Host`, `Content-Length` and hop-by-hop headers are set by the transport. */
  readonly headers: Readonly<Record<string, string>>
  /** Sent as UTF-8, byte for byte. */
  readonly body?: string | undefined
  /**
   * Overall deadline: resolve + connect + request + response + body; at most
   * {@link MAX_TIMEOUT_MS} (`Infinity` is that bound); NaN, 0 and below fail at once as `timeout`.
   */
  readonly timeoutMs: number
  /** Response body bytes to read at most. */
  readonly maxResponseBytes: number
  /** Request body bound (default {@link DEFAULT_MAX_REQUEST_BYTES}). */
  readonly maxRequestBytes?: number | undefined
  /**
   * Longest URL accepted: default a webhook URL's 2,048 characters (SPEC §1); at most
   * {@link MAX_SERVICE_URL_LENGTH}, which PDS, PLC and relay calls use (their query carries a DID
   * and a cursor of up to 2,048 characters, SPEC §5.3).
   */
  readonly maxUrlLength?: number | undefined
  /**
   * What a response body larger than `maxResponseBytes` is: `"fail"` (default; for callers that
   * need the whole body: DID documents, PDS calls) → `response_too_large`; `"truncate"` (webhook
   * deliveries: SPEC §4.3, §4.5, the status alone classifies a response) → the response with the
   * body read so far and `truncated: true`, the rest cancelled (the connection is closed). With
   * `"truncate"`, once the response head has arrived, a body that breaks off (reset, error) or
   * outlasts the deadline also ends the read with `truncated: true` instead of failing.
   */
  readonly onResponseOverflow?: "fail" | "truncate" | undefined
  /**
   * With `"truncate"`: body bytes kept and returned, the first ones (default and at most
   * `maxResponseBytes`). The bytes after them, up to `maxResponseBytes`, are read and dropped, so a
   * body that ends within the cap still ends cleanly (and its keep-alive connection is reused).
   */
  readonly keepResponseBytes?: number | undefined
}

export interface SafeResponse {
  readonly status: number
  /** Lowercased names; repeated headers joined with `, `. */
  readonly headers: Readonly<Record<string, string>>
  readonly body: Uint8Array
  /**
   * true only with `onResponseOverflow: "truncate"`, when `body` is not the whole response body:
   * more than `maxResponseBytes` arrived, more than `keepResponseBytes` were kept, or the body
   * broke off after the head.
   */
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
  const plan = makePlanner(policy)

  const send = (req: SafeRequest, timeoutMs: number): Effect.Effect<SafeResponse, SafeHttpError> => {
    const planned = plan(
      req.url,
      clampInt(req.maxUrlLength ?? MAX_WEBHOOK_URL_LENGTH, 1, MAX_SERVICE_URL_LENGTH, MAX_WEBHOOK_URL_LENGTH)
    )
    if (Either.isLeft(planned)) return fail(planned.left)
    const target = planned.right

    const maxRequestBytes = clampInt(
      req.maxRequestBytes ?? DEFAULT_MAX_REQUEST_BYTES,
      0,
      Number.MAX_SAFE_INTEGER,
      DEFAULT_MAX_REQUEST_BYTES
    )
    // The body stays a string: node:http then writes the head and the body in ONE write (a Buffer
    // body costs a copy here and a two-buffer writev there). Its UTF-8 length is measured without
    // encoding it; Node encodes it exactly so (lone surrogates as U+FFFD, like Buffer.from).
    const body = req.body
    const contentLength = body !== undefined
      ? Buffer.byteLength(body, "utf8")
      : req.method === "POST"
      ? 0
      : undefined
    if (contentLength !== undefined && contentLength > maxRequestBytes) return fail("request_too_large")
    const headers = buildHeaders(req.headers, target.hostHeader, contentLength)
    if (Either.isLeft(headers)) return fail(headers.left)
    const maxResponseBytes = clampInt(req.maxResponseBytes, 0, Number.MAX_SAFE_INTEGER, 0)
    const base: Omit<ExchangeSpec, "address" | "family"> = {
      agents,
      target,
      method: req.method,
      headers: headers.right,
      body,
      maxResponseBytes,
      truncate: req.onResponseOverflow === "truncate",
      keepResponseBytes: clampInt(req.keepResponseBytes ?? maxResponseBytes, 0, maxResponseBytes, maxResponseBytes)
    }

    // `send` runs when the request effect runs (inside `request`'s suspend): the deadline starts now
    const deadline = deadlineNow(clock) + timeoutMs
    if (target.literal !== undefined) {
      const literal = target.literal
      return exchangeAll(
        deadlines,
        clock,
        [{ address: formatAddress(literal), family: literal.length === 4 ? 4 : 6 }],
        base,
        deadline
      )
    }
    // a name: resolved ONCE, within the same deadline
    return resolver.lookup(target.hostname).pipe(
      Effect.mapError(() => new SafeHttpError({ kind: "dns" })),
      Effect.timeoutFail({
        duration: Duration.millis(timeoutMs),
        onTimeout: () => new SafeHttpError({ kind: "timeout" })
      }),
      Effect.flatMap((answers) => {
        const addresses = validateAnswers(answers, addressPolicy, target.loopbackOnly)
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
      // +Infinity is the longest deadline ({@link MAX_TIMEOUT_MS}); NaN, 0 and below fail at once
      const timeoutMs = req.timeoutMs === Number.POSITIVE_INFINITY
        ? MAX_TIMEOUT_MS
        : clampInt(req.timeoutMs, 0, MAX_TIMEOUT_MS, 0)
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

/** {@link SafeHttp.layer}, at module level. */
export const layer: (options: SafeHttpOptions) => Layer.Layer<SafeHttp, never, Resolver> = SafeHttp.layer

/** {@link SafeHttp.layerDefault}, at module level. */
export const layerDefault: (options: SafeHttpOptions) => Layer.Layer<SafeHttp> = SafeHttp.layerDefault

/** {@link Resolver.layer} (the system resolver), at module level. */
export const layerSystemResolver: Layer.Layer<Resolver> = Resolver.layer
