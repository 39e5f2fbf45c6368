/**
 * `firehook webhooks resume <did> <rkey> [--replay]` as operators run it (`bun src/cli/main.ts` as a
 * child process against a fresh PostgreSQL database): clears auto-disabled and gone (SPEC §4.3),
 * replays the parked rows with their ids, exit codes (2 bad arguments, 1 no such webhook).
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { runCli } from "../support/proc.js"
import { plc } from "../support/stack.js"
import { insertDelivery, insertWebhook } from "../support/webhookRows.js"
import { lines } from "./cli-expect.js"

const ALICE = plc(1)
const BOB = plc(2)

const cli = (args: ReadonlyArray<string>, env: Record<string, string>) => Effect.promise(() => runCli(args, env))

describe("firehook webhooks resume", () => {
  it.scopedLive(
    "clears autoDisabled and gone; --replay replays the parked rows with their ids; exit codes",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        const env = { DATABASE_URL: Redacted.value(db.url) }
        yield* Effect.gen(function*() {
          yield* insertWebhook(ALICE, "down", {
            state: { auto_disabled_at: "now()", failing_since: "now() - interval '5 days'", failed_attempts: "30" }
          })
          yield* insertWebhook(ALICE, "gone", { state: { gone_at: "now()" } })
          yield* insertDelivery(ALICE, "down", "p1", { status: "dead_letter", errorKind: "webhook_disabled" })
          yield* insertDelivery(ALICE, "down", "p2", { status: "dead_letter", errorKind: "webhook_disabled" })
          yield* insertDelivery(ALICE, "down", "x1", { status: "dead_letter", errorKind: "http_4xx" })
        }).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.orDie)
        const read = <A>(f: (sql: SqlClient.SqlClient) => Effect.Effect<A, unknown>) =>
          Effect.flatMap(SqlClient.SqlClient, f).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.orDie)
        const state = {
          outbox: (sql: SqlClient.SqlClient) =>
            sql<{ delivery_id: string; status: string }>`SELECT delivery_id, status FROM outbox ORDER BY delivery_id`,
          webhooks: (sql: SqlClient.SqlClient) =>
            sql<{ rkey: string; auto: boolean; gone: boolean }>`
              SELECT rkey, auto_disabled_at IS NOT NULL AS auto, gone_at IS NOT NULL AS gone
              FROM webhooks ORDER BY rkey`
        }

        // bad arguments: exit 2, one line
        for (const args of [["webhooks", "resume", "not-a-did", "down"], ["webhooks", "resume", ALICE, "a/b"]]) {
          const bad = yield* cli(args, env)
          expect(bad.code, bad.stderr).toBe(2)
          expect(bad.stdout).toBe("")
          expect(lines(bad.stderr)).toHaveLength(1)
        }
        // another owner's rkey, an unknown rkey: exit 1, nothing changes
        for (const args of [["webhooks", "resume", BOB, "down"], ["webhooks", "resume", ALICE, "nope"]]) {
          const missing = yield* cli(args, env)
          expect(missing.code, missing.stderr).toBe(1)
          expect(missing.stderr).toBe("firehook: no such webhook\n")
        }
        expect(yield* read(state.webhooks)).toEqual([
          { rkey: "down", auto: true, gone: false },
          { rkey: "gone", auto: false, gone: true }
        ])

        const resumed = yield* cli(["webhooks", "resume", ALICE, "down", "--replay", "--json"], env)
        expect(resumed.code, resumed.stderr).toBe(0)
        expect(JSON.parse(resumed.stdout)).toEqual({
          ownerDid: ALICE,
          rkey: "down",
          cleared: true,
          active: true,
          replayed: 2
        })
        expect(yield* read(state.outbox)).toEqual([
          { delivery_id: "p1", status: "pending" },
          { delivery_id: "p2", status: "pending" },
          { delivery_id: "x1", status: "dead_letter" }
        ])

        const gone = yield* cli(["webhooks", "resume", ALICE, "gone"], env)
        expect(gone.code, gone.stderr).toBe(0)
        expect(gone.stdout).toBe(`${ALICE} gone: resumed\n`)
        expect(yield* read(state.webhooks)).toEqual([
          { rkey: "down", auto: false, gone: false },
          { rkey: "gone", auto: false, gone: false }
        ])
      }),
    180_000
  )
})
