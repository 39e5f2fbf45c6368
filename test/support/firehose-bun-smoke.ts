/**
 * Smoke check of the firehose decoders (and the WebSocket source) under Bun, the production runtime:
 * `node_modules/.bin/bun test/support/firehose-bun-smoke.ts` prints `ok` and exits 0, or prints the
 * failure and exits 1. Run by test/firehose/bun.test.ts.
 */
import { Chunk, Effect, Either, Stream } from "effect"
import { WebSocketServer } from "ws"
import { decodeJetstreamFrame } from "../../src/schemas/Jetstream.js"
import { decodeRelayFrame } from "../../src/schemas/RelayFrame.js"
import { connectJetstream, connectRelay } from "../../src/services/intake/FirehoseSource.js"
import { commitFrame, jetstreamCreate, richRecord, richRecordJson } from "../intake/frames.js"

const ctx = { stream: "smoke", relay: "wss://relay.example", maxBytes: 1 << 20 }
const T = 1725911162329308

const same = (a: unknown, b: unknown): boolean => {
  const canon = (v: unknown): unknown =>
    Array.isArray(v)
      ? v.map(canon)
      : typeof v === "object" && v !== null
      ? Object.fromEntries(Object.keys(v).sort().map((k) => [k, canon((v as Record<string, unknown>)[k])]))
      : v
  return JSON.stringify(canon(a)) === JSON.stringify(canon(b))
}

const check = (cond: boolean, what: string): void => {
  if (!cond) {
    console.log(`FAIL: ${what}`)
    process.exit(1)
  }
}

// 1. one relay frame
const relay = decodeRelayFrame(
  commitFrame({ seq: 7, ops: [{ action: "create", path: "app.bsky.feed.post/3l3qo2vuowo2b", record: richRecord() }] }),
  ctx
)
check(Either.isRight(relay), "relay frame decodes")
if (Either.isRight(relay) && relay.right.kind === "events") {
  const e = relay.right.events[0]
  check(relay.right.seq === 7n, "relay seq")
  check(
    e !== undefined && e.kind === "commit" && same(e.record, richRecordJson()),
    "relay record in the JSON data model"
  )
} else {
  check(false, "relay frame kind")
}

// 2. one Jetstream frame
const js = decodeJetstreamFrame(jetstreamCreate(T, "3l3qo2vuowo2b", richRecordJson()), ctx)
check(Either.isRight(js), "jetstream frame decodes")
if (Either.isRight(js)) {
  check(js.right.cursor === BigInt(T), "jetstream cursor")
  check(js.right.event?.kind === "commit" && same(js.right.event.record, richRecordJson()), "jetstream record")
}

// 3. both sources over Bun's global WebSocket
const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 })
await new Promise<void>((resolve) => wss.once("listening", () => resolve()))
wss.on("connection", (socket, req) => {
  if ((req.url ?? "").startsWith("/subscribe")) {
    socket.once("message", () => {
      socket.send(jetstreamCreate(T, "r1"))
      socket.send(jetstreamCreate(T + 1, "r2"))
      socket.close(1000)
    })
  } else {
    socket.send(
      commitFrame({ seq: 8, ops: [{ action: "create", path: "app.bsky.feed.post/k", record: richRecord() }] })
    )
    socket.close(1000)
  }
})
const address = wss.address()
const port = typeof address === "object" && address !== null ? address.port : 0
const common = { ...ctx, connectTimeoutMs: 5000, allowInsecure: true, cursor: 5n }

const program = Effect.gen(function*() {
  const jsItems = yield* connectJetstream({
    ...common,
    url: `ws://127.0.0.1:${port}/subscribe`,
    wantedDids: ["did:plc:eygmaihciaxprqvxpfvl6flk"]
  })
    .pipe(Stream.either, Stream.runCollect, Effect.map(Chunk.toReadonlyArray))
  check(jsItems.length === 3, `jetstream over a socket: ${jsItems.length} items`)
  const relayItems = yield* connectRelay({ ...common, url: `ws://127.0.0.1:${port}` })
    .pipe(Stream.either, Stream.runCollect, Effect.map(Chunk.toReadonlyArray))
  check(relayItems.length === 2, `relay over a socket: ${relayItems.length} items`)
  const first = relayItems[0]
  check(
    first !== undefined && Either.isRight(first) && Either.isRight(first.right) &&
      first.right.right.kind === "events" &&
      same(
        first.right.right.events[0]?.kind === "commit" ? first.right.right.events[0].record : undefined,
        richRecordJson()
      ),
    "relay record over a socket"
  )
})

await Effect.runPromise(program)
wss.close()
console.log("ok")
process.exit(0)
