// Mutation audit of ConfigRead / Config (SPEC §6.5 strict parsing): the edges the main config
// suite left open. Every case goes through `Config.load`, as startup does.
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Option } from "effect"
import * as Config from "../../src/services/platform/Config.js"

const load = (env: Record<string, string>) =>
  Config.load({ isTty: false }).pipe(Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))))

const refusal = (env: Record<string, string>) =>
  Effect.gen(function*() {
    const result = yield* Effect.either(load(env))
    if (Either.isRight(result)) return yield* Effect.die(`accepted ${JSON.stringify(env)}`)
    return result.left
  })

describe("Config strict parsing (audit)", () => {
  // SPEC §6.5: an enumeration is closed and exact; a value with a stray space is not the value it
  // resembles (` test` must not open the insecure mode's NODE_ENV, `info ` is not a log level)
  const padded: ReadonlyArray<readonly [string, string]> = [
    ["NODE_ENV", " test"],
    ["NODE_ENV", "development "],
    ["LOG_LEVEL", "info "],
    ["LOG_FORMAT", "\tjson"],
    ["WEBHOOK_ALLOW_INSECURE_DEV", "1 "],
    ["FIREHOSE_SOURCE", " relay"]
  ]
  for (const [variable, value] of padded) {
    it.effect(`${variable}=${JSON.stringify(value)} is refused, not trimmed`, () =>
      Effect.gen(function*() {
        const err = yield* refusal({ [variable]: value })
        expect(err.variable).toBe(variable)
        expect(err.message).toContain("must be one of")
        expect(err.message).not.toContain("\n")
      }))
  }

  // the URL length bounds are inclusive: 2,048 characters for a service or stream URL, 4,096 for DATABASE_URL
  const sized = (prefix: string, length: number) => `${prefix}${"a".repeat(length - prefix.length)}`
  const urls: ReadonlyArray<readonly [string, string, number]> = [
    ["PLC_DIRECTORY_URL", "https://plc.example/", 2048],
    ["OWNER_DISCOVERY_URL", "https://relay.example/", 2048],
    ["JETSTREAM_URL", "wss://jetstream.example/", 2048],
    ["DATABASE_URL", "postgresql://db.example/", 4096]
  ]
  for (const [variable, prefix, max] of urls) {
    it.effect(`${variable}: ${max} characters load, ${max + 1} are refused`, () =>
      Effect.gen(function*() {
        yield* load({ [variable]: sized(prefix, max) })
        const err = yield* refusal({ [variable]: sized(prefix, max + 1) })
        expect(err.variable).toBe(variable)
      }))
  }

  // SPEC §5.1: a service base URL carries no credentials, a user name alone included
  for (const variable of ["PLC_DIRECTORY_URL", "OWNER_DISCOVERY_URL"]) {
    it.effect(`${variable} with a user name and no password is refused`, () =>
      Effect.gen(function*() {
        const err = yield* refusal({ [variable]: "https://operator@relay.example" })
        expect(err.variable).toBe(variable)
        expect(err.message).toContain("credentials")
        expect(err.message).not.toContain("operator")
      }))
  }

  // every trailing slash goes (paths are joined to these URLs: `//xrpc/...` is another path)
  it.effect("PLC_DIRECTORY_URL / OWNER_DISCOVERY_URL lose every trailing slash, not only the last", () =>
    Effect.gen(function*() {
      const c = yield* load({
        PLC_DIRECTORY_URL: "https://plc.example///",
        OWNER_DISCOVERY_URL: "https://relay.example//"
      })
      expect(c.backfill.plcDirectoryUrl).toBe("https://plc.example")
      expect(c.backfill.ownerDiscoveryUrl).toEqual(Option.some("https://relay.example"))
    }))

  // SPEC §6.5: a listen address is an IP literal of at most 64 characters; Node's isIP takes an
  // IPv6 zone of any length (`fe80::1%<anything>`), the bound refuses a long one
  for (const variable of ["HEALTH_HOST", "API_HOST"]) {
    it.effect(`${variable}: a 65-character zoned IPv6 literal is refused`, () =>
      Effect.gen(function*() {
        const err = yield* refusal({ [variable]: `fe80::1%${"z".repeat(57)}` })
        expect(err.variable).toBe(variable)
        expect(err.message).toContain("must be an IP literal or localhost")
      }))
  }

  // Config.load reads the sections in a fixed order, so the first invalid variable reported is
  // always the same one: with one broken variable per section, each is reported once those before it are fixed
  it.effect("several invalid variables: the one of the earliest section is reported", () =>
    Effect.gen(function*() {
      const order = [
        "HEALTH_PORT",
        "REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX",
        "WEBHOOK_INTAKE_QUEUE_MAX",
        "DELIVERY_CONCURRENCY",
        "RETENTION_DELIVERED_MS",
        "BACKFILL_CONCURRENCY",
        "IDENTITY_CACHE_STALE_MS",
        "RECONCILE_PAGE_RECORDS",
        "PRIOR_REFS_TTL_MS",
        "RETRY_SCHEDULER_CONCURRENCY",
        "API_PORT"
      ]
      for (let i = 0; i < order.length; i++) {
        const env = Object.fromEntries(order.slice(i).map((name) => [name, "x"]))
        expect((yield* refusal(env)).variable).toBe(order[i])
      }
    }))
})
