/**
 * `npm run demo`: firehook end to end on your machine, offline, in well under a minute.
 *
 * 1. starts a real local atproto network (`devnet/network.ts`: `@atproto/dev-env`, a real PDS and PLC);
 * 2. starts a webhook receiver on 127.0.0.1 that verifies both signatures and prints what it gets;
 * 3. starts firehook as in production (`bun src/main.ts`) on an embedded PostgreSQL in a temporary
 *    directory, reading the PDS's firehose and resolving DIDs through the local PLC;
 * 4. creates an account, writes a `place.wisp.v2.wh` record (webhook: "POST my posts to the
 *    receiver, signed with this secret") and a post;
 * 5. prints the verified delivery;
 * 6. prints the owner's delivery log as the owner reads it: `firehook hooks deliveries` through the
 *    owners' API, with a service token from the demo PDS; then shuts everything down and exits 0
 *    (1 on any failure).
 *
 * Runs under Node ≥ 22 (`node demo/demo.ts`; the `node` devDependency when started by npm).
 */
import { AtpAgent } from "@atproto/api"
import { type ChildProcess, spawn } from "node:child_process"
import { createHmac, randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { Webhook } from "standardwebhooks"

const ROOT = Path.resolve(import.meta.dirname, "..")
const BIN = Path.join(ROOT, "node_modules", ".bin")
const LIMIT_MS = 55_000
const PASSWORD = "demo-password-0123"
const t0 = performance.now()

const stamp = () => `[${((performance.now() - t0) / 1000).toFixed(1).padStart(4)}s]`
const say = (line: string) => process.stdout.write(`${stamp()} ${line}\n`)
const indent = (text: string) => text.split("\n").map((l) => `         ${l}`).join("\n")
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

const children: Array<ChildProcess> = []
const cleanups: Array<() => Promise<void>> = []
process.once("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL")
})

const freePort = () =>
  new Promise<number>((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const address = server.address()
      const port = typeof address === "object" && address !== null ? address.port : 0
      server.close(() => resolve(port))
    })
  })

/** Poll until `check` returns a value (not undefined), or fail with `what` at the deadline. */
const until = async <A>(what: string, check: () => Promise<A | undefined>, ms = 30_000): Promise<A> => {
  const end = performance.now() + ms
  for (let i = 0; i < 10_000 && performance.now() < end; i++) {
    const value = await check().catch(() => undefined)
    if (value !== undefined) return value
    await sleep(100)
  }
  throw new Error(`timed out waiting for ${what}`)
}

const exited = (child: ChildProcess) =>
  new Promise<void>((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) resolve()
    else child.once("exit", () => resolve())
  })

/** SIGTERM, then SIGKILL after `ms`. */
const stopChild = async (child: ChildProcess, ms: number) => {
  if (child.exitCode !== null || child.signalCode !== null) return
  child.kill("SIGTERM")
  const timer = setTimeout(() => child.kill("SIGKILL"), ms)
  await exited(child)
  clearTimeout(timer)
}

/** `bun src/cli/main.ts <args>` with `env` only; its exit code and output. */
const runCli = (args: ReadonlyArray<string>, env: Record<string, string>) =>
  new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
    const child = spawn(Path.join(BIN, "bun"), ["src/cli/main.ts", ...args], {
      cwd: ROOT,
      env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? Os.tmpdir(), ...env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    children.push(child)
    let stdout = ""
    let stderr = ""
    child.stdout?.on("data", (d: Buffer) => (stdout += d.toString("utf8")))
    child.stderr?.on("data", (d: Buffer) => (stderr += d.toString("utf8")))
    child.on("close", (code) => resolve({ code, stdout, stderr }))
  })

// ---------------------------------------------------------------------------------------------
// 1. the atproto network

const startNetwork = async () => {
  const child = spawn(Path.join(BIN, "node"), ["devnet/network.ts", "--max-ms", String(LIMIT_MS + 30_000)], {
    cwd: ROOT,
    env: { ...process.env, NODE_ENV: "development" },
    stdio: ["pipe", "pipe", "pipe"]
  })
  children.push(child)
  let stderr = ""
  child.stderr?.on("data", (d: Buffer) => (stderr = (stderr + d.toString("utf8")).slice(-4000)))
  const ports = await new Promise<{ pds: string; plc: string }>((resolve, reject) => {
    let buffered = ""
    child.stdout?.on("data", (d: Buffer) => {
      buffered += d.toString("utf8")
      const nl = buffered.indexOf("\n")
      if (nl < 0) return
      const msg = JSON.parse(buffered.slice(0, nl)) as { ready?: boolean; pds?: string; plc?: string; error?: string }
      if (msg.ready === true && msg.pds !== undefined && msg.plc !== undefined) resolve({ pds: msg.pds, plc: msg.plc })
      else reject(new Error(`the atproto network failed to start: ${msg.error ?? buffered}`))
    })
    child.once("exit", (code) => reject(new Error(`the atproto network exited (${code}): ${stderr}`)))
  })
  cleanups.push(() => stopChild(child, 10_000))
  return ports
}

