/**
 * The secrets of callers firehook knows no webhook record of (SPEC §7: every table is bounded; §8:
 * owners are "anyone with a place.wisp.v2.wh record"). Any DID whose document has an `#atproto` key
 * can call the secret methods (a did:web path DID is a static did.json), and DIDs are free to mint:
 * held to the owner's 1,000 each, they grew the `secrets` table without bound. Through the owners'
 * API, a caller with no `webhooks` row and no `rejected_records` row holds at most 10 secrets
 * (`LimitExceeded`), and all such callers together at most `beforeRecordTotal` (100,000; 503
 * `NotEnoughResources`); owners keep 1,000, and the operator's `create` is not limited so. Real
 * PostgreSQL; the bounds hold for concurrent creates (advisory locks).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, layer } from "@effect/vitest"
import { Cause, Clock, Effect, Either, Exit, Fiber, Layer, Redacted, TestClock } from "effect"
import pg from "pg"
import { secretsFailure } from "../../src/services/api/SecretMethods.js"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import {
  MAX_SECRETS_BEFORE_RECORD,
  MAX_SECRETS_BEFORE_RECORD_TOTAL,
  Secrets,
  SecretsError
} from "../../src/services/delivery/Secrets.js"
import { DatabaseUrl } from "../../src/services/platform/Database.js"
import { SECRETS_OWNER } from "../../src/services/platform/LockKeys.js"
import { eventually } from "../delivery/worker-support.js"
import * as Db from "../support/db.js"
import { insertWebhook } from "../support/webhookRows.js"
import { apiLayer, callAs, newDid, newOwner } from "./support.js"

const S = "place.wisp.v2.secret"
/** the TestClock set to the wall clock now (the verifier library reads the wall clock) */
const wallClock = Effect.suspend(() => TestClock.setTime(Date.now()))

const rejectedRecord = (ownerDid: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`INSERT INTO rejected_records (owner_did, rkey, rev, reason, source)
      VALUES (${ownerDid}, 'hook', '3l2aaaaaaaa22', 'invalid', 'stream')`)

const countOf = (ownerDid: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ n: number }>`SELECT count(*)::int AS n FROM secrets WHERE owner_did = ${ownerDid}`,
      (r) => r[0]?.n ?? 0
    ))

const reasonOf = <A>(exit: Exit.Exit<A, SecretsError>): string | undefined =>
  Exit.isFailure(exit)
    ? Cause.failureOption(exit.cause).pipe((o) => (o._tag === "Some" ? o.value.reason : undefined))
    : undefined

describe("the owners' API: secrets of callers without a webhook record", () => {
  layer(apiLayer())((it) => {
    it.effect("a caller with no webhook record gets 10 secrets, then LimitExceeded; with a webhooks row, more", () =>
      Effect.gen(function*() {
        yield* wallClock
        const stranger = yield* newOwner()
        const statuses: Array<number> = []
        for (let i = 0; i < 10; i++) {
          statuses.push((yield* callAs(stranger, `${S}.create`, { body: { name: `s${i}` } })).status)
        }
        expect(statuses).toEqual(Array.from({ length: 10 }, () => 200))
        const refused = yield* callAs(stranger, `${S}.create`, { body: { name: "eleventh" } })
        expect([refused.status, refused.body]).toEqual([400, {
          error: "LimitExceeded",
          message: "at most 10 secrets before your first webhook record"
        }])
        // an existing name still answers AlreadyExists; rotate, list and delete are unaffected
        const dup = yield* callAs(stranger, `${S}.create`, { body: { name: "s0" } })
        expect([dup.status, dup.body["error"]]).toEqual([400, "AlreadyExists"])
        expect((yield* callAs(stranger, `${S}.rotate`, { body: { name: "s0" } })).status).toBe(200)
        expect(yield* countOf(stranger.did)).toBe(10)

        // the owner publishes a webhook record (firehook stores its row): the owner's 1,000 apply
        yield* insertWebhook(stranger.did, "hook")
        const more = yield* callAs(stranger, `${S}.create`, { body: { name: "eleventh" } })
        expect(more.status).toBe(200)
        expect(yield* countOf(stranger.did)).toBe(11)
      }))

    it.effect("a record firehook refused (a rejected_records row) counts as a webhook record", () =>
      Effect.gen(function*() {
        yield* wallClock
        const owner = yield* newOwner()
        yield* rejectedRecord(owner.did)
        for (let i = 0; i < 12; i++) {
          expect((yield* callAs(owner, `${S}.create`, { body: { name: `r${i}` } })).status).toBe(200)
        }
      }))

    it.effect("the overall bound answers 503 NotEnoughResources", () =>
      Effect.gen(function*() {
        const failure = yield* Effect.flip(secretsFailure(new SecretsError({ reason: "before_record_full" })))
        expect([failure.status, failure.error]).toEqual([503, "NotEnoughResources"])
        expect(failure.message).not.toMatch(/did:|https?:/)
        expect([MAX_SECRETS_BEFORE_RECORD, MAX_SECRETS_BEFORE_RECORD_TOTAL]).toEqual([10, 100_000])
      }))
  })
})

const keyring = Either.getOrThrow(
  SecretBox.makeKeyring(Either.getOrThrow(SecretBox.parseKey(Buffer.alloc(32, 7).toString("base64"))), [])
)
const TOTAL = 25
const secretsWithTotal = Secrets.layerSqlWithKeyring(keyring, { beforeRecordTotal: TOTAL })

