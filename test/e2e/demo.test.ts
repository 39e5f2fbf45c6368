/**
 * `npm run demo` keeps working: it starts the local atproto network, a receiver and firehook, and
 * must print a delivery whose two signatures verified, then the owner's delivery log read through the
 * owners' API (`firehook hooks deliveries`), then exit 0 (offline, well under a minute).
 */
import { spawn } from "node:child_process"
import { expect, it } from "vitest"
import { NODE22 } from "../support/devnet.js"
import { ROOT } from "../support/proc.js"

it("npm run demo prints a verified delivery and exits 0", async () => {
  const child = spawn(NODE22, ["demo/demo.ts"], {
    cwd: ROOT,
    env: { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" },
    stdio: ["ignore", "pipe", "pipe"]
  })
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
}, 90_000)
