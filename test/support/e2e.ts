/**
 * Shared pieces of the end-to-end tests that run `bun src/main.ts`: a fresh database per firehook
 * deployment on the test PostgreSQL server, plain queries, and bounded polling.
 */
import { Effect, Exit, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { expect, inject } from "vitest"
import { databaseUrl, runDatabaseName } from "./pgAdmin.js"
import { exitWithin, freePort, killAllChildren, type Running, startFirehook } from "./proc.js"

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

/**
 * Databases and directories made by one test file; `cleanup()` drops and removes them. The
 * databases are named for the run, so that globalSetup drops them if the file never gets to its
 * cleanup (see db.ts).
 */
export const e2eResources = () => {
  const dbs: Array<string> = []
  const dirs: Array<string> = []
  let admin: pg.Client | undefined
  const adminClient = async () => {
    if (admin === undefined) {
      admin = new pg.Client({ connectionString: inject("pgAdminUrl") })
      await admin.connect()
    }
    return admin
  }
  return {
    /** a new empty database on the test server; its URL */
    freshDb: async (): Promise<string> => {
      const name = runDatabaseName(inject("pgRunTag"))
      await (await adminClient()).query(`CREATE DATABASE ${name}`)
      dbs.push(name)
      return databaseUrl(inject("pgAdminUrl"), name)
    },
    tempDir: (): string => {
      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-e2e-"))
      dirs.push(dir)
      return dir
    },
    cleanup: async () => {
      // processes a failed test left running (it stopped before their SIGTERM)
      killAllChildren()
      if (admin !== undefined) {
        for (const d of dbs) await admin.query(`DROP DATABASE IF EXISTS ${d} WITH (FORCE)`)
        await admin.end()
      }
      for (const d of dirs) Fs.rmSync(d, { recursive: true, force: true })
    }
  }
}

export const query = async <T extends pg.QueryResultRow>(
  url: string,
  q: string,
  params: Array<unknown> = []
): Promise<Array<T>> => {
  const c = new pg.Client({ connectionString: url })
  await c.connect()
  try {
    return (await c.query<T>(q, params)).rows
  } finally {
    await c.end()
  }
}

/** Poll `cond` every 50 ms until it holds; fail after `ms` with `what` and the optional debug text. */
export const waitUntil = async (
  cond: () => Promise<boolean> | boolean,
  ms: number,
  what: string,
  debug?: () => Promise<string> | string
) => {
  const until = Date.now() + ms
  for (let i = 0; i < 100_000 && Date.now() < until; i++) {
    if (await cond()) return
    await sleep(50)
  }
  // a debug text that fails (a query against a database that went away) must not hide the timeout
  const text = debug === undefined
    ? ""
    : await Promise.resolve().then(debug).catch((e: unknown) => `(debug failed: ${String(e)})`)
  throw new Error(`timed out: ${what} ${text}`)
}

/** The last `n` lines of `text`. */
export const lastLines = (text: string, n: number): string => text.split("\n").slice(-n - 1).join("\n")

/**
 * A running firehook's state for a failure message: its exit (if any), the last `n` lines of its
 * stderr and of its stdout, and its `/health` body (2 s bound).
 */
export const processTail = async (d: Deployment, n = 40): Promise<string> => {
  const c = d.running.child
  const health = c.exitCode === null && c.signalCode === null
    ? await fetch(d.health, { signal: AbortSignal.timeout(2000) })
      .then(async (r) => `${r.status} ${(await r.text()).slice(0, 4000)}`)
      .catch((e: unknown) => `unreachable (${String(e)})`)
    : "not running"
  return [
    `pid ${c.pid} exit ${c.exitCode} signal ${c.signalCode}`,
    `health: ${health}`,
    `stderr (last ${n} lines):\n${lastLines(d.running.stderr(), n)}`,
    `stdout (last ${n} lines):\n${lastLines(d.running.stdout(), n)}`
  ].join("\n")
}

/**
 * One webhook's delivery state for a failure message: its outbox rows by status, attempt count and
 * last error (with their next attempt relative to the database's now(), in seconds), its attempts,
 * its webhook row, its owner's reconciliation state (a `scanning` owner's deliveries are deferred
 * without an attempt) and the backfill sweep's state. Each query's failure is reported in place.
 */
export const webhookDiagnostics = async (db: string, ownerDid: string, rkey: string): Promise<string> => {
  const parts: Array<[string, string, Array<unknown>]> = [
    [
      "outbox",
      `SELECT status, attempt_count, last_error_kind, last_http_status, crash_count, count(*)::int AS n,
         round(extract(epoch FROM min(next_attempt_at) - now())::numeric, 1)::float8 AS min_next_s,
         round(extract(epoch FROM max(next_attempt_at) - now())::numeric, 1)::float8 AS max_next_s,
         round(extract(epoch FROM max(leased_until) - now())::numeric, 1)::float8 AS max_lease_s,
         round(extract(epoch FROM now() - max(updated_at))::numeric, 1)::float8 AS last_update_ago_s,
         count(DISTINCT split_part(lease_token, ':', 1))::int AS lease_workers
       FROM outbox WHERE owner_did = $1 AND webhook_rkey = $2
       GROUP BY 1, 2, 3, 4, 5 ORDER BY 1, 2, 3`,
      [ownerDid, rkey]
    ],
    [
      "attempts",
      `SELECT a.outcome, a.error_kind, a.http_status, count(*)::int AS n,
         round(extract(epoch FROM now() - max(a.started_at))::numeric, 1)::float8 AS last_ago_s
       FROM delivery_attempts a JOIN outbox o ON o.delivery_id = a.delivery_id
       WHERE o.owner_did = $1 AND o.webhook_rkey = $2 GROUP BY 1, 2, 3`,
      [ownerDid, rkey]
    ],
    [
      "webhook",
      `SELECT active, enabled, gone_at, auto_disabled_at, generation, url FROM webhooks
       WHERE owner_did = $1 AND rkey = $2`,
      [ownerDid, rkey]
    ],
    [
      "owner",
      `SELECT reconcile_status, generation, scan_generation, failure_count, last_failure_kind,
         round(extract(epoch FROM now() - scan_started_at)::numeric, 1)::float8 AS scan_started_ago_s,
         round(extract(epoch FROM now() - completed_at)::numeric, 1)::float8 AS completed_ago_s,
         round(extract(epoch FROM now() - failed_at)::numeric, 1)::float8 AS failed_ago_s,
         reconcile_requested_at IS NOT NULL AS requested
       FROM owners WHERE did = $1`,
      [ownerDid]
    ],
    ["backfill", `SELECT * FROM backfill_state`, []],
    ["all outbox", `SELECT status, count(*)::int AS n FROM outbox GROUP BY 1 ORDER BY 1`, []]
  ]
  const out: Array<string> = []
  for (const [name, q, params] of parts) {
    const text = await query(db, q, params)
      .then((rows) => JSON.stringify(rows))
      .catch((e: unknown) => `(failed: ${String(e)})`)
    out.push(`${name}: ${text}`)
  }
  return out.join("\n")
}

export interface Deployment {
  readonly running: Running
  readonly port: number
  readonly health: string
}

/** Start `bun src/main.ts` with a fresh health port and data dir; `env` is the rest of its configuration. */
export const startDeployment = async (dataDir: string, env: Record<string, string>): Promise<Deployment> => {
  const port = await freePort()
  const running = startFirehook({
    FIREHOOK_DATA_DIR: dataDir,
    HEALTH_PORT: String(port),
    SHUTDOWN_TIMEOUT_MS: "5000",
    LOG_LEVEL: process.env["E2E_LOG_LEVEL"] ?? "warn",
    ...env
  })
  return { running, port, health: `http://127.0.0.1:${port}/health` }
}

/**
 * The end of a devnet file (its `afterAll`): firehook, when still running, stopped by SIGTERM, which
 * must end it cleanly (exit 0 within 15 s); then, whether it did or not, the network, the receivers'
 * scope, and the file's databases and directories.
 */
export const closeDevnetFile = async (parts: {
  readonly firehook: Deployment | undefined
  readonly devnet: { readonly close: () => Promise<void> } | undefined
  readonly scope: Scope.CloseableScope
  readonly res: ReturnType<typeof e2eResources>
}) => {
  const { firehook } = parts
  const steps: ReadonlyArray<() => Promise<void>> = [
    async () => {
      if (
        firehook !== undefined && firehook.running.child.exitCode === null && firehook.running.child.signalCode === null
      ) {
        firehook.running.child.kill("SIGTERM")
        expect((await exitWithin(firehook.running, 15_000)).code).toBe(0)
      }
    },
    async () => await parts.devnet?.close(),
    () => Effect.runPromise(Scope.close(parts.scope, Exit.void)),
    () => parts.res.cleanup()
  ]
  // every step runs whatever the one before it did (a firehook that did not stop cleanly must not
  // leave the network, the receivers, the databases and the directories behind); the first
  // failure (an assertion) still fails the file
  const failures: Array<unknown> = []
  for (const step of steps) await step().catch((e: unknown) => void failures.push(e))
  if (failures.length > 0) throw failures[0]
}
