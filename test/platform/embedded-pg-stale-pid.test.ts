/**
 * A `postmaster.pid` left behind by a server that died uncleanly (a host crash, an OOM kill,
 * `docker kill`): its pid may since be another live process's (pids are reused after a reboot or a
 * container restart, and a restarted container may give it to firehook itself). Before the review of
 * 7 December 2026 such a file was taken for a running server: firehook "adopted" it and every later
 * start failed ("could not create the database"). A server is now adopted only when one answers on
 * the port the file names; otherwise the file is stale and firehook starts the server on the same
 * data. A server that answers while it starts up (SQLSTATE 57P03) still counts as present.
 */
import { Effect, Exit, Logger, Redacted, Scope } from "effect"
import { type ChildProcess, execFileSync, spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import * as EmbeddedPg from "../../src/services/platform/EmbeddedPg.js"

const isRoot = typeof process.getuid === "function" && process.getuid() === 0
const STALE = "stale postmaster.pid (no server answers); starting the embedded PostgreSQL"
const ADOPTING = "embedded PostgreSQL already running for this data directory; adopting it"

const dirs: Array<string> = []
const children: Array<ChildProcess> = []
const servers: Array<Net.Server> = []
const tmp = (prefix: string) => {
  const d = Fs.mkdtempSync(Path.join(Os.tmpdir(), prefix))
  Fs.chmodSync(d, 0o755)
  dirs.push(d)
  return d
}
afterAll(async () => {
  for (const c of children) c.kill("SIGKILL")
  for (const s of servers) await new Promise<void>((r) => s.close(() => r()))
  for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
})

/** A live process that is not a server, of the user the server runs as (PostgreSQL refuses such a pid). */
const otherProcess = (): number => {
  const asServerUser = isRoot
    ? {
      uid: Number(execFileSync("id", ["-u", "postgres"], { encoding: "utf8" }).trim()),
      gid: Number(execFileSync("id", ["-g", "postgres"], { encoding: "utf8" }).trim())
    }
    : {}
  const child = spawn("sleep", ["600"], { ...asServerUser, stdio: "ignore" })
  children.push(child)
  if (child.pid === undefined) throw new Error("sleep did not start")
  return child.pid
}

/** A port something listens on, answering each connection as `onConnection` does (never a PostgreSQL of ours). */
const listener = (onConnection: (socket: Net.Socket) => void) =>
  new Promise<number>((resolve) => {
    const server = Net.createServer(onConnection)
    servers.push(server)
    server.listen(0, "127.0.0.1", () => resolve((server.address() as Net.AddressInfo).port))
  })

/** Something that is not PostgreSQL: each connection closed at once. */
const notAServer = () => listener((socket) => socket.destroy())

/** A PostgreSQL that is starting up: it answers each startup message with FATAL 57P03. */
const startingServer = () =>
  listener((socket) => {
    socket.once("data", () => {
      const fields = Buffer.concat([
        ...[["S", "FATAL"], ["V", "FATAL"], ["C", "57P03"], ["M", "the database system is starting up"]].map((
          [k, v]
        ) => Buffer.from(`${k}${v}\0`)),
        Buffer.from([0])
      ])
      const header = Buffer.alloc(5)
      header.write("E", 0)
      header.writeInt32BE(fields.length + 4, 1)
      socket.end(Buffer.concat([header, fields]))
    })
  })

/** The lock file's text with its pid (line 1) and port (line 4) replaced. */
const withPidAndPort = (text: string, pid: number, port: number) => {
  const lines = text.split("\n")
  lines[0] = String(pid)
  lines[3] = String(port)
  return lines.join("\n")
}

const query = async (url: Redacted.Redacted<string>, q: string) => {
  const c = new pg.Client({ connectionString: Redacted.value(url) })
  await c.connect()
  try {
    return (await c.query<Record<string, unknown>>(q)).rows
  } finally {
    await c.end()
  }
}

const capture = () => {
  const messages: Array<string> = []
  const layer = Logger.replace(
    Logger.defaultLogger,
    Logger.make(({ message }) => void messages.push(Array.isArray(message) ? message.join(" ") : String(message)))
  )
  return { messages, layer }
}

/**
 * A cluster with a table in it, started and stopped cleanly; the lock file its server wrote while
 * running (what a crash leaves behind) is returned, and no server runs for the directory.
 */
const clusterWithLeftover = async (prefix: string) => {
  const options = { dataDir: tmp(prefix), sharedDir: tmp(`${prefix}shared-`), stopTimeout: "20 seconds" as const }
  const first = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
    const db = yield* EmbeddedPg.start(options)
    yield* Effect.promise(() => query(db.url, "CREATE TABLE kept (n int); INSERT INTO kept VALUES (42)"))
    return { pgDir: db.pgDir, lockText: Fs.readFileSync(Path.join(db.pgDir, "postmaster.pid"), "utf8") }
  })))
  const pidFile = Path.join(first.pgDir, "postmaster.pid")
  expect(Fs.existsSync(pidFile)).toBe(false)
  return { options, pidFile, lockText: first.lockText }
}

