/**
 * Noisy neighbours (SPEC §4.1, §4.3): what one bad receiver costs the healthy ones.
 *
 *   node --import tsx bench/noisy.ts [seconds=90]
 *
 * One delivery worker (default settings: concurrency 64, 4 per origin, 10 s timeout, breaker at 20
 * consecutive transient failures, 60 s cool-down) against a real PostgreSQL (a throw-away database
 * `fh_bench_noisy_<pid>_<hex>` on DATABASE_URL's server, dropped at the end; else an embedded one)
 * and local receivers in a worker thread: 20 healthy ones (204 at once), one that never answers
 * (`hanging`) and one that always answers 503. Every 100 ms one processEvents
 * transaction enqueues 10 deliveries to the healthy receivers (100/s in total, round robin), 5 to the
 * hanging one and 5 to the 503 one (50/s each), for `seconds`. The hanging origin's circuit opens at
 * its 20th timeout (about 50 s in, 4 requests at a time); from then on its backlog (50 rows/s) is the
 * "noisy neighbour".
 *
 * Prints the healthy deliveries' enqueue → first attempt latency (p50/p99/max, from the database)
 * over the whole run and after the hanging origin's circuit opened (target: p99 < 100 ms), and the
 * rows the worker parked in bulk.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Context, Duration, Effect, Either, Layer, Logger, LogLevel, Redacted } from "effect"
import * as Os from "node:os"
import type { RecordEvent } from "../src/schemas/RecordEvent.js"
import * as Delivery from "../src/services/delivery/Delivery.js"
import * as DeliveryStore from "../src/services/delivery/DeliveryStore.js"
import { Destinations } from "../src/services/delivery/Destinations.js"
import * as Publisher from "../src/services/delivery/Publisher.js"
import { Secrets } from "../src/services/delivery/Secrets.js"
import * as Processor from "../src/services/matching/Processor.js"
import * as Config from "../src/services/platform/Config.js"
import * as Database from "../src/services/platform/Database.js"
import * as Health from "../src/services/platform/Health.js"
import { parseAllowCidrs, SafeHttp } from "../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../src/services/platform/Lifecycle.js"
import * as RegistryStore from "../src/services/registry/RegistryStore.js"
import { runBench } from "./lifecycle.js"
import {
  benchConfig,
  benchDatabaseUrl,
  benchPipeline,
  percentile,
  plc,
  recordEvents,
  startReceiverThread
} from "./support.js"

const SECONDS = Number(process.argv[2] ?? 90)
const HEALTHY = 20
const HEALTHY_PER_TICK = 10
const BAD_PER_TICK = 5
const TICK_MS = 100

const print = (s: string) => Effect.sync(() => process.stdout.write(s + "\n"))

// ---------------------------------------------------------------------------------------------
// receivers (worker thread): `healthy` answer 204, `hanging` never answers, `failing` answer 503

const RECEIVER_SOURCE = `
const http = require("node:http")
const { parentPort, workerData } = require("node:worker_threads")
const modes = workerData.modes
const ports = []
let pending = modes.length
modes.forEach((mode, i) => {
  const server = http.createServer((req, res) => {
    req.on("data", () => {})
    req.on("end", () => {
      if (mode === "hanging") return
      res.writeHead(mode === "failing" ? 503 : 204)
      res.end()
    })
  })
  server.keepAliveTimeout = 60000
  server.listen(0, "127.0.0.1", () => {
    ports[i] = server.address().port
    if (--pending === 0) parentPort.postMessage(ports)
  })
})
`

type Mode = "healthy" | "hanging" | "failing"
const MODES: ReadonlyArray<Mode> = [...Array.from({ length: HEALTHY }, (): Mode => "healthy"), "hanging", "failing"]

const startReceivers = startReceiverThread(RECEIVER_SOURCE, { modes: MODES })

// ---------------------------------------------------------------------------------------------
// events: receiver i's webhook watches scope DID i

const event = recordEvents()
const scopeDid = (i: number) => plc(2_000_000 + i)
let seq = 0
const post = (receiver: number) => {
  const n = seq++
  return event(scopeDid(receiver), "app.bsky.feed.post", `p${n}`, {
    $type: "app.bsky.feed.post",
    text: `noisy neighbour post ${n}`,
    createdAt: "2026-01-01T00:00:00Z"
  })
}

// ---------------------------------------------------------------------------------------------
// layers

const config = benchConfig({ WEBHOOK_ALLOW_INSECURE_DEV: "1", LOG_LEVEL: "warn" })

const pipelineOn = (url: Redacted.Redacted<string>) => benchPipeline(url, config)

const workerOn = (url: Redacted.Redacted<string>) =>
  Delivery.layer({ workerId: "bench-noisy" }).pipe(
    Layer.provide(
      Layer.mergeAll(
        DeliveryStore.layerSql,
        RegistryStore.layerSql,
        Secrets.layerMemory([]),
        SafeHttp.layerDefault({
          allowInsecureDev: true,
          allowCidrs: Either.getOrElse(parseAllowCidrs(""), () => []),
          maxSocketsPerHost: config.delivery.concurrency
        }),
        Destinations.layer,
        Publisher.layerNoop,
        Health.layer.pipe(Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: Duration.seconds(30) })))
      )
    ),
    Layer.provide(Layer.mergeAll(Database.layerUrl(url, { maxConnections: 24 }), Config.layerValue(config)))
  )

const latencies = (sql: SqlClient.SqlClient, from: Date, prefix: string) =>
  sql<{ ms: number }>`
    SELECT (extract(epoch FROM a.started_at - o.created_at) * 1000)::float8 AS ms
    FROM outbox o JOIN delivery_attempts a ON a.delivery_id = o.delivery_id AND a.attempt = 1
    WHERE o.created_at >= ${from} AND o.webhook_rkey LIKE ${prefix + "%"}
    ORDER BY 1`.pipe(Effect.map((rows) => rows.map((r) => Number(r.ms))))

const describeLatency = (ms: ReadonlyArray<number>) =>
  `p50 ${percentile(ms, 50).toFixed(1)} ms, p99 ${percentile(ms, 99).toFixed(1)} ms, max ${
    (ms[ms.length - 1] ?? Number.NaN).toFixed(1)
  } ms over ${ms.length}`

const program = Effect.gen(function*() {
  const url = yield* benchDatabaseUrl("noisy")
  const { ports } = yield* startReceivers
  const pipeline = yield* Layer.build(pipelineOn(url))
  const sql = Context.get(pipeline, SqlClient.SqlClient)
  const processor = Context.get(pipeline, Processor.Processor)
  const d = config.delivery
  yield* print(
    `noisy bench: ${HEALTHY} healthy receivers at ${
      (HEALTHY_PER_TICK * 1000) / TICK_MS
    }/s, one hanging and one 503 at ${
      (BAD_PER_TICK * 1000) / TICK_MS
    }/s each, ${SECONDS} s; concurrency ${d.concurrency} (per origin ${d.perOriginConcurrency}), timeout ${d.timeoutMs} ms, breaker ${d.circuitThreshold} failures / ${d.circuitCooldownMs} ms; ${
      process.versions["bun"] === undefined ? `node ${process.version}` : `bun ${process.versions["bun"]}`
    }, ${Os.cpus().length} CPUs`
  )
  // webhook rkeys say which receiver: ok<i>, hanging, failing
  const rkeyOf = (i: number) => (MODES[i] === "healthy" ? `ok${i}` : MODES[i] ?? "x")
  yield* processor.processEvents(
    MODES.map((_, i) =>
      event(plc(20_000 + i), "place.wisp.v2.wh", rkeyOf(i), {
        $type: "place.wisp.v2.wh",
        scope: { aturi: `at://${scopeDid(i)}` },
        url: `http://127.0.0.1:${ports[i]}/in`,
        secret: `noisy-secret-${i}-0123456789abcdef`,
        createdAt: "2026-01-01T00:00:00Z"
      })
    ),
    { registryWriter: true }
  )

  const workerCtx = yield* Layer.buildWithScope(workerOn(url), yield* Effect.scope)
  const worker = Context.get(workerCtx, Delivery.Delivery)
  const startedAt = (yield* sql<{ now: Date }>`SELECT now() AS now`)[0]?.now ?? new Date(0)
  const hanging = MODES.indexOf("hanging")
  const failing = MODES.indexOf("failing")
  let openedAt: Date | undefined
  let healthyNext = 0
  const t0 = performance.now()
  const ticks = Math.max(1, Math.round((SECONDS * 1000) / TICK_MS))
  for (let k = 0; k < ticks; k++) {
    const wait = t0 + k * TICK_MS - performance.now()
    if (wait > 0) yield* Effect.sleep(Duration.millis(wait))
    const batch: Array<RecordEvent> = []
    for (let j = 0; j < HEALTHY_PER_TICK; j++) batch.push(post(healthyNext++ % HEALTHY))
    for (let j = 0; j < BAD_PER_TICK; j++) batch.push(post(hanging), post(failing))
    yield* processor.processEvents(batch, { registryWriter: false })
    // both bad origins open: the hanging one is the last to open (its 20th timeout)
    if (openedAt === undefined && (yield* worker.stats).openCircuits >= 2) {
      openedAt = (yield* sql<{ now: Date }>`SELECT now() AS now`)[0]?.now
      yield* print(`both bad origins' circuits open after ${((performance.now() - t0) / 1000).toFixed(1)} s`)
    }
  }
  const offered = ticks * HEALTHY_PER_TICK
  // every healthy delivery attempted (bounded)
  const attempted = sql<{ n: number }>`
    SELECT count(*)::int AS n FROM outbox WHERE webhook_rkey LIKE 'ok%' AND created_at >= ${startedAt}
      AND status = 'delivered'`.pipe(Effect.map((r) => Number(r[0]?.n ?? 0)))
  yield* Effect.gen(function*() {
    while ((yield* attempted) < offered) yield* Effect.sleep(Duration.millis(200))
  }).pipe(Effect.timeoutOption(Duration.seconds(60)))
  const all = yield* latencies(sql, startedAt, "ok")
  const after = openedAt === undefined ? [] : yield* latencies(sql, openedAt, "ok")
  const stats = yield* worker.stats
  const pending = yield* sql<{ rkey: string; n: number; future: number }>`
    SELECT webhook_rkey AS rkey, count(*)::int AS n,
      count(*) FILTER (WHERE next_attempt_at > now())::int AS future
    FROM outbox WHERE status = 'pending' GROUP BY 1 ORDER BY 1`
  yield* print(
    `healthy deliveries: ${(yield* attempted)} of ${offered} delivered; enqueue → first attempt ${describeLatency(all)}`
  )
  yield* print(
    `pending rows: ${
      pending.map((r) => `${r.rkey} ${r.n} (${r.future} not due)`).join(", ")
    }; rows parked in bulk by the worker: ${stats.parkedRows}; attempts ${stats.attempts}`
  )
  yield* print(
    openedAt === undefined
      ? `noisy: the hanging origin's circuit did not open within ${SECONDS} s (run longer); healthy p99 ${
        percentile(all, 99).toFixed(1)
      } ms (target < 100 ms)`
      : `noisy: healthy p99 ${percentile(after, 99).toFixed(1)} ms after both bad circuits opened (${
        describeLatency(after)
      }; whole run p99 ${percentile(all, 99).toFixed(1)} ms; target < 100 ms)`
  )
})

runBench(program.pipe(Effect.scoped, Effect.provide(Logger.minimumLogLevel(LogLevel.Warning))))
