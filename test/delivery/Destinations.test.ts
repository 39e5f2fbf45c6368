import { describe, expect, it } from "@effect/vitest"
import { Effect, Either } from "effect"
import { createHmac } from "node:crypto"
import { Webhook } from "standardwebhooks"
import {
  type DeliveryInput,
  Destinations,
  discordPreset,
  type OutgoingRequest,
  selectPreset,
  slackPreset,
  type Transform,
  webhookPreset
} from "../../src/services/delivery/Destinations.js"

// A stored body with non-canonical spacing and key order: it must be sent byte for byte.
const storedBody =
  "{\"v\":1, \"event\":{\"did\":\"did:plc:ewvi7nxzyoun6zhxrhs64oiz\",\"rkey\":\"3l_a~b\",\"text\":\"héllo 🦋\"} ,\"z\":0}"

const input = (over: Partial<DeliveryInput> = {}): DeliveryInput => ({
  deliveryId: "0190f3a1-7c2e-7b1a-9d4e-1f2a3b4c5d6e",
  eventId: "ev-1",
  body: storedBody,
  event: {
    did: "did:plc:ewvi7nxzyoun6zhxrhs64oiz",
    collection: "app.bsky.feed.post",
    rkey: "3l_a~b",
    operation: "create",
    cid: "bafyreib2rxk3rh6kzwq",
    timestamp: "2026-01-15T12:00:00.000Z"
  },
  subscription: {
    ownerDid: "did:plc:owner0000000000000000000",
    rkey: "3kwhrkey",
    url: "https://receiver.example/hooks/in?x=1",
    match: "direct"
  },
  secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
  timestampSeconds: Math.floor(Date.now() / 1000),
  userAgent: "firehook/0.1.0",
  ...over
})

const request = (t: Transform, i: DeliveryInput): OutgoingRequest => {
  const r = t(i)
  if (Either.isLeft(r) || r.right === null) return expect.unreachable("expected a request")
  return r.right
}

describe("test deliveries (SPEC §8.5)", () => {
  it("the webhook preset adds X-Firehook-Test: 1 to a test delivery only, signed as any other", () => {
    const base = input()
    const test = input({ event: { ...base.event, operation: "test" } })
    const r = request(webhookPreset, test)
    expect(r.headers["X-Firehook-Test"]).toBe("1")
    expect(r.headers["webhook-signature"]).toMatch(/^v1,/)
    expect(r.body).toBe(storedBody)
    expect(request(webhookPreset, base).headers["X-Firehook-Test"]).toBeUndefined()
  })

  it("slack and discord get their summary of a test, without the header", () => {
    const test = input({ event: { ...input().event, operation: "test" } })
    for (const preset of [slackPreset, discordPreset]) {
      const r = request(preset, test)
      expect(r.body).toContain("test app.bsky.feed.post")
      expect(r.headers["X-Firehook-Test"]).toBeUndefined()
    }
  })
})