/** The next start on `options`: whether it owns its server, the kept rows, the lock file's pid and port. */
const nextStart = async (
  options: { readonly dataDir: string; readonly sharedDir: string; readonly stopTimeout: "20 seconds" },
  pidFile: string
) => {
  const { layer, messages } = capture()
  const scope = await Effect.runPromise(Scope.make())
  try {
    const exit = await Effect.runPromiseExit(
      EmbeddedPg.start(options).pipe(Effect.provide(layer), Scope.extend(scope))
    )
    if (Exit.isFailure(exit)) return { failure: String(exit.cause), messages }
    const db = exit.value
    const lines = Fs.readFileSync(pidFile, "utf8").split("\n")
    return {
      owned: db.owned,
      rows: await query(db.url, "SELECT n FROM kept"),
      lock: { pid: Number(lines[0]), port: Number(lines[3]) },
      port: db.port,
      messages
    }
  } finally {
    await Effect.runPromise(Scope.close(scope, Exit.void))
  }
}

describe("a stale postmaster.pid left by a crash", () => {
  it(
    "naming a live process that is not a server (a reused pid): said once, the server started on the same data",
    async () => {
      const { lockText, options, pidFile } = await clusterWithLeftover("firehook-stale-")
      const other = otherProcess()
      Fs.writeFileSync(pidFile, withPidAndPort(lockText, other, await notAServer()))
      const next = await nextStart(options, pidFile)
      expect(next.failure).toBeUndefined()
      expect(next.owned).toBe(true)
      expect(next.rows).toEqual([{ n: 42 }])
      // the lock file is the new server's
      expect(next.lock?.pid).not.toBe(other)
      expect(next.lock?.port).toBe(next.port)
      expect(next.messages.filter((m) => m === STALE)).toHaveLength(1)
      expect(next.messages).not.toContain(ADOPTING)
    },
    180_000
  )

  it(
    "naming this process (a restarted container gave the old server's pid to firehook): not taken for a server",
    async () => {
      const { lockText, options, pidFile } = await clusterWithLeftover("firehook-stale-self-")
      Fs.writeFileSync(pidFile, withPidAndPort(lockText, process.pid, await notAServer()))
      const next = await nextStart(options, pidFile)
      expect(next.failure).toBeUndefined()
      expect(next.owned).toBe(true)
      expect(next.rows).toEqual([{ n: 42 }])
      expect(next.lock?.pid).not.toBe(process.pid)
      expect(next.messages.filter((m) => m === STALE)).toHaveLength(1)
      expect(next.messages).not.toContain(ADOPTING)
    },
    180_000
  )

  it("a server answering that it is starting up (57P03) counts as present: adopted, its lock file kept", async () => {
    const dataDir = tmp("firehook-starting-")
    const pgDir = Path.join(dataDir, "pg")
    Fs.mkdirSync(pgDir, { mode: 0o700 })
    const text = withPidAndPort(
      `0\n${pgDir}\n1765000000\n0\n\n127.0.0.1\n0 0\nready\n`,
      otherProcess(),
      await startingServer()
    )
    Fs.writeFileSync(Path.join(pgDir, "postmaster.pid"), text)
    const { layer, messages } = capture()
    const exit = await Effect.runPromiseExit(Effect.scoped(
      EmbeddedPg.start({ dataDir, sharedDir: tmp("firehook-starting-shared-") }).pipe(Effect.provide(layer))
    ))
    // adopted (the fake server then fails the database's creation): neither removed nor started over
    expect(Exit.isFailure(exit)).toBe(true)
    expect(String(Exit.isFailure(exit) ? exit.cause : "")).toContain("could not create the database")
    expect(messages).toContain(ADOPTING)
    expect(messages).not.toContain(STALE)
    expect(Fs.readFileSync(Path.join(pgDir, "postmaster.pid"), "utf8")).toBe(text)
  }, 60_000)
})
