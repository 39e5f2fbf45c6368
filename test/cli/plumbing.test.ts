/**
 * The command line's shared plumbing, pure and in-process (src/cli/Arguments.ts, Failure.ts,
 * Output.ts): how `--since` / `--until` are read (README "Operator CLI": ISO 8601 or a duration
 * ago, UTC without an offset, dates that do not exist refused, [since, until) not empty), which
 * exit code and one line a failure gets (exit 2 for invalid arguments, 1 for an operation that
 * could not be done, 130 when interrupted; SPEC §4.8), which arguments are never echoed, and the
 * tables' cells. The commands that use them are run in deliveries-command.test.ts,
 * operator-commands.test.ts and, as processes, cli.test.ts.
 */
import { HelpDoc, ValidationError } from "@effect/cli"
import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Either, Option, TestClock } from "effect"
import { checkDeliveryId, checkDid, checkName, checkRkey, ERROR_KINDS, parseRange } from "../../src/cli/Arguments.js"
import { describeFailure, Failed, redactArgs, UsageError } from "../../src/cli/Failure.js"
import { HooksFailed, HooksInvalid } from "../../src/cli/HookErrors.js"
import { cell, table, terminalJson } from "../../src/cli/Output.js"
import { SecretsError } from "../../src/services/delivery/Secrets.js"
import { InvalidArgument } from "../../src/services/operator/Operator.js"
import * as Database from "../../src/services/platform/Database.js"

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
      expect(yield* since("2026-01-02T03:04:05.123000000Z")).toBe("2026-01-02T03:04:05.123Z")
      // finer than a millisecond: refused, not cut to .123 (this line asserted the cut before 6 December 2026)
      expect(yield* since("2026-01-02T03:04:05.123456789Z")).toBe(
        "refused: invalid --since: at most millisecond precision (3 fraction digits, 2026-01-02T03:04:05.123Z): a finer time is refused, not rounded"
      )
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

// ---------------------------------------------------------------------------------------------
// Exit codes and the one line

const describeFail = (e: unknown) => describeFailure(Cause.fail(e))

describe("a failure's exit code and one line (describeFailure)", () => {
  it("invalid arguments exit 2, operations that could not be done 1, an interrupt 130, a defect 1", () => {
    expect(describeFail(new UsageError({ text: "invalid --limit: must be in 1..1000" }))).toEqual({
      code: 2,
      line: "invalid --limit: must be in 1..1000"
    })
    expect(describeFail(new InvalidArgument({ field: "--owner", rule: "must be a DID" }))).toEqual({
      code: 2,
      line: "invalid --owner: must be a DID"
    })
    expect(describeFail(new HooksInvalid({ text: "invalid --pds: …" }))).toEqual({ code: 2, line: "invalid --pds: …" })
    expect(describeFail(new Failed({ text: "no such secret" }))).toEqual({ code: 1, line: "no such secret" })
    expect(describeFail(new HooksFailed({ reason: "login", text: "login failed: x" }))).toEqual({
      code: 1,
      line: "login failed: x"
    })
    expect(describeFailure(Cause.interrupt(0 as never))).toEqual({ code: 130, line: "interrupted" })
    expect(describeFailure(Cause.die(new Error("boom")))).toEqual({ code: 1, line: "unexpected internal error" })
    // a failure without a message says so in general terms
    expect(describeFail({ _tag: "Odd" })).toEqual({ code: 1, line: "operation failed" })
    expect(describeFail(new Error(""))).toEqual({ code: 1, line: "operation failed" })
    expect(describeFail("text")).toEqual({ code: 1, line: "operation failed" })
  })

  it("a secrets refusal of the owner, name or token is invalid arguments (2); the others are failures (1)", () => {
    const code = (reason: SecretsError["reason"]) => describeFail(new SecretsError({ reason })).code
    expect(["invalid_owner", "invalid_name", "invalid_token"].map((r) => code(r as SecretsError["reason"])))
      .toEqual([2, 2, 2])
    expect(
      (["already_exists", "not_found", "limit_reached", "no_key", "invalid_key", "store"] as const).map(code)
    ).toEqual([1, 1, 1, 1, 1, 1])
    expect(describeFail(new SecretsError({ reason: "invalid_name" })).line).toBe(
      "secrets: the secret name must match ^[A-Za-z0-9._-]{1,64}$"
    )
  })

  it("@effect/cli's refusals: exit 2, one line without ANSI codes, bounded, pointing at --help", () => {
    const invalid = (doc: HelpDoc.HelpDoc) => describeFail(ValidationError.invalidValue(doc))
    expect(invalid(HelpDoc.p("Expected an integer,\n  got   abc"))).toEqual({
      code: 2,
      line: "Expected an integer, got abc (see --help)"
    })
    expect(describeFail(ValidationError.missingValue(HelpDoc.p("\u001b[1mExpected\u001b[0m a value")))).toEqual({
      code: 2,
      line: "Expected a value (see --help)"
    })
    expect(invalid(HelpDoc.empty)).toEqual({ code: 2, line: "invalid arguments (see --help)" })
    const long = invalid(HelpDoc.p("x".repeat(2000)))
    expect(long).toEqual({ code: 2, line: `${"x".repeat(500)} (see --help)` })
  })

  it("a refused database connection is said in words, by the service's error and the CLI's line alike", () => {
    const refused = (code: string) => Database.couldNotConnect(Object.assign(new Error("refused"), { code })).message
    const explained: ReadonlyArray<readonly [string, string]> = [
      ["3D000", "no database of that name on the server"],
      ["28P01", "password authentication failed"],
      ["28000", "the server refused this role or client (pg_hba.conf)"],
      ["57P03", "the server is starting up or shutting down"],
      ["55000", "the database does not accept connections (ALLOW_CONNECTIONS false)"],
      ["53300", "the server has no connection slot left"],
      ["ECONNREFUSED", "nothing listens at that host and port"],
      ["ENOTFOUND", "the host name does not resolve"],
      ["EAI_AGAIN", "the host name does not resolve"],
      ["EHOSTUNREACH", "the host is unreachable"],
      ["ETIMEDOUT", "the host did not answer"]
    ]
    for (const [code, meaning] of explained) {
      const message = refused(code)
      expect(message).toBe(`database: could not connect (${code}: ${meaning})`)
      expect(Database.isUnreachableLine(message)).toBe(true)
      expect(describeFail(new Failed({ text: message })).line).toBe(message)
    }
    expect(refused("timeout")).toBe("database: could not connect (timeout)")
    expect(refused("08006")).toBe("database: could not connect (08006)")
  })
})