describe("webhookPreset", () => {
  it("sends exactly the SPEC §4.5 header set, with the stored body unchanged", () => {
    const i = input()
    const r = request(webhookPreset, i)
    expect(r.url).toBe("https://receiver.example/hooks/in?x=1")
    expect(r.method).toBe("POST")
    expect(r.body).toBe(storedBody)
    expect(Buffer.from(r.body, "utf8").equals(Buffer.from(storedBody, "utf8"))).toBe(true)
    expect(r.isSuccess).toBeUndefined()
    expect(Object.keys(r.headers).sort()).toEqual([
      "Content-Type",
      "Idempotency-Key",
      "User-Agent",
      "X-Firehook-Match",
      "X-Firehook-Webhook",
      "X-Webhook-Signature",
      "webhook-id",
      "webhook-signature",
      "webhook-timestamp"
    ].sort())
    expect(r.headers).toMatchObject({
      "Content-Type": "application/json",
      "User-Agent": "firehook/0.1.0",
      "Idempotency-Key": i.deliveryId,
      "webhook-id": i.deliveryId,
      "webhook-timestamp": String(i.timestampSeconds),
      "X-Firehook-Webhook": "at://did:plc:owner0000000000000000000/place.wisp.v2.wh/3kwhrkey",
      "X-Firehook-Match": "direct"
    })
    expect(r.headers["X-Webhook-Signature"]).toBe(
      "sha256=" + createHmac("sha256", i.secret ?? "").update(storedBody, "utf8").digest("hex")
    )
    expect(new Webhook(i.secret ?? "").verify(r.body, r.headers)).toEqual(JSON.parse(storedBody))
  })

  it("signs exactly the bytes it sends, surrounding whitespace of the stored body included (SPEC §4.5)", () => {
    const padded = ` ${storedBody}\n`
    const i = input({ body: padded })
    const r = request(webhookPreset, i)
    expect(r.body).toBe(padded)
    expect(r.headers["X-Webhook-Signature"]).toBe(
      "sha256=" + createHmac("sha256", i.secret ?? "").update(padded, "utf8").digest("hex")
    )
    expect(new Webhook(i.secret ?? "").verify(r.body, r.headers)).toEqual(JSON.parse(storedBody))
  })

  it("reports backlink matches", () => {
    const r = request(webhookPreset, input({ subscription: { ...input().subscription, match: "backlink" } }))
    expect(r.headers["X-Firehook-Match"]).toBe("backlink")
  })

  it("sends no signature headers when the subscription has no secret", () => {
    const r = request(webhookPreset, input({ secret: undefined }))
    expect(Object.keys(r.headers).sort()).toEqual(
      ["Content-Type", "Idempotency-Key", "User-Agent", "X-Firehook-Match", "X-Firehook-Webhook"].sort()
    )
    expect(r.body).toBe(storedBody)
  })

  it("signs each attempt with its own timestamp", () => {
    const a = request(webhookPreset, input({ timestampSeconds: 1_700_000_000 }))
    const b = request(webhookPreset, input({ timestampSeconds: 1_700_000_060 }))
    expect(a.headers["webhook-timestamp"]).toBe("1700000000")
    expect(b.headers["webhook-timestamp"]).toBe("1700000060")
    expect(a.headers["webhook-signature"]).not.toBe(b.headers["webhook-signature"])
    expect(a.headers["X-Webhook-Signature"]).toBe(b.headers["X-Webhook-Signature"])
  })
})

describe("selectPreset", () => {
  it("chooses by URL", () => {
    const cases: ReadonlyArray<readonly [string, string]> = [
      ["https://hooks.slack.com/services/T000/B000/XXXX", "slack"],
      ["https://HOOKS.SLACK.COM./services/T000/B000/XXXX", "slack"],
      ["https://discord.com/api/webhooks/123/abc", "discord"],
      ["https://discordapp.com/api/webhooks/123/abc", "discord"],
      ["https://canary.discord.com/api/webhooks/123/abc", "discord"],
      ["https://discord.com/api/v10/webhooks/123/abc", "discord"],
      ["https://discord.com/channels/123", "webhook"],
      ["https://evil-discord.com/api/webhooks/123/abc", "webhook"],
      ["https://hooks.slack.com.evil.example/services/x", "webhook"],
      ["https://slack.com/services/x", "webhook"],
      ["https://receiver.example/hook", "webhook"]
    ]
    for (const [url, preset] of cases) expect([url, selectPreset(new URL(url))]).toEqual([url, preset])
  })
})

describe("slackPreset", () => {
  it("posts {text: summary} with Slack escaping and no signature", () => {
    const i = input({ subscription: { ...input().subscription, url: "https://hooks.slack.com/services/T0/B0/x" } })
    const r = request(slackPreset, i)
    expect(r.url).toBe("https://hooks.slack.com/services/T0/B0/x")
    expect(r.body).toBe(
      JSON.stringify({
        text: "create app.bsky.feed.post `at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3l_a~b`"
      })
    )
    expect(r.headers).toEqual({
      "Content-Type": "application/json",
      "User-Agent": "firehook/0.1.0",
      "Idempotency-Key": i.deliveryId
    })
    const weird = request(slackPreset, input({ event: { ...i.event, operation: "delete", rkey: "a<b>&`c" } }))
    expect(JSON.parse(weird.body)).toEqual({
      text: "delete app.bsky.feed.post `at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/a&lt;b&gt;&amp;'c`"
    })
  })
})

