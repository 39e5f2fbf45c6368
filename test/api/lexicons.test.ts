/**
 * The lexicon files in `lexicons/` are the contract of the owners' API (SPEC §8.3): every method
 * of SPEC §8.4 and §8.5 has one, of the right kind, and the Effect Schemas the service decodes and
 * encodes with accept only values the lexicon accepts (checked with atproto's own validator,
 * `@atproto/lexicon`, over values generated from the Schemas).
 */
import { Lexicons } from "@atproto/lexicon"
import { describe, expect, it } from "@effect/vitest"
import { Arbitrary, FastCheck, Schema } from "effect"
import { SECRET_CONTRACTS } from "../../src/schemas/SecretLexicon.js"
import { WEBHOOK_CONTRACTS } from "../../src/schemas/WebhookLexicon.js"
import type { AnyContract } from "../../src/schemas/XrpcContract.js"
import { lexiconDocs } from "./support.js"

const ALL: ReadonlyArray<AnyContract> = [...SECRET_CONTRACTS, ...WEBHOOK_CONTRACTS]

describe("lexicons", () => {
  const docs = lexiconDocs()
  const lex = new Lexicons(docs)

  it("every method of SPEC §8.4 and §8.5 has a lexicon of its kind, and every lexicon method a contract", () => {
    expect(ALL.map((c) => c.nsid).sort()).toEqual([
      "dev.firehook.webhook.getDelivery",
      "dev.firehook.webhook.list",
      "dev.firehook.webhook.listDeliveries",
      "dev.firehook.webhook.redeliver",
      "dev.firehook.webhook.replay",
      "dev.firehook.webhook.resume",
      "dev.firehook.webhook.subscribeDeliveries",
      "dev.firehook.webhook.test",
      "place.wisp.v2.secret.create",
      "place.wisp.v2.secret.delete",
      "place.wisp.v2.secret.list",
      "place.wisp.v2.secret.rotate"
    ])
    for (const c of ALL) {
      const def = lex.getDefOrThrow(c.nsid)
      expect(def.type).toBe(c.kind)
      const declared = "errors" in def ? (def.errors ?? []).map((e) => e.name) : []
      expect([...declared].sort()).toEqual([...c.errors].sort())
      expect("input" in def && def.input !== undefined).toBe(c.input !== undefined)
    }
    const methods = docs.filter((d) => {
      const t = d.defs["main"]?.type
      return t === "query" || t === "procedure" || t === "subscription"
    })
    expect(methods.map((d) => d.id).sort()).toEqual(ALL.map((c) => c.nsid).sort())
  })

  // wisp.place's secret methods exactly as SPEC §8.4 gives them
  it("the secret methods' shapes", () => {
    const props = (nsid: string, part: "input" | "output") => {
      const def = lex.getDefOrThrow(nsid)
      const body = part in def ? (def as Record<string, unknown>)[part] : undefined
      const schema = (body as { schema?: { properties?: object; required?: Array<string> } } | undefined)?.schema
      return { keys: Object.keys(schema?.properties ?? {}).sort(), required: [...(schema?.required ?? [])].sort() }
    }
    for (const m of ["create", "rotate", "delete"]) {
      expect(props(`place.wisp.v2.secret.${m}`, "input")).toEqual({ keys: ["name"], required: ["name"] })
    }
    expect(props("place.wisp.v2.secret.create", "output").required).toEqual(["createdAt", "name", "token"])
    expect(props("place.wisp.v2.secret.rotate", "output").required).toEqual(["name", "rotatedAt", "token"])
    expect(props("place.wisp.v2.secret.list", "output").required).toEqual(["secrets"])
    expect(props("place.wisp.v2.secret.delete", "output")).toEqual({ keys: [], required: [] })
    expect(lex.getDefOrThrow("place.wisp.v2.secret.list#secretMeta")).toMatchObject({
      required: ["name", "createdAt"],
      properties: { lastRotatedAt: { format: "datetime" } }
    })
  })

  for (const c of ALL) {
    it(`${c.nsid}: values of its Schemas are valid under its lexicon`, () => {
      const out = Schema.encodeSync(c.output)
      FastCheck.assert(
        FastCheck.property(Arbitrary.make(c.output), (value) => {
          const wire = JSON.parse(JSON.stringify(out(value)))
          if (c.kind === "subscription") lex.assertValidXrpcMessage(c.nsid, wire)
          else lex.assertValidXrpcOutput(c.nsid, wire)
        }),
        { numRuns: 200 }
      )
      if (c.input !== undefined) {
        const input = c.input
        const enc = Schema.encodeSync(input)
        FastCheck.assert(
          FastCheck.property(Arbitrary.make(input), (value) => {
            lex.assertValidXrpcInput(c.nsid, JSON.parse(JSON.stringify(enc(value))))
          }),
          { numRuns: 200 }
        )
      }
      // parameters: the decoded values (numbers as numbers) are what the lexicon types
      const decodeParams = Schema.decodeUnknownSync(c.params)
      const encodeParams = Schema.encodeSync(c.params)
      FastCheck.assert(
        FastCheck.property(Arbitrary.make(c.params), (value) => {
          const raw = encodeParams(value)
          expect(decodeParams(raw)).toEqual(value)
          lex.assertValidXrpcParams(c.nsid, value)
        }),
        { numRuns: 200 }
      )
    })
  }

  it("the lexicon refuses what the Schemas refuse, for the secret name", () => {
    const input = SECRET_CONTRACTS[0].input
    if (input === undefined) return expect.fail("create has an input")
    const decode = Schema.decodeUnknownEither(input)
    for (const name of [".", "..", "a/b", "", "x".repeat(65), "a b", "ä"]) {
      expect(decode({ name })._tag).toBe("Left")
    }
    expect(decode({ name: "main" })._tag).toBe("Right")
  })
})
