import { describe, expect, it } from "vitest"
import { compareTid, isTid, MAX_TID_MICROS, TID_ALPHABET, tidFromMicros, tidToMicros } from "../../src/schemas/Tid.js"

// An independent reference encoder (BigInt), used to cross-check the Number-based implementation.
const referenceTid = (micros: bigint, clockId: bigint): string => {
  let v = (micros << 10n) | clockId
  let out = ""
  for (let i = 0; i < 13; i++) {
    out = TID_ALPHABET.charAt(Number(v & 31n)) + out
    v >>= 5n
  }
  return out
}

describe("isTid", () => {
  it.each(["3jzfcijpj2z2a", "2222222222222", "jzzzzzzzzzzzz", "7777777777777", "3kcbfyfxqnk2c", "bzzzzzzzzzzzz"])(
    "accepts %s",
    (s) => {
      expect(isTid(s)).toBe(true)
    }
  )

  it.each([
    ["empty", ""],
    ["12 chars", "3jzfcijpj2z2"],
    ["14 chars", "3jzfcijpj2z2aa"],
    ["first char k (top bit set)", "kjzfcijpj2z2a"],
    ["first char z", "zzzzzzzzzzzzz"],
    ["uppercase", "3JZFCIJPJ2Z2A"],
    ["digit 0", "3jzfcijpj0z2a"],
    ["digit 1", "3jzfcijpj1z2a"],
    ["digit 8", "3jzfcijpj8z2a"],
    ["digit 9", "9jzfcijpj2z2a"],
    ["dash", "3jzf-ijpj2z2a"],
    ["space", "3jzfcijpj2z2 "]
  ])("rejects %s", (_name, s) => {
    expect(isTid(s)).toBe(false)
  })

  it("checks the character at every position", () => {
    const valid = "3jzfcijpj2z2a"
    for (let i = 0; i < valid.length; i++) {
      for (const bad of ["1", "8", "A", "-"]) {
        const s = valid.slice(0, i) + bad + valid.slice(i + 1)
        expect([s, isTid(s)]).toEqual([s, false])
      }
    }
  })
})

describe("compareTid", () => {
  it.each(
    [
      ["3jzfcijpj2z2a", "3jzfcijpj2z2b", -1],
      ["3jzfcijpj2z2b", "3jzfcijpj2z2a", 1],
      ["3jzfcijpj2z2a", "3jzfcijpj2z2a", 0],
      ["2222222222222", "3222222222222", -1],
      ["7zzzzzzzzzzzz", "a222222222222", -1], // '7' < 'a' in the alphabet and in code units
      ["jzzzzzzzzzzzz", "bzzzzzzzzzzzz", 1]
    ] as const
  )("%s vs %s → %s", (a, b, expected) => {
    expect(compareTid(a, b)).toBe(expected)
  })

  it("lexicographic order is chronological order", () => {
    const micros = [0, 1, 31, 32, 1023, 1024, 1_000_000, 1_700_000_000_000_000, 1_700_000_000_000_001, MAX_TID_MICROS]
    const tids = micros.map((m) => tidFromMicros(m))
    for (let i = 1; i < tids.length; i++) {
      expect(compareTid(tids[i - 1] ?? "", tids[i] ?? "")).toBe(-1)
      expect(compareTid(tids[i] ?? "", tids[i - 1] ?? "")).toBe(1)
    }
    // same microsecond: the clock id breaks the tie
    expect(compareTid(tidFromMicros(5, 1), tidFromMicros(5, 2))).toBe(-1)
    expect(compareTid(tidFromMicros(5, 1023), tidFromMicros(6, 0))).toBe(-1)
  })
})

describe("tidFromMicros / tidToMicros", () => {
  it.each(
    [
      [0, 0, "2222222222222"],
      [0, 1, "2222222222223"],
      [0, 31, "222222222222z"],
      [0, 32, "2222222222232"],
      [0, 1023, "22222222222zz"],
      [1, 0, "2222222222322"],
      [MAX_TID_MICROS, 1023, "bzzzzzzzzzzzz"]
    ] as const
  )("(%s, %s) → %s", (micros, clock, expected) => {
    expect(tidFromMicros(micros, clock)).toBe(expected)
  })

  it("clock id defaults to 0", () => {
    expect(tidFromMicros(1_700_000_000_000_000)).toBe(tidFromMicros(1_700_000_000_000_000, 0))
  })

  it("agrees with an independent BigInt encoder", () => {
    const samples = [0, 1, 2, 1_000, 1_699_999_999_999_999, 1_700_000_000_123_456, 2 ** 52 + 7, MAX_TID_MICROS]
    for (const m of samples) {
      for (const c of [0, 1, 17, 512, 1023]) {
        const tid = tidFromMicros(m, c)
        expect(tid).toBe(referenceTid(BigInt(m), BigInt(c)))
        expect(isTid(tid)).toBe(true)
        expect(tidToMicros(tid)).toBe(m)
      }
    }
  })

  it("decodes a real TID", () => {
    const micros = tidToMicros("3jzfcijpj2z2a")
    expect(micros).toBeDefined()
    // 2023-ish
    expect(new Date((micros ?? 0) / 1000).getUTCFullYear()).toBe(2023)
    expect(referenceTid(BigInt(micros ?? 0), 0n).slice(0, 11)).toBe("3jzfcijpj2z")
  })

  it("clamps out-of-range inputs instead of failing", () => {
    expect(tidFromMicros(-5)).toBe("2222222222222")
    expect(tidFromMicros(Number.NaN)).toBe("2222222222222")
    expect(tidFromMicros(1.9)).toBe(tidFromMicros(1))
    expect(tidFromMicros(Number.POSITIVE_INFINITY)).toBe(tidFromMicros(MAX_TID_MICROS))
    expect(tidFromMicros(0, 5000)).toBe(tidFromMicros(0, 1023))
    expect(tidFromMicros(0, -1)).toBe(tidFromMicros(0, 0))
    expect(tidFromMicros(0, Number.NaN)).toBe(tidFromMicros(0, 0))
  })

  it("truncates a fractional clock id, as it does a fractional timestamp", () => {
    expect(tidFromMicros(0, 1.9)).toBe(tidFromMicros(0, 1))
    expect(tidFromMicros(0, 1022.5)).toBe(tidFromMicros(0, 1022))
  })

  it("tidToMicros rejects non-TIDs and timestamps beyond 2^53 - 1", () => {
    expect(tidToMicros("nope")).toBeUndefined()
    // strings whose first 11 characters alone would decode to a timestamp in range
    expect(tidToMicros("3jzfcijpj2z")).toBeUndefined()
    expect(tidToMicros("3jzfcijpj2z2")).toBeUndefined()
    expect(tidToMicros("3jzfcijpj2z2A")).toBeUndefined()
    expect(tidToMicros("3jzfcijpj2z2aa")).toBeUndefined()
    expect(tidToMicros("jzzzzzzzzzzzz")).toBeUndefined()
    expect(tidToMicros("bzzzzzzzzzzzz")).toBe(MAX_TID_MICROS)
  })
})
