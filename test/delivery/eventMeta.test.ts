/**
 * `eventMeta` reads `cid` and `timestamp` from the ends of a canonical body instead of parsing it;
 * it must agree with a full parse for every shape of body the outbox stores, and fall back to a
 * parse for anything that is not in canonical form.
 */
import { describe, expect, it } from "@effect/vitest"
import { Either } from "effect"
import { eventMeta } from "../../src/services/delivery/Delivery.js"
import { buildPayload } from "../../src/services/matching/Canonical.js"
import { ev, plc } from "../support/stack.js"

const parsed = (body: string) => {
  const o = JSON.parse(body) as { cid?: string; timestamp?: string }
  return { cid: o.cid, timestamp: o.timestamp ?? "" }
}

const bodyOf = (e: Parameters<typeof buildPayload>[0]) => {
  const p = buildPayload(e, e.record)
  if (Either.isLeft(p)) throw new Error(p.left)
  return p.right.body
}

describe("eventMeta", () => {
  it("agrees with JSON.parse on canonical bodies: create, update, delete, nested timestamps, large records", () => {
    const bodies = [
      bodyOf(ev(plc(1), "app.bsky.feed.post", "p1")),
      bodyOf(ev(plc(1), "app.bsky.feed.post", "p2", { operation: "update", cid: "bafyreiaaaa" })),
      bodyOf(ev(plc(1), "app.bsky.feed.post", "p3", { operation: "delete" })),
      bodyOf(
        ev(plc(1), "x.y.z", "p4", {
          record: {
            timestamp: "not-this-one",
            cid: "nor-this",
            nested: { timestamp: "deep" },
            text: "t".repeat(100_000)
          }
        })
      ),
      bodyOf(ev(plc(1), "x.y.z", "p5", { record: { text: "quotes \" and \\ backslashes }\"" } }))
    ]
    for (const body of bodies) expect(eventMeta(body)).toEqual(parsed(body))
    expect(eventMeta(bodies[2] ?? "").cid).toBeUndefined()
    expect(eventMeta(bodies[1] ?? "").cid).toBe("bafyreiaaaa")
  })

  it("falls back to a parse for bodies that are not canonical, and never throws", () => {
    const spaced = "{ \"timestamp\": \"2026-01-01T00:00:00.000Z\", \"cid\": \"bafyx\" }"
    expect(eventMeta(spaced)).toEqual({ cid: "bafyx", timestamp: "2026-01-01T00:00:00.000Z" })
    expect(eventMeta("{\"cid\":\"esc\\\"aped\",\"timestamp\":\"t\"}")).toEqual({ cid: "esc\"aped", timestamp: "t" })
    expect(eventMeta("not json")).toEqual({ cid: undefined, timestamp: "" })
    expect(eventMeta("[]")).toEqual({ cid: undefined, timestamp: "" })
  })
})
