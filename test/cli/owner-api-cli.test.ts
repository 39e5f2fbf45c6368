/**
 * `firehook hooks status|deliveries|show|redeliver|replay|test|resume|tail|secrets` (the owners' API
 * from the command line, SPEC §8.6) with a real local PDS (`@atproto/dev-env`) minting the service
 * tokens: against a running firehook (`bun src/main.ts`: every command, a receiver on a real socket
 * getting the deliveries and the test send, the live tail over a real WebSocket) and against a tiny
 * XRPC server on a real socket (./owner-api-fake.ts) that answers per the lexicons with fixed
 * views (the states, errors and frames a fresh deployment does not produce), which also checks that
 * every call carries a token for its own method and the service's DID.
 *
 * Bad arguments exit 2 before signing in (the PDS given is unreachable: a sign-in would exit 1);
 * refusals exit 1 with the XRPC error name and message on one line; tokens are never printed.
 */
import { Effect, Exit, Scope } from "effect"
import { randomBytes } from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"
import { type Receiver, receiver } from "../delivery/worker-support.js"
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
import { type CliResult, exitWithin, freePort, killUnlessExited, runCli, spawnCli, waitFor } from "../support/proc.js"
import { expectOk, expectOneLineError, lines } from "./cli-expect.js"
import { cborFrame, checked, FAKE_DID, type FakeXrpc, startFake } from "./owner-api-fake.js"

const res = e2eResources()
let devnet: Devnet
let firehook: Deployment
let service: string
let fake: FakeXrpc
let db: string
let rx: Receiver
const scope = Effect.runSync(Scope.make())

beforeAll(async () => {
  devnet = await startDevnet(180_000)
  db = await res.freshDb()
  rx = await Effect.runPromise(Scope.extend(receiver(), scope))
  const apiPort = await freePort()
  service = `http://127.0.0.1:${apiPort}`
  firehook = await startService(db, apiPort)
  fake = await startFake()
  await waitFor(firehook.health, 200, firehook.running, 60_000)
}, 400_000)

const startService = (db: string, apiPort: number) =>
  startDeployment(
    res.tempDir(),
    devnetFirehookEnv(devnet, db, {
      WEBHOOK_SECRET_ENCRYPTION_KEY: randomBytes(32).toString("base64"),
      // the service DID comes from PUBLIC_URL (did:web:localhost%3A<port>), published in did.json
      PUBLIC_URL: `http://localhost:${apiPort}`,
      API_PORT: String(apiPort),
      LOG_LEVEL: "debug",
      // the production topology: the API in the root process, delivery in its child, so the
      // tail's outcomes cross processes (NOTIFY, on the tail's demand)
      DELIVERY_PROCESS: "child"
    })
  )

afterAll(async () => {
  if (firehook !== undefined && firehook.running.child.exitCode === null) {
    firehook.running.child.kill("SIGTERM")
    await exitWithin(firehook.running, 20_000).catch(() => undefined)
  }
  await fake?.close()
  await devnet?.close()
  await Effect.runPromise(Scope.close(scope, Exit.void))
  await res.cleanup()
}, 60_000)

// ---------------------------------------------------------------------------------------------

interface Owner {
  readonly account: Account
  readonly appPassword: string
  /** the PDS and credentials, and the running firehook as the service */
  readonly env: Record<string, string>
  /** the PDS and credentials, and the fake XRPC server as the service */
  readonly fakeEnv: Record<string, string>
}

const owner = async (name: string): Promise<Owner> => {
  const account = await createAccount(devnet, name)
  const app = await account.agent.com.atproto.server.createAppPassword({ name: "firehook-cli" })
  const base = {
    ATPROTO_PDS: devnet.pds,
    ATPROTO_IDENTIFIER: account.handle,
    ATPROTO_APP_PASSWORD: app.data.password
  }
  return {
    account,
    appPassword: app.data.password,
    env: { ...base, FIREHOOK_SERVICE_URL: service },
    fakeEnv: { ...base, FIREHOOK_SERVICE_URL: fake.url, FIREHOOK_SERVICE_DID: FAKE_DID }
  }
}

const hooks = (env: Record<string, string>, args: ReadonlyArray<string>) => runCli(["hooks", ...args], env)

