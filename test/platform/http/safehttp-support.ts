/**
 * Shared pieces of the SafeHttp tests (safehttp.*.test.ts, SPEC §4.6): a self-signed certificate
 * for receiver.test and 127.0.0.1, real HTTP/HTTPS servers on 127.0.0.1, a fake Resolver, and the
 * request and error helpers.
 */
import { afterAll, expect } from "@effect/vitest"
import { Cause, type Context, Duration, Effect, Either, Layer } from "effect"
import { execFileSync } from "node:child_process"
import { mkdtempSync, readFileSync, rmSync } from "node:fs"
import * as Http from "node:http"
import * as Https from "node:https"
import * as Net from "node:net"
import { tmpdir } from "node:os"
import * as Path from "node:path"
import {
  parseAllowCidrs,
  type ResolvedAddress,
  type ResolveError,
  Resolver,
  SafeHttp,
  SafeHttpError,
  type SafeHttpErrorKind,
  type SafeHttpOptions,
  type SafeRequest
} from "../../../src/services/platform/http/SafeHttp.js"
import { freePort } from "../../support/proc.js"

// ---------------------------------------------------------------------------------------------
// A self-signed certificate for receiver.test and 127.0.0.1 (openssl is required for these tests)

/** The test certificate's files (in a temporary directory) and their PEM texts. */
export interface TestCertificate {
  readonly KEY_PATH: string
  readonly CERT_PATH: string
  readonly KEY: string
  readonly CERT: string
}

let certificate: TestCertificate | undefined

/**
 * Creates the test certificate (once per test file) and removes it after the file's tests
 * (afterAll). Call it at the top of every test file that starts a server with `tls: true`.
 */
export const useTestCertificate = (): TestCertificate => {
  if (certificate !== undefined) return certificate
  const certDir = mkdtempSync(Path.join(tmpdir(), "firehook-safehttp-"))
  const KEY_PATH = Path.join(certDir, "key.pem")
  const CERT_PATH = Path.join(certDir, "cert.pem")
  execFileSync(
    "openssl",
    [
      "req",
      "-x509",
      "-newkey",
      "ec",
      "-pkeyopt",
      "ec_paramgen_curve:prime256v1",
      "-nodes",
      "-keyout",
      KEY_PATH,
      "-out",
      CERT_PATH,
      "-days",
      "2",
      "-subj",
      "/CN=receiver.test",
      "-addext",
      "subjectAltName=DNS:receiver.test,IP:127.0.0.1"
    ],
    { stdio: "ignore" }
  )
  certificate = {
    KEY_PATH,
    CERT_PATH,
    KEY: readFileSync(KEY_PATH, "utf8"),
    CERT: readFileSync(CERT_PATH, "utf8")
  }
  afterAll(() => {
    rmSync(certDir, { recursive: true, force: true })
    certificate = undefined
  })
  return certificate
}

/** The certificate useTestCertificate created for this test file (a TLS server needs one). */
const testCertificate = (): TestCertificate => {
  if (certificate === undefined) throw new Error("a TLS test server needs useTestCertificate() in its test file")
  return certificate
}

// ---------------------------------------------------------------------------------------------
// Test servers

export interface Seen {
  readonly method: string
  readonly url: string
  readonly headers: Http.IncomingHttpHeaders
  readonly rawHeaders: ReadonlyArray<string>
  readonly body: string
  readonly remoteAddress: string | undefined
  /** TLS server name indication received (HTTPS servers); `false` when none was sent. */
  readonly sni: unknown
}

export interface TestServer {
  readonly port: number
  readonly seen: Array<Seen>
  /** TCP connections accepted so far. */
  readonly connections: () => number
  /** TCP connections currently open. */
  readonly open: () => number
}

export type Handler = (req: Http.IncomingMessage, res: Http.ServerResponse, body: string) => void

export const ok: Handler = (_req, res) => {
  res.writeHead(200, { "content-type": "text/plain", "X-Reply": "yes" })
  res.end("thanks")
}

export const startServer = (
  handler: Handler,
  options?: { readonly tls?: boolean; readonly host?: string; readonly port?: number }
) =>
  Effect.acquireRelease(
    Effect.async<{ readonly server: Http.Server; readonly api: TestServer }>((resume) => {
      const seen: Array<Seen> = []
      let connections = 0
      const sockets = new Set<Net.Socket>()
      const onRequest = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
        const chunks: Array<Buffer> = []
        req.on("data", (c: Buffer) => chunks.push(c))
        req.on("end", () => {
          const body = Buffer.concat(chunks).toString("utf8")
          seen.push({
            method: req.method ?? "",
            url: req.url ?? "",
            headers: req.headers,
            rawHeaders: req.rawHeaders,
            body,
            remoteAddress: req.socket.remoteAddress,
            sni: Reflect.get(req.socket, "servername")
          })
          handler(req, res, body)
        })
      }
      const server: Http.Server = options?.tls === true
        ? Https.createServer({ key: testCertificate().KEY, cert: testCertificate().CERT }, onRequest)
        : Http.createServer(onRequest)
      server.on("connection", (s: Net.Socket) => {
        connections++
        sockets.add(s)
        s.on("close", () => sockets.delete(s))
      })
      server.on("tlsClientError", () => undefined)
      server.listen(options?.port ?? 0, options?.host ?? "127.0.0.1", () => {
        const a = server.address()
        const port = typeof a === "object" && a !== null ? a.port : 0
        resume(
          Effect.succeed({ server, api: { port, seen, connections: () => connections, open: () => sockets.size } })
        )
      })
    }),
    ({ server }) =>
      Effect.async<void>((resume) => {
        server.closeAllConnections()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ api }) => api))

