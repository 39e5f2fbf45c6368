/**
 * `DATABASE_URL` over TLS: a mode that promises a checked certificate (`verify-full` and the modes
 * firehook makes it, `ssl=true`, `PGSSLMODE=require`) must refuse a self-signed certificate and one
 * for another name before the startup message (user, database) and the password are sent, even
 * with NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment; the operator's explicit opt-outs
 * (`no-verify`, `uselibpqcompat=true`) keep their meaning.
 *
 * The servers are fakes of this process (test/support/fakePgTls.ts): SSLRequest answered `S`, TLS
 * with the certificate given, then a password request and a refusal (`28P01`), so that a connection
 * that gets through fails with `28P01` and the server has recorded the password. The client runs in
 * child processes, under Bun (the production runtime) and under Node, because both read
 * NODE_TLS_REJECT_UNAUTHORIZED and NODE_EXTRA_CA_CERTS (naming the test's CA) only at start
 * (test/support/database-tls-smoke.ts).
 */
import { execFile } from "node:child_process"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { type FakePg, type FakePgState, fakePgTls } from "../support/fakePgTls.js"
import { BUN, ROOT } from "../support/proc.js"
import { makeTestPki, stderrBesideTlsWarning } from "../support/testPki.js"

const pki = makeTestPki("pg-tls")
const GOOD = pki.signed("good", ["DNS:localhost", "IP:127.0.0.1"])
const OTHER = pki.signed("other", ["DNS:other.test"])
const SELF = pki.selfSigned("self", ["DNS:localhost", "IP:127.0.0.1"])
afterAll(() => pki.remove())

const PASSWORD = "tls-pg-SECRET-pw"
const url = (host: string, port: number, query: string) =>
  `postgresql://fh_user:${PASSWORD}@${host}:${port}/fh_db${query === "" ? "" : `?${query}`}`

type Cert = "good" | "other" | "self" | "none"
const PEMS = { good: GOOD, other: OTHER, self: SELF, none: undefined } as const

interface Case {
  readonly name: string
  readonly cert: Cert
  readonly host: "127.0.0.1" | "localhost"
  readonly query: string
  readonly pgsslmode?: string
  /** the LISTEN connection (PgListen on `DatabaseSsl.driverConfig`) rather than the pool */
  readonly listen?: boolean
}

const SELF_SIGNED = "database: could not connect (DEPTH_ZERO_SELF_SIGNED_CERT)"
const OTHER_NAME = "database: could not connect (ERR_TLS_CERT_ALTNAME_INVALID)"
const REFUSED_PASSWORD = "database: could not connect (28P01: password authentication failed)"

/** Cases the certificate check must refuse, with the failure the startup line names. */
const REFUSED: ReadonlyArray<readonly [Case, string]> = [
  [{ name: "selfVerifyFullIp", cert: "self", host: "127.0.0.1", query: "sslmode=verify-full" }, SELF_SIGNED],
  [{ name: "selfVerifyFullName", cert: "self", host: "localhost", query: "sslmode=verify-full" }, SELF_SIGNED],
  [{ name: "selfRequire", cert: "self", host: "127.0.0.1", query: "sslmode=require" }, SELF_SIGNED],
  [{ name: "selfPrefer", cert: "self", host: "localhost", query: "sslmode=prefer" }, SELF_SIGNED],
  [{ name: "selfVerifyCa", cert: "self", host: "127.0.0.1", query: "sslmode=verify-ca" }, SELF_SIGNED],
  [{ name: "selfSslTrue", cert: "self", host: "127.0.0.1", query: "ssl=true" }, SELF_SIGNED],
  [{ name: "selfPgsslmode", cert: "self", host: "127.0.0.1", query: "", pgsslmode: "require" }, SELF_SIGNED],
  [{ name: "otherVerifyFullIp", cert: "other", host: "127.0.0.1", query: "sslmode=verify-full" }, OTHER_NAME],
  [{ name: "otherVerifyFullName", cert: "other", host: "localhost", query: "sslmode=verify-full" }, OTHER_NAME],
  [{ name: "otherRequire", cert: "other", host: "localhost", query: "sslmode=require" }, OTHER_NAME],
  [{ name: "otherSslTrue", cert: "other", host: "localhost", query: "ssl=true" }, OTHER_NAME],
  [
    { name: "selfListen", cert: "self", host: "127.0.0.1", query: "sslmode=require", listen: true },
    "failed (DEPTH_ZERO_SELF_SIGNED_CERT)"
  ],
  // libpq's verify-ca (asked for with uselibpqcompat): the chain is checked against sslrootcert
  [
    {
      name: "selfLibpqVerifyCa",
      cert: "self",
      host: "127.0.0.1",
      query: `uselibpqcompat=true&sslmode=verify-ca&sslrootcert=${encodeURIComponent(pki.caPath)}`
    },
    SELF_SIGNED
  ]
]

