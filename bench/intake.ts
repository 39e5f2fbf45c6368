/**
 * Intake throughput: the real Jetstream intake pipeline (FirehoseSource → Intake stream runners →
 * Processor → PostgreSQL) against a local Jetstream, with 10,000 active webhooks.
 *
 *   node --import tsx bench/intake.ts [events = 200000] [share of events with references = 0.05]
 *   DATABASE_URL=postgresql://postgres@127.0.0.1:5432/postgres node --import tsx bench/intake.ts
 *   bun bench/intake.ts 200000                       (the production runtime)
 *   BUN_JSC_heapGrowthMaxIncrease=1 bun bench/intake.ts   (the recommended production setting, see
 *                                                     docs/operations.md "Memory")
 *   node without the tsx loader (tsx alone holds ≈ 80–110 MiB of this process's RSS; it is harness,
 *   not firehook): bun build bench/intake.ts --target=node --packages=external --format=esm \
 *     --outfile=node_modules/.cache/fh-bench/intake.mjs && node node_modules/.cache/fh-bench/intake.mjs
 *
 * - Database: `DATABASE_URL` when set (a database `fh_bench_intake_<pid>_<hex>` is created on that
 *   server and dropped afterwards, bench/lifecycle.ts), else an embedded PostgreSQL in a temporary directory (removed afterwards).
 * - Registry: 10,000 valid, active webhook rows (`Registry.toRow` over validated records, one
 *   multi-row INSERT per 1,000) are written before the registry loads, by the child process (the
 *   seeding's memory is harness setup, not firehook's); 10% are backlink scopes, so all three
 *   Jetstream streams run (registry; direct with ~7,000 wantedDids; backlink).
 * - Source: a child process runs a local Jetstream (bench/support.ts, the protocol of
 *   test/support/fakeJetstream.ts) over N commit frames generated before timing (1% from watched
 *   scopes, 5% with references, a network-like collection/operation mix). The child is a separate
 *   process so that its frames and sockets count neither in this process's RSS nor on its thread.
 * - Feeding: live and closed-loop. Frames are released in order, never more than the intake queue
 *   (512) ahead of the backlink stream's durable cursor: firehook takes them as fast as it commits
 *   them, and its socket never overflows (a browser-style WebSocket cannot push back, so an
 *   open-loop flood would measure reconnects instead of intake). The release follows each committed
 *   backlink batch (the wrapped `processEvents` below sees its cursor), so the harness costs this
 *   process at most one IPC message per batch (and per 64 frames), not a 1 ms polling loop. Timing starts at the first release
 *   and ends when the backlink and direct streams' durable cursors reach their last frames.
 * - Batch commit times: `Processor.processEvents` is wrapped and timed (performance.now), the span
 *   that the intake's `firehook_intake_batch_commit_ms` histogram covers (its lock wait included).
 *
 * Diagnostics (environment):
 * - `WEBHOOK_INTAKE_QUEUE_MAX`, `WEBHOOK_INTAKE_BATCH_MAX`: intake tuning (default 512 / 128);
 * - `BENCH_STORES=memory`: the in-memory stores instead of PostgreSQL;
 * - `BENCH_PROCESSOR=noop`: batches only write their cursor (the socket → intake path alone);
 * - `BENCH_TRACE=1`: time summed per span (SQL statements by their first words);
 * - `BENCH_PROFILE=<file>`: a V8 CPU profile of the timed part;
 * - `BENCH_DEBUG=1` (after a full GC: Bun always, Node with `--expose-gc`), `BENCH_SMAPS=1`: memory by stage;
 * - `BENCH_MEMLOG=<ms>`: rss / heap / external / arrayBuffers (and JSC's heap under Bun) every <ms>
 *   while timed, one line each to stderr;
 * - `BENCH_HEAPSNAPSHOT=<file>` (Node): a heap snapshot after the timed part, after a full GC.
 */
