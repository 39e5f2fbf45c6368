/**
 * Generic over the served method table (so every method added to it is covered): each has a
 * lexicon of its kind in `lexicons/`; its answers to calls with generated valid inputs are valid
 * under its lexicon (outputs checked with atproto's own validator and the method's Schema, errors
 * `{error, message}` with a generic or lexicon-declared name), and some of them reach the handler
 * (a 200 or a lexicon-declared error, not only generic refusals); and a property test throws random
 * bytes, random JSON, random query strings and random tokens at every method while the listener
 * keeps answering, never with a 500.
 */
import { Lexicons } from "@atproto/lexicon"
import type * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Arbitrary, Effect, FastCheck, Runtime, Schema, TestClock } from "effect"
import * as Api from "../../src/services/api/Api.js"
import type { ApiMethod } from "../../src/services/api/Methods.js"
import { insertWebhook } from "../support/webhookRows.js"
import { apiLayer, call, type CallOptions, lexiconDocs, mint, newOwner } from "./support.js"

const lex = new Lexicons(lexiconDocs())
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const GENERIC_ERRORS = ["InvalidRequest", "RateLimitExceeded", "NotConfigured", "InternalServerError"]
const HIGH = { limit: 1_000_000, perMs: 60_000 }

const declaredErrors = (nsid: string): ReadonlyArray<string> => {
  const def = lex.getDefOrThrow(nsid)
  return "errors" in def ? (def.errors ?? []).map((e) => e.name) : []
}

/** The query string of a params value (encoded by the method's Schema). */
const queryOf = (m: ApiMethod<Api.ServedRequirements>, params: unknown): string => {
  const raw = Schema.encodeSync(m.contract.params)(params) as Record<string, string | ReadonlyArray<string> | undefined>
  const q = new URLSearchParams()
  for (const [k, v] of Object.entries(raw)) {
    if (v === undefined) continue
    for (const x of typeof v === "string" ? [v] : v) q.append(k, x)
  }
  return q.toString()
}

const SEED = 20261115
/** every served method is called ~100 times per test: minutes on a loaded 2-core machine */
const GENERATED_CALLS_TIMEOUT = 240_000

/**
 * What a method needs to exist before a generated call can succeed, by NSID (a method whose
 * generated calls would all be `NotFound` for a new owner): written for the owner and the input.
 */
const PREREQUISITES: {
  readonly [nsid: string]: (ownerDid: string, input: unknown) => Effect.Effect<void, never, SqlClient.SqlClient>
} = {
  "dev.firehook.webhook.resume": (ownerDid, input) => {
    const rkey = (input as { readonly rkey: string }).rkey
    return insertWebhook(ownerDid, rkey).pipe(Effect.catchAllDefect(() => Effect.void))
  }
}

