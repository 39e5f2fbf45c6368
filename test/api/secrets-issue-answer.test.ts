/**
 * `place.wisp.v2.secret.create` / `rotate` answer from their write alone (SPEC §1.3, §8.4: the token
 * is shown only by the call that stored it). The times come back from the INSERT / UPDATE itself
 * (`RETURNING`), so no second statement can fail after the write committed: a rotation that took
 * effect is never answered 500 (the new token thrown away while the old one no longer signs). And
 * the call's 10 s deadline (Xrpc.ts) interrupts a write still under way, so a 504 leaves the store
 * as it was: the old token still signs. The app runs here directly over the in-memory store.
 */
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Duration, Effect, Either, Fiber, TestClock } from "effect"
import { randomBytes } from "node:crypto"
import { makeBuckets } from "../../src/services/api/RateLimiter.js"
import * as SecretMethods from "../../src/services/api/SecretMethods.js"
import * as Xrpc from "../../src/services/api/Xrpc.js"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import {
  make as makeSecrets,
  makeMemoryStore,
  Secrets,
  SecretsError,
  type SecretsStoreShape
} from "../../src/services/delivery/Secrets.js"
import * as RateLimitedLog from "../../src/services/platform/RateLimitedLog.js"

const OWNER = "did:plc:" + "a".repeat(24)
const keyring = Either.getOrThrow(SecretBox.makeKeyring(Uint8Array.from(randomBytes(32)), []))

/** The app over the secret methods, with a verifier that accepts every token as OWNER's. */
const deps: Xrpc.PipelineDeps<Secrets> = {
  methods: new Map(SecretMethods.SECRET_METHODS.map((m) => [m.contract.nsid, m])),
  auth: { verify: () => Effect.succeed({ did: OWNER }), replayEntries: Effect.succeed(0) },
  trustProxy: false,
  didDocument: undefined,
  limiters: {
    failedAuth: makeBuckets({ limit: 100, perMs: 60_000 }, 10),
    calls: makeBuckets({ limit: 100, perMs: 60_000 }, 10),
    methods: new Map()
  },
  counters: { calls: 0, authFailures: 0, rateLimited: 0 },
  log: RateLimitedLog.make(),
  deadline: Xrpc.CALL_DEADLINE,
  maxBodyBytes: Xrpc.MAX_BODY_BYTES
}

/** A store whose reads (get, list) fail while `broken` is set: the connection dropped after the write. */
const storeWithFailingReads = Effect.gen(function*() {
  const base = yield* makeMemoryStore
  const state = { broken: false, reads: 0 }
  const failed = Effect.fail(new SecretsError({ reason: "store", code: "57P01" }))
  const store: SecretsStoreShape = {
    ...base,
    get: (
      owner,
      name
    ) => (state.broken ? Effect.zipRight(Effect.sync(() => state.reads++), failed) : base.get(owner, name)),
    list: (owner) => (state.broken ? Effect.zipRight(Effect.sync(() => state.reads++), failed) : base.list(owner))
  }
  return { store, state }
})

/** POST `place.wisp.v2.secret.<m>` {name} through the app; status and JSON body. */
const post = (secrets: Secrets["Type"], m: "create" | "rotate", name: string) =>
  Effect.gen(function*() {
    const request = HttpServerRequest.fromWeb(
      new Request(`http://127.0.0.1/xrpc/place.wisp.v2.secret.${m}`, {
        method: "POST",
        headers: { authorization: "Bearer x", "content-type": "application/json" },
        body: JSON.stringify({ name })
      })
    )
    const response = yield* Xrpc.app(deps).pipe(
      Effect.provideService(HttpServerRequest.HttpServerRequest, request),
      Effect.provideService(Secrets, secrets),
      Effect.scoped
    )
    const body = yield* Effect.promise(() =>
      HttpServerResponse.toWeb(response).json() as Promise<Record<string, unknown>>
    )
    return { status: response.status, body }
  })

describe("secret create / rotate answer from their write alone", () => {
  it.effect("rotate: every read after the UPDATE fails, yet the call answers the token it stored and its time", () =>
    Effect.gen(function*() {
      const { state, store } = yield* storeWithFailingReads
      const secrets = yield* makeSecrets(store, keyring, { cacheTtl: 0 })
      const original = (yield* secrets.create(OWNER, "main")).token

      state.broken = true
      const rotated = yield* post(secrets, "rotate", "main")
      state.broken = false

      expect(rotated.status, "the rotation took effect, so the call must answer its token").toBe(200)
      expect(state.reads).toBe(0)
      const stored = yield* secrets.resolve(OWNER, "main")
      expect(stored).not.toBe(original)
      expect(rotated.body["token"], "the answered token is the one that now signs").toBe(stored)
      const [row] = yield* secrets.list(OWNER)
      expect(rotated.body["rotatedAt"]).toBe(row?.rotatedAt?.toISOString())
    }))

  it.effect("create: every read after the INSERT fails, yet the call answers the token it stored and its time", () =>
    Effect.gen(function*() {
      const { state, store } = yield* storeWithFailingReads
      const secrets = yield* makeSecrets(store, keyring, { cacheTtl: 0 })
      yield* TestClock.setTime(Date.UTC(2025, 0, 2, 3, 4, 5, 678))

      state.broken = true
      const created = yield* post(secrets, "create", "main")
      state.broken = false

      expect(created.status).toBe(200)
      expect(created.body["token"]).toBe(yield* secrets.resolve(OWNER, "main"))
      expect(created.body["createdAt"]).toBe("2025-01-02T03:04:05.678Z")
      expect((yield* secrets.list(OWNER))[0]?.createdAt.toISOString()).toBe("2025-01-02T03:04:05.678Z")
    }))

  it.effect("the call's deadline interrupts a rotation still writing: 504, and the old token still signs (TestClock)", () =>
    Effect.gen(function*() {
      const base = yield* makeMemoryStore
      // the UPDATE would commit only after the 10 s deadline
      const slow: SecretsStoreShape = {
        ...base,
        update: (owner, name, envelope) =>
          Effect.zipRight(
            Effect.sleep(Duration.sum(Xrpc.CALL_DEADLINE, "1 second")),
            base.update(owner, name, envelope)
          )
      }
      const secrets = yield* makeSecrets(slow, keyring, { cacheTtl: 0 })
      const original = (yield* secrets.create(OWNER, "main")).token

      const fiber = yield* Effect.fork(post(secrets, "rotate", "main"))
      yield* Effect.repeat(TestClock.sleeps(), { until: (sleeps) => Chunk.size(sleeps) >= 2 })
      yield* TestClock.adjust(Xrpc.CALL_DEADLINE)
      // past the time the write would have committed (had the deadline waited for it)
      yield* TestClock.adjust("1 second")
      const answer = yield* Fiber.join(fiber)
      expect([answer.status, answer.body["error"]]).toEqual([504, "UpstreamTimeout"])
      expect(yield* secrets.resolve(OWNER, "main"), "a 504 must leave the old token signing").toBe(original)
      expect((yield* secrets.list(OWNER))[0]?.rotatedAt).toBeUndefined()
    }))
})
