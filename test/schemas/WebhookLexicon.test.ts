/**
 * The bounds of the owners' methods' Schemas (SPEC §8.3, §8.5) at their edges: what a value one
 * past a bound does (refused), and that the largest value a stored row can hold still passes.
 * test/api/lexicons.test.ts checks the other direction (every value of a Schema is valid under
 * its lexicon) over generated values, which seldom reach a bound.
 */
import { describe, expect, it } from "@effect/vitest"
import { Either, Schema } from "effect"
import { MAX_CID_LENGTH } from "../../src/schemas/RecordEvent.js"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"

const accepts = <A, I>(schema: Schema.Schema<A, I>, value: unknown): boolean =>
  Either.isRight(Schema.decodeUnknownEither(schema)(value))

const AT = "2026-01-02T03:04:05.000Z"

const attempt = (n: number, extra: Record<string, unknown> = {}) => ({
  n,
  startedAt: AT,
  durationMs: 12,
  outcome: "failed",
  ...extra
})

const delivery = {
  id: "whd_v1_a",
  eventId: "whd_v1_e",
  rkey: "w1",
  match: "direct",
  event: { operation: "create", did: "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", collection: "app.bsky.feed.post", rkey: "p1" },
  status: "dead_letter",
  attempts: 12,
  createdAt: AT
}

describe("WebhookLexicon", () => {
  it("#attemptView: the response excerpt is the first 1 KiB (SPEC §4.5), 1,024 characters at most; n from 1", () => {
    expect(accepts(WebhookLexicon.AttemptView, attempt(1, { responseExcerpt: "x".repeat(1024) }))).toBe(true)
    expect(accepts(WebhookLexicon.AttemptView, attempt(1, { responseExcerpt: "x".repeat(1025) }))).toBe(false)
    expect(accepts(WebhookLexicon.AttemptView, attempt(0))).toBe(false)
  })

  it("getDelivery: its newest 100 attempts at most (SPEC §8.5), the older ones counted", () => {
    const output = (n: number) => ({
      delivery,
      attempts: Array.from({ length: n }, (_, i) => attempt(i + 1)),
      olderAttempts: 0
    })
    expect(accepts(WebhookLexicon.getDelivery.output, output(100))).toBe(true)
    expect(accepts(WebhookLexicon.getDelivery.output, output(101))).toBe(false)
  })

  it("#eventRef: a cid of 1..MAX_CID_LENGTH characters; the operation `test` of a test delivery", () => {
    const ref = (extra: Record<string, unknown>) => ({ ...delivery.event, ...extra })
    expect(accepts(WebhookLexicon.EventRef, ref({ cid: "b" }))).toBe(true)
    expect(accepts(WebhookLexicon.EventRef, ref({ cid: "b".repeat(MAX_CID_LENGTH) }))).toBe(true)
    expect(accepts(WebhookLexicon.EventRef, ref({ cid: "" }))).toBe(false)
    expect(accepts(WebhookLexicon.EventRef, ref({ cid: "b".repeat(MAX_CID_LENGTH + 1) }))).toBe(false)
    expect(accepts(WebhookLexicon.EventRef, ref({ operation: "test" }))).toBe(true)
  })

  it("#webhookView: the longest record URI fits (a 2,048-character DID, a 512-character rkey); the scope's at-uri ≤ 2,048", () => {
    const did = `did:web:${"a".repeat(2048 - "did:web:".length)}`
    const uri = `at://${did}/place.wisp.v2.wh/${"r".repeat(512)}`
    expect(accepts(WebhookLexicon.WebhookView.fields.uri, uri)).toBe(true)
    expect(accepts(WebhookLexicon.WebhookView.fields.uri, "u".repeat(WebhookLexicon.MAX_URI_LENGTH + 1))).toBe(false)
    const scope = (aturi: string) => ({ aturi })
    expect(accepts(WebhookLexicon.Scope, scope(`at://${did}`.slice(0, 2048)))).toBe(true)
    expect(accepts(WebhookLexicon.Scope, scope("a".repeat(2049)))).toBe(false)
  })

  it("#errorInfo: a kind with or without the receiver's status (a timeout has none)", () => {
    expect(accepts(WebhookLexicon.ErrorInfo, { kind: "timeout" })).toBe(true)
    expect(accepts(WebhookLexicon.ErrorInfo, { kind: "http_5xx", httpStatus: 503 })).toBe(true)
  })

  it("replay: at most 10,000 per call; `inactive` present only when more than 0", () => {
    const output = (extra: Record<string, unknown>) => ({ replayed: 10_000, truncated: true, ...extra })
    expect(accepts(WebhookLexicon.replay.output, output({}))).toBe(true)
    expect(accepts(WebhookLexicon.replay.output, output({ replayed: 10_001 }))).toBe(false)
    expect(accepts(WebhookLexicon.replay.output, output({ inactive: 1 }))).toBe(true)
    expect(accepts(WebhookLexicon.replay.output, output({ inactive: 0 }))).toBe(false)
  })

  it("#outcome frames: terminal statuses only, and the event `test`", () => {
    const frame = (extra: Record<string, unknown>) => ({
      $type: "dev.firehook.webhook.subscribeDeliveries#outcome",
      id: "whd_v1_a",
      rkey: "w1",
      event: "create",
      status: "delivered",
      at: AT,
      ...extra
    })
    expect(accepts(WebhookLexicon.OutcomeFrame, frame({}))).toBe(true)
    expect(accepts(WebhookLexicon.OutcomeFrame, frame({ event: "test", status: "dead_letter" }))).toBe(true)
    expect(accepts(WebhookLexicon.OutcomeFrame, frame({ status: "pending" }))).toBe(false)
    expect(accepts(WebhookLexicon.OutcomeFrame, frame({ status: "leased" }))).toBe(false)
  })
})
