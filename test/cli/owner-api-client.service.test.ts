/**
 * The owners' API client in process (SPEC §8.6, §8.2): the --service URL rules, the service DID read
 * from did.json (bounded in bytes and time), one fresh token per call addressed to the service's
 * DID for the call's method, and refusals as one-line `ApiFailed`s. The XRPC server is
 * ./owner-api-fake.ts on a real loopback socket; the "PDS" is a typed fake `HooksShape` minting
 * unsigned tokens the fake reads the claims of.
 */
import { Deferred, Duration, Effect, Either, Fiber, Option, Redacted, TestClock, TestContext } from "effect"
import * as Http from "node:http"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import type { HooksShape } from "../../src/cli/HookRecords.js"
import * as OwnerApi from "../../src/cli/OwnerApi.js"
import * as Tail from "../../src/cli/OwnerTail.js"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"
import { left, OWNER, run } from "./owner-api-client-support.js"
import { FAKE_DID, type FakeXrpc, startFake } from "./owner-api-fake.js"

const b64 = (o: unknown) => Buffer.from(JSON.stringify(o)).toString("base64url")

/** A "PDS" minting one distinct token per request, remembering what it was asked for. */
const fakeHooks = () => {
  const asked: Array<{ aud: string; lxm: string; token: string }> = []
  const hooks: HooksShape = {
    did: OWNER,
    create: () => Effect.die("unused"),
    list: Effect.die("unused"),
    setEnabled: () => Effect.die("unused"),
    remove: () => Effect.die("unused"),
    serviceToken: (aud, lxm) =>
      Effect.sync(() => {
        const exp = Math.floor(Date.now() / 1000) + 60
        const token = `${b64({ alg: "none" })}.${b64({ iss: OWNER, aud, lxm, exp, jti: asked.length })}.c2ln`
        asked.push({ aud, lxm, token })
        return Redacted.make(token)
      })
  }
  return { hooks, asked }
}

interface Plain {
  readonly url: string
  readonly requests: Array<{ path: string; authorization: string | undefined; contentType?: string }>
  answer: (path: string, res: Http.ServerResponse) => void
  readonly close: () => Promise<void>
}

/** A bare HTTP server whose answers the test writes itself (sizes, redirects, silence). */
const plain = (): Promise<Plain> =>
  new Promise((resolve) => {
    const server = Http.createServer((req, res) => {
      p.requests.push({
        path: req.url ?? "/",
        authorization: req.headers.authorization,
        ...(req.headers["content-type"] === undefined ? {} : { contentType: req.headers["content-type"] })
      })
      p.answer(req.url ?? "/", res)
    })
    const p: Plain = {
      url: "",
      requests: [],
      answer: (_path, res) => res.writeHead(404).end(),
      close: () =>
        new Promise<void>((r) => {
          server.closeAllConnections()
          server.close(() => r())
        })
    }
    server.listen(0, "127.0.0.1", () => {
      const a = server.address()
      Object.assign(p, { url: `http://127.0.0.1:${typeof a === "object" && a !== null ? a.port : 0}` })
      resolve(p)
    })
  })

let fake: FakeXrpc
let bare: Plain

beforeAll(async () => {
  fake = await startFake()
  bare = await plain()
})

afterAll(async () => {
  await fake?.close()
  await bare?.close()
})

