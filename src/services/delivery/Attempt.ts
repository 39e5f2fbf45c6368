/**
 * One attempt (SPEC §4.2): a decision over the subscription, the secret, the destination transform
 * and the origin's circuit breaker that answers a {@link Settlement}, and the thin send that carries
 * out a `Send` (the request, then its classification, §4.3).
 *
 * The decisions ({@link screen}, {@link prepare}, {@link admit}, {@link judge}) are pure functions of
 * their inputs (the breaker is consulted by the shell). The shell ({@link attempt}) reads the
 * subscription and the secret, sends, feeds the breaker and the metrics, and marks the row as
 * settling once its settlement is known (from then on a lost lease no longer interrupts it).
 *
 * @since 0.1.0
 */
import { Clock, Effect, Either, Option } from "effect"
import type { SafeHttpError, SafeHttpErrorKind, SafeResponse } from "../platform/http/SafeHttp.js"
import { USER_AGENT } from "../platform/Version.js"
import type { CircuitBreaker } from "./CircuitBreaker.js"
import { classifyStatus, type FailureKind, parseRetryAfter } from "./Classify.js"
import {
  type ClaimedRow,
  excerpt,
  originKey,
  RESPONSE_EXCERPT_BYTES,
  type SubscriptionSnapshot
} from "./DeliveryStore.js"
import type { DeliveryInput, OutgoingRequest, Transform } from "./Destinations.js"
import { nudge } from "./Parking.js"
import { Cancel, Defer, Deliver, Fail, failure, Park, Send, type Settled, type Settlement } from "./Settlement.js"
import {
  logRecurring,
  logStoreError,
  recordAttemptDuration,
  recordFirstAttemptLatency,
  updateOpenCircuits
} from "./Telemetry.js"
import { goneKey, LEASE_MARGIN_MS, leaseTooShortToSend, type WorkerEnv } from "./WorkerState.js"

/**
 * Response bytes read at most (SPEC §4.5); the rest is cancelled, never a failure: the status alone
 * classifies a response (§4.3). Of what is read, the first `RESPONSE_EXCERPT_BYTES` are kept.
 */
export const MAX_RESPONSE_BYTES = 64 * 1024
/** Random extra delay added to deferrals, so deferred rows do not come back in one burst. */
export const DEFER_JITTER_MS = 1_000
/** Shortest deferral while an origin's circuit is open or its probe is outstanding. */
export const CIRCUIT_MIN_DEFER_MS = 1_000
/** URLs whose destination transform is memoised by one worker. */
export const TRANSFORM_CACHE_MAX = 4096

/** Transport failures that say the origin is unhealthy (they feed the circuit breaker). */
const TRANSIENT_TRANSPORT: ReadonlySet<string> = new Set<SafeHttpErrorKind>(["dns", "timeout", "network"])

/** The first key of a canonical body that has a `cid` (keys are sorted, `cid` sorts first). */
const CANONICAL_CID = /^\{"cid":"([^"\\]*)"/
/** The last key of every canonical body (`timestamp` sorts after every other top-level key). */
const CANONICAL_TIMESTAMP = /"timestamp":"([^"\\]*)"\}$/

/**
 * cid and source time from the stored canonical body (for destination transforms). The canonical
 * form (SPEC §3.5: keys sorted recursively) puts `cid` first and `timestamp` last, so both are read
 * from the ends of the body without parsing it (a body can be 512 KiB); anything else is parsed.
 */
export const eventMeta = (body: string): { readonly cid: string | undefined; readonly timestamp: string } => {
  const ts = CANONICAL_TIMESTAMP.exec(body.length > 256 ? body.slice(-256) : body)
  if (ts !== null) {
    const cid = body.startsWith("{\"cid\":") ? CANONICAL_CID.exec(body.slice(0, 256)) : null
    if (cid !== null || !body.startsWith("{\"cid\":")) return { cid: cid?.[1], timestamp: ts[1] ?? "" }
  }
  const parsed = Either.try(() => JSON.parse(body) as unknown)
  if (Either.isLeft(parsed) || typeof parsed.right !== "object" || parsed.right === null) {
    return { cid: undefined, timestamp: "" }
  }
  const cid: unknown = Reflect.get(parsed.right, "cid")
  const timestamp: unknown = Reflect.get(parsed.right, "timestamp")
  return {
    cid: typeof cid === "string" ? cid : undefined,
    timestamp: typeof timestamp === "string" ? timestamp : ""
  }
}

