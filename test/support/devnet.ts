/**
 * The real local atproto network for end-to-end tests: `devnet/network.ts` (`@atproto/dev-env`, a
 * real PDS and PLC) in a Node 22 child process, and `@atproto/api` clients for its accounts.
 */
import { AtpAgent } from "@atproto/api"
import { type ChildProcess, spawn } from "node:child_process"
import * as Path from "node:path"
import { ROOT } from "./proc.js"

export const NODE22 = Path.join(ROOT, "node_modules/.bin/node")

export interface Devnet {
  /** `http://localhost:<port>` */
  readonly pds: string
  readonly plc: string
  /** `ws://localhost:<port>`: the PDS's `subscribeRepos` host, firehook's `RELAY_URL` */
  readonly relayUrl: string
  readonly close: () => Promise<void>
}

const networks = new Set<ChildProcess>()
process.once("exit", () => {
  for (const c of networks) c.kill("SIGKILL")
})

/**
 * Start the network; resolves once it reports its ports (fails after `timeoutMs`). `@atproto/dev-env`
 * chooses its ports by binding and closing port 0, so one may be taken before its server binds it
 * (by another listener or an outbound connection of the parallel tests): that start is tried again,
 * at most three times in all.
 */
export const startDevnet = async (timeoutMs = 60_000): Promise<Devnet> => {
  for (let attempt = 1;; attempt++) {
    try {
      return await startDevnetOnce(timeoutMs)
    } catch (e) {
      if (attempt >= 3 || !String(e).includes("EADDRINUSE")) throw e
    }
  }
}

const startDevnetOnce = (timeoutMs: number): Promise<Devnet> =>
  new Promise<Devnet>((resolve, reject) => {
    const child = spawn(NODE22, ["devnet/network.ts", "--max-ms", String(20 * 60_000)], {
      cwd: ROOT,
      env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp", NODE_ENV: "development" },
      stdio: ["pipe", "pipe", "pipe"]
    })
    networks.add(child)
    let out = ""
    let err = ""
    let ready = false
    const exited = new Promise<void>((r) =>
      child.on("exit", () => {
        networks.delete(child)
        r()
      })
    )
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`devnet did not start within ${timeoutMs} ms: ${err.slice(-2000)}`))
    }, timeoutMs)
    child.stderr?.on("data", (d: Buffer) => (err = (err + d.toString("utf8")).slice(-20_000)))
    child.stdout?.on("data", (d: Buffer) => {
      out += d.toString("utf8")
      for (let nl = out.indexOf("\n"); nl >= 0 && !ready; nl = out.indexOf("\n")) {
        const line = out.slice(0, nl)
        out = out.slice(nl + 1)
        let msg: { ready?: boolean; pds?: string; plc?: string; error?: string }
        try {
          msg = JSON.parse(line) as typeof msg
        } catch {
          continue // not the harness's protocol (a library writing to stdout)
        }
        if (msg.error !== undefined) {
          clearTimeout(timer)
          reject(new Error(`devnet failed to start: ${msg.error}`))
          return
        }
        if (msg.ready === true && msg.pds !== undefined && msg.plc !== undefined) {
          ready = true
          clearTimeout(timer)
          const pds = msg.pds
          resolve({
            pds,
            plc: msg.plc,
            relayUrl: pds.replace(/^http/, "ws"),
            close: async () => {
              if (child.exitCode !== null || child.signalCode !== null) return
              child.kill("SIGTERM")
              const t = setTimeout(() => child.kill("SIGKILL"), 15_000)
              await exited
              clearTimeout(t)
            }
          })
        }
      }
    })
    child.on("exit", (code) => {
      if (!ready) {
        clearTimeout(timer)
        reject(new Error(`devnet exited with ${code}: ${err.slice(-2000)}`))
      }
    })
  })

export interface Account {
  readonly did: string
  readonly handle: string
  readonly password: string
  readonly agent: AtpAgent
}

/** Create an account on the devnet PDS (handle `<name>.test`) and return a logged-in agent. */
export const createAccount = async (devnet: Devnet, name: string): Promise<Account> => {
  const agent = new AtpAgent({ service: devnet.pds })
  const handle = `${name}.test`
  const password = `pw-${name}-0123456789`
  const res = await agent.createAccount({ handle, email: `${name}@example.com`, password })
  return { did: res.data.did, handle, password, agent }
}

export const WH = "place.wisp.v2.wh"

export interface Ref {
  readonly uri: string
  readonly cid: string
  readonly rkey: string
}

const refOf = (data: { uri: string; cid: string }): Ref => ({
  uri: data.uri,
  cid: data.cid,
  rkey: data.uri.slice(data.uri.lastIndexOf("/") + 1)
})

/** createRecord in the account's own repo */
export const createRecord = async (
  account: Account,
  collection: string,
  record: Record<string, unknown>,
  rkey?: string
): Promise<Ref> => {
  const res = await account.agent.com.atproto.repo.createRecord({
    repo: account.did,
    collection,
    record: { $type: collection, ...record },
    ...(rkey === undefined ? {} : { rkey })
  })
  return refOf(res.data)
}

export const putRecord = async (
  account: Account,
  collection: string,
  rkey: string,
  record: Record<string, unknown>
): Promise<Ref> => {
  const res = await account.agent.com.atproto.repo.putRecord({
    repo: account.did,
    collection,
    rkey,
    record: { $type: collection, ...record }
  })
  return refOf(res.data)
}

export const deleteRecord = async (account: Account, collection: string, rkey: string): Promise<void> => {
  await account.agent.com.atproto.repo.deleteRecord({ repo: account.did, collection, rkey })
}

export const nowIso = (): string => new Date().toISOString()

/**
 * firehook's configuration for a deployment on the devnet: the PDS firehose as its relay, the test
 * PLC, insecure development mode (loopback receivers and `ws://`), short retry delays.
 */
export const devnetFirehookEnv = (
  devnet: Devnet,
  databaseUrl: string,
  extra: Record<string, string> = {}
): Record<string, string> => ({
  DATABASE_URL: databaseUrl,
  NODE_ENV: "test",
  WEBHOOK_ALLOW_INSECURE_DEV: "1",
  FIREHOSE_SOURCE: "relay",
  RELAY_URL: devnet.relayUrl,
  PLC_DIRECTORY_URL: devnet.plc,
  DELIVERY_RETRY_BASE_MS: "200",
  DELIVERY_RETRY_MAX_MS: "1000",
  DELIVERY_TIMEOUT_MS: "2000",
  ...extra
})
