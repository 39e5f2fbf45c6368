/**
 * Soak: firehook as `npm start` runs it (`bun src/main.ts`, the delivery child on 2+ cores) under
 * churn for a while, sampled at a fixed interval, to see whether anything grows with time rather
 * than with load: memory, file descriptors, fibers, PostgreSQL connections, table rows, metric series.
 *
 *   bun bench/soak.ts [churnSeconds=600] [quietSeconds=120]
 *
 * Everything runs on 127.0.0.1 except the receivers (0.0.0.0, so that every `127.a.b.c` address
 * reaches them and each webhook can have an origin of its own):
 * - a database `fh_soak_<random>` on `DATABASE_URL` (default postgresql://postgres@127.0.0.1:5432/postgres),
 *   dropped at the end (`SOAK_KEEP_DB=1` keeps it);
 * - a fake Jetstream (test/support/fakeJetstream.ts), a fake PLC directory serving each owner's DID
 *   document with its `#atproto` key, a fake PDS serving the owners' current records;
 * - receivers whose answer depends on the URL: 204, 500, 429, half 500, no answer within the 2 s
 *   delivery timeout, a closed socket, 410, a 200 KiB body, and a port with nothing listening.
 * The churn: 120 owners create, update and delete webhook records (3 per second, each with a new
 * origin, 5 % invalid); posts from 40 scope DIDs (`EVENTS_PER_S`, default 5; a third are replies,
 * for backlink webhooks); owners' live tails opened and closed or dropped (`TAIL_EVERY_MS`, 4 s),
 * owners' API calls (`API_EVERY_MS`, 3 s), calls with a bad token from distinct loopback addresses
 * (`AUTHFAIL_EVERY_MS`, off). `OWNER_CHURN=1`: also a new owner watching a new DID every second
 * while an old one deletes its hooks (the direct stream's DID set changes every second).
 * Maintenance: every minute the terminal rows older than 90 s are aged by 40 days (outbox,
 * attempts, bodies, audit, tombstones, quarantine, refused records) and maintenance runs every
 * 10 s, so the pruning rules act within the run (`SOAK_AGE=0` turns the ageing off).
 *
 * Every `SAMPLE_MS` (30 s) one line: RSS and open FDs of the parent and the delivery child, their
 * `effect_fiber_active`, `firehook_delivery_open_circuits`, the database's connections and their
 * private memory, the row counts; every sample as JSON to `SOAK_OUT` (default
 * /tmp/firehook-soak.jsonl); at the end the first churn sample against the last one.
 * Keep the rates modest on a shared machine: the defaults deliver about 30–60 requests/s.
 */
import { type PrivateKey, Secp256k1PrivateKeyExportable } from "@atcute/crypto"
import type { Did, Nsid } from "@atcute/lexicons"
import { createServiceJwt } from "@atcute/xrpc-server/auth"
import { type ChildProcess, spawn } from "node:child_process"
import { randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Http from "node:http"
import type * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import WebSocket from "ws"
import { commitFrame, type LogEntry, startFakeJetstream, tidAt } from "../test/support/fakeJetstream.js"
import { serviceEnv } from "./start-env.js"

const ROOT = Path.resolve(import.meta.dirname, "..")
const BUN = Path.join(ROOT, "node_modules", ".bin", "bun")
const CHURN_S = Number(process.argv[2] ?? 600)
const QUIET_S = Number(process.argv[3] ?? 120)
const num = (name: string, def: number) => Number(process.env[name] ?? def)
const SAMPLE_MS = num("SAMPLE_MS", 30_000)
const EVENTS_PER_S = num("EVENTS_PER_S", 5)
const OUT = process.env["SOAK_OUT"] ?? Path.join(Os.tmpdir(), "firehook-soak.jsonl")
const ADMIN_URL = process.env["DATABASE_URL"] ?? "postgresql://postgres@127.0.0.1:5432/postgres"
const WH = "place.wisp.v2.wh"
const SERVICE_DID = "did:web:firehook.test"

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))
const say = (s: string) => process.stdout.write(`[${new Date().toISOString().slice(11, 19)}] ${s}\n`)
const rnd = (n: number) => Math.floor(Math.random() * n)
const pick = <A>(xs: ReadonlyArray<A>): A => xs[rnd(xs.length)] as A
const B32 = "abcdefghijklmnopqrstuvwxyz234567"
const newDid = () => "did:plc:" + Array.from(randomBytes(24), (b) => B32[b % 32]).join("")
const listen = (server: Http.Server, host = "127.0.0.1") =>
  new Promise<number>((resolve) => server.listen(0, host, () => resolve((server.address() as Net.AddressInfo).port)))
