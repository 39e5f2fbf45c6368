/**
 * Record values may hold a `bigint` (an integer outside ±(2^53 − 1), decoded exactly from either
 * source): every consumer of a record value takes it without crashing.
 */
import { Either } from "effect"
import { describe, expect, it } from "vitest"
import { sanitizeWhRecordForDelivery, validateWhRecord } from "../../src/schemas/WhRecord.js"
import { canonicalJson } from "../../src/services/matching/Canonical.js"
import { extractReferences } from "../../src/services/matching/References.js"
import { whRecordValue } from "../support/stack.js"
import { plc } from "./fixtures.js"

const BIG = 2n ** 60n + 3n

describe("bigint record values", () => {
  it("the reference walker treats them as leaves and still finds the references", () => {
    const uri = `at://${plc(1)}/app.bsky.feed.post/3k`
    const r = extractReferences({ n: BIG, list: [BIG, -BIG], subject: { uri } }, undefined)
    expect(r.tooComplex).toBe(false)
    expect(r.refs.map((x) => x.uri)).toEqual([uri])
  })

  it("a wh record: a bigint where a field is expected is that field's error; an unknown bigint field is ignored", () => {
    const opts = { allowInsecureDev: false }
    expect(validateWhRecord({ ...whRecordValue(`at://${plc(1)}`), enabled: BIG }, opts)).toEqual(Either.left("enabled"))
    const ok = validateWhRecord({ ...whRecordValue(`at://${plc(1)}`), extra: BIG }, opts)
    expect(Either.isRight(ok)).toBe(true)
    const sanitized = sanitizeWhRecordForDelivery({ ...whRecordValue(`at://${plc(1)}`), extra: BIG })
    expect(Either.getOrThrow(canonicalJson(sanitized))).toContain(`"extra":${BIG}`)
  })
})
