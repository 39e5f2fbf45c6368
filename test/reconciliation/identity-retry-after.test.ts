/**
 * A DID document host that asks for time (Identity.ts): a PLC directory (or did:web host) answering
 * 429 or 503 with `Retry-After` is asked nothing more until it has passed (at most an hour), for any
 * DID on it, in the foreground or the background. A lookup meanwhile fails at once as
 * `identity_unavailable` with `held` and the time left; the lookup that met the answer carries the
 * whole wait. Without the header (or on another status) nothing is held. Under the TestClock, with a
 * fake transport that answers with headers.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer, Metric, TestClock } from "effect"
import * as Config from "../../src/services/platform/Config.js"
import { SafeHttp, type SafeRequest, type SafeResponse } from "../../src/services/platform/http/SafeHttp.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Metrics from "../../src/services/reconciliation/ReconcileMetrics.js"
import { didDoc } from "../support/fakeAtproto.js"
import { plc, testConfig } from "../support/stack.js"

const PLC = "https://plc.test"
const ALICE = plc(21)
const BOB = plc(22)
const CAROL = plc(23)
const WEB = "did:web:other.example"

interface Answer {
  readonly status: number
  readonly headers?: Record<string, string>
  readonly body: unknown
}

/** A transport answering each URL with `answers`' entry (a 404 when absent), logging the URLs asked. */
const world = () => {
  const requests: Array<string> = []
  const answers = new Map<string, Answer>()
  const respond = (a: Answer): SafeResponse => ({
    status: a.status,
    headers: a.headers ?? {},
    body: new TextEncoder().encode(JSON.stringify(a.body)),
    truncated: false
  })
  const http = Layer.succeed(SafeHttp, {
    request: (req: SafeRequest) =>
      Effect.sync(() => {
        requests.push(req.url)
        return respond(answers.get(req.url) ?? { status: 404, body: { message: "DID not registered" } })
      })
  })
  const layer = Identity.layer().pipe(
    Layer.provide(http),
    Layer.provide(Config.layerValue(testConfig({ PLC_DIRECTORY_URL: PLC })))
  )
  const doc = (did: string, url: string) => answers.set(url, { status: 200, body: didDoc(did, "https://pds.example") })
  const refuse = (url: string, status: number, headers: Record<string, string> = {}) =>
    answers.set(url, { status, headers, body: { message: "slow down" } })
  return { requests, answers, layer, doc, refuse }
}

const resolve = (did: string) => Effect.either(Effect.flatMap(Identity.Identity, (i) => i.resolvePds(did)))
const failures = Effect.map(
  Metric.value(Metrics.identityFailures({ kind: "identity_unavailable" })),
  (s) => s.count
)

/** The error of a failed lookup, as the fields a caller reads. */
const errorOf = (r: Either.Either<string, Identity.IdentityError>) =>
  Either.isLeft(r)
    ? { kind: r.left.kind, retryAfterMs: r.left.retryAfterMs, held: r.left.held === true }
    : { resolved: r.right }

describe("Identity: a document host's Retry-After", () => {
  it.scoped("a 429 with Retry-After holds the directory: one request, then every lookup fails at once with the time left", () => {
    const w = world()
    for (const did of [ALICE, BOB, CAROL]) w.refuse(`${PLC}/${did}`, 429, { "retry-after": "300" })
    return Effect.gen(function*() {
      const counted = yield* failures
      expect(errorOf(yield* resolve(ALICE))).toEqual({
        kind: "identity_unavailable",
        retryAfterMs: 300_000,
        held: false
      })
      yield* TestClock.adjust("100 seconds")
      // another DID on the same directory: not asked, failed with what is left of the wait
      expect(errorOf(yield* resolve(BOB))).toEqual({ kind: "identity_unavailable", retryAfterMs: 200_000, held: true })
      expect(errorOf(yield* resolve(ALICE))).toEqual({
        kind: "identity_unavailable",
        retryAfterMs: 200_000,
        held: true
      })
      // a forced refetch (a service token's signature failed) is held too
      const forced = yield* Effect.either(
        Effect.flatMap(Identity.Identity, (i) => i.resolveSigningKey(CAROL, { fresh: true }))
      )
      expect(Either.isLeft(forced) && forced.left.held).toBe(true)
      expect(w.requests).toEqual([`${PLC}/${ALICE}`])
      // the held lookups fetched nothing: counted once, the 429
      expect((yield* failures) - counted).toBe(1)
      // a did:web host is another host: asked
      w.doc(WEB, "https://other.example/.well-known/did.json")
      expect(errorOf(yield* resolve(WEB))).toEqual({ resolved: "https://pds.example" })
      // the wait over, the directory is asked again
      yield* TestClock.adjust("200 seconds")
      w.doc(BOB, `${PLC}/${BOB}`)
      expect(errorOf(yield* resolve(BOB))).toEqual({ resolved: "https://pds.example" })
      expect(w.requests).toEqual([`${PLC}/${ALICE}`, "https://other.example/.well-known/did.json", `${PLC}/${BOB}`])
    }).pipe(Effect.provide(w.layer))
  })

  it.scoped("a 503 with an HTTP-date Retry-After holds the directory; the hold is at most an hour", () => {
    const w = world()
    return Effect.gen(function*() {
      // the HTTP date is read against the Clock
      const now = Date.UTC(2026, 11, 7, 12, 0, 0)
      yield* TestClock.setTime(now)
      w.refuse(`${PLC}/${ALICE}`, 503, { "retry-after": new Date(now + 2 * 3_600_000).toUTCString() })
      // the lookup that met it carries the whole wait (the retry scheduler caps it at its own maximum)
      expect(errorOf(yield* resolve(ALICE))).toEqual({
        kind: "identity_unavailable",
        retryAfterMs: 7_200_000,
        held: false
      })
      expect(errorOf(yield* resolve(BOB))).toEqual({
        kind: "identity_unavailable",
        retryAfterMs: 3_600_000,
        held: true
      })
      yield* TestClock.adjust("3600 seconds")
      w.doc(BOB, `${PLC}/${BOB}`)
      expect(errorOf(yield* resolve(BOB))).toEqual({ resolved: "https://pds.example" })
      expect(w.requests).toEqual([`${PLC}/${ALICE}`, `${PLC}/${BOB}`])
    }).pipe(Effect.provide(w.layer))
  })

  it.scoped("a 429 without Retry-After, or another status with one, holds nothing", () => {
    const w = world()
    w.refuse(`${PLC}/${ALICE}`, 429)
    w.refuse(`${PLC}/${BOB}`, 500, { "retry-after": "300" })
    return Effect.gen(function*() {
      expect(errorOf(yield* resolve(ALICE))).toEqual({
        kind: "identity_unavailable",
        retryAfterMs: undefined,
        held: false
      })
      expect(errorOf(yield* resolve(BOB))).toEqual({
        kind: "identity_unavailable",
        retryAfterMs: undefined,
        held: false
      })
      w.doc(CAROL, `${PLC}/${CAROL}`)
      expect(errorOf(yield* resolve(CAROL))).toEqual({ resolved: "https://pds.example" })
      expect(w.requests).toEqual([`${PLC}/${ALICE}`, `${PLC}/${BOB}`, `${PLC}/${CAROL}`])
    }).pipe(Effect.provide(w.layer))
  })
})