const freePort = async () => {
  const s = Http.createServer()
  const port = await listen(s)
  await new Promise((r) => s.close(r))
  return port
}
const json = (res: Http.ServerResponse, status: number, v: unknown) => {
  const body = Buffer.from(JSON.stringify(v))
  res.writeHead(status, { "content-type": "application/json", "content-length": body.length })
  res.end(body)
}

// ---------------------------------------------------------------------------------------------
// receivers: the path's first segment says how to answer

let received = 0
const receiver = () => {
  const s = Http.createServer((req, res) => {
    req.resume()
    req.on("end", () => {
      received++
      const mode = (req.url ?? "/").split("/")[1] ?? "ok"
      const answer = (status: number, body?: string | Buffer) => {
        res.writeHead(status)
        res.end(body)
      }
      if (mode === "flaky") return Math.random() < 0.5 ? answer(500, "oops") : answer(200, "ok")
      if (mode === "e500") return answer(500, "down")
      if (mode === "e429") return answer(429)
      if (mode === "close") return req.socket.destroy()
      if (mode === "gone") return answer(410)
      if (mode === "big") return answer(200, Buffer.alloc(200_000, 120))
      // answers after the delivery timeout (2 s)
      if (mode === "slow") return void setTimeout(() => !res.destroyed && answer(204), 4_000)
      return answer(204)
    })
  })
  s.keepAliveTimeout = 5_000
  return s
}
const MODES = ["ok", "ok", "ok", "ok", "flaky", "e500", "e429", "slow", "close", "gone", "big", "refused"]

// ---------------------------------------------------------------------------------------------
// owners, their DID documents and repos

interface Owner {
  readonly did: string
  readonly key: PrivateKey
  readonly multikey: string
  readonly hooks: Map<string, unknown>
  rev: string | undefined
}
const owners: Array<Owner> = []
const byDid = new Map<string, Owner>()
const newOwner = async (): Promise<Owner> => {
  const key = await Secp256k1PrivateKeyExportable.createKeypair()
  const o: Owner = {
    did: newDid(),
    key,
    multikey: await key.exportPublicKey("multikey"),
    hooks: new Map(),
    rev: undefined
  }
  owners.push(o)
  byDid.set(o.did, o)
  return o
}
const scopeDids = Array.from({ length: 40 }, newDid)

let pdsUrl = ""
const plc = Http.createServer((req, res) => {
  req.resume()
  const did = decodeURIComponent((req.url ?? "/").slice(1))
  const o = byDid.get(did)
  if (o === undefined) return json(res, 404, { message: "DID not registered" })
  json(res, 200, {
    "@context": ["https://www.w3.org/ns/did/v1", "https://w3id.org/security/multikey/v1"],
    id: did,
    alsoKnownAs: ["at://someone.test"],
    verificationMethod: [{ id: `${did}#atproto`, type: "Multikey", controller: did, publicKeyMultibase: o.multikey }],
    service: [{ id: "#atproto_pds", type: "AtprotoPersonalDataServer", serviceEndpoint: pdsUrl }]
  })
})
const pds = Http.createServer((req, res) => {
  req.resume()
  const u = new URL(req.url ?? "/", "http://x")
  const did = u.searchParams.get("did") ?? u.searchParams.get("repo") ?? ""
  const o = byDid.get(did)
  if (o === undefined) return json(res, 400, { error: "InvalidRequest", message: `Could not find repo: ${did}` })
  if (u.pathname === "/xrpc/com.atproto.sync.getLatestCommit") {
    return json(res, 200, { cid: "bafycommit", rev: o.rev ?? tidAt(1_000_000) })
  }
  if (u.pathname !== "/xrpc/com.atproto.repo.listRecords") return json(res, 404, { error: "MethodNotImplemented" })
  const limit = Number(u.searchParams.get("limit") ?? "50")
  const cursor = u.searchParams.get("cursor")
  const page = [...o.hooks.entries()]
    .sort((a, b) => (a[0] < b[0] ? 1 : a[0] > b[0] ? -1 : 0))
    .filter(([k]) => cursor === null || k < cursor)
    .slice(0, limit)
  const last = page[page.length - 1]
  json(res, 200, {
    records: page.map(([rkey, value]) => ({ uri: `at://${did}/${WH}/${rkey}`, cid: `bafy${rkey}`, value })),
    ...(last === undefined ? {} : { cursor: last[0] })
  })
})

