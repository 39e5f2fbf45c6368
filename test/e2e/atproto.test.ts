/**
 * firehook against real atproto software nobody here wrote: `@atproto/dev-env` (a real PDS and PLC,
 * Node 22 child process), firehook as in production (`bun src/main.ts`) consuming the PDS's
 * `subscribeRepos` directly and resolving DIDs through the test PLC, and receivers on 127.0.0.1 that
 * verify both signatures (`standardwebhooks` and the wisp `sha256=` header).
 */
import { Effect, Exit, Scope } from "effect"
import { spawnSync } from "node:child_process"
import { randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type Received, type Receiver, receiver, type Reply } from "../delivery/worker-support.js"
import {
  type Account,
  createAccount,
  createRecord,
  deleteRecord,
  type Devnet,
  devnetFirehookEnv,
  nowIso,
  putRecord,
  startDevnet,
  WH
} from "../support/devnet.js"
import {
  type Deployment,
  e2eResources,
  processTail,
  query,
  startDeployment,
  waitUntil,
  webhookDiagnostics
} from "../support/e2e.js"
import { exitWithin, ROOT, runCli, waitFor } from "../support/proc.js"

const res = e2eResources()
const KEY = randomBytes(32).toString("base64")
const scope = Effect.runSync(Scope.make())
let devnet: Devnet
let db: string
let firehook: Deployment
/** the secret of each webhook, by its AT-URI, for the receivers' verification */
const secrets = new Map<string, string>()
/** per path: the replies to give, in order (the last one repeats); default 200 */
const script = new Map<string, Array<Reply>>()
let rx: Receiver

const reply = (path: string): Reply => {
  const list = script.get(path)
  if (list === undefined || list.length === 0) return { status: 200, body: "ok" }
  return list.length === 1 ? (list[0] as Reply) : (list.shift() as Reply)
}

const firehookEnv = (extra: Record<string, string> = {}) =>
  devnetFirehookEnv(devnet, db, { WEBHOOK_SECRET_ENCRYPTION_KEY: KEY, ...extra })

beforeAll(async () => {
  devnet = await startDevnet()
  db = await res.freshDb()
  rx = await Effect.runPromise(
    Scope.extend(receiver({ reply: (p) => reply(p), secretFor: (uri) => secrets.get(uri) }), scope)
  )
  firehook = await startDeployment(res.tempDir(), firehookEnv())
  await waitFor(firehook.health, 200, firehook.running, 60_000)
}, 120_000)

const stop = async (d: Deployment) => {
  if (d.running.child.exitCode !== null || d.running.child.signalCode !== null) return
  d.running.child.kill("SIGTERM")
  expect((await exitWithin(d.running, 15_000)).code).toBe(0)
}

afterAll(async () => {
  if (firehook !== undefined) await stop(firehook)
  await devnet?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await res.cleanup()
}, 60_000)

/** What the receiver got on `path` */
const at = (path: string): Array<Received> => rx.received.filter((r) => r.path === path)
const bodyOf = (r: Received) => JSON.parse(r.body.toString("utf8")) as Record<string, unknown>

interface WebhookRow {
  readonly cid: string | null
  readonly enabled: boolean
  readonly active: boolean
  readonly gone_at: Date | null
}

const webhookRow = async (owner: Account, rkey: string): Promise<WebhookRow | undefined> =>
  (await query<WebhookRow>(
    db,
    "SELECT cid, enabled, active, gone_at FROM webhooks WHERE owner_did = $1 AND rkey = $2",
    [owner.did, rkey]
  ))[0]

/** Wait until firehook's registry row for the webhook satisfies `ok` (`undefined` = no row). */
const waitWebhook = (
  owner: Account,
  rkey: string,
  ok: (row: WebhookRow | undefined) => boolean,
  what: string,
  dbUrl = db
) =>
  waitUntil(
    async () =>
      ok(
        (await query<WebhookRow>(
          dbUrl,
          "SELECT cid, enabled, active, gone_at FROM webhooks WHERE owner_did = $1 AND rkey = $2",
          [owner.did, rkey]
        ))[0]
      ),
    30_000,
    what,
    () => firehook.running.stdout().slice(-3000)
  )