// fixtures, each checked against its method's output Schema
const T0 = "2026-11-20T10:00:00.000Z"
const T1 = "2026-11-20T10:00:01.500Z"
const webhookView = (did: string) => ({
  uri: `at://${did}/${WH}/hook`,
  rkey: "hook",
  cid: "bafyreib2rxk3rh6kzwq",
  scope: { aturi: `at://${did}/app.bsky.feed.post` },
  events: ["create"],
  enabled: true,
  signing: "secretId",
  url: "https://receiver.example/private-path",
  state: "autoDisabled",
  stateReason: "receiver_failing",
  stateSince: T0,
  circuit: "open",
  counts: { pending: 3, deadLetters: 2, delivered24h: 10, failed24h: 4 },
  lastSuccessAt: T0,
  lastFailureAt: T1,
  lastError: { kind: "http_status", httpStatus: 503 }
})
const deliveryView = (did: string) => ({
  id: "whd_v1_0001",
  eventId: "whe_v1_0001",
  rkey: "hook",
  match: "direct",
  event: { operation: "create", did, collection: "app.bsky.feed.post", rkey: "3kpost", cid: "bafyreipost" },
  status: "dead_letter",
  attempts: 2,
  createdAt: T0,
  lastError: { kind: "http_status", httpStatus: 500 }
})

// ---------------------------------------------------------------------------------------------

