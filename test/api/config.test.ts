/**
 * The owners' API configuration (SPEC §8.1, §6.5): `API_HOST`, `API_PORT`, `PUBLIC_URL`,
 * `SERVICE_DID`, `API_TRUST_PROXY`, parsed strictly; the service DID derived from `PUBLIC_URL`.
 */
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Option } from "effect"
import { didWebOf, isServiceDid, parsePublicUrl } from "../../src/services/api/ApiConfig.js"
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
        trustProxy: false
      })
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
    expect(didWebOf("https://a.example")).toBe("did:web:a.example")
    expect(didWebOf("http://127.0.0.1:9")).toBe("did:web:127.0.0.1%3A9")
    expect(isServiceDid("did:web:a.example%3A443")).toBe(true)
    expect(isServiceDid("did:web:a.example%3A")).toBe(false)
    expect(isServiceDid("did:web:A.example")).toBe(false)
  })
})
