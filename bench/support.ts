/**
 * Shared pieces of the benchmarks: a seeded PRNG, a deterministic webhook population and event
 * workload, a lean local Jetstream server with flow control, and small measurement helpers.
 *
 * The workload generators are deterministic (seeded), so two processes (the benchmark and its
 * Jetstream child) build the same webhooks without exchanging them.
 */
import { ConfigProvider, Effect, Layer, Redacted } from "effect"
import * as Fs from "node:fs"
import type { IncomingMessage } from "node:http"
import * as Os from "node:os"
import * as Path from "node:path"
import { Worker } from "node:worker_threads"
import { type WebSocket, WebSocketServer } from "ws"
import type { RecordEvent } from "../src/schemas/RecordEvent.js"
import { tidFromMicros } from "../src/schemas/Tid.js"
import * as Outbox from "../src/services/matching/Outbox.js"
import * as PriorRefsStore from "../src/services/matching/PriorRefsStore.js"
import * as Processor from "../src/services/matching/Processor.js"
import * as Config from "../src/services/platform/Config.js"
import * as Database from "../src/services/platform/Database.js"
import * as EmbeddedPg from "../src/services/platform/EmbeddedPg.js"
import { Tx } from "../src/services/platform/Persistence.js"
import * as Registry from "../src/services/registry/Registry.js"
import * as RegistryStore from "../src/services/registry/RegistryStore.js"
import { plc } from "../test/matching/fixtures.js"
import { commitFrame } from "../test/support/fakeJetstream.js"
import { scopedBenchDatabase } from "./lifecycle.js"

/**
 * The configuration from an environment map, as `testConfig` in test/support/stack.ts builds it
 * (that module imports vitest through test/support/db.ts, so it cannot load outside a test run).
 */
export const benchConfig = (env: Record<string, string>): Config.FirehookConfigShape =>
  Effect.runSync(
    Config.load({ isTty: false }).pipe(
      Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries({ NODE_ENV: "test", ...env }))))
    )
  )

// ---------------------------------------------------------------------------------------------
// randomness and identifiers

