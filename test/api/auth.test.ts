/**
 * Service auth of the owners' API (SPEC §8.2), over real HTTP: every refusal answers 401 with the
 * §8.2 error name and a generic message, before the body is read (the request's body never
 * completes, yet the answer comes) and without running the method (the owner has no secret
 * afterwards). Tokens are minted with @atcute/crypto keypairs and the library's creator or forged;
 * the DID documents come from a fake PLC through firehook's own Identity.
 */
import { describe, expect, layer } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import { FRESH_REFETCH_MIN_INTERVAL_MS } from "../../src/services/reconciliation/Identity.js"
import {
  apiLayer,
  call,
  callAs,
  claims,
  didDocument,
  docs,
  forge,
  keypair,
  mint,
  newDid,
  newOwner,
  type Owner,
  Plc,
  serverPort,
  SERVICE_DID,
  unfinishedPost
} from "./support.js"

const CREATE = "place.wisp.v2.secret.create"
const LIST = "place.wisp.v2.secret.list"
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))

/** A refused call of secret.create whose body never arrives: the 401 comes anyway. */
const refusedUnread = (token: string | undefined, error: string, what = "") =>
  Effect.gen(function*() {
    const port = yield* serverPort
    const answer = yield* unfinishedPost(port, CREATE, token === undefined ? {} : { authorization: `Bearer ${token}` })
    expect([what, answer === "no answer" ? answer : answer.status]).toEqual([what, 401])
    if (answer === "no answer") return
    const body = JSON.parse(answer.body) as { error: string; message: string }
    expect([what, body.error]).toEqual([what, error])
    expect(body.message.length).toBeGreaterThan(0)
    // the message is generic: nothing of the token
    if (token !== undefined) expect(answer.body).not.toContain(token.slice(0, 20))
  })

const noSecrets = (owner: Owner) =>
  Effect.gen(function*() {
    const list = yield* callAs(owner, LIST)
    expect(list.status).toBe(200)
    expect(list.body).toEqual({ secrets: [] })
  })

const HEADER = { alg: "ES256K", typ: "JWT" }

