/**
 * Issue 14 item 4 as an operator meets it (SPEC §3.4, §5.3 step 2), on a real atproto network
 * (`@atproto/dev-env`) with firehook as in production (`bun src/main.ts`) on a fresh database: the
 * owner created a webhook, a post it matched, and deleted the webhook, all on the PDS; firehook's
 * relay replays the owner's history from cursor 0. The replayed old create lands once the owner's
 * scan has begun (its pages held: the snapshot's rev is stored) or once it has completed; either
 * way the webhook does not come back and nothing is delivered to it (during the scan the replayed
 * create is stored one below the scan's token and the index follows it until the scan's swap, so
 * the replayed post may be matched: that row waits for the scan's end and is cancelled, never
 * attempted), while a webhook the owner creates afterwards works.
 *
 * The ordering is controlled, never slept for: a relay proxy forwards the replayed frames only as
 * far as the test releases them, a PLC/PDS proxy holds the owner's `listRecords`, and the test
 * watches firehook's database (owner status, stream cursor) and the proxies' request logs.
 */
import { Effect, Exit, Scope } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import { type Receiver, receiver } from "../delivery/worker-support.js"
import {
  type Account,
  createAccount,
  createRecord,
  deleteRecord,
  type Devnet,
  devnetFirehookEnv,
  nowIso,
  startDevnet,
  WH
} from "../support/devnet.js"
import { e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { exitWithin, waitFor } from "../support/proc.js"
import { type PdsGate, type RelayReplay, startPdsGate, startRelayReplay } from "../support/replayProxies.js"

const res = e2eResources()
const scope = Effect.runSync(Scope.make())
let devnet: Devnet
let rx: Receiver

beforeAll(async () => {
  devnet = await startDevnet()
  rx = await Effect.runPromise(Scope.extend(receiver(), scope))
}, 120_000)

afterAll(async () => {
  await devnet?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await res.cleanup()
}, 60_000)

const LIST_RECORDS = "/xrpc/com.atproto.repo.listRecords"
const POST = "app.bsky.feed.post"

const hookRecord = (owner: Account, path: string) => ({
  scope: { aturi: `at://${owner.did}/${POST}` },
  url: `${rx.url}${path}`,
  createdAt: nowIso()
})

/** The owner's history on the PDS: webhook `old` created, a post it matched, `old` deleted. */
const history = async (owner: Account, path: string) => {
  await createRecord(owner, WH, hookRecord(owner, path), "old")
  await createRecord(owner, POST, { text: "matched while the webhook existed", createdAt: nowIso() })
  await deleteRecord(owner, WH, "old")
}

/** The seq of the first replayed frame with an event that `is`. */
const seqOf = async (relay: RelayReplay, what: string, is: (e: StreamEvent) => boolean): Promise<bigint> => {
  await waitUntil(() => relay.frames.some((f) => f.events.some(is)), 30_000, `the replay of ${what}`)
  const frame = relay.frames.find((f) => f.events.some(is))
  if (frame === undefined) throw new Error(`no frame for ${what}`)
  return frame.seq
}

const isWh = (e: StreamEvent, operation: string) =>
  e.kind === "commit" && e.collection === WH && e.rkey === "old" && e.operation === operation
const isPost = (e: StreamEvent) => e.kind === "commit" && e.collection === POST

interface Run {
  readonly db: string
  readonly owner: Account
  readonly debug: () => string
}

const ownerRow = async (run: Run) =>
  (await query<{ status: string; snapshot_rev: string | null }>(
    run.db,
    "SELECT reconcile_status AS status, snapshot_rev FROM owners WHERE did = $1",
    [run.owner.did]
  ))[0]

const cursorAtLeast = (run: Run, seq: bigint, what: string) =>
  waitUntil(
    async () => {
      const rows = await query<{ c: string | null }>(run.db, "SELECT max(cursor)::text AS c FROM cursors")
      return BigInt(rows[0]?.c ?? "-1") >= seq
    },
    30_000,
    what,
    run.debug
  )

const statusIs = (run: Run, status: string) =>
  waitUntil(async () => (await ownerRow(run))?.status === status, 60_000, `owner ${status}`, run.debug)

/** The outbox rows of the deleted webhook: their status and last error kind. */
const oldRows = (run: Run) =>
  query<{ status: string; kind: string | null }>(
    run.db,
    "SELECT status, last_error_kind AS kind FROM outbox WHERE owner_did = $1 AND webhook_rkey = 'old'",
    [run.owner.did]
  )

/**
 * The deleted webhook is not back: no row, nothing received on its path. With `matchedDuringScan`,
 * the replayed post may have been matched while the scan was taken (the index follows a write the
 * scan's snapshot fences, until its swap): such a row waits while the owner is scanning (pending,
 * or for a moment leased: the worker claims it and defers it without an attempt) and is then
 * cancelled (`subscription_changed`), never attempted; without, there is no outbox row at all.
 */
const expectNotBack = async (run: Run, path: string, matchedDuringScan = false) => {
  expect(await query(run.db, "SELECT rkey FROM webhooks WHERE owner_did = $1 AND rkey = 'old'", [run.owner.did]))
    .toEqual([])
  const rows = await oldRows(run)
  if (matchedDuringScan) {
    // the rows in another state, listed (a failure shows them)
    expect(
      rows.filter((r) =>
        !(r.status === "pending" || r.status === "leased" ||
          (r.status === "cancelled" && r.kind === "subscription_changed"))
      )
    ).toEqual([])
    expect(
      await query(
        run.db,
        `SELECT a.delivery_id FROM delivery_attempts a JOIN outbox o ON o.delivery_id = a.delivery_id
         WHERE o.owner_did = $1 AND o.webhook_rkey = 'old'`,
        [run.owner.did]
      )
    ).toEqual([])
  } else {
    expect(rows).toEqual([])
  }
  expect(rx.received.filter((r) => r.path === path)).toEqual([])
}

/** A webhook the owner creates now is registered and gets the owner's next post. */
const expectNewHookWorks = async (run: Run, path: string) => {
  const fresh = await createRecord(run.owner, WH, hookRecord(run.owner, path), "new")
  await waitUntil(
    async () =>
      (await query<{ cid: string }>(run.db, "SELECT cid FROM webhooks WHERE owner_did = $1 AND rkey = 'new'", [
        run.owner.did
      ]))[0]?.cid === fresh.cid,
    30_000,
    "the new webhook registered",
    run.debug
  )
  const post = await createRecord(run.owner, POST, { text: "after", createdAt: nowIso() })
  await waitUntil(
    () =>
      rx.received.some((r) =>
        r.path === path && (JSON.parse(r.body.toString("utf8")) as { rkey?: string }).rkey === post.rkey
      ),
    30_000,
    "the new webhook's delivery",
    run.debug
  )
}

/**
 * Start a fresh firehook for `owner` behind the proxies; `ordered` releases the replay and checks;
 * the service is stopped cleanly afterwards.
 */
const withFirehook = async (
  owner: Account,
  options: { readonly holdPages: boolean },
  ordered: (run: Run, proxies: { relay: RelayReplay; gate: PdsGate; releasePages: () => void }) => Promise<void>
) => {
  const relay = await startRelayReplay(devnet.relayUrl, owner.did)
  const gate = await startPdsGate(devnet)
  const releasePages = options.holdPages ? gate.hold(LIST_RECORDS) : () => undefined
  try {
    const db = await res.freshDb()
    const d = await startDeployment(
      res.tempDir(),
      devnetFirehookEnv(devnet, db, { RELAY_URL: relay.url, PLC_DIRECTORY_URL: gate.url, BACKFILL_OWNERS: owner.did })
    )
    const run: Run = { db, owner, debug: () => `${JSON.stringify(gate.requests)} ${d.running.stdout().slice(-3000)}` }
    try {
      await waitFor(d.health, 200, d.running, 60_000)
      await ordered(run, { relay, gate, releasePages })
    } finally {
      releasePages()
      d.running.child.kill("SIGTERM")
    }
    expect((await exitWithin(d.running, 15_000)).code).toBe(0)
  } finally {
    releasePages()
    await relay.close()
    await gate.close()
  }
}

describe("snapshots beat old replays, end to end (issue 14 item 4)", () => {
  it(
    "the replayed create lands once the owner's scan has begun (its pages held): the webhook does not come back",
    async () => {
      const owner = await createAccount(devnet, "fenceduring")
      await history(owner, "/during/old")
      await withFirehook(owner, { holdPages: true }, async (run, { gate, relay, releasePages }) => {
        const created = await seqOf(relay, "the old create", (e) => isWh(e, "create"))
        const post = await seqOf(relay, "the post", isPost)
        const deleted = await seqOf(relay, "the delete", (e) => isWh(e, "delete"))
        expect(created < post && post < deleted).toBe(true)
        // the scan has begun: getLatestCommit answered, the first page is asked for and held
        await waitUntil(() => gate.requests.includes(LIST_RECORDS), 60_000, "the first page asked for", run.debug)
        expect((await ownerRow(run))?.status).toBe("scanning")
        // the stream replays the old create and the post it matched (not yet the delete)
        relay.release(deleted - 1n)
        await cursorAtLeast(run, post, "the replayed create and post processed")
        // stored one below the scan's token (so that a scan that fails leaves what the owner
        // wrote): the snapshot decides its key; nothing sent
        const held = await query<{ generation: string; scan_generation: string }>(
          run.db,
          `SELECT w.generation, o.scan_generation FROM webhooks w JOIN owners o ON o.did = w.owner_did
           WHERE w.owner_did = $1 AND w.rkey = 'old'`,
          [run.owner.did]
        )
        expect(held.map((r) => Number(r.scan_generation) - Number(r.generation))).toEqual([1])
        expect(rx.received.filter((r) => r.path === "/during/old")).toEqual([])
        // the scan's rev was stored before its first page was asked for
        expect(await ownerRow(run)).toMatchObject({ status: "scanning", snapshot_rev: expect.any(String) })
        releasePages()
        await statusIs(run, "complete")
        await expectNotBack(run, "/during/old", true)
        // the rest of the history, then a webhook created now
        relay.release()
        await cursorAtLeast(run, deleted, "the replayed delete processed")
        await expectNewHookWorks(run, "/during/new")
        // the row matched during the scan, if any, is cancelled once the scan has ended, never sent
        await waitUntil(async () => (await oldRows(run)).every((r) => r.status === "cancelled"), 60_000, "cancelled")
        await expectNotBack(run, "/during/old", true)
      })
    },
    240_000
  )

  it(
    "the replayed create lands once the owner's scan has completed: the webhook does not come back",
    async () => {
      const owner = await createAccount(devnet, "fenceafter")
      await history(owner, "/after/old")
      await withFirehook(owner, { holdPages: false }, async (run, { relay }) => {
        const post = await seqOf(relay, "the post", isPost)
        const deleted = await seqOf(relay, "the delete", (e) => isWh(e, "delete"))
        await statusIs(run, "complete")
        relay.release(deleted - 1n)
        await cursorAtLeast(run, post, "the replayed create and post processed")
        await expectNotBack(run, "/after/old")
        relay.release()
        await cursorAtLeast(run, deleted, "the replayed delete processed")
        await expectNewHookWorks(run, "/after/new")
        await expectNotBack(run, "/after/old")
      })
    },
    240_000
  )
})