describe("the --service given", () => {
  const given = (service: string | undefined, serviceDid?: string) =>
    run(OwnerApi.service({ service: Option.fromNullable(service), serviceDid: Option.fromNullable(serviceDid) }))
  const saved = { url: process.env["FIREHOOK_SERVICE_URL"], did: process.env["FIREHOOK_SERVICE_DID"] }
  afterEach(() => {
    for (const [k, v] of [["FIREHOOK_SERVICE_URL", saved.url], ["FIREHOOK_SERVICE_DID", saved.did]] as const) {
      if (v === undefined) delete process.env[k]
      else process.env[k] = v
    }
  })

  it("an https origin, or http to a loopback host; the DID given must be a service DID", async () => {
    delete process.env["FIREHOOK_SERVICE_URL"]
    delete process.env["FIREHOOK_SERVICE_DID"]
    expect(await given("https://hooks.example.com/")).toEqual(
      Either.right({ url: "https://hooks.example.com", did: Option.none() })
    )
    expect(await given("http://127.0.0.1:2583")).toEqual(
      Either.right({ url: "http://127.0.0.1:2583", did: Option.none() })
    )
    expect(await given("http://localhost:2583")).toEqual(
      Either.right({ url: "http://localhost:2583", did: Option.none() })
    )
    for (
      const bad of [
        "http://hooks.example.com",
        "https://hooks.example.com/xrpc",
        "https://user:pw@hooks.example.com",
        "https://hooks.example.com/?a=1",
        "ftp://hooks.example.com"
      ]
    ) {
      const r = await given(bad)
      expect([bad, Either.isLeft(r) ? r.left._tag : "accepted"]).toEqual([bad, "HooksInvalid"])
      expect(Either.isLeft(r) ? r.left.text : "").toMatch(/^invalid --service: must be an https:\/\/ origin/)
    }
    const missing = left(await given(undefined))
    expect(missing.text).toMatch(/^missing --service \(or FIREHOOK_SERVICE_URL\)/)
    expect(left(await given("https://hooks.example.com", "did:web:Bad Host")).text).toMatch(/^invalid --service-did/)
    expect(await given("https://hooks.example.com", "did:web:hooks.example.com%3A8443")).toEqual(
      Either.right({ url: "https://hooks.example.com", did: Option.some("did:web:hooks.example.com%3A8443") })
    )
  })

  it("FIREHOOK_SERVICE_URL / FIREHOOK_SERVICE_DID when the options are absent (an empty one is absent)", async () => {
    process.env["FIREHOOK_SERVICE_URL"] = "https://env.example"
    process.env["FIREHOOK_SERVICE_DID"] = "did:web:env.example"
    expect(await given(undefined)).toEqual(
      Either.right({ url: "https://env.example", did: Option.some("did:web:env.example") })
    )
    expect(await given("https://flag.example", "did:web:flag.example")).toEqual(
      Either.right({ url: "https://flag.example", did: Option.some("did:web:flag.example") })
    )
    process.env["FIREHOOK_SERVICE_URL"] = ""
    process.env["FIREHOOK_SERVICE_DID"] = ""
    expect(left(await given(undefined)).text).toMatch(/^missing --service/)
    expect(await given("https://flag.example")).toEqual(
      Either.right({ url: "https://flag.example", did: Option.none() })
    )
  })
})

