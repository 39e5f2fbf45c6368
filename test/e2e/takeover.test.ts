/**
 * Intake takeover keeps prior references (SPEC §6.4, §2.4), as operators meet it: two
 * `bun src/main.ts` replicas on one PostgreSQL database and a local Jetstream. Alice likes Bob's
 * post, the intake leader is SIGKILLed, the standby takes over, Alice deletes the like: Bob's
 * backlink webhook receives the delete.
 */
import * as Http from "node:http"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, type Connection, type FakeJetstream, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, waitFor } from "../support/proc.js"

const ALICE = "did:plc:aliceealiceealiceealicee"
const BOB = "did:plc:bobbbbbobbbbbobbbbbobbbb"
const T0 = 1_750_000_000_000_000
const WH = "place.wisp.v2.wh"
const POST = "app.bsky.feed.post"
const LIKE = "app.bsky.feed.like"
const bobPost = `at://${BOB}/${POST}/3kbobpost`

const res = e2eResources()
afterAll(() => res.cleanup())

interface Received {
  readonly path: string
  readonly body: Record<string, unknown>
}

/** a receiver on 127.0.0.1 that answers 200 and records every body */
const startReceiver = () =>
  new Promise<{ port: number; received: Array<Received>; close: () => Promise<void> }>((resolve) => {
    const received: Array<Received> = []
    const server = Http.createServer((req, res) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        received.push({ path: req.url ?? "", body: JSON.parse(Buffer.concat(chunks).toString("utf8")) })
        res.writeHead(200, { "content-type": "text/plain" }).end("ok")
      })
    })
    server.listen(0, "127.0.0.1", () => {
      const addr = server.address()
      const port = typeof addr === "object" && addr !== null ? addr.port : 0
      resolve({
        port,
        received,
        close: () =>
          new Promise<void>((r) => {
            server.closeAllConnections()
            server.close(() => r())
          })
      })
    })
  })

const start = (db: string, js: FakeJetstream) =>
  startDeployment(res.tempDir(), {
    DATABASE_URL: db,
    NODE_ENV: "test",
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    JETSTREAM_URL: js.url,
    DELIVERY_RETRY_BASE_MS: "200",
    DELIVERY_RETRY_MAX_MS: "1000"
  })

const role = async (port: number): Promise<string | undefined> => {
  try {
    const r = await fetch(`http://127.0.0.1:${port}/health`, { signal: AbortSignal.timeout(2000) })
    return ((await r.json()) as { intake?: { role?: string } }).intake?.role
  } catch {
    return undefined
  }
}

/** the backlink stream's connection: its hello filters on neither collections nor DIDs */
const isBacklink = (c: Connection) => {
  const o = c.options.at(-1)
  if (o === undefined) return false
  const cols = o["wantedCollections"]
  return !Array.isArray(o["wantedDids"]) && !(Array.isArray(cols) && cols.length > 0)
}

describe("intake takeover", () => {
  it(
    "Alice likes Bob's post, the leader is SIGKILLed, the standby takes over, Alice deletes the like: Bob's backlink hook gets the delete",
    async () => {
      const js = await startFakeJetstream()
      const rx = await startReceiver()
      const db = await res.freshDb()
      js.publish([
        commitFrame(BOB, T0, WH, "bl", "create", {
          $type: WH,
          scope: { aturi: `at://${BOB}`, backlinks: true },
          url: `http://127.0.0.1:${rx.port}/bob`,
          createdAt: "2026-01-01T00:00:00Z"
        })
      ])
      const a = await start(db, js)
      const b = await start(db, js)
      await waitFor(a.health, 200, a.running, 60_000)
      await waitFor(b.health, 200, b.running, 60_000)
      await waitUntil(
        async () => (await role(a.port)) === "leader" || (await role(b.port)) === "leader",
        20_000,
        "a leader"
      )
      const [leader, standby] = (await role(a.port)) === "leader" ? [a, b] : [b, a]
      expect(await role(standby.port)).toBe("standby")
      // the leader has Bob's hook and watches the whole network for references to Bob
      await waitUntil(() => js.connections.some(isBacklink), 20_000, "the leader's backlink stream")

      const likes = (event: string) =>
        rx.received.filter((r) => r.path === "/bob" && r.body["rkey"] === "l1" && r.body["event"] === event)
      js.publish([
        commitFrame(ALICE, T0 + 10_000_000, LIKE, "l1", "create", {
          $type: LIKE,
          subject: { uri: bobPost, cid: "bafyreie5737gdxlw5i64vzichcalba3z2v5n6icifvx5xytvske7mr3hpm" },
          createdAt: "2026-01-01T00:00:00Z"
        })
      ])
      await waitUntil(() => likes("create").length > 0, 30_000, "the like delivered")
      expect(
        (await query<{ n: string }>(db, "SELECT count(*)::text AS n FROM prior_refs WHERE record_uri LIKE $1", [
          `at://${ALICE}/%`
        ]))[0]?.n
      ).toBe("1")

      const backlinkConnections = js.connections.filter(isBacklink).length
      leader.running.child.kill("SIGKILL")
      await exitWithin(leader.running, 10_000)
      await waitUntil(async () => (await role(standby.port)) === "leader", 15_000, "takeover")
      await waitUntil(
        () => js.connections.filter(isBacklink).length > backlinkConnections,
        20_000,
        "the new leader's backlink stream"
      )

      js.publish([commitFrame(ALICE, T0 + 20_000_000, LIKE, "l1", "delete")])
      await waitUntil(
        () => likes("delete").length > 0,
        30_000,
        "the delete delivered to Bob's backlink hook",
        async () =>
          JSON.stringify({
            outbox: await query(db, "SELECT event_rkey, event_operation, status FROM outbox ORDER BY created_at"),
            priorRefs: await query(db, "SELECT record_uri FROM prior_refs"),
            received: rx.received.map((r) => [r.path, r.body["rkey"], r.body["event"]])
          })
      )
      expect(likes("delete")[0]?.body).toMatchObject({ did: ALICE, collection: LIKE, rkey: "l1", event: "delete" })
      expect(likes("delete")[0]?.body["record"]).toBeUndefined()

      standby.running.child.kill("SIGTERM")
      expect((await exitWithin(standby.running, 15_000)).code).toBe(0)
      await rx.close()
      await js.close()
    },
    180_000
  )
})
