/**
 * `firehook hooks …` (the webhook owner's CLI, `bun src/cli/main.ts`) against a real local PDS
 * (`@atproto/dev-env`), with an app password and no firehook configuration at all; and firehook
 * itself (`bun src/main.ts`, as in test/e2e/atproto.test.ts) delivering for the webhooks the CLI
 * wrote, to a receiver that verifies both signatures.
 *
 * Acceptance (issue #7): create → list shows it → firehook delivers for it → disable → no more
 * deliveries → (enable → delivers again) → delete → no more deliveries → list empty. The absence of
 * a delivery is proven without sleeping: a second webhook on the same collection is the sentinel
 * (the stream is ordered, and a webhook's outbox rows are written with the event's batch).
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
import { runCli, waitFor } from "../support/proc.js"
import { expectOk, expectOneLineError, lines } from "./cli-expect.js"

const res = e2eResources()
const scope = Effect.runSync(Scope.make())
let devnet: Devnet
let db: string
let firehook: Deployment
let rx: Receiver
/** the secret of each webhook, by its AT-URI, for the receiver's verification */
const secrets = new Map<string, string>()

beforeAll(async () => {
  devnet = await startDevnet()
  db = await res.freshDb()
  rx = await Effect.runPromise(Scope.extend(receiver({ secretFor: (uri) => secrets.get(uri) }), scope))
  firehook = await startDeployment(
    res.tempDir(),
    devnetFirehookEnv(devnet, db, { WEBHOOK_SECRET_ENCRYPTION_KEY: randomBytes(32).toString("base64") })
  )
  await waitFor(firehook.health, 200, firehook.running, 60_000)
}, 120_000)

afterAll(() => closeDevnetFile({ firehook, devnet, scope, res }), 60_000)

// ---------------------------------------------------------------------------------------------

/** The owner's environment: the PDS, the identifier, an app password; no firehook configuration. */
interface Owner {
  readonly account: Account
  readonly env: Record<string, string>
  readonly appPassword: string
}

const owner = async (name: string): Promise<Owner> => {
  const account = await createAccount(devnet, name)
  const app = await account.agent.com.atproto.server.createAppPassword({ name: "firehook-cli" })
  const appPassword = app.data.password
  return {
    account,
    appPassword,
    env: {
      ATPROTO_PDS: devnet.pds,
      ATPROTO_IDENTIFIER: account.handle,
      ATPROTO_APP_PASSWORD: appPassword,
      // the receivers are http://127.0.0.1: the service's insecure development mode, read the same way
      NODE_ENV: "test",
      WEBHOOK_ALLOW_INSECURE_DEV: "1"
    }
  }
}

const hooks = (o: Owner, args: ReadonlyArray<string>, env: Record<string, string> = o.env) =>
  runCli(["hooks", ...args], env)

interface Listed {
  readonly did: string
  readonly truncated: boolean
  readonly webhooks: ReadonlyArray<{
    readonly rkey: string
    readonly uri: string
    readonly cid: string
    readonly scope: string | null
    readonly backlinks: boolean
    readonly events: ReadonlyArray<string>
    readonly enabled: boolean
    readonly signing: string
    readonly secretId: string | null
    readonly url: string | null
    readonly accepted: boolean
    readonly invalid: string | null
  }>
}

const list = async (o: Owner, extra: ReadonlyArray<string> = []): Promise<Listed> => {
  const r = await hooks(o, ["list", "--json", ...extra])
  expectOk(r)
  return JSON.parse(r.stdout) as Listed
}

/** The owner's wh records as the PDS has them (independently of the CLI). */
const pdsRecords = async (o: Owner) =>
  (await o.account.agent.com.atproto.repo.listRecords({ repo: o.account.did, collection: WH, limit: 100 })).data.records

interface WebhookRow {
  readonly cid: string | null
  readonly enabled: boolean
  readonly active: boolean
}

/** Wait until firehook's registry row for the webhook satisfies `ok` (`undefined` = no row). */
const waitWebhook = (o: Owner, rkey: string, ok: (row: WebhookRow | undefined) => boolean, what: string) =>
  waitUntil(
    async () =>
      ok(
        (await query<WebhookRow>(db, "SELECT cid, enabled, active FROM webhooks WHERE owner_did = $1 AND rkey = $2", [
          o.account.did,
          rkey
        ]))[0]
      ),
    30_000,
    what,
    () => firehook.running.stdout().slice(-3000)
  )

const at = (path: string): Array<Received> => rx.received.filter((r) => r.path === path)
const rkeyOfBody = (r: Received) => (JSON.parse(r.body.toString("utf8")) as Record<string, unknown>)["rkey"]
const got = (path: string, rkey: string) => at(path).some((r) => rkeyOfBody(r) === rkey)

