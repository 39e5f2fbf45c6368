/**
 * bench/lifecycle.ts: a benchmark run with `DATABASE_URL` set works on a throw-away database
 * `fh_bench_<tag>_<pid>_<hex>` created on that server and dropped with its scope, never on the
 * database the variable names (bench/delivery.ts and bench/noisy.ts once truncated its tables); a
 * start drops the benchmark databases whose process is gone, and only those.
 */
import { Effect, Redacted } from "effect"
import { afterAll, describe, expect, inject, it } from "vitest"
import {
  benchDatabaseName,
  benchDatabaseOwner,
  dropStaleBenchDatabases,
  isAlive,
  staleBenchDatabases
} from "../../bench/lifecycle.js"
import { benchDatabaseUrl } from "../../bench/support.js"
import { databaseUrl, withClient } from "../support/pgAdmin.js"

const admin = (): string => inject("pgAdminUrl")
const exists = (name: string) =>
  withClient(
    admin(),
    async (c) => (await c.query(`SELECT 1 FROM pg_database WHERE datname = $1`, [name])).rowCount === 1
  )

/** a pid with no process on this machine */
const deadPid = (): number => {
  for (let pid = 4_000_000; pid > 1_000; pid -= 7) if (!isAlive(pid)) return pid
  return 4_194_301
}

const made: Array<string> = []
afterAll(async () => {
  await withClient(admin(), async (c) => {
    for (const name of made) await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
  })
})

describe("bench database names", () => {
  it("carry the tag and the creating process's pid in base 36", () => {
    const name = benchDatabaseName("e2e", 123_456, "0a1b2c3d")
    expect(name).toBe(`fh_bench_e2e_${(123_456).toString(36)}_0a1b2c3d`)
    expect(benchDatabaseOwner(name)).toBe(123_456)
    expect(benchDatabaseOwner(benchDatabaseName("delivery"))).toBe(process.pid)
  })

  it("are stale only when their process is gone (other names never)", () => {
    const alive = new Set([10, 20])
    const names = [
      benchDatabaseName("e2e", 10, "00000000"),
      benchDatabaseName("e2e", 11, "00000001"),
      benchDatabaseName("noisy", 21, "00000002"),
      benchDatabaseName("delivery", process.pid, "00000003"),
      "postgres",
      "firehook",
      "fh_bench_0123456789ab", // an older name without a pid: whose it is cannot be told
      "fh_test_abc_0123456789ab",
      "fh_bench_e2e_zz_nothex!!"
    ]
    expect(staleBenchDatabases(names, (pid) => alive.has(pid))).toEqual([names[1], names[2]])
  })
})

describe("bench databases on DATABASE_URL's server", () => {
  it("benchDatabaseUrl is a fresh database dropped with its scope, not DATABASE_URL's own", async () => {
    const before = process.env["DATABASE_URL"]
    const server = databaseUrl(admin(), "postgres")
    process.env["DATABASE_URL"] = server
    try {
      const name = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
        const url = Redacted.value(yield* benchDatabaseUrl("delivery"))
        const db = new URL(url).pathname.slice(1)
        expect(url).not.toBe(server)
        expect(db).toMatch(new RegExp(`^fh_bench_delivery_${process.pid.toString(36)}_[0-9a-f]{8}$`))
        made.push(db)
        expect(yield* Effect.promise(() => exists(db))).toBe(true)
        return db
      })))
      expect(await exists(name)).toBe(false)
    } finally {
      if (before === undefined) delete process.env["DATABASE_URL"]
      else process.env["DATABASE_URL"] = before
    }
  })

  it("a start drops the bench databases of gone processes, not a live one's", async () => {
    const dead = benchDatabaseName("e2e", deadPid())
    const live = benchDatabaseName("e2e", process.ppid)
    made.push(dead, live)
    await withClient(admin(), async (c) => {
      await c.query(`CREATE DATABASE ${dead}`)
      await c.query(`CREATE DATABASE ${live}`)
    })
    const dropped = await dropStaleBenchDatabases(admin())
    expect(dropped).toContain(dead)
    expect(dropped).not.toContain(live)
    expect(await exists(dead)).toBe(false)
    expect(await exists(live)).toBe(true)
  })
})
