/**
 * firehook's connections write dates in ISO form whatever the server's `DateStyle`
 * (DatabaseSsl.connectingClient, used by the pool and the LISTEN connection): `pg` parses
 * `timestamptz` only in that form, and under `DateStyle = 'SQL, DMY'` every timestamp read came
 * back null (the operator's `deliveries list` printed 1970-01-01). The SET costs a statement only
 * on a server that does not already report ISO.
 *
 * Also: the keyset positions the registry's load and the reconciliation's completion read keep as
 * text (RegistryStore.loadActive, ReconcileStoreSql.completedSince / completedCursor) name the
 * same instant when read back on a session of another `DateStyle` and `TimeZone` (an embedding
 * program's own client): `completed_at::text` was `07/12/2026 13:54:17.067702 IST`, read back as
 * Israel's time, 3.5 h later, and the rows in between were skipped.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { inject } from "vitest"
import * as Operator from "../../src/services/operator/Operator.js"
import * as Database from "../../src/services/platform/Database.js"
import * as DatabaseSsl from "../../src/services/platform/DatabaseSsl.js"
import { layerSql as reconcileLayerSql, ReconcileStore } from "../../src/services/reconciliation/ReconcileStore.js"
import {
  layerSql as registryLayerSql,
  type LoadPosition,
  RegistryStore
} from "../../src/services/registry/RegistryStore.js"
import * as Db from "../support/db.js"
import { withClient } from "../support/pgAdmin.js"
import { plc } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"

const ODD = { DateStyle: "SQL, DMY", TimeZone: "Asia/Kolkata" }

/** A migrated database (the run's template) whose sessions start with `ODD`'s settings. */
const oddDatabase = Effect.gen(function*() {
  const db = yield* Db.freshDatabaseWith(`TEMPLATE ${inject("pgTemplate")}`)
  yield* Effect.promise(() =>
    withClient(Redacted.value(db.url), async (c) => {
      for (const [k, v] of Object.entries(ODD)) {
        await c.query(`ALTER DATABASE ${db.name} SET ${k} = ${c.escapeLiteral(v)}`)
      }
    })
  )
  return db
})

/** firehook's database layer on {@link oddDatabase}. */
const firehookOnOdd = Layer.unwrapScoped(Effect.map(oddDatabase, ({ url }) => Database.layerUrl(url)))

/** One connection made by `DatabaseSsl.connectingClient` (what PgListen is given), asked `text`. */
const viaConnectingClient = (url: Redacted.Redacted<string>, text: string, form: "promise" | "callback") =>
  Effect.promise(async () => {
    const Client = DatabaseSsl.connectingClient(url)
    const client = new Client({ connectionTimeoutMillis: 10_000 })
    if (form === "promise") await client.connect()
    else {
      await new Promise<void>((resolve, reject) =>
        client.connect((err) => (err === null || err === undefined ? resolve() : reject(err)))
      )
    }
    try {
      return (await client.query<Record<string, string>>(text)).rows
    } finally {
      await client.end()
    }
  })

const SETTING = "SELECT current_setting('DateStyle') AS style, source FROM pg_settings WHERE name = 'DateStyle'"

describe("firehook's connections on a server whose DateStyle is 'SQL, DMY'", () => {
  it.layer(firehookOnOdd)("the pool", (it) => {
    it.scoped("every pool connection reports an ISO DateStyle, keeping the server's DMY order", () =>
      Effect.gen(function*() {
        const sql = yield* PgClient.PgClient
        // three connections held at once: three different sessions of the pool
        const conns = yield* Effect.all([sql.reserve, sql.reserve, sql.reserve])
        const seen = yield* Effect.forEach(
          conns,
          (c) => c.executeRaw("SELECT current_setting('DateStyle') AS style, pg_backend_pid() AS pid", [])
        )
        const rows = seen.flatMap((r) => (r as { rows: ReadonlyArray<{ style: string; pid: number }> }).rows)
        expect(new Set(rows.map((r) => r.pid)).size).toBe(3)
        expect(rows.map((r) => r.style)).toEqual(["ISO, DMY", "ISO, DMY", "ISO, DMY"])
      }))

    it.effect("a timestamptz reads back as the instant it names", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ t: unknown }>`SELECT '2026-03-01T10:00:00.123Z'::timestamptz AS t`
        expect(rows[0]?.t).toBeInstanceOf(Date)
        expect((rows[0]?.t as Date).toISOString()).toBe("2026-03-01T10:00:00.123Z")
      }))

    it.effect("operator list: createdAt is the row's enqueue time", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`
          INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                              event_rkey, event_operation, target_url, signing_mode, fingerprint, status, created_at)
          VALUES ('whd_ds_1', 'e1', 'did:plc:owner', 'w1', 'direct', 'did:plc:subject', 'app.bsky.feed.post', 'p1',
                  'create', 'https://receiver.invalid/hook', 'none', 'fp', 'pending', '2026-03-01T10:00:00Z')`
        const op = yield* Operator.make
        const rows = yield* op.listDeliveries({})
        expect(rows[0]?.createdAt.toISOString()).toBe("2026-03-01T10:00:00.000Z")
      }))
  })

  it.scoped("the LISTEN connection's class sets ISO on connect, in both connect forms", () =>
    Effect.gen(function*() {
      const { url } = yield* oddDatabase
      for (const form of ["promise", "callback"] as const) {
        const rows = yield* viaConnectingClient(url, SETTING, form)
        expect(rows).toEqual([{ style: "ISO, DMY", source: "session" }])
      }
    }))
})