describe("firehook hooks: the owners' API commands", () => {
  it("--help lists the commands and their options without any environment", async () => {
    const top = await runCli(["hooks", "--help"], {})
    expect(top.code, top.stderr).toBe(0)
    for (const c of ["status", "deliveries", "show", "redeliver", "replay", "test", "resume", "tail", "secrets"]) {
      expect(top.stdout).toContain(c)
    }
    const d = await runCli(["hooks", "deliveries", "--help"], {})
    expect(d.code, d.stderr).toBe(0)
    for (const flag of ["--status", "--since", "--until", "--limit", "--cursor", "--service", "--service-did"]) {
      expect(d.stdout).toContain(flag)
    }
    expectOneLineError(await runCli(["hooks", "secrets"], {}), 2)
  }, 120_000)

  it("bad arguments exit 2 with one line, before signing in", async () => {
    // the PDS is unreachable: any sign-in would fail with exit 1 ("could not reach the PDS")
    const env = {
      ATPROTO_PDS: "http://127.0.0.1:1",
      ATPROTO_IDENTIFIER: "nobody.test",
      ATPROTO_APP_PASSWORD: "app-password-that-is-never-sent",
      FIREHOOK_SERVICE_URL: "http://127.0.0.1:1",
      FIREHOOK_SERVICE_DID: FAKE_DID
    }
    const cases: ReadonlyArray<ReadonlyArray<string>> = [
      ["deliveries", "--limit", "0"],
      ["deliveries", "--status", "lost"],
      ["deliveries", "--since", "2026-01-02", "--until", "2026-01-01"],
      ["deliveries", "a/b"],
      ["show", "not an id"],
      ["redeliver", "x".repeat(129)],
      ["replay", "--rkey", ".."],
      ["test", "a/b"],
      ["resume"],
      ["secrets", "create", "bad name"],
      ["secrets", "rotate", "x".repeat(65)],
      ["status", "--service", "http://example.com"],
      ["status", "--service", "https://example.com/path"],
      ["tail", "--service-did", "not-a-did"]
    ]
    // a few at a time: the machine running the tests may be small
    const results: Array<CliResult> = []
    for (let i = 0; i < cases.length; i += 4) {
      results.push(...(await Promise.all(cases.slice(i, i + 4).map((args) => hooks(env, args)))))
    }
    results.forEach((r, i) => {
      expect(r.code, `${cases[i]?.join(" ")}: ${r.stderr}`).toBe(2)
      expectOneLineError(r, 2)
      expect(r.stderr).not.toContain("could not reach")
      expect(r.stderr).not.toContain(env.ATPROTO_APP_PASSWORD)
    })
    // the service and the credentials are required
    const { FIREHOOK_SERVICE_URL: _s, ...noService } = env
    const missing = await hooks(noService, ["status"])
    expectOneLineError(missing, 2)
    expect(missing.stderr).toContain("--service")
    const { ATPROTO_APP_PASSWORD: _p, ...noPassword } = env
    expectOneLineError(await hooks(noPassword, ["secrets", "list"]), 2)
    // arguments that are fine get as far as the (unreachable) PDS: exit 1
    const reachesPds = await hooks(env, ["deliveries", "hook", "--status", "dead_letter", "--since", "7d"])
    expectOneLineError(reachesPds, 1)
    expect(reachesPds.stderr).toContain("could not reach the PDS")
  }, 300_000)

  it("secrets against the running firehook: create, list, rotate, delete; refusals exit 1", async () => {
    const alice = await owner("alice")
    const bob = await owner("bob")

    // the service DID is read from the service's /.well-known/did.json
    const created = await hooks(alice.env, ["secrets", "create", "main"])
    expectOk(created)
    expect(lines(created.stdout)).toHaveLength(1)
    const token = created.stdout.trim()
    expect(token).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)

    const listed = await hooks(alice.env, ["secrets", "list", "--json"])
    expectOk(listed)
    const list = JSON.parse(listed.stdout) as { secrets: Array<{ name: string; createdAt: string }> }
    expect(list).toEqual({ secrets: [{ name: "main", createdAt: expect.any(String) }] })
    expect(listed.stdout).not.toContain("whsec_")
    const table = await hooks(alice.env, ["secrets", "list"])
    expectOk(table)
    expect(lines(table.stdout)[0]).toMatch(/^NAME\s+CREATED\s+LAST-ROTATED$/)
    expect(lines(table.stdout)[1]).toMatch(new RegExp(`^main\\s+${list.secrets[0]?.createdAt}\\s+-$`))

    const rotated = await hooks(alice.env, ["secrets", "rotate", "main", "--json"])
    expectOk(rotated)
    const r = JSON.parse(rotated.stdout) as { name: string; token: string; rotatedAt: string }
    expect(r).toEqual({ name: "main", token: expect.stringMatching(/^whsec_/), rotatedAt: expect.any(String) })
    expect(r.token).not.toBe(token)

    // refusals: the XRPC error name and message, exit 1
    const again = await hooks(alice.env, ["secrets", "create", "main"])
    expectOneLineError(again, 1)
    expect(again.stderr).toMatch(/^firehook: AlreadyExists: /)
    const bobDeletes = await hooks(bob.env, ["secrets", "delete", "main"])
    expectOneLineError(bobDeletes, 1)
    expect(bobDeletes.stderr).toMatch(/^firehook: NotFound: /)
    // a token for another service DID is refused by firehook
    const otherAud = await hooks({ ...alice.env, FIREHOOK_SERVICE_DID: "did:web:elsewhere.test" }, ["secrets", "list"])
    expectOneLineError(otherAud, 1)
    expect(otherAud.stderr).toMatch(/^firehook: InvalidToken: /)
    // a wrong password: the PDS refuses the sign-in
    const wrong = await hooks({ ...alice.env, ATPROTO_APP_PASSWORD: "wrong-password-000" }, ["secrets", "list"])
    expectOneLineError(wrong, 1)
    expect(wrong.stderr).toBe("firehook: login failed: invalid identifier or password\n")

    const deleted = await hooks(alice.env, ["secrets", "delete", "main"])
    expectOk(deleted)
    expect(lines(deleted.stdout)).toEqual(["deleted secret main"])
    const empty = await hooks(alice.env, ["secrets", "list"])
    expectOk(empty)
    expect(lines(empty.stdout)).toEqual(["no secrets"])
    const deletedJson = await hooks(alice.env, ["secrets", "delete", "main", "--json"])
    expectOneLineError(deletedJson, 1)
    expect(deletedJson.stderr).toMatch(/^firehook: NotFound: /)

    // no token and no secret value in the service's logs
    const logs = firehook.running.stdout() + firehook.running.stderr()
    expect(logs).toContain("api call")
    for (const s of [token, r.token]) expect(logs).not.toContain(s)
  }, 300_000)

  it("deliveries and show against the running firehook: the delivery, its attempt, the receiver's answer", async () => {
    const erin = await owner("erin")
    const frank = await owner("frank")
    const ref = await createRecord(erin.account, WH, {
      scope: { aturi: `at://${erin.account.did}/app.bsky.feed.post` },
      url: `${rx.url}/erin`,
      secret: "erin-inline-secret-0123456789",
      createdAt: nowIso()
    }, "hook")
    await waitUntil(
      async () =>
        (await query<{ cid: string }>(db, "SELECT cid FROM webhooks WHERE owner_did = $1 AND rkey = 'hook'", [
          erin.account.did
        ]))[0]?.cid === ref.cid,
      60_000,
      "erin's hook registered"
    )
    const posted = await createRecord(erin.account, "app.bsky.feed.post", { text: "to the log", createdAt: nowIso() })
    await waitUntil(() => rx.received.some((r) => r.path === "/erin"), 60_000, "the delivery to erin's receiver")
    type Listed = { deliveries: Array<{ id: string; status: string; event: { rkey: string } }> }
    let listed: Listed = { deliveries: [] }
    await waitUntil(
      async () => {
        const r = await hooks(erin.env, ["deliveries", "hook", "--json"])
        listed = r.code === 0 ? (JSON.parse(r.stdout) as Listed) : listed
        return listed.deliveries.some((d) => d.status === "delivered")
      },
      90_000,
      "the delivery recorded as delivered"
    )
    const d = listed.deliveries.find((x) => x.event.rkey === posted.rkey)
    expect(d).toMatchObject({ status: "delivered", event: { rkey: posted.rkey } })
    const id = String(d?.id)
    const table = await hooks(erin.env, ["deliveries"])
    expectOk(table)
    expect(table.stdout).toMatch(
      new RegExp(
        `^${id}\\s+\\S+\\s+hook\\s+create app\\.bsky\\.feed\\.post/${posted.rkey}\\s+delivered\\s+1\\s+-$`,
        "m"
      )
    )
    const shown = await hooks(erin.env, ["show", id])
    expectOk(shown)
    expect(shown.stdout).toMatch(/^1\s+\S+\s+\d+\s+delivered\s+200\s+-\s+ok$/m)
    const json = await hooks(erin.env, ["show", id, "--json"])
    expectOk(json)
    expect((JSON.parse(json.stdout) as { attempts: unknown }).attempts).toEqual([
      expect.objectContaining({ n: 1, outcome: "delivered", httpStatus: 200, responseExcerpt: "ok" })
    ])
    // another owner: NotFound, exit 1
    const other = await hooks(frank.env, ["show", id])
    expectOneLineError(other, 1)
    expect(other.stderr).toMatch(/^firehook: NotFound/)
    // the receiver's URL and secret never reached the service's logs
    const logs = firehook.running.stdout() + firehook.running.stderr()
    expect(logs).not.toContain(rx.url)
    expect(logs).not.toContain("erin-inline-secret-0123456789")
  }, 400_000)

  it("status, test, tail, redeliver, replay, resume against the running firehook", async () => {
    const gina = await owner("gina")
    const ref = await createRecord(gina.account, WH, {
      scope: { aturi: `at://${gina.account.did}/app.bsky.feed.post` },
      url: `${rx.url}/gina`,
      secret: "gina-inline-secret-0123456789",
      createdAt: nowIso()
    }, "hook")
    await waitUntil(
      async () =>
        (await query<{ cid: string }>(db, "SELECT cid FROM webhooks WHERE owner_did = $1 AND rkey = 'hook'", [
          gina.account.did
        ]))[0]?.cid === ref.cid,
      60_000,
      "gina's hook registered"
    )

    // status: the webhook, active
    const status = await hooks(gina.env, ["status"])
    expectOk(status)
    expect(lines(status.stdout)[0]).toMatch(/^RKEY\s+STATE\s+CIRCUIT\s+/)
    expect(status.stdout).toMatch(/^hook\s+active\s+closed\s+/m)
    expect(status.stdout).not.toContain(rx.url)
    const statusJson = await hooks(gina.env, ["status", "--json"])
    expectOk(statusJson)
    const listed = JSON.parse(statusJson.stdout) as { webhooks: Array<{ rkey: string; state: string; url: string }> }
    expect(listed.webhooks).toEqual([
      expect.objectContaining({ rkey: "hook", state: "active", url: "[redacted]", uri: ref.uri })
    ])

    // the deployment delivers in its child process: the outcome below crosses processes
    const deployed = (await (await fetch(firehook.health, { signal: AbortSignal.timeout(2000) })).json()) as {
      deliveryProcess?: { mode: string; state: string }
    }
    expect(deployed.deliveryProcess).toMatchObject({ mode: "child", state: "running" })

    // a tail started before the test send prints that delivery's outcome. Nothing tells when its
    // subscription is open, so: send a test, wait (bounded) for its line; at most a few sends.
    const tailing = spawnCli(["hooks", "tail", "--json"], gina.env)
    let testId = ""
    try {
      type Outcome = { $type: string; id: string; rkey: string; event: string; status: string; httpStatus?: number }
      const outcomes = () => lines(tailing.stdout()).map((l) => JSON.parse(l) as Outcome)
      // its connection is open once the service's gauge counts it (bounded; the retries below
      // remain for the moment between that and its demand reaching the delivery child)
      const metrics = firehook.health.replace(/\/health$/, "/metrics")
      await waitUntil(
        async () =>
          /^firehook_tail_connections(\{[^}]*\})? [1-9]/m.test(
            await (await fetch(metrics, { signal: AbortSignal.timeout(2000) })).text()
          ),
        20_000,
        "the tail's connection open"
      ).catch(() => undefined)
      for (let attempt = 0; attempt < 5 && testId === ""; attempt++) {
        const tested = await hooks(gina.env, ["test", "hook", "--json"])
        expectOk(tested)
        const { id } = JSON.parse(tested.stdout) as { id: string }
        expect(id).toMatch(/^whd_/)
        const seen = await waitUntil(() => outcomes().some((o) => o.id === id), 20_000, "the test outcome on the tail")
          .then(() => true, () => false)
        if (seen) testId = id
      }
      expect(testId, `tail stdout: ${tailing.stdout()} stderr: ${tailing.stderr()}`).not.toBe("")
      expect(outcomes().filter((o) => o.id === testId)).toEqual([
        {
          $type: "dev.firehook.webhook.subscribeDeliveries#outcome",
          id: testId,
          rkey: "hook",
          event: "test",
          status: "delivered",
          httpStatus: 200,
          at: expect.any(String)
        }
      ])
      // the receiver got the test send, marked as a test
      const testSends = rx.received.filter((r) => r.path === "/gina" && r.headers["x-firehook-test"] === "1")
      expect(testSends.length).toBeGreaterThanOrEqual(1)
      tailing.child.kill("SIGTERM")
      expect(await tailing.exit).toBe(130)
    } finally {
      // a tail that did not stop must not outlive its test (it runs until it is stopped)
      killUnlessExited(tailing.child)
    }

    // the actions, each answered by the running firehook
    const sendsBefore = rx.received.filter((r) => r.path === "/gina").length
    const redelivered = await hooks(gina.env, ["redeliver", testId])
    expectOk(redelivered)
    expect(lines(redelivered.stdout)).toEqual([`redelivering ${testId} (was delivered)`])
    await waitUntil(
      () => rx.received.filter((r) => r.path === "/gina").length > sendsBefore,
      60_000,
      "the redelivery reached the receiver"
    )
    const replayed = await hooks(gina.env, ["replay", "--json"])
    expectOk(replayed)
    expect(JSON.parse(replayed.stdout)).toEqual({ replayed: 0, truncated: false })
    const resumed = await hooks(gina.env, ["resume", "hook", "--json"])
    expectOk(resumed)
    expect(JSON.parse(resumed.stdout)).toEqual({ state: "active", replayed: 0 })
    // another owner's rkey: NotFound
    const other = await owner("hank")
    const notHis = await hooks(other.env, ["test", "hook"])
    expectOneLineError(notHis, 1)
    expect(notHis.stderr).toMatch(/^firehook: NotFound/)

    const logs = firehook.running.stdout() + firehook.running.stderr()
    expect(logs).not.toContain(rx.url)
    expect(logs).not.toContain("gina-inline-secret-0123456789")
  }, 400_000)

  it(
    "status, deliveries, show, redeliver, replay, test, resume (lexicon-conformant server): human and --json",
    async () => {
      const carol = await owner("carol")
      const did = carol.account.did
      const view = webhookView(did)
      const rejected = {
        ...view,
        uri: `at://${did}/${WH}/broken`,
        rkey: "broken",
        state: "rejected",
        stateReason: "url",
        circuit: "closed",
        counts: { pending: 0, deadLetters: 0, delivered24h: 0, failed24h: 0 }
      }
      const { lastError: _e, lastFailureAt: _f, lastSuccessAt: _s, stateSince: _t, ...rejectedView } = rejected
      fake.answers.set(
        "dev.firehook.webhook.list",
        () => ({ status: 200, body: checked(WebhookLexicon.list, { webhooks: [view, rejectedView] }) })
      )
      const delivery = deliveryView(did)
      fake.answers.set("dev.firehook.webhook.listDeliveries", (call) => ({
        status: 200,
        body: checked(WebhookLexicon.listDeliveries, {
          deliveries: [delivery],
          ...(call.query["cursor"] === undefined ? { cursor: "page-2" } : {})
        })
      }))
      const detail = {
        delivery,
        payload: { did, rkey: "3kpost", record: { text: "hello" } },
        attempts: [
          {
            n: 1,
            startedAt: T0,
            durationMs: 12,
            outcome: "retry",
            httpStatus: 500,
            responseExcerpt: "boom\u001b[31m\nred"
          },
          { n: 2, startedAt: T1, durationMs: 7, outcome: "dead_letter", errorKind: "timeout" }
        ],
        olderAttempts: 0
      }
      fake.answers.set("dev.firehook.webhook.getDelivery", (call) =>
        call.query["id"] === delivery.id
          ? { status: 200, body: checked(WebhookLexicon.getDelivery, detail) }
          : { status: 400, body: { error: "NotFound", message: "no such delivery" } })
      fake.answers.set("dev.firehook.webhook.redeliver", () => ({
        status: 200,
        body: checked(WebhookLexicon.redeliver, { id: delivery.id, previousStatus: "dead_letter", inactive: true })
      }))
      fake.answers.set("dev.firehook.webhook.replay", () => ({
        status: 200,
        body: checked(WebhookLexicon.replay, { replayed: 2, truncated: false, inactive: 1 })
      }))
      fake.answers.set("dev.firehook.webhook.test", (call) =>
        (call.body as { rkey: string }).rkey === "hook"
          ? { status: 200, body: checked(WebhookLexicon.test, { id: "whd_v1_test" }) }
          : { status: 400, body: { error: "NotFound", message: "no such webhook" } })
      fake.answers.set("dev.firehook.webhook.resume", (call) => ({
        status: 200,
        body: checked(WebhookLexicon.resume, {
          state: "active",
          replayed: (call.body as { replay?: boolean }).replay === true ? 2 : 0
        })
      }))
      const env = carol.fakeEnv
      const callsFrom = fake.calls.length

      // status
      const status = await hooks(env, ["status"])
      expectOk(status)
      expect(lines(status.stdout)[0]).toMatch(/^RKEY\s+STATE\s+CIRCUIT\s+PENDING\s+DEAD\s+OK\/24H\s+FAILED\/24H/)
      expect(status.stdout).toMatch(/hook\s+autoDisabled \(receiver_failing\)\s+open\s+3\s+2\s+10\s+4\s+/)
      expect(status.stdout).toContain("http_status 503")
      expect(status.stdout).toMatch(/broken\s+rejected \(url\)/)
      expect(status.stdout).not.toContain("receiver.example")
      const statusJson = await hooks(env, ["status", "--json"])
      expectOk(statusJson)
      expect(JSON.parse(statusJson.stdout)).toEqual({
        webhooks: [{ ...view, url: "[redacted]" }, { ...rejectedView, url: "[redacted]" }]
      })
      const withUrls = await hooks(env, ["status", "--json", "--show-urls"])
      expect(JSON.parse(withUrls.stdout)).toEqual({ webhooks: [view, rejectedView] })
      expect((await hooks(env, ["status", "--show-urls"])).stdout).toContain("https://receiver.example/private-path")

      // deliveries: the filters reach the service as the lexicon's parameters
      const listed = await hooks(env, ["deliveries", "hook", "--status", "dead_letter", "--since", T0, "--limit", "10"])
      expectOk(listed)
      expect(lines(listed.stdout)[0]).toMatch(/^ID\s+CREATED\s+WEBHOOK\s+EVENT\s+STATUS\s+ATTEMPTS\s+LAST-ERROR$/)
      expect(lines(listed.stdout)[1]).toMatch(
        /^whd_v1_0001\s+2026-11-20T10:00:00.000Z\s+hook\s+create app.bsky.feed.post\/3kpost\s+dead_letter\s+2\s+http_status 500$/
      )
      expect(lines(listed.stdout)[2]).toBe("(more: --cursor page-2)")
      const listCall = fake.calls.filter((c) => c.nsid === "dev.firehook.webhook.listDeliveries").at(-1)
      expect(listCall?.query).toEqual({ rkey: "hook", status: "dead_letter", since: T0, limit: "10" })
      expect(listCall?.method).toBe("GET")
      const page2 = await hooks(env, ["deliveries", "--cursor", "page-2", "--json"])
      expectOk(page2)
      expect(JSON.parse(page2.stdout)).toEqual({ deliveries: [delivery] })

      // show: the attempts with the receiver's answers, control characters never reach the terminal
      const shown = await hooks(env, ["show", delivery.id])
      expectOk(shown)
      expect(shown.stdout).toMatch(/^id: +whd_v1_0001$/m)
      expect(shown.stdout).toMatch(/^status: +dead_letter$/m)
      expect(shown.stdout).toMatch(/^N\s+STARTED\s+MS\s+OUTCOME\s+HTTP\s+ERROR\s+RESPONSE$/m)
      expect(shown.stdout).toMatch(/^1\s+2026-11-20T10:00:00.000Z\s+12\s+retry\s+500\s+-\s+boom \[31m red$/m)
      expect(shown.stdout).toMatch(/^2\s+2026-11-20T10:00:01.500Z\s+7\s+dead_letter\s+-\s+timeout\s+-$/m)
      expect(shown.stdout).toContain(`"text": "hello"`)
      expect(shown.stdout).not.toContain("\u001b")
      const shownJson = await hooks(env, ["show", delivery.id, "--json"])
      expectOk(shownJson)
      expect(JSON.parse(shownJson.stdout)).toEqual(detail)
      const unknown = await hooks(env, ["show", "whd_v1_nope"])
      expectOneLineError(unknown, 1)
      expect(unknown.stderr).toBe("firehook: NotFound: no such delivery\n")

      // actions
      const redelivered = await hooks(env, ["redeliver", delivery.id])
      expectOk(redelivered)
      // the service says the row will not be sent (its webhook changed since): the owner is told
      const NOT_SENT =
        "will not be sent: the webhook was changed, deleted or disabled since (or is gone or auto-disabled: resume it first)"
      expect(lines(redelivered.stdout)).toEqual([
        "redelivering whd_v1_0001 (was dead_letter)",
        `note: it ${NOT_SENT}`
      ])
      const replayedHuman = await hooks(env, ["replay"])
      expectOk(replayedHuman)
      expect(lines(replayedHuman.stdout)).toEqual(["replaying 2 dead letters", `note: 1 of them ${NOT_SENT}`])
      const replayed = await hooks(env, ["replay", "--rkey", "hook", "--since", T0, "--json"])
      expectOk(replayed)
      expect(JSON.parse(replayed.stdout)).toEqual({ replayed: 2, truncated: false, inactive: 1 })
      expect(fake.calls.filter((c) => c.nsid === "dev.firehook.webhook.replay").at(-1)?.body).toEqual({
        rkey: "hook",
        since: T0
      })
      const tested = await hooks(env, ["test", "hook"])
      expectOk(tested)
      expect(lines(tested.stdout)).toEqual([
        "test delivery whd_v1_test queued for webhook hook (see: firehook hooks show whd_v1_test)"
      ])
      const testMissing = await hooks(env, ["test", "nope"])
      expectOneLineError(testMissing, 1)
      expect(testMissing.stderr).toBe("firehook: NotFound: no such webhook\n")
      const resumed = await hooks(env, ["resume", "hook", "--replay"])
      expectOk(resumed)
      expect(lines(resumed.stdout)).toEqual(["webhook hook is active; replaying 2 parked deliveries"])
      expect(fake.calls.filter((c) => c.nsid === "dev.firehook.webhook.resume").at(-1)?.body).toEqual({
        rkey: "hook",
        replay: true
      })
      const resumedJson = await hooks(env, ["resume", "hook", "--json"])
      expect(JSON.parse(resumedJson.stdout)).toEqual({ state: "active", replayed: 0 })
      // more parked rows than one call replays: the service says truncated, the CLI says to run it again
      fake.answers.set("dev.firehook.webhook.resume", () => ({
        status: 200,
        body: checked(WebhookLexicon.resume, { state: "active", replayed: 10_000, truncated: true })
      }))
      const resumedMore = await hooks(env, ["resume", "hook", "--replay"])
      expectOk(resumedMore)
      expect(lines(resumedMore.stdout)).toEqual([
        "webhook hook is active; replaying 10000 parked deliveries",
        "(more than 10000 parked: run resume --replay again)"
      ])

      // every call: carol's own token, for that method, a token used once
      const made = fake.calls.slice(callsFrom)
      expect(made.length).toBeGreaterThanOrEqual(14)
      for (const c of made) expect(c.iss).toBe(did)
      expect(new Set(made.map((c) => c.authorization)).size).toBe(made.length)
      // no output ever held a token
      for (const out of [status, listed, shown, redelivered, replayed, tested, resumed]) {
        for (const c of made) expect(out.stdout + out.stderr).not.toContain(c.authorization.slice(7))
      }
      // a method the service does not serve: exit 1, the XRPC error
      fake.answers.delete("dev.firehook.webhook.list")
      const notServed = await hooks(env, ["status"])
      expectOneLineError(notServed, 1)
      expect(notServed.stderr).toMatch(/^firehook: MethodNotImplemented/)
      // an answer that is not the lexicon's is refused, not printed
      fake.answers.set("dev.firehook.webhook.list", () => ({ status: 200, body: { webhooks: [{ rkey: "x" }] } }))
      const invalid = await hooks(env, ["status", "--json"])
      expectOneLineError(invalid, 1)
      expect(invalid.stderr).toContain("invalid answer")
    },
    300_000
  )

  it("tail: one line per frame (binary and JSON frames), --json, error frames, refused upgrades, SIGTERM", async () => {
    const dave = await owner("dave")
    const env = dave.fakeEnv
    const NS = "dev.firehook.webhook.subscribeDeliveries"
    const outcome = {
      id: "whd_v1_0002",
      rkey: "hook",
      event: "create",
      status: "delivered",
      httpStatus: 200,
      at: T0
    }
    const failedOutcome = {
      id: "whd_v1_0003",
      rkey: "hook",
      event: "test",
      status: "dead_letter",
      errorKind: "timeout",
      at: T1
    }
    fake.refuseUpgrade = undefined
    fake.onSubscribe = (ws) => {
      ws.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
      ws.send(JSON.stringify({ $type: `${NS}#outcome`, ...failedOutcome }))
      ws.send(cborFrame({ op: 1, t: "#info" }, { name: "DeliveriesDropped", dropped: 3 }))
      ws.send(cborFrame({ op: 1, t: "#somethingNew" }, { x: 1 }))
      ws.close(1000)
    }
    const human = await hooks(env, ["tail"])
    expect(human.code, human.stderr).toBe(0)
    expect(lines(human.stdout)).toEqual([
      `${T0}  delivered    hook  create  whd_v1_0002  200`,
      `${T1}  dead_letter  hook  test    whd_v1_0003  timeout`,
      "(the service dropped 3 outcomes: this reader was too slow)"
    ])
    expect(human.stderr).toBe("firehook: the service ended the subscription (1000)\n")
    const json = await hooks(env, ["tail", "--json"])
    expect(json.code, json.stderr).toBe(0)
    expect(lines(json.stdout).map((l) => JSON.parse(l) as unknown)).toEqual([
      { $type: `${NS}#outcome`, ...outcome },
      { $type: `${NS}#outcome`, ...failedOutcome },
      { $type: `${NS}#info`, name: "DeliveriesDropped", dropped: 3 }
    ])
    // the upgrade carried dave's token for this method
    expect(fake.calls.filter((c) => c.nsid === NS).at(-1)?.iss).toBe(dave.account.did)

    // closed with 1001 (going away): the end of the subscription as 1000 is, exit 0
    fake.onSubscribe = (ws) => {
      ws.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
      ws.close(1001, "going away")
    }
    const away = await hooks(env, ["tail"])
    expect(away.code, away.stderr).toBe(0)
    expect(lines(away.stdout)).toEqual([`${T0}  delivered    hook  create  whd_v1_0002  200`])
    expect(away.stderr).toBe("firehook: the service ended the subscription (1001)\n")
    // any other close code is exit 1 with the code and reason
    fake.onSubscribe = (ws) => ws.close(1011, "internal")
    const broken = await hooks(env, ["tail"])
    expectOneLineError(broken, 1)
    expect(broken.stderr).toBe("firehook: the service closed the subscription (1011 internal)\n")

    // an error frame ends it: exit 1 with the error
    fake.onSubscribe = (ws) => {
      ws.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
      ws.send(cborFrame({ op: -1 }, { error: "ConsumerTooSlow", message: "too slow" }))
      ws.close(1008)
    }
    const errored = await hooks(env, ["tail"])
    expect(errored.code).toBe(1)
    expect(lines(errored.stdout)).toHaveLength(1)
    expect(errored.stderr).toBe("firehook: ConsumerTooSlow: too slow\n")

    // a refused upgrade: the reason in XRPC terms
    fake.refuseUpgrade = { status: 401, body: { error: "InvalidToken", message: "token refused" } }
    const refused = await hooks(env, ["tail"])
    expectOneLineError(refused, 1)
    expect(refused.stderr).toBe("firehook: InvalidToken: token refused\n")
    fake.refuseUpgrade = undefined

    // it runs until SIGTERM (Ctrl-C alike): the socket is closed, exit 130
    fake.onSubscribe = (ws) => ws.send(cborFrame({ op: 1, t: "#outcome" }, outcome))
    const running = spawnCli(["hooks", "tail"], env)
    try {
      await waitUntil(() => lines(running.stdout()).length >= 1, 30_000, "the first tail line", running.stderr)
      expect(fake.sockets.size).toBe(1)
      running.child.kill("SIGTERM")
      expect(await running.exit).toBe(130)
    } finally {
      killUnlessExited(running.child)
    }
    expect(lines(running.stdout())).toEqual([`${T0}  delivered    hook  create  whd_v1_0002  200`])
    await waitUntil(() => fake.sockets.size === 0, 10_000, "the subscription closed")
  }, 300_000)
})