// ---------------------------------------------------------------------------------------------
// /proc and the service's own figures

const statusKib = (pid: number, field: string): number => {
  try {
    return Number(new RegExp(`${field}:\\s+(\\d+)`).exec(Fs.readFileSync(`/proc/${pid}/status`, "utf8"))?.[1] ?? -1)
  } catch {
    return -1
  }
}
const openFds = (pid: number): number => {
  try {
    return Fs.readdirSync(`/proc/${pid}/fd`).length
  } catch {
    return -1
  }
}
const privateKib = (pid: number): number => {
  try {
    return Number(/Private_Dirty:\s+(\d+)/.exec(Fs.readFileSync(`/proc/${pid}/smaps_rollup`, "utf8"))?.[1] ?? 0)
  } catch {
    return 0
  }
}
const childOf = (pid: number): number | undefined => {
  for (const name of Fs.readdirSync("/proc")) {
    if (!/^\d+$/.test(name)) continue
    try {
      const s = Fs.readFileSync(`/proc/${name}/stat`, "utf8")
      if (Number(s.slice(s.lastIndexOf(")") + 2).split(" ")[1]) === pid) return Number(name)
    } catch {
      // gone meanwhile
    }
  }
  return undefined
}
const SERIES =
  /^(effect_fiber_active|firehook_process_resident_memory_bytes|firehook_delivery_in_flight|firehook_delivery_open_circuits)\b/

// ---------------------------------------------------------------------------------------------
// the run