describe("the service DID read from did.json", () => {
  const didOf = (timeout?: Duration.DurationInput) =>
    run(OwnerApi.serviceDid({ url: bare.url, did: Option.none() }, timeout))
  const own = () => `did:web:localhost%3A${new URL(bare.url).port}`
  const doc = (id: string, pad = 0) =>
    JSON.stringify({ "@context": ["https://www.w3.org/ns/did/v1"], id, pad: "x".repeat(pad) })

  it("fetched at /.well-known/did.json, without a token; 200 only; a document up to 64 KiB", async () => {
    const from = bare.requests.length
    bare.answer = (_p, res) => res.writeHead(200, { "content-type": "application/json" }).end(doc(own()))
    expect(await didOf()).toEqual(Either.right(own()))
    expect(bare.requests.slice(from)).toEqual([{ path: "/.well-known/did.json", authorization: undefined }])

    bare.answer = (_p, res) => res.writeHead(404, { "content-type": "application/json" }).end(doc(own()))
    const notFound = left(await didOf())
    expect([notFound.error, notFound.status]).toEqual(["NoServiceDid", 404])
    expect(notFound.text).toContain("(404); give --service-did (or FIREHOOK_SERVICE_DID)")

    const base = doc(own()).length
    bare.answer = (_p, res) => res.writeHead(200).end(doc(own(), OwnerApi.MAX_DID_DOCUMENT_BYTES - base))
    expect(await didOf()).toEqual(Either.right(own()))
    bare.answer = (_p, res) => res.writeHead(200).end(doc(own(), OwnerApi.MAX_DID_DOCUMENT_BYTES - base + 1))
    const large = left(await didOf())
    expect([large.error, large.text]).toEqual([
      "InvalidResponse",
      "the service's answer to /.well-known/did.json is too large"
    ])
  })

  it("the mismatch names the DID expected, one line", async () => {
    bare.answer = (_p, res) => res.writeHead(200).end(doc("did:web:other.example"))
    const e = left(await didOf())
    expect(e.error).toBe("ServiceDidMismatch")
    expect(e.text).toContain(`names itself did:web:other.example in /.well-known/did.json, not did:web:127.0.0.1%3A`)
  })

  it("bounded in time: 20 s by default (a service that never answers is a Timeout)", async () => {
    const arrived = Effect.runSync(Deferred.make<void>())
    bare.answer = () => Effect.runSync(Deferred.succeed(arrived, undefined))
    const r = await Effect.runPromise(
      Effect.gen(function*() {
        const fiber = yield* Effect.fork(Effect.either(OwnerApi.serviceDid({ url: bare.url, did: Option.none() })))
        yield* Deferred.await(arrived)
        yield* TestClock.adjust(Duration.seconds(19))
        const early = yield* Fiber.poll(fiber)
        yield* TestClock.adjust(Duration.seconds(1))
        return { early, r: yield* Fiber.join(fiber) }
      }).pipe(Effect.provide(TestContext.TestContext))
    )
    expect(Option.isNone(r.early)).toBe(true)
    const e = left(r.r)
    expect([e.error, e.text]).toEqual([
      "Timeout",
      `the firehook service at ${new URL(bare.url).host} did not answer /.well-known/did.json within 20 s`
    ])
  })
})

