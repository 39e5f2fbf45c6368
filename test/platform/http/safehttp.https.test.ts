/**
 * SafeHttp (SPEC §4.6), HTTPS: the allow-list, SNI and the certificate checked against the name
 * (real HTTPS servers on 127.0.0.1 with a self-signed certificate, a fake Resolver), and the same
 * under Bun, the production runtime.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { execFile } from "node:child_process"
import * as Path from "node:path"
import { BUN, ROOT } from "../../support/proc.js"
import {
  answers,
  cidrs,
  DEV,
  expectKind,
  ok,
  post,
  PROD,
  send,
  startServer,
  text,
  useTestCertificate
} from "./safehttp-support.js"

const { CERT, CERT_PATH, KEY_PATH } = useTestCertificate()

describe("SafeHttp: HTTPS (SNI and certificate checked against the name)", () => {
  const TLS = { ca: CERT }

  it.scopedLive("allow-list: 127.0.0.1 for http://receiver.test without development mode fails the scheme rule", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok)
      const resolver = answers("127.0.0.1")
      yield* expectKind(
        send(
          { allowInsecureDev: false, allowCidrs: cidrs("127.0.0.0/8"), tls: TLS },
          resolver,
          post(`http://receiver.test:${server.port}/hook`)
        ),
        "invalid_target",
        ["receiver.test", "127.0.0.1"]
      )
      expect(resolver.calls).toEqual([])
      expect(server.connections()).toBe(0)
    }))

  it.scopedLive("allow-list: https://receiver.test answering 127.0.0.1 is allowed with 127.0.0.0/8 listed, blocked without", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const url = `https://receiver.test:${server.port}/hook`
      const blocked = answers("127.0.0.1")
      yield* expectKind(send({ ...PROD, tls: TLS }, blocked, post(url)), "blocked_target", [
        "receiver.test",
        "127.0.0.1"
      ])
      yield* expectKind(
        send({ ...PROD, allowCidrs: cidrs("10.0.0.0/8, fd00::/8"), tls: TLS }, answers("127.0.0.1"), post(url)),
        "blocked_target",
        ["127.0.0.1"]
      )
      expect(server.connections()).toBe(0)

      const resolver = answers("127.0.0.1")
      const res = yield* send(
        { allowInsecureDev: false, allowCidrs: cidrs("10.0.0.0/8, 127.0.0.0/8"), tls: TLS },
        resolver,
        post(url)
      )
      expect(res.status).toBe(200)
      expect(text(res.body)).toBe("thanks")
      expect(resolver.calls).toEqual(["receiver.test"])
      expect(server.seen[0]!.headers.host).toBe(`receiver.test:${server.port}`)
      expect(server.seen[0]!.remoteAddress).toBe("127.0.0.1")
    }))

  it.scopedLive("allow-list also admits an https: literal inside it (certificate checked against the IP)", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const url = `https://127.0.0.1:${server.port}/hook`
      yield* expectKind(send({ ...PROD, tls: TLS }, answers(), post(url)), "blocked_target", ["127.0.0.1"])
      const res = yield* send({ ...PROD, allowCidrs: cidrs("127.0.0.1/32"), tls: TLS }, answers(), post(url))
      expect(res.status).toBe(200)
      expect(server.seen[0]!.headers.host).toBe(`127.0.0.1:${server.port}`)
    }))

  it.scopedLive("development mode: https://receiver.test on loopback, SNI = the name; no SNI for a literal", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const resolver = answers("127.0.0.1")
      const res = yield* send({ ...DEV, tls: TLS }, resolver, post(`https://receiver.test:${server.port}/hook`))
      expect(res.status).toBe(200)
      expect(resolver.calls).toEqual(["receiver.test"])
      expect(server.seen[0]!.sni).toBe("receiver.test")
      expect(server.seen[0]!.headers.host).toBe(`receiver.test:${server.port}`)
      const literal = yield* send({ ...DEV, tls: TLS }, answers(), post(`https://127.0.0.1:${server.port}/hook`))
      expect(literal.status).toBe(200)
      expect(server.seen[1]!.sni).toBe(false)
    }))

  it.scopedLive("TLS failures are network: wrong name for the certificate, untrusted certificate", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      // the certificate is for receiver.test: connecting to the same address as other.test must fail
      yield* expectKind(
        send({ ...DEV, tls: TLS }, answers("127.0.0.1"), post(`https://other.test:${server.port}/hook`)),
        "network",
        ["other.test", "127.0.0.1", String(server.port), "altname", "ERR_TLS"]
      )
      // no custom CA: the self-signed certificate is not trusted
      yield* expectKind(
        send(DEV, answers("127.0.0.1"), post(`https://receiver.test:${server.port}/hook`)),
        "network",
        ["receiver.test", "self-signed", "SELF_SIGNED"]
      )
      expect(server.seen).toHaveLength(0)
      expect(server.connections()).toBe(2)
    }))

  it.scopedLive("NODE_TLS_REJECT_UNAUTHORIZED=0 cannot turn certificate verification off", () =>
    Effect.gen(function*() {
      const server = yield* startServer(ok, { tls: true })
      const before = process.env["NODE_TLS_REJECT_UNAUTHORIZED"]
      yield* Effect.acquireRelease(
        Effect.sync(() => (process.env["NODE_TLS_REJECT_UNAUTHORIZED"] = "0")),
        () =>
          Effect.sync(() => {
            if (before === undefined) delete process.env["NODE_TLS_REJECT_UNAUTHORIZED"]
            else process.env["NODE_TLS_REJECT_UNAUTHORIZED"] = before
          })
      )
      yield* expectKind(send(DEV, answers("127.0.0.1"), post(`https://receiver.test:${server.port}/hook`)), "network", [
        "receiver.test"
      ])
      expect(server.seen).toHaveLength(0)
    }))
})

describe("SafeHttp under Bun", () => {
  it("the production runtime's node:http honours host/servername/Host (smoke script prints ok)", async () => {
    const out = await new Promise<{ stdout: string; stderr: string; code: number | null }>((resolve) => {
      execFile(
        BUN,
        [Path.join(ROOT, "test/support/safehttp-bun-smoke.ts")],
        {
          cwd: ROOT,
          timeout: 60_000,
          env: {
            PATH: process.env["PATH"] ?? "",
            HOME: process.env["HOME"] ?? "/tmp",
            SMOKE_CERT: CERT_PATH,
            SMOKE_KEY: KEY_PATH
          }
        },
        (error, stdout, stderr) =>
          resolve({ stdout, stderr, code: error === null ? 0 : typeof error.code === "number" ? error.code : -1 })
      )
    })
    expect(out.stderr).toBe("")
    expect(out.stdout.trim()).toBe("ok")
    expect(out.code).toBe(0)
  })
})
