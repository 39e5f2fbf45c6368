import type { ScopeUri } from "../../src/schemas/AtUri.js"
import { parseScopeUri } from "../../src/schemas/AtUri.js"
import type { Operation, RecordEvent } from "../../src/schemas/RecordEvent.js"
import type { WhRecord } from "../../src/schemas/WhRecord.js"
import { type ActiveWebhook, makeActiveWebhook } from "../../src/services/matching/WebhookIndex.js"

const B32 = "abcdefghijklmnopqrstuvwxyz234567"

/** A distinct canonical did:plc for each n. */
export const plc = (n: number): string => {
  let s = ""
  let v = n
  for (let i = 0; i < 24; i++) {
    s = B32[v % 32] + s
    v = Math.floor(v / 32)
  }
  return `did:plc:${s}`
}

export const REV = "3kabcdefghij2"

export const scope = (uri: string): ScopeUri => {
  const s = parseScopeUri(uri)
  if (s === undefined) throw new Error(`bad scope ${uri}`)
  return s
}

export interface WhOptions {
  readonly backlinks?: boolean
  readonly events?: ReadonlyArray<Operation>
  readonly url?: string
  readonly secret?: string
  readonly secretId?: string
  readonly enabled?: boolean
}

export const whRecord = (aturi: string, o: WhOptions = {}): WhRecord => ({
  $type: "place.wisp.v2.wh",
  scope: o.backlinks === undefined ? { aturi } : { aturi, backlinks: o.backlinks },
  url: o.url ?? "https://example.com/hook",
  createdAt: "2024-01-01T00:00:00Z",
  ...(o.events === undefined ? {} : { events: o.events }),
  ...(o.secret === undefined ? {} : { secret: o.secret }),
  ...(o.secretId === undefined ? {} : { secretId: o.secretId }),
  ...(o.enabled === undefined ? {} : { enabled: o.enabled })
})

export const webhook = (owner: string, rkey: string, aturi: string, o: WhOptions = {}): ActiveWebhook =>
  makeActiveWebhook(owner, rkey, whRecord(aturi, o), scope(aturi), REV)

export const event = (
  did: string,
  collection: string,
  rkey: string,
  o: { readonly operation?: Operation; readonly record?: unknown; readonly cid?: string } = {}
): RecordEvent => {
  const operation = o.operation ?? "create"
  return {
    kind: "commit",
    did,
    collection,
    rkey,
    operation,
    rev: REV,
    cid: operation === "delete" ? undefined : (o.cid ?? "bafyreib2rxk3rh6kzwq"),
    record: operation === "delete" ? undefined : (o.record ?? { $type: collection, text: "hi" }),
    timeUs: 1_700_000_000_123_456,
    stream: "direct",
    relay: "wss://jetstream2.us-east.bsky.network",
    cursor: "1700000000123456"
  }
}