import * as Socket from "@effect/platform/Socket"
import * as SqlClient from "@effect/sql/SqlClient"
import {
  Context,
  Duration,
  Effect,
  Layer,
  Logger,
  LogLevel,
  Metric,
  type MetricPair,
  MetricState,
  Redacted,
  Tracer
} from "effect"
import { type ChildProcess, fork } from "node:child_process"
import { randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { fileURLToPath } from "node:url"
import * as V8 from "node:v8"
import pg from "pg"
import { WebSocket as WsClient } from "ws"
import * as App from "../src/layers/App.js"
import { validateWhRecord } from "../src/schemas/WhRecord.js"
import * as CursorStore from "../src/services/intake/CursorStore.js"
import * as Intake from "../src/services/intake/Intake.js"
import * as Outbox from "../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../src/services/matching/PriorRefsStore.js"
import * as ProcessorModule from "../src/services/matching/Processor.js"
import { Processor, type ProcessorShape } from "../src/services/matching/Processor.js"
import * as Config from "../src/services/platform/Config.js"
import { FirehookConfig } from "../src/services/platform/Config.js"
import * as Database from "../src/services/platform/Database.js"
import * as EmbeddedPg from "../src/services/platform/EmbeddedPg.js"
import { Tx } from "../src/services/platform/Persistence.js"
import { Registry, toRow } from "../src/services/registry/Registry.js"
import * as RegistryModule from "../src/services/registry/Registry.js"
import * as RegistryStore from "../src/services/registry/RegistryStore.js"
import type { WebhookRow } from "../src/services/registry/RegistryStore.js"
import { scopedBenchDatabase } from "./lifecycle.js"
import {
  benchConfig,
  type FrameSet,
  machine,
  makeFrames,
  makeWebhooks,
  mib,
  percentile,
  startBenchJetstream,
  startRssSampler,
  type WebhookPopulation
} from "./support.js"

const WEBHOOKS = 10_000
const SEED = 0x1f2e3d4c
const STEP_US = 10

// ---------------------------------------------------------------------------------------------
// the Jetstream child process

interface ChildParams {
  readonly events: number
  readonly webhooks: number
  readonly seed: number
  readonly refsShare: number
  readonly t0: number
}

interface ReadyMessage {
  readonly type: "ready"
  readonly url: string
  readonly t0: number
  readonly stepUs: number
  readonly events: number
  readonly bytes: number
  readonly counts: FrameSet["counts"]
  readonly lastDirectTimeUs: number | null
  readonly generateMs: number
  readonly webhooks: number
  readonly owners: number
}
interface SubscribedMessage {
  readonly type: "subscribed"
  readonly subs: ReadonlyArray<{ readonly collections: number | null; readonly dids: number | null }>
}
interface CpuMessage {
  readonly type: "cpu"
  readonly cpuMs: number
}
interface SeededMessage {
  readonly type: "seeded"
  readonly rows: number
  readonly ms: number
  readonly error: string | null
}
type FromChild = ReadyMessage | SubscribedMessage | CpuMessage | SeededMessage
type ToChild =
  | { readonly type: "release"; readonly upTo: number }
  | { readonly type: "cpu" }
  | { readonly type: "seed"; readonly url: string }
  | { readonly type: "stop" }

const isFromChild = (u: unknown): u is FromChild =>
  typeof u === "object" &&
  u !== null &&
  "type" in u &&
  (u.type === "ready" || u.type === "subscribed" || u.type === "cpu" || u.type === "seeded")

const runChild = async (params: ChildParams): Promise<void> => {
  const send = (m: FromChild) => process.send?.(m)
  const started = performance.now()
  const population = makeWebhooks(params.webhooks, params.seed)
  const frames = makeFrames(population, {
    events: params.events,
    seed: params.seed,
    t0: params.t0,
    stepUs: STEP_US,
    refsShare: params.refsShare
  })
  const generateMs = performance.now() - started
  const server = await startBenchJetstream(frames, () =>
    send({
      type: "subscribed",
      subs: server.subscribed().map((s) => ({ collections: s.collections ?? null, dids: s.dids ?? null }))
    }))
  process.on("message", (m: ToChild) => {
    if (m.type === "release") server.release(m.upTo)
    else if (m.type === "seed") {
      const seedStart = performance.now()
      seedRows(m.url, webhookRows(population)).then(
        (rows) => send({ type: "seeded", rows, ms: performance.now() - seedStart, error: null }),
        (e: unknown) => send({ type: "seeded", rows: 0, ms: 0, error: String(e) })
      )
    } else if (m.type === "cpu") {
      const u = process.cpuUsage()
      send({ type: "cpu", cpuMs: (u.user + u.system) / 1000 })
    } else void server.close().then(() => process.exit(0))
  })
  process.on("disconnect", () => process.exit(0))
  send({
    type: "ready",
    url: server.url,
    t0: frames.t0,
    stepUs: frames.stepUs,
    events: frames.texts.length,
    bytes: frames.bytes,
    counts: frames.counts,
    lastDirectTimeUs: frames.lastDirectTimeUs ?? null,
    generateMs,
    webhooks: population.webhooks.length,
    owners: population.owners
  })
}

interface ChildHandle {
  readonly ready: ReadyMessage
  readonly release: (upTo: number) => void
  readonly subs: () => SubscribedMessage["subs"]
  readonly cpuMs: Effect.Effect<number>
  /** the child writes the webhook rows into the database at `url` (its memory, not ours) */
  readonly seed: (url: string) => Effect.Effect<SeededMessage>
}

const startChild = (params: ChildParams) =>
  Effect.acquireRelease(
    Effect.async<{ child: ChildProcess; handle: ChildHandle }, Error>((resume) => {
      const child = fork(fileURLToPath(import.meta.url), ["--jetstream-child", JSON.stringify(params)], {
        // Bun runs TypeScript itself; Node needs the tsx loader
        execArgv: process.versions["bun"] === undefined ? ["--import", "tsx"] : [],
        stdio: ["ignore", "inherit", "inherit", "ipc"]
      })
      let subs: SubscribedMessage["subs"] = []
      const cpuWaiters: Array<(ms: number) => void> = []
      const seedWaiters: Array<(m: SeededMessage) => void> = []
      let done = false
      child.on("message", (m: unknown) => {
        if (!isFromChild(m)) return
        if (m.type === "subscribed") subs = m.subs
        else if (m.type === "cpu") cpuWaiters.shift()?.(m.cpuMs)
        else if (m.type === "seeded") seedWaiters.shift()?.(m)
        else if (!done) {
          done = true
          const handle: ChildHandle = {
            ready: m,
            release: (upTo) => child.send({ type: "release", upTo } satisfies ToChild),
            subs: () => subs,
            cpuMs: Effect.async<number>((r) => {
              cpuWaiters.push((ms) => r(Effect.succeed(ms)))
              child.send({ type: "cpu" } satisfies ToChild)
            }),
            seed: (url) =>
              Effect.async<SeededMessage>((r) => {
                seedWaiters.push((msg) => r(Effect.succeed(msg)))
                child.send({ type: "seed", url } satisfies ToChild)
              })
          }
          resume(Effect.succeed({ child, handle }))
        }
      })
      child.once("exit", (code) => {
        if (!done) {
          done = true
          resume(Effect.fail(new Error(`the Jetstream child exited (${code ?? "signal"}) before it was ready`)))
        }
      })
    }),
    ({ child }) =>
      Effect.async<void>((resume) => {
        if (child.exitCode !== null || child.signalCode !== null) return resume(Effect.void)
        const timer = setTimeout(() => {
          if (child.pid !== undefined) process.kill(child.pid, "SIGKILL")
        }, 5_000)
        child.once("exit", () => {
          clearTimeout(timer)
          resume(Effect.void)
        })
        child.send({ type: "stop" } satisfies ToChild)
      })
  ).pipe(Effect.map(({ handle }) => handle))

// ---------------------------------------------------------------------------------------------
// the database

/** A fresh database on DATABASE_URL's server (dropped afterwards), or an embedded PostgreSQL. */
const benchDatabase = Effect.gen(function*() {
  const external = process.env["DATABASE_URL"]
  if (external !== undefined && external.length > 0) {
    // fh_bench_intake_<pid>_<hex>, dropped with the scope; stale ones of gone processes dropped first
    const { url } = yield* scopedBenchDatabase(external, "intake")
    return { url, where: "DATABASE_URL server" }
  }
  const name = `fh_bench_${randomBytes(6).toString("hex")}`
  const dir = yield* Effect.acquireRelease(
    Effect.sync(() => {
      const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-bench-pg-"))
      // as root, PostgreSQL runs as the postgres user, which must be able to enter the directory
      Fs.chmodSync(d, 0o755)
      return d
    }),
    (d) => Effect.sync(() => Fs.rmSync(d, { recursive: true, force: true }))
  )
  const embedded = yield* EmbeddedPg.start({ dataDir: dir, database: name })
  return { url: embedded.url, where: "embedded PostgreSQL (temporary directory)" }
})

/** The population as stored rows: every record validated, then `Registry.toRow`. */
const webhookRows = (population: WebhookPopulation): ReadonlyArray<WebhookRow> =>
  population.webhooks.map((w) => {
    const v = validateWhRecord(w.record, { allowInsecureDev: false })
    if (v._tag === "Left") throw new Error(`invalid bench webhook record (${v.left})`)
    return toRow(w.owner, w.rkey, v.right.record, v.right.scope, w.rev, 1, undefined, true)
  })

/**
 * Write the rows (multi-row INSERTs of 1,000) and their owners. Runs in the Jetstream child, so the
 * seeding's memory is not charged to the measured process (firehook only loads the registry).
 */
const seedRows = async (url: string, rows: ReadonlyArray<WebhookRow>): Promise<number> => {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 })
  await client.connect()
  try {
    for (let i = 0; i < rows.length; i += 1000) {
      const chunk = rows.slice(i, i + 1000).map((r) => ({
        owner_did: r.ownerDid,
        rkey: r.rkey,
        rev: r.rev,
        generation: r.generation,
        cid: r.cid ?? null,
        record: r.record,
        scope_uri: r.scopeUri,
        scope_did: r.scopeDid,
        backlinks: r.backlinks,
        url: r.url,
        events: r.events,
        enabled: r.enabled,
        active: r.active,
        signing_mode: r.signingMode,
        secret_id: r.secretId ?? null,
        fingerprint: r.fingerprint
      }))
      await client.query(
        `INSERT INTO webhooks (owner_did, rkey, rev, generation, cid, record, scope_uri, scope_did, backlinks, url,
          events, enabled, active, signing_mode, secret_id, fingerprint)
        SELECT owner_did, rkey, rev, generation, cid, record, scope_uri, scope_did, backlinks, url,
          events, enabled, active, signing_mode, secret_id, fingerprint
        FROM jsonb_to_recordset($1::jsonb) AS x(owner_did text, rkey text, rev text,
          generation bigint, cid text, record jsonb, scope_uri text, scope_did text, backlinks boolean, url text,
          events text[], enabled boolean, active boolean, signing_mode text, secret_id text, fingerprint text)`,
        [JSON.stringify(chunk)]
      )
    }
    await client.query(
      `INSERT INTO owners (did, generation) SELECT DISTINCT owner_did, 1 FROM webhooks ON CONFLICT DO NOTHING`
    )
    return rows.length
  } finally {
    await client.end()
  }
}

