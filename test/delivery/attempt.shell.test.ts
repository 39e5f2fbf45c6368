/**
 * The attempt shell (Attempt.ts `attempt`, SPEC §4.2–§4.3) over a stub transport: what it hands
 * the transport (the prepared request, the configured timeout, the 64 KiB truncated read), how it
 * resolves a server-managed secret, and what each outcome tells the origin's circuit breaker
 * (transient failures count; answers that reached a healthy receiver and firehook's own refusals
 * do not).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Queue, TestClock } from "effect"
import { createHmac } from "node:crypto"
import { Webhook } from "standardwebhooks"
import { attempt, MAX_RESPONSE_BYTES } from "../../src/services/delivery/Attempt.js"
import { makeCircuitBreaker } from "../../src/services/delivery/CircuitBreaker.js"
import {
  type ClaimedRow,
  originKey,
  RESPONSE_EXCERPT_BYTES,
  type SubscriptionSnapshot
} from "../../src/services/delivery/DeliveryStore.js"
import * as Destinations from "../../src/services/delivery/Destinations.js"
import { Secrets } from "../../src/services/delivery/Secrets.js"
import { Defer } from "../../src/services/delivery/Settlement.js"
import { makeState, type WorkerEnv } from "../../src/services/delivery/WorkerState.js"
import { SafeHttpError, type SafeHttpErrorKind, type SafeRequest } from "../../src/services/platform/http/SafeHttp.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"
import { plc } from "../support/stack.js"

const OWNER = plc(1)
const BOB = plc(2)
const URL_ = "https://receiver.example/hook"
const ORIGIN = originKey(URL_)
const SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
const BODY = "{\"event\":\"x\",\"timestamp\":\"2026-01-01T00:00:00.000Z\"}"

const sub: SubscriptionSnapshot = {
  exists: true,
  active: true,
  enabled: true,
  gone: false,
  autoDisabled: false,
  url: URL_,
  fingerprint: "fp",
  signingMode: "record_secret",
  secretId: undefined,
  recordSecret: SECRET,
  ownerStatus: "complete"
}

const rowWith = (snapshot: SubscriptionSnapshot): ClaimedRow => ({
  deliveryId: "whd_v1_shell",
  eventId: "whe_v1_shell",
  ownerDid: OWNER,
  webhookRkey: "wh1",
  matchKind: "direct",
  eventDid: BOB,
  eventCollection: "app.bsky.feed.post",
  eventRkey: "r1",
  eventOperation: "create",
  targetUrl: URL_,
  signingMode: snapshot.signingMode,
  secretId: snapshot.secretId,
  fingerprint: "fp",
  attemptCount: 0,
  leaseToken: "w:1",
  origin: ORIGIN,
  ageMs: 0,
  firstAttempt: true,
  reclaimed: false,
  crashCount: 0,
  body: BODY,
  snapshot
})

/** A status the stub receiver answers, or the transport failure it fails with. */
type Answer = number | SafeHttpErrorKind

/** A worker environment whose transport answers `answers` in turn (the last one repeated). */
const envAnswering = (answers: ReadonlyArray<Answer>, threshold = 1, timeoutMs = 4_321) =>
  Effect.gen(function*() {
    const sent: Array<SafeRequest> = []
    const breaker = makeCircuitBreaker({ threshold })
    const http = {
      request: (req: SafeRequest) =>
        Effect.suspend(() => {
          const answer = answers[Math.min(sent.length, answers.length - 1)] ?? 200
          sent.push(req)
          return typeof answer === "number"
            ? Effect.succeed({ status: answer, headers: {}, body: new Uint8Array(0), truncated: false })
            : Effect.fail(new SafeHttpError({ kind: answer }))
        })
    }
    const secrets = yield* Effect.provide(
      Secrets,
      Secrets.layerMemory([{ ownerDid: OWNER, name: "main", token: SECRET }])
    )
    const partial = {
      state: makeState(),
      breaker,
      clock: yield* Effect.clock,
      snapshotMaxAgeMs: Number.POSITIVE_INFINITY,
      scanningDeferMs: 1_000,
      secrets,
      http,
      timeoutMs,
      transformFor: () => Destinations.webhookPreset,
      parkWake: yield* Queue.sliding<void>(1),
      traced: false,
      leaseMs: 60_000,
      log: RateLimitedLog.make()
    }
    const env = partial as unknown as WorkerEnv
    const once = (snapshot: SubscriptionSnapshot = sub) => attempt(env, rowWith(snapshot), 0, { settling: false })
    const withLease = (renewedAt: number) => attempt(env, rowWith(sub), 0, { settling: false, renewedAt })
    return { sent, breaker, once, withLease }
  })