// ---------------------------------------------------------------------------------------------
// 2. the receiver

interface Delivery {
  readonly headers: Http.IncomingHttpHeaders
  readonly body: string
}

const startReceiver = async (secret: string) => {
  const got: Array<Delivery> = []
  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      got.push({ headers: req.headers, body: Buffer.concat(chunks).toString("utf8") })
      res.writeHead(204).end()
    })
  })
  const port = await freePort()
  await new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve))
  cleanups.push(
    () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  )
  const verify = (d: Delivery) => {
    const headers: Record<string, string> = {}
    for (const [k, v] of Object.entries(d.headers)) if (typeof v === "string") headers[k] = v
    let standard = false
    try {
      new Webhook(secret, { format: "raw" }).verify(d.body, headers)
      standard = true
    } catch {
      standard = false
    }
    const wisp =
      d.headers["x-webhook-signature"] === `sha256=${createHmac("sha256", secret).update(d.body).digest("hex")}`
    return { standard, wisp }
  }
  return { url: `http://127.0.0.1:${port}/hook`, got, verify }
}

// ---------------------------------------------------------------------------------------------
// 3. firehook

const startFirehook = async (pds: string, plc: string) => {
  const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-demo-"))
  // as root, the embedded PostgreSQL runs as a separate `postgres` user that must traverse this
  Fs.chmodSync(dataDir, 0o755)
  const port = await freePort()
  const apiPort = await freePort()
  const env: Record<string, string> = {
    PATH: process.env["PATH"] ?? "",
    HOME: process.env["HOME"] ?? Os.tmpdir(),
    NODE_ENV: "development",
    WEBHOOK_ALLOW_INSECURE_DEV: "1",
    FIREHOSE_SOURCE: "relay",
    RELAY_URL: pds.replace(/^http/, "ws"),
    PLC_DIRECTORY_URL: plc,
    FIREHOOK_DATA_DIR: dataDir,
    HEALTH_HOST: "127.0.0.1",
    HEALTH_PORT: String(port),
    // the owners' API; its service DID is did:web:localhost%3A<port>, published at /.well-known/did.json
    API_PORT: String(apiPort),
    PUBLIC_URL: `http://localhost:${apiPort}`,
    LOG_LEVEL: "warn",
    LOG_FORMAT: "json",
    SHUTDOWN_TIMEOUT_MS: "5000"
  }
  // DATABASE_URL is deliberately not passed on: the demo never writes into your database
  const child = spawn(Path.join(BIN, "bun"), ["src/main.ts"], { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] })
  children.push(child)
  let output = ""
  const keep = (d: Buffer) => (output = (output + d.toString("utf8")).slice(-8000))
  child.stdout?.on("data", keep)
  child.stderr?.on("data", keep)
  cleanups.push(async () => {
    await stopChild(child, 10_000)
    Fs.rmSync(dataDir, { recursive: true, force: true })
  })
  const health = `http://127.0.0.1:${port}/health`
  const exitedEarly = exited(child).then(() => {
    throw new Error(`firehook exited early:\n${output}`)
  })
  void exitedEarly.catch(() => undefined) // it also rejects when the demo stops firehook at the end
  await Promise.race([
    until(
      "firehook to be live",
      async () => ((await fetch(health, { signal: AbortSignal.timeout(2000) })).status === 200 ? true : undefined),
      40_000
    ),
    exitedEarly
  ])
  const activeWebhooks = async (): Promise<number> => {
    const body = (await (await fetch(health, { signal: AbortSignal.timeout(2000) })).json()) as {
      registry?: { active?: number }
    }
    return body.registry?.active ?? 0
  }
  return { health, api: `http://127.0.0.1:${apiPort}`, dataDir, activeWebhooks, output: () => output }
}

// ---------------------------------------------------------------------------------------------