// ---------------------------------------------------------------------------------------------
// CPU of the PostgreSQL server processes serving the benchmark (Linux /proc, local server only)

/** CPU ms (user + system) of every process named postgres*, by pid. */
const postgresCpu = (): Map<number, number> => {
  const out = new Map<number, number>()
  if (!Fs.existsSync("/proc/self/stat")) return out
  for (const pid of Fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(pid)) continue
    let stat: string
    try {
      stat = Fs.readFileSync(`/proc/${pid}/stat`, "utf8")
    } catch {
      continue
    }
    const close = stat.lastIndexOf(")")
    if (!stat.slice(stat.indexOf("(") + 1, close).startsWith("postgres")) continue
    const fields = stat.slice(close + 2).split(" ")
    out.set(Number(pid), (Number(fields[11]) + Number(fields[12])) * 10) // USER_HZ = 100
  }
  return out
}

/** CPU ms used since `before` by the given server pids (undefined when none is a local process). */
const postgresCpuSince = (before: ReadonlyMap<number, number>, pids: ReadonlyArray<number>): number | undefined => {
  const now = postgresCpu()
  let total = 0
  let seen = 0
  for (const pid of pids) {
    const ms = now.get(pid)
    if (ms === undefined) continue
    seen++
    total += ms - (before.get(pid) ?? 0)
  }
  return seen === 0 ? undefined : total
}

