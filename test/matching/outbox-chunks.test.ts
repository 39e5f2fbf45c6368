/**
 * Outbox insert chunks (SPEC §3.5: ≤ 1,000 rows, ≤ 4 MiB): the chunker never goes over the byte
 * bound (an item larger than the bound alone is a chunk of its own), and bodies are measured in
 * UTF-8 bytes, not UTF-16 code units. Pure; no database.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Layer } from "effect"
import { buildPayload } from "../../src/services/matching/Canonical.js"
import type { MatchResult } from "../../src/services/matching/Match.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { event, plc, webhook } from "./fixtures.js"

const KiB = 1024
const MiB = 1024 * KiB

const limits = (chunkBytes: number, chunkRows = 1000): Outbox.OutboxLimits => ({
  maxFanout: 100,
  maxEventBytes: 16 * MiB,
  chunkRows,
  chunkBytes
})

const body = (n: number, text: string): Outbox.EventBody => ({
  eventId: `whe_v1_${n}`,
  body: text,
  sha256: "0".repeat(64)
})

/** the chunks `write` would send: split by repeated chunkEnd (each chunk is non-empty, so ≤ list.length rounds) */
const split = <A>(list: ReadonlyArray<A>, l: Outbox.OutboxLimits, size: (a: A) => number) => {
  const out: Array<ReadonlyArray<A>> = []
  for (let start = 0, round = 0; start < list.length && round <= list.length; round++) {
    const end = Outbox.chunkEnd(list, start, l, size)
    expect(end).toBeGreaterThan(start)
    out.push(list.slice(start, end))
    start = end
  }
  expect(out.reduce((n, c) => n + c.length, 0)).toBe(list.length)
  return out
}
const utf8 = (s: string) => Buffer.byteLength(s, "utf8")
const sum = <A>(chunk: ReadonlyArray<A>, size: (a: A) => number) => chunk.reduce((n, a) => n + size(a), 0)

describe("chunkEnd", () => {
  const id = (n: number) => n

  it("never adds an item that would take the chunk over the byte bound", () => {
    // 60 + 41 = 101 > 100: the second item starts a new chunk
    expect(split([60, 41, 1], limits(100), id)).toEqual([[60], [41, 1]])
    // exactly at the bound is allowed
    expect(split([60, 40, 1], limits(100), id)).toEqual([[60, 40], [1]])
    expect(split([100, 1], limits(100), id)).toEqual([[100], [1]])
  })

  it("an item larger than the bound goes alone, and the chunker still advances", () => {
    expect(split([150, 10, 10, 250], limits(100), id)).toEqual([[150], [10, 10], [250]])
    expect(split([10, 150], limits(100), id)).toEqual([[10], [150]])
  })

  it("the row bound: at most chunkRows items per chunk", () => {
    expect(split([1, 1, 1, 1, 1, 1, 1], limits(100, 3), id)).toEqual([[1, 1, 1], [1, 1, 1], [1]])
    const many = Array.from({ length: 2001 }, () => 1)
    expect(split(many, limits(4 * MiB), id).map((c) => c.length)).toEqual([1000, 1000, 1])
  })

  it("512 KiB bodies near the 4 MiB bound: every chunk is within it", () => {
    const full = 512 * KiB
    const sizes = [...Array.from({ length: 7 }, () => full), 1, full, full - 1, 2, full]
    const chunks = split(sizes, limits(4 * MiB), id)
    for (const c of chunks) expect(sum(c, id)).toBeLessThanOrEqual(4 * MiB)
    expect(chunks.map((c) => c.length)).toEqual([8, 4])
  })
})