const main = async () => {
  say("firehook demo: a local atproto network (real PDS + PLC), a webhook receiver and firehook; offline")
  const net = await startNetwork()
  say(`atproto network up: PDS ${net.pds}, PLC ${net.plc}`)

  const secret = `demo-${randomBytes(18).toString("base64url")}`
  const receiver = await startReceiver(secret)
  say(`receiver listening on ${receiver.url}`)

  say("starting firehook (bun src/main.ts, embedded PostgreSQL in a temporary directory)…")
  const firehook = await startFirehook(net.pds, net.plc)
  say(`firehook is live: ${firehook.health}`)

  const agent = new AtpAgent({ service: net.pds })
  const account = await agent.createAccount({
    handle: "alice.test",
    email: "alice@example.com",
    password: PASSWORD
  })
  const did = account.data.did
  say(`created account alice.test (${did})`)

  const webhook = {
    $type: "place.wisp.v2.wh",
    scope: { aturi: `at://${did}/app.bsky.feed.post` },
    url: receiver.url,
    events: ["create"],
    secret,
    createdAt: new Date().toISOString()
  }
  const wh = await agent.com.atproto.repo.createRecord({
    repo: did,
    collection: "place.wisp.v2.wh",
    rkey: "demo",
    record: webhook
  })
  say(`wrote the webhook record ${wh.data.uri}`)
  process.stdout.write(indent(JSON.stringify({ ...webhook, secret: "<redacted>" }, null, 2)) + "\n")
  await until(
    "firehook to register the webhook",
    async () => ((await firehook.activeWebhooks()) >= 1 ? true : undefined)
  )
  say("firehook registered the webhook (seen on the PDS firehose)")

  const posted = await agent.post({ text: "hello from the firehook demo", createdAt: new Date().toISOString() })
  say(`alice posted ${posted.uri}`)

  const delivery = await until("the delivery", async () => receiver.got[0])
  const verified = receiver.verify(delivery)
  say("the receiver got:")
  const shown = [
    "content-type",
    "user-agent",
    "idempotency-key",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "x-webhook-signature",
    "x-firehook-webhook",
    "x-firehook-match"
  ]
  const headerLines = shown.filter((h) => delivery.headers[h] !== undefined).map((h) =>
    `${h}: ${String(delivery.headers[h])}`
  )
  process.stdout.write(
    indent(`POST /hook\n${headerLines.join("\n")}\n\n${JSON.stringify(JSON.parse(delivery.body), null, 2)}`) + "\n"
  )
  say(
    `signatures: Standard Webhooks (webhook-signature) ${verified.standard ? "verified" : "INVALID"}, ` +
      `wisp (X-Webhook-Signature) ${verified.wisp ? "verified" : "INVALID"}`
  )
  if (!verified.standard || !verified.wisp) throw new Error("signature verification failed")

  // 6. the owner's side: the delivery log through the owners' API, with a token from alice's PDS
  const serviceDid = `did:web:localhost%3A${new URL(firehook.api).port}`
  await until("the delivery to be recorded as delivered", async () => {
    const token = await agent.com.atproto.server.getServiceAuth({
      aud: serviceDid,
      lxm: "dev.firehook.webhook.listDeliveries",
      exp: Math.floor(Date.now() / 1000) + 60
    })
    const res = await fetch(`${firehook.api}/xrpc/dev.firehook.webhook.listDeliveries?rkey=demo`, {
      headers: { authorization: `Bearer ${token.data.token}` },
      signal: AbortSignal.timeout(5000)
    })
    const body = (await res.json()) as { deliveries?: Array<{ status?: string }> }
    return body.deliveries?.some((d) => d.status === "delivered") === true ? true : undefined
  })
  say("alice reads her delivery log: firehook hooks deliveries demo (owners' API, a service token from her PDS)")
  const log = await runCli(["hooks", "deliveries", "demo"], {
    ATPROTO_PDS: net.pds,
    ATPROTO_IDENTIFIER: "alice.test",
    ATPROTO_APP_PASSWORD: PASSWORD,
    FIREHOOK_SERVICE_URL: firehook.api
  })
  if (log.code !== 0) throw new Error(`firehook hooks deliveries failed: ${log.stderr.trim()}`)
  process.stdout.write(indent(log.stdout.trimEnd()) + "\n")
}

const shutdown = async () => {
  for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined)
}

const hardLimit = setTimeout(() => {
  process.stderr.write(`demo: did not finish within ${LIMIT_MS / 1000} s\n`)
  for (const c of children) c.kill("SIGKILL")
  process.exit(1)
}, LIMIT_MS + 5_000)

let code = 0
try {
  await Promise.race([
    main(),
    sleep(LIMIT_MS).then(() => {
      throw new Error(`the demo did not finish within ${LIMIT_MS / 1000} s`)
    })
  ])
} catch (e) {
  code = 1
  process.stderr.write(`demo failed: ${e instanceof Error ? e.message : String(e)}\n`)
}
say("shutting down…")
await shutdown()
clearTimeout(hardLimit)
say(code === 0 ? "done." : "done (failed).")
process.exit(code)
