/**
 * Relay frames (SPEC §3.2) at the edges a mutation audit found untested: message names are
 * 1–128 characters of `[A-Za-z0-9_.-]`; `seq` a whole number; `time` at most 64 characters with
 * its `:` separators, a leap second accepted; `tooBig` only when it is `true`; an op, a header or
 * a record block that is a byte string is no map; a CAR that ends in a truncated block is
 * malformed; and a record decoded by the wide-integer path keeps every DAG-CBOR rule the fast
 * path has (minimal encoding, no duplicate keys, no indefinite lengths, no NaN, CID links of
 * CIDv1 dag-cbor/raw sha2-256 only), with byte strings in arrays as `{$bytes}` too, and a
 * `__proto__` key as an own key (it set the record's prototype before, and a wide integer inside it
 * made the frame poison).
 */
import * as Cbor from "@atcute/cbor"
import { Either } from "effect"
import { describe, expect, it } from "vitest"
import type { FrameErrorReason } from "../../src/schemas/Jetstream.js"
import type { RecordEvent } from "../../src/schemas/RecordEvent.js"
import { decodeRelayFrame, parseTimeUs } from "../../src/schemas/RelayFrame.js"
import { car, cidBytes, commitFrame, DID, errorFrame, frame, infoFrame, REV, TIME, TIME_US } from "./frames.js"

const ctx = { stream: "relay", relay: "wss://bsky.network", maxBytes: 1 << 20 }
const POST = "app.bsky.feed.post"

const reasonOf = (bytes: Uint8Array): FrameErrorReason | "ok" => {
  const r = decodeRelayFrame(bytes, ctx)
  return Either.isLeft(r) ? r.left.reason : "ok"
}

/** The frame's body changed by `f` (header and every other field as they were). */
const withBody = (bytes: Uint8Array, f: (b: Record<string, unknown>) => Record<string, unknown>): Uint8Array => {
  const [header, rest] = Cbor.decodeFirst(bytes)
  return frame(header, f(Cbor.decode(rest) as Record<string, unknown>))
}

/** A commit creating one record whose block is exactly `block`. */
const withBlock = (block: Uint8Array): Uint8Array =>
  commitFrame({ seq: 9, ops: [{ action: "create", path: `${POST}/k`, record: {}, block }] })

const bytesOf = (...parts: ReadonlyArray<ReadonlyArray<number> | Uint8Array>): Uint8Array =>
  Uint8Array.from(parts.flatMap((p) => Array.from(p)))

/** 2^61 + 2 as a DAG-CBOR unsigned integer: outside ±(2^53 − 1), so only the wide path reads it */
const WIDE = [0x1b, 0x20, 0, 0, 0, 0, 0, 0, 2]
const key = (k: string) => [0x60 + k.length, ...Array.from(k, (c) => c.charCodeAt(0))]
/** a tag-42 CID link whose content (0x00 ‖ CID) is `content` */
const link = (content: Uint8Array) => [0xd8, 0x2a, 0x58, content.length, ...content]
const GOOD_CID = bytesOf([0x00], cidBytes(Uint8Array.from([7])))

describe("relay message names", () => {
  it("error and #info names are 1–128 characters of [A-Za-z0-9_.-]", () => {
    expect(reasonOf(errorFrame("Future_Cursor.v-2"))).toBe("ok")
    for (const name of ["", "Future Cursor", "Future\nCursor", "Curs\u00e9r", "a/b", "a:b"]) {
      expect([name, reasonOf(errorFrame(name))]).toEqual([name, "shape"])
      expect([name, reasonOf(infoFrame(name))]).toEqual([name, "shape"])
    }
  })

  it("a header or a body that is a byte string is no map", () => {
    expect(reasonOf(frame(Cbor.toBytes(Uint8Array.from([1])), { seq: 1 }))).toBe("shape")
    expect(reasonOf(frame({ op: 1, t: "#identity" }, Cbor.toBytes(Uint8Array.from([1]))))).toBe("shape")
  })
})