describe("discordPreset", () => {
  it("posts {content, allowed_mentions: {parse: []}} with no signature", () => {
    const i = input({ subscription: { ...input().subscription, url: "https://discord.com/api/webhooks/1/t" } })
    const r = request(discordPreset, i)
    expect(JSON.parse(r.body)).toEqual({
      content: "create app.bsky.feed.post `at://did:plc:ewvi7nxzyoun6zhxrhs64oiz/app.bsky.feed.post/3l_a~b`",
      allowed_mentions: { parse: [] }
    })
    expect(Object.keys(r.headers).sort()).toEqual(["Content-Type", "Idempotency-Key", "User-Agent"])
  })

  it("keeps content within 2000 characters", () => {
    const long = input({ event: { ...input().event, did: "did:web:" + "a".repeat(2_500) } })
    const content = (JSON.parse(request(discordPreset, long).body) as { content: string }).content
    expect(content).toHaveLength(2000)
    expect(content.endsWith("…")).toBe(true)
    expect(content.startsWith("create app.bsky.feed.post `at://did:web:aaa")).toBe(true)
  })

  it("never cuts a surrogate pair in half at the 2000-character limit (U+1F98B and U+10FFFF)", () => {
    // "create app.bsky.feed.post `at://did:web:" is 40 units: the pair starts at index 1998, so a
    // cut at 1999 would keep its high surrogate alone
    for (const astral of ["\u{1F98B}", "\u{10FFFF}"]) {
      const did = "did:web:" + "a".repeat(1_958) + astral + "a".repeat(600)
      const content = (JSON.parse(request(discordPreset, input({ event: { ...input().event, did } })).body) as {
        content: string
      }).content
      expect(content).toHaveLength(1_999)
      expect(content.endsWith("a…")).toBe(true)
    }
  })
})

describe("Destinations service", () => {
  it.effect("the default layer resolves the presets by URL", () =>
    Effect.gen(function*() {
      const d = yield* Destinations
      expect(d.resolve(new URL("https://receiver.example/x"))).toBe(webhookPreset)
      expect(d.resolve(new URL("https://hooks.slack.com/services/a"))).toBe(slackPreset)
      expect(d.resolve(new URL("https://discord.com/api/webhooks/1/t"))).toBe(discordPreset)
    }).pipe(Effect.provide(Destinations.layer)))

  const custom: Transform = (i) =>
    Either.right({
      url: i.subscription.url,
      method: "POST",
      headers: { "Content-Type": "text/plain", "X-Custom": i.eventId },
      body: `${i.event.operation}:${i.event.rkey}`,
      isSuccess: (status) => status === 202
    })
  const skip: Transform = () => Either.right(null)
  const broken: Transform = () => Either.left("transform_failed")
  const throwing: Transform = () => JSON.parse("{not json") as never

  it.effect("layerWith: custom destinations are checked first and can add, skip or fail", () =>
    Effect.gen(function*() {
      const d = yield* Destinations
      const i = input()
      const viaCustom = d.resolve(new URL("https://ntfy.example/topic"))(i)
      expect(Either.isRight(viaCustom) && viaCustom.right !== null && viaCustom.right.body).toBe("create:3l_a~b")
      if (Either.isRight(viaCustom) && viaCustom.right !== null) {
        expect(viaCustom.right.headers).toEqual({ "Content-Type": "text/plain", "X-Custom": "ev-1" })
        expect(viaCustom.right.isSuccess?.(202)).toBe(true)
        expect(viaCustom.right.isSuccess?.(200)).toBe(false)
      }
      expect(d.resolve(new URL("https://skip.example/"))(i)).toEqual(Either.right(null))
      expect(d.resolve(new URL("https://broken.example/"))(i)).toEqual(Either.left("transform_failed"))
      expect(d.resolve(new URL("https://throws.example/"))(i)).toEqual(Either.left("transform_failed"))
      // a custom entry matching a Slack URL wins over the built-in preset
      expect(d.resolve(new URL("https://hooks.slack.com/services/override"))).not.toBe(slackPreset)
      // built-ins and the fallback are still there for everything else
      expect(d.resolve(new URL("https://hooks.slack.com/services/a"))).toBe(slackPreset)
      expect(d.resolve(new URL("https://discord.com/api/webhooks/1/t"))).toBe(discordPreset)
      expect(d.resolve(new URL("https://receiver.example/x"))).toBe(webhookPreset)
      // a throwing matcher is skipped, not fatal
      expect(d.resolve(new URL("https://matcher-throws.example/"))).toBe(webhookPreset)
    }).pipe(
      Effect.provide(Destinations.layerWith([
        { name: "ntfy", matches: (u) => u.hostname === "ntfy.example", transform: custom },
        { name: "skip", matches: (u) => u.hostname === "skip.example", transform: skip },
        { name: "broken", matches: (u) => u.hostname === "broken.example", transform: broken },
        { name: "throws", matches: (u) => u.hostname === "throws.example", transform: throwing },
        { name: "slack-override", matches: (u) => u.pathname.endsWith("/override"), transform: skip },
        {
          name: "bad-matcher",
          matches: (u) => u.hostname === "matcher-throws.example" && (JSON.parse("{") as boolean),
          transform: skip
        }
      ]))
    ))

  it.effect("layerWith: an entry named like a built-in replaces it; `webhook` replaces the fallback", () =>
    Effect.gen(function*() {
      const d = yield* Destinations
      // `slack` was replaced by an entry that never matches: Slack URLs now get the fallback
      const slackUrl = d.resolve(new URL("https://hooks.slack.com/services/a"))
      expect(slackUrl).not.toBe(slackPreset)
      expect(slackUrl(input())).toEqual(Either.right(null))
      // the replaced fallback
      expect(d.resolve(new URL("https://receiver.example/x"))(input())).toEqual(Either.right(null))
      // discord untouched
      expect(d.resolve(new URL("https://discord.com/api/webhooks/1/t"))).toBe(discordPreset)
    }).pipe(
      Effect.provide(Destinations.layerWith([
        { name: "slack", matches: () => false, transform: broken },
        { name: "webhook", matches: () => false, transform: skip }
      ]))
    ))
})

