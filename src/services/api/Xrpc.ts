/**
 * The owners' API request pipeline (SPEC §8.1–8.3), the one place every call goes through:
 *
 *   route → configured? → method/verb → failed-auth limit (client address) → auth (signature →
 *   per-caller limits → replay claim) → parameters → body → decode → handler → encode → error mapping
 *
 * - Routes: `/xrpc/<nsid>` and `GET /.well-known/did.json` (only when the service DID is the
 *   did:web of `PUBLIC_URL`); anything else 404. Unknown methods 501 `MethodNotImplemented`; a
 *   query or subscription needs GET, a procedure POST (else 405).
 * - Not configured (no service DID): every `/xrpc/` call is 503 `NotConfigured`.
 * - Authentication comes first (SPEC §8.2: "before anything else is read"): a refused token is a
 *   401 before the query string is decoded or one byte of the body is read, and no handler runs.
 *   A client address with 30 failed authentications in the last minute is refused (429) before
 *   its token is even looked at; each verification holds one of those 30 while it runs (given
 *   back when the token is accepted), so concurrent calls cannot exceed the limit.
 * - Per caller DID: 120 calls/min, and per method the extra limits of {@link METHOD_RATES};
 *   refused → 429 with `Retry-After`. They are taken inside the verification, once the signature
 *   has verified and before the token's `(iss, jti)` is claimed in the replay stores (a refused
 *   call takes no replay entry), and given back when the claim does not accept the token.
 * - Procedure bodies: `Content-Type: application/json`, at most 64 KiB (a larger
 *   `Content-Length` is refused unread; a body without one is read up to the bound), UTF-8 JSON.
 *   Bad input → 400 `InvalidRequest`.
 * - A 10 s deadline covers a call from authentication to its encoded response (a subscription's
 *   up to its upgrade): 504 `UpstreamTimeout`.
 * - Every error is `{error, message}`; a defect is a 500 with a fixed message (and a log line
 *   naming the method, never a value); a call interrupted by a shutdown ends interrupted and is
 *   answered 503 `ServiceUnavailable` ("the service is stopping; retry").
 */
import * as HttpApp from "@effect/platform/HttpApp"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Cause, Chunk, Clock, Duration, Effect, Either, Metric, Schema, Stream } from "effect"
import type { Scope } from "effect"
import type { RawParams } from "../../schemas/XrpcContract.js"
import { labelledCounterFamily } from "../platform/Metrics.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { addressKey, clientAddress } from "./ClientAddress.js"
import type { ApiMethod } from "./Methods.js"
import { type Buckets, type Decision, retryAfterSeconds, takeAll } from "./RateLimiter.js"
import type { ServiceAuthShape } from "./ServiceAuth.js"
import {
  internal,
  invalidRequest,
  methodNotImplemented,
  notConfigured,
  rateLimited,
  wrongVerb,
  XrpcFailure
} from "./XrpcError.js"

/** SPEC §8.3: procedure bodies at most 64 KiB. */
export const MAX_BODY_BYTES = 64 * 1024
/** SPEC §8.3: a 10 s deadline per call. */
export const CALL_DEADLINE = Duration.seconds(10)
/** Query strings longer than this are refused unread. */
export const MAX_QUERY_LENGTH = 8192
export const MAX_PARAMS = 64
/** A body over the bound is read and dropped up to this many more bytes (then the connection is cut). */
export const DRAIN_MAX_BYTES = 1024 * 1024

/** Counts for health (SPEC §8.1): monotonic, counts only. */
export interface ApiCounters {
  calls: number
  authFailures: number
  rateLimited: number
}

export interface Limiters {
  /** failed authentications per client address */
  readonly failedAuth: Buckets
  /** calls per caller DID */
  readonly calls: Buckets
  /** extra limits per caller DID of single methods, by NSID */
  readonly methods: ReadonlyMap<string, Buckets>
}

export interface PipelineDeps<R> {
  readonly methods: ReadonlyMap<string, ApiMethod<R>>
  /** undefined: the API is not configured */
  readonly auth: ServiceAuthShape | undefined
  readonly trustProxy: boolean
  /** what `/.well-known/did.json` serves (undefined: 404) */
  readonly didDocument: unknown
  readonly limiters: Limiters
  readonly counters: ApiCounters
  /** recurring warnings (a store or an identity that cannot answer fails every call): once a minute per kind */
  readonly log: RateLimitedLog.RateLimitedLog
  readonly deadline: Duration.Duration
  readonly maxBodyBytes: number
}

