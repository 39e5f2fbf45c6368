/**
 * Several replicas on one PostgreSQL database, in one test process (separate service layers, each
 * with its own database pool, HTTP server, caches and hub):
 * - the live tail: an outcome settled by replica A (NOTIFY `firehook_outcomes`) reaches a tail
 *   served by replica B (LISTEN), for its owner only; B's own outcomes reach its tails once
 *   (in process), never a second time through its own notification;
 * - the jti replay store: a token accepted by one API replica is refused (401) by another; when
 *   the shared store cannot answer the call is 503, and the same token is accepted once it can;
 *   a replica whose own replay cache is full checks new tokens against the shared store alone;
 *   the shared store is bounded by its live rows, counted, with a smaller share for long-lived tokens.
 */
import * as NodeHttpServer from "@effect/platform-node/NodeHttpServer"
import * as HttpServer from "@effect/platform/HttpServer"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Layer, Logger, Redacted } from "effect"
import pg from "pg"
import * as Api from "../../src/services/api/Api.js"
import * as Jti from "../../src/services/api/JtiStore.js"
import * as TailHub from "../../src/services/api/Tail.js"
import * as DeliveryOutcomes from "../../src/services/delivery/DeliveryOutcomes.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Db from "../support/db.js"
import { fakePlc } from "../support/fakeAtproto.js"
import { testConfig } from "../support/stack.js"
import { captureLogs, docs, KEY, mint, newOwner, SERVICE_DID } from "./support.js"
import { openTailOrDie, outcome, until, untilEffect } from "./tailClient.js"

const TAIL = "dev.firehook.webhook.subscribeDeliveries"
const LIST = "place.wisp.v2.secret.list"

interface ReplicaOptions {
  readonly outcomes: DeliveryOutcomes.SqlOptions
  readonly jti?: Layer.Layer<Jti.JtiStore, never, never>
  readonly api?: Api.ApiOptions
}

/** One API replica on the database at `url`: its own pool, identity cache, hub and HTTP server. */
const replica = (url: Redacted.Redacted<string>, plcUrl: string, options: ReplicaOptions) =>
  Effect.gen(function*() {
    const config = testConfig({
      WEBHOOK_ALLOW_INSECURE_DEV: "1",
      PLC_DIRECTORY_URL: plcUrl,
      SERVICE_DID,
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
    const tail = TailHub.layer().pipe(Layer.provideMerge(DeliveryOutcomes.layerSql(options.outcomes)))
    const api = Api.layer(Api.SERVED_METHODS, options.api).pipe(
      Layer.provideMerge(Layer.mergeAll(Api.methodsLayerSql, identity, tail, options.jti ?? Jti.layerSql))
    )
    const ctx = yield* Layer.build(
      Api.serve(NodeHttpServer.layerTest).pipe(Layer.provideMerge(api), Layer.provideMerge(core))
    )
    const server = Context.get(ctx, HttpServer.HttpServer)
    return {
      port: server.address._tag === "TcpAddress" ? server.address.port : 0,
      outcomes: Context.get(ctx, DeliveryOutcomes.DeliveryOutcomes)
    }
  })

/** A process that only settles deliveries: its outcomes are notified, nothing is served. */
const settler = (url: Redacted.Redacted<string>) =>
  Effect.map(
    Layer.build(DeliveryOutcomes.layerSql({ notify: true, listen: false }).pipe(Layer.provide(Database.layerUrl(url)))),
    (ctx) => Context.get(ctx, DeliveryOutcomes.DeliveryOutcomes)
  )

const get = (port: number, nsid: string, token: string) =>
  Effect.promise(async () => {
    const res = await fetch(`http://127.0.0.1:${port}/xrpc/${nsid}`, { headers: { authorization: `Bearer ${token}` } })
    return { status: res.status, body: (await res.json()) as { readonly [k: string]: unknown } }
  })

/** One statement on a connection of its own to the database at `url`: its rows. */
const sqlOn = (url: Redacted.Redacted<string>, text: string, values: ReadonlyArray<unknown> = []) =>
  Effect.promise(async () => {
    const client = new pg.Client({ connectionString: Redacted.value(url) })
    await client.connect()
    try {
      return (await client.query(text, [...values])).rows as ReadonlyArray<unknown>
    } finally {
      await client.end()
    }
  })

/** Every `firehook_outcomes` payload, seen by a plain LISTEN of the test's own. */
const listenAll = (url: Redacted.Redacted<string>) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const client = new pg.Client({ connectionString: Redacted.value(url) })
      await client.connect()
      const seen: Array<string> = []
      client.on("notification", (n) => seen.push(n.payload ?? ""))
      await client.query(`LISTEN ${DeliveryOutcomes.CHANNEL}`)
      return { client, seen }
    }),
    ({ client }) => Effect.promise(() => client.end())
  )