describe("served methods", () => {
  layer(apiLayer({ api: { limits: { callsPerCaller: HIGH, failedAuthPerAddress: HIGH } } }))((it) => {
    it.effect("every served method has a lexicon of its kind", () =>
      Effect.sync(() => {
        expect(Api.SERVED_METHODS.length).toBeGreaterThan(0)
        for (const m of Api.SERVED_METHODS) {
          const def = lex.getDef(m.contract.nsid)
          expect(def?.type).toBe(m.contract.kind)
        }
      }))

    it.effect("answers to generated valid calls are valid under the lexicon", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const ok = new Map<string, number>()
        // the same seed for every method: names one method creates are the ones the next rotates …
        for (const m of Api.SERVED_METHODS) {
          if (m.contract.kind === "subscription") continue
          const nsid = m.contract.nsid
          const params = FastCheck.sample(Arbitrary.make(m.contract.params), { numRuns: 20, seed: SEED })
          const inputs = m.contract.input === undefined
            ? params.map(() => undefined)
            : FastCheck.sample(Arbitrary.make(m.contract.input), { numRuns: 20, seed: SEED })
          for (let i = 0; i < params.length; i++) {
            yield* wallClock
            const input = inputs[i]
            const prerequisite = PREREQUISITES[nsid]
            if (prerequisite !== undefined) yield* prerequisite(owner.did, input)
            const options: CallOptions = {
              token: yield* mint(owner, nsid),
              query: queryOf(m, params[i]),
              ...(m.contract.input === undefined
                ? {}
                : { body: Schema.encodeSync(m.contract.input)(input) })
            }
            const r = yield* call(nsid, options)
            if (r.status === 200) {
              ok.set(nsid, (ok.get(nsid) ?? 0) + 1)
              lex.assertValidXrpcOutput(nsid, r.body)
              Schema.decodeUnknownSync(m.contract.output)(r.body)
            } else {
              expect(Object.keys(r.body).sort()).toEqual(["error", "message"])
              expect([...GENERIC_ERRORS, ...declaredErrors(nsid)]).toContain(r.body["error"])
              // a lexicon-declared error is the handler's answer too (a fresh owner has no
              // delivery or webhook, so getDelivery, redeliver and test answer NotFound)
              if (declaredErrors(nsid).includes(String(r.body["error"]))) ok.set(nsid, (ok.get(nsid) ?? 0) + 1)
            }
          }
        }
        for (const m of Api.SERVED_METHODS) {
          if (m.contract.kind !== "subscription") {
            expect([m.contract.nsid, ok.get(m.contract.nsid) ?? 0]).not.toEqual([m.contract.nsid, 0])
          }
        }
      }), GENERATED_CALLS_TIMEOUT)

    it.effect(
      "property: random bytes, JSON, query strings and tokens at every method; the listener keeps answering",
      () =>
        Effect.gen(function*() {
          yield* wallClock
          const owner = yield* newOwner()
          const runtime = yield* Effect.runtime<Effect.Effect.Context<ReturnType<typeof call>>>()
          const run = Runtime.runPromise(runtime)
          const wellFormed = (r: { status: number; body: { readonly [k: string]: unknown } }) =>
            r.status === 200 ||
            (r.status >= 400 && r.status < 500 && typeof r.body["error"] === "string" &&
              typeof r.body["message"] === "string")
          const body = FastCheck.oneof(
            FastCheck.uint8Array({ maxLength: 4096 }),
            FastCheck.jsonValue({ maxDepth: 4 }).map((v) => new TextEncoder().encode(JSON.stringify(v))),
            FastCheck.record({ name: FastCheck.string({ maxLength: 80 }) }).map((v) =>
              new TextEncoder().encode(JSON.stringify(v))
            )
          )
          const query = FastCheck.oneof(
            FastCheck.string({ maxLength: 200 }).map((s) => encodeURIComponent(s)),
            FastCheck.dictionary(FastCheck.string({ maxLength: 10 }), FastCheck.string({ maxLength: 20 })).map((d) =>
              new URLSearchParams(d).toString()
            )
          )
          for (const m of Api.SERVED_METHODS) {
            const nsid = m.contract.nsid
            yield* wallClock // a slow machine must not age the TestClock past the tokens' iat
            yield* Effect.promise(() =>
              FastCheck.assert(
                FastCheck.asyncProperty(body, query, FastCheck.boolean(), async (bytes, q, post) => {
                  const token = await run(mint(owner, nsid))
                  const r = await run(call(nsid, {
                    token,
                    query: q,
                    ...(post ? { raw: bytes } : {}),
                    method: post ? "POST" : "GET"
                  }))
                  return wellFormed(r)
                }),
                { numRuns: 60, seed: SEED }
              )
            )
            // random tokens: always a 401 refusal
            yield* Effect.promise(() =>
              FastCheck.assert(
                FastCheck.asyncProperty(FastCheck.string({ minLength: 1, maxLength: 300 }), async (t) => {
                  const r = await run(call(nsid, {
                    headers: { authorization: `Bearer ${encodeURIComponent(t)}` },
                    method: m.contract.kind === "procedure" ? "POST" : "GET"
                  }))
                  return r.status === 401 && typeof r.body["error"] === "string"
                }),
                { numRuns: 30, seed: SEED }
              )
            )
          }
          // still serving
          yield* wallClock
          const after = yield* call("place.wisp.v2.secret.list", {
            token: yield* mint(owner, "place.wisp.v2.secret.list")
          })
          expect(after.status).toBe(200)
        }),
      GENERATED_CALLS_TIMEOUT
    )
  })
})