const apiCalls = labelledCounterFamily("firehook_api_calls_total", {
  description: "Owners' API calls, by method (unknown for any other path under /xrpc/) and HTTP status"
})

const NO_STORE = { "cache-control": "no-store" } as const

/** The response of a failure: `{error, message}`, with `Retry-After` (429) or a Bearer challenge (401). */
export const failureResponse = (f: XrpcFailure): HttpServerResponse.HttpServerResponse => {
  const headers: Record<string, string> = { ...NO_STORE }
  if (f.retryAfter !== undefined) headers["retry-after"] = String(f.retryAfter)
  if (f.status === 401) headers["www-authenticate"] = `Bearer error="${f.error}"`
  if (f.allow !== undefined) headers["allow"] = f.allow
  return HttpServerResponse.unsafeJson({ error: f.error, message: f.message }, { status: f.status, headers })
}

const AUTH_MESSAGES: { readonly [error: string]: string } = {
  AuthenticationRequired: "a service token is required (Authorization: Bearer …)",
  InvalidToken: "the service token is not valid for this call",
  BadJwtSignature: "the service token's signature could not be verified",
  ExpiredToken: "the service token has expired"
}

/** The query parameters of a URL (repeated names become arrays), or a failure when unbounded. */
export const queryParams = (url: string): Either.Either<RawParams, XrpcFailure> => {
  const q = url.indexOf("?")
  if (q < 0) return Either.right({})
  const query = url.slice(q + 1)
  if (query.length > MAX_QUERY_LENGTH) return Either.left(invalidRequest("the query string is too long"))
  const out: { [k: string]: string | Array<string> } = {}
  let n = 0
  for (const [k, v] of new URLSearchParams(query)) {
    if (++n > MAX_PARAMS) return Either.left(invalidRequest("too many parameters"))
    const prev = out[k]
    out[k] = prev === undefined ? v : Array.isArray(prev) ? [...prev, v] : [prev, v]
  }
  return Either.right(out)
}

const isJson = (contentType: string | undefined): boolean =>
  contentType !== undefined && (contentType.split(";")[0] ?? "").trim().toLowerCase() === "application/json"

const JsonText = Schema.parseJson()

/** A procedure's JSON body, at most `max` bytes, read only after the call is authorized. */
const readJsonBody = (request: HttpServerRequest.HttpServerRequest, max: number) =>
  Effect.gen(function*() {
    if (!isJson(request.headers["content-type"])) {
      return yield* Effect.fail(invalidRequest("the body must be application/json"))
    }
    const length = request.headers["content-length"]
    if (length !== undefined && (!/^\d{1,15}$/.test(length) || Number(length) > max)) {
      return yield* Effect.fail(invalidRequest(`the body must be at most ${max} bytes`))
    }
    // Past the bound the rest is read and dropped (up to DRAIN_MAX_BYTES), so that the client gets
    // its 400: stopping the stream early would close the connection before the answer is written.
    const chunks = yield* request.stream.pipe(
      Stream.mapError(() => invalidRequest("the body could not be read")),
      Stream.runFoldEffect({ size: 0, chunks: Chunk.empty<Uint8Array>() }, (acc, chunk) => {
        const size = acc.size + chunk.length
        if (size > max + DRAIN_MAX_BYTES) return Effect.fail(invalidRequest(`the body must be at most ${max} bytes`))
        return Effect.succeed({
          size,
          chunks: size > max ? Chunk.empty<Uint8Array>() : Chunk.append(acc.chunks, chunk)
        })
      })
    )
    if (chunks.size > max) return yield* Effect.fail(invalidRequest(`the body must be at most ${max} bytes`))
    const bytes = new Uint8Array(chunks.size)
    let offset = 0
    for (const c of chunks.chunks) {
      bytes.set(c, offset)
      offset += c.length
    }
    const text = Either.try(() => new TextDecoder("utf-8", { fatal: true }).decode(bytes))
    if (Either.isLeft(text)) return yield* Effect.fail(invalidRequest("the body is not UTF-8"))
    return yield* Schema.decodeUnknown(JsonText)(text.right).pipe(
      Effect.mapError(() => invalidRequest("the body is not JSON"))
    )
  })

const refused = (d: Decision, counters: ApiCounters): XrpcFailure => {
  counters.rateLimited++
  return rateLimited(retryAfterSeconds(d.retryAfterMs))
}

