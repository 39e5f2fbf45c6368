/**
 * Which service DID the owners' CLI asks the PDS to address tokens to (SPEC §8.6): the one given
 * (`--service-did` / `FIREHOOK_SERVICE_DID`), else the `id` of the service's
 * `/.well-known/did.json`, taken only when it is the did:web of the `--service` URL's host and port
 * (for a loopback URL, also `did:web:localhost%3A<port>`). Otherwise a service could name another
 * service's DID and receive a token valid there. Against real sockets: a tiny service that
 * publishes a chosen DID document, and a "PDS" that only counts requests (a refusal must come
 * before any sign-in).
 */
import { Effect, Either, Option } from "effect"
import * as Http from "node:http"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as OwnerApi from "../../src/cli/OwnerApi.js"
import { runCli } from "../support/proc.js"
import { expectOneLineError } from "./cli-expect.js"

interface Server {
  readonly port: number
  readonly url: string
  hits: number
  close: () => Promise<void>
}

const serve = (answer: (path: string) => { status: number; body: unknown }): Promise<Server> =>
  new Promise((resolve) => {
    const server = Http.createServer((req, res) => {
      s.hits++
      const a = answer(req.url ?? "/")
      res.writeHead(a.status, { "content-type": "application/json" }).end(JSON.stringify(a.body))
    })
    const s: Server = {
      port: 0,
      url: "",
      hits: 0,
      close: () => new Promise<void>((r) => server.close(() => r()))
    }
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      Object.assign(s, { port, url: `http://127.0.0.1:${port}` })
      resolve(s)
    })
  })

/** The DID document the service publishes (its `id` set per test). */
let published = "did:web:victim.example"
const didDocument = (id: string) => ({
  "@context": ["https://www.w3.org/ns/did/v1"],
  id,
  service: [{ id: "#firehook", type: "FirehookService", serviceEndpoint: "https://victim.example" }]
})

let service: Server
let pds: Server

beforeAll(async () => {
  service = await serve((path) =>
    path === "/.well-known/did.json"
      ? { status: 200, body: didDocument(published) }
      : { status: 404, body: { error: "NotFound" } }
  )
  pds = await serve(() => ({ status: 500, body: { error: "InternalServerError" } }))
})

afterAll(async () => {
  await service?.close()
  await pds?.close()
})

const didOf = (did: Option.Option<string> = Option.none()) =>
  Effect.runPromise(Effect.either(OwnerApi.serviceDid({ url: service.url, did }, "5 seconds")))

describe("the service DID the CLI signs for", () => {
  it("the DIDs a service may name itself: its host and port (loopback: also localhost)", () => {
    expect(OwnerApi.ownServiceDids(service.url)).toContain(`did:web:localhost%3A${service.port}`)
    expect(OwnerApi.ownServiceDids("https://hooks.example.com:8443")).toEqual(["did:web:hooks.example.com%3A8443"])
    expect(OwnerApi.ownServiceDids("https://hooks.example.com")).toEqual(["did:web:hooks.example.com"])
  })

  it("only the did:web of the --service URL's host and port is taken from did.json", async () => {
    published = `did:web:localhost%3A${service.port}`
    expect(await didOf()).toEqual(Either.right(published))

    for (
      const other of [
        "did:web:victim.example",
        `did:web:victim.example%3A${service.port}`,
        `did:web:localhost%3A${service.port + 1}`,
        "did:web:localhost",
        "did:plc:abcdefghijklmnopqrstuvwx"
      ]
    ) {
      published = other
      const r = await didOf()
      expect([other, Either.isLeft(r) ? r.left.error : "accepted"]).toEqual([other, "ServiceDidMismatch"])
    }
    // given explicitly, a DID is taken as is (nothing is fetched)
    const before = service.hits
    expect(await didOf(Option.some("did:web:victim.example"))).toEqual(Either.right("did:web:victim.example"))
    expect(service.hits).toBe(before)
  })

  it("the CLI refuses with one line (exit 1) before signing in; --service-did names the DID deliberately", async () => {
    published = "did:web:victim.example"
    const env = {
      ATPROTO_PDS: pds.url,
      ATPROTO_IDENTIFIER: "alice.test",
      ATPROTO_APP_PASSWORD: "app-password-that-is-never-sent",
      FIREHOOK_SERVICE_URL: service.url
    }
    const refused = await runCli(["hooks", "secrets", "list"], env)
    expectOneLineError(refused, 1)
    expect(refused.stderr).toContain("did:web:victim.example")
    expect(refused.stderr).toContain("--service-did")
    expect(pds.hits).toBe(0)

    // deliberately: the DID is taken as given and the sign-in is attempted (the PDS answers 500)
    const deliberate = await runCli(["hooks", "secrets", "list"], {
      ...env,
      FIREHOOK_SERVICE_DID: "did:web:victim.example"
    })
    expectOneLineError(deliberate, 1)
    expect(pds.hits).toBeGreaterThan(0)
    expect(deliberate.stderr).not.toContain("victim.example")
  }, 60_000)
})