// ---------------------------------------------------------------------------------------------
// What is never echoed

describe("arguments never echoed (redactArgs)", () => {
  const argv = (...args: ReadonlyArray<string>) => ["bun", "firehook", ...args]

  it("the values of --token, --password and --secret, given as the next argument or after =", () => {
    for (const flag of ["--token", "--password", "--secret"]) {
      expect(redactArgs("bad value short1 here", argv("hooks", flag, "short1")), flag).toBe(
        "bad value [redacted] here"
      )
      expect(redactArgs("bad value short2 here", argv("hooks", `${flag}=short2`)), flag).toBe(
        "bad value [redacted] here"
      )
    }
    // a flag at the end has no value to hide; other short values are kept
    expect(redactArgs("--token main", argv("secrets", "create", "main", "--token"))).toBe("--token main")
    expect(redactArgs("--limit=abc", argv("deliveries", "list", "--limit=abc"))).toBe("--limit=abc")
  })

  it("anything of 32 characters or more, except options, DIDs and delivery ids; the longest first", () => {
    const token = "t".repeat(32)
    expect(redactArgs(`got ${token}`, argv("secrets", "create", "did:plc:x", "main", token))).toBe("got [redacted]")
    expect(redactArgs(`got ${token.slice(1)}`, argv(token.slice(1)))).toBe(`got ${token.slice(1)}`)
    const did = `did:plc:${"a".repeat(24)}`
    const id = `whd_v1_${"b".repeat(40)}`
    const option = `--owner=${"c".repeat(40)}`
    expect(redactArgs(`${did} ${id} ${option}`, argv(did, id, option))).toBe(`${did} ${id} ${option}`)
    // a secret that contains a shorter one is hidden whole
    const long = `${"s".repeat(10)}${"u".repeat(30)}`
    expect(redactArgs(`x ${long} x`, argv("--secret", "s".repeat(10), long))).toBe("x [redacted] x")
  })

  it("the app password from the environment, from 6 characters on", () => {
    const before = process.env["ATPROTO_APP_PASSWORD"]
    try {
      process.env["ATPROTO_APP_PASSWORD"] = "pw-123"
      expect(redactArgs("login with pw-123 failed", [])).toBe("login with [redacted] failed")
      process.env["ATPROTO_APP_PASSWORD"] = "pw-12"
      expect(redactArgs("login with pw-12 failed", [])).toBe("login with pw-12 failed")
    } finally {
      if (before === undefined) delete process.env["ATPROTO_APP_PASSWORD"]
      else process.env["ATPROTO_APP_PASSWORD"] = before
    }
  })
})

// ---------------------------------------------------------------------------------------------
// Tables

describe("--json for a terminal (terminalJson, printJson's text)", () => {
  it("DEL and the C1 controls (U+009B is CSI) are escaped; the JSON still parses to the same value", () => {
    const value = { text: "hi\u009b2J\u009b31mowned\u007f", n: 1, nested: ["\u0085"] }
    const text = terminalJson(value)
    expect(text).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/)
    expect(text).toContain("\\u009b2J")
    expect(JSON.parse(text)).toEqual(value)
  })
})

describe("tables (cell, table)", () => {
  it("a cell never carries a control character; a missing value is -", () => {
    expect(cell(undefined)).toBe("-")
    expect(cell(0)).toBe("0")
    expect(cell("a\nb\u001b[31mc\u007fd\u009be")).toBe("a b [31mc d e")
  })

  it("columns padded to the widest cell or header, two spaces apart, the last one unpadded", () => {
    expect(table(["ID", "STATUS", "URL"], [["a", "delivered", "https://x"], ["long-id", "ok", ""]])).toBe(
      ["ID       STATUS     URL", "a        delivered  https://x", "long-id  ok"].join("\n")
    )
    expect(table(["NAME", "CREATED"], [])).toBe("NAME  CREATED")
    expect(table(["NAME", "CREATED", "ROTATED"], [["a", "b", "-"]])).toBe("NAME  CREATED  ROTATED\na     b        -")
  })
})
