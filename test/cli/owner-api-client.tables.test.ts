/**
 * The owners' API client's tables (SPEC §8.6, src/cli/OwnerApiView.ts): status, a delivery's
 * detail, deliveries and secrets, and the tail's lines.
 */
import { describe, expect, it } from "vitest"
import * as View from "../../src/cli/OwnerApiView.js"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"
import { OWNER, T0 } from "./owner-api-client-support.js"
import { checked } from "./owner-api-fake.js"

describe("the tables", () => {
  const webhook = checked(WebhookLexicon.list, {
    webhooks: [{
      uri: `at://${OWNER}/dev.firehook.webhook/hook`,
      rkey: "hook",
      cid: "bafyreib2rxk3rh6kzwq",
      scope: { aturi: `at://${OWNER}/app.bsky.feed.post` },
      events: ["create"],
      enabled: true,
      signing: "secretId",
      url: "https://receiver.example/private",
      state: "active",
      stateReason: "ignored_when_active",
      circuit: "closed",
      counts: { pending: 1, deadLetters: 2, delivered24h: 3, failed24h: 4 },
      lastError: { kind: "timeout" }
    }]
  }) as typeof WebhookLexicon.list.output.Type

  it("status: no URL unless shown; an active state without its reason; an error without a status", () => {
    const rows = View.statusTable(webhook.webhooks, false).split("\n")
    expect(rows).toHaveLength(2)
    expect(rows[0]).toMatch(
      /^RKEY\s+STATE\s+CIRCUIT\s+PENDING\s+DEAD\s+OK\/24H\s+FAILED\/24H\s+LAST-SUCCESS\s+LAST-ERROR$/
    )
    expect(rows[1]).toMatch(/^hook\s+active\s+closed\s+1\s+2\s+3\s+4\s+-\s+timeout$/)
    const shown = View.statusTable(webhook.webhooks, true).split("\n")
    expect(shown[0]).toMatch(/LAST-ERROR\s+URL$/)
    expect(shown[1]).toMatch(/timeout\s+https:\/\/receiver\.example\/private$/)
    expect(View.statusTable([], false)).toBe("no webhooks known to this firehook service")
    const odd = {
      ...webhook.webhooks[0]!,
      url: "https://receiver.example/a\u001b[2Jb",
      lastError: { kind: "http_status", httpStatus: 503 }
    }
    const oddRow = View.statusTable([odd], true).split("\n")[1]
    expect(oddRow).toMatch(/http_status 503\s+https:\/\/receiver\.example\/a \[2Jb$/)
    expect(oddRow).not.toContain("\u001b")
  })

  const delivery = {
    id: "whd_v1_0001",
    eventId: "whe_v1_0001",
    rkey: "hook",
    match: "direct",
    event: { operation: "update", did: OWNER, collection: "app.bsky.feed.post", rkey: "3kpost" },
    status: "pending",
    attempts: 3,
    createdAt: T0,
    nextAttemptAt: T0
  }

  it("a delivery's detail: the fields it has, a long excerpt shortened to 60 characters, older attempts", () => {
    const detail = checked(WebhookLexicon.getDelivery, {
      delivery,
      attempts: [
        { n: 3, startedAt: T0, durationMs: 5, outcome: "retry", httpStatus: 503, responseExcerpt: "a".repeat(61) },
        { n: 2, startedAt: T0, durationMs: 5, outcome: "retry", httpStatus: 500, responseExcerpt: "b".repeat(60) }
      ],
      olderAttempts: 1
    }) as typeof WebhookLexicon.getDelivery.output.Type
    const text = View.deliveryDetail(detail)
    expect(text).toMatch(/^event: {8}update app\.bsky\.feed\.post\/3kpost$/m)
    expect(text).toMatch(/^next attempt: 2026-11-20T10:00:00\.000Z$/m)
    expect(text).not.toMatch(/^delivered:/m)
    expect(text).not.toMatch(/^last error:/m)
    expect(text).toMatch(new RegExp(`^3 .* 503\\s+-\\s+${"a".repeat(59)}…$`, "m"))
    expect(text).toMatch(new RegExp(`^2 .* 500\\s+-\\s+${"b".repeat(60)}$`, "m"))
    expect(text).toContain("\n(1 older attempts not shown)\n")
    expect(text.endsWith("payload: no longer retained")).toBe(true)
    const none = View.deliveryDetail({ ...detail, attempts: [], olderAttempts: 0 })
    expect(none).toContain("\nno attempts yet\n")
    expect(none).not.toContain("older attempts")
  })

  it("a delivery's payload: valid JSON, with DEL and the C1 controls (U+009B is CSI) escaped as well", () => {
    // the payload is a record from any repo the webhook matched (a backlink: a third party's)
    const record = { text: "hi\u009b2J\u009b31mowned\u007f", "k\u0085": 1, plain: "é ✓", nl: "a\nb" }
    const detail = checked(WebhookLexicon.getDelivery, {
      delivery: { ...delivery, match: "backlink" },
      payload: { record },
      attempts: [],
      olderAttempts: 0
    }) as typeof WebhookLexicon.getDelivery.output.Type
    const text = View.deliveryDetail(detail)
    expect(text).not.toMatch(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/)
    const json = text.slice(text.indexOf("payload:\n") + "payload:\n".length)
    expect(json).toContain("\\u009b2J\\u009b31mowned\\u007f")
    expect(JSON.parse(json)).toEqual({ record })
  })

  it("deliveries and secrets", () => {
    const d = checked(WebhookLexicon.listDeliveries, {
      deliveries: [delivery]
    }) as typeof WebhookLexicon.listDeliveries.output.Type
    expect(View.deliveriesTable(d.deliveries).split("\n")[1]).toMatch(
      /^whd_v1_0001\s+2026-11-20T10:00:00\.000Z\s+hook\s+update app\.bsky\.feed\.post\/3kpost\s+pending\s+3\s+-$/
    )
    expect(View.secretsTable([{ name: "main", createdAt: T0 }]).split("\n")).toEqual([
      "NAME  CREATED                   LAST-ROTATED",
      `main  ${T0}  -`
    ])
  })

  it("tail lines: an outcome, a status with its error kind, the #info frame (one or many)", () => {
    const o = {
      $type: "dev.firehook.webhook.subscribeDeliveries#outcome",
      id: "whd_v1_1",
      rkey: "hook",
      event: "test",
      at: T0
    } as const
    expect(View.tailLine({ ...o, status: "dead_letter", httpStatus: 500, errorKind: "http_status" })).toBe(
      `${T0}  dead_letter  hook  test    whd_v1_1  500 http_status`
    )
    expect(View.tailLine({ ...o, status: "delivered" })).toBe(`${T0}  delivered    hook  test    whd_v1_1`)
    const info = { $type: "dev.firehook.webhook.subscribeDeliveries#info", name: "DeliveriesDropped" } as const
    expect(View.tailLine({ ...info, dropped: 1 })).toBe("(the service dropped 1 outcome: this reader was too slow)")
    expect(View.tailLine({ ...info, dropped: 2 })).toBe("(the service dropped 2 outcomes: this reader was too slow)")
    // the client's own losses (stderr)
    expect(View.tailLostLine("dropped", 1)).toBe(
      "firehook: 1 outcome dropped (this terminal was slower than the service)"
    )
    expect(View.tailLostLine("dropped", 5)).toBe(
      "firehook: 5 outcomes dropped (this terminal was slower than the service)"
    )
    expect(View.tailLostLine("invalid", 1)).toBe("firehook: an invalid frame was skipped")
  })
})
