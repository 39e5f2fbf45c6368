/**
 * The owners' API end to end on the real local atproto network (`@atproto/dev-env`: a real PDS and
 * PLC) with firehook as in production (`bun src/main.ts`): tokens are minted by the real PDS
 * (`com.atproto.server.getServiceAuth`, aud = the service DID, lxm = the method) for real accounts.
 * An owner creates a secret over XRPC, writes a hook with that `secretId`, a post is delivered
 * signed with it (both signatures verified: the `standardwebhooks` library and an HMAC check),
 * the owner reads the delivery in its log with the attempt's receiver status and response excerpt,
 * rotates it, and the next deliveries verify with the new token only. The service's whole log
 * output (at debug level) holds no token, no secret value and no receiver URL.
 */
import { Effect, Exit, Scope } from "effect"
import { createHmac } from "node:crypto"
import { randomBytes } from "node:crypto"
import { Webhook } from "standardwebhooks"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { openTailOrDie, until } from "../api/tailClient.js"
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
import { type Deployment, e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { exitWithin, freePort, waitFor } from "../support/proc.js"

const SERVICE_DID = "did:web:firehook.test"
const res = e2eResources()
const KEY = randomBytes(32).toString("base64")
const scope = Effect.runSync(Scope.make())
let devnet: Devnet
let db: string
let firehook: Deployment
let api: string
let rx: Receiver
/** the current secret of each webhook, by its AT-URI, for the receiver's verification */
const secrets = new Map<string, string>()
/** every service token the PDS minted in this test (none may appear in a log) */
const tokens: Array<string> = []

beforeAll(async () => {
  devnet = await startDevnet()
  db = await res.freshDb()
  rx = await Effect.runPromise(Scope.extend(receiver({ secretFor: (uri) => secrets.get(uri) }), scope))
  const apiPort = await freePort()
  api = `http://127.0.0.1:${apiPort}`
  firehook = await startDeployment(
    res.tempDir(),
    devnetFirehookEnv(devnet, db, {
      WEBHOOK_SECRET_ENCRYPTION_KEY: KEY,
      SERVICE_DID,
      API_PORT: String(apiPort),
      LOG_LEVEL: "debug"
    })
  )
  await waitFor(firehook.health, 200, firehook.running, 60_000)
}, 120_000)

afterAll(async () => {
  if (firehook !== undefined && firehook.running.child.exitCode === null) {
    firehook.running.child.kill("SIGKILL")
  }
  await devnet?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await res.cleanup()
}, 60_000)

/** A token for `lxm` minted by the account's own PDS (60 s, as the owners' CLI asks for). */
const serviceToken = async (account: Account, lxm: string): Promise<string> => {
  const r = await account.agent.com.atproto.server.getServiceAuth({
    aud: SERVICE_DID,
    lxm,
    exp: Math.floor(Date.now() / 1000) + 60
  })
  tokens.push(r.data.token)
  return r.data.token
}

const xrpc = async (
  account: Account,
  nsid: string,
  body?: unknown,
  token?: string,
  params?: Record<string, string>
) => {
  const t = token ?? (await serviceToken(account, nsid))
  const query = params === undefined ? "" : `?${new URLSearchParams(params).toString()}`
  const r = await fetch(`${api}/xrpc/${nsid}${query}`, {
    method: body === undefined ? "GET" : "POST",
    headers: { authorization: `Bearer ${t}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: JSON.stringify(body) })
  })
  return { status: r.status, body: (await r.json()) as Record<string, unknown> }
}

const at = (path: string): Array<Received> => rx.received.filter((r) => r.path === path)
const rkeyOf = (r: Received) => (JSON.parse(r.body.toString("utf8")) as { rkey: string }).rkey

/** Both signatures of a delivery, checked with `secret` (standardwebhooks, and the wisp HMAC). */
const verifiesWith = (r: Received, secret: string) => {
  const plain: Record<string, string> = {}
  for (const [k, v] of Object.entries(r.headers)) if (typeof v === "string") plain[k] = v
  let standard = true
  try {
    new Webhook(secret).verify(r.body.toString("utf8"), plain)
  } catch {
    standard = false
  }
  const hmac = "sha256=" + createHmac("sha256", Buffer.from(secret, "utf8")).update(r.body).digest("hex")
  return { standard, wisp: r.headers["x-webhook-signature"] === hmac }
}

const post = (account: Account, text: string) =>
  createRecord(account, "app.bsky.feed.post", { text, createdAt: nowIso() })

describe("the owners' API on a real atproto network", () => {
  it(
    "secrets over XRPC with PDS-minted tokens: create, sign, rotate; isolation; nothing secret in the logs",
    async () => {
      const alice = await createAccount(devnet, "alice")
      const bob = await createAccount(devnet, "bob")

      // create: the token is shown once
      const created = await xrpc(alice, "place.wisp.v2.secret.create", { name: "main" })
      expect(created.status).toBe(200)
      expect(created.body).toMatchObject({ name: "main", token: expect.stringMatching(/^whsec_/) })
      const first = String(created.body["token"])

      // a hook with that secretId, and a post delivered signed with it
      const path = "/alice"
      const uri = `at://${alice.did}/${WH}/hook`
      secrets.set(uri, first)
      const ref = await createRecord(alice, WH, {
        scope: { aturi: `at://${alice.did}/app.bsky.feed.post` },
        url: `${rx.url}${path}`,
        secretId: "main",
        createdAt: nowIso()
      }, "hook")
      await waitUntil(
        async () =>
          (await query<{ cid: string }>(db, "SELECT cid FROM webhooks WHERE owner_did = $1 AND rkey = $2", [
            alice.did,
            "hook"
          ]))[0]?.cid === ref.cid,
        30_000,
        "the hook registered",
        () => firehook.running.stdout().slice(-3000)
      )
      const before = await post(alice, "signed with the first token")
      await waitUntil(() => at(path).length >= 1, 30_000, "the first delivery")
      const d1 = at(path)[0] as Received
      expect(rkeyOf(d1)).toBe(before.rkey)
      expect(d1.verified).toEqual({ standard: true, wisp: true })
      expect(verifiesWith(d1, first)).toEqual({ standard: true, wisp: true })

      // the owner's delivery log: the delivery, and its attempt with the receiver's status and answer
      const listDeliveries = (who: Account) =>
        xrpc(who, "dev.firehook.webhook.listDeliveries", undefined, undefined, { rkey: "hook" })
      await waitUntil(
        async () => {
          const l = (await listDeliveries(alice)).body["deliveries"] as Array<{ status: string }> | undefined
          return l?.some((d) => d.status === "delivered") === true
        },
        30_000,
        "the delivery recorded as delivered"
      )
      const logged = await listDeliveries(alice)
      expect(logged.status).toBe(200)
      const rows = logged.body["deliveries"] as Array<{ id: string; event: { rkey: string } }>
      const row = rows.find((d) => d.event.rkey === before.rkey)
      expect(row).toMatchObject({
        rkey: "hook",
        status: "delivered",
        attempts: 1,
        event: { operation: "create", did: alice.did, collection: "app.bsky.feed.post", rkey: before.rkey }
      })
      const id = String(row?.id)
      const detail = await xrpc(alice, "dev.firehook.webhook.getDelivery", undefined, undefined, { id })
      expect(detail.status).toBe(200)
      expect(detail.body["attempts"]).toEqual([
        expect.objectContaining({ n: 1, outcome: "delivered", httpStatus: 200, responseExcerpt: "ok" })
      ])
      // bob: alice's delivery id answers exactly as an unknown one, and his log is empty
      const bobShows = await xrpc(bob, "dev.firehook.webhook.getDelivery", undefined, undefined, { id })
      const unknown = await xrpc(bob, "dev.firehook.webhook.getDelivery", undefined, undefined, { id: "whd_v1_x" })
      expect(bobShows).toEqual(unknown)
      expect([bobShows.status, bobShows.body["error"]]).toEqual([400, "NotFound"])
      expect(await listDeliveries(bob)).toEqual({ status: 200, body: { deliveries: [] } })

      // isolation: bob sees and touches nothing of alice's
      expect(await xrpc(bob, "place.wisp.v2.secret.list")).toEqual({ status: 200, body: { secrets: [] } })
      const bobRotates = await xrpc(bob, "place.wisp.v2.secret.rotate", { name: "main" })
      expect([bobRotates.status, bobRotates.body["error"]]).toEqual([400, "NotFound"])

      // rotate: the next deliveries verify with the new token only
      const rotated = await xrpc(alice, "place.wisp.v2.secret.rotate", { name: "main" })
      expect(rotated.status).toBe(200)
      const second = String(rotated.body["token"])
      expect(second).toMatch(/^whsec_/)
      expect(second).not.toBe(first)
      secrets.set(uri, second)
      // the worker's secret cache keeps a token at most 10 s: post until one is signed with the new token
      let from: number | undefined
      for (let i = 0; i < 30 && from === undefined; i++) {
        const n = at(path).length
        await post(alice, `after rotation ${i}`)
        await waitUntil(() => at(path).length > n, 30_000, "a delivery after the rotation")
        const last = at(path)[at(path).length - 1] as Received
        if (last.verified?.standard === true && last.verified.wisp) from = at(path).length - 1
        else await new Promise((r) => setTimeout(r, 1000))
      }
      expect(from).toBeDefined()
      const after = await post(alice, "well after the rotation")
      await waitUntil(() => at(path).some((r) => rkeyOf(r) === after.rkey), 30_000, "the last delivery")
      for (const r of at(path).slice(from)) {
        expect(verifiesWith(r, second)).toEqual({ standard: true, wisp: true })
        expect(verifiesWith(r, first)).toEqual({ standard: false, wisp: false })
      }

      // list: names and times, never a token
      const listed = await xrpc(alice, "place.wisp.v2.secret.list")
      expect(listed).toEqual({
        status: 200,
        body: {
          secrets: [{ name: "main", createdAt: created.body["createdAt"], lastRotatedAt: rotated.body["rotatedAt"] }]
        }
      })

      // a token used twice is refused the second time
      const once = await serviceToken(alice, "place.wisp.v2.secret.list")
      expect((await xrpc(alice, "place.wisp.v2.secret.list", undefined, once)).status).toBe(200)
      const replayed = await xrpc(alice, "place.wisp.v2.secret.list", undefined, once)
      expect([replayed.status, replayed.body["error"]]).toEqual([401, "InvalidToken"])
      // a token for another method is refused
      const other = await serviceToken(alice, "place.wisp.v2.secret.list")
      const wrong = await xrpc(alice, "place.wisp.v2.secret.delete", { name: "main" }, other)
      expect([wrong.status, wrong.body["error"]]).toEqual([401, "InvalidToken"])

      // health counts the calls
      const health = (await (await fetch(firehook.health)).json()) as { api: Record<string, unknown> }
      expect(health.api).toMatchObject({ configured: true, authFailures: 2 })

      // shutdown: clean, and the API stops listening; an open live tail is closed as going away
      const tailToken = await serviceToken(alice, "dev.firehook.webhook.subscribeDeliveries")
      const tail = await Effect.runPromise(openTailOrDie(Number(new URL(api).port), tailToken))
      firehook.running.child.kill("SIGTERM")
      expect((await exitWithin(firehook.running, 20_000)).code).toBe(0)
      await Effect.runPromise(until("the tail closed", () => tail.closed !== undefined))
      expect(tail.closed).toEqual({ code: 1001, reason: "shutdown" })
      await expect(fetch(`${api}/xrpc/place.wisp.v2.secret.list`)).rejects.toThrow()

      // nothing secret in the logs (debug level): no service token, no secret value, no receiver URL
      const logs = firehook.running.stdout() + firehook.running.stderr()
      expect(logs).toContain("api server listening")
      expect(logs).toContain("api call")
      for (const t of tokens) {
        expect(logs).not.toContain(t)
        expect(logs).not.toContain(t.split(".")[2] ?? t)
      }
      for (const s of [first, second]) expect(logs).not.toContain(s)
      expect(logs).not.toContain("whsec_")
      expect(logs).not.toContain(rx.url)
      expect(logs).not.toContain(`127.0.0.1:${rx.port}`)
    },
    240_000
  )
})
