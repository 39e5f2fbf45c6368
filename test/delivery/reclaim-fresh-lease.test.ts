/**
 * The reclaim of a dead worker's rows (SPEC §4.1, LeaseSql.reclaimStatement) against a row taken
 * by a live worker while the statement runs: the statement judges the owner dead from its snapshot,
 * and in READ COMMITTED its row lock then takes the row's newest version. If another process's
 * reclaim freed the row in the meantime and a live worker claimed it with a fresh lease, that lease
 * must stand (expiring it would let a third worker send the row again while the live one is still
 * sending it); a dead worker's row nobody took is still freed by the same statement.
 *
 * The claim lands inside the statement deterministically: the test holds the outbox's TOAST index
 * (`REINDEX` in an open transaction, ACCESS EXCLUSIVE on that index only), so the reclaim, once its
 * snapshot is taken, waits when it reads the first out-of-line lease token (a dead worker's row with
 * a long worker id); the claim commits while it waits, then the index is let go.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { reclaimStatement } from "../../src/services/delivery/LeaseSql.js"
import { WORKER_ALIVE } from "../../src/services/platform/LockKeys.js"
import * as Db from "../support/db.js"

const LIVE = "host:live:worker"
const DEAD = "host:dead:worker"
/** a worker id long enough (some 6 kB, hardly compressible) that its lease tokens are stored out of line */
const LONG_ID = `(SELECT 'gone-' || string_agg(md5(i::text), '') FROM generate_series(1, 200) i)`

const insertLeased = (sql: SqlClient.SqlClient, id: string, tokenExpr: string, untilExpr: string) =>
  sql.unsafe(
    `INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
       event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin,
       status, lease_token, leased_until)
     VALUES ($1, 'ev', 'did:plc:o', 'w', 'direct', 'did:plc:o', 'app.bsky.feed.post', $1,
       'create', 'https://receiver.example/hook', 'secret_id', 'main', 'fp', 'https://receiver.example',
       'leased', ${tokenExpr}, ${untilExpr})`,
    [id]
  )

/** Polls (20 ms apart, at most 10 s) until a session waits for a lock on relation `oid`. */
const waitsOn = (sql: SqlClient.SqlClient, oid: number) =>
  sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_locks WHERE relation = ${oid} AND NOT granted`.pipe(
    Effect.map((rows) => (rows[0]?.n ?? 0) > 0),
    Effect.tap((yes) => (yes ? Effect.void : Effect.sleep("20 millis"))),
    Effect.repeat({ until: (yes) => yes, times: 499 }),
    Effect.flatMap((yes) => (yes ? Effect.void : Effect.dieMessage("the reclaim never waited on the TOAST index")))
  )

describe("reclaim of a dead worker's rows vs a row claimed meanwhile", () => {
  it.scopedLive(
    "a row claimed by a live worker while the reclaim statement runs keeps its fresh lease",
    () =>
      Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        // the live worker's liveness mark, held on a connection of its own for the whole test
        const markConn = yield* sql.reserve
        yield* markConn.executeValues("SELECT pg_advisory_lock($1, hashtext($2))", [WORKER_ALIVE, LIVE])

        yield* sql`INSERT INTO delivery_events (event_id, body, body_sha256) VALUES ('ev', '{}', 'x')`
        // a dead worker's row, read first (earlier in the table and in lease order): the gate
        yield* insertLeased(sql, "g", `${LONG_ID} || ':1'`, `now() + interval '1 hour'`)
        // the row the test has a live worker claim while the reclaim waits
        yield* insertLeased(sql, "x", `'${DEAD}:1'`, `now() + interval '2 hours'`)
        const [toast] = yield* sql<{ oid: number; name: string }>`
          SELECT i.indexrelid::int AS oid, i.indexrelid::regclass::text AS name FROM pg_index i
          WHERE i.indrelid = (SELECT reltoastrelid FROM pg_class WHERE oid = 'outbox'::regclass)`
        if (toast === undefined) return yield* Effect.dieMessage("outbox has no TOAST index")

        const gateConn = yield* sql.reserve
        yield* gateConn.executeRaw("BEGIN", [])
        yield* gateConn.executeRaw(`REINDEX INDEX ${toast.name}`, [])

        // another process's reclaim starts, takes its snapshot (both rows leased to dead workers)
        // and waits to read the gate row's lease token
        const reclaim = yield* Effect.fork(reclaimStatement(sql, "host:reclaimer:worker"))
        yield* waitsOn(sql, toast.oid)
        // meanwhile the dead worker's row is freed and claimed by the LIVE worker (what another
        // replica's reclaim and its worker's claim commit), with a fresh one-minute lease
        yield* sql`UPDATE outbox SET lease_token = ${`${LIVE}:claimed`}, leased_until = now() + interval '1 minute'
          WHERE delivery_id = 'x'`
        expect((yield* Fiber.poll(reclaim))._tag).toBe("None")
        yield* gateConn.executeRaw("ROLLBACK", [])
        const freed = yield* Fiber.join(reclaim)

        const rows = yield* sql<{ id: string; token: string; valid: boolean }>`
          SELECT delivery_id AS id, left(lease_token, 40) AS token, leased_until > now() AS valid
          FROM outbox ORDER BY delivery_id`
        const x = rows.find((r) => r.id === "x")
        expect(x?.token).toBe(`${LIVE}:claimed`)
        // the live worker's lease was not expired by the reclaim (its mark is held)
        expect(x?.valid).toBe(true)
        // the dead worker's row nobody took was freed
        expect(rows.find((r) => r.id === "g")?.valid).toBe(false)
        expect(freed).toBe(1)
      }).pipe(Effect.provide(Db.layer())),
    30_000
  )
})
