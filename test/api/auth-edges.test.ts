/**
 * Service auth (SPEC §8.2) at the edges a mutation audit found untested: the bearer scheme must
 * open the header; `nbf` up to exactly 30 s ahead; a token accepted within its 30 s of `exp` skew
 * is still recorded, so its replay is refused (on both paths: the verifier library's and
 * firehook's own steps for a did:web service DID with a port); `iat` more than 1 h old refused on
 * the library's path too; a full replay cache without a shared store answers 503, never 401 and
 * never an unchecked token; a shared store that holds the token expired by the database's clock
 * answers `ExpiredToken` on the library's path, as on firehook's own; claims not of their types
 * (no `exp`, a fractional `exp`, a non-string `iss`) are refused as `InvalidToken`.
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, Layer, TestClock } from "effect"
import * as Jti from "../../src/services/api/JtiStore.js"
import { bearerToken } from "../../src/services/api/ServiceAuth.js"
import { apiLayer, apiLayerWith, call, claims, forge, mint, newOwner } from "./support.js"

const LIST = "place.wisp.v2.secret.list"
const HEADER = { alg: "ES256K", typ: "JWT" }
const nowS = () => Math.floor(Date.now() / 1000)
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const NO_AUTH_LIMIT = { limits: { failedAuthPerAddress: { limit: 10_000, perMs: 60_000 } } }
const PORT_DID = "did:web:hooks.example.com%3A8443"
const PORT_ENV = { SERVICE_DID: "", PUBLIC_URL: "https://hooks.example.com:8443" }

describe("the bearer token of an Authorization header", () => {
  it("the scheme opens the header: another scheme naming bearer later is no bearer token", () => {
    expect(bearerToken("Bearer abc.def.ghi")).toBe("abc.def.ghi")
    expect(bearerToken("bearer  abc.def.ghi ")).toBe("abc.def.ghi")
    expect(bearerToken("Basic bearer abc.def.ghi")).toBeUndefined()
    expect(bearerToken("XBearer abc.def.ghi")).toBeUndefined()
    expect(bearerToken(" Bearer abc.def.ghi")).toBeUndefined()
    expect(bearerToken("Bearer abc def")).toBeUndefined()
  })
})

describe("service auth edges, the verifier library's path", () => {
  layer(apiLayer({ api: NO_AUTH_LIMIT }))((it) => {
    it.effect("a token within its 30 s of exp skew is accepted once: its replay is refused", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const t = nowS()
        const late = yield* forge(owner.key, HEADER, claims(owner, LIST, { iat: t - 70, exp: t - 10 }))
        expect((yield* call(LIST, { token: late })).status).toBe(200)
        const again = yield* call(LIST, { token: late })
        expect([again.status, again.body["error"]]).toEqual([401, "InvalidToken"])
      }))

    it.effect("iat more than 1 h old is refused (the library's maxAge), 50 min old accepted", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const t = nowS()
        const recent = yield* forge(owner.key, HEADER, claims(owner, LIST, { iat: t - 3000, exp: t + 60 }))
        expect((yield* call(LIST, { token: recent })).status).toBe(200)
        const old = yield* forge(owner.key, HEADER, claims(owner, LIST, { iat: t - 3700, exp: t + 60 }))
        const refused = yield* call(LIST, { token: old })
        expect([refused.status, refused.body["error"]]).toEqual([401, "InvalidToken"])
      }))
  })

  layer(apiLayer({ api: { ...NO_AUTH_LIMIT, replayCapacity: 1 } }))((it) => {
    it.effect("without a shared store, a full replay cache answers 503 to new tokens; a replay stays 401", () =>
      Effect.gen(function*() {
        yield* wallClock
        const filler = yield* newOwner()
        const held = yield* mint(filler, LIST, { expiresIn: 3600 })
        expect((yield* call(LIST, { token: held })).status).toBe(200)
        const owner = yield* newOwner()
        const token = yield* mint(owner, LIST)
        const full = yield* call(LIST, { token })
        expect([full.status, full.body["error"]]).toEqual([503, "NotEnoughResources"])
        // the cache is the only record: the held token is never forgotten early
        const replayed = yield* call(LIST, { token: held })
        expect([replayed.status, replayed.body["error"]]).toEqual([401, "InvalidToken"])
        // the refused token was not recorded: still 503, not a replay
        const retried = yield* call(LIST, { token })
        expect([retried.status, retried.body["error"]]).toEqual([503, "NotEnoughResources"])
      }))
  })

  /** A shared store whose database holds every token expired (its clock ahead of this replica's). */
  const expiredStore: Jti.JtiStoreShape = {
    claim: () => Effect.succeed("expired"),
    prune: Effect.succeed(0),
    recount: Effect.succeed({ live: 0, longLived: 0 })
  }
  layer(apiLayerWith(Layer.succeed(Jti.JtiStore, expiredStore), { api: NO_AUTH_LIMIT }))((it) => {
    it.effect("a token the shared store holds expired is refused as ExpiredToken", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const refused = yield* call(LIST, { token: yield* mint(owner, LIST) })
        expect([refused.status, refused.body["error"]]).toEqual([401, "ExpiredToken"])
      }))
  })
})

describe("service auth edges, firehook's own steps (a did:web service DID with a port)", () => {
  layer(apiLayer({ env: PORT_ENV, api: NO_AUTH_LIMIT }))((it) => {
    const aud = `${PORT_DID}#firehook`

    it.effect("nbf up to exactly 30 s ahead is accepted, 31 s refused", () =>
      Effect.gen(function*() {
        // firehook's own steps read the Effect Clock: a whole second, exactly
        const t = nowS()
        yield* TestClock.setTime(t * 1000)
        const owner = yield* newOwner()
        const at = (ahead: number) =>
          forge(owner.key, HEADER, claims(owner, LIST, { aud, iat: t, exp: t + 60, nbf: t + ahead }))
        expect((yield* call(LIST, { token: yield* at(30) })).status).toBe(200)
        const early = yield* call(LIST, { token: yield* at(31) })
        expect([early.status, early.body["error"]]).toEqual([401, "InvalidToken"])
      }))

    it.effect("claims not of their types are 401 InvalidToken: no exp, a fractional exp, iss a number", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const t = nowS()
        const cases: ReadonlyArray<readonly [string, object]> = [
          // without exp the library is never asked: such a token would never expire
          ["no exp", { exp: undefined }],
          ["exp fractional", { exp: t + 60.5 }],
          ["iss a number", { iss: 5 }]
        ]
        for (const [what, extra] of cases) {
          const token = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud, ...extra }))
          const answer = yield* call(LIST, { token })
          expect([what, answer.status, answer.body["error"]]).toEqual([what, 401, "InvalidToken"])
          expect([what, (yield* call(LIST, { token })).status]).toEqual([what, 401])
        }
      }))

    it.effect("a token within its 30 s of exp skew is accepted once: its replay is refused", () =>
      Effect.gen(function*() {
        const t = nowS()
        yield* TestClock.setTime(t * 1000)
        const owner = yield* newOwner()
        const late = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud, iat: t - 70, exp: t - 10 }))
        expect((yield* call(LIST, { token: late })).status).toBe(200)
        const again = yield* call(LIST, { token: late })
        expect([again.status, again.body["error"]]).toEqual([401, "InvalidToken"])
      }))
  })
})
