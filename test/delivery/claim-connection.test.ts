/**
 * The claim connection's session (ClaimConnection.ts) on a real PostgreSQL: claims are planned
 * with their values every time. A claim sent as a named prepared statement could otherwise switch
 * to PostgreSQL's generic plan after five runs, which at volume cost 8 ms of the server's CPU per
 * delivery instead of 0.3 (docs/benchmarks.md, stop 53); the bitmap-scan guard stays.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { makeClaimConnection } from "../../src/services/delivery/ClaimConnection.js"
import * as Db from "../support/db.js"

describe("the claim connection", () => {
  it.scopedLive(
    "plans with the values (force_custom_plan) and without bitmap scans; the pool's other sessions as configured",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const pg = yield* PgClient.PgClient
        // the database's default is the generic plan (as PostgreSQL may choose it by itself)
        const db = (yield* sql<{ db: string }>`SELECT current_database() AS db`)[0]?.db ?? ""
        yield* sql.unsafe(`ALTER DATABASE "${db}" SET plan_cache_mode = force_generic_plan`)
        yield* sql`SELECT pg_terminate_backend(pid) FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()`
        const scope = yield* Scope.make()
        const claims = yield* makeClaimConnection(sql, pg).pipe(Scope.extend(scope))
        const setting = (name: string) =>
          Effect.map(sql<{ readonly value: string }>`SELECT current_setting(${name}) AS value`, (r) => r[0]?.value)
        expect(yield* claims.run("w", setting("plan_cache_mode"))).toBe("force_custom_plan")
        expect(yield* claims.run("w", setting("enable_bitmapscan"))).toBe("off")
        // another session of the pool keeps the database's settings
        const others = yield* Effect.all(Array.from({ length: 3 }, () => setting("plan_cache_mode")), {
          concurrency: 3
        })
        expect(others).toEqual(["force_generic_plan", "force_generic_plan", "force_generic_plan"])
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(Db.layer())),
    60_000
  )
})
