/**
 * The shared jti store under clock skew between API replicas (SPEC §8.2, §6.4): two replicas on one
 * PostgreSQL database whose machine clocks (their Effect `Clock`) are 2 minutes behind the
 * database's. A replica accepts a token until its own clock passes `exp` + 30 s; the shared row of
 * a `jti` lives until `exp` + 31 s by the database's clock. Before, a replica whose clock was behind
 * accepted a token the database already held expired, and a second such replica accepted it again
 * (the row had lapsed, so it was taken over): one token, two accepted calls. The claim now decides
 * expiry by the database's `now()`, the one clock all replicas share.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpServer from "@effect/platform/HttpServer"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Redacted } from "effect"
import * as Api from "../../src/services/api/Api.js"
import * as Jti from "../../src/services/api/JtiStore.js"
import * as TailHub from "../../src/services/api/Tail.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Db from "../support/db.js"
import { fakePlc } from "../support/fakeAtproto.js"
import { shiftedClock } from "../support/shiftedClock.js"
import { testConfig } from "../support/stack.js"
import { claims, docs, forge, KEY, newOwner } from "./support.js"

const LIST = "place.wisp.v2.secret.list"
/** a did:web service DID with a port: its tokens are checked by firehook's own steps on the Effect Clock */
const PORT_DID = "did:web:hooks.example.com%3A8443"
const AUD = `${PORT_DID}#firehook`
const HEADER = { alg: "ES256K", typ: "JWT" }
const SKEW_MS = -120_000

/** One API replica on the database at `url` with the shared jti store, its Clock off by `offsetMs`. */
const replica = (url: Redacted.Redacted<string>, plcUrl: string, offsetMs: number) =>
  Effect.gen(function*() {
    const config = testConfig({
      WEBHOOK_ALLOW_INSECURE_DEV: "1",
      PLC_DIRECTORY_URL: plcUrl,
      SERVICE_DID: "",
      PUBLIC_URL: "https://hooks.example.com:8443",
      WEBHOOK_SECRET_ENCRYPTION_KEY: KEY
    })
    const core = Layer.mergeAll(
      Config.layerValue(config),
      Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: "5 seconds" }))),
      Database.layerUrl(url)
    )
    const identity = Identity.layer().pipe(
      Layer.provide(SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] }))
    )
    const tail = TailHub.layer().pipe(Layer.provideMerge(DeliveryOutcomes.layerMemory))
    const api = Api.layer(Api.SERVED_METHODS).pipe(
      Layer.provideMerge(Layer.mergeAll(Api.methodsLayerSql, identity, tail, Jti.layerSql))
    )
    const ctx = yield* Layer.build(
      Api.serve(NodeHttpServer.layerTest).pipe(Layer.provideMerge(api), Layer.provideMerge(core))
    ).pipe(Effect.withClock(shiftedClock(offsetMs)))
    const server = Context.get(ctx, HttpServer.HttpServer)
    return server.address._tag === "TcpAddress" ? server.address.port : 0
  })

const get = (port: number, token: string) =>
  Effect.promise(async () => {
    const res = await fetch(`http://127.0.0.1:${port}/xrpc/${LIST}`, { headers: { authorization: `Bearer ${token}` } })
    return { status: res.status, error: ((await res.json()) as { readonly error?: unknown }).error }
  })

describe("the shared jti store with replicas whose clocks are behind the database's", () => {
  it.scopedLive(
    "a token the database holds expired is accepted by no replica, so never twice",
    () =>
      Effect.gen(function*() {
        const plc = yield* fakePlc(docs)
        const { url } = yield* Db.freshDatabase
        const a = yield* replica(url, plc.url, SKEW_MS)
        const b = yield* replica(url, plc.url, SKEW_MS)
        const owner = yield* newOwner()

        // in time for both (their clocks and the database's; issued 100 s ago, as their clocks
        // would refuse an `iat` of now): accepted once, refused by the other
        const nowS = Math.floor(Date.now() / 1000)
        const live = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud: AUD, iat: nowS - 100, exp: nowS + 60 }))
        expect(yield* get(a, live)).toEqual({ status: 200, error: undefined })
        expect(yield* get(b, live)).toEqual({ status: 401, error: "InvalidToken" })

        // expired 40 s ago by the database's clock (beyond the 30 s leeway), still in time for
        // clocks 2 minutes behind
        const late = yield* forge(owner.key, HEADER, claims(owner, LIST, { aud: AUD, iat: nowS - 100, exp: nowS - 40 }))
        const first = yield* get(a, late)
        const replayed = yield* get(b, late)
        // the replay, at another replica, is never accepted
        expect(replayed.status).toBe(401)
        // and the token is expired for every replica alike: the database's clock decides
        expect(first).toEqual({ status: 401, error: "ExpiredToken" })
        expect(replayed).toEqual({ status: 401, error: "ExpiredToken" })
      }),
    { timeout: 60_000 }
  )
})