describe("relay seq and time", () => {
  const identity = (body: Record<string, unknown>) =>
    frame({ op: 1, t: "#identity" }, { seq: 1, did: DID, time: TIME, ...body })

  it("seq is a whole number: 1.5 is refused as a frame, never thrown", () => {
    expect(reasonOf(identity({ seq: 1 }))).toBe("ok")
    expect(() => decodeRelayFrame(identity({ seq: 1.5 }), ctx)).not.toThrow()
    expect(reasonOf(identity({ seq: 1.5 }))).toBe("time")
  })

  it("time: at most 64 characters (a 43-digit fraction), a leap second, ':' separators only", () => {
    const at64 = `2024-09-05T06:11:04.870123${"0".repeat(37)}Z`
    expect(at64.length).toBe(64)
    expect(parseTimeUs(at64)).toBe(TIME_US)
    expect(parseTimeUs(`2024-09-05T06:11:04.870123${"0".repeat(38)}Z`)).toBeUndefined()
    expect(parseTimeUs("2024-09-05T06:11:60Z")).toBe(Date.UTC(2024, 8, 5, 6, 12, 0) * 1000)
    expect(parseTimeUs("2024-09-05T06x11:04Z")).toBeUndefined()
    expect(parseTimeUs("2024-09-05T06:11x04Z")).toBeUndefined()
  })
})

describe("relay commits", () => {
  const good = commitFrame({ seq: 7, ops: [{ action: "create", path: `${POST}/k`, record: { a: 1 } }] })

  it("tooBig other than true does not drop the commit's records", () => {
    const r = decodeRelayFrame(withBody(good, (b) => ({ ...b, tooBig: 1 })), ctx)
    expect(Either.isRight(r) && r.right.kind === "events" && r.right.events.length).toBe(1)
  })

  it("an op that is an array or a byte string is no map", () => {
    expect(reasonOf(withBody(good, (b) => ({ ...b, ops: [["create"]] })))).toBe("shape")
    expect(reasonOf(withBody(good, (b) => ({ ...b, ops: [Cbor.toBytes(Uint8Array.from([1]))] })))).toBe("shape")
  })

  it("a record block that is a byte string is no record", () => {
    expect(reasonOf(withBlock(Cbor.encode(Cbor.toBytes(Uint8Array.from([1, 2, 3])))))).toBe("record")
  })

  it("a CAR ending in a truncated block is malformed, though the record's block came before it", () => {
    const data = Cbor.encode({ $type: POST, text: "hi" })
    const cid = cidBytes(data)
    const whole = car([cid], [{ cid, data }])
    const body = {
      seq: 8,
      repo: DID,
      time: TIME,
      rev: REV,
      // a block announcing 100 bytes, of which 5 follow
      blocks: Cbor.toBytes(bytesOf(whole, [100, 1, 2, 3, 4, 5])),
      ops: [{ action: "create", path: `${POST}/k`, cid: new Cbor.CidLinkWrapper(cid) }]
    }
    expect(reasonOf(frame({ op: 1, t: "#commit" }, { ...body, blocks: Cbor.toBytes(whole) }))).toBe("ok")
    expect(reasonOf(frame({ op: 1, t: "#commit" }, body))).toBe("record")
  })
})