describe("discordPreset: the limit itself (policy audit)", () => {
  it("a summary of exactly 2000 characters is sent whole, without the cut mark", () => {
    const prefix = "create app.bsky.feed.post `at://"
    const suffix = "/app.bsky.feed.post/3l_a~b`"
    const did = "did:web:" + "a".repeat(2_000 - prefix.length - suffix.length - "did:web:".length)
    const content = (JSON.parse(request(discordPreset, input({ event: { ...input().event, did } })).body) as {
      content: string
    }).content
    expect(content).toBe(prefix + did + suffix)
    expect(content).toHaveLength(2_000)
  })
})

describe("discordPreset: surrogate pairs at the cut (policy audit)", () => {
  it("a pair that ends exactly before the cut mark is kept whole", () => {
    // "create app.bsky.feed.post `at://did:web:" is 40 units: the pair takes indexes 1997 and 1998,
    // the last two units kept before the mark; a cut one unit earlier would keep its high surrogate alone
    const did = "did:web:" + "a".repeat(1_957) + "\u{1F98B}" + "a".repeat(600)
    const content = (JSON.parse(request(discordPreset, input({ event: { ...input().event, did } })).body) as {
      content: string
    }).content
    expect(content).toHaveLength(2_000)
    expect(content.endsWith("\u{1F98B}…")).toBe(true)
  })
})

describe("Destinations: replaced built-ins (policy audit)", () => {
  it.effect("an entry named `discord` removes the built-in Discord preset: URLs it does not match get the fallback", () =>
    Effect.gen(function*() {
      const d = yield* Destinations
      expect(d.resolve(new URL("https://discord.com/api/webhooks/1/t"))).toBe(webhookPreset)
      expect(d.resolve(new URL("https://hooks.slack.com/services/a"))).toBe(slackPreset)
    }).pipe(
      Effect.provide(Destinations.layerWith([{ name: "discord", matches: () => false, transform: slackPreset }]))
    ))

  it.effect("a `webhook` entry that throws is a transform failure, not a defect", () =>
    Effect.gen(function*() {
      const d = yield* Destinations
      const transform = d.resolve(new URL("https://receiver.example/x"))
      expect(transform(input())).toEqual(Either.left("transform_failed"))
    }).pipe(
      Effect.provide(Destinations.layerWith([{
        name: "webhook",
        matches: () => false,
        transform: () => {
          throw new Error("a broken embedding transform")
        }
      }]))
    ))
})