describe("service auth", () => {
  layer(apiLayer({ api: { limits: { failedAuthPerAddress: { limit: 10_000, perMs: 60_000 } } } }))((it) => {
    it.effect("a genuine token of the PDS's kind is accepted (ES256K and ES256)", () =>
      Effect.gen(function*() {
        yield* wallClock
        for (const kind of ["k256", "p256"] as const) {
          const owner = yield* newOwner(kind)
          const created = yield* callAs(owner, CREATE, { body: { name: "main" } })
          expect(created.status).toBe(200)
          // audience with the service id, as a PDS proxy addresses it
          const token = yield* mint(owner, LIST, { aud: `${SERVICE_DID}#firehook` })
          const listed = yield* call(LIST, { token })
          expect(listed.status).toBe(200)
          expect(listed.body).toMatchObject({ secrets: [{ name: "main" }] })
          // typ may be absent; the scheme's case does not matter
          const alg = kind === "k256" ? "ES256K" : "ES256"
          const untyped = yield* forge(owner.key, { alg }, claims(owner, LIST))
          expect((yield* call(LIST, { headers: { authorization: `bearer ${untyped}` } })).status).toBe(200)
        }
      }))

    it.effect("refusals: each 401, body unread, nothing done", () =>
      Effect.gen(function*() {
        yield* wallClock
        const alice = yield* newOwner()
        const bob = yield* newOwner()
        const stranger = yield* keypair()
        const c = (extra: object = {}) => claims(alice, CREATE, extra)
        const cases: ReadonlyArray<readonly [string, Effect.Effect<string | undefined>, string]> = [
          ["no token", Effect.succeed(undefined), "AuthenticationRequired"],
          ["malformed token", Effect.succeed("not.a-token"), "InvalidToken"],
          ["not a JWT at all", Effect.succeed("garbage"), "InvalidToken"],
          ["alg: none", forge(alice.key, { alg: "none", typ: "JWT" }, c()), "InvalidToken"],
          ["alg: HS256", forge(alice.key, { alg: "HS256", typ: "JWT" }, c()), "InvalidToken"],
          ["a key that is not the issuer's", forge(stranger, HEADER, c()), "BadJwtSignature"],
          ["another DID's key", forge(bob.key, HEADER, c()), "BadJwtSignature"],
          ["aud of another service", forge(alice.key, HEADER, c({ aud: "did:web:other.example" })), "InvalidToken"],
          ["missing lxm", forge(alice.key, HEADER, { ...c(), lxm: undefined }), "InvalidToken"],
          ["lxm of another method", forge(alice.key, HEADER, c({ lxm: LIST })), "InvalidToken"],
          ["expired", forge(alice.key, HEADER, c({ iat: nowS() - 600, exp: nowS() - 120 })), "ExpiredToken"],
          ["exp more than 1 h ahead", forge(alice.key, HEADER, c({ exp: nowS() + 3700 })), "InvalidToken"],
          ["iat in the future", forge(alice.key, HEADER, c({ iat: nowS() + 120, exp: nowS() + 300 })), "InvalidToken"],
          ["typ at+jwt (an access token)", forge(alice.key, { alg: "ES256K", typ: "at+jwt" }, c()), "InvalidToken"],
          ["typ refresh+jwt", forge(alice.key, { alg: "ES256K", typ: "refresh+jwt" }, c()), "InvalidToken"],
          ["typ dpop+jwt", forge(alice.key, { alg: "ES256K", typ: "dpop+jwt" }, c()), "InvalidToken"],
          ["typ JOSE (only JWT or none)", forge(alice.key, { alg: "ES256K", typ: "JOSE" }, c()), "InvalidToken"],
          ["kid of another key", forge(alice.key, { ...HEADER, kid: "#atproto_label" }, c()), "InvalidToken"],
          ["ES256 header on a secp256k1 key", forge(alice.key, { alg: "ES256", typ: "JWT" }, c()), "InvalidToken"],
          ["no jti", forge(alice.key, HEADER, { ...c(), jti: undefined }), "InvalidToken"],
          ["iss with a fragment", forge(alice.key, HEADER, c({ iss: `${alice.did}#atproto_pds` })), "InvalidToken"],
          ["iss of an unknown DID", forge(alice.key, HEADER, c({ iss: newDid() })), "InvalidToken"]
        ]
        for (const [what, token, error] of cases) {
          const t = yield* token
          yield* refusedUnread(t, error, what)
        }
        // a Basic scheme is no bearer token
        const basic = yield* call(LIST, { headers: { authorization: "Basic YWxpY2U6cHc=" } })
        expect([basic.status, basic.body["error"]]).toEqual([401, "AuthenticationRequired"])
        expect(basic.headers["www-authenticate"]).toBe("Bearer error=\"AuthenticationRequired\"")
        yield* noSecrets(alice)
      }))

    it.effect("a replayed jti is refused (401), the first use is not", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const token = yield* mint(owner, LIST)
        expect((yield* call(LIST, { token })).status).toBe(200)
        const again = yield* call(LIST, { token })
        expect([again.status, again.body["error"]]).toEqual([401, "InvalidToken"])
        // the same jti from another issuer is another token
        const other = yield* newOwner()
        const jti = "shared-jti-0123456789"
        const first = yield* forge(owner.key, HEADER, claims(owner, LIST, { jti }))
        const second = yield* forge(other.key, HEADER, claims(other, LIST, { jti }))
        expect((yield* call(LIST, { token: first })).status).toBe(200)
        expect((yield* call(LIST, { token: second })).status).toBe(200)
        // control: an accepted token's call does wait for its body (so an answer without it means unread)
        const replayed = yield* forge(owner.key, HEADER, claims(owner, CREATE, { jti: "replayed-create" }))
        const port = yield* serverPort
        expect(yield* unfinishedPost(port, CREATE, { authorization: `Bearer ${replayed}` }, { waitMs: 1000 })).toBe(
          "no answer"
        )
        yield* refusedUnread(replayed, "InvalidToken")
      }))

    it.effect("key rotation: after a failed signature the document is fetched once more", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        expect((yield* callAs(owner, LIST)).status).toBe(200) // the document (old key) is cached
        const rotated = yield* keypair()
        docs.set(owner.did, didDocument(owner.did, rotated.multikey))
        const signed = (key: typeof rotated) => forge(key, HEADER, claims(owner, LIST))
        // within 10 s of the last fetch the cache is trusted (forged tokens cannot force fetches)
        const early = yield* call(LIST, { token: yield* signed(rotated) })
        expect([early.status, early.body["error"]]).toEqual([401, "BadJwtSignature"])
        yield* TestClock.adjust(FRESH_REFETCH_MIN_INTERVAL_MS)
        expect((yield* call(LIST, { token: yield* signed(rotated) })).status).toBe(200)
        // the old key no longer verifies
        const old = yield* call(LIST, { token: yield* forge(owner.key, HEADER, claims(owner, LIST)) })
        expect([old.status, old.body["error"]]).toEqual([401, "BadJwtSignature"])
      }))

    it.effect("an issuer whose document is not one is refused (401); an unreachable directory is 502", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        docs.set(owner.did, "not a document")
        const invalid = yield* callAs(owner, LIST)
        expect([invalid.status, invalid.body["error"]]).toEqual([401, "InvalidToken"])
        const other = yield* newOwner()
        const plc = yield* Plc
        const handler = plc.handler
        plc.handler = (req) =>
          req.path.includes(other.did) ? { status: 500, body: "{\"error\":\"InternalServerError\"}" } : handler(req)
        const down = yield* callAs(other, LIST).pipe(Effect.ensuring(Effect.sync(() => (plc.handler = handler))))
        expect([down.status, down.body["error"]]).toEqual([502, "UpstreamFailure"])
      }))
  })
})

