/**
 * Intake against a local Jetstream (real WebSockets): batch durability, retries, reconnects,
 * quarantine, backpressure, the direct set and its reconfiguration.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Duration, Effect, HashMap, Layer, Logger, Option, Ref, Stream } from "effect"
import { validateWhRecord } from "../../src/schemas/WhRecord.js"
import * as CursorStore from "../../src/services/intake/CursorStore.js"
import * as FirehoseSource from "../../src/services/intake/FirehoseSource.js"
import * as Intake from "../../src/services/intake/Intake.js"
import * as Outbox from "../../src/services/matching/Outbox.js"
import { Registry, toRow } from "../../src/services/registry/Registry.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { eventually } from "../support/eventually.js"
import { commitFrame, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { relayConfig, relayServer } from "../support/fakeRelay.js"
import { newRecorder, type Recorder, recordingProcessor } from "../support/recordingProcessor.js"
import { memoryStack, plc, testConfig, whRecordValue } from "../support/stack.js"

const WH = "place.wisp.v2.wh"

const T0 = 1_750_000_000_000_000
const POST = "app.bsky.feed.post"

const fakeJetstream = Effect.acquireRelease(
  Effect.promise(() => startFakeJetstream()),
  (f) => Effect.promise(() => f.close())
)

const fastTuning = (queueMax: number, batchMax: number): Intake.IntakeTuning => ({
  ...Intake.defaultTuning(queueMax, batchMax),
  batchRetryBase: Duration.millis(5),
  backoffBase: Duration.millis(10),
  backoffCap: Duration.millis(50),
  poisonBackoff: Duration.millis(20)
})

const specFor = (fake: FakeJetstream, name = "registry"): Intake.StreamSpec => ({
  name,
  relay: "ws://127.0.0.1",
  registryWriter: true,
  initialCursor: 0n,
  rewind: 2_000_000n,
  cursorIsTime: true,
  connect: (cursor) =>
    FirehoseSource.connectJetstream({
      url: fake.url,
      cursor,
      stream: name,
      relay: "ws://127.0.0.1",
      maxBytes: 1 << 20,
      connectTimeoutMs: 5000,
      allowInsecure: true
    }).pipe(Stream.map(Intake.jetstreamItem))
})

const posts = (n: number, from = 0) =>
  Array.from({ length: n }, (_, i) => commitFrame(plc(1), T0 + (from + i + 1) * 1000, POST, `p${from + i}`, "create"))

/** A registry stream runner over `fake`, running in the test's scope, once its first session is connected. */
const runConnected = (fake: FakeJetstream, tuning: Intake.IntakeTuning) =>
  Effect.gen(function*() {
    const runner = yield* Intake.makeStreamRunner(specFor(fake), tuning)
    yield* Effect.forkScoped(runner.run)
    yield* eventually(Effect.sync(() => fake.connections[0]?.options.length === 1), "connected")
    return runner
  })

const runnerStack = (rec: Recorder) =>
  Layer.mergeAll(recordingProcessor(rec), CursorStore.layerMemory, Outbox.layerMemory)

const processedKeys = (rec: Recorder) => rec.batches.flat().map((e) => (e.kind === "commit" ? e.rkey : e.kind))