describe("replicas on one database", () => {
  it.scopedLive(
    "an outcome settled by replica A reaches the tail served by replica B (LISTEN), its owner's only",
    () =>
      Effect.gen(function*() {
        const plc = yield* fakePlc(docs)
        const { url } = yield* Db.freshDatabase
        const a = yield* settler(url)
        const b = yield* replica(url, plc.url, { outcomes: { notify: true, listen: true } })
        const raw = yield* listenAll(url)
        const owner = yield* newOwner()
        const other = yield* newOwner()
        // before any tail is open, A's outcomes are not notified (nobody wants them)
        const unwanted = outcome(owner.did)
        yield* a.publish(unwanted)
        expect(yield* a.notifying).toBe(false)
        const tail = yield* openTailOrDie(b.port, yield* mint(owner, TAIL))
        // the open tail's demand reaches A (NOTIFY firehook_tail_demand)
        yield* untilEffect("A hears B's tail demand", a.notifying)

        const fromA = outcome(owner.did, { status: "dead_letter", httpStatus: 503, errorKind: "http_5xx" })
        yield* a.publish(outcome(other.did))
        yield* a.publish(fromA)
        yield* until("A's outcome at B", () => tail.frames.length >= 1)
        expect(tail.frames[0]).toMatchObject({
          id: fromA.id,
          status: "dead_letter",
          httpStatus: 503,
          errorKind: "http_5xx"
        })

        // B's own: once, in process; its notification (seen on the channel) is not delivered again.
        // B notifies only while another process demands: the test's own client does
        yield* Effect.promise(() =>
          raw.client.query("SELECT pg_notify($1, 'another-process')", [DeliveryOutcomes.DEMAND_CHANNEL])
        )
        yield* untilEffect("B hears the other demand", b.outcomes.notifying)
        const fromB = outcome(owner.did)
        yield* b.outcomes.publish(fromB)
        yield* until("B's own", () => tail.frames.length >= 2)
        yield* until("B's notification on the channel", () => raw.seen.some((p) => p.includes(fromB.id)))
        const marker = outcome(owner.did)
        yield* a.publish(marker)
        yield* until("the marker", () => tail.frames.some((f) => f["id"] === marker.id))
        expect(tail.frames.map((f) => f["id"])).toEqual([fromA.id, fromB.id, marker.id])
        // the payloads carry no URL or body: ids, owner, rkey, event, status, codes, time
        for (const p of raw.seen) expect(p.length).toBeLessThan(8000)
        // the outcome published while no tail was open never went on the channel
        expect(raw.seen.some((p) => p.includes(unwanted.id))).toBe(false)
        tail.ws.close(1000)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "jti: a token accepted by one API replica is refused by another; store down → 503, then accepted",
    () =>
      Effect.gen(function*() {
        const plc = yield* fakePlc(docs)
        const { url } = yield* Db.freshDatabase
        const b = yield* replica(url, plc.url, { outcomes: { notify: false, listen: true } })
        const c = yield* replica(url, plc.url, { outcomes: { notify: false, listen: true } })
        const owner = yield* newOwner()
        const token = yield* mint(owner, LIST)
        expect((yield* get(b.port, LIST, token)).status).toBe(200)
        const replayed = yield* get(c.port, LIST, token)
        expect([replayed.status, replayed.body["error"]]).toEqual([401, "InvalidToken"])
        // and on the first replica too (its own cache)
        expect((yield* get(b.port, LIST, token)).status).toBe(401)

        // a replica whose shared store cannot answer: 503, never an unchecked token
        let up = false
        const real = yield* Effect.provide(Jti.makeSql, yield* Layer.build(Database.layerUrl(url)))
        const flaky: Jti.JtiStoreShape = {
          claim: (iss, jti, exp) =>
            up ? real.claim(iss, jti, exp) : Effect.fail(new StoreError({ op: "api.jti.claim", code: "08006" })),
          prune: real.prune,
          recount: real.recount
        }
        const d = yield* replica(url, plc.url, {
          outcomes: { notify: false, listen: false },
          jti: Layer.succeed(Jti.JtiStore, flaky)
        })
        const fresh = yield* mint(owner, LIST)
        const down = yield* get(d.port, LIST, fresh)
        expect([down.status, down.body["error"]]).toEqual([503, "ServiceUnavailable"])
        up = true
        expect((yield* get(d.port, LIST, fresh)).status).toBe(200)
        // a replay to the replica that accepted it is refused by its own cache, without asking the
        // store: so still 401 (never 503) while the store cannot answer
        up = false
        const again = yield* get(d.port, LIST, fresh)
        expect([again.status, again.body["error"]]).toEqual([401, "InvalidToken"])
        up = true
        expect((yield* get(b.port, LIST, fresh)).status).toBe(401)
        // expired rows are pruned
        expect(yield* real.prune).toBe(0)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "jti: a replica whose replay cache is full checks tokens against the shared store alone (no 503)",
    () =>
      Effect.gen(function*() {
        const plc = yield* fakePlc(docs)
        const { url } = yield* Db.freshDatabase
        const full = yield* replica(url, plc.url, {
          outcomes: { notify: false, listen: false },
          api: { replayCapacity: 1 }
        })
        const other = yield* replica(url, plc.url, { outcomes: { notify: false, listen: false } })
        // one caller fills the cache (here: one genuine 1-hour token)
        const filler = yield* newOwner()
        const held = yield* mint(filler, LIST, { expiresIn: 3600 })
        expect((yield* get(full.port, LIST, held)).status).toBe(200)
        // another owner's genuine token: accepted (before: 503 NotEnoughResources until the filler's expired)
        const owner = yield* newOwner()
        const token = yield* mint(owner, LIST)
        const accepted = yield* get(full.port, LIST, token)
        expect([accepted.status, accepted.body["error"]]).toEqual([200, undefined])
        // replays are still refused, on this replica (through the store) and on another
        expect((yield* get(full.port, LIST, token)).status).toBe(401)
        expect((yield* get(other.port, LIST, token)).status).toBe(401)
        expect((yield* get(full.port, LIST, held)).status).toBe(401)
        expect((yield* get(other.port, LIST, held)).status).toBe(401)
        // a token first accepted by another replica is refused here too, though this cache is full
        const elsewhere = yield* mint(owner, LIST)
        expect((yield* get(other.port, LIST, elsewhere)).status).toBe(200)
        expect((yield* get(full.port, LIST, elsewhere)).status).toBe(401)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "jti: the shared store is bounded: past its live rows 503, long-lived tokens first; expired rows free it",
    () =>
      Effect.gen(function*() {
        const plc = yield* fakePlc(docs)
        const { url } = yield* Db.freshDatabase
        const db = yield* Layer.build(Database.layerUrl(url))
        const store = yield* Effect.provide(Jti.makeSqlWith({ liveRows: 4, longLivedRows: 1 }), db)
        const bounded = yield* replica(url, plc.url, {
          outcomes: { notify: false, listen: false },
          jti: Layer.succeed(Jti.JtiStore, store)
        })
        const other = yield* replica(url, plc.url, { outcomes: { notify: false, listen: false } })
        const owner = yield* newOwner()
        // rows claimed by another replica count once the table is counted
        for (let i = 0; i < 2; i++) expect((yield* get(other.port, LIST, yield* mint(owner, LIST))).status).toBe(200)
        expect(yield* store.recount).toEqual({ live: 2, longLived: 0 })
        // a long-lived token takes the long-lived share (this process counts its own claims at once)
        expect((yield* get(bounded.port, LIST, yield* mint(owner, LIST, { expiresIn: 3600 }))).status).toBe(200)
        const long = yield* get(bounded.port, LIST, yield* mint(owner, LIST, { expiresIn: 3600 }))
        expect([long.status, long.body["error"]]).toEqual([503, "NotEnoughResources"])
        // a PDS's 60 s token still gets in, until the whole table is at its bound
        expect((yield* get(bounded.port, LIST, yield* mint(owner, LIST, { expiresIn: 60 }))).status).toBe(200)
        const short = yield* mint(owner, LIST, { expiresIn: 60 })
        const full = yield* get(bounded.port, LIST, short)
        expect([full.status, full.body["error"]]).toEqual([503, "NotEnoughResources"])
        expect(yield* store.recount).toEqual({ live: 4, longLived: 1 })
        // the refused token was not recorded anywhere: once rows expire (not yet pruned) and the
        // table is counted again, it is accepted, once
        yield* sqlOn(url, "UPDATE api_jti SET expires_at = now() - interval '1 second'")
        expect(yield* store.recount).toEqual({ live: 0, longLived: 0 })
        expect((yield* get(bounded.port, LIST, short)).status).toBe(200)
        expect((yield* get(bounded.port, LIST, short)).status).toBe(401)
        expect((yield* get(other.port, LIST, short)).status).toBe(401)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "jti: one prune deletes every expired row while it finds full batches (bounded), not 10,000 a minute",
    () =>
      Effect.gen(function*() {
        const { url } = yield* Db.freshDatabase
        const store = yield* Effect.provide(Jti.makeSql, yield* Layer.build(Database.layerUrl(url)))
        const expired = Jti.PRUNE_MAX_ROWS * 2 + 5
        yield* sqlOn(
          url,
          `INSERT INTO api_jti (iss, jti, expires_at)
           SELECT 'did:web:flood.example', 'j' || g, now() - interval '1 minute' FROM generate_series(1, $1::int) g`,
          [expired]
        )
        yield* sqlOn(
          url,
          "INSERT INTO api_jti (iss, jti, expires_at) VALUES ('did:web:owner.example', 'live', now() + interval '1 hour')"
        )
        expect(yield* store.prune).toBe(expired)
        expect(yield* sqlOn(url, "SELECT count(*)::int AS n FROM api_jti")).toEqual([{ n: 1 }])
        expect(yield* store.prune).toBe(0)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "jti: a shared store that cannot answer: 30 calls are 30 × 503, logged at most once a minute (not per call)",
    () => {
      const { capture, lines } = captureLogs()
      return Effect.gen(function*() {
        const plc = yield* fakePlc(docs)
        const { url } = yield* Db.freshDatabase
        const real = yield* Effect.provide(Jti.makeSql, yield* Layer.build(Database.layerUrl(url)))
        const down: Jti.JtiStoreShape = {
          claim: () => Effect.fail(new StoreError({ op: "api.jti.claim", code: "08006" })),
          prune: real.prune,
          recount: real.recount
        }
        const d = yield* replica(url, plc.url, {
          outcomes: { notify: false, listen: false },
          jti: Layer.succeed(Jti.JtiStore, down)
        })
        const owner = yield* newOwner()
        for (let i = 0; i < 30; i++) {
          const r = yield* get(d.port, LIST, yield* mint(owner, LIST))
          expect([r.status, r.body["error"]]).toEqual([503, "ServiceUnavailable"])
        }
        const warnings = lines.filter((l) => l.level === "WARN" || l.level === "ERROR" || l.level === "FATAL")
        // one line per kind of problem in the minute, not one per call
        expect(warnings.length).toBeGreaterThan(0)
        expect(warnings.length).toBeLessThanOrEqual(2)
      }).pipe(Effect.provide(Logger.replace(Logger.defaultLogger, capture)))
    },
    { timeout: 60_000 }
  )
})
