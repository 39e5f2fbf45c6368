/**
 * The shared jti store's bounds (SPEC §8.2; docs/api.md: 1,000,000 live rows, 500,000 of tokens
 * living longer than about 90 s) on real PostgreSQL, pinned where a mutation audit found them
 * untested: the edge of a long-lived token (a row living more than 2 minutes from its claim), and
 * a prune that deletes expired rows only (a token that still lives is never forgotten early), and
 * the layer's first count as it starts (a replica started with the table at its bound refuses new
 * tokens at once, not after a minute).
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it, layer } from "@effect/vitest"
import { Clock, Context, Effect, Layer, TestClock } from "effect"
import * as Jti from "../../src/services/api/JtiStore.js"
import * as Db from "../support/db.js"
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
  })
})
