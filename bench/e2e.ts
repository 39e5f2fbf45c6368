/**
 * End to end: a local Jetstream → firehook as `npm start` runs it → HTTP receivers, all on
 * loopback, each in its own process.
 *
 *   bun bench/e2e.ts [deliveries=40000] [webhooks=1000] [rate=500] [steadySeconds=20]
 *   npm run bench -- e2e            (this phase alone, through bench/run.ts)
 *
 * - Database: `DATABASE_URL` names a server on which a database `fh_bench_e2e_<pid>_<hex>` is created
 *   (dropped afterwards; at the start, the `fh_bench_*` databases of benchmarks whose process is gone
 *   are dropped: bench/lifecycle.ts); unset: an embedded PostgreSQL in a temporary directory.
 * - SIGINT / SIGTERM: firehook, the receivers, the Jetstream and the database (or the embedded
 *   server and its directory) are stopped and removed, then the bench exits 130 / 143; whatever
 *   way this process exits, a firehook it started that still runs is killed (SIGKILL).
 * - firehook: `bun src/main.ts` with the variables of `npm start` (start-env.ts), every
 *   role (`FIREHOOK_ROLES` unset), `NODE_ENV=test` + `WEBHOOK_ALLOW_INSECURE_DEV=1` (a ws:// Jetstream
 *   and http:// receivers on loopback), `DELIVERY_ALLOW_CIDRS=127.0.0.0/8`, `DELIVERY_CONCURRENCY` 64,
 *   per origin 64 / receivers. It migrates the fresh database itself.
 * - Jetstream: test/support/fakeJetstream.ts in this process (requireHello, cursor, filters).
 * - Receivers: bench/e2e-receivers.ts in a child process, 4 node:http servers answering 204.
 * - Webhooks: `webhooks` owners each create one `place.wisp.v2.wh` record through the stream (the
 *   registry stream, as owners do), `webhooks / 10` scope DIDs watched by 10 webhooks each, every one
 *   with an inline secret (every request signed); each event fans out to 10 deliveries.
 *
 * Phases:
 * 1. Throughput: `deliveries / 10` posts from the scope DIDs published at `BENCH_E2E_PUBLISH_RATE` events/s
 *    (default 1,000, i.e. 10,000 deliveries/s offered, above what delivery does on 2 cores);
 *    deliveries/s = distinct deliveries received / (last arrival − first publish). CPU per delivery:
 *    /proc utime + stime of the firehook process and its descendants (each with its reaped children's
 *    `cutime`), and of the PostgreSQL processes serving the bench database plus the server's
 *    background processes (pg_stat_activity, polled during the phase: a backend that ends counts
 *    with its last reading), over the same window (bench/proc-cpu.ts). PostgreSQL's CPU is
 *    measured only when those pids are this machine's postgres processes; a server in a container
 *    or on another host prints "PostgreSQL CPU not measured (server not local)" and no CPU total.
 * 2. Latency: `rate` deliveries/s offered for `steadySeconds` (one event every 1000 × 10 / rate ms:
 *    20 ms at 500/s; `BENCH_E2E_STEADY_TICK_MS` sets another tick, the events of a tick published together);
 *    enqueue → first attempt = `delivery_attempts.started_at − outbox.created_at` (attempt 1).
 * 3. The bare loops (bench/loops.ts) from this process to the same receivers, same concurrency and
 *    body size: the ratio is taken against the faster one.
 * Peak RSS: VmHWM of every firehook process (and of the receivers and this process, for reference).
 *
 * Phase 2 also prints each firehook process's share of a core and the bench database's transactions
 * (commits + rollbacks, `pg_stat_database`) per published event. `BENCH_E2E_IDLE_SECONDS=<n>`
 * measures the firehook processes' CPU for n seconds with the webhooks registered and no events,
 * before phase 1; `BENCH_E2E_LATENCY_DETAIL=1` prints phase 2's latency per second and the
 * outbox's autovacuum times.
 *
 * `DATABASE_PREPARED_STATEMENTS` is passed on to firehook when set (A/B runs of the prepared statements).
 * `BENCH_E2E_PROFILE=<dir>`: firehook runs with `bun --cpu-prof-md --cpu-prof-dir=<dir>` (a
 * markdown CPU profile of the whole run, written when it exits after SIGTERM).
 */
