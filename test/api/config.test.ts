/**
 * The owners' API configuration (SPEC §8.1, §6.5): `API_HOST`, `API_PORT`, `PUBLIC_URL`,
 * `SERVICE_DID`, `API_TRUST_PROXY`, parsed strictly; the service DID derived from `PUBLIC_URL`.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Duration, Effect, Either, Option } from "effect"
import { limitsOf } from "../../src/services/api/Api.js"
import { didWebOf, isServiceDid, parsePublicUrl } from "../../src/services/api/ApiConfig.js"
import { DEFAULT_LIMITS } from "../../src/services/api/RateLimiter.js"
import { DEFAULT_REPLAY_CAPACITY } from "../../src/services/api/ReplayCache.js"
import { CALL_DEADLINE, MAX_BODY_BYTES } from "../../src/services/api/Xrpc.js"
import * as Config from "../../src/services/platform/Config.js"

const load = (env: Record<string, string>) =>
  Config.load({ isTty: false }).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))))

const DEV = { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }

describe("ApiConfig", () => {
  it.effect("defaults: 127.0.0.1:3004, not configured, proxy not trusted", () =>
    Effect.gen(function*() {
      const c = yield* load({})
      expect(c.api).toEqual({
        host: "127.0.0.1",
        port: 3004,
        publicUrl: Option.none(),
        serviceDid: Option.none(),
        trustProxy: false,
        limits: {
          authFailuresPerMinute: 30,
          callsPerMinute: 120,
          testPerMinute: 10,
          replayPerMinute: 2,
          callTimeoutMs: 10_000,
          bodyMaxBytes: 65_536,
          jtiCacheMax: 100_000
        }
      })
    }))

  it.effect("the defaults of the API_* numbers are SPEC §8.2's and §8.3's, as the API's own constants", () =>
    Effect.gen(function*() {
      const c = yield* load({})
      expect(limitsOf(c.api.limits)).toEqual(DEFAULT_LIMITS)
      expect(c.api.limits.callTimeoutMs).toBe(Duration.toMillis(CALL_DEADLINE))
      expect(c.api.limits.bodyMaxBytes).toBe(MAX_BODY_BYTES)
      expect(c.api.limits.jtiCacheMax).toBe(DEFAULT_REPLAY_CAPACITY)
    }))

  it.effect("API_*_PER_MINUTE, API_CALL_TIMEOUT_MS, API_BODY_MAX_BYTES, API_JTI_CACHE_MAX are read", () =>
    Effect.gen(function*() {
      const c = yield* load({
        API_AUTH_FAILURES_PER_MINUTE: "300",
        API_CALLS_PER_MINUTE: "1000",
        API_TEST_PER_MINUTE: "1",
        API_REPLAY_PER_MINUTE: "20",
        API_CALL_TIMEOUT_MS: "30000",
        API_BODY_MAX_BYTES: "1024",
        API_JTI_CACHE_MAX: "1000000"
      })
      expect(limitsOf(c.api.limits)).toEqual({
        failedAuthPerAddress: { limit: 300, perMs: 60_000 },
        callsPerCaller: { limit: 1000, perMs: 60_000 },
        methodRates: {
          "dev.firehook.webhook.test": { limit: 1, perMs: 60_000 },
          "dev.firehook.webhook.replay": { limit: 20, perMs: 60_000 }
        },
        maxKeys: DEFAULT_LIMITS.maxKeys
      })
      expect([c.api.limits.callTimeoutMs, c.api.limits.bodyMaxBytes, c.api.limits.jtiCacheMax]).toEqual([
        30_000,
        1024,
        1_000_000
      ])
    }))

  it.effect("PUBLIC_URL alone: its origin, and SERVICE_DID = did:web of its host (port as %3A)", () =>
    Effect.gen(function*() {
      const a = yield* load({ PUBLIC_URL: "https://hooks.example.com/" })
      expect(a.api.publicUrl).toEqual(Option.some("https://hooks.example.com"))
      expect(a.api.serviceDid).toEqual(Option.some("did:web:hooks.example.com"))
      const b = yield* load({ PUBLIC_URL: "https://Hooks.Example.com:8443" })
      expect(b.api.publicUrl).toEqual(Option.some("https://hooks.example.com:8443"))
      expect(b.api.serviceDid).toEqual(Option.some("did:web:hooks.example.com%3A8443"))
      const dev = yield* load({ ...DEV, PUBLIC_URL: "http://localhost:3004" })
      expect(dev.api.serviceDid).toEqual(Option.some("did:web:localhost%3A3004"))
    }))

  it.effect("SERVICE_DID wins over the derived one; SERVICE_DID alone configures the API", () =>
    Effect.gen(function*() {
      const a = yield* load({ PUBLIC_URL: "https://hooks.example.com", SERVICE_DID: "did:web:firehook.example" })
      expect(a.api.serviceDid).toEqual(Option.some("did:web:firehook.example"))
      const b = yield* load({ SERVICE_DID: "did:plc:abcdefghijklmnopqrstuvwx", API_TRUST_PROXY: "1" })
      expect(b.api.serviceDid).toEqual(Option.some("did:plc:abcdefghijklmnopqrstuvwx"))
      expect(b.api.publicUrl).toEqual(Option.none())
      expect(b.api.trustProxy).toBe(true)
    }))

  it.effect("API_HOST / API_PORT", () =>
    Effect.gen(function*() {
      const c = yield* load({ API_HOST: "::", API_PORT: "0" })
      expect([c.api.host, c.api.port]).toEqual(["::", 0])
    }))

  const invalid: ReadonlyArray<readonly [Record<string, string>, string, string]> = [
    [{ API_HOST: "api.example.com" }, "API_HOST", "IP literal"],
    [{ API_PORT: "65536" }, "API_PORT", "0..65535"],
    [{ API_PORT: "x" }, "API_PORT", "integer"],
    [{ API_TRUST_PROXY: "yes" }, "API_TRUST_PROXY", "0, 1"],
    [{ API_CALLS_PER_MINUTE: "0" }, "API_CALLS_PER_MINUTE", "1..1000000"],
    [{ API_AUTH_FAILURES_PER_MINUTE: "30/min" }, "API_AUTH_FAILURES_PER_MINUTE", "integer"],
    [{ API_TEST_PER_MINUTE: "1000001" }, "API_TEST_PER_MINUTE", "1..1000000"],
    [{ API_REPLAY_PER_MINUTE: "-2" }, "API_REPLAY_PER_MINUTE", "integer"],
    [{ API_CALL_TIMEOUT_MS: "999" }, "API_CALL_TIMEOUT_MS", "1000..60000"],
    [{ API_BODY_MAX_BYTES: "2097152" }, "API_BODY_MAX_BYTES", "1024..1048576"],
    [{ API_JTI_CACHE_MAX: "10" }, "API_JTI_CACHE_MAX", "1000..10000000"],
    [{ PUBLIC_URL: "http://hooks.example.com" }, "PUBLIC_URL", "https"],
    [{ PUBLIC_URL: "http://localhost:3004" }, "PUBLIC_URL", "https"],
    [{ ...DEV, PUBLIC_URL: "http://hooks.example.com" }, "PUBLIC_URL", "loopback"],
    [{ PUBLIC_URL: "https://hooks.example.com/api" }, "PUBLIC_URL", "path"],
    [{ PUBLIC_URL: "https://hooks.example.com/?x=1" }, "PUBLIC_URL", "query"],
    [{ PUBLIC_URL: "https://u:p@hooks.example.com" }, "PUBLIC_URL", "credentials"],
    [{ PUBLIC_URL: "https://[2001:db8::1]" }, "PUBLIC_URL", "SERVICE_DID"],
    [{ PUBLIC_URL: "not-a-url" }, "PUBLIC_URL", "https"],
    [{ PUBLIC_URL: "not a url" }, "PUBLIC_URL", "whitespace"],
    [{ SERVICE_DID: "did:web:hooks.example.com#firehook" }, "SERVICE_DID", "fragment"],
    [{ SERVICE_DID: "did:key:z6Mkabc" }, "SERVICE_DID", "did:plc"],
    [{ SERVICE_DID: "did:plc:short" }, "SERVICE_DID", "did:plc"],
    [{ SERVICE_DID: "did:web:hooks.example.com%3A99999" }, "SERVICE_DID", "did:plc"]
  ]
  for (const [env, variable, rule] of invalid) {
    it.effect(`invalid: ${JSON.stringify(env)}`, () =>
      Effect.gen(function*() {
        const r = yield* Effect.either(load(env))
        expect(Either.isLeft(r)).toBe(true)
        if (Either.isLeft(r)) {
          expect(r.left.variable).toBe(variable)
          expect(r.left.rule).toContain(rule)
        }
      }))
  }

  it("the pure rules", () => {
    expect(parsePublicUrl("https://a.example", false)).toBe("https://a.example")
    expect(parsePublicUrl("http://127.0.0.1:9", true)).toBe("http://127.0.0.1:9")
    expect(parsePublicUrl("http://127.0.0.1:9", false)).toBeUndefined()
    // http:// to any loopback host (localhost, 127.0.0.0/8, ::1), never to another or a mapped form
    expect(parsePublicUrl("http://localhost:9", true)).toBe("http://localhost:9")
    expect(parsePublicUrl("http://127.9.8.7", true)).toBe("http://127.9.8.7")
    expect(parsePublicUrl("http://[::1]:9", true)).toBe("http://[::1]:9")
    expect(parsePublicUrl("http://[::ffff:127.0.0.1]:9", true)).toBeUndefined()
    expect(parsePublicUrl("http://10.0.0.1", true)).toBeUndefined()
    expect(parsePublicUrl("http://localhost.example.com", true)).toBeUndefined()
    expect(didWebOf("https://a.example")).toBe("did:web:a.example")
    expect(didWebOf("http://127.0.0.1:9")).toBe("did:web:127.0.0.1%3A9")
    expect(isServiceDid("did:web:a.example%3A443")).toBe(true)
    expect(isServiceDid("did:web:a.example%3A")).toBe(false)
    expect(isServiceDid("did:web:A.example")).toBe(false)
  })
})
