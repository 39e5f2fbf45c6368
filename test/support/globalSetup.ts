/**
 * One PostgreSQL server for the whole test run: `DATABASE_URL` when set, else an embedded
 * PostgreSQL in a temporary directory (removed afterwards). Test files get a fresh database each
 * (see db.ts); this hands them the server's admin URL, the run's tag (the prefix of the databases
 * this run creates) and a migrated template database that db.ts's `layer` clones.
 *
 * Each test file drops its own databases when it ends (db.ts, e2e.ts): a run of the whole suite
 * creates about 260 of them, some 2 GB on the embedded server's disk if they were kept to the end.
 * Their names start with the run's tag, so that what is left when the run ends (a test file that
 * died before its cleanup) is dropped here, and at the start the databases of runs whose process is
 * gone (a killed run) are dropped too; another live run's databases are never touched.
 */
import { Effect, Exit, Layer, Redacted, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import type { TestProject } from "vitest/node"
import * as Database from "../../src/services/platform/Database.js"
import * as EmbeddedPg from "../../src/services/platform/EmbeddedPg.js"
import { buildCliBundle } from "./cliBundle.js"
import { databaseUrl, withClient as withAdmin } from "./pgAdmin.js"

declare module "vitest" {
  export interface ProvidedContext {
    pgAdminUrl: string
    pgMode: "external" | "embedded"
    /** this run's databases are named `fh_test_<pgRunTag>_…` */
    pgRunTag: string
    /** a database with firehook's migrations applied, cloned by db.ts's `layer` */
    pgTemplate: string
  }
}

/** `fh_test_<tag>_<12 hex>` or `fh_tmpl_<tag>`, where the tag is the run's pid in base 36 */
const RUN_DATABASE = /^fh_(?:test_([0-9a-z]+)_[0-9a-f]{12}|tmpl_([0-9a-z]+))$/

const isAlive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"
  }
}

/** Drop `names`, four at a time (their checkpoint requests coalesce). */
const dropAll = async (adminUrl: string, names: ReadonlyArray<string>) => {
  const queue = [...names]
  const worker = () =>
    withAdmin(adminUrl, async (c) => {
      for (let name = queue.shift(); name !== undefined; name = queue.shift()) {
        await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
      }
    })
  await Promise.all(Array.from({ length: Math.min(4, queue.length) }, worker))
}

/** The databases of the run tagged `tag`, or of every run whose process has ended (tag undefined). */
const runDatabases = async (adminUrl: string, tag: string | undefined): Promise<ReadonlyArray<string>> => {
  const rows = await withAdmin(
    adminUrl,
    (c) => c.query<{ datname: string }>(`SELECT datname FROM pg_database WHERE datname LIKE 'fh\\_t%'`)
  )
  return rows.rows.map((r) => r.datname).filter((name) => {
    const m = RUN_DATABASE.exec(name)
    const owner = m?.[1] ?? m?.[2]
    if (owner === undefined) return false
    return tag === undefined ? !isAlive(parseInt(owner, 36)) : owner === tag
  })
}

/** Create the template database and apply the migrations to it (its connections closed after). */
const makeTemplate = async (adminUrl: string, name: string) => {
  await withAdmin(adminUrl, async (c) => {
    await c.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`)
    await c.query(`CREATE DATABASE ${name}`)
  })
  await Effect.runPromise(
    Effect.scoped(Layer.build(Database.layerUrl(Redacted.make(databaseUrl(adminUrl, name)))))
  )
}

export default async function setup(project: TestProject) {
  const cli = buildCliBundle()
  project.provide("cliBundle", cli.path)
  const teardown = await setupPg(project)
  return async () => {
    try {
      await teardown()
    } finally {
      cli.remove()
    }
  }
}

const setupPg = async (project: TestProject): Promise<() => Promise<void>> => {
  const tag = process.pid.toString(36)
  const template = `fh_tmpl_${tag}`
  const external = process.env["DATABASE_URL"]
  if (external !== undefined && external.length > 0) {
    await dropAll(external, await runDatabases(external, undefined))
    await makeTemplate(external, template)
    project.provide("pgAdminUrl", external)
    project.provide("pgMode", "external")
    project.provide("pgRunTag", tag)
    project.provide("pgTemplate", template)
    return async () => {
      await dropAll(external, await runDatabases(external, tag))
    }
  }
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-test-pg-"))
  Fs.chmodSync(dir, 0o755)
  const scope = Effect.runSync(Scope.make())
  const embedded = await Effect.runPromise(
    EmbeddedPg.start({ dataDir: dir, database: "postgres" }).pipe(Scope.extend(scope))
  )
  const adminUrl = Redacted.value(embedded.url)
  await makeTemplate(adminUrl, template)
  project.provide("pgAdminUrl", adminUrl)
  project.provide("pgMode", "embedded")
  project.provide("pgRunTag", tag)
  project.provide("pgTemplate", template)
  return async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    Fs.rmSync(dir, { recursive: true, force: true })
  }
}
