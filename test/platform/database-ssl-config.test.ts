/**
 * `DatabaseSsl.driverConfig`: the `pg` client settings firehook connects with. Each TLS setting of
 * `DATABASE_URL` (and `PGSSLMODE`) → the `ssl` the driver gets: every mode that promises a checked
 * certificate carries `rejectUnauthorized: true`, so that NODE_TLS_REJECT_UNAUTHORIZED cannot turn
 * the check off (test/platform/database-tls.test.ts shows it on the wire); the explicit opt-outs
 * keep pg's `rejectUnauthorized: false`. Everything else is what pg makes of the URL itself.
 */
import { Either } from "effect"
import { mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs"
import { createRequire } from "node:module"
import { tmpdir } from "node:os"
import * as Path from "node:path"
import Pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import * as DatabaseSsl from "../../src/services/platform/DatabaseSsl.js"

const dir = mkdtempSync(Path.join(tmpdir(), "firehook-ssl-config-"))
afterAll(() => rmSync(dir, { recursive: true, force: true }))
const file = (name: string, text: string) => {
  const path = Path.join(dir, name)
  writeFileSync(path, text)
  return path
}
const CA = file("ca.pem", "the CA's PEM")
const CERT = file("client.pem", "the client certificate's PEM")
const KEY = file("client.key", "the client key's PEM")

const BASE = "postgresql://u:p%40ss@db.example:6543/app"
const CHECKED = { rejectUnauthorized: true }
const UNCHECKED = { rejectUnauthorized: false }

const config = (query: string, pgSslMode?: string): Pg.ClientConfig =>
  Either.getOrThrowWith(
    DatabaseSsl.driverConfig(query === "" ? BASE : `${BASE}?${query}`, pgSslMode),
    (e) => new Error(`driverConfig failed: ${String(e)}`)
  )

/** The `ssl` pg derives from a client config (what its TLS connect is given). */
const pgSsl = (c: Pg.ClientConfig): unknown => Reflect.get(Reflect.get(new Pg.Client(c), "connectionParameters"), "ssl")

describe("DatabaseSsl.driverConfig: the ssl the driver gets", () => {
  it.each([
    ["sslmode=verify-full", CHECKED],
    // pg 8's aliases of verify-full (rewritten to it by driverConnectionString)
    ["sslmode=require", CHECKED],
    ["sslmode=prefer", CHECKED],
    ["sslmode=verify-ca", CHECKED],
    ["ssl=true", CHECKED],
    ["ssl=1", CHECKED],
    // a value pg does not know but turns TLS on for: checked
    ["ssl=require", CHECKED],
    // TLS asked for by the negotiation alone
    ["sslnegotiation=direct", CHECKED],
    ["uselibpqcompat=true&sslmode=verify-full", CHECKED],
    // the operator's explicit "without checking"
    ["sslmode=no-verify", UNCHECKED],
    ["ssl=no-verify", UNCHECKED],
    ["uselibpqcompat=true&sslmode=require", UNCHECKED],
    ["uselibpqcompat=true&sslmode=prefer", UNCHECKED],
    // no TLS
    ["sslmode=disable", false],
    ["uselibpqcompat=true&sslmode=disable", false],
    ["ssl=0", false],
    ["ssl=", false],
    // the last sslmode decides, as for pg
    ["sslmode=disable&sslmode=require", CHECKED],
    ["sslmode=require&sslmode=no-verify", UNCHECKED]
  ])("%s → %o", (query, ssl) => {
    const c = config(query)
    expect(c.ssl).toEqual(ssl)
    // pg keeps it: nothing in the config makes it parse the URL again
    expect(c).not.toHaveProperty("connectionString")
    expect(pgSsl(c)).toEqual(ssl)
  })

  it("certificate files are read as pg reads them, and the check stays on", () => {
    expect(config(`sslmode=verify-full&sslrootcert=${CA}`).ssl).toEqual({ ca: "the CA's PEM", ...CHECKED })
    expect(config(`sslmode=require&sslcert=${CERT}&sslkey=${KEY}`).ssl).toEqual({
      cert: "the client certificate's PEM",
      key: "the client key's PEM",
      ...CHECKED
    })
    // with a file of its own and no sslmode, pg turns TLS on: checked
    expect(config(`sslrootcert=${CA}`).ssl).toEqual({ ca: "the CA's PEM", ...CHECKED })
  })

  it("libpq's verify-ca (and require with a CA): the chain is checked, the name is not (the operator's choice)", () => {
    for (const mode of ["verify-ca", "require"]) {
      const ssl = config(`uselibpqcompat=true&sslmode=${mode}&sslrootcert=${CA}`).ssl
      expect(ssl).toMatchObject({ ca: "the CA's PEM", ...CHECKED })
      const skipName: unknown = typeof ssl === "object" ? ssl.checkServerIdentity : undefined
      expect(typeof skipName).toBe("function")
    }
  })

  it("PGSSLMODE, read only when the URL says nothing of TLS: its checking modes are checked", () => {
    for (const mode of ["prefer", "require", "verify-ca", "verify-full"]) {
      const c = config("", mode)
      expect(c.ssl, mode).toEqual(CHECKED)
      expect(pgSsl(c), mode).toEqual(CHECKED)
    }
    // the rest is left to pg, which reads PGSSLMODE itself (disable → false, no-verify → unchecked)
    for (const mode of [undefined, "disable", "no-verify", "allow", ""]) {
      expect(config("", mode), String(mode)).not.toHaveProperty("ssl")
    }
    // the URL wins over the environment, as for pg
    expect(config("sslmode=disable", "require").ssl).toBe(false)
    expect(config("sslmode=no-verify", "verify-full").ssl).toEqual(UNCHECKED)
  })

  it("the rest of the settings are pg's own reading of the URL", () => {
    const urls = [
      `${BASE}?sslmode=require&application_name=mine&options=-c%20search_path%3Dx`,
      `${BASE}?sslmode=no-verify`,
      "postgresql://u@127.0.0.1/app?sslmode=verify-full",
      "postgresql:///app?host=/var/run/postgresql",
      "postgres://u:pw@[::1]:5433/d%20b",
      "postgresql://u:pw@h/app?sslnegotiation=direct&sslmode=verify-full"
    ]
    const fields = ["user", "password", "host", "port", "database", "application_name", "options", "sslnegotiation"]
    for (const url of urls) {
      const c = Either.getOrThrow(DatabaseSsl.driverConfig(url, undefined))
      const mine = Reflect.get(new Pg.Client({ application_name: "firehook", ...c }), "connectionParameters")
      const pgs = Reflect.get(
        new Pg.Client({ application_name: "firehook", connectionString: DatabaseSsl.driverConnectionString(url) }),
        "connectionParameters"
      )
      for (const f of fields) expect(Reflect.get(mine, f), `${url} ${f}`).toEqual(Reflect.get(pgs, f))
    }
  })

  it("the parser's errors are returned (an unreadable sslrootcert, libpq's verify-ca without a CA)", () => {
    const missing = DatabaseSsl.driverConfig(`${BASE}?sslmode=verify-full&sslrootcert=${Path.join(dir, "none.pem")}`)
    expect(Either.isLeft(missing) ? Reflect.get(Object(missing.left), "code") : "no error").toBe("ENOENT")
    expect(Either.isLeft(DatabaseSsl.driverConfig(`${BASE}?uselibpqcompat=true&sslmode=verify-ca`))).toBe(true)
  })

  it("is the parser pg itself uses (the same module file: pinned to pg's version)", () => {
    const require = createRequire(import.meta.url)
    const ours = realpathSync(require.resolve("pg-connection-string"))
    const pgs = realpathSync(createRequire(require.resolve("pg")).resolve("pg-connection-string"))
    expect(ours).toBe(pgs)
  })
})
