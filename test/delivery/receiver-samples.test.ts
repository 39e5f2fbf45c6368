/**
 * docs/receivers.md's verification samples, taken from the doc as written and run against real
 * signed deliveries (the delivery worker on real PostgreSQL, a receiver on 127.0.0.1), so that the
 * doc cannot drift from what firehook sends:
 * - "TypeScript, Standard Webhooks" (the `standardwebhooks` library) accepts every genuine request
 *   and throws on a changed body, a wrong secret, a stale timestamp header and a genuine request
 *   verified more than 5 minutes later;
 * - "TypeScript, wisp-compatible header" gives `ok` true for genuine requests, false for a changed
 *   body, a wrong secret and a non-ASCII forgery (without throwing);
 * - "Shell, with openssl" prints both signatures exactly (its whsec_ line for `whsec_` + standard
 *   base64 secrets, the other line for any other secret, as its comments say).
 * The TypeScript samples are transpiled (types erased) and run with only their free variables
 * (`secret`; `rawBody` and `headers` for the wisp one) supplied.
 */
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Vm from "node:vm"
import ts from "typescript"
import { vi } from "vitest"
import { signatureHeaders } from "../../src/services/delivery/Signer.js"
import { ev, plc, rev, sqlStack, WH, whEv, whRecordValue } from "../support/stack.js"
import { eventually, type Received, receiver, run, startWorker, whsec } from "./worker-support.js"

const DOC = Path.resolve(import.meta.dirname, "../../docs/receivers.md")
const OWNER = plc(41)
const SCOPE = plc(42)
const POST = "app.bsky.feed.post"
let doc: string | undefined

/** The first fenced block after a heading of docs/receivers.md. */
const sample = (heading: string): string => {
  const md = doc ??= Fs.readFileSync(DOC, "utf8")
  const at = md.indexOf(`\n${heading}\n`)
  expect(at, `docs/receivers.md has "${heading}"`).toBeGreaterThanOrEqual(0)
  const block = /```[a-z]*\n([\s\S]*?)```/.exec(md.slice(at))
  expect(block).not.toBeNull()
  return block?.[1] ?? ""
}

type Sample = (...args: ReadonlyArray<unknown>) => unknown
const compiled = new Map<string, Sample>()

/** A TypeScript sample as a function of its free variables (CommonJS after type erasure), compiled once. */
const compile = (source: string, params: ReadonlyArray<string>, tail = ""): Sample => {
  const key = `${params.join(",")}\n${source}`
  const known = compiled.get(key)
  if (known !== undefined) return known
  const js = ts.transpileModule(source, {
    compilerOptions: { module: ts.ModuleKind.CommonJS, target: ts.ScriptTarget.ES2022 }
  }).outputText
  const fn = Vm.runInThisContext(`(function (require, exports, ${params.join(", ")}) {\n${js}\n${tail}\n})`) as Sample
  compiled.set(key, fn)
  return fn
}

const requireHere = createRequire(import.meta.url)

type Handle = (rawBody: string, headers: Record<string, string>) => unknown

const standardWebhooks = (secret: string): Handle => {
  const exports: { handle?: Handle } = {}
  compile(sample("### TypeScript, Standard Webhooks"), ["secret"])(requireHere, exports, secret)
  const handle = exports.handle
  if (handle === undefined) throw new Error("the sample exports no handle")
  return handle
}

const wispOk = (secret: string, rawBody: string, headers: Record<string, string>): unknown =>
  compile(sample("### TypeScript, wisp-compatible header"), ["secret", "rawBody", "headers"], "return ok")(
    requireHere,
    {},
    secret,
    rawBody,
    headers
  )

/** Runs the shell sample in a directory holding body.json; its two output lines. */
const shell = (secret: string, body: Buffer, headers: Record<string, string>) => {
  const BASE64 = /^whsec_(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}(?:==)?|[A-Za-z0-9+/]{3}=?)?$/
  const lines = sample("### Shell, with openssl").split("\n")
  const keyLines = lines.filter((l) => /^(# )?KEY_HEX=/.test(l))
  expect(keyLines.length).toBe(2)
  // the doc's first KEY_HEX line is live, the second commented out: swap them for other secrets
  const script = BASE64.test(secret) && secret.length > "whsec_".length
    ? lines
    : lines.map((l) => l.startsWith("KEY_HEX=") ? `# ${l}` : l.startsWith("# KEY_HEX=") ? l.slice(2) : l)
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-receiver-sample-"))
  try {
    Fs.writeFileSync(Path.join(dir, "body.json"), body)
    const out = spawnSync("bash", ["-c", script.join("\n")], {
      cwd: dir,
      env: {
        PATH: process.env["PATH"] ?? "/usr/bin:/bin",
        SECRET: secret,
        WEBHOOK_ID: headers["webhook-id"] ?? "",
        WEBHOOK_TIMESTAMP: headers["webhook-timestamp"] ?? ""
      },
      encoding: "utf8",
      timeout: 30_000,
      // stdin not a socket: bash would read ~/.bashrc as a remote shell's (noise on stderr)
      stdio: ["ignore", "pipe", "pipe"]
    })
    // nothing on stderr: a receiver's script stopping on errors (set -e, pipefail) must get through
    expect(out.stderr).toBe("")
    return out.stdout.trim().split("\n")
  } finally {
    Fs.rmSync(dir, { recursive: true, force: true })
  }
}

const plain = (req: Received): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const [k, v] of Object.entries(req.headers)) if (typeof v === "string") out[k] = v
  return out
}