describe("bodies are measured in UTF-8 bytes", () => {
  it("bodySize counts bytes, not UTF-16 code units", () => {
    expect(Outbox.bodySize(body(1, "abc"))).toBe(3)
    expect(Outbox.bodySize(body(1, "é"))).toBe(2)
    expect(Outbox.bodySize(body(1, "€".repeat(30)))).toBe(90)
    expect(Outbox.bodySize(body(1, "😀"))).toBe(4)
  })

  it("multibyte bodies are chunked by their byte size", () => {
    // 30 code units but 90 bytes each: two never share a 100-byte chunk
    const bodies = [body(1, "€".repeat(30)), body(2, "€".repeat(30)), body(3, "é".repeat(5))]
    const chunks = split(bodies, limits(100), Outbox.bodySize)
    expect(chunks.map((c) => c.map((b) => b.eventId))).toEqual([["whe_v1_1"], ["whe_v1_2", "whe_v1_3"]])
    for (const c of chunks) expect(sum(c, (b) => utf8(b.body))).toBeLessThanOrEqual(100)
  })

  it("fitsOneChunk: nine bodies of ~512 KiB of 3-byte characters do not fit one 4 MiB chunk", () => {
    const text = "€".repeat(Math.floor((512 * KiB) / 3)) // 174,762 code units, 524,286 bytes
    const bodies = Array.from({ length: 9 }, (_, i) => body(i, text))
    expect(Outbox.fitsOneChunk(bodies, [], Outbox.defaultLimits(100))).toBe(false)
    expect(Outbox.fitsOneChunk(bodies.slice(0, 8), [], Outbox.defaultLimits(100))).toBe(true)
  })

  it("fitsOneChunk: a last body that would go over the bound by one byte does not fit", () => {
    const bodies = [
      ...Array.from({ length: 7 }, (_, i) => body(i, "x".repeat(512 * KiB))),
      body(7, "y"),
      body(8, "z".repeat(512 * KiB - 1))
    ]
    expect(sum(bodies, Outbox.bodySize)).toBe(4 * MiB)
    expect(Outbox.fitsOneChunk(bodies, [], Outbox.defaultLimits(100))).toBe(true)
    const over = [...bodies.slice(0, 8), body(8, "z".repeat(512 * KiB))]
    expect(Outbox.fitsOneChunk(over, [], Outbox.defaultLimits(100))).toBe(false)
  })
})

describe("write sends body chunks within the byte bound", () => {
  it.effect("multibyte bodies: one insert per chunk, each ≤ chunkBytes in UTF-8 bytes", () => {
    const sent: Array<ReadonlyArray<Outbox.EventBody>> = []
    const store: Outbox.OutboxStoreShape = {
      insertEvents: (bodies) =>
        Effect.sync(() => {
          sent.push(bodies)
          return new Map<string, string>()
        }),
      insertRows: (rows) => Effect.succeed(rows.length),
      insertQuarantine: () => Effect.void,
      notify: Effect.void,
      insertBatch: () => Effect.dieMessage("the batch does not fit one chunk: insertBatch must not be used")
    }
    const l = limits(1000)
    const bodies = Array.from({ length: 10 }, (_, i) => body(i, "€".repeat(200))) // 600 bytes, 200 units each
    const prepared: Outbox.Prepared = {
      items: [],
      accepted: [],
      bodies,
      rows: [],
      oneChunk: Outbox.fitsOneChunk(bodies, [], l),
      limits: l
    }
    return Effect.gen(function*() {
      expect(prepared.oneChunk).toBe(false)
      yield* Outbox.write(prepared)
      expect(sent.map((c) => c.length)).toEqual(Array.from({ length: 10 }, () => 1))
      for (const c of sent) expect(sum(c, (b) => utf8(b.body))).toBeLessThanOrEqual(1000)
    }).pipe(Effect.provide(Layer.succeed(Outbox.OutboxStore, store)))
  })
})

describe("prepare: the fan-out bound (SPEC §3.5: fan-out > the active-webhook limit → fanout_limit)", () => {
  const e = event(plc(1), "app.bsky.feed.post", "3kabc")
  const payload = buildPayload(e, e.record)
  const item = (n: number): Outbox.EnqueueItem => {
    if (Either.isLeft(payload)) throw new Error("payload")
    const matches: ReadonlyArray<MatchResult> = Array.from(
      { length: n },
      (_, i) => ({ webhook: webhook(plc(100 + i), `w${i}`, `at://${plc(1)}`), match: "direct" })
    )
    return { event: e, payload: payload.right, matches }
  }

  it("a fan-out equal to the limit is enqueued; one more is refused", () => {
    const l = { ...limits(4 * MiB), maxFanout: 3 }
    const at = Outbox.prepare([item(3)], l)
    expect(at.accepted.map((a) => a.index)).toEqual([0])
    expect(at.rows).toHaveLength(3)
    const over = Outbox.prepare([item(4), item(2)], l)
    expect(over.accepted.map((a) => a.index)).toEqual([1])
    expect(over.rows).toHaveLength(2)
  })
})
