/**
 * One PostgreSQL server for the whole test run: `DATABASE_URL` when set, else an embedded
 * PostgreSQL in a temporary directory (removed afterwards). Test files get a fresh database each
 * (see db.ts); this only hands them the server's admin URL.
 */
import { Effect, Exit, Redacted, Scope } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import type { TestProject } from "vitest/node"
import * as EmbeddedPg from "../../src/services/platform/EmbeddedPg.js"

declare module "vitest" {
  export interface ProvidedContext {
    pgAdminUrl: string
    pgMode: "external" | "embedded"
  }
}

export default async function setup(project: TestProject) {
  const external = process.env["DATABASE_URL"]
  if (external !== undefined && external.length > 0) {
    project.provide("pgAdminUrl", external)
    project.provide("pgMode", "external")
    return async () => {}
  }
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "firehook-test-pg-"))
  Fs.chmodSync(dir, 0o755)
  const scope = Effect.runSync(Scope.make())
  const pg = await Effect.runPromise(
    EmbeddedPg.start({ dataDir: dir, database: "postgres" }).pipe(Scope.extend(scope))
  )
  project.provide("pgAdminUrl", Redacted.value(pg.url))
  project.provide("pgMode", "embedded")
  return async () => {
    await Effect.runPromise(Scope.close(scope, Exit.void))
    Fs.rmSync(dir, { recursive: true, force: true })
  }
}