const throwsWith = (f: () => unknown): string => {
  try {
    f()
    return "accepted"
  } catch (e) {
    return e instanceof Error ? e.message : String(e)
  }
}

/** rkey → secret: every kind of key derivation SPEC §4.5 has */
const SECRETS: Record<string, string> = {
  padded: whsec(7),
  unpadded: whsec(9).replace(/=+$/, ""),
  plain: "a-long-random-secret",
  urlsafe: "whsec_ab-cd_ef-gh_ij-kl_mn-op_qr-st_uv-wx_yz-01_23",
  unicode: "pässwörd ünïcode"
}

describe("docs/receivers.md's shell sample signs the exact bytes of body.json", () => {
  // Bodies firehook sends never end in a newline, but a receiver may hand the sample any bytes;
  // a sample reading the body through "$(cat body.json)" would drop trailing newlines.
  it("a body ending in newlines verifies, with both key forms", () => {
    for (const secret of [whsec(7), "a-long-random-secret"]) {
      const body = "{\"text\":\"trailing\"}\n\n"
      const h = signatureHeaders({ secret, deliveryId: "dlv_sample", timestampSeconds: 1_767_225_600, body })
      const headers = { "webhook-id": h["webhook-id"]!, "webhook-timestamp": h["webhook-timestamp"]! }
      const [wisp, standard] = shell(secret, Buffer.from(body, "utf8"), headers)
      expect(wisp).toBe(h["X-Webhook-Signature"])
      expect(`v1,${standard}`).toBe(h["webhook-signature"])
    }
  })
})

describe("docs/receivers.md verification samples, run against real signed deliveries", () => {
  it.scopedLive("accept genuine requests, reject forged ones", () =>
    Effect.gen(function*() {
      const rx = yield* receiver()
      yield* run(
        Object.entries(SECRETS).map(([rkey, secret]) =>
          whEv(OWNER, rkey, whRecordValue(`at://${SCOPE}/${POST}`, { url: `${rx.url}/hooks/${rkey}`, secret }), {
            rev: rev(1)
          })
        )
      )
      const worker = yield* startWorker()
      yield* worker.delivery.awaitListening.pipe(Effect.timeout(Duration.seconds(10)))
      yield* run([
        ev(SCOPE, POST, "p1", {
          rev: rev(2),
          record: { $type: POST, text: "hello ✓ \u2028 €", createdAt: "2026-01-01T00:00:00Z" }
        })
      ])
      const n = Object.keys(SECRETS).length
      yield* eventually("a request per webhook", Effect.sync(() => rx.received.length), (k) => k >= n, 10_000)
      expect(rx.received.length).toBe(n)

      for (const req of rx.received) {
        const rkey = (req.headers["x-firehook-webhook"] as string).slice(`at://${OWNER}/${WH}/`.length)
        const secret = SECRETS[rkey] ?? ""
        const rawBody = req.body.toString("utf8")
        const headers = plain(req)
        const changed = rawBody.replace("hello", "hellO")
        expect(changed).not.toBe(rawBody)
        const why = `webhook ${rkey}`

        // Standard Webhooks, TypeScript
        const handle = standardWebhooks(secret)
        expect(handle(rawBody, headers), why).toEqual(JSON.parse(rawBody))
        expect(throwsWith(() => handle(changed, headers)), why).toBe("No matching signature found")
        expect(throwsWith(() => standardWebhooks(secret + "x")(rawBody, headers)), why).toBe(
          "No matching signature found"
        )
        const stale = { ...headers, "webhook-timestamp": String(Number(headers["webhook-timestamp"]) - 301) }
        expect(throwsWith(() => handle(rawBody, stale)), why).toBe("Message timestamp too old")
        const now = Date.now()
        vi.spyOn(Date, "now").mockReturnValue(now + 6 * 60_000)
        try {
          expect(throwsWith(() => handle(rawBody, headers)), why).toBe("Message timestamp too old")
        } finally {
          vi.restoreAllMocks()
        }

        // wisp-compatible, TypeScript
        expect(wispOk(secret, rawBody, headers), why).toBe(true)
        expect(wispOk(secret, changed, headers), why).toBe(false)
        expect(wispOk(secret + "x", rawBody, headers), why).toBe(false)
        const nonAscii = "sha256=é" + (headers["x-webhook-signature"] ?? "").slice("sha256=".length + 1)
        expect(wispOk(secret, rawBody, { ...headers, "x-webhook-signature": nonAscii }), why).toBe(false)

        // openssl
        const [wisp, standard] = shell(secret, req.body, headers)
        expect(wisp, why).toBe(headers["x-webhook-signature"])
        expect(`v1,${standard}`, why).toBe(headers["webhook-signature"])
        const [, forged] = shell(secret, Buffer.from(changed, "utf8"), headers)
        expect(`v1,${forged}`, why).not.toBe(headers["webhook-signature"])
      }
    }).pipe(Effect.scoped, Effect.provide(sqlStack({ env: { WEBHOOK_ALLOW_INSECURE_DEV: "1" } }))), 120_000)
})
