/**
 * The Redis publisher over TLS (`rediss://`, SPEC §4.7): the password must never reach a server
 * whose certificate does not check out, and a trusted one must work, with the host name as SNI.
 *
 * Certificates are made with the `openssl` CLI into a temporary directory (a CA of the test's own,
 * leaves signed by it, a self-signed one). In this process (vitest, Node) nothing trusts that CA.
 * The trusted path runs in child processes, under Bun (the production runtime) and under Node,
 * because both read NODE_EXTRA_CA_CERTS only at start (test/support/publisher-tls-smoke.ts). Every
 * server listens on 127.0.0.1; `localhost` resolves there.
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Duration, Effect, Redacted, Schedule } from "effect"
import { execFile } from "node:child_process"
import * as Path from "node:path"
import * as Publisher from "../../src/services/delivery/Publisher.js"
import * as Health from "../../src/services/platform/Health.js"
import { auditEvent } from "../support/auditEvent.js"
import { captureLogs } from "../support/captureLogs.js"
import { fakeRedis } from "../support/fakeRedis.js"
import { BUN, ROOT } from "../support/proc.js"
import { makeTestPki, stderrBesideTlsWarning } from "../support/testPki.js"
import { newHealth, target } from "./publisher-support.js"

const pki = makeTestPki("redis-tls")
const GOOD = pki.signed("good", ["DNS:localhost", "IP:127.0.0.1"])
// for the child processes only (the smoke script reads `other.*` from the directory)
pki.signed("other", ["DNS:other.test"])
const SELF = pki.selfSigned("self", ["DNS:localhost", "IP:127.0.0.1"])
afterAll(() => pki.remove())

const SECRET = "tls-test-SECRET-pw"
const answer = (c: ReadonlyArray<string>) => (c[0] === "PUBLISH" ? ":1\r\n" : "+OK\r\n")

/** `connect` (handshake only), bounded; the error's kind and code, or `ok`. */
const tryConnect = (url: string, connectTimeout: Duration.DurationInput = "5 seconds") =>
  Effect.scoped(Publisher.connect(target(url), { connectTimeout })).pipe(
    Effect.as("ok"),
    Effect.catchAll((e) => Effect.succeed(`${e.kind}:${e.code}`)),
    Effect.timeout("10 seconds")
  )

// live clock throughout: nothing here is timed; the deadlines only bound the waits
describe("rediss:// to a certificate this process does not trust", () => {
  it.scopedLive.each(
    [
      ["self-signed, by IP", SELF, "127.0.0.1", "connect:DEPTH_ZERO_SELF_SIGNED_CERT", []],
      ["self-signed, by name", SELF, "localhost", "connect:DEPTH_ZERO_SELF_SIGNED_CERT", ["localhost"]],
      ["from an unknown CA, by IP", GOOD, "127.0.0.1", "connect:UNABLE_TO_VERIFY_LEAF_SIGNATURE", []],
      ["from an unknown CA, by name", GOOD, "localhost", "connect:UNABLE_TO_VERIFY_LEAF_SIGNATURE", ["localhost"]]
    ] as const
  )(
    "%s: the handshake is refused and the server receives no command (no AUTH)",
    ([_, pem, host, outcome, servernames]) =>
      Effect.gen(function*() {
        const fake = yield* fakeRedis(answer, { tls: pem })
        expect(yield* tryConnect(`rediss://:${SECRET}@${host}:${fake.port}/3`)).toBe(outcome)
        // the server saw the ClientHello (so the refusal was the client's) and the handshake fail
        const seen = yield* fake.awaitState((s) => s.tlsErrors === 1).pipe(Effect.timeout("10 seconds"))
        expect(seen).toMatchObject({ accepted: 1, connections: 0, commands: [] })
        // SNI carries a name, never an IP literal (RFC 6066)
        expect(seen.servernames).toEqual(servernames)
      })
  )

  it.scopedLive("the publisher stays unconnected, drops its messages and logs the certificate error only", () =>
    Effect.gen(function*() {
      const fake = yield* fakeRedis(answer, { tls: SELF })
      const logs = yield* captureLogs
      const { health } = yield* newHealth
      const url = `rediss://user:${SECRET}@localhost:${fake.port}/2`
      const p = yield* Publisher.make({ url: Redacted.make(url), channel: "c" }).pipe(
        Effect.provideService(Health.Health, health),
        Effect.provide(logs.layer)
      )
      const failed = (ls: ReadonlyArray<string>) => ls.find((l) => l.includes("redis connection failed"))
      yield* logs.lines.pipe(
        Effect.repeat({ until: (ls) => failed(ls) !== undefined, schedule: Schedule.spaced("10 millis") }),
        Effect.timeout("10 seconds")
      )
      yield* p.publish(auditEvent())
      const stats = yield* p.awaitStats((s) => s.dropped === 1).pipe(Effect.timeout("10 seconds"))
      expect(stats).toMatchObject({ configured: true, connected: false, published: 0 })
      const seen = yield* fake.awaitState((s) => s.tlsErrors >= 1).pipe(Effect.timeout("10 seconds"))
      expect(seen.commands).toEqual([])
      expect(seen.connections).toBe(0)
      const line = failed(yield* logs.lines) ?? ""
      expect(line).toContain("\"kind\":\"connect\"")
      expect(line).toContain("\"code\":\"DEPTH_ZERO_SELF_SIGNED_CERT\"")
      for (const part of [SECRET, "user", "localhost", String(fake.port)]) expect(line).not.toContain(part)
    }))

  it.scopedLive("a plain-text server behind rediss:// gets the ClientHello only; the handshake is bounded", () =>
    Effect.gen(function*() {
      // a fake that speaks RESP without TLS: the ClientHello is no command, so it never answers
      const fake = yield* fakeRedis(answer)
      expect(yield* tryConnect(`rediss://:${SECRET}@localhost:${fake.port}`, "200 millis")).toBe("timeout:connect")
      const seen = yield* fake.awaitState((s) => s.closed === 1).pipe(Effect.timeout("10 seconds"))
      expect(seen).toMatchObject({ accepted: 1, commands: [] })
    }))
})

