/**
 * Config.load's strict parsing (SPEC §1.2, §6.5): FIREHOOK_DATA_DIR and the URL variables with
 * surrounding whitespace or a control character are refused at startup, and insecure development mode
 * takes only real loopback hosts, never a look-alike name.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { load, SECRET } from "./config-support.js"

describe("Config", () => {
  // SPEC §6.5 (strict parsing): a stray space or control character (`FIREHOOK_DATA_DIR=/data ` in a
  // `docker run --env-file`, which keeps trailing spaces, or in a quoted value) was taken as part of
  // the path, so the embedded PostgreSQL started empty in a new directory beside the real one, its
  // data silently left behind
  describe("FIREHOOK_DATA_DIR with surrounding whitespace or a control character is refused at startup", () => {
    const broken: ReadonlyArray<readonly [string, string]> = [
      ["a trailing space", "/var/lib/firehook "],
      ["a leading space", " /var/lib/firehook"],
      ["only a space", " "],
      ["a trailing carriage return", "/var/lib/firehook\r"],
      ["a trailing tab", "/var/lib/firehook\t"],
      ["a newline inside", "/var/lib/fire\nhook"],
      ["a NUL", "/var/lib/firehook\u0000"],
      ["a trailing no-break space", "/var/lib/firehook\u00a0"],
      ["a byte-order mark", "\ufeff/var/lib/firehook"]
    ]
    for (const [what, value] of broken) {
      it.effect(`refuses ${what}`, () =>
        Effect.gen(function*() {
          const result = yield* Effect.either(load({ FIREHOOK_DATA_DIR: value }))
          if (Either.isRight(result)) return expect.fail(`FIREHOOK_DATA_DIR with ${what} was accepted`)
          expect(result.left.variable).toBe("FIREHOOK_DATA_DIR")
          expect(result.left.message).toBe(
            "invalid configuration: FIREHOOK_DATA_DIR must be a path of at most 1024 characters, without control characters or leading or trailing whitespace"
          )
        }))
    }
    it.effect("accepts spaces and other characters inside a path, and 1024 characters", () =>
      Effect.gen(function*() {
        for (const dir of ["/srv/my data/.firehook", "./état/données", "C:/fire hook", `/${"d".repeat(1023)}`]) {
          expect((yield* load({ FIREHOOK_DATA_DIR: dir })).dataDir).toBe(dir)
        }
        const long = yield* Effect.either(load({ FIREHOOK_DATA_DIR: `/${"d".repeat(1024)}` }))
        expect(Either.isLeft(long)).toBe(true)
      }))
  })

  // SPEC §6.5 (strict parsing): WHATWG URL ignores leading / trailing spaces and controls and every
  // tab and newline, so these parsed, started, and failed every request later (a stray space after
  // PLC_DIRECTORY_URL broke every did:plc owner; DATABASE_URL said "could not connect (ENOTFOUND)")
  describe("URL variables with whitespace or a control character are refused at startup", () => {
    const DEV = { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }
    const urls: ReadonlyArray<readonly [string, string, string]> = [
      // variable, a valid value, a fragment of the rule the broken value is refused with
      ["DATABASE_URL", `postgresql://postgres:${SECRET}@127.0.0.1:5432/postgres`, "whitespace or control characters"],
      ["PLC_DIRECTORY_URL", "http://127.0.0.1:18091", "https://"],
      ["OWNER_DISCOVERY_URL", "https://relay.example", "https://"],
      ["JETSTREAM_URL", "ws://127.0.0.1:6008/subscribe", "wss://"],
      ["RELAY_URL", "wss://relay.example", "wss://"],
      ["PUBLIC_URL", "https://relay.example", "whitespace or control characters"],
      ["REDIS_URL", `redis://:${SECRET}@127.0.0.1:6379/0`, "whitespace or control characters"]
    ]
    const breaks: ReadonlyArray<readonly [string, (s: string) => string]> = [
      ["a trailing space", (s) => `${s} `],
      ["a leading space", (s) => ` ${s}`],
      ["a trailing newline", (s) => `${s}\n`],
      ["a carriage return", (s) => `${s}\r`],
      ["a tab inside", (s) => s.replace("://", "://\t")],
      ["a newline inside", (s) => s.replace("127.0.0", "127.0\n.0").replace("relay.", "relay\n.")],
      ["a NUL", (s) => `${s}\u0000`],
      ["a no-break space", (s) => `${s}\u00a0`],
      ["a zero-width space", (s) => `${s}\u200b`],
      ["a byte-order mark", (s) => `\ufeff${s}`]
    ]
    for (const [variable, valid, ruleFragment] of urls) {
      it.effect(`${variable}: the valid value loads`, () =>
        Effect.gen(function*() {
          yield* load({ ...DEV, [variable]: valid })
        }))
      for (const [what, broken] of breaks) {
        it.effect(`${variable} with ${what}`, () =>
          Effect.gen(function*() {
            const result = yield* Effect.either(load({ ...DEV, [variable]: broken(valid) }))
            if (Either.isRight(result)) return expect.fail(`${variable} with ${what} was accepted`)
            expect(result.left.variable).toBe(variable)
            expect(result.left.message).toContain(ruleFragment)
            expect(result.left.message).not.toContain(SECRET)
            expect(result.left.message).not.toContain("\n")
          }))
      }
    }
  })

  // SPEC §1.2 / §6.5: insecure development mode allows ws:// and http:// to a loopback host only:
  // exactly `localhost`, an IPv4 literal in 127.0.0.0/8, or [::1]; a DNS name that starts with
  // `127.` resolves wherever its owner points it
  describe("insecure development mode: loopback means 127.0.0.0/8, [::1] or localhost, never a look-alike name", () => {
    const DEV = { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }
    const loopback = ["127.0.0.1:6008", "127.5.6.7", "localhost:2470", "LOCALHOST", "[::1]:2582", "[0:0:0:0:0:0:0:1]"]
    const forged = [
      "127.evil.example",
      "127.0.0.1.evil.example",
      "127.0.0.1.nip.io:6008",
      "127-0-0-1.evil.example",
      "localhost.evil.example",
      "evil.localhost",
      "localhost.",
      "[::ffff:127.0.0.1]",
      "[::2]",
      "128.0.0.1",
      "10.0.0.1"
    ]
    for (const host of loopback) {
      it.effect(`accepts ${host}`, () =>
        Effect.gen(function*() {
          const c = yield* load({
            ...DEV,
            JETSTREAM_URL: `ws://${host}/subscribe`,
            RELAY_URL: `ws://${host}`,
            PLC_DIRECTORY_URL: `http://${host}`,
            OWNER_DISCOVERY_URL: `http://${host}/`
          })
          expect(c.intake.jetstreamUrl).toBe(`ws://${host}/subscribe`)
        }))
    }
    const vars: ReadonlyArray<readonly [string, (host: string) => string]> = [
      ["JETSTREAM_URL", (h) => `ws://${h}/subscribe`],
      ["RELAY_URL", (h) => `ws://${h}/`],
      ["PLC_DIRECTORY_URL", (h) => `http://${h}`],
      ["OWNER_DISCOVERY_URL", (h) => `http://${h}/`]
    ]
    for (const host of forged) {
      for (const [variable, url] of vars) {
        it.effect(`refuses ${variable}=${url(host)}`, () =>
          Effect.gen(function*() {
            const result = yield* Effect.either(load({ ...DEV, [variable]: url(host) }))
            if (Either.isRight(result)) return expect.fail(`${variable}=${url(host)} was accepted as loopback`)
            expect(result.left.variable).toBe(variable)
            expect(result.left.message).toContain("loopback")
          }))
      }
    }
  })
})