describe("attempt: the lease just before the request (SPEC §4.1)", () => {
  it.effect("a row whose lease was last renewed 2/3 of a lease ago or more (a frozen or starved process) is handed back without a request", () =>
    Effect.gen(function*() {
      const { sent, withLease } = yield* envAnswering([200])
      // the monotonic clock at 100 s; the lease is 60 s
      yield* TestClock.adjust("100 seconds")
      // renewed 39.999 s ago: still well inside the lease; sent
      expect(yield* withLease(100_000 - 39_999)).toMatchObject({ _tag: "Deliver" })
      expect(sent).toHaveLength(1)
      // renewed 40 s ago (2/3 of the lease) and 75 s ago (expired; another worker may hold it): no request
      for (const renewedAt of [100_000 - 40_000, 100_000 - 75_000]) {
        expect(yield* withLease(renewedAt)).toEqual(Defer({ delayMs: 0, jitterMs: 0, reason: "lease_lost" }))
      }
      expect(sent).toHaveLength(1)
    }))

  it.effect("with a 30 s timeout (lease 60 s) a request starts only while the lease left covers it: renewed up to 25 s ago", () =>
    Effect.gen(function*() {
      const { sent, withLease } = yield* envAnswering([200], 1, 30_000)
      yield* TestClock.adjust("100 seconds")
      // renewed 25 s ago: 35 s of lease left, the whole request (30 s) and the 5 s margin fit; sent
      expect(yield* withLease(100_000 - 25_000)).toMatchObject({ _tag: "Deliver" })
      expect(sent).toHaveLength(1)
      // renewed 25.001 s ago (a renewal hung on the database meanwhile): a request started now could
      // outlast the lease while another worker takes the row over; handed back without a request
      expect(yield* withLease(100_000 - 25_001)).toEqual(Defer({ delayMs: 0, jitterMs: 0, reason: "lease_lost" }))
      expect(sent).toHaveLength(1)
    }))
})

describe("attempt: what the origin's circuit breaker hears (SPEC §4.3)", () => {
  it.effect("5xx and 429 answers open it; 4xx, 410 and 3xx answers come from a healthy receiver and do not", () =>
    Effect.gen(function*() {
      for (const status of [503, 500, 429]) {
        const { breaker, once } = yield* envAnswering([status])
        expect(yield* once()).toMatchObject({ _tag: "Fail", httpStatus: status })
        expect(breaker.canAttempt(ORIGIN, 0), String(status)).toBe("open")
      }
      for (const [status, kind] of [[400, "http_4xx"], [404, "http_4xx"], [410, "gone"], [302, "redirect"]] as const) {
        const { breaker, once } = yield* envAnswering([status])
        expect(yield* once()).toMatchObject({ _tag: "Fail", kind, httpStatus: status })
        expect(breaker.canAttempt(ORIGIN, 0), String(status)).toBe("closed")
      }
    }))

  it.effect("dns, timeout and network failures open it; firehook's own refusals (blocked, invalid, too large) do not", () =>
    Effect.gen(function*() {
      for (const kind of ["dns", "timeout", "network"] as const) {
        const { breaker, once } = yield* envAnswering([kind])
        expect(yield* once()).toMatchObject({ _tag: "Fail", kind, httpStatus: undefined })
        expect(breaker.canAttempt(ORIGIN, 0), kind).toBe("open")
      }
      for (const kind of ["blocked_target", "invalid_target", "request_too_large"] as const) {
        const { breaker, once } = yield* envAnswering([kind])
        expect(yield* once()).toMatchObject({ _tag: "Fail", kind })
        expect(breaker.canAttempt(ORIGIN, 0), kind).toBe("closed")
      }
    }))

  it.effect("a delivery between two transient failures resets the count", () =>
    Effect.gen(function*() {
      const { breaker, once } = yield* envAnswering([503, 200, 503], 2)
      expect(yield* once()).toMatchObject({ _tag: "Fail", kind: "http_5xx" })
      expect(yield* once()).toMatchObject({ _tag: "Deliver", httpStatus: 200 })
      expect(yield* once()).toMatchObject({ _tag: "Fail", kind: "http_5xx" })
      expect(breaker.canAttempt(ORIGIN, 0)).toBe("closed")
    }))
})

describe("attempt: what the transport is asked to send (SPEC §4.5)", () => {
  it.effect("the prepared request as is, with the configured timeout and a truncated 64 KiB read", () =>
    Effect.gen(function*() {
      const { once, sent } = yield* envAnswering([204])
      expect(yield* once()).toMatchObject({ _tag: "Deliver", httpStatus: 204 })
      expect(sent).toHaveLength(1)
      const req = sent[0]
      expect(req).toMatchObject({
        url: URL_,
        method: "POST",
        body: BODY,
        timeoutMs: 4_321,
        maxResponseBytes: MAX_RESPONSE_BYTES,
        onResponseOverflow: "truncate",
        keepResponseBytes: RESPONSE_EXCERPT_BYTES
      })
      expect(req?.headers).toMatchObject({
        "Content-Type": "application/json",
        "Idempotency-Key": "whd_v1_shell",
        "webhook-id": "whd_v1_shell",
        "webhook-timestamp": "0"
      })
      // signed for the attempt's start (the TestClock's 0): what the standardwebhooks library signs
      expect(req?.headers["webhook-signature"]).toBe(new Webhook(SECRET).sign("whd_v1_shell", new Date(0), BODY))
    }))

  it.effect("a server-managed secret is resolved and signs; one that does not resolve sends nothing", () =>
    Effect.gen(function*() {
      const { once, sent } = yield* envAnswering([200])
      const managed = { ...sub, signingMode: "secret_id", secretId: "main", recordSecret: undefined } as const
      expect(yield* once(managed)).toMatchObject({ _tag: "Deliver" })
      expect(sent).toHaveLength(1)
      const headers = sent[0]?.headers ?? {}
      expect(headers["X-Webhook-Signature"]).toBe(
        "sha256=" + createHmac("sha256", SECRET).update(BODY, "utf8").digest("hex")
      )
      expect(yield* once({ ...managed, secretId: "missing" })).toMatchObject({
        _tag: "Fail",
        kind: "secret_unavailable"
      })
      expect(sent).toHaveLength(1)
    }))
})
