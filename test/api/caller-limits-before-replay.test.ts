/**
 * The caller's rate limits (SPEC §8.2: 120 calls/min per DID, and a method's own limit) are taken
 * once the token's signature has verified and BEFORE its `(iss, jti)` is claimed in the replay
 * stores. A call they refuse (429) takes no replay entry: entries live until the token expires (up
 * to 1 h + 31 s), so when the limits were taken after the claim, one DID minting fresh 1-hour
 * tokens with its own key filled the bounded replay cache (every other owner then got 503
 * `NotEnoughResources`) and claimed one `api_jti` row per refused call. On both verification paths
 * (the library's, and firehook's own for a did:web service DID with a port). The 429 is the same
 * answer as before (body, `Retry-After`, `Cache-Control`); a refused call does not count as a failed
 * authentication of its address; a token the replay stores refuse (a replay) gives the caller's
 * tokens back, and still counts as a failed authentication.
 *
 * Scaled down: 5 calls/min per caller and a replay cache of 20 entries.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Effect, Layer, TestClock } from "effect"
import * as Jti from "../../src/services/api/JtiStore.js"
import { type Answer, apiLayer, apiLayerWith, call, mint, newOwner, type Owner } from "./support.js"

const LIST = "place.wisp.v2.secret.list"
const CREATE = "place.wisp.v2.secret.create"
const PORT_DID = "did:web:hooks.example.com%3A8443"
const PORT_ENV = { SERVICE_DID: "", PUBLIC_URL: "https://hooks.example.com:8443" }
const MINUTE = 60_000
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))

/** `n` calls of `owner`, each with a fresh 1-hour token (`aud`: the service DID unless given). */
const flood = (owner: Owner, nsid: string, n: number, options: { aud?: string; body?: unknown } = {}) =>
  Effect.gen(function*() {
    const answers: Array<Answer> = []
    for (let i = 0; i < n; i++) {
      const token = yield* mint(owner, nsid, {
        expiresIn: 3600,
        ...(options.aud === undefined ? {} : { aud: options.aud })
      })
      answers.push(yield* call(nsid, { token, ...(options.body === undefined ? {} : { body: options.body }) }))
    }
    return answers
  })

/** The 429 of a caller's limit, exactly as it has always been answered. */
const expectRateLimited = (r: Answer) => {
  expect(r.status).toBe(429)
  expect(r.body).toEqual({ error: "RateLimitExceeded", message: "too many calls" })
  expect(r.headers["retry-after"]).toMatch(/^[1-9]\d*$/)
  expect(r.headers["cache-control"]).toBe("no-store")
  expect(r.headers["www-authenticate"]).toBeUndefined()
}

describe("calls refused by the caller's limits take no replay entry (the library's path)", () => {
  layer(apiLayer({
    api: {
      limits: {
        callsPerCaller: { limit: 5, perMs: MINUTE },
        // a caller's 429s are not failed authentications: 20 of them leave the address's 3 alone
        failedAuthPerAddress: { limit: 3, perMs: MINUTE },
        methodRates: { [CREATE]: { limit: 1, perMs: MINUTE } }
      },
      replayCapacity: 20
    }
  }))((it) => {
    it.effect("one DID over its 120/min cannot fill the replay cache: another owner's call still succeeds", () =>
      Effect.gen(function*() {
        yield* wallClock
        const attacker = yield* newOwner()
        const answers = yield* flood(attacker, LIST, 25)
        expect(answers.slice(0, 5).map((r) => r.status)).toEqual([200, 200, 200, 200, 200])
        for (const r of answers.slice(5)) expectRateLimited(r)
        const honest = yield* newOwner()
        const r = yield* call(LIST, { token: yield* mint(honest, LIST) })
        expect([r.status, r.body]).toEqual([200, { secrets: [] }])
      }))

    it.effect("nor can one over a method's own limit", () =>
      Effect.gen(function*() {
        yield* wallClock
        const attacker = yield* newOwner()
        const answers = yield* flood(attacker, CREATE, 21, { body: { name: "flood" } })
        expect(answers[0]?.status).toBe(200)
        for (const r of answers.slice(1)) expectRateLimited(r)
        const honest = yield* newOwner()
        expect((yield* call(LIST, { token: yield* mint(honest, LIST) })).status).toBe(200)
      }))
  })
})