describe("the overall bound of secrets of callers without a webhook record (real PostgreSQL)", () => {
  layer(Db.layer())((it) => {
    it.effect("at most `beforeRecordTotal` in all; owners and the operator's create are not held to it", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`TRUNCATE secrets, webhooks, rejected_records`
        const secrets = yield* Secrets
        const [a, b, c, d, owner] = [newDid(), newDid(), newDid(), newDid(), newDid()]
        const createAll = (did: string, n: number) =>
          Effect.forEach(Array.from({ length: n }, (_, i) => `n${i}`), (name) => secrets.createAsCaller(did, name))
        yield* createAll(a, 10)
        yield* createAll(b, 10)
        yield* createAll(c, 5)
        expect(reasonOf(yield* Effect.exit(secrets.createAsCaller(d, "first")))).toBe("before_record_full")
        expect(reasonOf(yield* Effect.exit(secrets.createAsCaller(c, "n5")))).toBe("before_record_full")
        // an existing name is still AlreadyExists
        expect(reasonOf(yield* Effect.exit(secrets.createAsCaller(c, "n0")))).toBe("already_exists")
        // an owner is not held to it (nor counted)
        yield* insertWebhook(owner, "hook")
        yield* createAll(owner, 12)
        // the operator's create (CLI, embedding) is not limited by the caller bounds
        yield* secrets.create(d, "by-operator")
        yield* Effect.forEach(Array.from({ length: 11 }, (_, i) => `op${i}`), (name) => secrets.create(a, name))
        expect(yield* countOf(a)).toBe(21)
        // a's secrets stop counting once a publishes a record: room for d
        yield* insertWebhook(a, "hook")
        yield* secrets.createAsCaller(d, "first")
        expect(yield* countOf(d)).toBe(2)
      }).pipe(Effect.provide(secretsWithTotal)))

    it.effect("the bounds hold for concurrent creates of many callers: 22 stored, 10 at once → exactly 3 more", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`TRUNCATE secrets, webhooks, rejected_records`
        const secrets = yield* Secrets
        const url = yield* DatabaseUrl
        const [a, b, c] = [newDid(), newDid(), newDid()]
        for (const [did, n] of [[a, 10], [b, 10], [c, 2]] as const) {
          yield* Effect.forEach(
            Array.from({ length: n }, (_, i) => `pre${i}`),
            (name) => secrets.createAsCaller(did, name)
          )
        }
        // Another session holds the lock of the callers without a record: every create has passed
        // its own lock and waits there, so all 10 are in flight at once (no timing) before it lets go.
        const holder = yield* Effect.acquireRelease(
          Effect.promise(async () => {
            const client = new pg.Client({ connectionString: Redacted.value(url) })
            await client.connect()
            await client.query("BEGIN")
            await client.query("SELECT pg_advisory_xact_lock($1::int, -1)", [SECRETS_OWNER])
            return client
          }),
          (client) => Effect.promise(() => client.end())
        )
        const callers = Array.from({ length: 10 }, () => newDid())
        const creates = yield* Effect.fork(
          Effect.forEach(callers, (did) => Effect.either(secrets.createAsCaller(did, "main")), {
            concurrency: "unbounded"
          })
        )
        yield* eventually(
          "every create waiting for the callers' lock",
          sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE datname = current_database() AND wait_event_type = 'Lock'`,
          (r) => r[0]?.n === callers.length
        ).pipe(Effect.withClock(Clock.make())) // polled on the wall clock, not the TestClock
        yield* Effect.promise(() => holder.query("ROLLBACK"))
        const results = yield* Fiber.join(creates)
        expect(results.filter(Either.isRight)).toHaveLength(3)
        expect(results.flatMap((r) => (Either.isLeft(r) ? [r.left.reason] : []))).toEqual(
          Array.from({ length: 7 }, () => "before_record_full")
        )
        const rows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM secrets`
        expect(rows[0]?.n).toBe(TOTAL)
      }).pipe(Effect.provide(secretsWithTotal), Effect.scoped))

    it.effect("one caller's concurrent creates: exactly 10 (real PostgreSQL)", () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`TRUNCATE secrets, webhooks, rejected_records`
        const secrets = yield* Secrets
        const did = newDid()
        const results = yield* Effect.forEach(
          Array.from({ length: 16 }, (_, i) => `c${i}`),
          (name) => Effect.either(secrets.createAsCaller(did, name)),
          { concurrency: "unbounded" }
        )
        expect(results.filter(Either.isRight)).toHaveLength(10)
        expect(new Set(results.flatMap((r) => (Either.isLeft(r) ? [r.left.reason] : [])))).toEqual(
          new Set(["limit_before_record"])
        )
        expect(yield* countOf(did)).toBe(10)
      }).pipe(Effect.provide(Secrets.layerSqlWithKeyring(keyring))))
  })
})

/** The same service over the memory store: no records known there, so the owner bound only. */
describe("the memory store", () => {
  layer(Layer.empty)((it) => {
    it.effect("holds a caller to the owner bound (it knows no webhook records)", () =>
      Effect.gen(function*() {
        const secrets = yield* Secrets
        const did = newDid()
        yield* Effect.forEach(
          Array.from({ length: 12 }, (_, i) => `m${i}`),
          (name) => secrets.createAsCaller(did, name)
        )
        expect((yield* secrets.list(did)).length).toBe(12)
      }).pipe(Effect.provide(Secrets.layerMemory())))
  })
})
