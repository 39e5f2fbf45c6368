/**
 * The benchmarks' databases on a `DATABASE_URL` server, and how a benchmark ends on a signal.
 *
 * Signals: an Effect benchmark runs through {@link runBench} (the platform runtime's `runMain`,
 * which Bun and Node share): SIGINT or SIGTERM interrupts the program, its scope's finalizers run
 * (the database dropped, the embedded PostgreSQL stopped, the receivers ended), and it exits 130 /
 * 143 as a shell reports a process ended by that signal. bench/e2e.ts, a plain async program, does
 * the same with its own handlers.
 *
 * A benchmark never writes to the database `DATABASE_URL` names (an operator's `npm start` reads the
 * same variable): it creates a throw-away database `fh_bench_<tag>_<pid in base 36>_<8 hex>` on that
 * server, migrates it (firehook's layers do) and drops it when it ends. A benchmark that was killed
 * (SIGKILL, a crash, a host reboot) cannot drop its database: each start drops the `fh_bench_*`
 * databases whose process is gone (the idea of test/support/globalSetup.ts for `fh_test_*`), never
 * those of a benchmark still running on this machine. The pid says nothing about another machine:
 * two machines benchmarking against one server at the same time could drop each other's database.
 */
import { runMain } from "@effect/platform-bun/BunRuntime"
import { Cause, Effect, Exit, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import pg from "pg"

/** `fh_bench_<tag>_<pid base 36>_<8 hex>`; the tag is lower-case letters and digits. */
export const BENCH_DATABASE = /^fh_bench_([a-z0-9]+)_([0-9a-z]+)_([0-9a-f]{8})$/

/** A new database name for the benchmark `tag` run by the process `pid`. */
export const benchDatabaseName = (tag: string, pid: number = process.pid, random: string = randomHex()): string => {
  const t = tag.toLowerCase().replace(/[^a-z0-9]/g, "")
  return `fh_bench_${t.length > 0 ? t : "x"}_${pid.toString(36)}_${random}`
}

const randomHex = () => randomBytes(4).toString("hex")

/** The pid of the process that created a benchmark database (undefined: not such a name). */
export const benchDatabaseOwner = (name: string): number | undefined => {
  const m = BENCH_DATABASE.exec(name)
  if (m === null) return undefined
  const pid = parseInt(m[2] ?? "", 36)
  return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined
}

/** Whether a process with this pid exists on this machine (EPERM: it does, as another user). */
export const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}

/**
 * The benchmark databases among `names` whose creating process is gone (`alive` answers for a
 * pid). Other names (the operator's, the tests' `fh_test_*`, a benchmark of an older naming) are
 * never picked, nor this process's.
 */
export const staleBenchDatabases = (
  names: ReadonlyArray<string>,
  alive: (pid: number) => boolean = isAlive,
  self: number = process.pid
): ReadonlyArray<string> =>
  names.filter((name) => {
    const pid = benchDatabaseOwner(name)
    return pid !== undefined && pid !== self && !alive(pid)
  })

/** `serverUrl` with its database replaced by `database`. */
export const databaseUrlOn = (serverUrl: string, database: string): string => {
  const u = new URL(serverUrl)
  u.pathname = `/${database}`
  return u.toString()
}

const withClient = async <A>(url: string, f: (c: pg.Client) => Promise<A>): Promise<A> => {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 })
  await client.connect()
  try {
    return await f(client)
  } finally {
    await client.end()
  }
}

/** Drop the benchmark databases of processes that are gone, on the server of `adminUrl`; their names. */
export const dropStaleBenchDatabases = (adminUrl: string): Promise<ReadonlyArray<string>> =>
  withClient(adminUrl, async (c) => {
    const rows = await c.query<{ datname: string }>(
      `SELECT datname FROM pg_database WHERE datname LIKE 'fh\\_bench\\_%'`
    )
    const stale = staleBenchDatabases(rows.rows.map((r) => r.datname))
    for (const name of stale) await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    return stale
  })

export interface BenchDatabase {
  readonly name: string
  readonly url: string
  /** drop it (with FORCE); safe to call more than once, and before the creation ended */
  readonly drop: () => Promise<void>
}

/**
 * A fresh empty database for the benchmark `tag` on the server of `adminUrl` (after dropping the
 * stale ones). `onDrop` receives the drop before anything is created, so a caller stopped during the
 * creation can still drop it.
 */
export const createBenchDatabase = async (
  adminUrl: string,
  tag: string,
  onDrop?: (drop: () => Promise<void>) => void
): Promise<BenchDatabase> => {
  const name = benchDatabaseName(tag)
  let dropped: Promise<void> | undefined
  const drop = () =>
    dropped ??= withClient(adminUrl, async (c) => {
      await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    })
  onDrop?.(drop)
  await dropStaleBenchDatabases(adminUrl).catch(() => [])
  await withClient(adminUrl, (c) => c.query(`CREATE DATABASE ${name}`))
  return { name, url: databaseUrlOn(adminUrl, name), drop }
}

/** {@link createBenchDatabase} as a scoped resource: dropped when the scope closes. */
export const scopedBenchDatabase = (adminUrl: string, tag: string) =>
  Effect.acquireRelease(
    Effect.promise(() => createBenchDatabase(adminUrl, tag)),
    (db) => Effect.promise(() => db.drop())
  ).pipe(Effect.map((db) => ({ name: db.name, url: Redacted.make(db.url) })))

/**
 * The exit code of a process ended by `signal` as a shell reports it (128 + its number): 130 for
 * SIGINT, 143 for SIGTERM.
 */
export const signalExitCode = (signal: NodeJS.Signals | undefined): number | undefined =>
  signal === "SIGINT" ? 130 : signal === "SIGTERM" ? 143 : undefined

/**
 * Run a benchmark program: its output is its own; a failure is printed as `bench failed: …` (exit
 * 1); SIGINT / SIGTERM interrupt it, its finalizers run, and it exits 130 / 143. The process exits
 * when the program ends (sockets a loop left open do not keep it alive).
 */
export const runBench = <E>(program: Effect.Effect<void, E>): void => {
  let signal: NodeJS.Signals | undefined
  // kept for the whole run: a second Ctrl-C while the finalizers run is ignored (it would end the
  // process before the database is dropped); finalizers that hang are cut short after 2 minutes
  const note = (s: NodeJS.Signals) => () => {
    if (signal !== undefined) return
    signal = s
    setTimeout(() => process.exit(signalExitCode(s) ?? 1), 120_000).unref()
  }
  process.on("SIGINT", note("SIGINT"))
  process.on("SIGTERM", note("SIGTERM"))
  runMain(
    program.pipe(
      Effect.tapErrorCause((cause) =>
        Cause.isInterruptedOnly(cause)
          ? Effect.void
          : Effect.sync(() => process.stderr.write(`bench failed: ${Cause.pretty(cause)}\n`))
      )
    ),
    {
      disableErrorReporting: true,
      disablePrettyLogger: true,
      teardown: (exit) => {
        process.exit(signalExitCode(signal) ?? (Exit.isSuccess(exit) ? 0 : 1))
      }
    }
  )
}