/** One authorized, decoded call of `m`, for the verified caller. */
const authorize = <R>(
  deps: PipelineDeps<R>,
  auth: ServiceAuthShape,
  m: ApiMethod<R>,
  request: HttpServerRequest.HttpServerRequest,
  address: string
) =>
  Effect.gen(function*() {
    const nsid = m.contract.nsid
    const perMethod = deps.limiters.methods.get(nsid)
    const limits = (did: string): ReadonlyArray<readonly [Buckets, string]> =>
      perMethod === undefined
        ? [[deps.limiters.calls, did]]
        : [[deps.limiters.calls, did], [perMethod, did]]
    let limited = false
    // The caller's limits (120/min, the method's own) are taken once the token's signature has
    // verified and before its (iss, jti) is claimed: a call they refuse takes no replay entry (which
    // would live until the token expires, so one DID over its limit could fill the replay cache).
    // Refused, the token is genuine: the address's reservation is given back. Taken, they are given
    // back if the claim does not accept the token (a replay, an expired or unrecordable token).
    const callerLimits = (did: string) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        limited = true
        const decision = takeAll(limits(did), now)
        if (!decision.allowed) {
          deps.limiters.failedAuth.give(address, now)
          return Effect.fail(refused(decision, deps.counters))
        }
        return Effect.succeed(Effect.flatMap(Clock.currentTimeMillis, (later) =>
          Effect.sync(() => {
            for (const [b, key] of limits(did)) b.give(key, later)
          })))
      })
    const verified = yield* auth.verify(request.headers["authorization"], nsid, callerLimits).pipe(
      Effect.catchTags({
        AuthFailure: (e) =>
          Effect.gen(function*() {
            // the address's failed authentication was taken (reserved) before the verification began
            deps.counters.authFailures++
            yield* Effect.logDebug("api: authentication refused").pipe(
              Effect.annotateLogs({ nsid, error: e.error, reason: e.reason })
            )
            return yield* Effect.fail(
              new XrpcFailure({ status: 401, error: e.error, message: AUTH_MESSAGES[e.error] ?? "unauthorized" })
            )
          }),
        AuthUnavailable: (e) =>
          // an unreachable issuer counts as a failed authentication (its reservation is kept): the
          // claims are read before any signature, so a forged token names any DID (and, with
          // did:web, any host), and without the limit each one would make firehook fetch a DID
          // document; the other reasons are not the token's, and give the reservation back
          Effect.flatMap(Clock.currentTimeMillis, (now) =>
            Effect.sync(() => {
              if (e.reason !== "identity_unavailable") deps.limiters.failedAuth.give(address, now)
            })).pipe(
              Effect.zipRight(deps.log.run(
                `auth:${e.reason}`,
                (suppressed) =>
                  Effect.logWarning("api: a token could not be verified now").pipe(
                    Effect.annotateLogs({ nsid, reason: e.reason, suppressed })
                  )
              )),
              Effect.zipRight(Effect.fail(
                e.reason === "replay_cache_full" || e.reason === "replay_store_full"
                  ? new XrpcFailure({
                    status: 503,
                    error: "NotEnoughResources",
                    message: "too many live tokens; retry"
                  })
                  : e.reason === "replay_store_unavailable"
                  ? new XrpcFailure({
                    status: 503,
                    error: "ServiceUnavailable",
                    message: "the token cannot be checked now; retry"
                  })
                  : new XrpcFailure({
                    status: 502,
                    error: "UpstreamFailure",
                    message: "the caller's identity is unreachable",
                    // over the budget of identity lookups for unverified tokens: when to retry
                    ...(e.retryAfterMs === undefined ? {} : { retryAfter: retryAfterSeconds(e.retryAfterMs) })
                  })
              ))
            )
      })
    )
    // authenticated: the reservation of a failed authentication is given back
    deps.limiters.failedAuth.give(address, yield* Clock.currentTimeMillis)
    // a verifier that never ran the hook (a test double) leaves the caller's limits to be taken now
    if (!limited) {
      const decision = takeAll(limits(verified.did), yield* Clock.currentTimeMillis)
      if (!decision.allowed) return yield* Effect.fail(refused(decision, deps.counters))
    }
    const params = yield* queryParams(request.url)
    const body = m.contract.input === undefined ? undefined : yield* readJsonBody(request, deps.maxBodyBytes)
    const prepared = yield* m.prepare(params, body)
    return { caller: verified.did, prepared }
  })

const VERB: { readonly [K in ApiMethod<never>["contract"]["kind"]]: string } = {
  query: "GET",
  procedure: "POST",
  subscription: "GET"
}

