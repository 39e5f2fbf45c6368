/**
 * Issue 14 item 5 as operators meet it (SPEC §5.3): a real `bun src/main.ts` reconciling an
 * operator-listed owner whose PDS answers a first `listRecords` page with no records but a cursor.
 * The cursor is followed, so the webhook on the next page stays (it used to end the snapshot, and
 * completion deleted and tombstoned the webhook). A local PLC directory and PDS (one HTTP server),
 * a local Jetstream, a fresh database.
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, startDeployment } from "../support/e2e.js"
import { didDoc } from "../support/fakeAtproto.js"
import { startFakeJetstream, tidAt } from "../support/fakeJetstream.js"
import { exitWithin, waitFor } from "../support/proc.js"

const OWNER = "did:plc:emptypagecursorowneraaaa"
const WH = "place.wisp.v2.wh"
const T0 = 1_700_000_000_000_000

const res = e2eResources()
afterAll(() => res.cleanup())

interface Pds {
  readonly url: string
  /** `plain`: the hook on the first page; `emptyFirst`: an empty first page with a cursor, the hook next */
  mode: "plain" | "emptyFirst"
  rev: string
  readonly cursors: Array<string | null>
  readonly close: () => Promise<void>
}

/** PLC directory and PDS for OWNER, on one server (the reference PDS's paging otherwise). */
const startAtproto = async (): Promise<Pds> => {
  const state = { mode: "plain" as Pds["mode"], rev: tidAt(T0), cursors: [] as Array<string | null> }
  let base = ""
  const server = Http.createServer((req, res) => {
    const u = new URL(req.url ?? "/", "http://x")
    const send = (status: number, value: unknown) => {
      const body = JSON.stringify(value)
      res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
      res.end(body)
    }
    if (u.pathname === `/${OWNER}`) return send(200, didDoc(OWNER, base))
    if (u.pathname === "/xrpc/com.atproto.sync.getLatestCommit") return send(200, { cid: "bafycommit", rev: state.rev })
    if (u.pathname !== "/xrpc/com.atproto.repo.listRecords") return send(404, { error: "MethodNotImplemented" })
    const cursor = u.searchParams.get("cursor")
    state.cursors.push(cursor)
    const hook = {
      uri: `at://${OWNER}/${WH}/w`,
      cid: "bafyhookw",
      value: {
        $type: WH,
        scope: { aturi: `at://${OWNER}/app.bsky.feed.post` },
        url: "https://receiver.example/hook",
        createdAt: "2026-01-01T00:00:00Z"
      }
    }
    if (cursor === "w") return send(200, { records: [] })
    if (state.mode === "emptyFirst" && cursor === null) return send(200, { records: [], cursor: "c1" })
    return send(200, { records: [hook], cursor: "w" })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  return Object.assign(state, {
    url: base,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  })
}

/** Start, wait for the end of the initial backfill (phase `live`), run `check`, stop cleanly. */
const runUntilLive = async (env: Record<string, string>, check: () => Promise<void>) => {
  const d = await startDeployment(res.tempDir(), env)
  try {
    let phase: unknown
    for (let i = 0; i < 600 && phase !== "live"; i++) {
      const health = await waitFor(d.health, 200, d.running, 60_000)
      phase = ((await health.json()) as { phase?: unknown }).phase
      if (phase !== "live") await new Promise((r) => setTimeout(r, 100))
    }
    expect(phase).toBe("live")
    await check()
  } finally {
    d.running.child.kill("SIGTERM")
  }
  expect((await exitWithin(d.running, 15_000)).code).toBe(0)
}

describe("reconciliation end to end", () => {
  it(
    "an empty listRecords page with a cursor does not end the snapshot: the webhook on the next page stays",
    async () => {
      const pds = await startAtproto()
      const js = await startFakeJetstream()
      try {
        const db = await res.freshDb()
        const env = {
          DATABASE_URL: db,
          NODE_ENV: "test",
          WEBHOOK_ALLOW_INSECURE_DEV: "1",
          JETSTREAM_URL: js.url,
          PLC_DIRECTORY_URL: pds.url,
          BACKFILL_OWNERS: OWNER
        }
        const rows = () => query<{ rkey: string }>(db, "SELECT rkey FROM webhooks WHERE owner_did = $1", [OWNER])
        const stones = () => query<{ rkey: string }>(db, "SELECT rkey FROM tombstones WHERE owner_did = $1", [OWNER])
        const status = async () =>
          (await query<{ s: string }>(db, "SELECT reconcile_status AS s FROM owners WHERE did = $1", [OWNER]))[0]?.s
        // first start: the hook is on the first page
        await runUntilLive(env, async () => {
          expect(await status()).toBe("complete")
          expect((await rows()).map((r) => r.rkey)).toEqual(["w"])
        })
        // the owner's repo moved on (a newer rev), and its PDS now answers an empty first page with
        // a cursor; the next start's sweep reconciles the owner again
        pds.mode = "emptyFirst"
        pds.rev = tidAt(T0 + 1_000_000)
        pds.cursors.length = 0
        await runUntilLive(env, async () => {
          expect(await status()).toBe("complete")
          expect((await rows()).map((r) => r.rkey)).toEqual(["w"])
          expect(await stones()).toEqual([])
          expect(pds.cursors).toEqual([null, "c1", "w"])
        })
      } finally {
        await js.close()
        await pds.close()
      }
    },
    180_000
  )
})