describe("relay records with integers outside ±(2^53 − 1): the wide path keeps the DAG-CBOR rules", () => {
  it("control: a wide integer next to a valid CID link is read", () => {
    const r = decodeRelayFrame(withBlock(bytesOf([0xa2], key("a"), link(GOOD_CID), key("b"), WIDE)), ctx)
    if (Either.isLeft(r) || r.right.kind !== "events") throw new Error("refused")
    const record = (r.right.events[0] as RecordEvent).record
    expect(record).toEqual({ a: { $link: new Cbor.CidLinkWrapper(GOOD_CID.subarray(1)).$link }, b: 2n ** 61n + 2n })
  })

  const refused: ReadonlyArray<readonly [string, Uint8Array]> = [
    ["a non-minimal integer (1 in two bytes)", bytesOf([0xa2], key("a"), WIDE, key("b"), [0x18, 0x01])],
    ["a duplicate key whose last value is the wide integer", bytesOf([0xa2], key("a"), [0x01], key("a"), WIDE)],
    ["an indefinite-length array", bytesOf([0xa2], key("a"), WIDE, key("b"), [0x9f, 0x01, 0xff])],
    ["a NaN", bytesOf([0xa2], key("a"), WIDE, key("b"), [0xf9, 0x7e, 0x00])],
    ["a CID link with a byte after the CID", bytesOf([0xa2], key("a"), link(bytesOf(GOOD_CID, [0])), key("b"), WIDE)],
    [
      "a CID link without its 0x00 prefix",
      bytesOf([0xa2], key("a"), link(bytesOf([0x01], GOOD_CID.subarray(1))), key("b"), WIDE)
    ],
    [
      "a CID link of another codec (dag-pb)",
      bytesOf([0xa2], key("a"), link(bytesOf(GOOD_CID.subarray(0, 2), [0x70], GOOD_CID.subarray(3))), key("b"), WIDE)
    ],
    [
      "a CID link of another hash (sha2-512's code)",
      bytesOf([0xa2], key("a"), link(bytesOf(GOOD_CID.subarray(0, 3), [0x13], GOOD_CID.subarray(4))), key("b"), WIDE)
    ],
    [
      "a CID link whose digest length is not 32",
      bytesOf([0xa2], key("a"), link(bytesOf(GOOD_CID.subarray(0, 4), [0x40], GOOD_CID.subarray(5))), key("b"), WIDE)
    ],
    ["a CID link whose content is no byte string", bytesOf([0xa2], key("a"), [0xd8, 0x2a, 0x80], key("b"), WIDE)],
    ["a tag other than 42", bytesOf([0xa2], key("a"), [0xc1, 0x01], key("b"), WIDE)],
    [
      "a tag other than 42 holding a CID",
      bytesOf([0xa2], key("a"), [0xc1, 0x58, GOOD_CID.length], GOOD_CID, key("b"), WIDE)
    ],
    ["an integer map key", bytesOf([0xa2], key("a"), WIDE, [0x01], [0x02])],
    ["an undefined", bytesOf([0xa2], key("a"), WIDE, key("b"), [0xf7])],
    ["a map announcing more entries than it holds", bytesOf([0xa3], key("a"), WIDE, key("b"), [0x01])],
    ["an array announcing more items than it holds", bytesOf([0xa1], key("a"), [0x83, 0x01], WIDE)],
    ["a byte after the record", bytesOf([0xa1], key("a"), WIDE, [0x01])]
  ]
  for (const [what, block] of refused) {
    it(`${what} → record`, () => expect(reasonOf(withBlock(block))).toBe("record"))
  }

  it("a record nested 100,000 levels deep is read (the decoding does not recurse)", () => {
    const depth = 100_000
    const r = decodeRelayFrame(
      withBlock(bytesOf([0xa2], key("a"), new Uint8Array(depth).fill(0x81), WIDE, key("b"), [0xd8, 0x2a, 0x80])),
      ctx
    )
    // control: the same nesting with a tag-42 that holds no CID is refused
    expect(Either.isLeft(r) && r.left.reason).toBe("record")
    const ok = decodeRelayFrame(withBlock(bytesOf([0xa1], key("a"), new Uint8Array(depth).fill(0x81), WIDE)), ctx)
    if (Either.isLeft(ok) || ok.right.kind !== "events") throw new Error("refused")
    let v: unknown = ((ok.right.events[0] as RecordEvent).record as { a: unknown }).a
    let levels = 0
    for (; Array.isArray(v) && v.length === 1; levels++) v = v[0]
    expect([levels, v]).toEqual([depth, 2n ** 61n + 2n])
  })

  it("empty arrays and maps are read beside the wide integer, at any depth", () => {
    const r = decodeRelayFrame(
      withBlock(bytesOf([0xa3], key("a"), [0x80], key("b"), [0xa1], key("c"), [0x82, 0xa0, 0x80], key("d"), WIDE)),
      ctx
    )
    if (Either.isLeft(r) || r.right.kind !== "events") throw new Error("refused")
    expect((r.right.events[0] as RecordEvent).record).toEqual({ a: [], b: { c: [{}, []] }, d: 2n ** 61n + 2n })
  })

  it("byte strings in arrays become {$bytes}, as in maps", () => {
    const r = decodeRelayFrame(withBlock(bytesOf([0xa2], key("a"), WIDE, key("b"), [0x81, 0x42, 0xde, 0xad])), ctx)
    if (Either.isLeft(r) || r.right.kind !== "events") throw new Error("refused")
    expect((r.right.events[0] as RecordEvent).record).toEqual({ a: 2n ** 61n + 2n, b: [{ $bytes: "3q0" }] })
  })
})

