/**
 * The owners' CLI's service tokens do not depend on the owner's machine clock (SPEC §8.6): the CLI
 * asks `getServiceAuth` for no `exp`, so the PDS gives the token its default life (iat + 60 s) by
 * its own clock. With an `exp` computed from a slow local clock, a reference PDS refuses the call
 * (`BadExpiration: expiration is in past`, @atproto/pds getServiceAuth) and no `hooks status|
 * secrets …` command could run; a fast clock would mint tokens living longer than 60 s.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import * as SecretLexicon from "../../src/schemas/SecretLexicon.js"
import { type FakePds, fakePds, PDS_DID } from "./hook-records-fake-pds.js"
import { run } from "./hook-records-support.js"
import { checked, FAKE_DID, startFake } from "./owner-api-fake.js"

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8").toString("base64url")
const HOUR_S = 3_600

/** `getServiceAuth` as the reference PDS answers it, by the PDS's (the wall) clock. */
const referenceServiceAuth = (pds: FakePds) =>
  pds.override.set("com.atproto.server.getServiceAuth", (call) => {
    const now = Math.floor(Date.now() / 1000)
    const asked = call.query.get("exp")
    const exp = asked === null ? now + 60 : Number(asked)
    if (exp < now) return { status: 400, body: { error: "BadExpiration", message: "expiration is in past" } }
    if (exp - now > HOUR_S) {
      return {
        status: 400,
        body: {
          error: "BadExpiration",
          message: "cannot request a token with an expiration more than an hour in the future"
        }
      }
    }
    const claims = { iss: PDS_DID, aud: call.query.get("aud"), lxm: call.query.get("lxm"), iat: now, exp }
    return { status: 200, body: { token: `${b64({ alg: "ES256K", typ: "JWT" })}.${b64(claims)}.c2ln` } }
  })

const fakeService = Effect.acquireRelease(Effect.promise(startFake), (f) => Effect.promise(() => f.close()))

describe("owners' CLI service tokens and the local clock", () => {
  for (const skew of [-120_000, 7_200_000]) {
    it.scoped(`\`hooks secrets list\` works with the machine clock ${skew / 1000} s off; no exp is asked for`, () =>
      Effect.gen(function*() {
        const pds = yield* fakePds
        referenceServiceAuth(pds)
        const service = yield* fakeService
        service.answers.set("place.wisp.v2.secret.list", () => ({
          status: 200,
          body: checked(SecretLexicon.list, { secrets: [] })
        }))
        yield* TestClock.setTime(Date.now() + skew)
        const r = yield* run(pds, ["secrets", "list", "--json", "--service", service.url, "--service-did", FAKE_DID])
        expect([r.code, r.line]).toEqual([0, ""])
        expect(JSON.parse(r.stdout)).toEqual({ secrets: [] })
        const asked = pds.calls.filter((c) => c.nsid === "com.atproto.server.getServiceAuth")
        expect(asked).toHaveLength(1)
        expect(asked.map((c) => [c.query.get("aud"), c.query.get("lxm"), c.query.has("exp")])).toEqual([
          [FAKE_DID, "place.wisp.v2.secret.list", false]
        ])
        // the service got the call, with the token the PDS minted (checked by the fake: aud, lxm, exp)
        expect(service.calls.map((c) => c.nsid)).toEqual(["place.wisp.v2.secret.list"])
      }))
  }
})