/** Write a webhook record and wait until firehook's registry holds that version. */
const registerWebhook = async (
  owner: Account,
  rkey: string,
  fields: Record<string, unknown>,
  secret?: string
): Promise<string> => {
  const uri = `at://${owner.did}/${WH}/${rkey}`
  if (secret !== undefined) secrets.set(uri, secret)
  const ref = await createRecord(owner, WH, {
    createdAt: nowIso(),
    ...(secret === undefined ? {} : { secret }),
    ...fields
  }, rkey)
  await waitWebhook(owner, rkey, (row) => row?.cid === ref.cid, `webhook ${rkey} registered`)
  return uri
}

const outboxOf = (owner: Account, rkey: string, dbUrl = db) =>
  query<
    {
      delivery_id: string
      status: string
      attempt_count: number
      last_error_kind: string | null
      event_operation: string
      event_rkey: string
    }
  >(
    dbUrl,
    "SELECT delivery_id, status, attempt_count, last_error_kind, event_operation, event_rkey FROM outbox WHERE owner_did = $1 AND webhook_rkey = $2 ORDER BY created_at",
    [owner.did, rkey]
  )

const post = (account: Account, text: string, extra: Record<string, unknown> = {}) =>
  createRecord(account, "app.bsky.feed.post", { text, createdAt: nowIso(), ...extra })

