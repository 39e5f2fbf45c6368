/**
 * The command line's shared plumbing, pure and in-process (src/cli/Arguments.ts): how `--since` /
 * `--until` are read (README "Operator CLI": ISO 8601 or a duration ago, UTC without an offset,
 * dates that do not exist refused, [since, until) not empty) and the checks of ids, names and
 * kinds (SPEC §4.8). The commands that use them are run in deliveries-command.test.ts,
 * operator-commands.test.ts and, as processes, cli.test.ts.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Option, TestClock } from "effect"
import { checkDeliveryId, checkDid, checkName, checkRkey, ERROR_KINDS, parseRange } from "../../src/cli/Arguments.js"
import type { UsageError } from "../../src/cli/Failure.js"

// ---------------------------------------------------------------------------------------------
// --since / --until

const NOW = Date.parse("2026-03-01T12:00:00.000Z")

/** `--since s` alone: the time it means (ISO), or the one-line refusal. */
const since = (s: string) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(NOW)
    const r = yield* Effect.either(parseRange(Option.some(s), Option.none()))
    return Either.match(r, { onLeft: (e) => `refused: ${e.text}`, onRight: (v) => v.sinceT?.toISOString() })
  })

const SINCE_REFUSED =
  "refused: invalid --since: expected an ISO 8601 time (2026-01-02, 2026-01-02T03:04:05Z) or a duration ago (30m, 12h, 7d)"

/** `--since` and `--until`: the range (ISO), or the one-line refusal. */
const range = (s: Option.Option<string>, u: Option.Option<string>) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(NOW)
    const r = yield* Effect.either(parseRange(s, u))
    return Either.match(r, {
      onLeft: (e) => `refused: ${e.text}`,
      onRight: (v) => [v.sinceT?.toISOString(), v.untilT?.toISOString()]
    })
  })

describe("--since / --until (parseRange)", () => {
  it.effect("a duration ago: 1-999999 minutes, hours or days before now; 0 and a seventh digit refused", () =>
    Effect.gen(function*() {
      expect(yield* since("30m")).toBe("2026-03-01T11:30:00.000Z")
      expect(yield* since("12h")).toBe("2026-03-01T00:00:00.000Z")
      expect(yield* since("7d")).toBe("2026-02-22T12:00:00.000Z")
      expect(yield* since("1m")).toBe("2026-03-01T11:59:00.000Z")
      expect(yield* since(" 2h ")).toBe("2026-03-01T10:00:00.000Z")
      expect(yield* since("999999m")).toBe(new Date(NOW - 999_999 * 60_000).toISOString())
      for (const bad of ["0m", "0h", "00d", "1000000m", "05m", "1w", "1s", "-1h", "1.5h", "h"]) {
        expect(yield* since(bad), bad).toBe(SINCE_REFUSED)
      }
    }))

  it.effect("ISO 8601: a date is midnight UTC, a time without an offset is UTC; offsets and fractions are read", () =>
    Effect.gen(function*() {
      expect(yield* since("2026-01-02")).toBe("2026-01-02T00:00:00.000Z")
      expect(yield* since("2026-01-02T03:04")).toBe("2026-01-02T03:04:00.000Z")
      expect(yield* since("2026-01-02T03:04:05")).toBe("2026-01-02T03:04:05.000Z")
      expect(yield* since("2026-01-02T03:04:05Z")).toBe("2026-01-02T03:04:05.000Z")
      expect(yield* since("2026-01-02T03:04:05+02:00")).toBe("2026-01-02T01:04:05.000Z")
      expect(yield* since("2026-01-02T03:04:05-05:30")).toBe("2026-01-02T08:34:05.000Z")
      expect(yield* since("2026-01-02T03:04:05.123456789Z")).toBe("2026-01-02T03:04:05.123Z")
      for (const bad of ["2026-01-02T03:04:05.1234567890Z", "2026-01-02 03:04", "2026-1-2", "yesterday", ""]) {
        expect(yield* since(bad), bad).toBe(SINCE_REFUSED)
      }
    }))

  it.effect("UTC also where the machine's time zone is not", () =>
    Effect.gen(function*() {
      const before = process.env["TZ"]
      process.env["TZ"] = "America/New_York"
      const read = yield* Effect.ensuring(
        Effect.all([since("2026-01-02"), since("2026-01-02T03:04")]),
        Effect.sync(() => {
          if (before === undefined) delete process.env["TZ"]
          else process.env["TZ"] = before
        })
      )
      expect(read).toEqual(["2026-01-02T00:00:00.000Z", "2026-01-02T03:04:00.000Z"])
    }))

  it.effect("a date or hour that does not exist is refused, never rolled over; the last real ones pass", () =>
    Effect.gen(function*() {
      for (
        const ok of [
          "2024-02-29",
          "2000-02-29",
          "2026-02-28",
          "2026-04-30",
          "2026-06-30",
          "2026-09-30",
          "2026-11-30",
          "2026-12-31",
          "2026-01-31T23:59:59Z"
        ]
      ) {
        expect(yield* since(ok), ok).toBe(new Date(ok.length === 10 ? `${ok}T00:00:00Z` : ok).toISOString())
      }
      for (
        const bad of [
          "2026-02-29",
          "1900-02-29",
          "2026-02-30",
          "2026-04-31",
          "2026-06-31",
          "2026-09-31",
          "2026-11-31",
          "2026-13-01",
          "2026-00-10",
          "2026-01-00",
          "2026-01-32",
          "2026-01-01T24:00Z",
          "2026-01-01T24:00:00"
        ]
      ) {
        expect(yield* since(bad), bad).toBe(SINCE_REFUSED)
      }
    }))

  it.effect("[since, until) must not be empty; each flag is named in its own refusal", () =>
    Effect.gen(function*() {
      expect(yield* range(Option.some("2026-01-02"), Option.some("2026-01-03"))).toEqual([
        "2026-01-02T00:00:00.000Z",
        "2026-01-03T00:00:00.000Z"
      ])
      expect(yield* range(Option.none(), Option.some("1h"))).toEqual([undefined, "2026-03-01T11:00:00.000Z"])
      expect(yield* range(Option.none(), Option.none())).toEqual([undefined, undefined])
      expect(yield* range(Option.some("2026-01-02T00:00:00Z"), Option.some("2026-01-02"))).toBe(
        "refused: invalid --since/--until: --since (2026-01-02T00:00:00.000Z) must be earlier than --until (2026-01-02T00:00:00.000Z)"
      )
      expect(yield* range(Option.some("1h"), Option.some("2h"))).toBe(
        "refused: invalid --since/--until: --since (2026-03-01T11:00:00.000Z) must be earlier than --until (2026-03-01T10:00:00.000Z)"
      )
      expect(yield* range(Option.some("1h"), Option.some("soon"))).toBe(
        "refused: invalid --until: expected an ISO 8601 time (2026-01-02, 2026-01-02T03:04:05Z) or a duration ago (30m, 12h, 7d)"
      )
    }))
})

