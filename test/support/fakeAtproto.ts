/**
 * A fake PLC directory and a fake PDS: real HTTP servers on 127.0.0.1 (reached through SafeHttp in
 * insecure development mode), with per-test handlers and a request log.
 *
 * The default PDS handler implements the reference PDS's behaviour (shared/reference/atproto.md
 * §4.5): `listRecords` in descending rkey order, `cursor` = the last rkey of a page (also on the final
 * non-empty page), the end = an empty page without a cursor; an unknown repo answers
 * `400 InvalidRequest "Could not find repo: <did>"`; `getLatestCommit` answers the repo's rev.
 */
import { Effect } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"

export interface FakeRequest {
  readonly method: string
  readonly path: string
  readonly query: URLSearchParams
  /** the raw query string as received (to check URL encoding) */
  readonly rawQuery: string
}

export interface FakeResponse {
  readonly status: number
  readonly body: string | Uint8Array
  readonly contentType?: string
  /** more response headers (lowercase names) */
  readonly headers?: Readonly<Record<string, string>>
}

export type Handler = (req: FakeRequest) => FakeResponse | Promise<FakeResponse>

export interface FakeServer {
  readonly url: string
  readonly requests: Array<FakeRequest>
  handler: Handler
}

const json = (status: number, value: unknown): FakeResponse => ({ status, body: JSON.stringify(value) })

/** A scoped HTTP server on 127.0.0.1 with a replaceable handler. */
export const fakeServer = (initial: Handler) =>
  Effect.acquireRelease(
    Effect.async<{ server: Http.Server; fake: FakeServer }>((resume) => {
      const fake: FakeServer = { url: "", requests: [], handler: initial }
      const server = Http.createServer((req, res) => {
        const u = new URL(req.url ?? "/", "http://x")
        const rawQuery = (req.url ?? "").includes("?") ? (req.url ?? "").slice((req.url ?? "").indexOf("?") + 1) : ""
        const r: FakeRequest = { method: req.method ?? "GET", path: u.pathname, query: u.searchParams, rawQuery }
        fake.requests.push(r)
        Promise.resolve()
          .then(() => fake.handler(r))
          .then(
            (out) => {
              const body = typeof out.body === "string" ? Buffer.from(out.body, "utf8") : Buffer.from(out.body)
              res.writeHead(out.status, {
                ...out.headers,
                "content-type": out.contentType ?? "application/json",
                "content-length": body.length
              })
              res.end(body)
            },
            () => {
              res.writeHead(500)
              res.end()
            }
          )
      })
      server.keepAliveTimeout = 1000
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as AddressInfo).port
        resume(Effect.succeed({ server, fake: Object.assign(fake, { url: `http://127.0.0.1:${port}` }) }))
      })
    }),
    ({ server }) =>
      Effect.async<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ fake }) => fake))

// ---------------------------------------------------------------------------------------------
// PLC

export const didDoc = (did: string, pds: string, extra: ReadonlyArray<unknown> = []) => ({
  "@context": ["https://www.w3.org/ns/did/v1"],
  id: did,
  alsoKnownAs: ["at://someone.test"],
  service: [...extra, { id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint: pds }]
})

/** A PLC directory serving `docs` (did → document); 404 "DID not registered" otherwise. */
export const fakePlc = (docs: Map<string, unknown>) =>
  fakeServer((req) => {
    const did = decodeURIComponent(req.path.slice(1))
    const doc = docs.get(did)
    return doc === undefined ? json(404, { message: `DID not registered: ${did}` }) : json(200, doc)
  })

// ---------------------------------------------------------------------------------------------
// PDS

export interface FakeRecord {
  readonly rkey: string
  readonly value: unknown
  readonly cid?: string
}

export interface FakeRepo {
  rev: string | undefined
  records: Array<FakeRecord>
}

/** The reference behaviour over `repos` (did → repo). */
export const pdsHandler = (repos: Map<string, FakeRepo>): Handler => (req) => {
  if (req.path === "/xrpc/com.atproto.sync.getLatestCommit") {
    const repo = repos.get(req.query.get("did") ?? "")
    if (repo === undefined) return json(400, { error: "RepoNotFound", message: "Could not find repo" })
    if (repo.rev === undefined) return json(501, { error: "MethodNotImplemented" })
    return json(200, { cid: "bafycommit", rev: repo.rev })
  }
  if (req.path === "/xrpc/com.atproto.repo.listRecords") {
    const did = req.query.get("repo") ?? ""
    const repo = repos.get(did)
    if (repo === undefined) return json(400, { error: "InvalidRequest", message: `Could not find repo: ${did}` })
    const limit = Number(req.query.get("limit") ?? "50")
    const cursor = req.query.get("cursor")
    const sorted = [...repo.records].sort((a, b) => (a.rkey < b.rkey ? 1 : a.rkey > b.rkey ? -1 : 0))
    const from = cursor === null ? sorted : sorted.filter((r) => r.rkey < cursor)
    const page = from.slice(0, limit)
    const last = page[page.length - 1]
    return json(200, {
      records: page.map((r) => ({
        uri: `at://${did}/place.wisp.v2.wh/${r.rkey}`,
        cid: r.cid ?? `bafy${r.rkey.replace(/[^a-z0-9]/gi, "")}`,
        value: r.value
      })),
      ...(last === undefined ? {} : { cursor: last.rkey })
    })
  }
  return json(404, { error: "MethodNotImplemented" })
}

export const listRecordsRequests = (fake: FakeServer) =>
  fake.requests.filter((r) => r.path === "/xrpc/com.atproto.repo.listRecords")
