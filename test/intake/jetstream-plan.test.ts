/**
 * Which Jetstream stream handles which event (SPEC §3.1): the `registry` stream wh records, the
 * `direct` stream the events of the direct set's DIDs, the `backlink` stream the rest of the network.
 * An event is processed by one stream only.
 */
import { Duration, Effect } from "effect"
import { describe, expect, it } from "vitest"
import { WH_COLLECTION } from "../../src/schemas/WhRecord.js"
import { jetstreamSpecs } from "../../src/services/intake/JetstreamPlan.js"
import { WebhookIndex } from "../../src/services/matching/WebhookIndex.js"
import { event, plc, webhook } from "../matching/fixtures.js"

const OWNER = plc(1)
const WATCHED = plc(2)
const OTHER = plc(3)
const POST = "app.bsky.feed.post"

describe("the Jetstream streams split the events between them", () => {
  const index = new WebhookIndex()
  index.upsert(webhook(OWNER, "w", `at://${WATCHED}`, { backlinks: true }))
  const specs = jetstreamSpecs({
    url: "wss://jetstream.example/subscribe",
    common: { maxBytes: 1 << 20, connectTimeoutMs: 1000, allowInsecure: false },
    index,
    directDidsMax: 10,
    reconfigureDelay: Duration.seconds(1),
    makeRunner: () => Effect.dieMessage("unused"),
    start: () => Effect.dieMessage("unused")
  })

  it("the backlink stream skips the direct set's DIDs (owners and scope DIDs) and wh records; it keeps the rest", () => {
    const skip = specs.backlink.skip
    expect(skip?.(event(WATCHED, POST, "k"))).toBe(true)
    expect(skip?.(event(OWNER, POST, "k"))).toBe(true)
    expect(skip?.(event(OTHER, WH_COLLECTION, "k"))).toBe(true)
    expect(skip?.(event(OTHER, POST, "k"))).toBe(false)
  })

  it("the backlink stream skips every #identity and #account event (the registry stream gets them all)", () => {
    const skip = specs.backlink.skip
    const base = { did: OTHER, timeUs: 1, stream: "backlink", relay: "wss://jetstream.example/subscribe", cursor: "1" }
    expect(skip?.({ ...base, kind: "identity" })).toBe(true)
    expect(skip?.({ ...base, kind: "account", active: true })).toBe(true)
  })

  it("the direct stream skips only wh records (the registry stream's)", () => {
    const skip = specs.direct.skip
    expect(skip?.(event(WATCHED, WH_COLLECTION, "k"))).toBe(true)
    expect(skip?.(event(WATCHED, POST, "k"))).toBe(false)
    expect(specs.registry.skip).toBeUndefined()
  })
})
