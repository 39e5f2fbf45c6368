/**
 * A tiny PDS on a real HTTP socket (127.0.0.1) for the in-process tests of the owners' record
 * library (src/cli/HookRecords.ts): one account, the `com.atproto.server` session methods and the
 * `com.atproto.repo` record methods `@atproto/api` calls, with the reference PDS's compare-and-swap
 * (`InvalidSwap`) and `RecordNotFound` answers. Every call is recorded (method, query and body), so a
 * test sees exactly what the library wrote.
 */
import { Effect, type Scope } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"

export const PDS_DID = "did:plc:ownerownerownerownerowne"
export const PDS_HANDLE = "owner.test"
export const PDS_PASSWORD = "app-pass-word-0000"

/** valid CIDv1 (dag-cbor, sha-256) strings: the client checks the `cid` format of answers */
const CIDS: ReadonlyArray<string> = [
  "bafyreiej5wohacte5wj4l44s4wx3q6dhaeslgqf6x6d7nkq7i6xrwzdxsy",
  "bafyreidgvl3nngu6mkmppm7snh36ponuodando6gocsaxq3nnmiu54367i",
  "bafyreid2fhmmitjorg2moxmx3snjaxovgzya3itvmt3genpx6kbzfjrgxq",
  "bafyreicfol3zrsjme7ejxn5tdgmuh6plfzntbvf7utnklanns7idfeqbo4",
  "bafyreihcpiyqe54o3fbufh5rge23q624xgumzzof7atnxcpklapfgh37im",
  "bafyreibbcmpgdbkzjroppxev45oozwr6p2wcoqjudsubu65brmjwj3hali",
  "bafyreiajef73hv6f43kedsmxvxh237ysppto3upflm7xpzq6jxuxdrer5m",
  "bafyreigpgfvek5s5xzyyrp4bj3subeczi2p6uyiwfa2lmz4d6abp5m6oye",
  "bafyreid5o5c76xtan7fczhhgvohrc5zwbyau4jccaxawmlzyi4jtrlmc7y",
  "bafyreiam6rraof6pfsms5ddub2vxguzjxey4oxyrywjqdpuht6c3lgt2xi",
  "bafyreic27evmyyypg7dg45d36e2ypgsxnujyn7fout74uzs7cvhyt3sx4e",
  "bafyreigyixx3cbho7wzcdocxz4hm6ethx6syrjinuw7m2dqildu5s3un4e"
]

export interface PdsCall {
  /** the NSID called */
  readonly nsid: string
  readonly query: URLSearchParams
  /** the JSON body of a procedure (`{}` for a query) */
  readonly body: Readonly<Record<string, unknown>>
}

export interface StoredRecord {
  readonly cid: string
  readonly value: unknown
}

interface Answer {
  readonly status: number
  readonly body: unknown
}

export interface FakePds {
  readonly url: string
  readonly calls: Array<PdsCall>
  /** the account's `place.wisp.v2.wh` records by rkey */
  readonly records: Map<string, StoredRecord>
  /** an answer that replaces the normal one for an NSID */
  readonly override: Map<string, (call: PdsCall) => Answer>
  /** a fresh CID (a different one each call) */
  readonly nextCid: () => string
}

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8").toString("base64url")
const jwt = (scope: string) =>
  `${b64({ alg: "ES256K", typ: "JWT" })}.${
    b64({ scope, sub: PDS_DID, aud: "did:web:pds.test", iat: 1_700_000_000, exp: 4_000_000_000 })
  }.c2ln`

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v)
const str = (v: unknown): string | undefined => (typeof v === "string" ? v : undefined)
const xrpcError = (status: number, error: string, message: string): Answer => ({ status, body: { error, message } })

