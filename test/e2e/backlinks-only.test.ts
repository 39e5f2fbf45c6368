/**
 * End to end on a real atproto network (`@atproto/dev-env`: a real PDS and PLC) with firehook as in
 * production (`bun src/main.ts`, the PDS's `subscribeRepos` as its relay):
 * - `scope.backlinksOnly` (SPEC §1, §2.2): Bob's hook gets Alice's like of his post, never his post;
 *   `{backlinks: false, backlinksOnly: true}` is refused and counted;
 * - large response bodies (SPEC §4.3, §4.5): a receiver answering 200 with 100 KiB is delivered.
 */
import { Effect, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Received, type Receiver, receiver, type Reply } from "../delivery/worker-support.js"
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
const scope = Effect.runSync(Scope.make())
let devnet: Devnet
let db: string
let firehook: Deployment
let rx: Receiver
const secrets = new Map<string, string>()

/** `/large`: 200 with a 100 KiB body; anything else 200 `ok` */
const reply = (path: string): Reply =>
  path === "/large" ? { status: 200, body: Buffer.alloc(100 * 1024, 0x61) } : { status: 200, body: "ok" }

beforeAll(async () => {
  devnet = await startDevnet()
  db = await res.freshDb()
  rx = await Effect.runPromise(
    Scope.extend(receiver({ reply, secretFor: (uri) => secrets.get(uri) }), scope)
  )
  firehook = await startDeployment(res.tempDir(), devnetFirehookEnv(devnet, db))
  await waitFor(firehook.health, 200, firehook.running, 60_000)
}, 120_000)

afterAll(() => closeDevnetFile({ firehook, devnet, scope, res }), 60_000)

const at = (path: string): Array<Received> => rx.received.filter((r) => r.path === path)
const bodyOf = (r: Received) => JSON.parse(r.body.toString("utf8")) as Record<string, unknown>
const debug = () => firehook.running.stdout().slice(-3000)

const registered = (owner: Account, rkey: string, cid: string) =>
  waitUntil(
    async () =>
      (await query<{ cid: string }>(db, "SELECT cid FROM webhooks WHERE owner_did = $1 AND rkey = $2", [
        owner.did,
        rkey
      ]))[0]?.cid === cid,
    30_000,
    `webhook ${rkey} registered`,
    debug
  )

const outbox = (owner: Account, rkey: string) =>
  query<{ status: string; event_did: string; event_collection: string; match_kind: string }>(
    db,
    "SELECT status, event_did, event_collection, match_kind FROM outbox WHERE owner_did = $1 AND webhook_rkey = $2",
    [owner.did, rkey]
  )

const invalidRecords = async (): Promise<number> => {
  const r = await fetch(firehook.health)
  const body = (await r.json()) as { registry?: { invalidRecords?: number } }
  return body.registry?.invalidRecords ?? 0
}

describe("scope.backlinksOnly and large responses on a real atproto network", () => {
  it(
    "a backlinksOnly hook on Bob's posts gets Alice's like, not the post; the invalid combination is refused",
    async () => {
      const bob = await createAccount(devnet, "bob")
      const alice = await createAccount(devnet, "alice")
      const hook = (path: string, s: Record<string, unknown>) => ({
        scope: s,
        url: `${rx.url}${path}`,
        createdAt: nowIso()
      })
      // the witness first (a later hook's record would reference its scope): a plain hook on Bob's
      // repo, answering with a 100 KiB body
      const witness = await createRecord(bob, WH, hook("/large", { aturi: `at://${bob.did}` }), "witness")
      await registered(bob, "witness", witness.cid)
      const invalidBefore = await invalidRecords()
      await createRecord(
        bob,
        WH,
        hook("/bad", { aturi: `at://${bob.did}`, backlinks: false, backlinksOnly: true }),
        "bad"
      )
      await waitUntil(async () => (await invalidRecords()) > invalidBefore, 30_000, "the invalid record counted", debug)
      expect(await query(db, "SELECT rkey FROM webhooks WHERE owner_did = $1 AND rkey = 'bad'", [bob.did])).toEqual([])
      const secret = "bob-backlinks-only-0123456789"
      secrets.set(`at://${bob.did}/${WH}/only`, secret)
      const only = await createRecord(
        bob,
        WH,
        { ...hook("/only", { aturi: `at://${bob.did}/app.bsky.feed.post`, backlinksOnly: true }), secret },
        "only"
      )
      await registered(bob, "only", only.cid)

      const bobPost = await createRecord(bob, "app.bsky.feed.post", { text: "bob writes", createdAt: nowIso() })
      const like = await createRecord(alice, "app.bsky.feed.like", {
        subject: { uri: bobPost.uri, cid: bobPost.cid },
        createdAt: nowIso()
      })
      // the like is delivered (settled); the stream is ordered, so Bob's post was matched before it
      await waitUntil(
        async () => (await outbox(bob, "only")).some((r) => r.event_did === alice.did && r.status === "delivered"),
        30_000,
        "the like delivered",
        async () => JSON.stringify(await outbox(bob, "only")) + debug()
      )
      // the witness got Bob's post, and its 100 KiB answer made a delivery, not a failure
      await waitUntil(
        async () =>
          (await outbox(bob, "witness")).some((r) =>
            r.event_did === bob.did && r.event_collection === "app.bsky.feed.post" && r.status === "delivered"
          ),
        30_000,
        "the witness delivered despite its 100 KiB answer",
        async () => JSON.stringify(await outbox(bob, "witness"))
      )
      expect(at("/large").some((r) => bodyOf(r)["rkey"] === bobPost.rkey)).toBe(true)

      expect(await outbox(bob, "only")).toEqual([
        { status: "delivered", event_did: alice.did, event_collection: "app.bsky.feed.like", match_kind: "backlink" }
      ])
      const got = at("/only")
      expect(got).toHaveLength(1)
      expect(bodyOf(got[0] as Received)).toMatchObject({ did: alice.did, rkey: like.rkey, event: "create" })
      expect(got[0]?.headers["x-firehook-match"]).toBe("backlink")
      expect(got[0]?.verified).toEqual({ standard: true, wisp: true })
      expect(at("/bad")).toEqual([])
    },
    120_000
  )
})
