/**
 * Maintenance's row bounds of tombstones and refused records keep the newest rows whatever the
 * session's `DateStyle` and `TimeZone`: the cut row's time is read as UTC text of a fixed format
 * (ListKey.KEY_TEXT_FORMAT), never `::text`. Under `DateStyle = 'SQL, DMY'` and TimeZone
 * Asia/Kolkata `deleted_at::text` was `07/12/2026 13:54:17.067702 IST`, read back as Israel's time
 * (3.5 h later), and the bound deleted rows among the newest it must keep (a deleted webhook's
 * tombstone gone, an older replayed create could bring it back).
 *
 * On firehook's own pool (whose sessions are ISO: DatabaseSsl.connectingClient) and on an embedding
 * program's plain client, whose sessions keep the database's settings.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { withClient } from "../support/pgAdmin.js"

/** A migrated database (the run's template) whose sessions start with DateStyle 'SQL, DMY', TimeZone Asia/Kolkata. */
const oddDatabase = Effect.gen(function*() {
  const db = yield* Db.freshDatabaseWith(`TEMPLATE ${inject("pgTemplate")}`)
  yield* Effect.promise(() =>
    withClient(Redacted.value(db.url), async (c) => {
      await c.query(`ALTER DATABASE ${db.name} SET DateStyle = 'SQL, DMY'`)
      await c.query(`ALTER DATABASE ${db.name} SET TimeZone = 'Asia/Kolkata'`)
    })
  )
  return db
})

const firehookClient = Layer.unwrapScoped(Effect.map(oddDatabase, ({ url }) => Database.layerUrl(url)))
const plainClient = Layer.unwrapScoped(Effect.map(oddDatabase, ({ url }) => PgClient.layer({ url })))

/** The two bounds' tests, registered through the layer's own `it.effect`. */
type Register = (name: string, self: () => Effect.Effect<void, unknown, SqlClient.SqlClient>) => void

const boundTests = (effect: Register) => {
  effect("the tombstone row bound keeps the newest tombstonesMaxRows rows", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      // ten tombstones, one an hour apart, all younger than the 7-day retention
      for (let i = 0; i < 10; i++) {
        yield* sql`
          INSERT INTO tombstones (owner_did, rkey, rev, generation, deleted_at)
          VALUES ('did:plc:a', ${`t${i}`}, '3kabc', 1, now() - make_interval(mins => ${i * 60}))`
      }
      const counts = yield* Maintenance.runOnce({ tombstonesMaxRows: 5 })
      const left = yield* sql<{ rkey: string }>`SELECT rkey FROM tombstones ORDER BY deleted_at DESC`
      expect(left.map((r) => r.rkey)).toEqual(["t0", "t1", "t2", "t3", "t4"])
      expect(counts.tombstones).toBe(5)
    }))

  effect("the refused-record row bound keeps the newest rejectedMaxRows rows", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      for (let i = 0; i < 10; i++) {
        yield* sql`
          INSERT INTO rejected_records (owner_did, rkey, rev, reason, source, first_seen_at, last_seen_at)
          VALUES (${`did:plc:r${i}`}, 'k', '3kabc', 'invalid', 'stream',
            now() - make_interval(mins => ${i * 60}), now() - make_interval(mins => ${i * 60}))`
      }
      const counts = yield* Maintenance.runOnce({ rejectedMaxRows: 5 })
      const left = yield* sql<{ owner_did: string }>`
        SELECT owner_did FROM rejected_records ORDER BY last_seen_at DESC`
      expect(left.map((r) => r.owner_did)).toEqual([
        "did:plc:r0",
        "did:plc:r1",
        "did:plc:r2",
        "did:plc:r3",
        "did:plc:r4"
      ])
      expect(counts.rejected_records).toBe(5)
    }))
}

describe("maintenance row bounds on a database of DateStyle 'SQL, DMY', TimeZone Asia/Kolkata", () => {
  it.layer(plainClient)("an embedding program's client (sessions not ISO)", (it) => {
    it.effect("the premise: this client's sessions write dates in the SQL style", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ style: string }>`SELECT current_setting('DateStyle') AS style`
        expect(rows[0]?.style).toBe("SQL, DMY")
      }))
    boundTests((name, self) => it.effect(name, self))
  })

  it.layer(firehookClient)("firehook's own pool", (it) => {
    boundTests((name, self) => it.effect(name, self))
  })
})