/** mulberry32: a small seeded PRNG returning floats in [0, 1). */
export const makeRng = (seed: number): () => number => {
  let s = seed | 0
  return () => {
    s = (s + 0x6d2b79f5) | 0
    let t = s
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** A canonical `did:plc:` for n (distinct n → distinct DID): the tests' helper. */
export { plc }

const TID_CHARS = "234567abcdefghijklmnopqrstuvwxyz"
/** A syntactically valid TID for n (record keys). */
export const tidN = (n: number): string => {
  let s = ""
  let v = n
  for (let i = 0; i < 12; i++) {
    s = TID_CHARS[v % 32] + s
    v = Math.floor(v / 32)
  }
  return `3${s}`
}

// ---------------------------------------------------------------------------------------------
// webhooks

export const WH = "place.wisp.v2.wh"

const FEED = ["app.bsky.feed.post", "app.bsky.feed.like", "app.bsky.feed.repost"] as const
const GRAPH = ["app.bsky.graph.follow", "app.bsky.graph.block", "app.bsky.graph.listitem"] as const
const SCOPE_COLLECTIONS = [...FEED, ...GRAPH, "app.bsky.actor.profile"] as const
const GLOBS: ReadonlyArray<{ readonly glob: string; readonly members: ReadonlyArray<string> }> = [
  { glob: "app.bsky.feed.*", members: FEED },
  { glob: "app.bsky.graph.*", members: GRAPH },
  { glob: "app.bsky.*", members: [...FEED, ...GRAPH] }
]

export interface BenchWebhook {
  readonly owner: string
  readonly rkey: string
  readonly rev: string
  readonly aturi: string
  readonly scopeDid: string
  /** a concrete collection an event must have to match directly (undefined: any) */
  readonly collections: ReadonlyArray<string> | undefined
  readonly scopeRkey: string | undefined
  readonly backlinks: boolean
  readonly createOnly: boolean
  /** the record value as a user would write it */
  readonly record: Record<string, unknown>
}

export interface WebhookPopulation {
  readonly webhooks: ReadonlyArray<BenchWebhook>
  readonly backlinkScopes: ReadonlyArray<BenchWebhook>
  readonly owners: number
  /** owners ∪ scope DIDs (Jetstream's wantedDids) */
  readonly wantedDids: number
}

/**
 * `count` active webhooks, 4 per owner. Scope DIDs: 30% the owner's own repo, else one of
 * `count · 0.75` other DIDs, so owners ∪ scope DIDs stays within Jetstream's 10,000 wantedDids.
 * Scopes: 40% DID-only, 25% collection, 15% glob, 20% one record. 10% backlinks (≤ 1,000 backlink
 * DIDs). 20% only `create`. Signing: 50% inline secret, 10% secretId, 40% unsigned.
 */
export const makeWebhooks = (count: number, seed: number): WebhookPopulation => {
  const rand = makeRng(seed)
  const pick = <A>(xs: ReadonlyArray<A>): A => xs[Math.floor(rand() * xs.length)] as A
  const owners = Math.max(1, Math.ceil(count / 4))
  const others = Math.max(1, Math.floor(count * 0.75))
  const webhooks: Array<BenchWebhook> = []
  const backlinkScopes: Array<BenchWebhook> = []
  const wanted = new Set<string>()
  for (let i = 0; i < count; i++) {
    const owner = plc(1_000_000 + (i % owners))
    const scopeDid = rand() < 0.3 ? owner : plc(2_000_000 + Math.floor(rand() * others))
    const r = rand()
    let aturi: string
    let collections: ReadonlyArray<string> | undefined
    let scopeRkey: string | undefined
    if (r < 0.4) {
      aturi = `at://${scopeDid}`
      collections = undefined
    } else if (r < 0.65) {
      const c = pick(SCOPE_COLLECTIONS)
      aturi = `at://${scopeDid}/${c}`
      collections = [c]
    } else if (r < 0.8) {
      const g = pick(GLOBS)
      aturi = `at://${scopeDid}/${g.glob}`
      collections = g.members
    } else {
      const c = pick(FEED)
      scopeRkey = tidN(5_000_000 + i)
      aturi = `at://${scopeDid}/${c}/${scopeRkey}`
      collections = [c]
    }
    const backlinks = rand() < 0.1
    const createOnly = rand() < 0.2
    const s = rand()
    const record: Record<string, unknown> = {
      $type: WH,
      scope: backlinks ? { aturi, backlinks: true } : { aturi },
      url: `https://hooks${i % 97}.example.com/firehook/${i}`,
      createdAt: "2026-01-01T00:00:00.000Z",
      ...(createOnly ? { events: ["create"] } : {}),
      ...(s < 0.5 ? { secret: `whsec-inline-${i}-0123456789abcdef` } : s < 0.6 ? { secretId: `key-${i % 7}` } : {})
    }
    const w: BenchWebhook = {
      owner,
      rkey: tidN(9_000_000 + i),
      rev: tidN(9_500_000 + i),
      aturi,
      scopeDid,
      collections,
      scopeRkey,
      backlinks,
      createOnly,
      record
    }
    webhooks.push(w)
    if (backlinks) backlinkScopes.push(w)
    wanted.add(owner)
    wanted.add(scopeDid)
  }
  return { webhooks, backlinkScopes, owners, wantedDids: wanted.size }
}

// ---------------------------------------------------------------------------------------------
// events

/** Collections of the plain 94% (roughly the network's mix: likes dominate). */
const PLAIN_MIX: ReadonlyArray<readonly [string, number]> = [
  ["app.bsky.feed.like", 0.45],
  ["app.bsky.graph.follow", 0.14],
  ["app.bsky.feed.post", 0.13],
  ["app.bsky.feed.repost", 0.12],
  ["app.bsky.graph.block", 0.03],
  ["app.bsky.actor.profile", 0.03],
  ["app.bsky.graph.listitem", 0.04],
  ["app.bsky.feed.threadgate", 0.02],
  ["chat.bsky.actor.declaration", 0.02],
  ["app.bsky.graph.starterpack", 0.02]
]

const TEXT = "just setting up my bsky, the weather is lovely today and the coffee is even better. #coffee"
const CID = "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm"
const CREATED = "2026-03-01T12:00:00.000Z"

const plainRecord = (collection: string, n: number): Record<string, unknown> => {
  switch (collection) {
    case "app.bsky.feed.post":
      return { $type: collection, text: TEXT, langs: ["en"], createdAt: CREATED }
    case "app.bsky.graph.follow":
    case "app.bsky.graph.block":
      // a DID string is not a reference
      return { $type: collection, subject: plc(50_000_000 + n), createdAt: CREATED }
    case "app.bsky.actor.profile":
      return { $type: collection, displayName: "Someone", description: TEXT, createdAt: CREATED }
    case "app.bsky.feed.like":
    case "app.bsky.feed.repost":
      // without an AT-URI subject here: the reference-carrying share is generated separately
      return { $type: collection, subject: { cid: CID }, createdAt: CREATED }
    default:
      return { $type: collection, name: "a list entry", createdAt: CREATED }
  }
}

export interface FrameSet {
  /** the exact frame texts, in time order */
  readonly texts: ReadonlyArray<string>
  readonly dids: ReadonlyArray<string>
  readonly collections: ReadonlyArray<string>
  /** time_us of frame i = t0 + i · stepUs */
  readonly t0: number
  readonly stepUs: number
  readonly bytes: number
  readonly counts: {
    readonly direct: number
    readonly withRefs: number
    readonly refsToBacklinkScopes: number
    readonly creates: number
    readonly updates: number
    readonly deletes: number
    readonly deletesOfReferencingRecords: number
  }
  /** time_us of the last frame whose DID is in the direct set (undefined: none) */
  readonly lastDirectTimeUs: number | undefined
}

export interface WorkloadOptions {
  readonly events: number
  readonly seed: number
  readonly t0: number
  readonly stepUs: number
  /** share of events from a watched DID/collection/rkey (default 0.01) */
  readonly directShare?: number
  /** share of events whose record carries AT-URI references (default 0.05) */
  readonly refsShare?: number
}

/**
 * N Jetstream commit frames:
 * - `directShare` from a watched scope (its DID, a matching collection, its rkey if it has one);
 * - `refsShare` from unwatched DIDs whose record references something (a like/repost subject or a
 *   reply + @mention), half of them pointing at a backlink scope;
 * - the rest plain records from unwatched DIDs (mix above), no references;
 * - operations: ~91% create, ~5% delete (a quarter of them deleting an earlier referencing
 *   record, so the prior-reference path runs), ~5% update (2% of plain events, every profile
 *   write, half of the events on single-record scopes).
 */
export const makeFrames = (population: WebhookPopulation, o: WorkloadOptions): FrameSet => {
  const rand = makeRng(o.seed ^ 0x5bd1e995)
  const pick = <A>(xs: ReadonlyArray<A>): A => xs[Math.floor(rand() * xs.length)] as A
  const directShare = o.directShare ?? 0.01
  const refsShare = o.refsShare ?? 0.05
  const texts: Array<string> = new Array(o.events)
  const dids: Array<string> = new Array(o.events)
  const collections: Array<string> = new Array(o.events)
  const direct = population.webhooks
  const targets = population.backlinkScopes
  const referencing: Array<{ did: string; collection: string; rkey: string }> = []
  const wanted = new Set<string>()
  for (const w of direct) {
    wanted.add(w.owner)
    wanted.add(w.scopeDid)
  }
  let bytes = 0
  let nDirect = 0
  let withRefs = 0
  let toScopes = 0
  let creates = 0
  let updates = 0
  let deletes = 0
  let deletesOfRef = 0
  let lastDirectTimeUs: number | undefined
  const plainCollection = (): string => {
    let r = rand()
    for (const [c, p] of PLAIN_MIX) {
      if (r < p) return c
      r -= p
    }
    return "app.bsky.feed.like"
  }
  for (let n = 0; n < o.events; n++) {
    const timeUs = o.t0 + n * o.stepUs
    const r = rand()
    let did: string
    let collection: string
    let rkey: string
    let operation: "create" | "update" | "delete" = "create"
    let record: Record<string, unknown> | undefined
    if (r < directShare && direct.length > 0) {
      const w = pick(direct)
      did = w.scopeDid
      collection = w.collections === undefined ? pick(SCOPE_COLLECTIONS) : pick(w.collections)
      rkey = w.scopeRkey ?? tidN(20_000_000 + n)
      if (w.scopeRkey !== undefined) operation = rand() < 0.5 ? "update" : "delete"
      else if (!w.createOnly && rand() < 0.1) operation = "delete"
      if (operation !== "delete") record = plainRecord(collection, n)
      nDirect++
    } else if (r < directShare + refsShare) {
      did = plc(70_000_000 + n)
      const toScope = targets.length > 0 && rand() < 0.5
      const target = toScope ? pick(targets) : undefined
      const targetDid = target?.scopeDid ?? plc(60_000_000 + n)
      const subjectCollection = target?.collections?.[0] ?? "app.bsky.feed.post"
      const subject = target?.scopeRkey !== undefined
        ? target.aturi
        : `at://${targetDid}/${subjectCollection}/${tidN(n)}`
      rkey = tidN(30_000_000 + n)
      const shape = rand()
      if (shape < 0.5) {
        collection = "app.bsky.feed.post"
        record = {
          $type: collection,
          text: `replying to @someone ${TEXT}`,
          reply: { root: { uri: subject, cid: CID }, parent: { uri: subject, cid: CID } },
          facets: [
            {
              index: { byteStart: 12, byteEnd: 20 },
              features: [{ $type: "app.bsky.richtext.facet#mention", did: targetDid }]
            }
          ],
          langs: ["en"],
          createdAt: CREATED
        }
      } else {
        collection = shape < 0.8 ? "app.bsky.feed.like" : "app.bsky.feed.repost"
        record = { $type: collection, subject: { uri: subject, cid: CID }, createdAt: CREATED }
      }
      withRefs++
      if (toScope) {
        toScopes++
        referencing.push({ did, collection, rkey })
      }
    } else {
      const op = rand()
      if (op < 0.05) {
        operation = "delete"
        const prior = referencing.length > 0 && rand() < 0.25
          ? referencing.splice(Math.floor(rand() * referencing.length), 1)[0]
          : undefined
        if (prior !== undefined) {
          did = prior.did
          collection = prior.collection
          rkey = prior.rkey
          deletesOfRef++
        } else {
          did = plc(80_000_000 + n)
          collection = plainCollection()
          rkey = tidN(40_000_000 + n)
        }
      } else {
        did = plc(80_000_000 + n)
        collection = plainCollection()
        rkey = collection === "app.bsky.actor.profile" ? "self" : tidN(40_000_000 + n)
        if (op < 0.07 || collection === "app.bsky.actor.profile") operation = "update"
        record = plainRecord(collection, n)
      }
    }
    if (operation === "create") creates++
    else if (operation === "update") updates++
    else deletes++
    const entry = commitFrame(did, timeUs, collection, rkey, operation, record)
    texts[n] = entry.text
    dids[n] = did
    collections[n] = collection
    bytes += entry.text.length
    if (wanted.has(did)) lastDirectTimeUs = timeUs
  }
  return {
    texts,
    dids,
    collections,
    t0: o.t0,
    stepUs: o.stepUs,
    bytes,
    counts: {
      direct: nDirect,
      withRefs,
      refsToBacklinkScopes: toScopes,
      creates,
      updates,
      deletes,
      deletesOfReferencingRecords: deletesOfRef
    },
    lastDirectTimeUs
  }
}

// ---------------------------------------------------------------------------------------------
// a lean local Jetstream with flow control

interface Filters {
  readonly collections: ReadonlySet<string> | undefined
  readonly dids: ReadonlySet<string> | undefined
}

interface Conn {
  readonly socket: WebSocket
  readonly cursor: number | undefined
  filters: Filters | undefined
}

export interface BenchJetstream {
  readonly url: string
  /** make frames [0, upTo) available: sent to matching live connections, replayable by cursor */
  readonly release: (upTo: number) => void
  /** the filters of the connections that sent their hello */
  readonly subscribed: () => ReadonlyArray<
    { readonly collections: number | undefined; readonly dids: number | undefined }
  >
  readonly connections: () => number
  readonly close: () => Promise<void>
}

const asStringSet = (u: unknown): ReadonlySet<string> | undefined =>
  Array.isArray(u) && u.length > 0 ? new Set(u.filter((x): x is string => typeof x === "string")) : undefined

/**
 * The Jetstream protocol as `test/support/fakeJetstream.ts` speaks it (`requireHello`, `cursor`,
 * `options_update` with wantedCollections / wantedDids), over a fixed, pre-generated frame set that
 * is released progressively: a connection replays the released frames from its cursor
 * (inclusive), then receives newly released ones live. Filters are sets (the test server scans
 * arrays, which costs ~10k comparisons per frame against a 10,000-DID direct set).
 */
export const startBenchJetstream = (frames: FrameSet, onChange?: () => void): Promise<BenchJetstream> =>
  new Promise((resolve) => {
    const conns = new Set<Conn>()
    let released = 0
    const wants = (f: Filters, i: number): boolean =>
      (f.collections === undefined || f.collections.has(frames.collections[i] ?? "")) &&
      (f.dids === undefined || f.dids.has(frames.dids[i] ?? ""))
    const indexOf = (cursor: number): number => Math.max(0, Math.ceil((cursor - frames.t0) / frames.stepUs))
    const wss = new WebSocketServer({
      host: "127.0.0.1",
      port: 0,
      perMessageDeflate: false,
      maxPayload: 16 * 1024 * 1024
    })
    wss.on("connection", (socket: WebSocket, req: IncomingMessage) => {
      const url = new URL(req.url ?? "/", "ws://127.0.0.1")
      const raw = url.searchParams.get("cursor")
      const conn: Conn = { socket, cursor: raw === null ? undefined : Number(raw), filters: undefined }
      conns.add(conn)
      socket.on("close", () => {
        conns.delete(conn)
        onChange?.()
      })
      socket.on("message", (data) => {
        const msg: unknown = JSON.parse(String(data))
        if (typeof msg !== "object" || msg === null || !("type" in msg) || msg.type !== "options_update") return
        const payload: unknown = "payload" in msg ? msg.payload : {}
        const p = typeof payload === "object" && payload !== null ? (payload as Record<string, unknown>) : {}
        const first = conn.filters === undefined
        const filters: Filters = {
          collections: asStringSet(p["wantedCollections"]),
          dids: asStringSet(p["wantedDids"])
        }
        conn.filters = filters
        if (first && conn.cursor !== undefined) {
          for (let i = indexOf(conn.cursor); i < released; i++) {
            if (wants(filters, i)) socket.send(frames.texts[i] ?? "")
          }
        }
        onChange?.()
      })
    })
    wss.once("listening", () => {
      const addr = wss.address()
      const port = typeof addr === "object" && addr !== null ? addr.port : 0
      resolve({
        url: `ws://127.0.0.1:${port}/subscribe`,
        release: (upTo) => {
          const end = Math.min(upTo, frames.texts.length)
          if (end <= released) return
          for (const c of conns) {
            const f = c.filters
            if (f === undefined || c.socket.readyState !== 1) continue
            for (let i = released; i < end; i++) if (wants(f, i)) c.socket.send(frames.texts[i] ?? "")
          }
          released = end
        },
        subscribed: () =>
          [...conns]
            .filter((c) => c.filters !== undefined)
            .map((c) => ({ collections: c.filters?.collections?.size, dids: c.filters?.dids?.size })),
        connections: () => conns.size,
        close: () =>
          new Promise<void>((r) => {
            for (const c of conns) c.socket.terminate()
            wss.close(() => r())
          })
      })
    })
  })

// ---------------------------------------------------------------------------------------------
// measurement

export const mib = (n: number): string => (n / 1024 / 1024).toFixed(1)

/** Samples this process's RSS every `everyMs` (and on demand); keeps the peak. */
export const startRssSampler = (everyMs = 20) => {
  let peak = process.memoryUsage.rss()
  let windowPeak = 0
  const sample = () => {
    const rss = process.memoryUsage.rss()
    if (rss > peak) peak = rss
    if (rss > windowPeak) windowPeak = rss
    return rss
  }
  const timer = setInterval(sample, everyMs)
  timer.unref()
  return {
    sample,
    /** start a new window (e.g. the timed part) */
    resetWindow: () => {
      windowPeak = process.memoryUsage.rss()
    },
    peak: () => peak,
    windowPeak: () => windowPeak,
    stop: () => clearInterval(timer)
  }
}

/** The p-th percentile (0–100) of unsorted values (nearest rank). */
export const percentile = (values: ArrayLike<number>, p: number): number => {
  const sorted = Array.from(values).sort((a, b) => a - b)
  if (sorted.length === 0) return Number.NaN
  const rank = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  return sorted[rank] ?? Number.NaN
}

export const machine = (): string => {
  const cpus = Os.cpus()
  const model = cpus[0]?.model.trim() ?? "unknown CPU"
  const bun = process.versions["bun"]
  const runtime = bun === undefined ? `node ${process.version}` : `bun ${bun}`
  return `${cpus.length} cores (${model}), ${mib(Os.totalmem())} MiB RAM, ${runtime}, ${Os.platform()} ${Os.release()}`
}

/**
 * Receivers in a worker thread of their own (`source`, evaluated, posts its ports when listening):
 * their ports; the thread ends with the scope.
 */
export const startReceiverThread = (source: string, workerData: unknown) =>
  Effect.acquireRelease(
    Effect.async<{ worker: Worker; ports: ReadonlyArray<number> }>((resume) => {
      const worker = new Worker(source, { eval: true, workerData })
      worker.once("message", (ports: ReadonlyArray<number>) => resume(Effect.succeed({ worker, ports })))
    }),
    ({ worker }) => Effect.promise(() => worker.terminate())
  )

/**
 * A maker of registry-stream create events on a clock of its own (1 ms apart, from a fixed
 * start): each call's rev, time and cursor come after the last one's.
 */
export const recordEvents = () => {
  let clock = 1_700_000_000_000_000
  return (did: string, collection: string, rkey: string, record: unknown): RecordEvent => {
    clock += 1000
    return {
      kind: "commit",
      did,
      collection,
      rkey,
      operation: "create",
      rev: tidFromMicros(clock),
      cid: "bafyreib2rxk3rh6kzwq",
      record,
      timeUs: clock,
      stream: "registry",
      relay: "wss://relay.bench",
      cursor: String(clock)
    }
  }
}

/**
 * The database a benchmark runs on: with `DATABASE_URL` set, a throw-away database
 * `fh_bench_<tag>_<pid>_<hex>` created on that server and dropped with the scope (lifecycle.ts; the
 * database `DATABASE_URL` names is never written to); else an embedded PostgreSQL in a temporary
 * directory (named after `tag`) that lives, and is removed, with the scope. Empty either way: the
 * caller's `Database.layerUrl` migrates it.
 */
export const benchDatabaseUrl = (tag: string) =>
  Effect.gen(function*() {
    const external = process.env["DATABASE_URL"]
    if (external !== undefined && external.length > 0) return (yield* scopedBenchDatabase(external, tag)).url
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), `firehook-bench-${tag}-`))
    Fs.chmodSync(dir, 0o755)
    yield* Effect.addFinalizer(() => Effect.sync(() => Fs.rmSync(dir, { recursive: true, force: true })))
    const pg = yield* EmbeddedPg.start({ dataDir: dir, database: "firehook_bench" })
    return pg.url
  })

/** The matching pipeline (registry, processor, outbox) on the database at `url`: what enqueues. */
export const benchPipeline = (url: Redacted.Redacted<string>, config: Config.FirehookConfigShape) =>
  Processor.layer().pipe(
    Layer.provideMerge(Registry.layer),
    Layer.provideMerge(Layer.mergeAll(RegistryStore.layerSql, PriorRefsStore.layerSql, Outbox.layerSql, Tx.layerSql)),
    Layer.provideMerge(Layer.mergeAll(Database.layerUrl(url, { maxConnections: 8 }), Config.layerValue(config)))
  )