// ---------------------------------------------------------------------------------------------
// Ids, names and kinds

/** The refusal of a check (`undefined` when it passes). */
const refusalOf = (check: Effect.Effect<void, UsageError>) =>
  Effect.runSync(Effect.match(check, { onFailure: (e) => e.text, onSuccess: () => undefined }))

describe("ids, names and kinds given as arguments", () => {
  it("a delivery id: 1-128 of [A-Za-z0-9_]", () => {
    const refused = "invalid <id>: expected a delivery id (whd_v1_…)"
    for (const ok of ["whd_v1_abc", "a", "a".repeat(128), "X_9"]) {
      expect(refusalOf(checkDeliveryId(ok)), ok).toBe(undefined)
    }
    for (const bad of ["", "a".repeat(129), "whd-v1", "whd.v1", "whd v1", "whd/v1", "whd_v1_é"]) {
      expect(refusalOf(checkDeliveryId(bad)), bad).toBe(refused)
    }
  })

  it("a DID, a record key and a secret name, each refused in its own words", () => {
    expect(refusalOf(checkDid("--owner", "did:plc:ewvi7nxzyoun6zhxrhs64oiz"))).toBe(undefined)
    expect(refusalOf(checkDid("--owner", "alice.bsky.social"))).toBe(
      "invalid --owner: must be a canonical DID (did:plc:… or did:web:…)"
    )
    expect(refusalOf(checkRkey("<rkey>", "3lhook"))).toBe(undefined)
    expect(refusalOf(checkRkey("<rkey>", "a/b"))).toBe("invalid <rkey>: must be a record key")
    expect(refusalOf(checkName("n".repeat(64)))).toBe(undefined)
    expect(refusalOf(checkName("n".repeat(65)))).toBe("invalid <name>: must match ^[A-Za-z0-9._-]{1,64}$")
  })

  it("--error-kind takes the parked rows' kind too (README: webhook_disabled)", () => {
    expect(ERROR_KINDS).toContain("webhook_disabled")
    expect(ERROR_KINDS).toEqual(expect.arrayContaining(["http_5xx", "http_429", "gone", "http_4xx", "timeout"]))
  })
})
