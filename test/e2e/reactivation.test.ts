/**
 * An account's reactivation reconciles its owner (docs/decisions.md, "A deactivated account
 * answers"), on the real local atproto network: `@atproto/dev-env`'s PDS and PLC, firehook as in
 * production (`bun src/main.ts`) on the PDS's `subscribeRepos` (relay source) and a receiver that
 * verifies the signatures. Both scans (the webhook removed while the account is deactivated, and
 * back when it is active again) are requested by the `#account` events themselves: no CLI, no sweep.
 *
 * Measured on this PDS (`@atproto/pds` of `@atproto/dev-env`): `deactivateAccount` emits
 * `#account active=false status=deactivated`, and listRecords then answers `400 "Could not find
 * repo"`; `activateAccount` emits `#account active=true` (no status), followed by `#identity` and
 * `#sync`. The test asserts what firehook does with those real events.
 */
import { Effect, Scope } from "effect"
import { randomBytes } from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Received, type Receiver, receiver } from "../delivery/worker-support.js"
import {
  type Account,
  createAccount,
  createRecord,
  type Devnet,
  devnetFirehookEnv,
  nowIso,
  startDevnet,
  WH
} from "../support/devnet.js"
import { closeDevnetFile, type Deployment, e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { waitFor } from "../support/proc.js"

const res = e2eResources()
const KEY = randomBytes(32).toString("base64")
const scope = Effect.runSync(Scope.make())
let devnet: Devnet
let db: string
let firehook: Deployment
const secrets = new Map<string, string>()
let rx: Receiver

const env = () =>
  devnetFirehookEnv(devnet, db, {
    WEBHOOK_SECRET_ENCRYPTION_KEY: KEY,
    // the reactivation's scan comes from the RetryScheduler's next round: one a second here
    RETRY_SCHEDULER_INTERVAL_MS: "1000",
    // the stamp's log line ("owner reconciliation requested …") is at info
    LOG_LEVEL: "info"
  })

beforeAll(async () => {
  devnet = await startDevnet()
  db = await res.freshDb()
  rx = await Effect.runPromise(
    Scope.extend(receiver({ reply: () => ({ status: 200, body: "ok" }), secretFor: (uri) => secrets.get(uri) }), scope)
  )
  firehook = await startDeployment(res.tempDir(), env())
  await waitFor(firehook.health, 200, firehook.running, 60_000)
}, 120_000)

afterAll(() => closeDevnetFile({ firehook, devnet, scope, res }), 60_000)

const bodyOf = (r: Received) => JSON.parse(r.body.toString("utf8")) as Record<string, unknown>
const logs = () => firehook.running.stdout().slice(-4000)

interface WebhookRow {
  readonly cid: string | null
  readonly active: boolean
}

const webhookRow = async (owner: Account, rkey: string): Promise<WebhookRow | undefined> =>
  (await query<WebhookRow>(db, "SELECT cid, active FROM webhooks WHERE owner_did = $1 AND rkey = $2", [
    owner.did,
    rkey
  ]))[0]

interface OwnerRow {
  readonly reconcile_status: string
  readonly reconcile_requested_at: Date | null
}

const ownerRow = async (owner: Account): Promise<OwnerRow | undefined> =>
  (await query<OwnerRow>(db, "SELECT reconcile_status, reconcile_requested_at FROM owners WHERE did = $1", [
    owner.did
  ]))[0]

/** Wait until the owner's requested scan has completed and its request is cleared. */
const ownerScanned = (owner: Account, what: string) =>
  waitUntil(
    async () => {
      const row = await ownerRow(owner)
      return row?.reconcile_status === "complete" && row.reconcile_requested_at === null
    },
    30_000,
    what,
    async () => JSON.stringify(await ownerRow(owner))
  )

const post = (account: Account, text: string) =>
  createRecord(account, "app.bsky.feed.post", { text, createdAt: nowIso() })

describe("an account's reactivation on a real atproto network", () => {
  it(
    "deactivated: its webhook is removed by itself; reactivated: the webhook comes back by itself and delivers",
    async () => {
      const hana = await createAccount(devnet, "hana")
      const path = "/hana"
      const uri = `at://${hana.did}/${WH}/posts`
      secrets.set(uri, "hana-secret-0123456789")
      const ref = await createRecord(hana, WH, {
        createdAt: nowIso(),
        scope: { aturi: `at://${hana.did}/app.bsky.feed.post` },
        url: `${rx.url}${path}`,
        secret: "hana-secret-0123456789"
      }, "posts")
      await waitUntil(async () => (await webhookRow(hana, "posts"))?.cid === ref.cid, 30_000, "registered", logs)
      const before = await post(hana, "before")
      await waitUntil(
        () => rx.received.some((r) => r.path === path && bodyOf(r)["rkey"] === before.rkey),
        30_000,
        "the first delivery",
        logs
      )

      // deactivated: `#account active=false` stamps the owner, and the RetryScheduler's scan finds
      // "Could not find repo" and removes the webhook, with no CLI and no sweep
      await hana.agent.com.atproto.server.deactivateAccount({})
      await waitUntil(
        async () => (await webhookRow(hana, "posts")) === undefined,
        30_000,
        "the webhook removed after the deactivation",
        logs
      )
      await ownerScanned(hana, "the owner complete after the deactivation's scan")

      // reactivated: `#account active=true` stamps the owner and the RetryScheduler reconciles it,
      // with no CLI and no sweep
      await hana.agent.com.atproto.server.activateAccount()
      await waitUntil(
        async () => {
          const row = await webhookRow(hana, "posts")
          return row?.cid === ref.cid && row.active
        },
        30_000,
        "the webhook back after the reactivation",
        logs
      )
      await ownerScanned(hana, "the owner complete, its request cleared")
      expect(firehook.running.stdout()).toContain("owner reconciliation requested (account status or repo sync)")

      // and the watched DID's new post is delivered, signed
      const after = await post(hana, "after")
      await waitUntil(
        () => rx.received.some((r) => r.path === path && bodyOf(r)["rkey"] === after.rkey),
        30_000,
        "a delivery after the reactivation",
        logs
      )
      const got = rx.received.filter((r) => r.path === path)
      expect(got.map((r) => bodyOf(r)["rkey"])).toEqual([before.rkey, after.rkey])
      for (const r of got) {
        expect(r.verified).toEqual({ standard: true, wisp: true })
        expect(r.headers["x-firehook-webhook"]).toBe(uri)
      }
    },
    120_000
  )
})