/** A call of `/xrpc/<nsid>`. */
const xrpc = <R>(deps: PipelineDeps<R>, request: HttpServerRequest.HttpServerRequest, nsid: string) =>
  Effect.gen(function*() {
    deps.counters.calls++
    const auth = deps.auth
    if (auth === undefined) {
      return yield* Effect.fail(notConfigured("this service has no service DID (SERVICE_DID / PUBLIC_URL)"))
    }
    const m = deps.methods.get(nsid)
    if (m === undefined) return yield* Effect.fail(methodNotImplemented())
    const verb = VERB[m.contract.kind]
    if (request.method !== verb) return yield* Effect.fail(wrongVerb(verb))
    const address = addressKey(
      clientAddress(request.remoteAddress, request.headers["x-forwarded-for"], deps.trustProxy)
    )
    // Every verification takes (reserves) one of the address's failed authentications before it
    // begins and gives it back once the token is accepted: so concurrent calls from one address can
    // never fail more than its limit (with a look that took nothing, 100 forged tokens sent at once
    // all passed it, and each made firehook resolve a DID), and a verification that never ends
    // (the call's deadline) counts as a failure. An address over its limit is refused before its
    // token is looked at.
    const reserved = deps.limiters.failedAuth.take(address, yield* Clock.currentTimeMillis)
    if (!reserved.allowed) return yield* Effect.fail(refused(reserved, deps.counters))
    // the platform runs a request uninterruptibly: the call itself is made interruptible, so that
    // the deadline can stop it
    const deadline = <A, E, Q>(eff: Effect.Effect<A, E, Q>) =>
      Effect.timeoutFail(Effect.interruptible(eff), {
        duration: deps.deadline,
        onTimeout: () =>
          new XrpcFailure({ status: 504, error: "UpstreamTimeout", message: "the call did not finish in time" })
      })
    if (m.contract.kind === "subscription") {
      // no deadline on the connection itself; interruptible, so that a shutdown can end it
      const call = yield* deadline(authorize(deps, auth, m, request, address))
      return yield* Effect.interruptible(call.prepared.respond(call.caller))
    }
    return yield* deadline(
      Effect.flatMap(authorize(deps, auth, m, request, address), (call) => call.prepared.respond(call.caller))
    )
  })

const notFound = HttpServerResponse.unsafeJson({ error: "NotFound", message: "not found" }, {
  status: 404,
  headers: NO_STORE
})

/** What a call interrupted by a shutdown is answered. */
export const stopping = (): XrpcFailure =>
  new XrpcFailure({ status: 503, error: "ServiceUnavailable", message: "the service is stopping; retry" })

/**
 * A call interrupted by the server (its listener closing at shutdown) ends interrupted, and the
 * platform answers it an empty-bodied 503: that answer becomes the XRPC error `{error, message}`
 * (with `Cache-Control: no-store`), as every other failure is. Only an empty 503 is replaced: the
 * app's own 503s have bodies, and a client that went away (499) is answered nothing.
 */
const stoppingAnswer: HttpApp.PreResponseHandler = (_request, response) =>
  Effect.succeed(
    response.status === 503 && response.body._tag === "Empty" ? failureResponse(stopping()) : response
  )

/** The API as an HTTP app: every request answered, never a failure (an interrupted call ends interrupted). */
export const app = <R>(
  deps: PipelineDeps<R>
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, R | HttpServerRequest.HttpServerRequest | Scope.Scope> =>
  Effect.gen(function*() {
    yield* HttpApp.appendPreResponseHandler(stoppingAnswer)
    const request = yield* HttpServerRequest.HttpServerRequest
    const q = request.url.indexOf("?")
    const path = q < 0 ? request.url : request.url.slice(0, q)
    if (path === "/.well-known/did.json" && request.method === "GET" && deps.didDocument !== undefined) {
      return HttpServerResponse.unsafeJson(deps.didDocument)
    }
    if (!path.startsWith("/xrpc/")) return notFound
    const nsid = path.slice("/xrpc/".length)
    const label = deps.methods.has(nsid) ? nsid : "unknown"
    const started = yield* Clock.currentTimeMillis
    const response = yield* xrpc(deps, request, nsid).pipe(
      Effect.catchAll((f) => Effect.succeed(failureResponse(f))),
      Effect.catchAllCause((cause) =>
        Cause.isInterruptedOnly(cause)
          ? Effect.failCause(cause)
          : Effect.logError("api: a call failed unexpectedly").pipe(
            Effect.annotateLogs({ nsid: label }),
            Effect.as(failureResponse(internal()))
          )
      )
    )
    const ms = (yield* Clock.currentTimeMillis) - started
    yield* Metric.increment(apiCalls({ method: label, status: String(response.status) }))
    yield* Effect.logDebug("api call").pipe(Effect.annotateLogs({ nsid: label, status: response.status, ms }))
    return response
  })