/** Cases that must get through the handshake (then the fake refuses the password: `28P01`). */
const ACCEPTED: ReadonlyArray<Case> = [
  { name: "goodVerifyFullIp", cert: "good", host: "127.0.0.1", query: "sslmode=verify-full" },
  { name: "goodVerifyFullName", cert: "good", host: "localhost", query: "sslmode=verify-full" },
  { name: "goodRequire", cert: "good", host: "localhost", query: "sslmode=require" },
  { name: "goodPgsslmode", cert: "good", host: "localhost", query: "", pgsslmode: "verify-full" },
  { name: "goodListen", cert: "good", host: "localhost", query: "sslmode=require", listen: true },
  // the operator's explicit "encrypt without checking"
  { name: "selfNoVerify", cert: "self", host: "127.0.0.1", query: "sslmode=no-verify" },
  { name: "selfLibpqRequire", cert: "self", host: "127.0.0.1", query: "uselibpqcompat=true&sslmode=require" },
  // libpq's verify-ca: a certificate from the given CA, whatever its name
  {
    name: "otherLibpqVerifyCa",
    cert: "other",
    host: "localhost",
    query: `uselibpqcompat=true&sslmode=verify-ca&sslrootcert=${encodeURIComponent(pki.caPath)}`
  }
]

/** A server without TLS (answers `N`): refused by the client, nothing sent in the clear. */
const PLAIN: Case = { name: "plainVerifyFull", cert: "none", host: "127.0.0.1", query: "sslmode=verify-full" }

const ALL: ReadonlyArray<Case> = [...REFUSED.map(([c]) => c), ...ACCEPTED, PLAIN]

interface SmokeOut {
  readonly runtime: string
  readonly outcomes: Readonly<Record<string, string>>
}

const runSmoke = (
  command: string,
  args: ReadonlyArray<string>,
  cases: ReadonlyArray<{ readonly name: string; readonly url: string; readonly pgsslmode?: string }>,
  env: Record<string, string>
) =>
  new Promise<{ readonly stdout: string; readonly stderr: string; readonly code: number }>((resolve) => {
    execFile(
      command,
      [...args, Path.join(ROOT, "test/support/database-tls-smoke.ts"), JSON.stringify(cases)],
      {
        cwd: ROOT,
        timeout: 90_000,
        env: {
          PATH: process.env["PATH"] ?? "",
          HOME: process.env["HOME"] ?? "/tmp",
          NODE_EXTRA_CA_CERTS: pki.caPath,
          ...env
        }
      },
      (error, stdout, stderr) =>
        resolve({ stdout, stderr, code: error === null ? 0 : typeof error.code === "number" ? error.code : -1 })
    )
  })

/** Wait (bounded) until every connection a server accepted is closed, then read what it saw. */
const settled = async (server: FakePg): Promise<FakePgState> => {
  for (let waited = 0; waited < 10_000; waited += 25) {
    const s = server.state()
    if (s.accepted > 0 && s.closed === s.accepted) return s
    await new Promise((resolve) => setTimeout(resolve, 25))
  }
  return server.state()
}

