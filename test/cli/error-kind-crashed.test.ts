/**
 * `--error-kind` takes every `last_error_kind` a row can have. A row whose request killed its
 * worker three times is dead-lettered `crashed` (docs/operations.md, Process tree; replayable once
 * the cause is fixed), and a row whose subscription changed is cancelled `subscription_changed`;
 * before 5 December 2026 `--error-kind crashed` was refused (exit 2), so those dead letters could
 * only be replayed with every other dead letter of their webhooks.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import * as Database from "../../src/services/platform/Database.js"
import { freePort, runCli } from "../support/proc.js"
import { ALICE, CAROL, seededDatabase } from "./cli-seed.js"

describe("firehook deliveries --error-kind", () => {
  it.scopedLive(
    "crashed dead letters are replayed; subscription_changed lists the cancelled rows",
    () =>
      Effect.gen(function*() {
        const db = yield* seededDatabase((sql) =>
          Effect.gen(function*() {
            yield* sql`UPDATE outbox SET status = 'dead_letter', finished_at = now(),
                         last_error_kind = 'crashed' WHERE owner_did = ${ALICE}`
            yield* sql`UPDATE outbox SET status = 'cancelled', finished_at = now(),
                         last_error_kind = 'subscription_changed' WHERE owner_did = ${CAROL}`
          })
        )
        const env = { DATABASE_URL: Redacted.value(db.url), HEALTH_PORT: String(yield* Effect.promise(freePort)) }
        const cli = (args: ReadonlyArray<string>) => Effect.promise(() => runCli(args, env))

        const cancelled = yield* cli(["deliveries", "list", "--error-kind", "subscription_changed", "--json"])
        expect(cancelled.code, cancelled.stderr).toBe(0)
        expect((JSON.parse(cancelled.stdout) as Array<{ ownerDid: string }>).map((r) => r.ownerDid)).toEqual([
          CAROL,
          CAROL
        ])

        const replay = yield* cli(["deliveries", "replay", "--status", "dead_letter", "--error-kind", "crashed"])
        expect(replay.code, replay.stderr).toBe(0)
        expect(replay.stdout).toBe("replayed 2 dead-lettered deliveries\n")
        const left = yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          return yield* sql<{ owner_did: string; status: string }>`
            SELECT owner_did, status FROM outbox ORDER BY owner_did, status`
        }).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.scoped)
        expect(left.map((r) => `${r.owner_did === ALICE ? "alice" : "carol"} ${r.status}`)).toEqual([
          "alice pending",
          "alice pending",
          "carol cancelled",
          "carol cancelled"
        ])
      }),
    { timeout: 60_000 }
  )
})