// ---------------------------------------------------------------------------------------------
// BENCH_PROFILE=<file.cpuprofile>: a V8 CPU profile of the timed part only

const startProfile = (): Effect.Effect<(() => Promise<void>) | undefined> =>
  Effect.promise(async () => {
    const file = process.env["BENCH_PROFILE"]
    if (file === undefined || file.length === 0) return undefined
    const Inspector = await import("node:inspector")
    const session = new Inspector.Session()
    session.connect()
    const post = (method: string, params?: object) =>
      new Promise<unknown>((resolve, reject) =>
        session.post(method, params, (err, result) => (err === null ? resolve(result) : reject(err)))
      )
    await post("Profiler.enable")
    await post("Profiler.setSamplingInterval", { interval: 200 })
    await post("Profiler.start")
    return async () => {
      const result = await post("Profiler.stop")
      const profile = typeof result === "object" && result !== null && "profile" in result ? result.profile : undefined
      Fs.writeFileSync(file, JSON.stringify(profile))
      session.disconnect()
    }
  })

// ---------------------------------------------------------------------------------------------
// the benchmark

/**
 * BENCH_TRACE=1: a tracer that adds up the time of every span (by name; SQL statements by their
 * first words) while `enabled()`, on top of the default tracer. For finding where a batch's time goes.
 */
const spanTotals = new Map<string, { n: number; ms: number }>()
let tracing = false
const recordingTracer = (native: Tracer.Tracer): Tracer.Tracer =>
  Tracer.make({
    span: (name, parent, context, links, startTime, kind, options) => {
      const span = native.span(name, parent, context, links, startTime, kind, options)
      const end = span.end.bind(span)
      span.end = (endTime, exit) => {
        if (tracing) {
          const text = span.attributes.get("db.query.text")
          const key = typeof text === "string" ? `sql ${text.trim().split(/\s+/).slice(0, 3).join(" ")}` : name
          const t = spanTotals.get(key) ?? { n: 0, ms: 0 }
          t.n++
          t.ms += Number(endTime - startTime) / 1e6
          spanTotals.set(key, t)
        }
        end(endTime, exit)
      }
      return span
    },
    context: (f, fiber) => native.context(f, fiber)
  })

/**
 * BENCH_MEMLOG=<ms>: the memory breakdown every <ms> while timed (process.memoryUsage, and under Bun
 * JSC's heap statistics), printed as one line per sample to stderr (no arrays kept).
 */
const startMemLog = (): Effect.Effect<() => void> =>
  Effect.promise(async () => {
    const every = Number(process.env["BENCH_MEMLOG"] ?? 0)
    if (!(every > 0)) return () => {}
    type JscStats = {
      readonly heapSize: number
      readonly heapCapacity: number
      readonly extraMemorySize: number
      readonly objectCount: number
    }
    const jsc: (() => JscStats) | undefined = process.versions["bun"] === undefined
      ? undefined
      : ((await import("bun:jsc" as string)) as { heapStats: () => JscStats }).heapStats
    const t0 = performance.now()
    const timer = setInterval(() => {
      const m = process.memoryUsage()
      const j = jsc?.()
      process.stderr.write(
        `mem ${((performance.now() - t0) / 1000).toFixed(1)}s rss ${mib(m.rss)} heapUsed ${mib(m.heapUsed)} heapTotal ${
          mib(m.heapTotal)
        } ` +
          `external ${mib(m.external)} arrayBuffers ${mib(m.arrayBuffers)}` +
          (j === undefined
            ? ""
            : ` jsc heap ${mib(j.heapSize)} capacity ${mib(j.heapCapacity)} extra ${
              mib(j.extraMemorySize)
            } objects ${j.objectCount}`) +
          "\n"
      )
    }, every)
    return () => clearInterval(timer)
  })

interface BatchTiming {
  readonly ms: number
  readonly events: number
  readonly stream: string
}

const counterByTag = (pairs: ReadonlyArray<MetricPair.MetricPair.Untyped>, name: string, tag: string) => {
  const out: Record<string, number> = {}
  for (const p of pairs) {
    if (p.metricKey.name !== name || !MetricState.isCounterState(p.metricState)) continue
    const key = p.metricKey.tags.find((t) => t.key === tag)?.value ?? "-"
    out[key] = (out[key] ?? 0) + Number(p.metricState.count)
  }
  return out
}

/** A full, synchronous GC: Bun's `Bun.gc(true)`, Node's `gc()` when run with --expose-gc. */
const fullGc = () => {
  const bun = (globalThis as { readonly Bun?: { readonly gc: (sync: boolean) => void } }).Bun
  if (bun !== undefined) bun.gc(true)
  else (globalThis as { readonly gc?: () => void }).gc?.()
}

/** BENCH_DEBUG=1: memory at a stage (after a full GC: Bun always, Node when run with --expose-gc). */
const stage = (name: string) =>
  Effect.sync(() => {
    if (process.env["BENCH_DEBUG"] !== "1") return
    fullGc()
    const m = process.memoryUsage()
    if (process.env["BENCH_SMAPS"] === "1" && Fs.existsSync("/proc/self/smaps")) {
      const sizes = new Map<string, number>()
      let current = "?"
      for (const line of Fs.readFileSync("/proc/self/smaps", "utf8").split("\n")) {
        const head = /^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$/.exec(line)
        if (head !== null) current = head[1] === undefined || head[1] === "" ? "[anon]" : head[1]
        else if (line.startsWith("Rss:")) {
          sizes.set(current, (sizes.get(current) ?? 0) + Number(line.split(/\s+/)[1]) * 1024)
        }
      }
      console.log(`  smaps: ${
        [...sizes.entries()].sort((a, b) => b[1] - a[1]).slice(0, 6).map(([k, v]) =>
          `${k} ${mib(v)}`
        ).join(", ")
      }`)
    }
    const h = V8.getHeapStatistics()
    console.log(
      `stage ${name}: rss ${mib(m.rss)} MiB, heap used ${mib(m.heapUsed)} of ${mib(m.heapTotal)} MiB, external ${
        mib(m.external)
      } MiB, ` +
        `v8 malloced ${mib(h.malloced_memory)} (peak ${mib(h.peak_malloced_memory)}) MiB`
    )
  })