describe("stream runner", () => {
  it.scopedLive("the cursor moves only after the batch commits; events arriving during a commit form the next batch; batches never exceed the limit", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const fake = yield* fakeJetstream
      const cursors = yield* CursorStore.CursorStore
      rec.gate = yield* Deferred.make<void>()
      const runner = yield* Intake.makeStreamRunner(specFor(fake), fastTuning(64, 4))
      yield* Effect.forkScoped(runner.run)
      yield* eventually(
        Effect.sync(() => fake.connections.length === 1 && fake.connections[0]!.options.length === 1),
        "connected"
      )
      fake.publish(posts(1))
      yield* eventually(Effect.sync(() => rec.calls === 1), "first batch started")
      // the first batch is blocked in its transaction: nothing is durable yet
      fake.publish(posts(9, 1))
      yield* eventually(Effect.map(Ref.get(runner.state), (s) => s.queued === 10), "all queued")
      expect(yield* cursors.load("registry", "ws://127.0.0.1")).toBeUndefined()
      expect((yield* Ref.get(runner.state)).durableCursor).toBeUndefined()
      yield* Deferred.succeed(rec.gate, undefined)
      yield* eventually(Effect.sync(() => rec.batches.flat().length === 10), "all committed")
      expect(rec.batches.map((b) => b.length)).toEqual([1, 4, 4, 1])
      expect(processedKeys(rec)).toEqual(Array.from({ length: 10 }, (_, i) => `p${i}`))
      expect(yield* cursors.load("registry", "ws://127.0.0.1")).toBe(BigInt(T0 + 10_000))
      expect((yield* Ref.get(runner.state)).durableCursor).toBe(BigInt(T0 + 10_000))
    }).pipe(Effect.provide(runnerStack(rec)))
  })

  it.scopedLive("a transient failure is retried in place; beyond the attempts the stream reconnects with cursor = last durable (rewound)", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const fake = yield* fakeJetstream
      const runner = yield* runConnected(fake, fastTuning(64, 128))
      rec.failures = 2
      fake.publish(posts(3))
      yield* eventually(Effect.sync(() => rec.batches.flat().length === 3), "committed after retries")
      expect(rec.failures).toBe(0)
      expect(rec.calls).toBe(rec.batches.length + 2)
      expect(fake.connections.length).toBe(1)
      // now fail more than the attempts: the session ends and reconnects from the durable cursor
      rec.failures = 3
      fake.publish(posts(2, 3))
      yield* eventually(Effect.sync(() => fake.connections.length === 2), "reconnected")
      // within the process the durable cursor is exact (the rewind applies to a cursor loaded at start)
      expect(fake.connections[1]?.cursor).toBe(BigInt(T0 + 3000))
      yield* eventually(Effect.sync(() => processedKeys(rec).includes("p4")), "replayed and committed")
      expect((yield* Ref.get(runner.state)).failureKind).toBe("handler")
    }).pipe(Effect.provide(runnerStack(rec)))
  })

  it.scopedLive("a malformed frame quarantines the stream: earlier events commit, later frames are ignored, then replayed after reconnect", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const fake = yield* fakeJetstream
      yield* runConnected(fake, fastTuning(64, 128))
      rec.gate = yield* Deferred.make<void>()
      fake.publish(posts(2))
      // a corrupt frame on the wire only (a relay glitch), then more valid frames
      fake.connections[0]!.socket.send("{\"did\":\"not a did\",\"time_us\":1,\"kind\":\"commit\"}")
      fake.publish(posts(2, 2))
      yield* eventually(Effect.sync(() => rec.calls >= 1), "batch started")
      yield* Deferred.succeed(rec.gate, undefined)
      yield* eventually(Effect.sync(() => fake.connections.length === 2), "reconnected after quarantine")
      yield* eventually(Effect.sync(() => processedKeys(rec).includes("p3")), "later frames replayed")
      // the first session committed p0, p1 and stopped at the poison: p2 and p3 come only from the
      // replay, which starts at the durable cursor (p1, inclusive)
      const keys = processedKeys(rec)
      expect(keys.slice(0, 2)).toEqual(["p0", "p1"])
      expect(keys.slice(2)).toEqual(["p1", "p2", "p3"])
      const q = (yield* Ref.get(yield* Outbox.MemoryOutboxState)).quarantine
      expect(q.map((x) => x.reason)).toEqual(["protocol"])
      expect(fake.connections[1]?.cursor).toBe(BigInt(T0 + 2000))
      expect(new Set(processedKeys(rec))).toEqual(new Set(["p0", "p1", "p2", "p3"]))
    }).pipe(Effect.provide(runnerStack(rec)))
  })

  it.scopedLive("a frame whose DID is atproto syntax but not canonical (did:web:Example.com) is not poison: the stream goes on", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const fake = yield* fakeJetstream
      const runner = yield* runConnected(fake, fastTuning(64, 128))
      fake.publish(posts(1))
      fake.publish([commitFrame("did:web:Example.com", T0 + 1500, WH, "odd", "create")])
      fake.publish(posts(1, 1))
      yield* eventually(Effect.sync(() => processedKeys(rec).includes("p1")), "the frame after it committed")
      expect(processedKeys(rec)).toEqual(["p0", "odd", "p1"])
      expect(fake.connections.length).toBe(1)
      expect((yield* Ref.get(yield* Outbox.MemoryOutboxState)).quarantine).toEqual([])
      expect((yield* Ref.get(runner.state)).failureKind).toBeUndefined()
    }).pipe(Effect.provide(runnerStack(rec)))
  })

  it.scopedLive("a full queue closes the socket; the queue is drained in order; the stream reconnects from the last ack", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const fake = yield* fakeJetstream
      const runner = yield* runConnected(fake, fastTuning(4, 2))
      rec.gate = yield* Deferred.make<void>()
      fake.publish(posts(20))
      yield* eventually(
        Effect.sync(() => fake.connections[0]?.socket.readyState === 3),
        "socket closed by backpressure"
      )
      // at most the queue (4) plus the batch in flight were read before the socket closed
      expect(rec.calls).toBe(1)
      yield* Deferred.succeed(rec.gate, undefined)
      rec.gate = undefined
      yield* eventually(Effect.map(Ref.get(runner.state), (st) => st.failureKind === "queue"), "queue failure recorded")
      yield* eventually(Effect.sync(() => new Set(processedKeys(rec)).size === 20), "everything committed")
      expect(fake.connections.length).toBeGreaterThanOrEqual(2)
      // in order, and batches never above the limit: each key first seen in publishing order, and a
      // replay after a reconnect starts at the last committed key (inclusive: it may repeat that key,
      // never go further back)
      const seen = processedKeys(rec).map((k) => Number(k.slice(1)))
      expect(seen.filter((k, i) => seen.indexOf(k) === i)).toEqual(Array.from({ length: 20 }, (_, i) => i))
      for (let i = 1; i < seen.length; i++) {
        expect(seen[i], `step ${i} of ${JSON.stringify(seen)}`).toBeGreaterThanOrEqual(seen[i - 1] ?? 0)
      }
      expect(Math.max(...rec.batches.map((b) => b.length))).toBeLessThanOrEqual(2)
      const firstReplay = fake.connections[1]?.cursor
      expect(firstReplay).toBeDefined()
    }).pipe(Effect.provide(runnerStack(rec)))
  })
})