const answer = (pds: FakePds, call: PdsCall): Answer => {
  const custom = pds.override.get(call.nsid)
  if (custom !== undefined) return custom(call)
  const uriOf = (rkey: string) => `at://${PDS_DID}/place.wisp.v2.wh/${rkey}`
  const rkey = str(call.body["rkey"]) ?? call.query.get("rkey") ?? ""
  const current = pds.records.get(rkey)
  const swap = call.body["swapRecord"]
  const swapFails = (swap === null && current !== undefined) ||
    (typeof swap === "string" && current?.cid !== swap)
  switch (call.nsid) {
    case "com.atproto.server.createSession":
      return call.body["password"] === PDS_PASSWORD
        ? {
          status: 200,
          body: {
            did: PDS_DID,
            handle: PDS_HANDLE,
            accessJwt: jwt("com.atproto.appPass"),
            refreshJwt: jwt("com.atproto.refresh"),
            active: true
          }
        }
        : xrpcError(401, "AuthenticationRequired", `Invalid identifier or password ${PDS_PASSWORD}`)
    case "com.atproto.server.deleteSession":
      return { status: 200, body: {} }
    case "com.atproto.repo.getRecord":
      return current === undefined
        ? xrpcError(400, "RecordNotFound", `Could not locate record: ${uriOf(rkey)}`)
        : { status: 200, body: { uri: uriOf(rkey), cid: current.cid, value: current.value } }
    case "com.atproto.repo.createRecord": {
      const key = str(call.body["rkey"]) ?? `3lhook${String(pds.records.size).padStart(6, "0")}`
      const cid = pds.nextCid()
      pds.records.set(key, { cid, value: call.body["record"] })
      return { status: 200, body: { uri: uriOf(key), cid } }
    }
    case "com.atproto.repo.putRecord": {
      if (swapFails) return xrpcError(400, "InvalidSwap", "Record was at another cid")
      const cid = pds.nextCid()
      pds.records.set(rkey, { cid, value: call.body["record"] })
      return { status: 200, body: { uri: uriOf(rkey), cid } }
    }
    case "com.atproto.repo.deleteRecord":
      if (swapFails) return xrpcError(400, "InvalidSwap", "Record was at another cid")
      pds.records.delete(rkey)
      return { status: 200, body: {} }
    case "com.atproto.repo.listRecords": {
      const limit = Number(call.query.get("limit") ?? "50")
      const cursor = call.query.get("cursor")
      const keys = [...pds.records.keys()].sort().filter((k) => cursor === null || k > cursor).slice(0, limit)
      const records = keys.map((k) => ({
        uri: uriOf(k),
        cid: pds.records.get(k)?.cid,
        value: pds.records.get(k)?.value
      }))
      const last = keys.at(-1)
      return { status: 200, body: last === undefined ? { records } : { records, cursor: last } }
    }
    default:
      return xrpcError(501, "MethodNotImplemented", call.nsid)
  }
}

/** The fake PDS for the scope's lifetime. */
export const fakePds: Effect.Effect<FakePds, never, Scope.Scope> = Effect.acquireRelease(
  Effect.async<{ server: Http.Server; pds: FakePds }>((resume) => {
    let n = 0
    const pds: FakePds = {
      url: "",
      calls: [],
      records: new Map(),
      override: new Map(),
      nextCid: () => CIDS[n++ % CIDS.length] ?? ""
    }
    const server = Http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        const u = new URL(req.url ?? "/", "http://x")
        const raw = Buffer.concat(chunks).toString("utf8")
        let parsed: unknown = {}
        try {
          parsed = raw.length > 0 ? JSON.parse(raw) : {}
        } catch {
          parsed = {}
        }
        const call: PdsCall = {
          nsid: u.pathname.replace(/^\/xrpc\//, ""),
          query: u.searchParams,
          body: isRecord(parsed) ? parsed : {}
        }
        pds.calls.push(call)
        const out = answer(pds, call)
        const body = Buffer.from(JSON.stringify(out.body), "utf8")
        res.writeHead(out.status, { "content-type": "application/json", "content-length": body.length })
        res.end(body)
      })
    })
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as AddressInfo).port
      resume(Effect.succeed({ server, pds: Object.assign(pds, { url: `http://127.0.0.1:${port}` }) }))
    })
  }),
  ({ server }) =>
    Effect.async<void>((resume) => {
      server.closeAllConnections()
      server.close(() => resume(Effect.void))
    })
).pipe(Effect.map(({ pds }) => pds))

/** The calls that change the repo. */
export const writes = (pds: FakePds): ReadonlyArray<PdsCall> =>
  pds.calls.filter((c) =>
    ["com.atproto.repo.createRecord", "com.atproto.repo.putRecord", "com.atproto.repo.deleteRecord"].includes(c.nsid)
  )