interface OutboxCounts {
  readonly outbox: number
  readonly direct: number
  readonly backlink: number
  readonly bodies: number
  readonly prior: number
  readonly quarantine: number
}

type Matching = Context.Context<Processor | Registry | CursorStore.CursorStore | Outbox.OutboxStore>

/** What the measurement needs from a storage backend (PostgreSQL, or memory for diagnosis). */
interface Backend {
  readonly where: string
  readonly version: string
  readonly seedMs: number
  readonly loadMs: number
  readonly matching: Matching
  readonly counts: Effect.Effect<OutboxCounts | undefined>
  /** server processes working for the benchmark: its database's backends and the background processes */
  readonly serverPids: Effect.Effect<ReadonlyArray<number>>
}

/** PostgreSQL: seed the webhook rows, then build the real matching layer (the registry loads). */
const sqlBackend = (child: ChildHandle, url: string, where: string) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const version = (yield* sql<{ server_version: string }>`SHOW server_version`)[0]?.server_version ?? "?"
    yield* stage("database connected")
    const seeded = yield* child.seed(url)
    if (seeded.error !== null) return yield* Effect.dieMessage(`seeding failed: ${seeded.error}`)
    const seedMs = seeded.ms
    yield* stage("webhooks seeded")
    const loadStart = performance.now()
    const matching: Matching = yield* Layer.build(App.matchingLayer)
    const loadMs = performance.now() - loadStart
    yield* stage("registry loaded")
    const counts = sql<{ [K in keyof OutboxCounts]: string }>`
      SELECT (SELECT count(*) FROM outbox) AS outbox,
             (SELECT count(*) FROM outbox WHERE match_kind = 'direct') AS direct,
             (SELECT count(*) FROM outbox WHERE match_kind = 'backlink') AS backlink,
             (SELECT count(*) FROM delivery_events) AS bodies,
             (SELECT count(*) FROM prior_refs) AS prior,
             (SELECT count(*) FROM quarantine) AS quarantine`.pipe(
      Effect.map((rows): OutboxCounts | undefined => {
        const r = rows[0]
        return r === undefined
          ? undefined
          : {
            outbox: Number(r.outbox),
            direct: Number(r.direct),
            backlink: Number(r.backlink),
            bodies: Number(r.bodies),
            prior: Number(r.prior),
            quarantine: Number(r.quarantine)
          }
      }),
      Effect.orDie
    )
    const serverPids = sql<{ pid: number }>`
      SELECT pid FROM pg_stat_activity WHERE datname = current_database() OR backend_type <> 'client backend'`.pipe(
      Effect.map((rows) => rows.map((r) => Number(r.pid))),
      Effect.orDie
    )
    const backend: Backend = { where, version, seedMs, loadMs, matching, counts, serverPids }
    return backend
  })

/** BENCH_STORES=memory: the same pipeline on the in-memory stores (no PostgreSQL at all). */
const memoryBackend = (population: WebhookPopulation) =>
  Effect.gen(function*() {
    const seedStart = performance.now()
    const store = yield* RegistryStore.makeMemory
    for (const row of webhookRows(population)) yield* store.upsert(row)
    const seedMs = performance.now() - seedStart
    const loadStart = performance.now()
    const matching: Matching = yield* Layer.build(
      ProcessorModule.layer().pipe(
        Layer.provideMerge(RegistryModule.layer),
        Layer.provideMerge(
          Layer.mergeAll(
            Layer.succeed(RegistryStore.RegistryStore, store),
            PriorRefsStore.layerMemory(),
            Outbox.layerMemory,
            Tx.layerMemory,
            CursorStore.layerMemory
          )
        )
      )
    )
    const loadMs = performance.now() - loadStart
    const backend: Backend = {
      where: "none: in-memory stores (BENCH_STORES=memory)",
      version: "-",
      seedMs,
      loadMs,
      matching,
      counts: Effect.succeed(undefined),
      serverPids: Effect.succeed([])
    }
    return backend
  })

/** BENCH_PROCESSOR=noop: every batch only runs its cursor write (isolates socket → intake cost). */
const noopProcessor = (real: ProcessorShape): ProcessorShape => ({
  ...real,
  processEvents: (_batch, options) =>
    (options.finalize ?? Effect.void).pipe(Effect.as({ outcomes: [], inserted: 0, duplicates: 0, quarantined: 0 }))
})