describe("relay records with integers outside ±(2^53 − 1): a `__proto__` key", () => {
  const recordOf = (bytes: Uint8Array): Record<string, unknown> => {
    const r = decodeRelayFrame(withBlock(bytes), ctx)
    if (Either.isLeft(r) || r.right.kind !== "events") throw new Error(`refused: ${JSON.stringify(r)}`)
    return (r.right.events[0] as RecordEvent).record as Record<string, unknown>
  }
  const subject = bytesOf(key("subject"), key("at://x"))

  it("stays an own data property: the record's prototype is Object.prototype, nothing inherited", () => {
    const record = recordOf(bytesOf([0xa2], key("n"), WIDE, key("__proto__"), [0xa1], subject))
    expect(Object.getPrototypeOf(record)).toBe(Object.prototype)
    expect(Object.keys(record)).toEqual(["n", "__proto__"])
    expect(Object.getOwnPropertyDescriptor(record, "__proto__")?.value).toEqual({ subject: "at://x" })
    expect(record["subject"]).toBeUndefined()
  })

  it("holding the wide integer, is read (not a poison frame)", () => {
    const record = recordOf(bytesOf([0xa2], key("$type"), key(POST), key("__proto__"), [0xa1], key("n"), WIDE))
    expect(Object.getPrototypeOf(record)).toBe(Object.prototype)
    expect(Object.getOwnPropertyDescriptor(record, "__proto__")?.value).toEqual({ n: 2n ** 61n + 2n })
  })

  it("a map key that is not a string is no DAG-CBOR record", () => {
    expect(reasonOf(withBlock(bytesOf([0xa2], key("a"), WIDE, [0x01], [0x02])))).toBe("record")
  })
})

describe("relay commit bounds", () => {
  it("ops that name one record block share one decoded record: decoded once, not once per op", () => {
    // a 100 KB record block sent once, named by 400 ops (a small frame that decoded 400 copies,
    // 2.6 GB of heap for a record of empty maps)
    const block = Cbor.encode({ pad: "x".repeat(100_000), n: 1 })
    const frameOf = (n: number) =>
      withBody(
        commitFrame({
          seq: 9,
          omitBlocks: true,
          ops: Array.from(
            { length: n },
            (_, i) => ({ action: "create" as const, path: `${POST}/k${i}`, record: {}, block })
          )
        }),
        (b) => ({ ...b, blocks: Cbor.toBytes(car([cidBytes(block)], [{ cid: cidBytes(block), data: block }])) })
      )
    const bytes = frameOf(400)
    expect(bytes.length).toBeLessThan(150_000)
    const r = decodeRelayFrame(bytes, ctx)
    if (Either.isLeft(r) || r.right.kind !== "events") return expect.unreachable()
    const events = r.right.events
    expect(events).toHaveLength(400)
    const first = events[0]
    if (first === undefined || first.kind !== "commit") return expect.unreachable()
    expect(first.record).toEqual({ pad: "x".repeat(100_000), n: 1 })
    expect(events.every((e) => e.kind === "commit" && e.record === first.record)).toBe(true)
    expect(events.map((e) => e.kind === "commit" ? e.rkey : "")).toEqual(events.map((_, i) => `k${i}`))
  })
})