const RUNTIMES = [
  ["Bun (production)", BUN, []],
  ["Node", process.execPath, ["--import", "tsx"]]
] as const

const ENVS = [
  ["NODE_TLS_REJECT_UNAUTHORIZED=0", { NODE_TLS_REJECT_UNAUTHORIZED: "0" }],
  ["no NODE_TLS_REJECT_UNAUTHORIZED", {}]
] as const

describe("DATABASE_URL over TLS, the test CA trusted (child processes)", () => {
  let servers: Map<string, FakePg> = new Map()
  afterAll(async () => {
    await Promise.all([...servers.values()].map((s) => s.close()))
  })

  for (const [runtime, command, args] of RUNTIMES) {
    for (const [envName, env] of ENVS) {
      it(
        `${runtime}, ${envName}: a certificate that does not check out gets no startup message and no password`,
        async () => {
          await Promise.all([...servers.values()].map((s) => s.close()))
          servers = new Map()
          for (const c of ALL) servers.set(c.name, await fakePgTls(PEMS[c.cert]))
          const port = (name: string) => servers.get(name)?.port ?? 0
          const r = await runSmoke(
            command,
            args,
            ALL.map((c) => ({
              name: c.name,
              url: url(c.host, port(c.name), c.query),
              ...(c.pgsslmode === undefined ? {} : { pgsslmode: c.pgsslmode }),
              ...(c.listen === true ? { listen: true } : {})
            })),
            env
          )
          // the runtime's own warning about the variable is all stderr may hold
          expect(stderrBesideTlsWarning(r.stderr)).toEqual([])
          expect(r.code).toBe(0)
          const out = JSON.parse(r.stdout) as SmokeOut
          expect(out.runtime).toBe(runtime === "Node" ? "node" : "bun")
          const seen = async (name: string) => {
            const server = servers.get(name)
            return server === undefined ? expect.fail(`no server for ${name}`) : await settled(server)
          }

          // what each case came to and what its server saw, compared as a whole (a failure shows every case)
          const view = (s: FakePgState, outcome: string | undefined) => ({
            outcome,
            sslRequests: s.sslRequests,
            handshakes: s.handshakes,
            servernames: s.servernames,
            clearStartups: s.clearStartups.length,
            tlsStartups: s.tlsStartups.map((p) => `${p["user"]}@${p["database"]}`),
            passwords: s.passwords
          })
          const actual: Record<string, ReturnType<typeof view>> = {}
          for (const c of ALL) actual[c.name] = view(await seen(c.name), out.outcomes[c.name])
          const expected: Record<string, ReturnType<typeof view>> = {}
          for (const [c, outcome] of REFUSED) {
            // the SSLRequest, then a handshake the client broke off: nothing else, in the clear or not
            expected[c.name] = {
              outcome,
              sslRequests: 1,
              handshakes: 0,
              servernames: [],
              clearStartups: 0,
              tlsStartups: [],
              passwords: []
            }
          }
          for (const c of ACCEPTED) {
            expected[c.name] = {
              outcome: c.listen === true ? "failed (28P01)" : REFUSED_PASSWORD,
              sslRequests: 1,
              handshakes: 1,
              // the SNI is the host name, none for an IP (RFC 6066)
              servernames: [c.host === "localhost" ? "localhost" : ""],
              clearStartups: 0,
              tlsStartups: ["fh_user@fh_db"],
              passwords: [PASSWORD]
            }
          }
          expected[PLAIN.name] = {
            outcome: "database: could not connect (the server does not support SSL; see sslmode in DATABASE_URL)",
            sslRequests: 1,
            handshakes: 0,
            servernames: [],
            clearStartups: 0,
            tlsStartups: [],
            passwords: []
          }
          expect(actual).toEqual(expected)
        },
        120_000
      )
    }
  }
})
