/**
 * Test fixtures: real `subscribeRepos` frames (DAG-CBOR header ‖ body, CAR blocks with sha-256
 * dag-cbor CIDs) and Jetstream JSON frames, built in-process. Runs under Node and Bun.
 */
import * as Cbor from "@atcute/cbor"
import { createHash } from "node:crypto"

export const DID = "did:plc:eygmaihciaxprqvxpfvl6flk"
export const DID2 = "did:web:example.com"
export const REV = "3l3qo2vutsw2b"
export const TIME = "2024-09-05T06:11:04.870123Z"
export const TIME_US = 1725516664870123

const concat = (parts: ReadonlyArray<Uint8Array>): Uint8Array => {
  let n = 0
  for (const p of parts) n += p.length
  const out = new Uint8Array(n)
  let o = 0
  for (const p of parts) {
    out.set(p, o)
    o += p.length
  }
  return out
}

const varint = (n: number): Uint8Array => {
  const out: Array<number> = []
  let v = n
  while (v >= 0x80) {
    out.push((v & 0x7f) | 0x80)
    v = Math.floor(v / 128)
  }
  out.push(v)
  return Uint8Array.from(out)
}

/** CIDv1, dag-cbor (0x71), sha2-256 (0x12, 32 bytes): the 36 raw CID bytes. */
export const cidBytes = (data: Uint8Array): Uint8Array =>
  concat([Uint8Array.from([0x01, 0x71, 0x12, 0x20]), new Uint8Array(createHash("sha256").update(data).digest())])

export const cidLink = (data: Uint8Array): Cbor.CidLinkWrapper => new Cbor.CidLinkWrapper(cidBytes(data))

export interface Block {
  readonly cid: Uint8Array
  readonly data: Uint8Array
}

/** CARv1: varint(len) ‖ dag-cbor {version: 1, roots}, then per block varint(len) ‖ cid ‖ bytes. */
export const car = (roots: ReadonlyArray<Uint8Array>, blocks: ReadonlyArray<Block>): Uint8Array => {
  const header = Cbor.encode({ version: 1, roots: roots.map((r) => new Cbor.CidLinkWrapper(r)) })
  const parts: Array<Uint8Array> = [varint(header.length), header]
  for (const b of blocks) parts.push(varint(b.cid.length + b.data.length), b.cid, b.data)
  return concat(parts)
}

/**
 * `Cbor.encode(record)` with each placeholder integer 2^32 (`1b 00000001 00000000`) or −2^32 − 1
 * (`3b 00000001 00000000`), in encoding order, replaced by the next of `values`: DAG-CBOR integers
 * outside ±(2^53 − 1) (up to 2^64 − 1 and down to −2^64), which `@atcute/cbor` cannot encode.
 */
export const wideIntBlock = (record: unknown, values: ReadonlyArray<bigint>): Uint8Array => {
  const data = Cbor.encode(record)
  const dv = new DataView(data.buffer, data.byteOffset, data.byteLength)
  let at = 0
  for (const v of values) {
    const i = data.findIndex((b, k) =>
      k >= at && k + 9 <= data.length && (b === 0x1b || b === 0x3b) && dv.getUint32(k + 1) === 1 &&
      dv.getUint32(k + 5) === 0
    )
    if (i < 0) throw new Error("wideIntBlock: no placeholder left")
    data[i] = v < 0n ? 0x3b : 0x1b
    dv.setBigUint64(i + 1, v < 0n ? -1n - v : v)
    at = i + 9
  }
  return data
}

export const frame = (header: unknown, body: unknown): Uint8Array => concat([Cbor.encode(header), Cbor.encode(body)])

export type OpSpec =
  | {
    readonly action: "create" | "update"
    readonly path: string
    readonly record: unknown
    /** the record block's exact bytes (instead of `Cbor.encode(record)`) */
    readonly block?: Uint8Array
  }
  | { readonly action: "delete"; readonly path: string }

export interface CommitSpec {
  readonly seq: number
  readonly repo?: string
  readonly rev?: string
  readonly time?: string
  readonly ops: ReadonlyArray<OpSpec>
  readonly tooBig?: boolean
  /** leave these ops' record blocks out of the CAR */
  readonly omitBlocks?: boolean
}

/** A `#commit` frame whose CAR holds a (fake) commit block as root plus every record block. */
export const commitFrame = (c: CommitSpec): Uint8Array => {
  const blocks: Array<Block> = []
  const ops = c.ops.map((op) => {
    if (op.action === "delete") return { action: op.action, path: op.path, cid: null }
    const data = op.block ?? Cbor.encode(op.record)
    const cid = cidBytes(data)
    if (c.omitBlocks !== true) blocks.push({ cid, data })
    return { action: op.action, path: op.path, cid: new Cbor.CidLinkWrapper(cid) }
  })
  const commitBlock = Cbor.encode({ did: c.repo ?? DID, rev: c.rev ?? REV, version: 3, data: null })
  const commitCid = cidBytes(commitBlock)
  const body = {
    seq: c.seq,
    repo: c.repo ?? DID,
    time: c.time ?? TIME,
    rev: c.rev ?? REV,
    since: null,
    commit: new Cbor.CidLinkWrapper(commitCid),
    blocks: Cbor.toBytes(car([commitCid], [{ cid: commitCid, data: commitBlock }, ...blocks])),
    ops,
    tooBig: c.tooBig ?? false,
    rebase: false,
    blobs: []
  }
  return frame({ op: 1, t: "#commit" }, body)
}

export const identityFrame = (seq: number, did: string = DID): Uint8Array =>
  frame({ op: 1, t: "#identity" }, { seq, did, time: TIME, handle: "alice.test" })

export const accountFrame = (seq: number, did: string = DID): Uint8Array =>
  frame({ op: 1, t: "#account" }, { seq, did, time: TIME, active: false, status: "deactivated" })

export const infoFrame = (name: string): Uint8Array =>
  frame({ op: 1, t: "#info" }, { name, message: "cursor older than the window" })

export const errorFrame = (error: string): Uint8Array => frame({ op: -1 }, { error, message: "Cursor in the future." })

/** An image blob ref and some raw bytes: the record shapes that need the JSON data model. */
export const richRecord = (): Record<string, unknown> => {
  const blobData = Uint8Array.from([1, 2, 3, 4, 5])
  return {
    $type: "app.bsky.feed.post",
    text: "hello",
    createdAt: "2024-09-05T06:11:04.870Z",
    embed: {
      $type: "app.bsky.embed.images",
      images: [{ alt: "", image: { $type: "blob", ref: cidLink(blobData), mimeType: "image/png", size: 5 } }]
    },
    raw: Cbor.toBytes(Uint8Array.from([0xde, 0xad, 0xbe, 0xef, 0x00]))
  }
}

/** The same record as Jetstream (or any atproto JSON) writes it. */
export const richRecordJson = (): Record<string, unknown> =>
  JSON.parse(JSON.stringify(richRecord())) as Record<string, unknown>

export const jetstreamCommit = (
  timeUs: number,
  commit: Record<string, unknown>,
  did: string = DID
): string => JSON.stringify({ did, time_us: timeUs, kind: "commit", commit })

export const jetstreamCreate = (timeUs: number, rkey: string, record: unknown = { $type: "x.y.z", n: 1 }): string =>
  jetstreamCommit(timeUs, {
    rev: REV,
    operation: "create",
    collection: "app.bsky.feed.post",
    rkey,
    record,
    cid: "bafyreidwaivazkwu67xztlmuobx35hs2lnfh3kolmgfmucldvhd3sgzcqi"
  })
