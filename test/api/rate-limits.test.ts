/**
 * The rate limits of the owners' API (SPEC §8.2) under TestClock: failed authentications per
 * client address (30/min; the first X-Forwarded-For hop only with API_TRUST_PROXY=1), calls per
 * caller DID (120/min) and per method; each refusal is 429 with Retry-After.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Fiber, TestClock } from "effect"
import { DEFAULT_LIMITS } from "../../src/services/api/RateLimiter.js"
import { apiLayer, call, claims, forge, healthApi, mint, newDid, newOwner, Plc } from "./support.js"
import { until } from "./tailClient.js"

const LIST = "place.wisp.v2.secret.list"
const CREATE = "place.wisp.v2.secret.create"
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
/** tokens that outlive the TestClock's jumps (at most 1 h ahead, SPEC §8.2) */
const longMint = (owner: Parameters<typeof mint>[0], lxm: string) => mint(owner, lxm, { expiresIn: 3000 })

const nowS = () => Math.floor(Date.now() / 1000)

describe("rate limits behind a trusted proxy", () => {
  layer(apiLayer({ env: { API_TRUST_PROXY: "1" } }))((it) => {
    it.effect("30 failed authentications per client address per minute, then 429 for anything from it", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const from = (ip: string) => ({ "x-forwarded-for": `${ip}, 10.0.0.1` })
        for (let i = 0; i < 30; i++) {
          const r = yield* call(LIST, { token: "garbage", headers: from("203.0.113.5") })
          expect(r.status).toBe(401)
        }
        const refused = yield* call(LIST, { token: "garbage", headers: from("203.0.113.5") })
        expect([refused.status, refused.body["error"], refused.headers["retry-after"]]).toEqual([
          429,
          "RateLimitExceeded",
          "2"
        ])
        // a good token from that address is refused too (its token is not even looked at)
        const good = yield* call(LIST, { token: yield* longMint(owner, LIST), headers: from("203.0.113.5") })
        expect(good.status).toBe(429)
        // the proxy's own address is not the client; another client is not affected
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST), headers: from("203.0.113.6") })).status)
          .toBe(200)
        // one token comes back every 2 s
        yield* TestClock.adjust("2 seconds")
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST), headers: from("203.0.113.5") })).status)
          .toBe(200)
        expect((yield* call(LIST, { token: "garbage", headers: from("203.0.113.5") })).status).toBe(401)
        expect((yield* call(LIST, { token: "garbage", headers: from("203.0.113.5") })).status).toBe(429)
        yield* TestClock.adjust("1 minute")
        expect((yield* call(LIST, { token: "garbage", headers: from("203.0.113.5") })).status).toBe(401)
        // IPv6 clients count by /64
        for (let i = 0; i < 30; i++) {
          yield* call(LIST, { token: "garbage", headers: from(`2001:db8:1:2::${i.toString(16)}`) })
        }
        expect((yield* call(LIST, { token: "garbage", headers: from("2001:db8:1:2:ffff::1") })).status).toBe(429)
        expect((yield* call(LIST, { token: "garbage", headers: from("2001:db8:1:3::1") })).status).toBe(401)
      }))

    it.effect("120 calls per caller DID per minute, then 429 with Retry-After; other callers unaffected", () =>
      Effect.gen(function*() {
        yield* wallClock
        const a = yield* newOwner()
        const b = yield* newOwner()
        for (let i = 0; i < 120; i++) {
          const r = yield* call(LIST, { token: yield* longMint(a, LIST) })
          expect(r.status).toBe(200)
        }
        const refused = yield* call(CREATE, { token: yield* longMint(a, CREATE), body: { name: "x" } })
        expect([refused.status, refused.body["error"], refused.headers["retry-after"]]).toEqual([
          429,
          "RateLimitExceeded",
          "1"
        ])
        expect((yield* call(LIST, { token: yield* longMint(b, LIST) })).status).toBe(200)
        yield* TestClock.adjust("500 millis")
        expect((yield* call(LIST, { token: yield* longMint(a, LIST) })).status).toBe(200)
        expect((yield* call(LIST, { token: yield* longMint(a, LIST) })).status).toBe(429)
        const api = (yield* healthApi) as { rateLimited: number }
        expect(api.rateLimited).toBeGreaterThanOrEqual(2)
      }))
  })
})

describe("per-method limits", () => {
  it("SPEC §8.2: dev.firehook.webhook.test 10/min, replay 2/min", () => {
    expect(DEFAULT_LIMITS.methodRates).toEqual({
      "dev.firehook.webhook.test": { limit: 10, perMs: 60_000 },
      "dev.firehook.webhook.replay": { limit: 2, perMs: 60_000 }
    })
    expect(DEFAULT_LIMITS.callsPerCaller).toEqual({ limit: 120, perMs: 60_000 })
    expect(DEFAULT_LIMITS.failedAuthPerAddress).toEqual({ limit: 30, perMs: 60_000 })
  })

  layer(apiLayer({ api: { limits: { methodRates: { [LIST]: { limit: 2, perMs: 60_000 } } } } }))((it) => {
    it.effect("a method's own limit counts within the caller's overall one", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST) })).status).toBe(200)
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST) })).status).toBe(200)
        const refused = yield* call(LIST, { token: yield* longMint(owner, LIST) })
        expect([refused.status, refused.headers["retry-after"]]).toEqual([429, "30"])
        // other methods of the caller still go through
        expect((yield* call(CREATE, { token: yield* longMint(owner, CREATE), body: { name: "y" } })).status).toBe(200)
        yield* TestClock.adjust("30 seconds")
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST) })).status).toBe(200)
      }))
  })
})