import { Effect, Exit, Fiber, Redacted, Scope } from "effect"
import { type ChildProcess, spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import * as EmbeddedPg from "../src/services/platform/EmbeddedPg.js"
import { commitFrame, startFakeJetstream } from "../test/support/fakeJetstream.js"
import { createBenchDatabase, signalExitCode } from "./lifecycle.js"
import { bareHttpLoop, fetchLoop } from "./loops.js"
import { postgresLocality, snapshot, spent, spentKeepingLast, tree } from "./proc-cpu.js"
import { startReceiverProcess } from "./receiver-process.js"
import { serviceEnv } from "./start-env.js"
import { percentile, plc } from "./support.js"

const WEBHOOKS = Number(process.argv[3] ?? 1_000)
const RATE = Number(process.argv[4] ?? 500)
const STEADY_SECONDS = Number(process.argv[5] ?? 20)
const PUBLISH_RATE = Number(process.env["BENCH_E2E_PUBLISH_RATE"] ?? 1_000)
const RECEIVERS = 4
const CONCURRENCY = 64
const FANOUT = 10
/**
 * Phase 2's pacing: one event (FANOUT deliveries) every `1000 × FANOUT / rate` ms, i.e. 20 ms at
 * 500/s, so the offered load is steady at the grain of one event. `BENCH_E2E_STEADY_TICK_MS=100`
 * is the pacing of the runs before 3 December 2026 (the events of 100 ms published together: at
 * 500/s, 50 deliveries at once every 100 ms).
 */
const STEADY_TICK_MS = Number(process.env["BENCH_E2E_STEADY_TICK_MS"] ?? (1000 * FANOUT) / RATE)
const EVENTS = Math.max(1, Math.ceil(Number(process.argv[2] ?? 40_000) / FANOUT))
const WH = "place.wisp.v2.wh"
const ROOT = Path.resolve(import.meta.dirname, "..")
const BUN = Path.join(ROOT, "node_modules", ".bin", "bun")

/**
 * `BENCH_E2E_LATENCY_DETAIL=1`: phase 2's enqueue → first attempt per second of the phase (p50,
 * p99, max, rows), and the outbox's autovacuum/autoanalyze times, to tell a tail spread over the
 * phase from one gathered in a few seconds.
 */
const latencyDetail = async (
  q: <T extends pg.QueryResultRow>(text: string, params?: Array<unknown>) => Promise<Array<T>>,
  since: Date
) => {
  const rows = await q<{ s: number; ms: number }>(
    `SELECT floor(extract(epoch FROM o.created_at - $1::timestamptz))::int AS s,
            (extract(epoch FROM a.started_at - o.created_at) * 1000)::float8 AS ms
     FROM outbox o JOIN delivery_attempts a ON a.delivery_id = o.delivery_id AND a.attempt = 1
     WHERE o.created_at >= $1`,
    [since]
  )
  const bySecond = new Map<number, Array<number>>()
  for (const r of rows) bySecond.set(Number(r.s), [...(bySecond.get(Number(r.s)) ?? []), Number(r.ms)])
  for (const [s, v] of [...bySecond].sort((a, b) => a[0] - b[0])) {
    say(
      `  second ${s}: ${v.length} rows, p50 ${percentile(v, 50).toFixed(1)} p99 ${percentile(v, 99).toFixed(1)} max ${
        Math.max(...v).toFixed(1)
      } ms`
    )
  }
  const vac = await q<{ v: Date | null; a: Date | null; n: string }>(
    `SELECT last_autovacuum AS v, last_autoanalyze AS a, autovacuum_count::text AS n
     FROM pg_stat_user_tables WHERE relname = 'outbox'`
  )
  say(
    `  outbox autovacuum: last ${vac[0]?.v?.toISOString() ?? "never"} (count ${vac[0]?.n ?? "?"}), autoanalyze ${
      vac[0]?.a?.toISOString() ?? "never"
    }; phase 2 started ${since.toISOString()}`
  )
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
const mib = (kib: number) => (kib / 1024).toFixed(0)
const say = (s: string) => process.stdout.write(s + "\n")

/** Poll `cond` every `every` ms until it holds; throw after `ms`. */
const until = async (cond: () => Promise<boolean> | boolean, ms: number, what: string, every = 100) => {
  const end = Date.now() + ms
  for (let i = 0; i < 1_000_000 && Date.now() < end; i++) {
    if (await cond()) return
    await sleep(every)
  }
  throw new Error(`timed out: ${what}`)
}

// ---------------------------------------------------------------------------------------------
// /proc

const vmHwmKib = (pid: number): number => {
  try {
    const m = /VmHWM:\s+(\d+) kB/.exec(Fs.readFileSync(`/proc/${pid}/status`, "utf8"))
    return Number(m?.[1] ?? 0)
  } catch {
    return 0
  }
}

const processName = (pid: number): string => {
  try {
    return Fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").filter((s) => s.length > 0).map((s) =>
      Path.basename(s)
    ).slice(0, 3).join(" ")
  } catch {
    return "?"
  }
}

// ---------------------------------------------------------------------------------------------
// processes

const freePort = () => Effect.runPromise(EmbeddedPg.freePort)

interface Service {
  readonly child: ChildProcess
  readonly health: string
  readonly stderr: () => string
}

const startService = async (env: Record<string, string>, dataDir: string): Promise<Service> => {
  const port = await freePort()
  const profileDir = process.env["BENCH_E2E_PROFILE"]
  const prepared = process.env["DATABASE_PREPARED_STATEMENTS"]
  const flags = profileDir === undefined ? [] : ["--cpu-prof-md", `--cpu-prof-dir=${profileDir}`]
  const child = spawn(BUN, [...flags, "src/main.ts"], {
    cwd: ROOT,
    env: {
      ...serviceEnv(),
      HEALTH_PORT: String(port),
      API_PORT: "0",
      FIREHOOK_DATA_DIR: dataDir,
      ...(prepared === undefined ? {} : { DATABASE_PREPARED_STATEMENTS: prepared }),
      ...env
    },
    stdio: ["ignore", "ignore", "pipe"]
  })
  children.push(child)
  let err = ""
  child.stderr?.on("data", (d: Buffer) => (err = (err + d.toString("utf8")).slice(-20_000)))
  return { child, health: `http://127.0.0.1:${port}/health`, stderr: () => err }
}

const stopService = (s: Service) =>
  new Promise<number | null>((resolve) => {
    if (s.child.exitCode !== null) return resolve(s.child.exitCode)
    const timer = setTimeout(() => s.child.kill("SIGKILL"), 20_000)
    s.child.once("exit", (code) => {
      clearTimeout(timer)
      resolve(code)
    })
    s.child.kill("SIGTERM")
  })

// ---------------------------------------------------------------------------------------------
// database

/**
 * The bench database: a fresh one on `DATABASE_URL`'s server, else an embedded server in a
 * temporary directory. Its removal is registered before it is created (a signal during the
 * creation still removes it).
 */
const database = async (): Promise<{ url: string }> => {
  const external = process.env["DATABASE_URL"]
  if (external !== undefined && external.length > 0) {
    const db = await createBenchDatabase(external, "e2e", (drop) => register(drop))
    return { url: db.url }
  }
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-bench-e2e-"))
  register(async () => Fs.rmSync(dir, { recursive: true, force: true }))
  Fs.chmodSync(dir, 0o755)
  const scope = Effect.runSync(Scope.make())
  register(() => Effect.runPromise(Scope.close(scope, Exit.void)))
  const starting = Effect.runFork(
    EmbeddedPg.start({ dataDir: dir, database: "firehook_bench" }).pipe(Scope.extend(scope))
  )
  register(() => Effect.runPromise(Fiber.interrupt(starting)))
  const embedded = await Effect.runPromise(Fiber.join(starting))
  return { url: Redacted.value(embedded.url) }
}

// ---------------------------------------------------------------------------------------------
// stopping: the end of the run, an error, SIGINT / SIGTERM

const cleanups: Array<() => Promise<unknown>> = []
let cleaning: Promise<void> | undefined
/** Run the cleanups, the last registered first, once (a second call waits for the first run). */
const cleanup = (): Promise<void> =>
  cleaning ??= (async () => {
    for (let c = cleanups.pop(); c !== undefined; c = cleanups.pop()) await c().catch(() => undefined)
  })()
/** Register a cleanup; once the cleanup ran (a signal came), it runs at once. */
const register = (c: () => Promise<unknown>) => {
  if (cleaning === undefined) cleanups.push(c)
  else void c().catch(() => undefined)
}

/** firehook and the receivers, killed when this process exits whatever way (a synchronous handler) */
const children: Array<ChildProcess> = []
process.on("exit", () => {
  for (const child of children) {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL")
  }
})

let stopSignal: NodeJS.Signals | undefined
const onSignal = (signal: NodeJS.Signals) => () => {
  // a repeated signal (a second Ctrl-C) changes nothing; a cleanup that hangs is cut after 2 minutes
  if (stopSignal !== undefined) return
  stopSignal = signal
  const code = signalExitCode(signal) ?? 1
  process.stderr.write(`e2e bench: ${signal}, stopping firehook and removing the bench database\n`)
  setTimeout(() => process.exit(code), 120_000).unref()
  void cleanup().finally(() => process.exit(code))
}
process.on("SIGINT", onSignal("SIGINT"))
process.on("SIGTERM", onSignal("SIGTERM"))

// ---------------------------------------------------------------------------------------------
// the run

const scopeDid = (j: number) => plc(1_000_000 + j)
const scopes = Math.max(1, Math.floor(WEBHOOKS / FANOUT))
let timeUs = Date.now() * 1000
let seq = 0
const post = () => {
  const n = seq++
  timeUs += 1
  return commitFrame(scopeDid(n % scopes), timeUs, "app.bsky.feed.post", `p${n}`, "create", {
    $type: "app.bsky.feed.post",
    text: `benchmark post number ${n} with a little text so the body looks like a real one`,
    createdAt: "2026-01-01T00:00:00Z"
  })
}

type Query = <T extends pg.QueryResultRow>(text: string, params?: Array<unknown>) => Promise<Array<T>>

/** `BENCH_E2E_IDLE_SECONDS=<n>`: firehook's CPU over n seconds with the webhooks registered and no events. */
const idleCpu = async (root: number) => {
  const idleSeconds = Number(process.env["BENCH_E2E_IDLE_SECONDS"] ?? 0)
  if (idleSeconds <= 0) return
  const idle0 = snapshot(tree(root), true)
  await sleep(idleSeconds * 1000)
  const idle1 = snapshot(tree(root), true)
  const each = [...idle1.keys()].map((pid) =>
    `${pid === root ? "root" : "child"} ${
      ((((idle1.get(pid) ?? 0) - (idle0.get(pid) ?? 0)) / 1000 / idleSeconds) * 100).toFixed(1)
    }%`
  )
  say(
    `idle: firehook ${
      ((spent(idle0, idle1) / 1000 / idleSeconds) * 100).toFixed(1)
    }% of a core over ${idleSeconds} s with no events (${each.join(", ")})`
  )
}

/**
 * Phase 1's PostgreSQL CPU: the processes serving the bench database and the server's background
 * processes, read now and on every `poll` (their list every 10th poll): a backend that ends keeps
 * its last reading, one that starts during the phase counts from 0. `end`: the CPU spent, or
 * not local (the pids are not this machine's postgres processes: not measured).
 */
const postgresCpu = async (q: Query) => {
  const pgPids = async () =>
    (await q<{ pid: number }>(
      `SELECT pid FROM pg_stat_activity
       WHERE (datname = current_database() AND pid <> pg_backend_pid()) OR backend_type <> 'client backend'`
    )).map((r) => Number(r.pid))
  const known = new Set(await pgPids())
  const start = snapshot(known)
  const last = new Map<number, number>()
  let polls = 0
  const poll = async () => {
    if (polls++ % 10 === 9) { for (const pid of await pgPids()) known.add(pid) }
    for (const [pid, ms] of snapshot(known)) last.set(pid, ms)
  }
  const end = async (): Promise<{ local: boolean; ms: number }> => {
    for (const pid of await pgPids()) known.add(pid)
    await poll()
    const local = postgresLocality([...known]) === "local"
    return { local, ms: local ? spentKeepingLast(start, [last]) : Number.NaN }
  }
  return { poll, end }
}

const main = async () => {
  try {
    const db = await database()
    const client = new pg.Client({ connectionString: db.url, connectionTimeoutMillis: 10_000 })
    register(() => client.end())
    await client.connect()
    const q = async <T extends pg.QueryResultRow>(text: string, params: Array<unknown> = []) =>
      (await client.query<T>(text, params)).rows
    const rx = await startReceiverProcess(RECEIVERS)
    children.push(rx.child)
    register(async () => rx.stop())
    const js = await startFakeJetstream()
    register(() => js.close())
    const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-bench-e2e-data-"))
    register(async () => Fs.rmSync(dataDir, { recursive: true, force: true }))
    const service = await startService({
      DATABASE_URL: db.url,
      NODE_ENV: "test",
      WEBHOOK_ALLOW_INSECURE_DEV: "1",
      JETSTREAM_URL: js.url,
      DELIVERY_ALLOW_CIDRS: "127.0.0.0/8",
      DELIVERY_CONCURRENCY: String(CONCURRENCY),
      DELIVERY_PER_ORIGIN_CONCURRENCY: String(Math.ceil(CONCURRENCY / RECEIVERS)),
      // owners' DIDs are not resolvable here: reconciliation fails fast on a closed port
      PLC_DIRECTORY_URL: `http://127.0.0.1:${await freePort()}`
    }, dataDir)
    register(async () => {
      const code = await stopService(service)
      if (code !== 0) say(`firehook exited with ${code}; stderr tail: ${service.stderr().slice(-2000)}`)
    })
    const root = service.child.pid ?? 0
    await until(
      async () => {
        if (service.child.exitCode !== null) throw new Error(`firehook exited: ${service.stderr().slice(-2000)}`)
        const r = await fetch(service.health, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined)
        return r?.status === 200
      },
      300_000,
      "firehook ready",
      250
    )
    say(
      `e2e bench: ${
        EVENTS * FANOUT
      } deliveries (phase 1), ${WEBHOOKS} webhooks, ${RECEIVERS} receivers, concurrency ${CONCURRENCY}, ${
        process.versions["bun"] === undefined ? `node ${process.version}` : `bun ${process.versions["bun"]}`
      } (firehook: bun src/main.ts), ${Os.cpus().length} CPUs, load average ${Os.loadavg()[0]?.toFixed(1)} at start`
    )

    // webhooks through the registry stream
    const registrations = Array.from({ length: WEBHOOKS }, (_, i) => {
      timeUs += 1
      return commitFrame(plc(10_000 + i), timeUs, WH, "w", "create", {
        $type: WH,
        scope: { aturi: `at://${scopeDid(i % scopes)}` },
        url: `http://127.0.0.1:${rx.ports[i % rx.ports.length]}/h/${i}`,
        secret: `bench-secret-${i}-0123456789abcdef`,
        createdAt: "2026-01-01T00:00:00Z"
      })
    })
    for (let i = 0; i < registrations.length; i += 200) {
      js.publish(registrations.slice(i, i + 200))
      await sleep(50)
    }
    const wanted = Array.from({ length: scopes }, (_, j) => scopeDid(j))
    await until(
      async () => {
        const n = Number((await q<{ n: string }>(`SELECT count(*)::text AS n FROM webhooks WHERE active`))[0]?.n)
        const subscribed = js.connections.some((c) => {
          const dids = c.options.at(-1)?.["wantedDids"]
          return c.socket.readyState === 1 && Array.isArray(dids) && wanted.every((d) => dids.includes(d))
        })
        return n === WEBHOOKS && subscribed
      },
      300_000,
      "webhooks registered and the direct stream subscribed",
      250
    )
    // warm up: one event per scope
    for (let j = 0; j < scopes; j++) js.publish([post()])
    await until(async () => (await rx.stats()).distinct >= scopes * FANOUT, 60_000, "warm-up delivered")
    await rx.reset()
    await idleCpu(root)

    // 1. throughput
    const fhPids0 = tree(root)
    const fhCpu0 = snapshot(fhPids0, true)
    const pgCpu = await postgresCpu(q)
    const pollPg = pgCpu.poll
    const target = EVENTS * FANOUT
    const t0 = Date.now()
    const perTick = Math.max(1, Math.round(PUBLISH_RATE / 20))
    for (let published = 0, k = 0; published < EVENTS; k++) {
      const wait = t0 + k * 50 - Date.now()
      if (wait > 0) await sleep(wait)
      const n = Math.min(perTick, EVENTS - published)
      js.publish(Array.from({ length: n }, post))
      published += n
      await pollPg()
    }
    const publishedMs = Date.now() - t0
    let last = { requests: 0, distinct: 0, first: 0, last: 0 }
    await until(
      async () => {
        await pollPg()
        return (last = await rx.stats()).distinct >= target
      },
      600_000,
      "phase 1 delivered"
    )
    const fhPids1 = tree(root)
    const fhCpu1 = snapshot([...new Set([...fhPids0, ...fhPids1])], true)
    const { local: pgLocal, ms: pgMs } = await pgCpu.end()
    if (!pgLocal) say("PostgreSQL CPU not measured (server not local)")
    const seconds = (last.last - t0) / 1000
    const rate = target / seconds
    const fhMs = spent(fhCpu0, fhCpu1)
    // the split between firehook's processes: the root (intake, api, … and, inline, delivery) and
    // each process below it (the delivery child by default on 2+ cores)
    const perProcess = [...fhCpu1.keys()].map((pid) => {
      const ms = (fhCpu1.get(pid) ?? 0) - (fhCpu0.get(pid) ?? 0)
      return `${pid === root ? "root" : `child ${pid}`} ${(ms / target).toFixed(3)} ms`
    })
    say(
      `phase 1: ${target} deliveries (${last.requests} requests) in ${seconds.toFixed(1)} s from the first publish = ${
        rate.toFixed(0)
      } deliveries/s end to end (${EVENTS} events published in ${
        (publishedMs / 1000).toFixed(1)
      } s); CPU: firehook ${fhPids1.length} process(es) ${((fhMs / 1000 / seconds) * 100).toFixed(0)}% (${
        (fhMs / target).toFixed(3)
      } ms/delivery), PostgreSQL ${
        pgLocal
          ? `${((pgMs / 1000 / seconds) * 100).toFixed(0)}% (${(pgMs / target).toFixed(3)} ms/delivery)`
          : "not measured (server not local)"
      }; per firehook process: ${perProcess.join(", ")}`
    )

    // 2. steady offered load
    await rx.reset()
    const steadyStart = (await q<{ now: Date }>(`SELECT now() AS now`))[0]?.now ?? new Date(0)
    const eventsPerTick = Math.max(1, Math.round((RATE / FANOUT) * (STEADY_TICK_MS / 1000)))
    const ticks = Math.max(1, Math.round((STEADY_SECONDS * 1000) / STEADY_TICK_MS))
    const xacts = async () =>
      Number(
        (await q<{ n: string }>(
          `SELECT (xact_commit + xact_rollback)::text AS n FROM pg_stat_database WHERE datname = current_database()`
        ))[0]?.n ?? 0
      )
    const xact0 = await xacts()
    const fhCpu2 = snapshot(tree(root), true)
    const s0 = Date.now()
    for (let k = 0; k < ticks; k++) {
      const wait = s0 + k * STEADY_TICK_MS - Date.now()
      if (wait > 0) await sleep(wait)
      js.publish(Array.from({ length: eventsPerTick }, post))
    }
    const offered = ticks * eventsPerTick * FANOUT
    const steadySeconds = (Date.now() - s0) / 1000
    await until(async () => (await rx.stats()).distinct >= offered, 300_000, "phase 2 delivered")
    const fhCpu2End = snapshot(tree(root), true)
    await sleep(600) // pg_stat_database is updated by the backends at most every 500 ms
    const xactPerEvent = (await xacts() - xact0) / (ticks * eventsPerTick)
    const fhSteadyMs = spent(fhCpu2, fhCpu2End)
    const steadyPerProcess = [...fhCpu2End.keys()].map((pid) =>
      `${pid === root ? "root" : "child"} ${
        ((((fhCpu2End.get(pid) ?? 0) - (fhCpu2.get(pid) ?? 0)) / 1000 / steadySeconds) * 100).toFixed(0)
      }%`
    )
    let lat: Array<number> = []
    await until(
      async () => {
        lat = (await q<{ ms: number }>(
          `SELECT (extract(epoch FROM a.started_at - o.created_at) * 1000)::float8 AS ms
           FROM outbox o JOIN delivery_attempts a ON a.delivery_id = o.delivery_id AND a.attempt = 1
           WHERE o.created_at >= $1`,
          [steadyStart]
        )).map((r) => Number(r.ms))
        return lat.length >= offered
      },
      60_000,
      "phase 2 attempts recorded",
      250
    )
    const p50 = percentile(lat, 50)
    const p99 = percentile(lat, 99)
    if (process.env["BENCH_E2E_LATENCY_DETAIL"] === "1") await latencyDetail(q, steadyStart)
    say(
      `phase 2: ${offered} deliveries offered at ${
        (offered / steadySeconds).toFixed(0)
      }/s (target ${RATE}/s): enqueue → first attempt p50 ${p50.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms, max ${
        Math.max(...lat).toFixed(1)
      } ms; firehook CPU ${((fhSteadyMs / 1000 / steadySeconds) * 100).toFixed(0)}% of a core (${
        steadyPerProcess.join(", ")
      }); ${xactPerEvent.toFixed(1)} database transactions per event (${FANOUT} deliveries)`
    )

    // peak RSS (before the bare loops, which run in this process)
    const rss = tree(root).map((pid) => `${processName(pid)} [${pid}] ${mib(vmHwmKib(pid))} MiB`)
    const fhPeak = Math.max(...tree(root).map(vmHwmKib))

    // 3. bare loops to the same receivers
    const body = await q<{ n: number }>(`SELECT avg(octet_length(body))::int AS n FROM delivery_events`)
    const bodyBytes = Number(body[0]?.n ?? 300)
    const loop = {
      ports: rx.ports,
      requests: Math.min(target, 20_000),
      bodyBytes,
      concurrency: CONCURRENCY,
      paths: WEBHOOKS
    }
    const bareHttp = await bareHttpLoop(loop)
    const bareFetch = await fetchLoop(loop)
    const bare = Math.max(bareHttp.rate, bareFetch.rate)
    say(
      `phase 3: bare loops from this process, concurrency ${CONCURRENCY}, ${bodyBytes}-byte bodies: node:http ${
        bareHttp.rate.toFixed(0)
      } requests/s (${bareHttp.cpuMs.toFixed(3)} ms CPU per request, client only), fetch ${
        bareFetch.rate.toFixed(0)
      } requests/s (${bareFetch.cpuMs.toFixed(3)} ms); end to end / bare = ${(rate / bare).toFixed(3)}`
    )
    say(
      `peak RSS (VmHWM): firehook ${rss.join(", ")}; receivers ${mib(vmHwmKib(rx.child.pid ?? 0))} MiB; bench ${
        mib(vmHwmKib(process.pid))
      } MiB; load average ${Os.loadavg()[0]?.toFixed(1)} at end`
    )
    say(
      `e2e: deliveries/s ${rate.toFixed(0)} | bare ${bare.toFixed(0)}/s | ratio ${
        (rate / bare).toFixed(3)
      } | cpu firehook ${(fhMs / target).toFixed(3)} ms + ${
        pgLocal
          ? `postgres ${(pgMs / target).toFixed(3)} ms = ${((fhMs + pgMs) / target).toFixed(3)} ms/delivery`
          : "postgres not measured (server not local)"
      } | p50 ${p50.toFixed(1)} ms | p99 ${p99.toFixed(1)} ms at ${RATE}/s | peak rss ${mib(fhPeak)} MiB (${
        tree(root).length
      } firehook process(es))`
    )
  } finally {
    await cleanup()
  }
}

main().then(
  () => {
    // after a signal, its handler exits once the cleanup ended
    if (stopSignal === undefined) process.exit(0)
  },
  (e: unknown) => {
    if (stopSignal !== undefined) return
    process.stderr.write(`bench failed: ${e instanceof Error ? e.message : String(e)}\n`)
    process.exit(1)
  }
)