describe("calls: a fresh token for each, addressed to the service for the method", () => {
  const api = (url = fake.url, timeout?: Duration.DurationInput) => {
    const pds = fakeHooks()
    return { pds, api: OwnerApi.make(pds.hooks, url, FAKE_DID, timeout) }
  }

  it("a query is a GET with its parameters, a procedure a POST with its JSON body; each its own token", async () => {
    const { api: client, pds } = api()
    fake.answers.set("dev.firehook.webhook.listDeliveries", () => ({ status: 200, body: { deliveries: [] } }))
    fake.answers.set("dev.firehook.webhook.redeliver", (call) => ({
      status: 200,
      body: { id: (call.body as { id: string }).id, previousStatus: "dead_letter" }
    }))
    const from = fake.calls.length
    const q = await Effect.runPromise(
      OwnerApi.request(WebhookLexicon.listDeliveries, { params: { rkey: "hook", limit: "10", cursor: undefined } })
    )
    expect(await run(client.call(q))).toEqual(Either.right({ deliveries: [] }))
    const p = await Effect.runPromise(OwnerApi.request(WebhookLexicon.redeliver, { input: { id: "whd_v1_0001" } }))
    expect(await run(client.call(p))).toEqual(Either.right({ id: "whd_v1_0001", previousStatus: "dead_letter" }))
    expect(await run(client.call(q))).toEqual(Either.right({ deliveries: [] }))
    const made = fake.calls.slice(from)
    expect(made.map((c) => [c.nsid, c.method, c.query, c.body])).toEqual([
      ["dev.firehook.webhook.listDeliveries", "GET", { rkey: "hook", limit: "10" }, undefined],
      ["dev.firehook.webhook.redeliver", "POST", {}, { id: "whd_v1_0001" }],
      ["dev.firehook.webhook.listDeliveries", "GET", { rkey: "hook", limit: "10" }, undefined]
    ])
    expect(pds.asked.map((a) => [a.aud, a.lxm])).toEqual([
      [FAKE_DID, "dev.firehook.webhook.listDeliveries"],
      [FAKE_DID, "dev.firehook.webhook.redeliver"],
      [FAKE_DID, "dev.firehook.webhook.listDeliveries"]
    ])
    expect(made.map((c) => c.authorization)).toEqual(pds.asked.map((a) => `Bearer ${a.token}`))
    expect(new Set(made.map((c) => c.authorization)).size).toBe(3)
    expect(client.did).toBe(OWNER)
    expect([client.serviceUrl, client.serviceDid]).toEqual([fake.url, FAKE_DID])
    expect(Duration.toMillis(client.timeout)).toBe(20_000)
  })

  it("a bad argument is a usage error naming its flag, before any token", async () => {
    const bad = await run(
      OwnerApi.request(WebhookLexicon.listDeliveries, { params: { limit: "1000" } }, { limit: "--limit (1..100)" })
    )
    expect(left(bad)).toMatchObject({ _tag: "HooksInvalid", text: "invalid --limit (1..100)" })
    const unnamed = await run(OwnerApi.request(WebhookLexicon.redeliver, { input: {} }))
    expect(left(unnamed).text).toBe("invalid id")
    const sub = await run(OwnerApi.request(WebhookLexicon.subscribeDeliveries, {}))
    expect(left(sub).text).toBe("dev.firehook.webhook.subscribeDeliveries is a subscription")
  })

  it("refusals: the XRPC error and message on one line, bounded; no error name → the status", async () => {
    const { api: client } = api()
    const req = await Effect.runPromise(OwnerApi.request(WebhookLexicon.list, {}))
    const answer = (status: number, body: unknown) => {
      fake.answers.set("dev.firehook.webhook.list", () => ({ status, body }))
      return run(client.call(req)).then((r) => {
        const e = left(r)
        if (e._tag !== "ApiFailed") throw new Error(e.text)
        return e
      })
    }
    expect(await answer(400, { error: "NotFound", message: "no such\u001b[31m\nhook" })).toMatchObject({
      _tag: "ApiFailed",
      error: "NotFound",
      status: 400,
      text: "NotFound: no such [31m hook"
    })
    expect((await answer(400, { error: "Bad Name!\n", message: "m".repeat(400) })).text).toBe(
      `BadName: ${"m".repeat(300)}`
    )
    expect((await answer(401, { error: "InvalidToken" })).text).toBe(
      "InvalidToken (401 from dev.firehook.webhook.list)"
    )
    expect(await answer(502, { message: "no name" })).toMatchObject({
      error: "HttpError",
      status: 502,
      text: "the firehook service answered 502 to dev.firehook.webhook.list"
    })
    expect((await answer(400, { error: "!!!" })).error).toBe("Error")
    expect(await answer(400, { message: "no name" })).toMatchObject({ error: "HttpError", status: 400 })
    expect(await answer(200, { webhooks: [{ rkey: "x" }] })).toMatchObject({
      error: "InvalidResponse",
      text: "the firehook service sent an invalid answer to dev.firehook.webhook.list"
    })
  })

  it("a redirect is not followed (the token stays with the service); a large answer is refused", async () => {
    const { api: client } = api(bare.url)
    const req = await Effect.runPromise(OwnerApi.request(WebhookLexicon.list, {}))
    const from = bare.requests.length
    bare.answer = (path, res) =>
      path.startsWith("/xrpc/")
        ? res.writeHead(302, { location: `${bare.url}/elsewhere` }).end()
        : res.writeHead(200).end(JSON.stringify({ webhooks: [] }))
    expect(left(await run(client.call(req)))).toMatchObject({ error: "Redirect", status: 302 })
    expect(bare.requests.slice(from).map((r) => r.path)).toEqual(["/xrpc/dev.firehook.webhook.list"])

    bare.answer = (_p, res) => res.writeHead(200).end(JSON.stringify({ id: "whd_v1_1", previousStatus: "dead_letter" }))
    const post = await Effect.runPromise(OwnerApi.request(WebhookLexicon.redeliver, { input: { id: "whd_v1_1" } }))
    const before = bare.requests.length
    expect(Either.isRight(await run(client.call(post)))).toBe(true)
    expect(Either.isRight(await run(client.call(req)))).toBe(false)
    expect(bare.requests.slice(before).map((r) => r.contentType)).toEqual(["application/json", undefined])

    const empty = JSON.stringify({ webhooks: [] })
    const exactly = `${empty}${" ".repeat(OwnerApi.MAX_RESPONSE_BYTES - empty.length)}`
    bare.answer = (_p, res) => res.writeHead(200).end(exactly)
    expect(await run(client.call(req))).toEqual(Either.right({ webhooks: [] }))
    bare.answer = (_p, res) => res.writeHead(200).end(`${exactly} `)
    expect(left(await run(client.call(req)))).toMatchObject({
      error: "InvalidResponse",
      text: "the service's answer to dev.firehook.webhook.list is too large"
    })
  })

  it("an unreachable service is one line naming its host", async () => {
    const { api: client } = api("http://127.0.0.1:1")
    const req = await Effect.runPromise(OwnerApi.request(WebhookLexicon.list, {}))
    expect(left(await run(client.call(req)))).toMatchObject({
      error: "Unreachable",
      text: "could not reach the firehook service at 127.0.0.1:1 (dev.firehook.webhook.list)"
    })
  })

  it("calls time out after the client's timeout; the probe after 5 s", async () => {
    const arrived = Effect.runSync(Deferred.make<string>())
    bare.answer = (path) => Effect.runSync(Deferred.succeed(arrived, path))
    const pds = fakeHooks()
    const client = OwnerApi.make(pds.hooks, bare.url, FAKE_DID, "7 seconds")
    const req = await Effect.runPromise(OwnerApi.request(WebhookLexicon.list, {}))
    const timed = (eff: Effect.Effect<unknown, unknown>, seconds: number) =>
      Effect.runPromise(
        Effect.gen(function*() {
          const fiber = yield* Effect.fork(Effect.either(eff))
          yield* Deferred.await(arrived)
          yield* TestClock.adjust(Duration.seconds(seconds))
          return yield* Fiber.join(fiber)
        }).pipe(Effect.provide(TestContext.TestContext))
      )
    const r = await timed(client.call(req), 7)
    expect(r).toEqual(Either.left(expect.objectContaining({
      error: "Timeout",
      text: `the firehook service at ${new URL(bare.url).host} did not answer dev.firehook.webhook.list within 7 s`
    })))
    const again = Effect.runSync(Deferred.make<string>())
    bare.answer = (path) => Effect.runSync(Deferred.succeed(again, path))
    const probed = await Effect.runPromise(
      Effect.gen(function*() {
        const fiber = yield* Effect.fork(client.probe(Tail.NSID))
        yield* Deferred.await(again)
        yield* TestClock.adjust(Duration.seconds(5))
        return yield* Fiber.join(fiber)
      }).pipe(Effect.provide(TestContext.TestContext))
    )
    expect(Option.map(probed, (e) => e._tag === "ApiFailed" ? e.error : e._tag)).toEqual(Option.some("Timeout"))
    expect(pds.asked.map((a) => a.lxm)).toEqual(["dev.firehook.webhook.list", Tail.NSID])
  })

  it("the probe: the XRPC refusal of a GET, none when it answers below 400", async () => {
    const { api: client, pds } = api()
    fake.refuseUpgrade = { status: 429, body: { error: "TooManyConnections", message: "8 open" } }
    const refused = await Effect.runPromise(client.probe(Tail.NSID))
    expect(Option.map(refused, (e) => [e.error, e.status, e.text])).toEqual(
      Option.some(["TooManyConnections", 429, "TooManyConnections: 8 open"])
    )
    fake.refuseUpgrade = { status: 400, body: { error: "InvalidRequest" } }
    expect(Option.map(await Effect.runPromise(client.probe(Tail.NSID)), (e) => e.error)).toEqual(
      Option.some("InvalidRequest")
    )
    fake.refuseUpgrade = { status: 200, body: {} }
    expect(await Effect.runPromise(client.probe(Tail.NSID))).toEqual(Option.none())
    fake.refuseUpgrade = undefined
    expect(pds.asked.map((a) => [a.aud, a.lxm])).toEqual([
      [FAKE_DID, Tail.NSID],
      [FAKE_DID, Tail.NSID],
      [FAKE_DID, Tail.NSID]
    ])
  })
})