const main = async () => {
  const cleanups: Array<() => Promise<unknown>> = []
  try {
    const rxServers = Array.from({ length: 6 }, receiver)
    const rxPorts = await Promise.all(rxServers.map((s) => listen(s, "0.0.0.0")))
    const close = (servers: ReadonlyArray<Http.Server>) =>
      servers.forEach((s) => {
        s.closeAllConnections()
        s.close()
      })
    cleanups.push(async () => close(rxServers))
    const deadPort = await freePort()
    const plcPort = await listen(plc)
    pdsUrl = `http://127.0.0.1:${await listen(pds)}`
    cleanups.push(async () => close([plc, pds]))
    for (let i = 0; i < 120; i++) await newOwner()

    const admin = new pg.Client({ connectionString: ADMIN_URL, connectionTimeoutMillis: 10_000 })
    await admin.connect()
    cleanups.push(() => admin.end())
    const dbName = `fh_soak_${randomBytes(4).toString("hex")}`
    await admin.query(`CREATE DATABASE ${dbName}`)
    if (process.env["SOAK_KEEP_DB"] !== "1") {
      cleanups.push(() => admin.query(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`))
    }
    const dbUrl = new URL(ADMIN_URL)
    dbUrl.pathname = `/${dbName}`
    const db = new pg.Client({ connectionString: dbUrl.toString(), connectionTimeoutMillis: 10_000 })
    await db.connect()
    cleanups.push(() => db.end())
    const rows = async <T extends pg.QueryResultRow>(c: pg.Client, text: string) => (await c.query<T>(text)).rows

    const js = await startFakeJetstream()
    cleanups.push(() => js.close())
    const healthPort = await freePort()
    const apiPort = await freePort()
    const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-soak-"))
    cleanups.push(async () => Fs.rmSync(dataDir, { recursive: true, force: true }))
    const logPath = Path.join(dataDir, "firehook.log")
    const log = Fs.openSync(logPath, "w")
    const fh: ChildProcess = spawn(BUN, ["src/main.ts"], {
      cwd: ROOT,
      env: {
        ...serviceEnv(),
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        DELIVERY_ALLOW_CIDRS: "127.0.0.0/8",
        DATABASE_URL: dbUrl.toString(),
        JETSTREAM_URL: js.url,
        PLC_DIRECTORY_URL: `http://127.0.0.1:${plcPort}`,
        HEALTH_PORT: String(healthPort),
        API_PORT: String(apiPort),
        SERVICE_DID,
        FIREHOOK_DATA_DIR: dataDir,
        DELIVERY_TIMEOUT_MS: "2000",
        DELIVERY_MAX_ATTEMPTS: "4",
        DELIVERY_RETRY_BASE_MS: "500",
        DELIVERY_RETRY_MAX_MS: "5000",
        DELIVERY_CIRCUIT_THRESHOLD: "5",
        DELIVERY_CIRCUIT_COOLDOWN_MS: "5000",
        MAINTENANCE_INTERVAL_MS: "10000",
        RETENTION_AUDIT_MAX_ROWS: "1000",
        RETENTION_QUARANTINE_MAX_ROWS: "1000",
        RETENTION_TOMBSTONES_MAX_ROWS: "1000",
        RETRY_SCHEDULER_INTERVAL_MS: "10000"
      },
      stdio: ["ignore", log, log]
    })
    cleanups.push(() =>
      new Promise((resolve) => {
        if (fh.exitCode !== null) return resolve(fh.exitCode)
        const timer = setTimeout(() => fh.kill("SIGKILL"), 60_000)
        fh.once("exit", (code) => {
          clearTimeout(timer)
          say(`firehook exited ${code} (log: ${logPath}, removed)`)
          resolve(code)
        })
        fh.kill("SIGTERM")
      })
    )
    const health = `http://127.0.0.1:${healthPort}`
    const api = `http://127.0.0.1:${apiPort}`
    for (let i = 0; i < 1_200; i++) {
      const r = await fetch(`${health}/health`, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined)
      if (r?.status === 200) break
      if (fh.exitCode !== null || i === 1_199) {
        throw new Error(`firehook did not start: ${Fs.readFileSync(logPath, "utf8")}`)
      }
      await sleep(250)
    }
    say(`firehook ready (pid ${fh.pid}), database ${dbName}`)

    // the churn ----------------------------------------------------------------------------
    let timeUs = Date.now() * 1000
    const nextTime = () => (timeUs = Math.max(timeUs + 1, Date.now() * 1000))
    let origins = 0
    const hookRecord = (invalid: boolean, scope?: string) => {
      const mode = pick(MODES)
      const n = origins++
      const host = `127.${(n >> 16) & 255}.${(n >> 8) & 255}.${(n & 255) || 1}`
      return {
        $type: WH,
        scope: { aturi: `at://${scope ?? pick(scopeDids)}`, ...(Math.random() < 0.2 ? { backlinks: true } : {}) },
        url: invalid
          ? "ftp://nope.example/x"
          : `http://${host}:${mode === "refused" ? deadPort : pick(rxPorts)}/${mode}/${n}`,
        ...(Math.random() < 0.7 ? { secret: `soak-secret-${randomBytes(8).toString("hex")}` } : {}),
        createdAt: new Date().toISOString()
      }
    }
    const write = (
      o: Owner,
      op: "create" | "update" | "delete",
      rkey: string,
      frames: Array<LogEntry>,
      scope?: string
    ) => {
      const t = nextTime()
      o.rev = tidAt(t)
      if (op === "delete") {
        o.hooks.delete(rkey)
        return frames.push(commitFrame(o.did, t, WH, rkey, "delete"))
      }
      const v = hookRecord(Math.random() < 0.05, scope)
      o.hooks.set(rkey, v)
      frames.push(commitFrame(o.did, t, WH, rkey, op, v))
    }
    const churnHooks = () => {
      const frames: Array<LogEntry> = []
      for (let k = 0; k < 3; k++) {
        const o = pick(owners)
        const keys = [...o.hooks.keys()]
        const r = Math.random()
        if (keys.length === 0 || (r < 0.45 && keys.length < 5)) write(o, "create", tidAt(nextTime() + 7), frames)
        else write(o, r < 0.75 ? "update" : "delete", pick(keys), frames)
      }
      js.publish(frames)
    }
    const churnOwners = async () => {
      const frames: Array<LogEntry> = []
      write(await newOwner(), "create", tidAt(nextTime() + 3), frames, newDid())
      const old = owners[rnd(Math.max(1, owners.length - 20))] as Owner
      for (const k of [...old.hooks.keys()]) write(old, "delete", k, frames)
      js.publish(frames)
    }
    let posts = 0
    const postEvents = (n: number) => {
      const frames: Array<LogEntry> = []
      for (let i = 0; i < n; i++) {
        const p = posts++
        const record = {
          $type: "app.bsky.feed.post",
          text: `soak post ${p}`,
          ...(Math.random() < 0.3
            ? { reply: { root: { uri: `at://${pick(scopeDids)}/app.bsky.feed.post/p1`, cid: "bafyx" } } }
            : {}),
          createdAt: new Date().toISOString()
        }
        const op = Math.random() < 0.1 ? "delete" : "create"
        frames.push(commitFrame(pick(scopeDids), nextTime(), "app.bsky.feed.post", `p${p % 500}`, op, record))
      }
      js.publish(frames)
    }
    // the owners' API
    const mint = (o: Owner, lxm: string) =>
      createServiceJwt({
        keypair: o.key,
        issuer: o.did as Did,
        audience: SERVICE_DID as Did,
        lxm: lxm as Nsid,
        expiresIn: 60
      })
    const tails = new Set<WebSocket>()
    const openTail = async () => {
      const o = pick(owners.slice(0, 20))
      const ws = new WebSocket(`ws://127.0.0.1:${apiPort}/xrpc/dev.firehook.webhook.subscribeDeliveries`, {
        headers: { authorization: `Bearer ${await mint(o, "dev.firehook.webhook.subscribeDeliveries")}` }
      })
      tails.add(ws)
      const forget = () => tails.delete(ws)
      ws.on("unexpected-response", forget)
      ws.on("error", forget)
      ws.on("close", forget)
      // closed cleanly, dropped, or paused (a reader that stops reading) and then dropped
      const how = rnd(3)
      if (how === 2) ws.on("open", () => ws.pause())
      setTimeout(() => {
        if (how === 0) ws.close()
        else ws.terminate()
        forget()
      }, 3_000 + rnd(30_000))
    }
    const callApi = async () => {
      const o = pick(owners)
      const nsid = pick(["dev.firehook.webhook.list", "dev.firehook.webhook.listDeliveries"])
      const r = await fetch(`${api}/xrpc/${nsid}`, {
        headers: { authorization: `Bearer ${await mint(o, nsid)}` },
        signal: AbortSignal.timeout(10_000)
      }).catch(() => undefined)
      await r?.arrayBuffer().catch(() => undefined)
    }
    let authFails = 0
    const authFail = () => {
      const n = authFails++
      const req = Http.request({
        host: "127.0.0.1",
        port: apiPort,
        path: "/xrpc/dev.firehook.webhook.list",
        localAddress: `127.${(n >> 16) & 255}.${(n >> 8) & 255}.${(n & 255) || 1}`,
        headers: { authorization: "Bearer not.a.token" },
        timeout: 5_000
      })
      req.on("response", (res) => res.resume())
      req.on("error", () => undefined)
      req.on("timeout", () => req.destroy())
      req.end()
    }
    // simulated time for maintenance: terminal rows older than 90 s are aged past their retention
    const AGED: ReadonlyArray<readonly [string, string]> = [
      ["outbox", "finished_at"],
      ["delivery_events", "created_at"],
      ["delivery_attempts", "started_at"],
      ["audit", "created_at"],
      ["tombstones", "deleted_at"],
      ["quarantine", "created_at"],
      ["rejected_records", "last_seen_at"]
    ]
    const age = async () => {
      for (const [table, col] of AGED) {
        await db.query(`UPDATE ${table} SET ${col} = ${col} - interval '40 days'
          WHERE ${col} < now() - interval '90 seconds' AND ${col} > now() - interval '1 day'`)
      }
    }

    // sampling ------------------------------------------------------------------------------
    const TABLES = [
      "outbox",
      "delivery_attempts",
      "delivery_events",
      "audit",
      "tombstones",
      "quarantine",
      "rejected_records",
      "prior_refs",
      "webhooks",
      "owners",
      "registry_changes",
      "api_jti"
    ]
    const samples: Array<Record<string, number | string>> = []
    Fs.writeFileSync(OUT, "")
    const sample = async (phase: string) => {
      const root = fh.pid ?? 0
      const child = childOf(root) ?? 0
      const s: Record<string, number | string> = {
        t: samples.length === 0 ? 0 : Math.round((Date.now() - Number(samples[0]?.["at"])) / 1000),
        at: Date.now(),
        phase,
        "parent rss MiB": Math.round(statusKib(root, "VmRSS") / 1024),
        "child rss MiB": Math.round(statusKib(child, "VmRSS") / 1024),
        "parent fds": openFds(root),
        "child fds": openFds(child)
      }
      const text = await fetch(`${health}/metrics`, { signal: AbortSignal.timeout(5_000) })
        .then((r) => r.text())
        .catch(() => "")
      const lines = text.split("\n").filter((l) => l.length > 0 && !l.startsWith("#"))
      for (const line of lines) {
        if (SERIES.test(line)) s[line.slice(0, line.lastIndexOf(" "))] = Number(line.slice(line.lastIndexOf(" ") + 1))
      }
      s["metric series"] = lines.length
      const backends = await rows<{ pid: number }>(
        admin,
        `SELECT pid FROM pg_stat_activity WHERE datname = '${dbName}' AND pid <> pg_backend_pid()`
      )
      // this harness's own connection is one of them
      s["pg connections"] = backends.length - 1
      s["pg private MiB"] = Math.round(backends.reduce((n, b) => n + privateKib(Number(b.pid)), 0) / 1024)
      for (const t of TABLES) {
        s[`rows ${t}`] = Number((await rows<{ n: string }>(db, `SELECT count(*)::text AS n FROM ${t}`))[0]?.n)
      }
      s["received"] = received
      samples.push(s)
      Fs.appendFileSync(OUT, JSON.stringify(s) + "\n")
      const pickOut = Object.entries(s).filter(([k]) => !k.startsWith("rows ") && k !== "at")
      say(pickOut.map(([k, v]) => `${k.replace("{process=\"delivery-child\"}", "(child)")}=${v}`).join(" "))
    }

    const timers: Array<ReturnType<typeof setInterval>> = []
    cleanups.push(async () => timers.forEach(clearInterval))
    let churning = true
    const every = (ms: number, f: () => unknown) => {
      if (ms > 0) timers.push(setInterval(() => churning && f(), ms))
    }
    await sample("start")
    for (let i = 0; i < 60; i++) churnHooks()
    every(1_000, churnHooks)
    every(200, () => postEvents(Math.max(1, Math.round(EVENTS_PER_S / 5))))
    every(num("TAIL_EVERY_MS", 4_000), () => openTail().catch(() => undefined))
    every(num("API_EVERY_MS", 3_000), () => callApi().catch(() => undefined))
    every(num("AUTHFAIL_EVERY_MS", 0), authFail)
    if (process.env["OWNER_CHURN"] === "1") every(1_000, () => churnOwners().catch(() => undefined))
    if (process.env["SOAK_AGE"] !== "0") timers.push(setInterval(() => void age().catch(() => undefined), 60_000))
    timers.push(setInterval(() => void sample(churning ? "churn" : "quiet").catch(() => undefined), SAMPLE_MS))
    await sleep(CHURN_S * 1000)
    churning = false
    for (const ws of tails) ws.terminate()
    say("churn over: quiet")
    await sleep(QUIET_S * 1000)
    timers.forEach(clearInterval)
    await sample("end")

    const first = samples.find((s) => s["phase"] === "churn") ?? samples[0]
    const last = samples[samples.length - 1]
    say("first churn sample → last sample:")
    for (const k of Object.keys(last ?? {})) {
      if (k !== "at" && k !== "phase") say(`  ${k}: ${first?.[k]} → ${last?.[k]}`)
    }
  } finally {
    for (const c of cleanups.reverse()) await c().catch(() => undefined)
  }
}

await main()
process.exit(0)
