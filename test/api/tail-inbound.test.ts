/**
 * The live tail is one way, so the service holds nothing a client sends: on Node's server, once
 * the client's data frames (headers and announced payloads) pass `TailSocket.MAX_INBOUND_BYTES`
 * (1 KiB) its socket is ended, as soon as the header announcing them arrives; `ws` would otherwise
 * buffer a message up to its `maxPayload` (100 MiB) before the handler saw it. Control frames
 * (pings: at most 125 bytes each, the protocol's bound) are not counted. (Bun bounds a message by
 * its server's `maxPayloadLength`, 16 MiB by default, which firehook cannot set: docs/decisions.md.)
 */
import { describe, expect, it, layer } from "@effect/vitest"
import { Effect, TestClock } from "effect"
import type * as Net from "node:net"
import { Tail } from "../../src/services/api/Tail.js"
import * as TailSocket from "../../src/services/api/TailSocket.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import { apiLayer, mint, newOwner, serverPort } from "./support.js"
import { openTailOrDie, outcome, until, untilEffect } from "./tailClient.js"

const NSID = "dev.firehook.webhook.subscribeDeliveries"
const HIGH = { limit: 1_000_000, perMs: 60_000 }
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const connections = Effect.flatMap(Tail, (t) => Effect.map(t.stats, (s) => s.connections))

/** A masked client frame's header: `opcode`, FIN or not, announcing `length` bytes (mask key 0). */
const header = (opcode: number, length: number, fin = true) => {
  const ext = length < 126 ? 0 : length < 65_536 ? 2 : 8
  const h = Buffer.alloc(2 + ext + 4)
  h[0] = (fin ? 0x80 : 0) | opcode
  h[1] = 0x80 | (ext === 0 ? length : ext === 2 ? 126 : 127)
  if (ext === 2) h.writeUInt16BE(length, 2)
  if (ext === 8) h.writeBigUInt64BE(BigInt(length), 2)
  return h
}
const frame = (opcode: number, length: number, fin = true) =>
  Buffer.concat([header(opcode, length, fin), Buffer.alloc(length)])

/** Feeds `chunks` to a guard of `max` bytes: whether it ended the socket. */
const ends = (max: number, chunks: ReadonlyArray<Buffer>) => {
  let ended = 0
  const guard = TailSocket.inboundGuard(max, () => ended++)
  for (const c of chunks) guard(c)
  expect(ended).toBeLessThanOrEqual(1)
  return ended === 1
}

/** Every byte of `bytes` in a chunk of its own. */
const bytewise = (bytes: Buffer) => Array.from(bytes, (b) => Buffer.from([b]))

describe("TailSocket.inboundGuard", () => {
  it("counts data frames by their headers and ends past the bound, however the bytes are split", () => {
    // a text frame of 1,016 bytes: 8 of header, exactly 1,024 in all
    const atBound = frame(0x1, 1016)
    expect(ends(1024, [atBound])).toBe(false)
    expect(ends(1024, bytewise(atBound))).toBe(false)
    expect(ends(1024, [frame(0x1, 1017)])).toBe(true)
    // announced is enough: a header alone, its payload never sent (64 MiB)
    expect(ends(1024, [header(0x2, 64 * 1024 * 1024)])).toBe(true)
    expect(ends(1024, bytewise(header(0x2, 64 * 1024 * 1024)))).toBe(true)
    // a message in fragments: the fragments add up
    const fragments = [frame(0x1, 500, false), frame(0x0, 500, false), frame(0x0, 500)]
    expect(ends(1024, fragments)).toBe(true)
    expect(ends(1024, [Buffer.concat(fragments)])).toBe(true)
    // many small messages add up too
    expect(ends(1024, Array.from({ length: 200 }, () => frame(0x1, 1)))).toBe(true)
  })

  it("does not count control frames (ping, pong, close)", () => {
    const control = Array.from({ length: 100 }, (_, i) => frame([0x9, 0xa][i % 2] ?? 0x9, 125))
    expect(ends(1024, [...control, frame(0x8, 2)])).toBe(false)
    // and follows the frames after them: a data frame still counts
    expect(ends(1024, [...control, frame(0x1, 2000)])).toBe(true)
  })
})

describe("the live tail on Node's server: what a client sends", () => {
  layer(apiLayer({ api: { limits: { callsPerCaller: HIGH, failedAuthPerAddress: HIGH } } }))((it) => {
    it.effect("a client frame announcing 64 MiB ends the socket at once, and the connection's place is given back", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const tail = yield* openTailOrDie(yield* serverPort, yield* mint(owner, NSID))
        yield* untilEffect("served", Effect.map(connections, (n) => n === 1))
        const raw = (tail.ws as unknown as { readonly _socket: Net.Socket })._socket
        // the header and the first 64 KiB of a 64 MiB text frame, the rest never sent
        raw.write(header(0x1, 64 * 1024 * 1024))
        raw.write(Buffer.alloc(64 * 1024, 0x61))
        yield* until("the socket ended by the service", () => tail.closed !== undefined)
        // ended, not closed with a frame: the service did not wait for the message
        expect(tail.closed?.code).toBe(1006)
        yield* untilEffect("released", Effect.map(connections, (n) => n === 0))
      }))

    it.effect("pings (control frames) do not count: the tail goes on", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const tail = yield* openTailOrDie(yield* serverPort, yield* mint(owner, NSID))
        yield* untilEffect("served", Effect.map(connections, (n) => n === 1))
        let pongs = 0
        tail.ws.on("pong", () => pongs++)
        // 20 pings of 125 bytes: over 2 KiB
        for (let i = 0; i < 20; i++) tail.ws.ping(Buffer.alloc(125))
        yield* until("pongs", () => pongs === 20)
        const next = outcome(owner.did)
        yield* Effect.flatMap(DeliveryOutcomes.DeliveryOutcomes, (o) => o.publish(next))
        yield* until("a frame", () => tail.frames.length === 1)
        expect(tail.frames[0]?.["id"]).toBe(next.id)
        expect(tail.closed).toBeUndefined()
        tail.ws.close(1000)
        yield* until("closed", () => tail.closed !== undefined)
        yield* untilEffect("released", Effect.map(connections, (n) => n === 0))
      }))
  })
})
