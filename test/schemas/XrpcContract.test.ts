/**
 * The shared field Schemas of the owners' methods (SPEC §8.3–8.5) at their edges: integer
 * parameters, lexicon datetimes, secret names, record keys, tokens, counts and HTTP statuses, and
 * what `contract` builds. test/api/lexicons.test.ts checks that generated values are valid under the
 * lexicons; generated values seldom reach a bound, and never an invalid input.
 */
import { Either, Schema } from "effect"
import { describe, expect, it } from "vitest"
import {
  BooleanParam,
  contract,
  Count,
  Datetime,
  HttpStatus,
  IntParam,
  isDatetime,
  NoParams,
  RecordKey,
  SecretName,
  Token
} from "../../src/schemas/XrpcContract.js"

const accepts = <A, I>(schema: Schema.Schema<A, I>, value: unknown): boolean =>
  Either.isRight(Schema.decodeUnknownEither(schema)(value))

/** [value, accepted] pairs, so that a failure names the value. */
const verdicts = <A, I>(schema: Schema.Schema<A, I>, values: ReadonlyArray<unknown>) =>
  values.map((v) => [v, accepts(schema, v)])
const all = (values: ReadonlyArray<unknown>, accepted: boolean) => values.map((v) => [v, accepted])

describe("IntParam (the `limit` of SPEC §8.3: 1–100)", () => {
  const Limit = IntParam(1, 100)

  it("decimal digits without a leading zero, inside the range", () => {
    expect(Schema.decodeUnknownSync(Limit)("1")).toBe(1)
    expect(Schema.decodeUnknownSync(Limit)("100")).toBe(100)
    expect(Schema.decodeUnknownSync(Limit)("42")).toBe(42)
  })

  it("refuses everything else a number parser would read", () => {
    const refused = [
      "0",
      "101",
      "01",
      "001",
      "+5",
      "-1",
      " 5",
      "5 ",
      "1e1",
      "0x10",
      "1.0",
      "1.5",
      "",
      "5_0",
      "Infinity"
    ]
    expect(verdicts(Limit, refused)).toEqual(all(refused, false))
  })

  it("0 is a value when the range starts there; 0 with leading zeros is not", () => {
    const FromZero = IntParam(0, 10)
    expect(Schema.decodeUnknownSync(FromZero)("0")).toBe(0)
    expect(verdicts(FromZero, ["00", "-0", "11"])).toEqual(all(["00", "-0", "11"], false))
  })
})

describe("Datetime (a lexicon `datetime`)", () => {
  it("RFC 3339 with T and Z or an offset, a real date, years 0000–9999", () => {
    const ok = [
      "2026-01-02T03:04:05Z",
      "2026-01-02T03:04:05.123456Z",
      "2026-01-02T03:04:05+05:30",
      "2026-01-02T03:04:05-08:00",
      "2024-02-29T00:00:00Z",
      "0000-01-01T00:00:00Z",
      "9999-12-31T23:59:59Z",
      "2026-01-02T03:04:05." + "1".repeat(64 - "2026-01-02T03:04:05.Z".length) + "Z"
    ]
    expect(verdicts(Datetime, ok)).toEqual(all(ok, true))
  })

  it("refuses the forms RFC 3339 or the lexicon does not allow", () => {
    const refused = [
      "2026-01-02T03:04:05." + "1".repeat(65 - "2026-01-02T03:04:05.Z".length) + "Z",
      "2026-01-02T03:04:05-00:00",
      "2026-01-02t03:04:05Z",
      "2026-01-02T03:04:05z",
      "2026-01-02 03:04:05Z",
      "2026-01-02T24:00:00Z",
      "2026-01-02T03:04:05.Z",
      "2026-01-02T03:04:05+24:00",
      "2026-01-02T03:04:05",
      "2026-02-30T00:00:00Z",
      "2025-02-29T00:00:00Z",
      "2026-04-31T00:00:00Z",
      "2026-13-01T00:00:00Z",
      "2026-1-02T03:04:05Z",
      "+02026-01-02T03:04:05Z",
      "2026-01-02"
    ]
    expect(refused.map((s) => [s, isDatetime(s)])).toEqual(all(refused, false))
    expect(verdicts(Datetime, refused)).toEqual(all(refused, false))
  })
})