describe("calls refused by the caller's limits claim no api_jti row (shared replay store)", () => {
  // the store without its pruning fiber (its minutely sleeps would all run when the TestClock is set
  // to the wall clock)
  layer(
    apiLayerWith(Layer.effect(Jti.JtiStore, Jti.makeSql), {
      api: { limits: { callsPerCaller: { limit: 5, perMs: MINUTE } } }
    })
  )((it) => {
    it.effect("25 calls of one DID over its limit: 5 rows, one per accepted call", () =>
      Effect.gen(function*() {
        yield* wallClock
        const sql = yield* SqlClient.SqlClient
        const attacker = yield* newOwner()
        const answers = yield* flood(attacker, LIST, 25)
        expect(answers.filter((r) => r.status === 200)).toHaveLength(5)
        for (const r of answers.slice(5)) expectRateLimited(r)
        const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM api_jti WHERE iss = ${attacker.did}`
          .pipe(Effect.orDie)
        expect(rows).toEqual([{ n: 5 }])
      }))
  })
})

describe("calls refused by the caller's limits take no replay entry (firehook's own path, a did:web with a port)", () => {
  layer(apiLayer({
    env: PORT_ENV,
    api: {
      limits: {
        callsPerCaller: { limit: 5, perMs: MINUTE },
        failedAuthPerAddress: { limit: 10_000, perMs: MINUTE }
      },
      replayCapacity: 20
    }
  }))((it) => {
    const aud = `${PORT_DID}#firehook`
    it.effect("one DID over its limit cannot fill the replay cache: another owner's call still succeeds", () =>
      Effect.gen(function*() {
        yield* wallClock
        const attacker = yield* newOwner()
        const answers = yield* flood(attacker, LIST, 25, { aud })
        expect(answers.slice(0, 5).map((r) => r.status)).toEqual([200, 200, 200, 200, 200])
        for (const r of answers.slice(5)) expectRateLimited(r)
        const honest = yield* newOwner()
        expect((yield* call(LIST, { token: yield* mint(honest, LIST, { aud }) })).status).toBe(200)
      }))

    it.effect("a replayed token gives the caller's tokens back (a captured token cannot spend its owner's limit)", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const token = yield* mint(owner, LIST, { aud })
        expect((yield* call(LIST, { token })).status).toBe(200)
        for (let i = 0; i < 5; i++) {
          const r = yield* call(LIST, { token })
          expect([r.status, r.body["error"]]).toEqual([401, "InvalidToken"])
        }
        const fresh = yield* flood(owner, LIST, 5, { aud })
        expect(fresh.map((r) => r.status)).toEqual([200, 200, 200, 200, 429])
      }))
  })
})

describe("a replayed token on the library's path", () => {
  layer(apiLayer({
    api: {
      limits: {
        callsPerCaller: { limit: 4, perMs: MINUTE },
        failedAuthPerAddress: { limit: 3, perMs: MINUTE }
      }
    }
  }))((it) => {
    it.effect("gives the caller's tokens back, and still counts as a failed authentication of the address", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const token = yield* mint(owner, LIST)
        expect((yield* call(LIST, { token })).status).toBe(200)
        for (let i = 0; i < 3; i++) {
          const r = yield* call(LIST, { token })
          expect([r.status, r.body["error"]]).toEqual([401, "InvalidToken"])
        }
        // the address's 3 failed authentications are used up: even a good token is refused unread
        expectRateLimited(yield* call(LIST, { token: yield* mint(owner, LIST) }))
        // one failed authentication comes back every 20 s; the caller has all of its 4 calls (3 left
        // after the first, none spent by the replays, one refilled): had the replays kept theirs,
        // one call would be left
        yield* TestClock.adjust("20 seconds")
        for (let i = 0; i < 4; i++) expect((yield* call(LIST, { token: yield* mint(owner, LIST) })).status).toBe(200)
        expectRateLimited(yield* call(LIST, { token: yield* mint(owner, LIST) }))
      }))
  })
})