/**
 * The transform of a URL (presets are chosen by URL, SPEC §4.4), memoised per URL string (a bounded
 * map, emptied when full): a busy subscription's URL is not parsed on every attempt.
 */
export const memoTransforms = (resolve: (url: URL) => Transform): (url: string) => Transform | undefined => {
  const transforms = new Map<string, Transform | null>()
  return (url) => {
    const known = transforms.get(url)
    if (known !== undefined) return known ?? undefined
    const made = URL.canParse(url) ? resolve(new URL(url)) : null
    if (transforms.size >= TRANSFORM_CACHE_MAX) transforms.clear()
    transforms.set(url, made)
    return made ?? undefined
  }
}

// ---------------------------------------------------------------------------------------------
// The decisions

/** The kind (`last_error_kind`, metric reason) of a row cancelled because its subscription changed. */
export const SUBSCRIPTION_CHANGED_KIND = "subscription_changed"

/**
 * Step 1, the subscription as the attempt sees it: owner `scanning` → defer without spending an
 * attempt; missing, inactive, URL or fingerprint changed → cancel (`subscription_changed`); gone or
 * auto-disabled → park (SPEC §4.3: a dead letter `webhook_disabled`, no request); otherwise
 * undefined (go on).
 */
export const screen = (row: ClaimedRow, sub: SubscriptionSnapshot, scanningDeferMs: number): Settled | undefined => {
  if (sub.ownerStatus === "scanning") {
    return Defer({ delayMs: scanningDeferMs, jitterMs: DEFER_JITTER_MS, reason: "owner_scanning" })
  }
  if (
    !sub.exists ||
    !sub.active ||
    !sub.enabled ||
    sub.url !== row.targetUrl ||
    sub.fingerprint !== row.fingerprint
  ) {
    return Cancel({ reason: SUBSCRIPTION_CHANGED_KIND })
  }
  if (sub.gone || sub.autoDisabled) return Park()
  return undefined
}

/**
 * Steps 2 and 3, the secret and the destination transform: a subscription that signs but has no
 * secret → fail (`secret_unavailable`, never sent unsigned); no transform for the URL →
 * `invalid_target`; the transform fails → `transform_failed`; it answers `null` → delivered without
 * a request (`skipped`); otherwise `Send` its request.
 */
export const prepare = (
  row: ClaimedRow,
  body: string,
  sub: SubscriptionSnapshot,
  secret: string | undefined,
  transformFor: (url: string) => Transform | undefined,
  startedAtMs: number,
  nowMs: number
): Settlement => {
  const durationMs = Math.max(0, nowMs - startedAtMs)
  if (sub.signingMode !== "none" && secret === undefined) return failure("secret_unavailable", startedAtMs, durationMs)
  const transform = transformFor(sub.url)
  if (transform === undefined) return failure("invalid_target", startedAtMs, durationMs)
  const meta = eventMeta(body)
  const input: DeliveryInput = {
    deliveryId: row.deliveryId,
    eventId: row.eventId,
    body,
    event: {
      did: row.eventDid,
      collection: row.eventCollection,
      rkey: row.eventRkey,
      operation: row.eventOperation,
      ...(meta.cid === undefined ? {} : { cid: meta.cid }),
      timestamp: meta.timestamp
    },
    subscription: { ownerDid: row.ownerDid, rkey: row.webhookRkey, url: sub.url, match: row.matchKind },
    secret,
    timestampSeconds: Math.floor(startedAtMs / 1000),
    userAgent: USER_AGENT
  }
  const outgoing = transform(input)
  if (Either.isLeft(outgoing)) return failure("transform_failed", startedAtMs, durationMs)
  const request = outgoing.right
  if (request === null) {
    return Deliver({
      httpStatus: undefined,
      attempt: {
        startedAtMs,
        durationMs,
        outcome: "skipped",
        errorKind: undefined,
        httpStatus: undefined,
        responseExcerpt: undefined
      }
    })
  }
  return Send({ request, origin: originKey(request.url) })
}

/**
 * Step 4, the origin's circuit breaker: open → defer without an attempt until it may close
 * (at least {@link CIRCUIT_MIN_DEFER_MS}, plus jitter); otherwise undefined (send; half-open: this
 * is the probe).
 */
export const admit = (
  admission: "closed" | "probe" | "open",
  openUntilMs: number,
  startedAtMs: number
): Settled | undefined =>
  admission === "open"
    ? Defer({
      delayMs: Math.max(CIRCUIT_MIN_DEFER_MS, openUntilMs - startedAtMs),
      jitterMs: DEFER_JITTER_MS,
      reason: "circuit_open"
    })
    : undefined

