/**
 * `firehook hooks` and a PDS that answers with a redirect, as the CLI runs (the bundle under Bun):
 * no redirect is followed, so the app password (createSession) and the session's token (every
 * later call) go to the PDS named with --pds / ATPROTO_PDS only, whose http:// is allowed to a
 * loopback host only (README "hooks"; the owners' API client refuses redirects alike, OwnerApi.ts).
 * A redirect is one line, as any other refusal of the PDS. (Under Node the client's stream body
 * cannot be re-sent, so only Bun shows a followed redirect: these run the real CLI.)
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest"
import { runCli } from "../support/proc.js"

interface Listening {
  readonly server: Http.Server
  readonly url: string
}

const listen = (handler: Http.RequestListener): Promise<Listening> =>
  new Promise((resolve) => {
    const server = Http.createServer(handler)
    server.listen(0, "127.0.0.1", () =>
      resolve({ server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` }))
  })

const DID = "did:plc:ownerownerownerownerowne"
const PASSWORD = "secret-app-password-1234"
const b64 = (v: unknown) => Buffer.from(JSON.stringify(v), "utf8").toString("base64url")
const jwt = (scope: string) =>
  `${b64({ alg: "ES256K", typ: "JWT" })}.${b64({ scope, sub: DID, aud: "did:web:pds.test", exp: 4_000_000_000 })}.c2ln`
const ACCESS = jwt("com.atproto.appPass")

/** every request that reached the other origin: method, path, authorization and body */
const elsewhere: Array<string> = []
/** which methods the named PDS redirects (the others it answers itself) */
let redirected: ReadonlySet<string> = new Set()
let other: Listening
let named: Listening

const json = (res: Http.ServerResponse, status: number, body: unknown) =>
  res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(body))

beforeAll(async () => {
  other = await listen((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8")
      elsewhere.push(`${req.method} ${req.url} ${req.headers.authorization ?? ""} ${body}`)
      json(res, 401, { error: "AuthenticationRequired", message: "no" })
    })
  })
  named = await listen((req, res) => {
    req.resume()
    req.on("end", () => {
      const nsid = new URL(req.url ?? "/", named.url).pathname.replace("/xrpc/", "")
      if (redirected.has(nsid)) return res.writeHead(307, { location: `${other.url}${req.url ?? "/"}` }).end()
      if (nsid === "com.atproto.server.createSession") {
        return json(res, 200, {
          did: DID,
          handle: "owner.test",
          accessJwt: ACCESS,
          refreshJwt: jwt("com.atproto.refresh"),
          active: true
        })
      }
      return json(res, 200, {})
    })
  })
})

beforeEach(() => {
  elsewhere.length = 0
})

afterAll(async () => {
  for (const s of [other.server, named.server]) {
    s.closeAllConnections()
    await new Promise<void>((r) => s.close(() => r()))
  }
})

const list = () =>
  runCli(["hooks", "list"], {
    ATPROTO_PDS: named.url,
    ATPROTO_IDENTIFIER: "owner.test",
    ATPROTO_APP_PASSWORD: PASSWORD
  })

describe("firehook hooks and a PDS that redirects (the CLI under Bun)", () => {
  it("a 307 to createSession: the password is not re-sent elsewhere; one line, code 1", async () => {
    redirected = new Set(["com.atproto.server.createSession"])
    const r = await list()
    expect(elsewhere).toEqual([])
    expect(r.code).toBe(1)
    expect(r.stderr).toContain("login failed: the PDS answered 307, a redirect (not followed)")
    expect(r.stderr + r.stdout).not.toContain(PASSWORD)
  }, 60_000)

  it("a 307 to listRecords after signing in: the session's token is not sent elsewhere", async () => {
    redirected = new Set(["com.atproto.repo.listRecords"])
    const r = await list()
    expect(elsewhere).toEqual([])
    expect(r.code).toBe(1)
    expect(r.stderr).toContain("the PDS refused listRecords (307, a redirect, not followed)")
  }, 60_000)
})
