/**
 * `firehook webhooks resume <did> <rkey> --replay` when the replay stops at its statement bound
 * (src/services/operator/WebhookState.ts, src/cli/WebhooksCommand.ts): rows kept being parked while
 * it ran, so it replayed what its statements allowed and left the rest parked. It says so, as
 * `firehook deliveries replay` does ("run the same command again"), and `--json` has `complete:
 * false`; the same command run again takes the rest, and then says nothing more. `bun
 * src/cli/main.ts` as a child process against a fresh PostgreSQL database.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { runCli } from "../support/proc.js"
import { plc } from "../support/stack.js"
import { insertWebhook } from "../support/webhookRows.js"
import { lines } from "./cli-expect.js"

const ALICE = plc(1)
const AGAIN = "(stopped at its statement bound; run the same command again for the rest)"

const cli = (args: ReadonlyArray<string>, env: Record<string, string>) => Effect.promise(() => runCli(args, env))

/** rows `from`..`to` (SQL expressions) of ALICE's webhook `down` parked (dead letters of kind webhook_disabled) */
const parked = (from: string, to: string, createdAt: string) =>
  `INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
     event_rkey, event_operation, target_url, signing_mode, fingerprint, status, attempt_count, last_error_kind,
     finished_at, created_at, updated_at)
   SELECT 'p-' || g, 'ev-p-' || g, '${ALICE}', 'down', 'direct', '${ALICE}', 'app.bsky.feed.post', 'p', 'create',
     'https://receiver.example/hook', 'secret_id', 'fp-down', 'dead_letter', 1, 'webhook_disabled', now(),
     '${createdAt}'::timestamptz + g * interval '1 ms', now() - interval '1 hour'
   FROM generate_series(${from}, ${to}) g`

describe("firehook webhooks resume --replay: a replay stopped at its statement bound", () => {
  it.scopedLive(
    "says to run it again (text and --json); run again, it takes the rest and says nothing more",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        const env = { DATABASE_URL: Redacted.value(db.url) }
        const withDb = <A>(f: (sql: SqlClient.SqlClient) => Effect.Effect<A, unknown>) =>
          Effect.flatMap(SqlClient.SqlClient, f).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.orDie)
        // 1,000 parked rows: the replay counts them and allows itself 2 statements of 1,000. Each of
        // its statements lets 1,000 more in (parked by transactions older than the replay, enqueued
        // after the last row it took), until 4,000 rows exist.
        const arm = (sql: SqlClient.SqlClient) =>
          Effect.gen(function*() {
            yield* sql.unsafe(`CREATE OR REPLACE FUNCTION test_late_parked() RETURNS trigger LANGUAGE plpgsql AS $$
              DECLARE k int;
              BEGIN
                SELECT count(*) INTO k FROM outbox;
                IF k < 4000 THEN
                  ${parked("k + 1", "k + 1000", "2026-02-01T00:00:00Z")};
                END IF;
                RETURN NULL;
              END $$`)
            yield* sql.unsafe(`CREATE TRIGGER test_late_parked AFTER UPDATE ON outbox
              FOR EACH STATEMENT EXECUTE FUNCTION test_late_parked()`)
          })
        const statuses = (sql: SqlClient.SqlClient) =>
          sql<{ status: string; n: number }>`
            SELECT status, count(*)::int AS n FROM outbox GROUP BY status ORDER BY status`
        yield* Effect.gen(function*() {
          yield* insertWebhook(ALICE, "down", { state: { auto_disabled_at: "now()", parked: "1000" } })
          const sql = yield* SqlClient.SqlClient
          yield* sql.unsafe(parked("1", "1000", "2026-01-01T00:00:00Z"))
        }).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.orDie)
        yield* withDb(arm)

        const first = yield* cli(["webhooks", "resume", ALICE, "down", "--replay"], env)
        expect(first.code, first.stderr).toBe(0)
        expect(lines(first.stdout)).toEqual([`${ALICE} down: resumed; replayed 2000 parked deliveries`, AGAIN])
        expect(yield* withDb(statuses)).toEqual([{ status: "dead_letter", n: 1000 }, { status: "pending", n: 2000 }])

        // the same with --json, from the start again (1,000 parked; a DELETE fires no UPDATE trigger)
        yield* withDb((sql) =>
          Effect.zipRight(sql`DELETE FROM outbox`, sql.unsafe(parked("1", "1000", "2026-01-01T00:00:00Z")))
        )
        const json = yield* cli(["webhooks", "resume", ALICE, "down", "--replay", "--json"], env)
        expect(json.code, json.stderr).toBe(0)
        expect(JSON.parse(json.stdout)).toEqual({
          ownerDid: ALICE,
          rkey: "down",
          cleared: false,
          active: true,
          replayed: 2000,
          complete: false
        })

        expect(yield* withDb(statuses)).toEqual([{ status: "dead_letter", n: 1000 }, { status: "pending", n: 2000 }])

        // no more are let in: the rest are taken, and nothing is said of a bound
        yield* withDb((sql) => sql.unsafe("DROP TRIGGER test_late_parked ON outbox"))
        const rest = yield* cli(["webhooks", "resume", ALICE, "down", "--replay"], env)
        expect(rest.code, rest.stderr).toBe(0)
        expect(lines(rest.stdout)).toEqual([
          `${ALICE} down: was not gone or auto-disabled; state reset; replayed 1000 parked deliveries`
        ])
        expect(yield* withDb(statuses)).toEqual([{ status: "pending", n: 3000 }])
        const restJson = yield* cli(["webhooks", "resume", ALICE, "down", "--replay", "--json"], env)
        expect(JSON.parse(restJson.stdout)).toEqual({
          ownerDid: ALICE,
          rkey: "down",
          cleared: false,
          active: true,
          replayed: 0
        })
      }),
    180_000
  )
})