/**
 * Step 5, classification (§4.3) of what the request answered: delivered when the destination
 * accepts the status (default 2xx), else a failure of its kind (a 2xx that a custom destination
 * does not accept is `http_4xx`: permanent, retrying would only duplicate); 5xx and 429 carry their
 * `Retry-After`.
 */
export const judge = (
  response: Either.Either<SafeResponse, SafeHttpError>,
  request: OutgoingRequest,
  startedAtMs: number,
  sendEnd: number
): Settled => {
  const durationMs = Math.max(0, sendEnd - startedAtMs)
  if (Either.isLeft(response)) return failure(response.left.kind, startedAtMs, durationMs)
  const res = response.right
  const text = res.body.length > 0 ? excerpt(res.body) : undefined
  const isSuccess = request.isSuccess ?? ((s: number) => s >= 200 && s <= 299)
  if (Either.getOrElse(Either.try(() => isSuccess(res.status)), () => false)) {
    return Deliver({
      httpStatus: res.status,
      attempt: {
        startedAtMs,
        durationMs,
        outcome: "delivered",
        errorKind: undefined,
        httpStatus: res.status,
        responseExcerpt: text
      }
    })
  }
  const cls = classifyStatus(res.status)
  const kind: FailureKind = cls.outcome === "failed" ? cls.kind : "http_4xx"
  const retryAfterMs = kind === "http_5xx" || kind === "http_429"
    ? parseRetryAfter(res.headers["retry-after"], sendEnd)
    : undefined
  return Fail({ kind, httpStatus: res.status, retryAfterMs, startedAtMs, durationMs, responseExcerpt: text })
}

/**
 * What a sent attempt tells the origin's breaker: a transient failure (dns, timeout, network, 5xx,
 * 429), a sign of health (any other answer), or nothing (the request did not reach the origin).
 */
const report = (breaker: CircuitBreaker, origin: string, s: Settled, sendEnd: number): void => {
  if (s._tag !== "Fail") {
    breaker.onSuccess(origin)
  } else if (s.httpStatus !== undefined) {
    if (s.kind === "http_5xx" || s.kind === "http_429") breaker.onTransientFailure(origin, sendEnd)
    else breaker.onSuccess(origin)
  } else if (TRANSIENT_TRANSPORT.has(s.kind)) {
    breaker.onTransientFailure(origin, sendEnd)
  }
}

// ---------------------------------------------------------------------------------------------
// The shell

/**
 * The send: carries out a `Send` through the SSRF-safe transport, bounded by the timeout and
 * {@link MAX_RESPONSE_BYTES}. A larger body is truncated (`onResponseOverflow: "truncate"`), and
 * only the excerpt's bytes are kept.
 */
export const send = (
  env: WorkerEnv,
  request: OutgoingRequest
): Effect.Effect<Either.Either<SafeResponse, SafeHttpError>> =>
  Effect.either(
    env.http.request({
      url: request.url,
      method: request.method,
      headers: request.headers,
      body: request.body,
      timeoutMs: env.timeoutMs,
      maxResponseBytes: MAX_RESPONSE_BYTES,
      onResponseOverflow: "truncate",
      keepResponseBytes: RESPONSE_EXCERPT_BYTES
    })
  )

/**
 * The row's entry as the attempt sees it: `settling` is set once the attempt has its outcome;
 * `renewedAt` (monotonic ms) is the last renewal of its lease, checked just before the request.
 */
export interface AttemptGuard {
  settling: boolean
  readonly renewedAt?: number
}

/** One attempt, in a `Delivery.attempt` span when a tracer is installed. */
export const attempt = (env: WorkerEnv, row: ClaimedRow, claimedAtMs: number, guard: AttemptGuard) =>
  env.traced
    ? Effect.withSpan(attemptBody(env, row, claimedAtMs, guard), "Delivery.attempt", { captureStackTrace: false })
    : attemptBody(env, row, claimedAtMs, guard)

/** An unexpected defect in the attempt spends an attempt (`internal`), so a bug cannot loop forever. */
export const attemptSafe = (
  env: WorkerEnv,
  row: ClaimedRow,
  claimedAtMs: number,
  guard: AttemptGuard
): Effect.Effect<Settled> =>
  attempt(env, row, claimedAtMs, guard).pipe(
    Effect.catchAllDefect(() =>
      Effect.gen(function*() {
        yield* logRecurring(env, "defect", "delivery attempt failed unexpectedly", { deliveryId: row.deliveryId })
        guard.settling = true
        const now = yield* Clock.currentTimeMillis
        return failure("internal", now, 0)
      })
    )
  )

