/**
 * wisp.place's secret methods (SPEC §8.4) over the real secret store on PostgreSQL: outputs exactly
 * as §8.4 gives them, the token shown once, errors, the per-owner bound, NotConfigured without an
 * encryption key, and isolation: an owner sees and touches only its own secrets.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Clock, Effect, Either, Fiber, Redacted, TestClock } from "effect"
import pg from "pg"
import { Secrets } from "../../src/services/delivery/Secrets.js"
import { DatabaseUrl } from "../../src/services/platform/Database.js"
import { eventually } from "../delivery/worker-support.js"
import { apiLayer, callAs, healthApi, newOwner } from "./support.js"

const S = "place.wisp.v2.secret"
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))
const ISO = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/

describe("secret methods", () => {
  layer(apiLayer())((it) => {
    it.effect("create, list, rotate, delete: outputs of SPEC §8.4; tokens only from create and rotate", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const created = yield* callAs(owner, `${S}.create`, { body: { name: "main" } })
        expect(created.status).toBe(200)
        expect(Object.keys(created.body).sort()).toEqual(["createdAt", "name", "token"])
        expect(created.body["name"]).toBe("main")
        expect(created.body["token"]).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)
        expect(created.body["createdAt"]).toMatch(ISO)
        expect(created.headers["cache-control"]).toBe("no-store")
        // the store signs with exactly that token
        const secrets = yield* Secrets
        expect(yield* secrets.resolve(owner.did, "main")).toBe(created.body["token"])

        const dup = yield* callAs(owner, `${S}.create`, { body: { name: "main" } })
        expect([dup.status, dup.body["error"]]).toEqual([400, "AlreadyExists"])

        const listed = yield* callAs(owner, `${S}.list`)
        expect(listed.body).toEqual({ secrets: [{ name: "main", createdAt: created.body["createdAt"] }] })
        expect(listed.text).not.toContain("whsec_")

        const rotated = yield* callAs(owner, `${S}.rotate`, { body: { name: "main" } })
        expect(rotated.status).toBe(200)
        expect(Object.keys(rotated.body).sort()).toEqual(["name", "rotatedAt", "token"])
        expect(rotated.body["token"]).toMatch(/^whsec_/)
        expect(rotated.body["token"]).not.toBe(created.body["token"])
        expect(rotated.body["rotatedAt"]).toMatch(ISO)
        expect(yield* secrets.resolve(owner.did, "main")).toBe(rotated.body["token"])
        const after = yield* callAs(owner, `${S}.list`)
        expect(after.body).toEqual({
          secrets: [{ name: "main", createdAt: created.body["createdAt"], lastRotatedAt: rotated.body["rotatedAt"] }]
        })

        const deleted = yield* callAs(owner, `${S}.delete`, { body: { name: "main" } })
        expect([deleted.status, deleted.body]).toEqual([200, {}])
        const again = yield* callAs(owner, `${S}.delete`, { body: { name: "main" } })
        expect([again.status, again.body["error"]]).toEqual([400, "NotFound"])
        const missing = yield* callAs(owner, `${S}.rotate`, { body: { name: "main" } })
        expect([missing.status, missing.body["error"]]).toEqual([400, "NotFound"])
        expect((yield* callAs(owner, `${S}.list`)).body).toEqual({ secrets: [] })
      }))

    it.effect("names: the SPEC's pattern and the lexicon's record-key format; bad input is InvalidRequest", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        for (const name of ["a", "A.b_c-9", "x".repeat(64)]) {
          expect((yield* callAs(owner, `${S}.create`, { body: { name } })).status).toBe(200)
        }
        for (
          const body of [
            { name: "." },
            { name: ".." },
            { name: "x".repeat(65) },
            { name: "a/b" },
            { name: "" },
            {
              name: 5
            },
            {},
            []
          ]
        ) {
          const r = yield* callAs(owner, `${S}.create`, { body })
          expect([r.status, r.body["error"]]).toEqual([400, "InvalidRequest"])
        }
        // `.` and `..` match the SPEC's pattern, so the operator CLI (the same store) may create them:
        // list shows them (its output is a plain string); the lexicon's record-key refuses them as input
        const secrets = yield* Secrets
        const other = yield* newOwner()
        yield* secrets.create(other.did, ".")
        yield* secrets.create(other.did, "..")
        const listed = yield* callAs(other, `${S}.list`)
        expect(listed.status).toBe(200)
        expect((listed.body["secrets"] as ReadonlyArray<Record<string, unknown>>).map((m) => m["name"]).sort())
          .toEqual([".", ".."])
        const refused = yield* callAs(other, `${S}.delete`, { body: { name: "." } })
        expect([refused.status, refused.body["error"]]).toEqual([400, "InvalidRequest"])
      }))

    it.effect("create and rotate answer the times of the named secret (as list shows them), not another's", () =>
      Effect.gen(function*() {
        yield* wallClock
        const sql = yield* SqlClient.SqlClient
        const owner = yield* newOwner()
        expect((yield* callAs(owner, `${S}.create`, { body: { name: "a-old" } })).status).toBe(200)
        yield* sql`UPDATE secrets SET created_at = now() - interval '1 day', rotated_at = now() - interval '1 hour'
          WHERE owner_did = ${owner.did}`
        const created = yield* callAs(owner, `${S}.create`, { body: { name: "b-new" } })
        const rotated = yield* callAs(owner, `${S}.rotate`, { body: { name: "b-new" } })
        expect([created.status, rotated.status]).toEqual([200, 200])
        const listed = (yield* callAs(owner, `${S}.list`)).body["secrets"] as ReadonlyArray<Record<string, unknown>>
        expect(listed.map((s) => s["name"])).toEqual(["a-old", "b-new"])
        expect([created.body["createdAt"], rotated.body["rotatedAt"]]).toEqual([
          listed[1]?.["createdAt"],
          listed[1]?.["lastRotatedAt"]
        ])
      }))

    it.effect("isolation: owner B cannot list, rotate or delete owner A's secrets", () =>
      Effect.gen(function*() {
        yield* wallClock
        const a = yield* newOwner()
        const b = yield* newOwner()
        const created = yield* callAs(a, `${S}.create`, { body: { name: "shared" } })
        expect((yield* callAs(b, `${S}.list`)).body).toEqual({ secrets: [] })
        for (const m of ["rotate", "delete"]) {
          const r = yield* callAs(b, `${S}.${m}`, { body: { name: "shared" } })
          expect([r.status, r.body["error"]]).toEqual([400, "NotFound"])
        }
        // A's secret is untouched
        const secrets = yield* Secrets
        expect(yield* secrets.resolve(a.did, "shared")).toBe(created.body["token"])
        expect((yield* callAs(a, `${S}.list`)).body).toMatchObject({ secrets: [{ name: "shared" }] })
        // B's own secret of the same name is another secret
        const own = yield* callAs(b, `${S}.create`, { body: { name: "shared" } })
        expect(own.status).toBe(200)
        expect(own.body["token"]).not.toBe(created.body["token"])
        expect(yield* secrets.resolve(a.did, "shared")).toBe(created.body["token"])
      }))

    it.effect("at most 1,000 secrets per owner: LimitExceeded", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        const secrets = yield* Secrets
        yield* Effect.forEach(
          Array.from({ length: 1000 }, (_, i) => `s${i}`),
          (name) => secrets.create(owner.did, name),
          { concurrency: 8, discard: true }
        )
        const r = yield* callAs(owner, `${S}.create`, { body: { name: "one-more" } })
        expect([r.status, r.body["error"]]).toEqual([400, "LimitExceeded"])
        const listed = yield* callAs(owner, `${S}.list`)
        expect((listed.body["secrets"] as Array<unknown>).length).toBe(1000)
      }))

    it.effect("the bound holds for concurrent creates: 995 stored, 12 at once → exactly 5 more (real PostgreSQL)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const secrets = yield* Secrets
        const url = yield* DatabaseUrl
        const owner = yield* newOwner()
        yield* sql`INSERT INTO secrets (owner_did, name, envelope)
          SELECT ${owner.did}, 'pre' || g, 'x' FROM generate_series(1, 995) g`
        const names = Array.from({ length: 12 }, (_, i) => `race${i}`)
        // Another session holds the 12 names, uncommitted. A create that has counted the owner's
        // secrets then waits for it at its insert, so every create can be in flight at once: the
        // worst interleaving, made certain (no timing), before the holder rolls back.
        const holder = yield* Effect.acquireRelease(
          Effect.promise(async () => {
            const c = new pg.Client({ connectionString: Redacted.value(url) })
            await c.connect()
            await c.query("BEGIN")
            await c.query(
              "INSERT INTO secrets (owner_did, name, envelope) SELECT $1, unnest($2::text[]), 'held'",
              [owner.did, names]
            )
            return c
          }),
          (c) => Effect.promise(() => c.end())
        )
        const creates = yield* Effect.fork(
          Effect.forEach(names, (name) => Effect.either(secrets.create(owner.did, name)), { concurrency: "unbounded" })
        )
        yield* eventually(
          "every create waiting (on the holder, or on the owner's turn)",
          sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'`,
          (r) => r[0]?.n === names.length
        ).pipe(Effect.withClock(Clock.make())) // polled on the wall clock, not the TestClock
        yield* Effect.promise(() => holder.query("ROLLBACK"))
        const results = yield* Fiber.join(creates)
        expect(results.filter(Either.isRight)).toHaveLength(5)
        expect(results.flatMap((r) => (Either.isLeft(r) ? [r.left.reason] : []))).toEqual(
          Array.from({ length: 7 }, () => "limit_reached")
        )
        const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM secrets WHERE owner_did = ${owner.did}`
        expect(rows[0]?.n).toBe(1000)
      }).pipe(Effect.scoped))

    it.effect("health counts the calls", () =>
      Effect.gen(function*() {
        const api = yield* healthApi
        expect(api).toMatchObject({ configured: true, authFailures: 0, rateLimited: 0 })
        expect((api as { calls: number }).calls).toBeGreaterThan(10)
      }))
  })
})

describe("secret methods without WEBHOOK_SECRET_ENCRYPTION_KEY", () => {
  layer(apiLayer({ env: { WEBHOOK_SECRET_ENCRYPTION_KEY: "" } }))((it) => {
    it.effect("create and rotate answer 503 NotConfigured; list and delete work", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        for (const m of ["create", "rotate"]) {
          const r = yield* callAs(owner, `${S}.${m}`, { body: { name: "main" } })
          expect([r.status, r.body["error"]]).toEqual([503, "NotConfigured"])
        }
        expect((yield* callAs(owner, `${S}.list`)).body).toEqual({ secrets: [] })
        const d = yield* callAs(owner, `${S}.delete`, { body: { name: "main" } })
        expect([d.status, d.body["error"]]).toEqual([400, "NotFound"])
      }))
  })
})
