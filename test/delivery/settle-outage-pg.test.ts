/**
 * A database outage of a few seconds between a delivery's answer and its settle, on real
 * PostgreSQL: the worker reaches the database through a TCP proxy that the receiver cuts (every
 * connection dropped, new ones refused) as the request arrives, and that comes back 3 s later. The
 * worker's settle fails through the outage, is run again until the database is back, and applies:
 * the row is delivered after one request. Before, the settle was given up after its 0.7 s of
 * retries; the row stayed leased until its lease expired, and was then claimed and sent again.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Layer, Redacted, type Scope } from "effect"
import * as Net from "node:net"
import { layerSql as deliveryStoreSql } from "../../src/services/delivery/DeliveryStore.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../../src/services/matching/PriorRefsStore.js"
import * as ProcessorModule from "../../src/services/matching/Processor.js"
import * as Config from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import { Tx } from "../../src/services/platform/Persistence.js"
import * as Registry from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { ev, plc, rev, testConfig, whEv, whRecordValue } from "../support/stack.js"
import { countWhere, eventually, outboxRows, receiver, type Reply, run, startWorkerOn } from "./worker-support.js"

const BOB = plc(2)
const POST = "app.bsky.feed.post"
/** How long the database stays unreachable: well past the batcher's retries (0.7 s), within the lease. */
const OUTAGE = Duration.seconds(3)
/** The worker's lease: a row whose settle was given up is sent again this long after its claim. */
const LEASE_MS = 15_000

/** The matching pipeline on the database at `url` (the "intake" side of the test, not proxied). */
const stackOn = (url: Redacted.Redacted<string>, config: Config.FirehookConfigShape) =>
  ProcessorModule.layer().pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(
      Layer.mergeAll(RegistryStore.layerSql, PriorRefsStore.layerSql, Outbox.layerSql, Tx.layerSql, deliveryStoreSql)
    ),
    Layer.provideMerge(Layer.mergeAll(Database.layerUrl(url), Config.layerValue(config)))
  )

interface PgProxy {
  /** the database's URL through the proxy */
  readonly url: Redacted.Redacted<string>
  /** drop every connection and refuse new ones (each is closed as it is accepted) */
  readonly cut: () => void
  /** forward new connections again */
  readonly restore: () => void
}

/** A TCP proxy on 127.0.0.1 in front of the database server of `url`, for the scope. */
const pgProxy = (url: Redacted.Redacted<string>): Effect.Effect<PgProxy, never, Scope.Scope> => {
  const target = new URL(Redacted.value(url))
  const host = target.hostname === "" ? "127.0.0.1" : target.hostname
  const port = target.port === "" ? 5432 : Number(target.port)
  const sockets = new Set<Net.Socket>()
  const state = { down: false }
  const dropAll = () => {
    for (const s of sockets) s.destroy()
    sockets.clear()
  }
  return Effect.acquireRelease(
    Effect.async<Net.Server>((resume) => {
      const server = Net.createServer((client) => {
        if (state.down) {
          client.destroy()
          return
        }
        const upstream = Net.connect(port, host)
        sockets.add(client)
        sockets.add(upstream)
        const end = () => {
          client.destroy()
          upstream.destroy()
          sockets.delete(client)
          sockets.delete(upstream)
        }
        for (const s of [client, upstream]) {
          s.on("error", end)
          s.on("close", end)
        }
        client.pipe(upstream)
        upstream.pipe(client)
      })
      server.listen(0, "127.0.0.1", () => resume(Effect.succeed(server)))
    }),
    (server) =>
      Effect.async<void>((resume) => {
        dropAll()
        server.close(() => resume(Effect.void))
      })
  ).pipe(
    Effect.map((server) => {
      const proxied = new URL(Redacted.value(url))
      proxied.hostname = "127.0.0.1"
      proxied.port = String((server.address() as Net.AddressInfo).port)
      return {
        url: Redacted.make(proxied.toString()),
        cut: () => {
          state.down = true
          dropAll()
        },
        restore: () => {
          state.down = false
        }
      }
    })
  )
}

describe("a settle through a database outage, on PostgreSQL", () => {
  const config = testConfig({
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    // the receiver shares the test process: on a loaded machine a request can take seconds
    DELIVERY_TIMEOUT_MS: "10000"
  })

  it.scopedLive(
    "a row whose receiver answered while the database was unreachable for 3 s is delivered, and sent once",
    () =>
      Effect.flatMap(Db.freshDatabase, ({ url }) =>
        Effect.provide(
          Effect.gen(function*() {
            const proxy = yield* pgProxy(url)
            // the database becomes unreachable for the worker as the first request arrives, before it
            // is answered
            let requests = 0
            const reply = (): Reply => {
              if (++requests === 1) proxy.cut()
              return { status: 200 }
            }
            const rx = yield* receiver({ reply })
            yield* run([
              whEv(plc(1), "w", whRecordValue(`at://${BOB}`, { url: `${rx.url}/in`, secret: "outage-test-secret" }), {
                rev: rev(1)
              })
            ])
            yield* run([ev(BOB, POST, "p1", { rev: rev(10) })])
            const scope = yield* Effect.scope
            yield* startWorkerOn(
              proxy.url,
              config,
              { options: { workerId: "worker-a", leaseMs: LEASE_MS, pollIntervalMs: 100 } },
              scope
            )
            yield* eventually("the request", Effect.sync(() => rx.received.length), (n) => n === 1)
            yield* Effect.sleep(OUTAGE)
            // the outage covered the settle: the row is still leased, its answer not recorded
            const during = yield* outboxRows
            expect(during.map((r) => r.status)).toEqual(["leased"])
            proxy.restore()

            const rows = yield* eventually(
              "the row settled",
              outboxRows,
              (rs) => rs.every((r) => r.status !== "leased" && r.status !== "pending"),
              LEASE_MS * 2
            )
            expect(rows.map((r) => [r.status, r.attempt_count])).toEqual([["delivered", 1]])
            // one request, recorded as one attempt
            const id = rows[0]?.delivery_id ?? ""
            expect(rx.hits.get(id)).toBe(1)
            expect(rx.received.length).toBe(1)
            expect(yield* countWhere("delivery_attempts", "outcome = 'delivered'")).toBe(1)
            const sql = yield* SqlClient.SqlClient
            const audit = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM audit WHERE status = 'delivered'`
              .pipe(Effect.orDie)
            expect(audit[0]?.n).toBe(1)
          }),
          stackOn(url, config)
        )),
    60_000
  )
})