describe("firehook on a real atproto network", () => {
  it(
    "a webhook on Alice's posts: create, update, delete → three signed deliveries with the SPEC §3.5 payload",
    async () => {
      const alice = await createAccount(devnet, "alice")
      const path = "/alice-posts"
      const hook = await registerWebhook(
        alice,
        "posts",
        { scope: { aturi: `at://${alice.did}/app.bsky.feed.post` }, url: `${rx.url}${path}` },
        "alice-secret-0123456789"
      )
      const created = await post(alice, "hello")
      const updated = await putRecord(alice, "app.bsky.feed.post", created.rkey, {
        text: "hello again",
        createdAt: nowIso()
      })
      await deleteRecord(alice, "app.bsky.feed.post", created.rkey)
      await waitUntil(
        () => at(path).length >= 3,
        30_000,
        "three deliveries",
        () => firehook.running.stdout().slice(-3000)
      )
      const got = at(path)
      expect(got).toHaveLength(3)
      const byEvent = new Map(got.map((r) => [bodyOf(r)["event"], r] as const))
      expect([...byEvent.keys()].sort()).toEqual(["create", "delete", "update"])
      for (const r of got) {
        const b = bodyOf(r)
        expect(Object.keys(b)).toEqual([...Object.keys(b)].sort())
        expect(b["did"]).toBe(alice.did)
        expect(b["collection"]).toBe("app.bsky.feed.post")
        expect(b["rkey"]).toBe(created.rkey)
        expect(b["id"]).toMatch(/^whe_v1_[0-9a-f]{64}$/)
        expect(Number.isNaN(Date.parse(String(b["timestamp"])))).toBe(false)
        expect(r.method).toBe("POST")
        expect(r.headers["content-type"]).toBe("application/json")
        expect(r.headers["user-agent"]).toMatch(/^firehook\//)
        expect(r.verified).toEqual({ standard: true, wisp: true })
        expect(r.headers["x-firehook-webhook"]).toBe(hook)
        expect(r.headers["x-firehook-match"]).toBe("direct")
        expect(r.headers["idempotency-key"]).toMatch(/^whd_v1_[0-9a-f]{64}$/)
        expect(r.headers["webhook-id"]).toBe(r.headers["idempotency-key"])
      }
      const create = bodyOf(byEvent.get("create") as Received)
      const update = bodyOf(byEvent.get("update") as Received)
      const del = bodyOf(byEvent.get("delete") as Received)
      expect(create["cid"]).toBe(created.cid)
      expect(create["record"]).toEqual({ $type: "app.bsky.feed.post", text: "hello", createdAt: expect.any(String) })
      expect(update["cid"]).toBe(updated.cid)
      expect(update["record"]).toMatchObject({ text: "hello again" })
      expect(del).not.toHaveProperty("record")
      expect(del).not.toHaveProperty("cid")
      expect(
        new Set(got.map((r) => r.headers["idempotency-key"])).size
      ).toBe(3)
      expect(new Set(got.map((r) => bodyOf(r)["id"])).size).toBe(3)
      // the receiver answered before firehook settled the rows: wait for the settles
      await waitUntil(
        async () => (await outboxOf(alice, "posts")).filter((r) => r.status === "delivered").length === 3,
        30_000,
        "three settled deliveries",
        async () => JSON.stringify(await outboxOf(alice, "posts"))
      )
      expect((await outboxOf(alice, "posts")).map((r) => [r.status, r.attempt_count])).toEqual([
        ["delivered", 1],
        ["delivered", 1],
        ["delivered", 1]
      ])
    },
    90_000
  )

  it("a backlink webhook on Bob fires when Alice likes Bob's post and when she mentions him", async () => {
    const bob = await createAccount(devnet, "bob")
    const alice2 = await createAccount(devnet, "alice2")
    const path = "/bob-backlinks"
    const hook = await registerWebhook(bob, "mentions", {
      scope: { aturi: `at://${bob.did}`, backlinks: true },
      url: `${rx.url}${path}`
    }, "bob-secret-0123456789")
    const bobPost = await post(bob, "bob writes")
    const like = await createRecord(alice2, "app.bsky.feed.like", {
      subject: { uri: bobPost.uri, cid: bobPost.cid },
      createdAt: nowIso()
    })
    const text = "hi @bob.test"
    const mention = await post(alice2, text, {
      facets: [
        {
          index: { byteStart: 3, byteEnd: 12 },
          features: [{ $type: "app.bsky.richtext.facet#mention", did: bob.did }]
        }
      ]
    })
    // a post by Alice that neither references Bob nor mentions him in a facet (only in prose)
    const prose = await post(alice2, `prose about ${bob.did}`)
    // the sentinel: Bob's own post after all of them (the stream is ordered)
    const sentinel = await post(bob, "sentinel")
    await waitUntil(
      () => at(path).some((r) => bodyOf(r)["rkey"] === sentinel.rkey),
      30_000,
      "backlink deliveries",
      () => JSON.stringify(at(path).map(bodyOf))
    )
    const got = at(path)
    const summary = got.map((
      r
    ) => [r.headers["x-firehook-match"], bodyOf(r)["did"], bodyOf(r)["collection"], bodyOf(r)["rkey"]])
    expect(summary).toEqual(
      expect.arrayContaining([
        ["direct", bob.did, "app.bsky.feed.post", bobPost.rkey],
        ["backlink", alice2.did, "app.bsky.feed.like", like.rkey],
        ["backlink", alice2.did, "app.bsky.feed.post", mention.rkey],
        ["direct", bob.did, "app.bsky.feed.post", sentinel.rkey]
      ])
    )
    expect(got).toHaveLength(4)
    expect(got.some((r) => bodyOf(r)["rkey"] === prose.rkey)).toBe(false)
    for (const r of got) {
      expect(r.verified).toEqual({ standard: true, wisp: true })
      expect(r.headers["x-firehook-webhook"]).toBe(hook)
    }
  }, 90_000)

  it(
    "events filter, enabled:false then re-enabled, and a deleted record (deliveries stop, queued ones cancelled)",
    async () => {
      const carol = await createAccount(devnet, "carol")
      const scope = { aturi: `at://${carol.did}/app.bsky.feed.post` }
      // only deletes
      await registerWebhook(carol, "deletes", { scope, url: `${rx.url}/carol-deletes`, events: ["delete"] })
      // toggled
      await registerWebhook(carol, "toggle", { scope, url: `${rx.url}/carol-toggle`, enabled: false })
      // failing, then deleted while its delivery is queued for retry
      script.set("/carol-failing", [{ status: 500 }])
      await registerWebhook(carol, "failing", { scope, url: `${rx.url}/carol-failing` })

      const first = await post(carol, "first")
      await waitUntil(() => at("/carol-failing").length >= 2, 30_000, "the failing webhook retried")
      await deleteRecord(carol, "app.bsky.feed.post", first.rkey)
      await waitUntil(() => at("/carol-deletes").length >= 1, 30_000, "the delete delivered")

      // re-enable the toggled webhook; delete the failing one
      const toggled = await putRecord(carol, WH, "toggle", {
        createdAt: nowIso(),
        scope,
        url: `${rx.url}/carol-toggle`,
        enabled: true
      })
      await waitWebhook(carol, "toggle", (row) => row?.cid === toggled.cid && row.active, "toggle re-enabled")
      await deleteRecord(carol, WH, "failing")
      await waitWebhook(carol, "failing", (row) => row === undefined, "failing webhook removed")
      await waitUntil(
        async () => (await outboxOf(carol, "failing")).every((r) => r.status === "cancelled"),
        30_000,
        "the queued delivery cancelled",
        async () => JSON.stringify(await outboxOf(carol, "failing"))
      )
      const failingRequests = at("/carol-failing").length

      const second = await post(carol, "second")
      await waitUntil(() => at("/carol-toggle").length >= 1, 30_000, "the re-enabled webhook delivered")

      // the events filter: only the delete of `first` reached /carol-deletes (no creates)
      expect(at("/carol-deletes").map((r) => [bodyOf(r)["event"], bodyOf(r)["rkey"]])).toEqual([["delete", first.rkey]])
      expect((await outboxOf(carol, "deletes")).map((r) => r.event_operation)).toEqual(["delete"])
      // disabled: nothing for `first` (create or delete); re-enabled: `second`
      expect(at("/carol-toggle").map((r) => [bodyOf(r)["event"], bodyOf(r)["rkey"]])).toEqual([["create", second.rkey]])
      expect((await outboxOf(carol, "toggle")).map((r) => r.event_rkey)).toEqual([second.rkey])
      // deleted: its queued delivery was cancelled and nothing new was enqueued or sent
      const failing = await outboxOf(carol, "failing")
      expect(failing.map((r) => [r.event_operation, r.event_rkey, r.status])).toEqual([
        ["create", first.rkey, "cancelled"],
        ["delete", first.rkey, "cancelled"]
      ])
      expect(at("/carol-failing").length).toBe(failingRequests)
    },
    120_000
  )

  it("secretId: a server-managed secret signs the deliveries, and a rotation takes over", async () => {
    const grace = await createAccount(devnet, "grace")
    const cliEnv = { DATABASE_URL: db, WEBHOOK_SECRET_ENCRYPTION_KEY: KEY }
    const created = await runCli(["secrets", "create", grace.did, "main"], cliEnv)
    expect(created.code).toBe(0)
    const first = created.stdout.trim()
    expect(first).toMatch(/^whsec_/)
    const path = "/grace"
    const uri = await registerWebhook(grace, "signed", {
      scope: { aturi: `at://${grace.did}/app.bsky.feed.post` },
      url: `${rx.url}${path}`,
      secretId: "main"
    })
    secrets.set(uri, first)
    const before = await post(grace, "before rotation")
    await waitUntil(() => at(path).length >= 1, 30_000, "first signed delivery")
    expect(at(path).map((r) => [bodyOf(r)["rkey"], r.verified])).toEqual([[before.rkey, {
      standard: true,
      wisp: true
    }]])

    const rotated = await runCli(["secrets", "rotate", grace.did, "main"], cliEnv)
    expect(rotated.code).toBe(0)
    const second = rotated.stdout.trim()
    expect(second).toMatch(/^whsec_/)
    expect(second).not.toBe(first)
    secrets.set(uri, second)
    // the service's secret cache holds a token for at most 10 s: post until a delivery is signed
    // with the new token, then every later one must be too
    let newSigned: number | undefined
    for (let i = 0; i < 30 && newSigned === undefined; i++) {
      const n = at(path).length
      await post(grace, `after rotation ${i}`)
      await waitUntil(() => at(path).length > n, 30_000, "a delivery after rotation")
      const last = at(path)[at(path).length - 1]
      if (last?.verified?.standard === true && last.verified.wisp) newSigned = at(path).length - 1
      else await new Promise((r) => setTimeout(r, 1000))
    }
    expect(newSigned).toBeDefined()
    const after = await post(grace, "well after rotation")
    await waitUntil(() => at(path).some((r) => bodyOf(r)["rkey"] === after.rkey), 30_000, "the last delivery")
    for (const r of at(path).slice(newSigned)) expect(r.verified).toEqual({ standard: true, wisp: true })

    // the receiver guide's shell recipe (docs/receivers.md, openssl) computes both signatures
    const last = at(path).find((r) => bodyOf(r)["rkey"] === after.rkey) as Received
    const guide = Fs.readFileSync(Path.join(ROOT, "docs/receivers.md"), "utf8")
    const recipe = /### Shell, with openssl\n\n```sh\n([\s\S]*?)```/.exec(guide)?.[1]
    expect(recipe).toBeDefined()
    const dir = res.tempDir()
    Fs.writeFileSync(Path.join(dir, "body.json"), last.body)
    const shell = spawnSync("bash", ["-euo", "pipefail", "-c", recipe ?? ""], {
      cwd: dir,
      env: {
        PATH: process.env["PATH"] ?? "",
        SECRET: second,
        WEBHOOK_ID: String(last.headers["webhook-id"]),
        WEBHOOK_TIMESTAMP: String(last.headers["webhook-timestamp"])
      },
      encoding: "utf8"
    })
    expect(shell.status).toBe(0)
    expect(shell.stdout.trim().split("\n")).toEqual([
      last.headers["x-webhook-signature"],
      String(last.headers["webhook-signature"]).replace(/^v1,/, "")
    ])
  }, 120_000)

  it("receiver faults: 500 then 200 is retried; 410 is gone; a hanging receiver times out and is retried", async () => {
    const frank = await createAccount(devnet, "frank")
    const scope = { aturi: `at://${frank.did}/app.bsky.feed.post` }
    script.set("/frank-flaky", [{ status: 500 }, { status: 200 }])
    script.set("/frank-gone", [{ status: 410 }])
    script.set("/frank-hang", ["hang", { status: 200 }])
    for (const name of ["flaky", "gone", "hang"]) {
      await registerWebhook(frank, name, { scope, url: `${rx.url}/frank-${name}` }, `frank-${name}-secret-0123456789`)
    }
    await post(frank, "faults")
    const delivered = async (rkey: string) => (await outboxOf(frank, rkey))[0]?.status === "delivered"
    await waitUntil(
      async () => (await delivered("flaky")) && (await delivered("hang")),
      60_000,
      "flaky and hanging receivers eventually served",
      async () => JSON.stringify({ flaky: await outboxOf(frank, "flaky"), hang: await outboxOf(frank, "hang") })
    )
    await waitUntil(
      async () => (await outboxOf(frank, "gone"))[0]?.status === "dead_letter",
      30_000,
      "gone dead-lettered"
    )

    const attempts = async (rkey: string) => {
      const [row] = await outboxOf(frank, rkey)
      return query<{ outcome: string; error_kind: string | null; http_status: number | null }>(
        db,
        "SELECT outcome, error_kind, http_status FROM delivery_attempts WHERE delivery_id = $1 ORDER BY attempt",
        [row?.delivery_id]
      )
    }
    // 500 then 200: two requests with one Idempotency-Key, both signed
    const flaky = at("/frank-flaky")
    expect(flaky).toHaveLength(2)
    expect(new Set(flaky.map((r) => r.headers["idempotency-key"])).size).toBe(1)
    expect(flaky.every((r) => r.verified?.standard === true && r.verified.wisp)).toBe(true)
    expect((await attempts("flaky")).map((a) => [a.error_kind, a.http_status])).toEqual([
      ["http_5xx", 500],
      [null, 200]
    ])
    // 410: one request, dead-lettered as gone, and the subscription is marked gone
    expect(at("/frank-gone")).toHaveLength(1)
    expect((await outboxOf(frank, "gone"))[0]?.last_error_kind).toBe("gone")
    expect(await webhookRow(frank, "gone")).toMatchObject({ gone_at: expect.any(Date) })
    // hang: the first attempt timed out, the retry (same key) was answered
    const hang = at("/frank-hang")
    expect(hang.length).toBeGreaterThanOrEqual(2)
    expect(new Set(hang.map((r) => r.headers["idempotency-key"])).size).toBe(1)
    const hangAttempts = await attempts("hang")
    expect(hangAttempts[0]?.error_kind).toBe("timeout")
    expect(hangAttempts[hangAttempts.length - 1]).toMatchObject({ error_kind: null, http_status: 200 })
  }, 120_000)

  it(
    "backfill: firehook started later on an empty database, live-only, reconciles the operator's owner from listRecords and delivers",
    async () => {
      const dave = await createAccount(devnet, "dave")
      const path = "/dave"
      const uri = `at://${dave.did}/${WH}/later`
      secrets.set(uri, "dave-secret-0123456789")
      // the webhook exists before this firehook ever runs; nothing watches Dave now
      await stop(firehook)
      const ref = await createRecord(dave, WH, {
        createdAt: nowIso(),
        scope: { aturi: `at://${dave.did}/app.bsky.feed.post` },
        url: `${rx.url}${path}`,
        secret: "dave-secret-0123456789"
      }, "later")
      await post(dave, "before firehook") // history from before this firehook existed
      db = await res.freshDb()
      firehook = await startDeployment(res.tempDir(), firehookEnv({ BACKFILL_OWNERS: dave.did }))
      await waitFor(firehook.health, 200, firehook.running, 60_000)
      await waitWebhook(dave, "later", (row) => row?.cid === ref.cid && row.active, "reconciled from listRecords")
      const ownerRow = async () =>
        (
          await query<{ reconcile_status: string; from_operator: boolean; from_stream: boolean }>(
            db,
            "SELECT reconcile_status, from_operator, from_stream FROM owners WHERE did = $1",
            [dave.did]
          )
        )[0]
      await waitUntil(
        async () => (await ownerRow())?.reconcile_status === "complete",
        30_000,
        "reconciliation complete"
      )
      expect(await ownerRow()).toEqual({ reconcile_status: "complete", from_operator: true, from_stream: false })
      const fresh = await post(dave, "after backfill")
      await waitUntil(() => at(path).some((r) => bodyOf(r)["rkey"] === fresh.rkey), 30_000, "delivery after backfill")
      const got = at(path).find((r) => bodyOf(r)["rkey"] === fresh.rkey)
      expect(got?.verified).toEqual({ standard: true, wisp: true })
      expect(got?.headers["x-firehook-webhook"]).toBe(uri)
    },
    120_000
  )

  it(
    "SIGKILL mid-stream and restart: every expected delivery arrives at least once, duplicates share the Idempotency-Key",
    async () => {
      const erin = await createAccount(devnet, "erin")
      const path = "/erin"
      await registerWebhook(erin, "all", {
        scope: { aturi: `at://${erin.did}/app.bsky.feed.post` },
        url: `${rx.url}${path}`
      }, "erin-secret-0123456789")
      const dataDir = res.tempDir()
      await stop(firehook)
      firehook = await startDeployment(dataDir, firehookEnv())
      await waitFor(firehook.health, 200, firehook.running, 60_000)
      // the start's backfill sweep rescans erin too; a SIGKILL during her scan leaves her `scanning`
      // (a crash skips the scan's end), and the restarted process holds her deliveries until it takes
      // the dead process's page over (30 s without a beat) and scans her again: under CI's load that
      // outlasted the 90 s below once (stop 58). This test is about a kill mid-stream, not mid-scan.
      const live = async () => {
        const r = await fetch(firehook.health, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined)
        return r === undefined ? undefined : ((await r.json().catch(() => ({}))) as { phase?: unknown }).phase
      }
      await waitUntil(async () => (await live()) === "live", 60_000, "the start's backfill sweep done (phase live)")
      const TOTAL = 60
      const written: Array<string> = []
      /** the deployment killed mid-stream (its output, for a failure message) */
      let killed: Deployment | undefined
      for (let i = 0; i < TOTAL; i++) {
        written.push((await post(erin, `post ${i}`)).rkey)
        if (i === 20) {
          // mid-stream: some events are delivered, some enqueued, some not yet read
          killed = firehook
          firehook.running.child.kill("SIGKILL")
          expect((await exitWithin(firehook.running, 10_000)).signal).toBe("SIGKILL")
        }
        if (i === 40) {
          firehook = await startDeployment(dataDir, firehookEnv())
        }
      }
      await waitUntil(
        () => new Set(at(path).map((r) => bodyOf(r)["rkey"])).size >= TOTAL,
        90_000,
        "every delivery after the restart",
        // what kept the rows from being delivered: the rows, the owner's reconciliation, and both
        // processes' last output (the restarted one with its health)
        async () =>
          [
            `got ${new Set(at(path).map((r) => bodyOf(r)["rkey"])).size} of ${TOTAL} (${at(path).length} requests)`,
            await webhookDiagnostics(db, erin.did, "all"),
            `--- restarted firehook:\n${await processTail(firehook)}`,
            `--- killed firehook:\n${killed === undefined ? "none" : await processTail(killed, 20)}`
          ].join("\n")
      )
      const got = at(path)
      expect(new Set(got.map((r) => bodyOf(r)["rkey"]))).toEqual(new Set(written))
      // one Idempotency-Key per event, however many times it came
      const keys = new Map<string, Set<string>>()
      for (const r of got) {
        const id = String(bodyOf(r)["id"])
        const set = keys.get(id) ?? new Set<string>()
        set.add(String(r.headers["idempotency-key"]))
        keys.set(id, set)
        expect(r.verified).toEqual({ standard: true, wisp: true })
      }
      expect(keys.size).toBe(TOTAL)
      for (const set of keys.values()) expect(set.size).toBe(1)
      const [rows] = await query<{ n: string }>(db, "SELECT count(*)::text AS n FROM outbox WHERE owner_did = $1", [
        erin.did
      ])
      expect(rows?.n).toBe(String(TOTAL))
    },
    180_000
  )
})
