/**
 * The shared jti store's bounds (SPEC §8.2; docs/api.md: 1,000,000 live rows, 500,000 of tokens
 * living longer than about 90 s) on real PostgreSQL, pinned where a mutation audit found them
 * untested: the edge of a long-lived token (a row living more than 2 minutes from its claim), and
 * a prune that deletes expired rows only (a token that still lives is never forgotten early), and
 * the layer's first count as it starts (a replica started with the table at its bound refuses new
 * tokens at once, not after a minute), and a claim's 3 s bound (within the call's 10 s deadline);
 * then where a second audit found them untested: a token expired by the database's clock writes no
 * row, one prune stops at its 60 statements, and the layer prunes and recounts every minute and
 * goes on after a minute whose statements failed.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it, layer } from "@effect/vitest"
import { Chunk, Clock, Context, Effect, Either, Fiber, Layer, Logger, Redacted, TestClock } from "effect"
import pg from "pg"
import * as Jti from "../../src/services/api/JtiStore.js"
import { DatabaseUrl } from "../../src/services/platform/Database.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Db from "../support/db.js"
import { captureLogs } from "./support.js"
import { untilEffect } from "./tailClient.js"

describe("jti store bounds", () => {
  it("the default bounds are docs/api.md's: 1,000,000 live rows, 500,000 of long-lived tokens", () => {
    expect(Jti.DEFAULT_BOUNDS).toEqual({ liveRows: 1_000_000, longLivedRows: 500_000 })
  })

  layer(Db.layer())((it) => {
    it.effect("a row living 2 minutes from its claim is short-lived; 1 ms more is long-lived", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        // no room for long-lived tokens at all: a long-lived claim is refused, a short one recorded
        const store = yield* Jti.makeSqlWith({ liveRows: 10, longLivedRows: 0 })
        const now = yield* Clock.currentTimeMillis
        expect(yield* store.claim("did:web:a.example", "edge", now + 120_000)).toBe("fresh")
        expect(yield* store.claim("did:web:a.example", "past-edge", now + 120_001)).toBe("full")
        expect(yield* store.claim("did:web:a.example", "hour", now + 3_600_000)).toBe("full")
      }))

    it.effect("a prune deletes expired rows only: a row expiring in a minute is kept, and still refuses its jti", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const sql = yield* SqlClient.SqlClient
        const store = yield* Jti.makeSql
        yield* sql`DELETE FROM api_jti`
        yield* sql`INSERT INTO api_jti (iss, jti, expires_at) VALUES
          ('did:web:b.example', 'gone', now() - interval '1 second'),
          ('did:web:b.example', 'soon', now() + interval '1 minute')`
        expect(yield* store.prune).toBe(1)
        const left = yield* sql<{ readonly jti: string }>`SELECT jti FROM api_jti ORDER BY jti`
        expect(left.map((r) => r.jti)).toEqual(["soon"])
        const now = yield* Clock.currentTimeMillis
        expect(yield* store.claim("did:web:b.example", "soon", now + 60_000)).toBe("replayed")
      }))

    it.scoped("the layer counts the live rows as it starts: with the table at its bound, new tokens are refused", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM api_jti`
        yield* sql`INSERT INTO api_jti (iss, jti, expires_at) VALUES
          ('did:web:c.example', 'held-1', now() + interval '1 hour'),
          ('did:web:c.example', 'held-2', now() + interval '1 hour')`
        // the next count is a minute away (TestClock): only the one at the start can see these rows
        const store = Context.get(yield* Layer.build(Jti.layerSqlWith({ liveRows: 2 })), Jti.JtiStore)
        const now = yield* Clock.currentTimeMillis
        yield* untilEffect(
          "the count at the start",
          Effect.map(Effect.orDie(store.claim("did:web:c.example", "held-1", now + 60_000)), (v) => v === "full")
        )
        expect(yield* store.claim("did:web:c.example", "new", now + 60_000)).toBe("full")
      }))

    it.effect("a token expired by the database's clock is refused and writes no row", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const sql = yield* SqlClient.SqlClient
        const store = yield* Jti.makeSql
        yield* sql`DELETE FROM api_jti`
        expect(yield* store.claim("did:web:e.example", "late", Date.now() - 60_000)).toBe("expired")
        expect(yield* sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM api_jti`).toEqual([{ n: 0 }])
      }))

    it.scoped("the layer prunes and recounts every minute, and goes on after a minute whose statements failed", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const sql = yield* SqlClient.SqlClient
        yield* sql`DELETE FROM api_jti`
        yield* sql`INSERT INTO api_jti (iss, jti, expires_at) VALUES
          ('did:web:f.example', 'live-1', now() + interval '1 hour'),
          ('did:web:f.example', 'live-2', now() + interval '1 hour'),
          ('did:web:f.example', 'gone', now() - interval '1 second')`
        const { capture, lines } = captureLogs()
        const store = Context.get(
          yield* Layer.build(Jti.layerSqlWith({ liveRows: 2 })).pipe(
            Effect.provide(Logger.replace(Logger.defaultLogger, capture))
          ),
          Jti.JtiStore
        )
        let n = 0
        const claim = () => Effect.orDie(store.claim("did:web:f.example", `new-${++n}`, Date.now() + 60_000))
        // the layer's fiber waits for its next minute (a statement's timeout, interrupted, may stay listed)
        const sleeping = untilEffect(
          "the layer's fiber sleeps",
          Effect.zipWith(
            TestClock.sleeps(),
            Clock.currentTimeMillis,
            (s, now) => Chunk.some(s, (t) => t >= now + 60_000)
          )
        )
        const logged = (message: string) =>
          untilEffect(message, Effect.sync(() => lines.some((l) => l.message === message)))
        yield* untilEffect("the count at the start", Effect.map(claim(), (v) => v === "full"))
        yield* sleeping
        // a minute whose prune and count fail (the table is away): logged, and the fiber goes on
        yield* sql`ALTER TABLE api_jti RENAME TO api_jti_away`
        yield* TestClock.adjust("1 minute")
        yield* logged("api: expired token ids could not be pruned")
        yield* logged("api: live token ids could not be counted")
        yield* sleeping
        yield* sql`ALTER TABLE api_jti_away RENAME TO api_jti`
        // the live rows end (as tokens of other replicas expire): the next minute's count frees the room
        yield* sql`DELETE FROM api_jti WHERE jti <> 'gone'`
        yield* TestClock.adjust("1 minute")
        yield* untilEffect(
          "the expired row pruned",
          Effect.map(Effect.orDie(sql`SELECT jti FROM api_jti WHERE jti = 'gone'`), (rows) => rows.length === 0)
        )
        yield* untilEffect("the room counted back", Effect.map(claim(), (v) => v === "fresh"))
      }))

    it.effect(
      "one prune deletes at most 60 statements of 10,000 expired rows (600,000); the rest waits for the next",
      () =>
        Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          const store = yield* Jti.makeSql
          yield* sql`DELETE FROM api_jti`
          yield* sql`INSERT INTO api_jti (iss, jti, expires_at)
          SELECT 'did:web:flood.example', 'j' || g, now() - interval '1 minute' FROM generate_series(1, 600005) g`
          expect(yield* store.prune).toBe(600_000)
          expect(yield* store.prune).toBe(5)
        }),
      { timeout: 60_000 }
    )

    it.scoped("a claim the database does not answer fails after 3 s (TestClock), well within the call's 10 s", () =>
      Effect.gen(function*() {
        yield* TestClock.setTime(Date.now())
        const sql = yield* SqlClient.SqlClient
        const url = yield* DatabaseUrl
        const store = yield* Jti.makeSql
        // another session holds the table until the test ends
        yield* Effect.acquireRelease(
          Effect.promise(async () => {
            const client = new pg.Client({ connectionString: Redacted.value(url) })
            await client.connect()
            await client.query("BEGIN")
            await client.query("LOCK TABLE api_jti IN ACCESS EXCLUSIVE MODE")
            return client
          }),
          (client) => Effect.promise(() => client.end())
        )
        const now = yield* Clock.currentTimeMillis
        const claim = yield* Effect.fork(Effect.either(store.claim("did:web:d.example", "blocked", now + 60_000)))
        yield* untilEffect(
          "the claim waits on the lock",
          Effect.map(
            Effect.orDie(sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'`),
            (rows) => (rows[0]?.n ?? 0) > 0
          )
        )
        yield* TestClock.adjust("2999 millis")
        expect(claim.unsafePoll()).toBeNull()
        yield* TestClock.adjust("1 millis")
        expect(yield* Fiber.join(claim)).toEqual(
          Either.left(new StoreError({ op: "api.jti.claim", code: "timeout" }))
        )
      }))
  })
})
