/**
 * `sslmode` in DATABASE_URL (DatabaseSsl.ts): prefer / require / verify-ca keep pg 8's checking
 * meaning (verify-full) and reach the driver as `verify-full`, so pg's ten-line SECURITY WARNING
 * never reaches stderr (SPEC §6.1: stderr carries only the one-line failure); `no-verify` and
 * `uselibpqcompat=true` are the operator's explicit choices and pass unchanged.
 */
import { SqlError } from "@effect/sql/SqlError"
import { spawnSync } from "node:child_process"
import * as Net from "node:net"
import * as Path from "node:path"
import Pg from "pg"
import { describe, expect, it } from "vitest"
import * as Database from "../../src/services/platform/Database.js"
import * as DatabaseSsl from "../../src/services/platform/DatabaseSsl.js"
import { urlFor } from "../support/db.js"

const ROOT = Path.resolve(import.meta.dirname, "../..")
const BUN = Path.join(ROOT, "node_modules/.bin/bun")
const ENV = { PATH: process.env["PATH"] ?? "", HOME: process.env["HOME"] ?? "/tmp" }

/** The `ssl` option pg derives from a connection string (what its TLS connect is given). */
const sslOf = (url: string): unknown => {
  const client = new Pg.Client({ connectionString: url })
  return Reflect.get(Reflect.get(client, "connectionParameters"), "ssl")
}

const BASE = "postgresql://u:p%40ss@db.example:5432/app"

describe("DatabaseSsl.driverConnectionString", () => {
  it.each(["prefer", "require", "verify-ca"])("sslmode=%s becomes verify-full (pg 8's meaning, checked)", (mode) => {
    const out = DatabaseSsl.driverConnectionString(`${BASE}?sslmode=${mode}&application_name=x`)
    const u = new URL(out)
    expect(u.searchParams.get("sslmode")).toBe("verify-full")
    expect(u.searchParams.get("application_name")).toBe("x")
    expect([u.username, u.password, u.host, u.pathname]).toEqual(["u", "p%40ss", "db.example:5432", "/app"])
    // the certificate and the host name are checked: no `rejectUnauthorized: false`, no
    // `checkServerIdentity` override
    expect(sslOf(out)).toEqual({})
    expect(DatabaseSsl.driverConnectionString(out)).toBe(out)
  })

  it.each([
    `${BASE}`,
    `${BASE}?sslmode=disable`,
    `${BASE}?sslmode=verify-full`,
    `${BASE}?sslmode=no-verify`,
    `${BASE}?uselibpqcompat=true&sslmode=require`,
    "postgresql:///app?host=/var/run/postgresql"
  ])("%s passes unchanged", (url) => {
    expect(DatabaseSsl.driverConnectionString(url)).toBe(url)
  })

  it("the last sslmode is the one pg reads, and the one decided on", () => {
    expect(new URL(DatabaseSsl.driverConnectionString(`${BASE}?sslmode=disable&sslmode=require`)).searchParams.getAll(
      "sslmode"
    )).toEqual(["verify-full"])
    expect(DatabaseSsl.driverConnectionString(`${BASE}?sslmode=require&sslmode=disable`)).toBe(
      `${BASE}?sslmode=require&sslmode=disable`
    )
  })

  it("what each explicit choice means to pg", () => {
    expect(sslOf(`${BASE}?sslmode=disable`)).toBe(false)
    expect(sslOf(`${BASE}?sslmode=no-verify`)).toEqual({ rejectUnauthorized: false })
    expect(sslOf(`${BASE}?uselibpqcompat=true&sslmode=require`)).toEqual({ rejectUnauthorized: false })
  })

  it("an unknown sslmode is refused by the config rule", () => {
    for (const mode of ["prefer", "require", "verify-ca", "verify-full", "disable", "no-verify"]) {
      expect(DatabaseSsl.sslModeRule.test(`${BASE}?sslmode=${mode}`)).toBe(true)
    }
    expect(DatabaseSsl.sslModeRule.test(BASE)).toBe(true)
    for (const mode of ["allow", "Require", "", "true"]) {
      expect(DatabaseSsl.sslModeRule.test(`${BASE}?sslmode=${mode}`)).toBe(false)
    }
  })

  it("an ssl value pg would read as 'TLS on' whatever it says (ssl=false) is refused by the config rule", () => {
    for (const value of ["true", "1", "0", "no-verify"]) {
      expect(DatabaseSsl.sslParamRule.test(`${BASE}?ssl=${value}`)).toBe(true)
    }
    expect(DatabaseSsl.sslParamRule.test(BASE)).toBe(true)
    expect(DatabaseSsl.sslParamRule.test(`${BASE}?sslmode=require`)).toBe(true)
    for (const value of ["false", "no", "yes", "", "TRUE", "require"]) {
      expect(DatabaseSsl.sslParamRule.test(`${BASE}?ssl=${value}`)).toBe(false)
    }
    // the last value is the one pg reads
    expect(DatabaseSsl.sslParamRule.test(`${BASE}?ssl=true&ssl=false`)).toBe(false)
    expect(DatabaseSsl.sslParamRule.test(`${BASE}?ssl=false&ssl=0`)).toBe(true)
  })
})