const post = (o: Owner, text: string) => createRecord(o.account, "app.bsky.feed.post", { text, createdAt: nowIso() })

const outboxRkeys = async (o: Owner, webhookRkey: string): Promise<ReadonlyArray<string>> =>
  (
    await query<{ event_rkey: string }>(
      db,
      "SELECT event_rkey FROM outbox WHERE owner_did = $1 AND webhook_rkey = $2",
      [
        o.account.did,
        webhookRkey
      ]
    )
  ).map((r) => r.event_rkey)

// ---------------------------------------------------------------------------------------------

describe("firehook hooks (webhook owners' CLI) on a real PDS", () => {
  it("--help works without any environment", async () => {
    for (const args of [["hooks", "--help"], ["hooks", "create", "--help"], ["hooks", "list", "--help"]]) {
      const r = await runCli(args, {})
      expect(r.code, r.stderr).toBe(0)
      expect(r.stdout).toContain("USAGE")
      expect(r.stdout).toContain("--identifier")
    }
    const create = await runCli(["hooks", "create", "--help"], {})
    for (
      const flag of [
        "--scope",
        "--collection",
        "--url",
        "--events",
        "--secret-id",
        "--generate-secret",
        "--pds",
        "--identifier"
      ]
    ) {
      expect(create.stdout).toContain(flag)
    }
    // no subcommand: a usage error, one line
    expectOneLineError(await runCli(["hooks"], {}), 2)
  }, 60_000)

  it("invalid input: exit 2 with one line, checked before signing in, nothing written to the PDS", async () => {
    const dave = await owner("dave")
    const own = `at://${dave.account.did}/app.bsky.feed.post`
    const secret = `s3cret-${randomBytes(12).toString("hex")}`
    const cases: ReadonlyArray<ReadonlyArray<string>> = [
      ["create", "--scope", own, "--url", "ftp://example.com/hook"],
      ["create", "--scope", own, "--url", "https://user:pw@example.com/hook"],
      ["create", "--scope", own, "--url", "https://10.0.0.1/hook"],
      ["create", "--scope", own, "--url", "https://metadata.google.internal/hook"],
      ["create", "--scope", "at://dave.test/app.bsky.feed.post", "--url", "https://example.com/hook"],
      ["create", "--scope", `${own}?x=1`, "--url", "https://example.com/hook"],
      ["create", "--collection", "no/such", "--url", "https://example.com/hook"],
      ["create", "--scope", own, "--collection", "app.bsky.feed.post", "--url", "https://example.com/hook"],
      ["create", "--url", "https://example.com/hook"],
      ["create", "--scope", own, "--url", "https://example.com/hook", "--secret", secret, "--secret-id", "main"],
      ["create", "--scope", own, "--url", "https://example.com/hook", "--secret-id", "bad name"],
      ["create", "--scope", own, "--url", "https://example.com/hook", "--events", "create,create"],
      ["create", "--scope", own, "--url", "https://example.com/hook", "--events", "create,upsert"],
      ["create", "--scope", own, "--url", "https://example.com/hook", "--rkey", "a/b"],
      ["create", "--scope", own],
      ["create", "--scope", own, "--url", "https://example.com/hook", "--pds", "http://example.com"],
      // an unreachable PDS: the arguments fail first (no sign-in is attempted)
      ["create", "--scope", own, "--url", "ftp://example.com/hook", "--pds", "http://127.0.0.1:1"],
      ["disable", "a/b"],
      ["delete"]
    ]
    const results = await Promise.all(cases.map((args) => hooks(dave, args)))
    results.forEach((r, i) => {
      expectOneLineError(r, 2)
      expect(r.stderr, String(cases[i])).not.toContain(secret)
      expect(r.stderr).not.toContain(dave.appPassword)
    })
    // the receiver URL rules are the service's: http:// to loopback only in insecure development
    // mode, and that mode only with NODE_ENV=development|test
    const loopback = ["create", "--scope", own, "--url", "http://127.0.0.1:9/hook"]
    const { NODE_ENV: _n, WEBHOOK_ALLOW_INSECURE_DEV: _w, ...plain } = dave.env
    expectOneLineError(await hooks(dave, loopback, plain), 2)
    const prod = await hooks(dave, loopback, { ...plain, WEBHOOK_ALLOW_INSECURE_DEV: "1" })
    expectOneLineError(prod, 2)
    expect(prod.stderr).toContain("WEBHOOK_ALLOW_INSECURE_DEV")
    // nothing was written
    expect(await pdsRecords(dave)).toEqual([])
    expect((await list(dave)).webhooks).toEqual([])
    // missing credentials are usage errors too
    const { ATPROTO_APP_PASSWORD: _p, ...noPassword } = dave.env
    expectOneLineError(await hooks(dave, ["list"], noPassword), 2)
    const { ATPROTO_IDENTIFIER: _i, ...noIdentifier } = dave.env
    expectOneLineError(await hooks(dave, ["list"], noIdentifier), 2)
  }, 90_000)

  it("a wrong password: exit 1 with one line, the password never echoed", async () => {
    const erin = await owner("erin")
    const wrong = `wrong-${randomBytes(8).toString("hex")}`
    const viaFlag = await hooks(erin, ["list", "--password", wrong], { ...erin.env, ATPROTO_APP_PASSWORD: "" })
    expectOneLineError(viaFlag, 1)
    expect(viaFlag.stderr).toBe("firehook: login failed: invalid identifier or password\n")
    const viaEnv = await hooks(
      erin,
      ["create", "--collection", "app.bsky.feed.post", "--url", "https://example.com/h"],
      {
        ...erin.env,
        ATPROTO_APP_PASSWORD: wrong
      }
    )
    expectOneLineError(viaEnv, 1)
    expect(viaEnv.stderr).not.toContain(wrong)
    expect(await pdsRecords(erin)).toEqual([])
    // an unreachable PDS: exit 1, one line
    const down = await hooks(erin, ["list", "--pds", "http://127.0.0.1:1"])
    expectOneLineError(down, 1)
    expect(down.stderr).toContain("could not reach the PDS")
  }, 60_000)

  it(
    "create → list → firehook delivers → disable → no deliveries → enable → delete → no deliveries → list empty",
    async () => {
      const frank = await owner("frank")
      const did = frank.account.did

      // A: the webhook under test, on Frank's posts, with a generated secret (printed once)
      const createdA = await hooks(frank, [
        "create",
        "--collection",
        "app.bsky.feed.post",
        "--url",
        `${rx.url}/hook-a`,
        "--generate-secret",
        "--json"
      ])
      expectOk(createdA)
      const a = JSON.parse(createdA.stdout) as {
        did: string
        uri: string
        rkey: string
        cid: string
        enabled: boolean
        secret: string
      }
      expect(a.did).toBe(did)
      expect(a.uri).toBe(`at://${did}/${WH}/${a.rkey}`)
      expect(a.enabled).toBe(true)
      expect(a.secret).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)
      secrets.set(a.uri, a.secret)

      // B: the sentinel, same collection, a caller-given secret and record key (human output)
      const secretB = `sentinel-${randomBytes(16).toString("hex")}`
      const createdB = await hooks(frank, [
        "create",
        "--scope",
        `at://${did}/app.bsky.feed.post`,
        "--url",
        `${rx.url}/hook-b`,
        "--secret",
        secretB,
        "--events",
        "create",
        "--rkey",
        "sentinel"
      ])
      expectOk(createdB)
      expect(lines(createdB.stdout)).toEqual([`created webhook sentinel: at://${did}/${WH}/sentinel`])
      expect(createdB.stdout).not.toContain(secretB)
      secrets.set(`at://${did}/${WH}/sentinel`, secretB)
      // an existing record key is never replaced
      const again = await hooks(frank, [
        "create",
        "--collection",
        "app.bsky.feed.post",
        "--url",
        `${rx.url}/other`,
        "--rkey",
        "sentinel"
      ])
      expectOneLineError(again, 1)
      expect(again.stderr).toContain("already exists")

      // list shows both: no secret, no URL unless asked
      const listed = await list(frank)
      expect(listed.did).toBe(did)
      expect(listed.truncated).toBe(false)
      const byRkey = new Map(listed.webhooks.map((w) => [w.rkey, w] as const))
      expect([...byRkey.keys()].sort()).toEqual([a.rkey, "sentinel"].sort())
      expect(byRkey.get(a.rkey)).toEqual({
        rkey: a.rkey,
        uri: a.uri,
        cid: a.cid,
        scope: `at://${did}/app.bsky.feed.post`,
        backlinks: false,
        backlinksOnly: false,
        events: ["create", "update", "delete"],
        enabled: true,
        signing: "secret",
        secretId: null,
        createdAt: expect.any(String),
        url: "[redacted]",
        accepted: true,
        invalid: null
      })
      expect(byRkey.get("sentinel")).toMatchObject({ events: ["create"], signing: "secret", accepted: true })
      const json = JSON.stringify(listed)
      expect(json).not.toContain(a.secret)
      expect(json).not.toContain(secretB)
      expect(json).not.toContain(rx.url)
      const withUrls = await list(frank, ["--show-urls"])
      expect(new Set(withUrls.webhooks.map((w) => w.url))).toEqual(new Set([`${rx.url}/hook-a`, `${rx.url}/hook-b`]))
      const table = await hooks(frank, ["list"])
      expectOk(table)
      expect(table.stdout).toContain(a.rkey)
      expect(table.stdout).toContain("accepted")
      expect(table.stdout).not.toContain(rx.url)
      expect(table.stdout).not.toContain(a.secret)

      // firehook registers both and delivers a post to both, signed with the CLI's secrets
      await waitWebhook(frank, a.rkey, (row) => row?.cid === a.cid && row.active, "webhook A registered")
      await waitWebhook(frank, "sentinel", (row) => row?.active === true, "webhook B registered")
      const p1 = await post(frank, "one")
      await waitUntil(() => got("/hook-a", p1.rkey) && got("/hook-b", p1.rkey), 30_000, "p1 delivered to A and B")
      for (const r of [...at("/hook-a"), ...at("/hook-b")]) expect(r.verified).toEqual({ standard: true, wisp: true })
      expect(at("/hook-a")[0]?.headers["x-firehook-webhook"]).toBe(a.uri)

      // disable A: firehook stops matching it; B (the sentinel) proves the next post was processed
      const disabled = await hooks(frank, ["disable", a.rkey])
      expectOk(disabled)
      expect(lines(disabled.stdout)).toEqual([`disabled webhook ${a.rkey}`])
      const disabledAgain = await hooks(frank, ["disable", a.rkey, "--json"])
      expectOk(disabledAgain)
      expect(JSON.parse(disabledAgain.stdout)).toMatchObject({ rkey: a.rkey, enabled: false, changed: false })
      const afterDisable = (await list(frank)).webhooks.find((w) => w.rkey === a.rkey)
      expect(afterDisable).toMatchObject({ enabled: false, accepted: true, signing: "secret" })
      // the record kept everything else (the PDS's copy)
      const stored = (await pdsRecords(frank)).find((r) => r.uri === a.uri)?.value
      expect(stored).toMatchObject({
        enabled: false,
        secret: a.secret,
        url: `${rx.url}/hook-a`,
        scope: { aturi: `at://${did}/app.bsky.feed.post` }
      })
      await waitWebhook(frank, a.rkey, (row) => row?.enabled === false && row.active === false, "webhook A disabled")
      const p2 = await post(frank, "two")
      await waitUntil(() => got("/hook-b", p2.rkey), 30_000, "p2 delivered to the sentinel")
      expect(got("/hook-a", p2.rkey)).toBe(false)
      expect(await outboxRkeys(frank, a.rkey)).not.toContain(p2.rkey)
      expect(await outboxRkeys(frank, "sentinel")).toContain(p2.rkey)

      // enable A again: deliveries resume
      const enabled = await hooks(frank, ["enable", a.rkey, "--json"])
      expectOk(enabled)
      expect(JSON.parse(enabled.stdout)).toMatchObject({ rkey: a.rkey, uri: a.uri, enabled: true, changed: true })
      await waitWebhook(frank, a.rkey, (row) => row?.enabled === true && row.active, "webhook A re-enabled")
      const p3 = await post(frank, "three")
      await waitUntil(() => got("/hook-a", p3.rkey), 30_000, "p3 delivered to A")

      // delete A: gone from the PDS and from firehook; the next post reaches only the sentinel
      const deleted = await hooks(frank, ["delete", a.rkey])
      expectOk(deleted)
      expect(lines(deleted.stdout)).toEqual([`deleted webhook ${a.rkey}`])
      const deletedAgain = await hooks(frank, ["delete", a.rkey])
      expectOneLineError(deletedAgain, 1)
      expect(deletedAgain.stderr).toContain("no webhook record")
      expectOneLineError(await hooks(frank, ["enable", a.rkey]), 1)
      await waitWebhook(frank, a.rkey, (row) => row === undefined, "webhook A removed")
      const p4 = await post(frank, "four")
      await waitUntil(() => got("/hook-b", p4.rkey), 30_000, "p4 delivered to the sentinel")
      expect(got("/hook-a", p4.rkey)).toBe(false)
      expect(at("/hook-a").map(rkeyOfBody)).toEqual([p1.rkey, p3.rkey])

      // delete the sentinel: the list is empty
      const deletedB = await hooks(frank, ["delete", "sentinel", "--json"])
      expectOk(deletedB)
      expect(JSON.parse(deletedB.stdout)).toEqual({
        rkey: "sentinel",
        uri: `at://${did}/${WH}/sentinel`,
        deleted: true
      })
      expect((await list(frank)).webhooks).toEqual([])
      expect(await pdsRecords(frank)).toEqual([])
      const empty = await hooks(frank, ["list"])
      expectOk(empty)
      expect(lines(empty.stdout)).toEqual([`no webhooks in ${did}`])
    },
    180_000
  )
})
