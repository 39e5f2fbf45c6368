/**
 * `firehook secrets reseal` goes past a pass's bound: it runs passes back to back, each from where
 * the last stopped, until one reaches the end of the table, and prints the sums. Before, one run was
 * one pass from the first row, and "run it again" began at the first row again: with 100,000
 * (MAX_RESEAL_PAGES × RESEAL_PAGE_SIZE) envelopes no key opens ahead of a readable one, every run
 * printed `resealed 0` and `complete: false`, and the readable secret stayed under the old key.
 */
import { Command } from "@effect/cli"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Either, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { secrets } from "../../src/cli/SecretsCommand.js"
import * as SecretBox from "../../src/services/delivery/SecretBox.js"
import { MAX_RESEAL_PAGES, RESEAL_PAGE_SIZE } from "../../src/services/delivery/Secrets.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { runInProcess } from "./inProcess.js"

const firehook = Command.make("firehook").pipe(Command.withSubcommands([secrets]))
const LIVE_OWNER = "did:plc:zzzzzzzzzzzzzzzzzzzzzzzz"

describe("firehook secrets reseal: passes continue where the last stopped (in-process)", () => {
  it.scopedLive(
    "a readable secret after 100,000 unreadable envelopes is re-sealed in one run; the counts are the sums",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        const url = Redacted.value(db.url)
        const withDb = <A>(eff: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
          eff.pipe(Effect.provide(Database.layerUrl(db.url)), Effect.orDie)
        const [a, b] = [0, 1].map(() => randomBytes(32).toString("hex")) as [string, string]
        const run = (args: ReadonlyArray<string>, env: Record<string, string>) =>
          runInProcess(firehook, ["secrets", ...args], { DATABASE_URL: url, ...env })
        const given = "L".repeat(40)
        // the live secret under A (this run also migrates the fresh database)
        const created = yield* run(["create", LIVE_OWNER, "live", "--token", given], {
          WEBHOOK_SECRET_ENCRYPTION_KEY: a
        })
        expect(created.code, created.line).toBe(0)
        // one pass's worth of envelopes under a key nobody has any more, sorting before it
        const n = MAX_RESEAL_PAGES * RESEAL_PAGE_SIZE
        const dead = Either.getOrThrow(
          SecretBox.sealRandom(
            Either.getOrThrow(SecretBox.makeKeyring(Uint8Array.from(randomBytes(32)), [])),
            "x".repeat(40)
          )
        )
        yield* withDb(Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql`
            INSERT INTO secrets (owner_did, name, envelope)
            SELECT 'did:plc:aaaaaaaaaaaaaaaaaaaa' || lpad(to_hex(i / 1000), 4, '0'), 'n' || lpad((i % 1000)::text, 4, '0'), ${dead}
            FROM generate_series(0, ${n - 1}) AS i`))
        const live = withDb(Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql<{ envelope: string }>`SELECT envelope FROM secrets WHERE owner_did = ${LIVE_OWNER} AND name = 'live'`
            .pipe(
              Effect.map((rows) =>
                rows[0]?.envelope.split(".")[1]
              )
            )))
        const keyIdOf = (hex: string) =>
          SecretBox.keyId(Uint8Array.from(Buffer.from(hex, "hex")))
        expect(yield* live).toBe(keyIdOf(a))

        const moved = yield* run(["reseal", "--json"], {
          WEBHOOK_SECRET_ENCRYPTION_KEY: b,
          WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: a
        })
        // the unreadable envelopes still make it exit 1 (keep their key), but it got past them
        expect(moved.code).toBe(1)
        expect(moved.line).toMatch(/^100000 envelope\(s\) open with no configured key/)
        expect(JSON.parse(moved.stdout)).toEqual({ resealed: 1, unreadable: n, skipped: 0, complete: true })
        expect(yield* live, "the live secret is still under the key being retired").toBe(keyIdOf(b))

        // in words, the same sums over both passes; nothing left under A
        const again = yield* run(["reseal"], { WEBHOOK_SECRET_ENCRYPTION_KEY: b })
        expect(again.code).toBe(1)
        expect(again.stdout).toBe(`resealed 0, unreadable ${n}, skipped (changed meanwhile) 0\n`)
        for (const r of [created, moved, again]) {
          for (const secret of [a, b, dead, LIVE_OWNER]) {
            expect(`${r.stdout}${r.stderr}${r.line}`).not.toContain(secret)
          }
        }
      }),
    { timeout: 120_000 }
  )
})
