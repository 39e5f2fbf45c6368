/**
 * The in-memory registry of the intake leader follows changes made by other processes (issue 16,
 * SPEC §6.4, §5.3 step 5, §4.3 410 Gone), as operators run it: an `intake` process, a `delivery`
 * process and a `reconcile` process on one PostgreSQL database, a local Jetstream, a local PLC
 * directory and PDS, loopback receivers. The retry scheduler's round (which swaps owners completed
 * elsewhere) is an hour apart here, so only the cross-process sync can make these pass in time.
 * - The reconcile process completes an owner whose webhook exists only on its PDS: the intake
 *   process matches that webhook within seconds.
 * - A receiver answers 410 to the delivery process: the webhook is marked gone but stays in the
 *   intake leader's matching; its new matches are parked (`webhook_disabled`, no request) so that
 *   a replay after `resume` recovers them (the other webhook of the same owner goes on).
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { didDoc } from "../support/fakeAtproto.js"
import { commitFrame, startFakeJetstream, tidAt } from "../support/fakeJetstream.js"
import { exitWithin, waitFor } from "../support/proc.js"
import { startReceiver } from "../support/receiver.js"

const ALICE = "did:plc:syncaliceaaaaaaaaaaaaaaa"
const BOB = "did:plc:syncbobbbbbbbbbbbbbbbbbb"
const WH = "place.wisp.v2.wh"
const POST = "app.bsky.feed.post"
const T0 = 1_750_000_000_000_000

const res = e2eResources()
afterAll(() => res.cleanup())

/** PLC directory and PDS for ALICE on one server: her repo holds one webhook (to `url`). */
const startAtproto = async (url: string) => {
  let base = ""
  const server = Http.createServer((req, res) => {
    const u = new URL(req.url ?? "/", "http://x")
    const send = (status: number, value: unknown) => {
      const body = JSON.stringify(value)
      res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) })
      res.end(body)
    }
    if (u.pathname === `/${ALICE}`) return send(200, didDoc(ALICE, base))
    if (u.pathname.startsWith("/did:")) return send(404, { message: "DID not registered" })
    if (u.pathname === "/xrpc/com.atproto.sync.getLatestCommit") return send(200, { cid: "bafycommit", rev: tidAt(T0) })
    if (u.pathname !== "/xrpc/com.atproto.repo.listRecords") return send(404, { error: "MethodNotImplemented" })
    if (u.searchParams.get("cursor") !== null) return send(200, { records: [] })
    return send(200, {
      records: [{
        uri: `at://${ALICE}/${WH}/a1`,
        cid: "bafyhooka1",
        value: { $type: WH, scope: { aturi: `at://${ALICE}/${POST}` }, url, createdAt: "2026-01-01T00:00:00Z" }
      }],
      cursor: "a1"
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  return {
    url: base,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
}

const registryActive = async (url: string): Promise<number | undefined> => {
  try {
    const body = (await (await fetch(url, { signal: AbortSignal.timeout(2000) })).json()) as {
      registry?: { active?: number }
    }
    return body.registry?.active
  } catch {
    return undefined
  }
}

const phase = async (url: string): Promise<unknown> => {
  try {
    return ((await (await fetch(url, { signal: AbortSignal.timeout(2000) })).json()) as { phase?: unknown }).phase
  } catch {
    return undefined
  }
}

const hook = (did: string, timeUs: number, rkey: string, url: string) =>
  commitFrame(did, timeUs, WH, rkey, "create", {
    $type: WH,
    scope: { aturi: `at://${did}/${POST}` },
    url,
    createdAt: "2026-01-01T00:00:00Z"
  })

describe("registry sync across processes", () => {
  it(
    "a completion by the reconcile process reaches the intake leader's matching; a 410 parks the hook's new matches",
    async () => {
      const ok = await startReceiver()
      const gone = await startReceiver(() => ({ status: 410 }))
      const pds = await startAtproto(ok.url)
      const js = await startFakeJetstream()
      const db = await res.freshDb()
      const base = {
        DATABASE_URL: db,
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: js.url,
        PLC_DIRECTORY_URL: pds.url,
        RETRY_SCHEDULER_INTERVAL_MS: "3600000"
      }
      const intake = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "intake" })
      await waitFor(intake.health, 200, intake.running, 60_000)
      const delivery = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "delivery" })
      await waitFor(delivery.health, 200, delivery.running, 60_000)
      expect(await registryActive(intake.health)).toBe(0)

      // 1. the reconcile process finds Alice's webhook on her PDS and completes her
      const reconcile = await startDeployment(res.tempDir(), {
        ...base,
        FIREHOOK_ROLES: "reconcile",
        BACKFILL_OWNERS: ALICE
      })
      await waitUntil(
        async () =>
          (await query<{ s: string }>(db, "SELECT reconcile_status AS s FROM owners WHERE did = $1", [ALICE]))[0]?.s ===
            "complete",
        60_000,
        "Alice reconciled"
      )
      const completedAt = Date.now()
      await waitUntil(
        async () => (await registryActive(intake.health)) === 1,
        10_000,
        "the intake leader has Alice's hook"
      )
      expect(Date.now() - completedAt).toBeLessThan(10_000)
      js.publish([commitFrame(ALICE, T0 + 1_000_000, POST, "ap1", "create")])
      await waitUntil(() => ok.total() === 1, 30_000, "Alice's post delivered")
      await waitUntil(async () => (await phase(reconcile.health)) === "live", 60_000, "the reconcile process live")

      // 2. Bob's hooks come from the stream; one receiver answers 410
      js.publish([hook(BOB, T0 + 2_000_000, "g1", gone.url), hook(BOB, T0 + 2_000_001, "k1", ok.url)])
      await waitUntil(async () => (await registryActive(intake.health)) === 3, 30_000, "Bob's hooks active")
      js.publish([commitFrame(BOB, T0 + 3_000_000, POST, "bp1", "create")])
      await waitUntil(() => gone.total() === 1 && ok.total() === 2, 30_000, "Bob's first post sent to both")
      await waitUntil(
        async () =>
          (await query(db, "SELECT 1 FROM webhooks WHERE owner_did = $1 AND rkey = 'g1' AND gone_at IS NOT NULL", [
            BOB
          ]))
            .length === 1,
        30_000,
        "g1 marked gone"
      )
      // gone only affects delivery (SPEC §4.3): g1 stays in the intake leader's matching, and its
      // new match is enqueued and parked as a dead letter (webhook_disabled) without a request
      expect(await registryActive(intake.health)).toBe(3)
      js.publish([commitFrame(BOB, T0 + 4_000_000, POST, "bp2", "create")])
      await waitUntil(() => ok.total() === 3, 30_000, "Bob's second post delivered to k1")
      await waitUntil(
        async () =>
          (await query(
            db,
            `SELECT 1 FROM outbox WHERE owner_did = $1 AND event_rkey = 'bp2' AND webhook_rkey = 'g1'
              AND status = 'dead_letter' AND last_error_kind = 'webhook_disabled' AND attempt_count = 0`,
            [BOB]
          )).length === 1,
        30_000,
        "Bob's second post parked for g1"
      )
      expect(
        await query(db, "SELECT webhook_rkey FROM outbox WHERE owner_did = $1 AND event_rkey = 'bp2' ORDER BY 1", [BOB])
      ).toEqual([{ webhook_rkey: "g1" }, { webhook_rkey: "k1" }])
      expect(gone.total()).toBe(1)

      for (const d of [reconcile, delivery, intake]) {
        d.running.child.kill("SIGTERM")
        expect((await exitWithin(d.running, 20_000)).code).toBe(0)
      }
      await js.close()
      await pds.close()
      await ok.close()
      await gone.close()
    },
    240_000
  )
})