const attemptBody = (env: WorkerEnv, row: ClaimedRow, claimedAtMs: number, guard: AttemptGuard) =>
  Effect.gen(function*() {
    const clock = env.clock
    const startedAtMs = clock.unsafeCurrentTimeMillis()

    // 1. the current subscription, read by a query that starts after this attempt did (shared
    //    with the attempts starting at the same time); the claim statement's copy only when the
    //    options allow trusting it for a while
    let sub: SubscriptionSnapshot
    if (startedAtMs - claimedAtMs < env.snapshotMaxAgeMs) {
      sub = row.snapshot
    } else {
      const current = yield* Effect.either(env.subscriptions.get({ ownerDid: row.ownerDid, rkey: row.webhookRkey }))
      if (Either.isLeft(current)) {
        yield* logStoreError(env, current.left)
        guard.settling = true
        const now = clock.unsafeCurrentTimeMillis()
        return failure("subscription_unavailable", startedAtMs, Math.max(0, now - startedAtMs))
      }
      sub = current.right
    }
    const screened = screen(row, sub, env.scanningDeferMs)
    if (screened !== undefined) {
      guard.settling = true
      return screened
    }
    // a 410 for this registration came back to this process and its gone mark is not written yet:
    // parked like a gone webhook's rows, without a request (SPEC §4.3)
    if (env.state.markingGone.size > 0 && env.state.markingGone.has(goneKey(row))) {
      guard.settling = true
      return Park()
    }
    const body = row.body
    if (body === undefined) {
      guard.settling = true
      return failure("payload_missing", startedAtMs, Math.max(0, clock.unsafeCurrentTimeMillis() - startedAtMs))
    }

    // 2. the secret (inline, or the server-managed one)
    let secret: string | undefined = undefined
    if (sub.signingMode === "record_secret") {
      secret = sub.recordSecret
    } else if (sub.signingMode === "secret_id") {
      const name = sub.secretId
      const resolved = name === undefined ? undefined : yield* Effect.option(env.secrets.resolve(row.ownerDid, name))
      secret = resolved === undefined ? undefined : Option.getOrUndefined(resolved)
    }

    // 3. the destination transform
    const prepared = prepare(row, body, sub, secret, env.transformFor, startedAtMs, clock.unsafeCurrentTimeMillis())
    if (prepared._tag !== "Send") {
      guard.settling = true
      return prepared
    }

    // 4. the lease, just before the request (nothing after this step waits): a process frozen or
    //    starved past 2/3 of its lease (SIGSTOP, a paused VM) must not send for rows another worker
    //    may have taken over meanwhile; its heartbeat may not have run yet. Nor may a request start
    //    that the lease left would not cover. Handed back without an attempt (fenced by the token:
    //    a no-op when the row is no longer ours)
    if (
      guard.renewedAt !== undefined &&
      leaseTooShortToSend(
        env.leaseMs,
        env.timeoutMs,
        LEASE_MARGIN_MS,
        guard.renewedAt,
        Number(clock.unsafeCurrentTimeNanos() / 1_000_000n)
      )
    ) {
      guard.settling = true
      yield* logRecurring(env, "lease_lost", "delivery lease lost; attempt abandoned", { deliveryId: row.deliveryId })
      return Defer({ delayMs: 0, jitterMs: 0, reason: "lease_lost" })
    }

    // 5. the origin's circuit breaker
    const { origin, request } = prepared
    const breaker = env.breaker
    const admission = breaker.canAttempt(origin, startedAtMs)
    if (admission === "probe") nudge(env, origin, startedAtMs, admission)
    const deferred = admit(admission, admission === "open" ? breaker.get(origin)?.openUntilMs ?? 0 : 0, startedAtMs)
    if (deferred !== undefined) {
      guard.settling = true
      updateOpenCircuits(env)
      return deferred
    }

    // 6. send, classify
    const sendStart = clock.unsafeCurrentTimeMillis()
    if (row.firstAttempt) recordFirstAttemptLatency(row.ageMs + Math.max(0, sendStart - claimedAtMs))
    env.state.attempts++
    const response = yield* send(env, request)
    const sendEnd = clock.unsafeCurrentTimeMillis()
    recordAttemptDuration(Math.max(0, sendEnd - sendStart))
    guard.settling = true
    const settled = judge(response, request, startedAtMs, sendEnd)
    report(breaker, origin, settled, sendEnd)
    nudge(env, origin, sendEnd)
    updateOpenCircuits(env)
    return settled
  })
