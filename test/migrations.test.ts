import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { describe, expect, it } from "@effect/vitest"
import * as Reactivity from "@effect/experimental/Reactivity"
import { Effect } from "effect"
import * as Migrations from "../src/services/Migrations.js"
import * as Db from "./support/db.js"

const EXPECTED_TABLES = [
  "audit",
  "backfill_state",
  "cursors",
  "delivery_attempts",
  "delivery_events",
  "firehook_migrations",
  "outbox",
  "owners",
  "prior_refs",
  "quarantine",
  "secrets",
  "tombstones",
  "webhooks"
]

/** An independent client (its own pool) on the same database. */
const client = (url: Parameters<typeof PgClient.make>[0]["url"]) =>
  PgClient.make({ url, maxConnections: 4 }).pipe(Effect.provide(Reactivity.layer))

describe("Migrations", () => {
  it.scoped("run twice, and concurrently from two clients, without error", () =>
    Effect.gen(function* () {
      const { url } = yield* Db.freshDatabase
      const a = yield* client(url)
      const b = yield* client(url)
      const run = (c: PgClient.PgClient) => Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))
      // concurrently, on an empty database
      const [ra, rb] = yield* Effect.all([run(a), run(b)], { concurrency: 2 })
      const applied = [...ra, ...rb]
      expect(applied.map(([id]) => id)).toEqual([1])
      // again: a no-op
      expect(yield* run(a)).toEqual([])
      expect(yield* run(b)).toEqual([])
      const tables = yield* a<{ table_name: string }>`
        SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY table_name`
      expect(tables.map((t) => t.table_name)).toEqual(EXPECTED_TABLES)
      const ids = yield* a<{ migration_id: number }>`SELECT migration_id FROM firehook_migrations`
      expect(ids).toEqual([{ migration_id: 1 }])
    }))

  it.scoped("five concurrent runners on a fresh database: exactly one applies", () =>
    Effect.gen(function* () {
      const { url } = yield* Db.freshDatabase
      const clients = yield* Effect.all(Array.from({ length: 5 }, () => client(url)))
      const results = yield* Effect.all(
        clients.map((c) => Migrations.run.pipe(Effect.provideService(SqlClient.SqlClient, c))),
        { concurrency: "unbounded" }
      )
      expect(results.flat().length).toBe(1)
    }))

  it.layer(Db.layer())("the schema", (it) => {
    it.effect("has the due-row index the delivery worker needs", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const idx = yield* sql<{ indexname: string }>`
          SELECT indexname FROM pg_indexes WHERE tablename = 'outbox' ORDER BY indexname`
        expect(idx.map((i) => i.indexname)).toEqual(
          expect.arrayContaining(["outbox_due", "outbox_lease_expiry", "outbox_webhook", "outbox_finished"])
        )
      }))
  })
})