describe("without API_TRUST_PROXY", () => {
  layer(apiLayer({ api: { limits: { failedAuthPerAddress: { limit: 3, perMs: 60_000 } } } }))((it) => {
    it.effect("X-Forwarded-For is ignored: the socket peer is the client", () =>
      Effect.gen(function*() {
        yield* wallClock
        for (let i = 0; i < 3; i++) {
          const r = yield* call(LIST, { token: "garbage", headers: { "x-forwarded-for": `198.51.100.${i}` } })
          expect(r.status).toBe(401)
        }
        const r = yield* call(LIST, { token: "garbage", headers: { "x-forwarded-for": "198.51.100.99" } })
        expect([r.status, r.headers["retry-after"]]).toEqual([429, "20"])
      }))

    it.effect("an issuer whose directory does not answer counts as a failed authentication (no unbounded fetches)", () =>
      Effect.gen(function*() {
        yield* wallClock
        yield* TestClock.adjust("1 minute")
        const plc = yield* Plc
        const handler = plc.handler
        const fetched = () => plc.requests.length
        const before = fetched()
        plc.handler = () => ({ status: 503, body: "{\"error\":\"Unavailable\"}" })
        const answers = yield* Effect.forEach(
          Array.from({ length: 5 }, () => newOwner()),
          (owner) =>
            Effect.flatMap(owner, (o) => longMint(o, LIST)).pipe(
              Effect.flatMap((token) => call(LIST, { token })),
              Effect.map((r) => r.status)
            )
        ).pipe(Effect.ensuring(Effect.sync(() => (plc.handler = handler))))
        // three 502s use up the address's failed authentications; then nothing is fetched
        expect(answers).toEqual([502, 502, 502, 429, 429])
        expect(fetched() - before).toBe(3)
      }))

    it.effect("calls sent at once cannot fail more than the limit: each verification holds one while it runs", () =>
      Effect.gen(function*() {
        // the address's limit full again (past the other tests' moves of the clock)
        yield* wallClock
        yield* TestClock.adjust("2 minutes")
        const plc = yield* Plc
        const handler = plc.handler
        const before = plc.requests.length
        // the directory holds every answer until the test lets them go
        let release: () => void = () => {}
        const gate = new Promise<void>((r) => (release = r))
        plc.handler = (req) => gate.then(() => handler(req))
        // forged tokens naming DIDs nobody has: each verification fetches a document (then 401)
        const owner = yield* newOwner()
        const tokens = yield* Effect.forEach(
          Array.from({ length: 10 }, () => newDid()),
          (did) =>
            forge(
              owner.key,
              { alg: "ES256K", typ: "JWT" },
              claims({ did, key: owner.key }, LIST, { exp: nowS() + 900 })
            )
        )
        const answered: Array<number> = []
        const calls = yield* Effect.fork(
          Effect.forEach(tokens, (token) => Effect.tap(call(LIST, { token }), (r) => answered.push(r.status)), {
            concurrency: "unbounded"
          })
        )
        // every call is either answered or waiting on the directory
        yield* until("every call answered or fetching", () => answered.length + plc.requests.length - before >= 10)
          .pipe(Effect.ensuring(Effect.sync(() => release())))
        const answers = yield* Fiber.join(calls).pipe(Effect.ensuring(Effect.sync(() => (plc.handler = handler))))
        expect(answers.map((r) => r.status).sort()).toEqual([401, 401, 401, 429, 429, 429, 429, 429, 429, 429])
        expect(plc.requests.length - before).toBe(3)
        // an accepted token gives its hold back: a genuine call from the (now limited) address is
        // refused, one after the refill is not and leaves the address's one free failure in place
        yield* TestClock.adjust("20 seconds")
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST) })).status).toBe(200)
        expect((yield* call(LIST, { token: "garbage" })).status).toBe(401)
        expect((yield* call(LIST, { token: "garbage" })).status).toBe(429)
      }))
  })
})

describe("limits from the environment (API_*_PER_MINUTE, API_BODY_MAX_BYTES)", () => {
  layer(apiLayer({
    env: {
      API_AUTH_FAILURES_PER_MINUTE: "2",
      API_CALLS_PER_MINUTE: "3",
      API_BODY_MAX_BYTES: "1024"
    }
  }))((it) => {
    it.effect("2 failed authentications per address, 3 calls per caller, bodies up to 1 KiB", () =>
      Effect.gen(function*() {
        yield* wallClock
        for (let i = 0; i < 2; i++) expect((yield* call(LIST, { token: "garbage" })).status).toBe(401)
        const refused = yield* call(LIST, { token: "garbage" })
        expect([refused.status, refused.headers["retry-after"]]).toEqual([429, "30"])
        yield* TestClock.adjust("1 minute")
        const owner = yield* newOwner()
        const big = yield* call(CREATE, { token: yield* longMint(owner, CREATE), body: { name: "x".repeat(2048) } })
        expect([big.status, big.body["message"]]).toEqual([400, "the body must be at most 1024 bytes"])
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST) })).status).toBe(200)
        expect((yield* call(LIST, { token: yield* longMint(owner, LIST) })).status).toBe(200)
        const fourth = yield* call(LIST, { token: yield* longMint(owner, LIST) })
        expect([fourth.status, fourth.body["error"], fourth.headers["retry-after"]]).toEqual([
          429,
          "RateLimitExceeded",
          "20"
        ])
      }))
  })
})