// ---------------------------------------------------------------------------------------------
// With the test CA trusted (NODE_EXTRA_CA_CERTS), in a child process

interface Seen {
  readonly outcome: string
  readonly commands: ReadonlyArray<ReadonlyArray<string>>
  readonly servernames: ReadonlyArray<string>
  readonly accepted: number
  readonly connections: number
}

interface SmokeOut {
  readonly runtime: string
  readonly [name: string]: Seen | string
}

const runSmoke = (command: string, args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  Effect.async<{ readonly stdout: string; readonly stderr: string; readonly code: number }>((resume) => {
    execFile(
      command,
      [...args, Path.join(ROOT, "test/support/publisher-tls-smoke.ts")],
      {
        cwd: ROOT,
        timeout: 60_000,
        env: {
          PATH: process.env["PATH"] ?? "",
          HOME: process.env["HOME"] ?? "/tmp",
          SMOKE_DIR: pki.dir,
          NODE_EXTRA_CA_CERTS: pki.caPath,
          ...env
        }
      },
      (error, stdout, stderr) =>
        resume(Effect.succeed({
          stdout,
          stderr,
          code: error === null ? 0 : typeof error.code === "number" ? error.code : -1
        }))
    )
  })

const RUNTIMES = [
  ["Bun (production)", BUN, []],
  ["Node", process.execPath, ["--import", "tsx"]]
] as const

/** What each case of the smoke script must come to, whatever the runtime. */
const expectTrustedCa = (out: SmokeOut) => {
  const c = (name: string): Seen => {
    const v = out[name]
    if (v === undefined || typeof v === "string") return expect.fail(`no case ${name}`)
    return v
  }
  // trusted, by IP: AUTH, then SELECT (db 2 in the URL), then the PUBLISH; no SNI for an IP
  expect(c("goodIp")).toMatchObject({
    outcome: "ok",
    commands: [["AUTH", "SECRET"], ["SELECT", "2"], ["PUBLISH", "ch", "m"]],
    servernames: []
  })
  // trusted, by name: the name is the SNI; user and password in AUTH; db 0: no SELECT
  expect(c("goodName")).toMatchObject({
    outcome: "ok",
    commands: [["AUTH", "user", "SECRET"], ["PUBLISH", "ch", "m"]],
    servernames: ["localhost"]
  })
  // signed by the trusted CA for another name: refused by IP and by name, nothing sent
  for (const name of ["otherIp", "otherName"]) {
    expect(c(name), name).toMatchObject({ outcome: "connect:ERR_TLS_CERT_ALTNAME_INVALID", commands: [], accepted: 1 })
  }
  // self-signed stays untrusted when another CA is added
  for (const name of ["selfIp", "selfName"]) {
    expect(c(name), name).toMatchObject({ outcome: "connect:DEPTH_ZERO_SELF_SIGNED_CERT", commands: [], accepted: 1 })
  }
  expect(c("otherName").servernames).toEqual(["localhost"])
  expect(c("plain")).toMatchObject({ outcome: "timeout:connect", commands: [], accepted: 1 })
  // the whole publisher: one audit event published over TLS
  const published = c("publisher")
  expect(published.outcome).toBe("published")
  expect(published.servernames).toEqual(["localhost"])
  expect(published.commands.map((x) => x.slice(0, 2))).toEqual([["AUTH", "user"], ["PUBLISH", "webhook:events"]])
  expect(JSON.parse(published.commands[1]?.[2] ?? "{}")).toMatchObject({ deliveryId: "whd_v1_abc", url: "[redacted]" })
}

describe("rediss:// with a CA the process trusts (NODE_EXTRA_CA_CERTS, child process)", () => {
  it.live.each(RUNTIMES)(
    "%s: publishes to a certificate for the host; refuses one for another name or self-signed",
    ([runtime, command, args]) =>
      Effect.gen(function*() {
        const r = yield* runSmoke(command, args)
        expect(r.stderr).toBe("")
        expect(r.code).toBe(0)
        const out = JSON.parse(r.stdout) as SmokeOut
        expect(out.runtime).toBe(runtime === "Node" ? "node" : "bun")
        expectTrustedCa(out)
      })
  )

  // before 5 December 2026 the variable turned the check off: the password went to the self-signed
  // server and to the one certified for another name (the HTTP transport already ignored it)
  it.live.each(RUNTIMES)(
    "%s: NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment turns no certificate check off",
    ([runtime, command, args]) =>
      Effect.gen(function*() {
        const r = yield* runSmoke(command, args, { NODE_TLS_REJECT_UNAUTHORIZED: "0" })
        // the runtime's own warning about the variable is all stderr may hold
        expect(stderrBesideTlsWarning(r.stderr)).toEqual([])
        expect(r.code).toBe(0)
        const out = JSON.parse(r.stdout) as SmokeOut
        expect(out.runtime).toBe(runtime === "Node" ? "node" : "bun")
        expectTrustedCa(out)
      })
  )
})