describe("cursor loading", () => {
  it.scopedLive("a cursor loaded from the database is rewound 2 s; the first start of the registry stream is from 0", () => {
    const rec = newRecorder()
    return Effect.gen(function*() {
      const fake = yield* fakeJetstream
      const fresh = yield* Intake.makeStreamRunner(specFor(fake, "registry"), fastTuning(64, 8))
      yield* Effect.forkScoped(fresh.run)
      yield* eventually(Effect.sync(() => fake.connections.length === 1), "first connection")
      expect(fake.connections[0]?.cursor).toBe(0n)
      const cursors = yield* CursorStore.CursorStore
      yield* cursors.save("direct", "ws://127.0.0.1", BigInt(T0 + 9_000_000))
      const loaded = yield* Intake.makeStreamRunner(
        { ...specFor(fake, "direct"), initialCursor: undefined },
        fastTuning(64, 8)
      )
      yield* Effect.forkScoped(loaded.run)
      yield* eventually(Effect.sync(() => fake.connections.length === 2), "second connection")
      expect(fake.connections[1]?.cursor).toBe(BigInt(T0 + 9_000_000) - 2_000_000n)
      // a lower cursor never lowers the stored one
      yield* cursors.save("direct", "ws://127.0.0.1", 5n)
      expect(yield* cursors.load("direct", "ws://127.0.0.1")).toBe(BigInt(T0 + 9_000_000))
    }).pipe(Effect.provide(runnerStack(rec)))
  })
})