const measure = (
  backend: Backend,
  child: ChildHandle,
  config: Config.FirehookConfigShape,
  rss: ReturnType<typeof startRssSampler>
) =>
  Effect.gen(function*() {
    const ready = child.ready
    const window = config.intake.queueMax
    const { matching } = backend
    const registry = Context.get(matching, Registry)
    const regStats = yield* registry.stats
    if (regStats.active !== ready.webhooks) {
      return yield* Effect.dieMessage(
        `registry loaded ${regStats.active} of ${ready.webhooks} webhooks (${JSON.stringify(regStats)})`
      )
    }

    // time every batch as the intake sees it
    const noop = process.env["BENCH_PROCESSOR"] === "noop"
    const real = noop ? noopProcessor(Context.get(matching, Processor)) : Context.get(matching, Processor)
    const timings: Array<BatchTiming> = []
    let timing = false
    // the closed loop: a committed backlink batch releases the frames up to a queue ahead of its
    // cursor at once (the harness's own work in this process stays per batch, not per poll)
    let onBacklinkCommit: (cursor: bigint) => void = () => {}
    let onDirectCommit: (cursor: bigint) => void = () => {}
    const timed: ProcessorShape = {
      ...real,
      processEvents: (batch, options) =>
        Effect.suspend(() => {
          const start = performance.now()
          return real.processEvents(batch, options).pipe(
            Effect.tap(() =>
              Effect.sync(() => {
                if (timing) {
                  timings.push({
                    ms: performance.now() - start,
                    events: batch.length,
                    stream: batch[0]?.stream ?? options.cursor?.stream ?? "-"
                  })
                }
                if (options.cursor?.stream === "backlink") onBacklinkCommit(options.cursor.cursor)
                else if (options.cursor?.stream === "direct") onDirectCommit(options.cursor.cursor)
              })
            )
          )
        })
    }
    const intake = yield* Intake.make().pipe(
      Effect.provide(Context.add(matching, Processor, timed)),
      Effect.provideService(FirehookConfig, config)
    )
    const run = typeof globalThis.WebSocket === "function"
      ? intake.run
      : intake.run.pipe(
        Effect.provideService(
          Socket.WebSocketConstructor,
          (url) => new WsClient(url) as unknown as globalThis.WebSocket
        )
      )
    yield* Effect.forkScoped(run)

    // the three streams subscribed (their hello reached the server)
    for (let i = 0;; i++) {
      const subs = child.subs()
      const registryS = subs.some((s) => s.collections === 1)
      const directS = subs.some((s) => (s.dids ?? 0) > 0)
      const backlinkS = subs.some((s) => s.collections === null && s.dids === null)
      if (registryS && directS && backlinkS) break
      if (i > 3000) return yield* Effect.dieMessage(`streams did not subscribe: ${JSON.stringify(subs)}`)
      yield* Effect.sleep(Duration.millis(10))
    }

    yield* stage("streams subscribed")
    const rssBeforeTiming = rss.sample()
    const lastTimeUs = BigInt(ready.t0 + (ready.events - 1) * ready.stepUs)
    const lastDirect = ready.lastDirectTimeUs === null ? undefined : BigInt(ready.lastDirectTimeUs)
    const cursorOf = (s: Intake.IntakeStats, name: string) =>
      s.streams.find((x) => x.name === name)?.state.durableCursor
    const statsBefore = yield* intake.stats
    const batchesBefore = statsBefore.streams.reduce((n, x) => n + x.state.batches, 0)
    const loadAtStart = Os.loadavg()[0]?.toFixed(2) ?? "?"
    const cpuBefore = process.cpuUsage()
    const childCpuBefore = yield* child.cpuMs
    const pgCpuBefore = postgresCpu()
    const stopProfile = yield* startProfile()
    const stopMemLog = yield* startMemLog()
    rss.resetWindow()
    timing = true
    tracing = process.env["BENCH_TRACE"] === "1"
    const start = performance.now()
    let released = Math.min(window, ready.events)
    child.release(released)
    let lastProgressAt = start
    let backlinkDoneAt: number | undefined
    let directDoneAt: number | undefined = lastDirect === undefined ? start : undefined
    let backlinkCursor = -1n
    const committedOf = (
      cursor: bigint
    ) => (cursor < BigInt(ready.t0) ? 0 : Number(cursor - BigInt(ready.t0)) / ready.stepUs + 1)
    const releaseFor = (cursor: bigint) => {
      if (cursor <= backlinkCursor) return
      backlinkCursor = cursor
      lastProgressAt = performance.now()
      const next = Math.min(ready.events, Math.floor(committedOf(cursor)) + window)
      // in steps of at least an eighth of the queue (tiny batches must not mean one message each)
      if (next > released && (next - released >= window / 8 || next === ready.events)) {
        released = next
        child.release(released)
      }
      if (backlinkDoneAt === undefined && cursor >= lastTimeUs) backlinkDoneAt = performance.now()
    }
    onBacklinkCommit = releaseFor
    onDirectCommit = (cursor) => {
      if (directDoneAt === undefined && lastDirect !== undefined && cursor >= lastDirect) {
        directDoneAt = performance.now()
      }
    }
    // a watchdog: the durable cursors (in case a commit came without a cursor) and stalls
    for (;;) {
      const s = yield* intake.stats
      const bl = cursorOf(s, "backlink")
      const di = cursorOf(s, "direct")
      if (bl !== undefined) releaseFor(bl)
      if (di !== undefined) onDirectCommit(di)
      if (backlinkDoneAt !== undefined && directDoneAt !== undefined) break
      if (performance.now() - lastProgressAt > 60_000) {
        return yield* Effect.dieMessage(
          `no progress for 60 s: ${JSON.stringify(s, (_, v) => (typeof v === "bigint" ? v.toString() : v))}`
        )
      }
      yield* Effect.sleep(Duration.millis(10))
    }
    const endAt = Math.max(backlinkDoneAt, directDoneAt)
    const elapsedMs = endAt - start
    timing = false
    tracing = false
    if (stopProfile !== undefined) yield* Effect.promise(stopProfile)
    stopMemLog()
    yield* stage("after the timed part")
    const snapshotFile = process.env["BENCH_HEAPSNAPSHOT"]
    if (snapshotFile !== undefined && snapshotFile.length > 0 && process.versions["bun"] === undefined) {
      // Node: the live heap after the timed part (Chrome DevTools format)
      yield* Effect.sync(() => {
        fullGc()
        V8.writeHeapSnapshot(snapshotFile)
      })
    }
    const cpu = process.cpuUsage(cpuBefore)
    const childCpu = (yield* child.cpuMs) - childCpuBefore
    const pgCpu = postgresCpuSince(pgCpuBefore, yield* backend.serverPids)
    const windowRss = rss.windowPeak()
    const after = yield* intake.stats
    const batches = after.streams.reduce((n, x) => n + x.state.batches, 0) - batchesBefore
    const reconnects = after.streams.map((x) => `${x.name} ${x.state.reconnects}`).join(", ")

    const counts = yield* backend.counts
    const pairs = yield* Metric.snapshot
    const committedByStream = counterByTag(pairs, "firehook_intake_events_total", "stream")
    const outcomes = counterByTag(pairs, "firehook_events_processed_total", "outcome")
    const insertedMetric = Object.values(counterByTag(pairs, "firehook_outbox_rows_inserted_total", "-")).reduce(
      (a, b) => a + b,
      0
    )
    const outboxRows = counts?.outbox ?? insertedMetric

    const ms = timings.map((t) => t.ms)
    const byStream = (name: string) => timings.filter((t) => t.stream === name)
    const sec = elapsedMs / 1000
    const eventsPerSec = Math.round(ready.events / sec)
    const batchesPerSec = Math.round(batches / sec)
    const rowsPerSec = Math.round(outboxRows / sec)
    const p50 = percentile(ms, 50)
    const p99 = percentile(ms, 99)
    const max = ms.reduce((a, b) => Math.max(a, b), 0)
    const directMax = byStream("direct").reduce((a, t) => Math.max(a, t.ms), 0)
    const meanSize = timings.length === 0 ? 0 : timings.reduce((n, t) => n + t.events, 0) / timings.length
    const peak = rss.peak()
    const mem = process.memoryUsage()
    const cores = Os.cpus().length
    const c = ready.counts
    const pct = (n: number) => `${((100 * n) / ready.events).toFixed(1)}%`
    // the runtime and its memory settings (node flags; Bun's JSC options come from BUN_JSC_* variables)
    const runtimeFlags = [
      ...process.execArgv.filter((a) => !a.startsWith("--import") && a !== "tsx"),
      ...Object.entries(process.env).flatMap(([k, v]) => (k.startsWith("BUN_JSC_") ? [`${k}=${v ?? ""}`] : []))
    ]
    const loader = process.versions["bun"] === undefined && process.execArgv.includes("tsx") ? " (tsx)" : ""
    const runtime =
      (process.versions["bun"] === undefined ? `node ${process.version}${loader}` : `bun ${process.versions["bun"]}`) +
      (runtimeFlags.length === 0 ? "" : ` [${runtimeFlags.join(" ")}]`)
    const mode = noop ? " [BENCH_PROCESSOR=noop]" : ""

    console.log(
      `machine:        ${machine()}; 1-min load average ${loadAtStart} when timing started (other work on the machine skews the figures)`
    )
    console.log(`postgresql:     ${backend.version} (${backend.where})`)
    console.log(
      `webhooks:       ${regStats.active} active (${ready.owners} owners), ${regStats.directDids} wanted DIDs, ` +
        `${regStats.backlinkDids} backlink DIDs; seeded in ${backend.seedMs.toFixed(0)} ms, registry loaded in ${
          backend.loadMs.toFixed(0)
        } ms`
    )
    console.log(
      `workload:       ${ready.events} commit frames (${mib(ready.bytes)} MiB of JSON, generated in ${
        ready.generateMs.toFixed(0)
      } ms ` +
        `before timing): direct ${pct(c.direct)}, with references ${
          pct(c.withRefs)
        } (${c.refsToBacklinkScopes} to backlink scopes); ` +
        `create ${c.creates} / update ${c.updates} / delete ${c.deletes} (${c.deletesOfReferencingRecords} of referencing records)`
    )
    console.log(
      `feeding:        live, closed loop: frames released in order, ≤ ${window} ahead of the backlink stream's durable cursor ` +
        `(queue ${config.intake.queueMax}, batch ≤ ${config.intake.batchMax})`
    )
    console.log(
      `time:           ${sec.toFixed(2)} s until the backlink and direct durable cursors reached their last frames ` +
        `(the backlink stream's at ${
          backlinkDoneAt === undefined ? "-" : ((backlinkDoneAt - start) / 1000).toFixed(2)
        } s)`
    )
    console.log(
      `throughput:     ${eventsPerSec} events/s, ${batchesPerSec} batches/s ` +
        `(${byStream("backlink").length} backlink, ${byStream("direct").length} direct batches; mean ${
          meanSize.toFixed(1)
        } events/batch)`
    )
    console.log(
      `batch commit:   p50 ${p50.toFixed(2)} ms, p99 ${p99.toFixed(2)} ms, max ${
        max.toFixed(2)
      } ms; direct stream max ${directMax.toFixed(0)} ms ` +
        `(Processor.processEvents incl. its lock wait, ${ms.length} batches)`
    )
    console.log(
      counts === undefined
        ? `outbox:         ${outboxRows} rows (firehook_outbox_rows_inserted_total), ${rowsPerSec} rows/s`
        : `outbox:         ${outboxRows} rows (direct ${counts.direct}, backlink ${counts.backlink}), ${rowsPerSec} rows/s; ` +
          `${counts.bodies} event bodies, ${counts.prior} prior-ref rows, ${counts.quarantine} quarantined`
    )
    console.log(
      `committed:      ${Object.entries(committedByStream).map(([k, v]) => `${k} ${v}`).join(", ")} events ` +
        `(firehook_intake_events_total; backlink counts the direct-set frames it skips); outcomes ` +
        `${Object.entries(outcomes).map(([k, v]) => `${k} ${v}`).join(", ")}`
    )
    console.log(
      `cpu:            firehook ${((cpu.user + cpu.system) / 1000 / elapsedMs).toFixed(2)} cores ` +
        `(${((cpu.user + cpu.system) / ready.events).toFixed(1)} µs of CPU per event), ` +
        `jetstream child ${(childCpu / elapsedMs).toFixed(2)} cores` +
        (pgCpu === undefined
          ? ""
          : `, postgres (this database's backends + background) ${(pgCpu / elapsedMs).toFixed(2)} cores`) +
        ` (of ${cores})`
    )
    console.log(
      `memory:         rss peak ${mib(peak)} MiB (${mib(rssBeforeTiming)} MiB before timing, ${
        mib(windowRss)
      } MiB peak while timed), ` +
        `heap used now ${mib(mem.heapUsed)} of ${mib(mem.heapTotal)} MiB, external ${mib(mem.external)} MiB`
    )
    console.log(`reconnects:     ${reconnects}`)
    const met = (ok: boolean) => (ok ? "met" : "MISSED")
    console.log(
      `targets:        ≥ 20,000 events/s ${met(eventsPerSec >= 20_000)}; rss < 300 MiB ${met(peak < 300 * 1024 * 1024)}`
    )
    if (process.env["BENCH_DEBUG"] === "1") {
      const slow = timings.map((t, i) => ({ ...t, i })).sort((a, b) => b.ms - a.ms).slice(0, 8)
      console.log("slowest batches:", slow.map((t) => `#${t.i} ${t.stream}:${t.events}:${t.ms.toFixed(1)}ms`).join(" "))
    }
    if (spanTotals.size > 0) {
      console.log(`spans (BENCH_TRACE, ms summed over the timed ${elapsedMs.toFixed(0)} ms; nested spans overlap):`)
      for (const [k, v] of [...spanTotals.entries()].sort((a, b) => b[1].ms - a[1].ms)) {
        console.log(
          `  ${v.ms.toFixed(0).padStart(7)} ms ${String(v.n).padStart(7)}× ${
            (v.ms / v.n).toFixed(3).padStart(8)
          } ms  ${k}`
        )
      }
    }
    console.log(
      `intake: ${eventsPerSec} events/s${mode}, ${batchesPerSec} batches/s, p99 batch commit ${p99.toFixed(1)} ms, ` +
        `${rowsPerSec} outbox rows/s (${outboxRows} rows), peak rss ${mib(peak)} MiB, ${ready.events} events, ` +
        `${ready.webhooks} webhooks, PostgreSQL ${backend.version}, ${runtime}, ${cores} cores`
    )
  })