/**
 * A port on 127.0.0.1 with nothing listening: bindable a moment ago, below the kernel's ephemeral
 * range (freePort), where no other test's listener on port 0 can land before the connection.
 */
export const closedPort = Effect.promise(freePort)

/** a raw TCP server on 127.0.0.1 (scoped: closed with the test); yields its port */
export const rawServer = (onConnection: (socket: Net.Socket) => void) =>
  Effect.acquireRelease(
    Effect.async<{ readonly server: Net.Server; readonly port: number }>((resume) => {
      const server = Net.createServer(onConnection)
      server.listen(0, "127.0.0.1", () => {
        const a = server.address()
        resume(Effect.succeed({ server, port: typeof a === "object" && a !== null ? a.port : 0 }))
      })
    }),
    ({ server }) =>
      Effect.async<void>((resume) => {
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ port }) => port))

/**
 * A raw server's connection handler: the first request on each connection is answered (keep-alive);
 * the next one finds the connection closed (destroyed once its request has arrived whole).
 */
export const answerFirstDropRest =
  (seen: { readonly connection: () => void; readonly request: () => void }) => (socket: Net.Socket): void => {
    seen.connection()
    let served = 0
    let buffered = ""
    socket.setEncoding("latin1") // one character per byte, so lengths are byte counts
    socket.on("error", () => undefined)
    socket.on("data", (d: string) => {
      buffered += d
      const end = buffered.indexOf("\r\n\r\n")
      if (end < 0) return
      const length = Number(/content-length: (\d+)/i.exec(buffered)?.[1] ?? "0")
      if (buffered.length < end + 4 + length) return
      buffered = ""
      seen.request()
      served++
      if (served === 1) socket.write("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok")
      else socket.destroy()
    })
  }

export const eventually = (check: () => boolean, what: string) =>
  Effect.gen(function*() {
    for (let i = 0; i < 100; i++) {
      if (check()) return
      yield* Effect.sleep(Duration.millis(50))
    }
    expect.fail(`never happened: ${what}`)
  })

// ---------------------------------------------------------------------------------------------
// Fake resolver

export const fam = (address: string): ResolvedAddress => ({ address, family: address.includes(":") ? 6 : 4 })

export const fakeResolver = (answer: (host: string) => Effect.Effect<ReadonlyArray<ResolvedAddress>, ResolveError>) => {
  const calls: Array<string> = []
  const layer = Layer.succeed(Resolver, {
    lookup: (host) =>
      Effect.suspend(() => {
        calls.push(host)
        return answer(host)
      })
  })
  return { calls, layer }
}

export const answers = (...addresses: ReadonlyArray<string>) => fakeResolver(() => Effect.succeed(addresses.map(fam)))

export const DEV: SafeHttpOptions = { allowInsecureDev: true, allowCidrs: [] }
export const PROD: SafeHttpOptions = { allowInsecureDev: false, allowCidrs: [] }

export const cidrs = (s: string) => Either.getOrThrow(parseAllowCidrs(s))

export const post = (url: string, extra?: Partial<SafeRequest>): SafeRequest => ({
  url,
  method: "POST",
  headers: { "Content-Type": "application/json", "User-Agent": "firehook/test" },
  body: "{\"hello\":\"wörld\"}",
  timeoutMs: 5_000,
  maxResponseBytes: 64 * 1024,
  ...extra
})

export const send = (options: SafeHttpOptions, resolver: { readonly layer: Layer.Layer<Resolver> }, req: SafeRequest) =>
  Effect.flatMap(SafeHttp, (http) => http.request(req)).pipe(
    Effect.provide(SafeHttp.layer(options).pipe(Layer.provide(resolver.layer)))
  )

/** Runs `f` against one transport layer that stays open until `f` is done (its agents are not closed early). */
export const withHttp = <A, E>(
  options: SafeHttpOptions,
  resolver: { readonly layer: Layer.Layer<Resolver> },
  f: (http: Context.Tag.Service<SafeHttp>) => Effect.Effect<A, E>
) => Effect.flatMap(SafeHttp, f).pipe(Effect.provide(SafeHttp.layer(options).pipe(Layer.provide(resolver.layer))))

/** Every error must be generic: none of `secrets` may appear in its message, string or JSON forms. */
export const expectGeneric = (error: SafeHttpError, secrets: ReadonlyArray<string>) => {
  const renderings = [
    error.message,
    String(error),
    JSON.stringify(error),
    JSON.stringify(Object.getOwnPropertyNames(error).map((k) => [k, String(Reflect.get(error, k))])),
    Cause.pretty(Cause.fail(error))
  ]
  for (const r of renderings) {
    for (const s of secrets) expect(r).not.toContain(s)
  }
  expect(error.message).toBe(`delivery failed: ${error.kind}`)
  expect(Object.keys(error).sort()).toEqual(["_tag", "kind"])
}

export const expectKind = <R>(
  effect: Effect.Effect<unknown, SafeHttpError, R>,
  kind: SafeHttpErrorKind,
  secrets: ReadonlyArray<string>
) =>
  Effect.gen(function*() {
    const error = yield* Effect.flip(effect)
    expect(error).toBeInstanceOf(SafeHttpError)
    expect(error.kind).toBe(kind)
    expectGeneric(error, secrets)
    return error
  })

export const text = (b: Uint8Array) => Buffer.from(b).toString("utf8")