describe("Intake on Jetstream (real Registry and Processor on memory stores)", () => {
  const insecure = { NODE_ENV: "test", WEBHOOK_ALLOW_INSECURE_DEV: "1" }
  /** run `body` with an Intake pointed at a fresh local Jetstream */
  const withIntake = <A, E, R>(
    body: (fake: FakeJetstream, intake: Intake.IntakeShape) => Effect.Effect<A, E, R>,
    options: { readonly seed?: ReadonlyArray<readonly [string, string]>; readonly env?: Record<string, string> } = {}
  ) =>
    Effect.gen(function*() {
      const fake = yield* fakeJetstream
      const config = testConfig({ ...insecure, JETSTREAM_URL: fake.url, ...options.env })
      const seededStore = Layer.effect(
        RegistryStore.RegistryStore,
        Effect.gen(function*() {
          const store = yield* RegistryStore.makeMemory
          for (const [o, scopeDid] of options.seed ?? []) {
            const v = validateWhRecord(whRecordValue(`at://${scopeDid}`), { allowInsecureDev: false })
            if (v._tag === "Left") return yield* Effect.dieMessage("fixture")
            yield* store.upsert(toRow(o, "w", v.right.record, v.right.scope, "2222222222222", 1, undefined, true))
          }
          return store
        })
      )
      return yield* Effect.gen(function*() {
        const intake = yield* Intake.make({ reconfigureDelay: "50 millis", tuning: fastTuning(512, 128) })
        yield* Effect.forkScoped(intake.run)
        return yield* body(fake, intake)
      }).pipe(Effect.provide(memoryStack({ config, registryStore: seededStore })))
    })

  it.scopedLive(
    "10,000 direct DIDs go in options_update (never the URL); the 10,001st is refused by admission and counted",
    () =>
      withIntake(
        (fake) =>
          Effect.gen(function*() {
            yield* eventually(
              Effect.sync(() => fake.connections.some((c) => Array.isArray(c.options[0]?.["wantedDids"]))),
              "direct connected"
            )
            const direct = fake.connections.find((c) => Array.isArray(c.options[0]?.["wantedDids"]))!
            expect((direct.options[0]?.["wantedDids"] as Array<string>).length).toBe(10_000)
            expect(fake.connections.every((c) => !c.url.search.includes("wanted"))).toBe(true)
            expect(direct.url.search).toMatch(/^\?requireHello=true(&cursor=\d+)?$/)
            const registry = fake.connections.find((c) => Array.isArray(c.options[0]?.["wantedCollections"]))!
            expect(registry.cursor).toBe(0n)
            expect(registry.options[0]?.["wantedCollections"]).toEqual(["place.wisp.v2.wh"])
            // an existing owner adds a webhook on a new DID: the 10,001st DID
            fake.publish([
              commitFrame(plc(1000), T0 + 1000, WH, "extra", "create", whRecordValue(`at://${plc(99_999)}`))
            ])
            const reg = yield* Registry
            yield* eventually(Effect.map(reg.stats, (s) => s.rejected.direct_dids === 1), "rejected")
            expect(reg.index.size).toBe(5_000)
            expect(reg.index.wantedDids().size).toBe(10_000)
          }),
        { seed: Array.from({ length: 5_000 }, (_, i) => [plc(1000 + i), plc(50_000 + i)] as const) }
      ),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "a newly registered DID makes the direct stream replay from its registration time (− 2 s)",
    () =>
      withIntake((fake) =>
        Effect.gen(function*() {
          const A = plc(1)
          const B = plc(2)
          const OWNER = plc(3)
          // a first webhook: the direct stream starts
          fake.publish([commitFrame(OWNER, T0 + 1_000_000, WH, "wa", "create", whRecordValue(`at://${A}`))])
          yield* eventually(
            Effect.sync(() => fake.connections.some((c) => Array.isArray(c.options[0]?.["wantedDids"]))),
            "direct"
          )
          const directs = () => fake.connections.filter((c) => Array.isArray(c.options[0]?.["wantedDids"]))
          const before = directs().length
          // a registration for B and, right after it, a post by B that the current direct filter misses
          fake.publish([
            commitFrame(OWNER, T0 + 5_000_000, WH, "wb", "create", whRecordValue(`at://${B}`)),
            commitFrame(B, T0 + 5_000_500, POST, "bpost", "create")
          ])
          yield* eventually(Effect.sync(() => directs().length > before), "direct reconnected")
          const latest = directs().at(-1)!
          expect(latest.cursor).toBeDefined()
          expect(latest.cursor! <= BigInt(T0 + 5_000_000) - 2_000_000n).toBe(true)
          expect(latest.options[0]?.["wantedDids"]).toEqual([A, B, OWNER].sort())
          const outbox = yield* Outbox.MemoryOutboxState
          yield* eventually(
            Effect.map(
              Ref.get(outbox),
              (s) => [...s.rows.values()].some((r) => r.eventRkey === "bpost" && r.webhookRkey === "wb")
            ),
            "B's post delivered"
          )
        })
      ),
    { timeout: 60_000 }
  )
})

