/**
 * `npm run demo` keeps working: it starts the local atproto network, a receiver and firehook, and
 * must print a delivery whose two signatures verified, then the owner's delivery log read through the
 * owners' API (`firehook hooks deliveries`), then exit 0 (offline, well under a minute).
 *
 * Whatever happens, nothing the demo started outlives the test: the demo runs in a process group
 * of its own (its network, firehook and CLI children are in it), and with a temporary directory of
 * the test's (`TMPDIR`), where it makes firehook's data directory; the embedded PostgreSQL, which
 * firehook starts in a process group of its own, is found by the `postmaster.pid` in there. (The
 * demo's hard limit SIGKILLs firehook, which leaves that server running.)
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, expect, it } from "vitest"
import { NODE22 } from "../support/devnet.js"
import { waitUntil } from "../support/e2e.js"
import { ROOT } from "../support/proc.js"

/** `pid` is the PostgreSQL server on `dataDir` (not a process that has since taken its pid) */
const isServer = (pid: number, dataDir: string): boolean => {
  try {
    return Fs.readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").includes(dataDir)
  } catch {
    return false // it is gone
  }
}

/**
 * SIGKILL the demo's process group; stop any PostgreSQL server whose data directory is under
 * `tmp` (immediate shutdown, which also ends its backends; SIGKILL if it has not ended in 10 s).
 */
const stopEverything = async (child: ChildProcess | undefined, tmp: string) => {
  if (child?.pid !== undefined) {
    try {
      // the group's id is the demo's pid: no other process's while any of the group is left
      process.kill(-child.pid, "SIGKILL")
    } catch {
      // the whole group has exited
    }
  }
  for (const entry of Fs.readdirSync(tmp, { withFileTypes: true })) {
    if (!entry.isDirectory() || !entry.name.startsWith("firehook-demo-")) continue
    let lock: Array<string>
    try {
      lock = Fs.readFileSync(Path.join(tmp, entry.name, "pg", "postmaster.pid"), "utf8").split("\n")
    } catch {
      continue // no server started there, or it stopped and removed its lock file
    }
    // line 1: the server's pid; line 2: its data directory, as its command line names it
    const pid = Number(lock[0])
    const dataDir = lock[1] ?? ""
    if (!Number.isInteger(pid) || pid <= 0 || !isServer(pid, dataDir)) continue
    process.kill(pid, "SIGQUIT")
    await waitUntil(() => !isServer(pid, dataDir), 10_000, "the demo's PostgreSQL stopped").catch(() => {
      if (isServer(pid, dataDir)) process.kill(pid, "SIGKILL")
    })
  }
}

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-demo-test-"))
// as root, the embedded PostgreSQL runs as a separate `postgres` user that must traverse this
Fs.chmodSync(tmp, 0o755)
// the local network (`@atproto/dev-env`) claims its ports in a directory in the temporary
// directory, shared with every other network on this machine: that one stays shared
const portClaims = `atproto-dev-env-ports-${process.getuid?.() ?? "unknown"}`
Fs.mkdirSync(Path.join(Os.tmpdir(), portClaims), { recursive: true })
Fs.symlinkSync(Path.join(Os.tmpdir(), portClaims), Path.join(tmp, portClaims))
let demo: ChildProcess | undefined
afterAll(async () => {
  // also when the test timed out, and its `finally` never ran
  await stopEverything(demo, tmp)
  Fs.rmSync(tmp, { recursive: true, force: true })
}, 30_000)

it("npm run demo prints a verified delivery and exits 0", async () => {
  const child = spawn(NODE22, ["demo/demo.ts"], {
    cwd: ROOT,
    detached: true,
    env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp", TMPDIR: tmp },
    stdio: ["ignore", "pipe", "pipe"]
  })
  demo = child
  try {
    let out = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString("utf8")))
    child.stderr.on("data", (d: Buffer) => (out += d.toString("utf8")))
    const code = await new Promise<number | null>((resolve) => child.on("exit", (c) => resolve(c)))
    expect(out).toContain("firehook registered the webhook")
    expect(out).toMatch(/"text": "hello from the firehook demo"/)
    expect(out).toContain(
      "signatures: Standard Webhooks (webhook-signature) verified, wisp (X-Webhook-Signature) verified"
    )
    // the owner's side: the delivery log read through the owners' API with a token from the demo PDS
    expect(out).toContain("alice reads her delivery log: firehook hooks deliveries demo")
    expect(out).toMatch(/ID\s+CREATED\s+WEBHOOK\s+EVENT\s+STATUS\s+ATTEMPTS\s+LAST-ERROR/)
    expect(out).toMatch(/whd_\S+\s+\S+\s+demo\s+create app\.bsky\.feed\.post\/\S+\s+delivered\s+1/)
    // the webhook record is shown with its secret redacted
    expect(out).toMatch(/"secret": "<redacted>"/)
    expect(out).not.toMatch(/"secret": "demo-/)
    expect(code).toBe(0)
  } finally {
    await stopEverything(child, tmp)
    demo = undefined
  }
}, 90_000)
