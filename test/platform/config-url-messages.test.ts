/**
 * The URL variables' startup errors name the cause: a value over the variable's length bound is told
 * its bound, and a stream URL with credentials is told so, instead of the variable's generic "must be
 * a … URL" (which does not say why a well-formed URL is refused). Values at the bound still load.
 * An `ssl` query value pg would read as "TLS on" whatever it says (`ssl=false`) is refused.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Option } from "effect"
import { load, SECRET } from "./config-support.js"

/** `prefix` padded with `a`s in its last path segment to `length` characters */
const padded = (prefix: string, length: number, suffix = ""): string =>
  prefix + "a".repeat(length - prefix.length - suffix.length) + suffix

const refused: ReadonlyArray<readonly [Record<string, string>, string, string]> = [
  [
    { DATABASE_URL: padded(`postgresql://u:${SECRET}@db.example/`, 4097) },
    "DATABASE_URL",
    "must be at most 4096 characters"
  ],
  [{ JETSTREAM_URL: padded("wss://jetstream.example/", 2049) }, "JETSTREAM_URL", "must be at most 2048 characters"],
  [
    { FIREHOSE_SOURCE: "relay", RELAY_URL: padded("wss://relay.example/", 2049) },
    "RELAY_URL",
    "must be at most 2048 characters"
  ],
  [{ PLC_DIRECTORY_URL: padded("https://plc.example/", 2049) }, "PLC_DIRECTORY_URL", "must be at most 2048 characters"],
  [
    { OWNER_DISCOVERY_URL: padded("https://relay.example/", 2049) },
    "OWNER_DISCOVERY_URL",
    "must be at most 2048 characters"
  ],
  [{ PUBLIC_URL: padded("https://", 2049, ".example") }, "PUBLIC_URL", "must be at most 2048 characters"],
  [
    { DATABASE_URL: `postgresql://u:${SECRET}@db.example/firehook?ssl=false` },
    "DATABASE_URL",
    "ssl must be one of true, 1, 0, no-verify (or use sslmode)"
  ],
  [
    { JETSTREAM_URL: `wss://u:${SECRET}@jetstream.example/subscribe` },
    "JETSTREAM_URL",
    "without credentials (user:password@)"
  ],
  [{ JETSTREAM_URL: "wss://u@jetstream.example/subscribe" }, "JETSTREAM_URL", "without credentials (user:password@)"],
  [
    { FIREHOSE_SOURCE: "relay", RELAY_URL: `wss://:${SECRET}@relay.example` },
    "RELAY_URL",
    "without credentials (user:password@)"
  ]
]

describe("Config: the URL variables' errors name the cause", () => {
  for (const [env, variable, rule] of refused) {
    it.effect(`${variable}: ${rule}`, () =>
      Effect.gen(function*() {
        const result = yield* Effect.either(load(env))
        expect(Either.isLeft(result)).toBe(true)
        if (Either.isLeft(result)) {
          expect(result.left._tag).toBe("ConfigInvalid")
          expect(result.left.variable).toBe(variable)
          expect(result.left.message).toContain(rule)
          expect(result.left.message).not.toContain(SECRET)
          expect(result.left.message).not.toContain("\n")
        }
      }))
  }

  it.effect("values at the bounds load", () =>
    Effect.gen(function*() {
      const c = yield* load({
        DATABASE_URL: padded("postgresql://u@db.example/", 4096),
        JETSTREAM_URL: padded("wss://jetstream.example/", 2048),
        PLC_DIRECTORY_URL: padded("https://plc.example/", 2048),
        OWNER_DISCOVERY_URL: padded("https://relay.example/", 2048)
      })
      expect(Option.isSome(c.databaseUrl)).toBe(true)
      expect(c.intake.jetstreamUrl).toHaveLength(2048)
      expect(c.backfill.plcDirectoryUrl).toHaveLength(2048)
    }))

  it.effect("the generic rule still answers a value under the bound that is not such a URL", () =>
    Effect.gen(function*() {
      const result = yield* Effect.either(load({ JETSTREAM_URL: "https://jetstream.example/subscribe" }))
      expect(Either.isLeft(result) && result.left.message).toContain("must be a wss:// URL")
      const db = yield* Effect.either(load({ DATABASE_URL: "mysql://db.example/x" }))
      expect(Either.isLeft(db) && db.left.message).toContain("must be a postgres:// or postgresql:// URL")
    }))
})
