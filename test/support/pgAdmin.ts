/**
 * Plain `pg` helpers for the test PostgreSQL server's admin connection, shared by globalSetup.ts
 * (which runs outside the test workers and has no `inject`), db.ts and e2e.ts.
 */
import { randomBytes } from "node:crypto"
import pg from "pg"

/** Run `f` on a new connection to `url`, closed afterwards (10 s connect timeout). */
export const withClient = async <A>(url: string, f: (c: pg.Client) => Promise<A>): Promise<A> => {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 10_000 })
  await client.connect()
  try {
    return await f(client)
  } finally {
    await client.end()
  }
}

/** `serverUrl` with its database replaced by `database`. */
export const databaseUrl = (serverUrl: string, database: string): string => {
  const u = new URL(serverUrl)
  u.pathname = `/${database}`
  return u.toString()
}

/** A new database name of the run tagged `tag`: `fh_test_<tag>_<12 hex>` (the names globalSetup sweeps). */
export const runDatabaseName = (tag: string): string => `fh_test_${tag}_${randomBytes(6).toString("hex")}`