const bench = (events: number, refsShare: number) =>
  Effect.gen(function*() {
    yield* stage("modules loaded")
    const rss = startRssSampler(20)
    yield* Effect.addFinalizer(() => Effect.sync(() => rss.stop()))
    const t0 = Math.floor(Date.now() / 1000) * 1_000_000
    const child = yield* startChild({ events, webhooks: WEBHOOKS, seed: SEED, refsShare, t0 })
    // intake tuning may be varied from the environment (defaults: queue 512, batch 128)
    const tuning: Record<string, string> = {}
    for (const k of ["WEBHOOK_INTAKE_QUEUE_MAX", "WEBHOOK_INTAKE_BATCH_MAX"]) {
      const v = process.env[k]
      if (v !== undefined && v.length > 0) tuning[k] = v
    }
    const config = benchConfig({
      ...tuning,
      NODE_ENV: "test",
      WEBHOOK_ALLOW_INSECURE_DEV: "1",
      JETSTREAM_URL: child.ready.url
    })
    if (process.env["BENCH_STORES"] === "memory") {
      const backend = yield* memoryBackend(makeWebhooks(WEBHOOKS, SEED)).pipe(
        Effect.provideService(FirehookConfig, config)
      )
      return yield* measure(backend, child, config, rss)
    }
    const db = yield* benchDatabase
    return yield* Effect.gen(function*() {
      const backend = yield* sqlBackend(child, Redacted.value(db.url), db.where)
      return yield* measure(backend, child, config, rss)
    }).pipe(Effect.provide(Layer.merge(Database.layerUrl(db.url), Config.layerValue(config))))
  })

// ---------------------------------------------------------------------------------------------
// entry

if (process.argv[2] === "--jetstream-child") {
  const params = JSON.parse(process.argv[3] ?? "{}") as ChildParams
  void runChild(params)
} else {
  const events = Number(process.argv[2] ?? 200_000)
  const refsShare = Number(process.argv[3] ?? 0.05)
  if (!Number.isSafeInteger(events) || events < 1) throw new Error("usage: bench/intake.ts [events] [refs share]")
  Effect.runPromise(
    Effect.tracerWith((native) =>
      bench(events, refsShare).pipe(
        Effect.scoped,
        process.env["BENCH_TRACE"] === "1" ? Effect.withTracer(recordingTracer(native)) : (e) => e
      )
    ).pipe(Effect.provide(Logger.minimumLogLevel(LogLevel.Warning)))
  ).then(
    () => process.exit(0),
    (e: unknown) => {
      console.error(e)
      process.exit(1)
    }
  )
}
