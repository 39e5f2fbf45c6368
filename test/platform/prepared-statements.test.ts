/**
 * Named prepared statements (PreparedStatements.ts, issue 16 item 3): which texts get a name, and on
 * a real PostgreSQL that a connection keeps them, that `DATABASE_PREPARED_STATEMENTS=0` sends none,
 * and that DDL between two uses breaks neither a named nor a table-shaped statement.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import {
  MAX_NAMED,
  MAX_TRACKED,
  PREPARE_AFTER,
  StatementNames
} from "../../src/services/platform/PreparedStatements.js"
import * as Db from "../support/db.js"

const uses = (names: StatementNames, text: string, n: number) => Array.from({ length: n }, () => names.nameOf(text))

describe("StatementNames", () => {
  it("names a text at its PREPARE_AFTER-th use and keeps that name", () => {
    const names = new StatementNames()
    const seen = uses(names, "SELECT $1::int", PREPARE_AFTER + 2)
    expect(seen.slice(0, PREPARE_AFTER - 1)).toEqual(Array(PREPARE_AFTER - 1).fill(undefined))
    expect(seen.slice(PREPARE_AFTER - 1)).toEqual(["firehook_1", "firehook_1", "firehook_1"])
    expect(uses(names, "SELECT $1::text", PREPARE_AFTER).at(-1)).toBe("firehook_2")
  })

  it("never names a text whose result columns follow a table's", () => {
    const names = new StatementNames()
    for (
      const text of [
        "SELECT * FROM webhooks WHERE owner_did = $1",
        "UPDATE outbox SET status = $1 RETURNING *",
        "SELECT o.* FROM outbox o WHERE o.delivery_id = $1",
        "SELECT *, created_at::text AS k FROM outbox WHERE owner_did = $1"
      ]
    ) expect(uses(names, text, PREPARE_AFTER * 3)).toEqual(Array(PREPARE_AFTER * 3).fill(undefined))
    expect(names.size).toBe(0)
  })

  it("names a SELECT * over unnest(…) or jsonb_to_recordset(…), and count(*)", () => {
    const names = new StatementNames()
    for (
      const text of [
        "UPDATE outbox o SET status = 'delivered' FROM (SELECT * FROM unnest($1::text[])) AS v(id) WHERE o.delivery_id = v.id",
        "INSERT INTO x SELECT * FROM jsonb_to_recordset($1::jsonb) AS r(a text)",
        "SELECT count(*) FROM outbox WHERE owner_did = $1"
      ]
    ) expect(uses(names, text, PREPARE_AFTER).at(-1)).toBeDefined()
    expect(names.size).toBe(3)
  })

  it("stops at MAX_NAMED names and forgets the counts past MAX_TRACKED texts", () => {
    const names = new StatementNames()
    for (let i = 0; i < MAX_NAMED + 10; i++) uses(names, `SELECT $1::int + ${i}`, PREPARE_AFTER)
    expect(names.size).toBe(MAX_NAMED)
    expect(names.nameOf("SELECT $1::int + 0")).toBe("firehook_1")
    expect(uses(names, "SELECT $1::int + 99999", PREPARE_AFTER * 2)).toEqual(Array(PREPARE_AFTER * 2).fill(undefined))

    const counted = new StatementNames()
    uses(counted, "SELECT $1::bigint", PREPARE_AFTER - 1)
    for (let i = 0; i < MAX_TRACKED; i++) counted.nameOf(`SELECT $1::int * ${i}`)
    // the counts started over, so the first text needs PREPARE_AFTER more uses
    expect(uses(counted, "SELECT $1::bigint", PREPARE_AFTER - 1)).toEqual(Array(PREPARE_AFTER - 1).fill(undefined))
    expect(counted.nameOf("SELECT $1::bigint")).toBe("firehook_1")
  })
})

/** The statements this session has prepared (run on the connection of the surrounding transaction). */
const prepared = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<
      { readonly name: string; readonly statement: string }
    >`SELECT name, statement FROM pg_prepared_statements ORDER BY name`
      .unprepared
)

const probe = (sql: SqlClient.SqlClient, id: number) =>
  sql<{ readonly n: number }>`SELECT ${id}::int + 1 AS n`.pipe(Effect.map((rows) => rows[0]?.n))

describe("named prepared statements on PostgreSQL", () => {
  it.scoped("a frequent statement is parsed once per connection and its answers stay right", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const [answers, statements] = yield* sql.withTransaction(Effect.gen(function*() {
        const answers: Array<number | undefined> = []
        for (let i = 0; i < PREPARE_AFTER + 3; i++) answers.push(yield* probe(sql, i))
        return [answers, yield* prepared] as const
      }))
      expect(answers).toEqual(Array.from({ length: PREPARE_AFTER + 3 }, (_, i) => i + 1))
      expect(statements.map((s) => s.name)).toEqual(["firehook_1"])
      expect(statements[0]?.statement).toContain("::int + 1 AS n")
    }).pipe(Effect.provide(Db.layer())))

  it.scoped("a text without parameters is never named, however often it runs", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const statements = yield* sql.withTransaction(Effect.gen(function*() {
        for (let i = 0; i < PREPARE_AFTER * 2; i++) yield* sql`SELECT 41 + 1 AS n`
        return yield* prepared
      }))
      expect(statements).toEqual([])
    }).pipe(Effect.provide(Db.layer())))

  it.scoped("DATABASE_PREPARED_STATEMENTS=0: nothing is prepared", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const statements = yield* sql.withTransaction(Effect.gen(function*() {
        for (let i = 0; i < PREPARE_AFTER * 2; i++) yield* probe(sql, i)
        return yield* prepared
      }))
      expect(statements).toEqual([])
    }).pipe(Effect.provide(Db.layer({ preparedStatements: false }))))

  it.scoped("a column added between two uses breaks neither a named statement nor a SELECT *", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* sql`CREATE TABLE prep_t (id int PRIMARY KEY, a text)`
      yield* sql`INSERT INTO prep_t VALUES (1, 'x')`
      const named = sql<{ readonly a: string }>`SELECT a FROM prep_t WHERE id = ${1}`
      const star = sql<Record<string, unknown>>`SELECT * FROM prep_t WHERE id = ${1}`
      // one transaction: one connection, the one that prepared the statements
      yield* sql.withTransaction(Effect.gen(function*() {
        for (let i = 0; i < PREPARE_AFTER * 2; i++) yield* Effect.zip(named, star)
        const before = yield* prepared
        expect(before.map((s) => s.statement)).toEqual(["SELECT a FROM prep_t WHERE id = $1"])
        yield* sql`ALTER TABLE prep_t ADD COLUMN b text DEFAULT 'y'`
        for (let i = 0; i < 3; i++) {
          expect(yield* named).toEqual([{ a: "x" }])
          expect(yield* star).toEqual([{ id: 1, a: "x", b: "y" }])
        }
      }))
    }).pipe(Effect.provide(Db.layer())))
})