describe("SecretName (SPEC §1.3, §8.4: ^[A-Za-z0-9._-]{1,64}$, a record key)", () => {
  it("1 to 64 characters of the set; never . or ..", () => {
    const ok = ["a", "A-z_0.9", "...", ".a", "a".repeat(64)]
    expect(verdicts(SecretName, ok)).toEqual(all(ok, true))
    const refused = ["", ".", "..", "a".repeat(65), "a~b", "a+b", "a b", "a/b", "a:b", "é"]
    expect(verdicts(SecretName, refused)).toEqual(all(refused, false))
  })
})

describe("RecordKey (SPEC §1.1: [A-Za-z0-9._~:%@+-]{1,512}, not . or ..)", () => {
  it("the grammar intake accepts", () => {
    const ok = ["3jzfcijpj2z2a", "self", "a.b~c:d%e@f+g-h_i", "a".repeat(512)]
    expect(verdicts(RecordKey, ok)).toEqual(all(ok, true))
    const refused = ["", ".", "..", "a".repeat(513), "a/b", "a b", "a#b", "a?b", "é"]
    expect(verdicts(RecordKey, refused)).toEqual(all(refused, false))
  })
})

describe("Token (printable ASCII, bounded)", () => {
  it("1 to maxLength characters from ! to ~", () => {
    const T = Token(8)
    const ok = ["!", "~", "a:b/c", "x".repeat(8)]
    expect(verdicts(T, ok)).toEqual(all(ok, true))
    const refused = ["", " ", "a b", "x".repeat(9), "\u007f", "é", "a\tb"]
    expect(verdicts(T, refused)).toEqual(all(refused, false))
  })
})

describe("Count and HttpStatus", () => {
  it("Count: an integer from 0 to 2^53 - 1", () => {
    const ok = [0, 1, Number.MAX_SAFE_INTEGER]
    expect(verdicts(Count, ok)).toEqual(all(ok, true))
    const refused = [-1, 1.5, Number.MAX_SAFE_INTEGER + 1, Number.NaN, "1"]
    expect(verdicts(Count, refused)).toEqual(all(refused, false))
  })

  it("HttpStatus: an integer from 100 to 599", () => {
    expect(verdicts(HttpStatus, [100, 200, 599])).toEqual(all([100, 200, 599], true))
    expect(verdicts(HttpStatus, [99, 600, 200.5])).toEqual(all([99, 600, 200.5], false))
  })
})

describe("BooleanParam", () => {
  it("exactly true / false, both ways", () => {
    expect(Schema.decodeUnknownSync(BooleanParam)("true")).toBe(true)
    expect(Schema.decodeUnknownSync(BooleanParam)("false")).toBe(false)
    expect(Schema.encodeSync(BooleanParam)(true)).toBe("true")
    expect(Schema.encodeSync(BooleanParam)(false)).toBe("false")
    const refused = ["1", "0", "TRUE", "False", "", "yes"]
    expect(verdicts(BooleanParam, refused)).toEqual(all(refused, false))
  })
})

describe("contract", () => {
  it("keeps the declared errors (none by default) and has no input unless one is given", () => {
    const query = contract({ nsid: "dev.firehook.test.q", kind: "query", params: NoParams, output: Schema.Struct({}) })
    expect(query.errors).toEqual([])
    expect(query.input).toBeUndefined()
    const procedure = contract({
      nsid: "dev.firehook.test.p",
      kind: "procedure",
      params: NoParams,
      input: Schema.Struct({ name: SecretName }),
      output: Schema.Struct({}),
      errors: ["AlreadyExists"]
    })
    expect(procedure.errors).toEqual(["AlreadyExists"])
    expect(procedure.input !== undefined && accepts(procedure.input, { name: "a" })).toBe(true)
    expect(procedure.input !== undefined && accepts(procedure.input, { name: ".." })).toBe(false)
  })
})