const nowS = () => Math.floor(Date.now() / 1000)

// A did:web with a port: atproto's audience grammar (and so the verifier library's token parser) has
// no port outside localhost, but SPEC §8.2 accepts `<SERVICE_DID>#firehook` for every service DID.
const PORT_DID = "did:web:hooks.example.com%3A8443"

describe("service auth, a did:web service DID with a port", () => {
  layer(
    apiLayer({
      env: { SERVICE_DID: "", PUBLIC_URL: "https://hooks.example.com:8443" },
      api: { limits: { failedAuthPerAddress: { limit: 10_000, perMs: 60_000 } } }
    })
  )((it) => {
    it.effect("aud = SERVICE_DID and aud = SERVICE_DID#firehook are both accepted (ES256K and ES256)", () =>
      Effect.gen(function*() {
        yield* wallClock
        for (const kind of ["k256", "p256"] as const) {
          const owner = yield* newOwner(kind)
          const bare = yield* call(LIST, { token: yield* mint(owner, LIST, { aud: PORT_DID }) })
          expect([kind, bare.status]).toEqual([kind, 200])
          const fragment = yield* call(LIST, { token: yield* mint(owner, LIST, { aud: `${PORT_DID}#firehook` }) })
          expect([kind, fragment.status, fragment.text]).toEqual([kind, 200, "{\"secrets\":[]}"])
          // the method runs as the caller
          const token = yield* mint(owner, CREATE, { aud: `${PORT_DID}#firehook` })
          expect((yield* call(CREATE, { token, body: { name: "main" } })).status).toBe(200)
          const listed = yield* call(LIST, { token: yield* mint(owner, LIST, { aud: `${PORT_DID}#firehook` }) })
          expect(listed.body).toMatchObject({ secrets: [{ name: "main" }] })
        }
      }))

    it.effect("with that audience every other rule still holds: each refusal 401, body unread, nothing done", () =>
      Effect.gen(function*() {
        yield* wallClock
        const alice = yield* newOwner()
        const bob = yield* newOwner()
        const stranger = yield* keypair()
        const aud = `${PORT_DID}#firehook`
        const c = (extra: object = {}) => claims(alice, CREATE, { aud, ...extra })
        const cases: ReadonlyArray<readonly [string, Effect.Effect<string>, string]> = [
          ["a key that is not the issuer's", forge(stranger, HEADER, c()), "BadJwtSignature"],
          ["another DID's key", forge(bob.key, HEADER, c()), "BadJwtSignature"],
          ["a tampered payload", Effect.map(forge(alice.key, HEADER, c()), tamper), "BadJwtSignature"],
          [
            "no signature bytes",
            Effect.map(forge(alice.key, HEADER, c()), (t) => `${t.slice(0, t.lastIndexOf("."))}.AA`),
            "BadJwtSignature"
          ],
          ["another service id", forge(alice.key, HEADER, c({ aud: `${PORT_DID}#other` })), "InvalidToken"],
          [
            "another port",
            forge(alice.key, HEADER, c({ aud: "did:web:hooks.example.com%3A8444#firehook" })),
            "InvalidToken"
          ],
          ["lxm of another method", forge(alice.key, HEADER, c({ lxm: LIST })), "InvalidToken"],
          ["expired", forge(alice.key, HEADER, c({ iat: nowS() - 600, exp: nowS() - 120 })), "ExpiredToken"],
          ["exp more than 1 h ahead", forge(alice.key, HEADER, c({ exp: nowS() + 3700 })), "InvalidToken"],
          [
            "iat more than 1 h ago",
            forge(alice.key, HEADER, c({ iat: nowS() - 3700, exp: nowS() + 60 })),
            "InvalidToken"
          ],
          ["nbf in the future", forge(alice.key, HEADER, c({ nbf: nowS() + 120 })), "InvalidToken"],
          ["exp not after iat", forge(alice.key, HEADER, c({ iat: nowS() + 20, exp: nowS() + 20 })), "InvalidToken"],
          ["typ at+jwt", forge(alice.key, { alg: "ES256K", typ: "at+jwt" }, c()), "InvalidToken"],
          ["kid of another key", forge(alice.key, { ...HEADER, kid: "#atproto_label" }, c()), "InvalidToken"],
          ["ES256 header on a secp256k1 key", forge(alice.key, { alg: "ES256", typ: "JWT" }, c()), "InvalidToken"],
          ["no jti", forge(alice.key, HEADER, { ...c(), jti: undefined }), "InvalidToken"],
          ["iss of an unknown DID", forge(alice.key, HEADER, c({ iss: newDid() })), "InvalidToken"]
        ]
        for (const [what, token, error] of cases) {
          yield* refusedUnread(yield* token, error, what)
        }
        const listed = yield* call(LIST, { token: yield* mint(alice, LIST, { aud }) })
        expect([listed.status, listed.body]).toEqual([200, { secrets: [] }])
      }))

    it.effect("nbf: now, or up to 30 s ahead (clock skew), is accepted; beyond that refused", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const aud = `${PORT_DID}#firehook`
        for (const ahead of [-60, 0, 20]) {
          const token = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud, nbf: nowS() + ahead }))
          expect([ahead, (yield* call(LIST, { token })).status]).toEqual([ahead, 200])
        }
        const early = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud, nbf: nowS() + 45 }))
        const refused = yield* call(LIST, { token: early })
        expect([refused.status, refused.body["error"]]).toEqual([401, "InvalidToken"])
      }))

    it.effect("iat: up to 1 h old is accepted (3,600 s), older refused, as the library's maxAge", () =>
      Effect.gen(function*() {
        // firehook's own steps read the Effect Clock: a whole second, exactly
        const t = nowS()
        yield* TestClock.setTime(t * 1000)
        const owner = yield* newOwner()
        const aud = `${PORT_DID}#firehook`
        const at = (age: number) => forge(owner.key, HEADER, claims(owner, LIST, { aud, iat: t - age, exp: t + 60 }))
        expect((yield* call(LIST, { token: yield* at(3600) })).status).toBe(200)
        const old = yield* call(LIST, { token: yield* at(3601) })
        expect([old.status, old.body["error"]]).toEqual([401, "InvalidToken"])
      }))

    it.effect("a replayed jti is refused; a rotated key is fetched once more", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const aud = `${PORT_DID}#firehook`
        const token = yield* mint(owner, LIST, { aud })
        expect((yield* call(LIST, { token })).status).toBe(200)
        const again = yield* call(LIST, { token })
        expect([again.status, again.body["error"]]).toEqual([401, "InvalidToken"])
        // the same jti under the bare DID is the same token id of the same issuer: refused too
        const jti = "port-did-jti-0123456789"
        expect(
          (yield* call(LIST, { token: yield* forge(owner.key, HEADER, claims(owner, LIST, { aud, jti })) })).status
        )
          .toBe(200)
        const bare = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud: PORT_DID, jti }))
        expect((yield* call(LIST, { token: bare })).status).toBe(401)

        const rotated = yield* keypair()
        docs.set(owner.did, didDocument(owner.did, rotated.multikey))
        const signed = (key: typeof rotated) => forge(key, HEADER, claims(owner, LIST, { aud }))
        const early = yield* call(LIST, { token: yield* signed(rotated) })
        expect([early.status, early.body["error"]]).toEqual([401, "BadJwtSignature"])
        yield* TestClock.adjust(FRESH_REFETCH_MIN_INTERVAL_MS)
        expect((yield* call(LIST, { token: yield* signed(rotated) })).status).toBe(200)
        const old = yield* call(LIST, { token: yield* forge(owner.key, HEADER, claims(owner, LIST, { aud })) })
        expect([old.status, old.body["error"]]).toEqual([401, "BadJwtSignature"])
      }))

    it.effect("an unreachable directory is 502, as on the library's path", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const plc = yield* Plc
        const handler = plc.handler
        plc.handler = (req) =>
          req.path.includes(owner.did) ? { status: 500, body: "{\"error\":\"InternalServerError\"}" } : handler(req)
        const down = yield* call(LIST, { token: yield* mint(owner, LIST, { aud: `${PORT_DID}#firehook` }) }).pipe(
          Effect.ensuring(Effect.sync(() => (plc.handler = handler)))
        )
        expect([down.status, down.body["error"]]).toEqual([502, "UpstreamFailure"])
      }))
  })
})

/** The token with one character of its payload changed (its signature no longer matches). */
const tamper = (token: string): string => {
  const [h = "", p = "", s = ""] = token.split(".")
  const claims = JSON.parse(Buffer.from(p, "base64url").toString("utf8")) as Record<string, unknown>
  const changed = Buffer.from(JSON.stringify({ ...claims, jti: `${String(claims["jti"])}x` })).toString("base64url")
  return `${h}.${changed}.${s}`
}