describe("no library warning on stderr (under Bun, a process each)", () => {
  // a database that does not exist: whatever the server's TLS, nothing is migrated
  const url = (query: string) => `${urlFor("firehook_no_such_db")}?${query}`
  const child = (mode: "database" | "raw", target: string) =>
    spawnSync(BUN, ["test/platform/database-ssl-child.ts", mode, target], {
      cwd: ROOT,
      encoding: "utf8",
      timeout: 60_000,
      env: ENV
    })

  it("the control: pg's own parse of sslmode=require prints the SECURITY WARNING", () => {
    const r = child("raw", url("sslmode=require"))
    expect(r.stdout.trim()).toBe("constructed")
    expect(r.stderr).toContain("SECURITY WARNING")
  }, 90_000)

  it.each(["sslmode=require", "sslmode=prefer", "sslmode=verify-ca", "uselibpqcompat=true&sslmode=require"])(
    "Database.layerUrl with %s: stderr is empty, the failure is one typed line",
    (query) => {
      const r = child("database", url(query))
      expect(r.stderr).toBe("")
      expect(r.stdout).toMatch(/^failed database: could not connect \([^\n]*\)\n$/)
      expect(r.stdout).not.toContain("unknown error")
      expect(r.status).toBe(0)
    },
    90_000
  )
})

describe("Database.describeSqlError", () => {
  it("a server that answers SSLRequest with 'N' (no TLS) is named, not 'unknown error'", async () => {
    // what a PostgreSQL server without TLS answers: the single byte 'N'
    const server = Net.createServer((socket) => {
      socket.once("data", () => socket.end("N"))
    })
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
    const address = server.address()
    const port = typeof address === "object" && address !== null ? address.port : 0
    const client = new Pg.Client({ host: "127.0.0.1", port, user: "u", database: "d", ssl: true })
    const error = await client.connect().then(() => undefined, (e: unknown) => e)
    server.close()
    const expected = "the server does not support SSL; see sslmode in DATABASE_URL"
    expect(Database.describeSqlError(error)).toBe(expected)
    expect(Database.describeSqlError(new SqlError({ cause: error, message: "PgClient: Failed to connect" }))).toBe(
      expected
    )
  })

  it("a code wins; any other message is never read", () => {
    expect(Database.describeSqlError(Object.assign(new Error("x"), { code: "3D000" }))).toBe("3D000")
    const leaky = new Error("connect to postgresql://u:secret@db.example/app failed")
    expect(Database.describeSqlError(new SqlError({ cause: leaky, message: "m" }))).toBe("unknown error")
  })
})