describe("Intake on the relay firehose (subscribeRepos)", () => {
  it.scopedLive(
    "an #info frame (OutdatedCursor: events before the relay's window were missed) is logged with its name, rate-limited; the stream goes on",
    () =>
      Effect.gen(function*() {
        const frames = yield* Effect.promise(() => import("./frames.js"))
        const sockets: Array<(b: Uint8Array) => void> = []
        const { port } = yield* relayServer((socket) => sockets.push((b) => socket.send(b)))
        const lines = yield* Ref.make<ReadonlyArray<{ message: unknown; name: unknown }>>([])
        const logger = Logger.make(({ annotations, message }) => {
          Effect.runSync(
            Ref.update(
              lines,
              (xs) => [...xs, { message, name: HashMap.get(annotations, "name").pipe(Option.getOrUndefined) }]
            )
          )
        })
        const config = relayConfig(port)
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make({ tuning: fastTuning(512, 128) })
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => sockets.length === 1), "connected")
          sockets[0]!(frames.infoFrame("OutdatedCursor"))
          sockets[0]!(frames.infoFrame("OutdatedCursor"))
          sockets[0]!(frames.identityFrame(5))
          const cursors = yield* CursorStore.CursorStore
          yield* eventually(
            Effect.map(cursors.load("relay", `ws://127.0.0.1:${port}`), (c) => c === 5n),
            "the next frame committed"
          )
          const infos = (yield* Ref.get(lines)).filter((l) => l.name === "OutdatedCursor")
          expect(infos).toHaveLength(1)
          expect(String(infos[0]?.message)).toContain("info")
        }).pipe(
          Effect.provide(Layer.merge(memoryStack({ config }), Logger.replace(Logger.defaultLogger, logger)))
        )
      }),
    { timeout: 60_000 }
  )
  it.scopedLive(
    "one `relay` stream writes the registry and matches everything; cursor = seq; FutureCursor resets to live",
    () =>
      Effect.gen(function*() {
        const frames = yield* Effect.promise(() => import("./frames.js"))
        const OWNER = frames.DID
        const connections: Array<{ cursor: string | null; send: (b: Uint8Array) => void }> = []
        const { dropAll, port } = yield* relayServer((socket, req) => {
          const url = new URL(req.url ?? "/", "ws://x")
          expect(url.pathname).toBe("/xrpc/com.atproto.sync.subscribeRepos")
          connections.push({ cursor: url.searchParams.get("cursor"), send: (b) => socket.send(b) })
        })
        const config = relayConfig(port)
        yield* Effect.gen(function*() {
          const intake = yield* Intake.make({ tuning: fastTuning(512, 128) })
          yield* Effect.forkScoped(intake.run)
          yield* eventually(Effect.sync(() => connections.length === 1), "connected")
          expect(connections[0]?.cursor).toBeNull()
          const wh = whRecordValue(`at://${OWNER}/app.bsky.feed.post`)
          connections[0]!.send(
            frames.commitFrame({
              seq: 10,
              rev: "3l3qo2vutsw2b",
              ops: [{ action: "create", path: `${WH}/hook`, record: wh }]
            })
          )
          connections[0]!.send(
            frames.commitFrame({
              seq: 11,
              rev: "3l3qo2vutsw2c",
              ops: [{
                action: "create",
                path: "app.bsky.feed.post/p1",
                record: { $type: "app.bsky.feed.post", text: "hi" }
              }]
            })
          )
          const outbox = yield* Outbox.MemoryOutboxState
          yield* eventually(
            Effect.map(Ref.get(outbox), (s) => [...s.rows.values()].some((r) => r.eventRkey === "p1")),
            "post enqueued"
          )
          const cursors = yield* CursorStore.CursorStore
          expect(yield* cursors.load("relay", `ws://127.0.0.1:${port}`)).toBe(11n)
          // the relay drops us; we come back from seq 11 exactly (this process's position)
          dropAll()
          yield* eventually(Effect.sync(() => connections.length === 2), "reconnected")
          expect(connections[1]?.cursor).toBe("11")
          // FutureCursor: the next connection is live (no cursor)
          connections[1]!.send(frames.errorFrame("FutureCursor"))
          yield* eventually(Effect.sync(() => connections.length === 3), "reconnected after FutureCursor")
          expect(connections[2]?.cursor).toBeNull()
        }).pipe(Effect.provide(memoryStack({ config })))
      }),
    { timeout: 60_000 }
  )
})