describe("firehook's connections on a server that already writes ISO", () => {
  it.scoped("send no SET: the DateStyle is the server's own", () =>
    Effect.gen(function*() {
      const { url } = yield* Db.freshDatabaseWith(`TEMPLATE ${inject("pgTemplate")}`)
      for (const form of ["promise", "callback"] as const) {
        const rows = yield* viaConnectingClient(url, SETTING, form)
        expect(rows[0]?.style).toMatch(/^ISO, /)
        expect(rows[0]?.source).not.toBe("session")
      }
    }))
})

/**
 * An embedding program's own client (plain `@effect/sql-pg`, no DateStyle set), on a database
 * migrated by firehook: its sessions keep `ODD`'s settings.
 */
const plainOnOdd = Layer.unwrapScoped(Effect.gen(function*() {
  const { url } = yield* oddDatabase
  return PgClient.layer({ url })
}))

const sessionCheck = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const rows = yield* sql<{ style: string }>`SELECT current_setting('DateStyle') AS style`
  // the premise: this client's sessions do not write ISO
  expect(rows[0]?.style).toBe("SQL, DMY")
})

describe("time keys kept as text, on a session of DateStyle 'SQL, DMY' and TimeZone Asia/Kolkata", () => {
  it.layer(Layer.mergeAll(registryLayerSql, reconcileLayerSql).pipe(Layer.provideMerge(plainOnOdd)))(
    "an embedding program's client",
    (it) => {
      it.effect("RegistryStore.loadActive pages through every active webhook, one an hour apart", () =>
        Effect.gen(function*() {
          yield* sessionCheck
          for (let i = 0; i < 6; i++) {
            yield* insertWebhook(plc(1), `w${i}`, {
              state: { created_at: `now() - make_interval(hours => ${6 - i})` }
            })
          }
          const store = yield* RegistryStore
          const seen: Array<string> = []
          let after: Parameters<typeof store.loadActive>[1] = {}
          for (let page = 0; page < 10; page++) {
            const rows: ReadonlyArray<{ readonly rkey: string; readonly position: LoadPosition }> = yield* store
              .loadActive(2, after)
            seen.push(...rows.map((r) => r.rkey))
            const last = rows[rows.length - 1]
            if (last === undefined) break
            after = { after: last.position }
          }
          expect(seen).toEqual(["w0", "w1", "w2", "w3", "w4", "w5"])
        }))

      it.effect("ReconcileStore.completedSince reads every completion, one an hour apart", () =>
        Effect.gen(function*() {
          yield* sessionCheck
          const sql = yield* SqlClient.SqlClient
          const store = yield* ReconcileStore
          const start = yield* store.completedCursor(24 * 3600_000)
          for (let i = 0; i < 6; i++) {
            yield* sql`INSERT INTO owners (did, reconcile_status, completed_at)
              VALUES (${plc(10 + i)}, 'complete', now() - make_interval(hours => ${6 - i}))`
          }
          const seen: Array<string> = []
          let cursor = start
          for (let page = 0; page < 10; page++) {
            const batch = yield* store.completedSince(cursor, 2, 0)
            seen.push(...batch.dids)
            if (batch.dids.length === 0) break
            cursor = batch.cursor
          }
          expect(seen).toEqual([10, 11, 12, 13, 14, 15].map(plc))
        }))

      it.effect("ReconcileStore.completedCursor names the instant the margin before now", () =>
        Effect.gen(function*() {
          yield* sessionCheck
          const sql = yield* SqlClient.SqlClient
          const store = yield* ReconcileStore
          // completed 2 h ago: after a cursor 3 h before now, so it is read
          yield* sql`INSERT INTO owners (did, reconcile_status, completed_at)
            VALUES (${plc(30)}, 'complete', now() - interval '2 hours')`
          const cursor = yield* store.completedCursor(3 * 3600_000)
          // (the test above's completions, 1 and 2 h old, are read too)
          expect((yield* store.completedSince(cursor, 10, 0)).dids).toContain(plc(30))
        }))
    }
  )
})
