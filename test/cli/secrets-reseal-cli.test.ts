/**
 * `firehook secrets reseal` run in-process (as operator-commands.test.ts runs the other secrets
 * subcommands): the key-retirement step of SPEC §1.3. With the new key current and the old one
 * previous it re-seals every secret (same token), prints the counts (in words or `--json`) and
 * exits 0; an envelope no configured key opens is counted, kept, and makes it exit 1. Never a token,
 * an envelope or a key on stdout or stderr.
 */
import { Command } from "@effect/cli"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import { secrets } from "../../src/cli/SecretsCommand.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { plc } from "../support/stack.js"
import { runInProcess } from "./inProcess.js"

const ALICE = plc(1)
const firehook = Command.make("firehook").pipe(Command.withSubcommands([secrets]))

describe("firehook secrets reseal (in-process)", () => {
  it.scopedLive(
    "old key previous → exit 0 and every secret under the new key; an unreadable envelope → exit 1, kept",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        const url = Redacted.value(db.url)
        const envelopes = SqlClient.SqlClient.pipe(
          Effect.flatMap((sql) =>
            sql<{ name: string; envelope: string }>`SELECT name, envelope FROM secrets ORDER BY name`
          ),
          Effect.provide(Database.layerUrl(db.url)),
          Effect.orDie
        )
        const [a, b, c] = [0, 1, 2].map(() => randomBytes(32).toString("hex")) as [string, string, string]
        const run = (args: ReadonlyArray<string>, env: Record<string, string>) =>
          runInProcess(firehook, ["secrets", ...args], { DATABASE_URL: url, ...env })
        const given = "T".repeat(40)
        expect((yield* run(["create", ALICE, "main", "--token", given], { WEBHOOK_SECRET_ENCRYPTION_KEY: a })).code)
          .toBe(0)
        const sealedA = yield* envelopes

        const moved = yield* run(["reseal", "--json"], {
          WEBHOOK_SECRET_ENCRYPTION_KEY: b,
          WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: a
        })
        expect(moved.code, moved.line).toBe(0)
        expect(JSON.parse(moved.stdout)).toEqual({ resealed: 1, unreadable: 0, skipped: 0, complete: true })
        const sealedB = yield* envelopes
        expect(sealedB[0]?.envelope).not.toBe(sealedA[0]?.envelope)

        // A retired: nothing left to do, in words
        const again = yield* run(["reseal"], { WEBHOOK_SECRET_ENCRYPTION_KEY: b })
        expect(again).toEqual({
          code: 0,
          line: "",
          stdout: "resealed 0, unreadable 0, skipped (changed meanwhile) 0\n",
          stderr: ""
        })

        // the operator dropped B too early: counted, kept, exit 1
        const lost = yield* run(["reseal", "--json"], { WEBHOOK_SECRET_ENCRYPTION_KEY: c })
        expect(lost.code).toBe(1)
        expect(JSON.parse(lost.stdout)).toEqual({ resealed: 0, unreadable: 1, skipped: 0, complete: true })
        expect(lost.line).toMatch(/^1 envelope\(s\) open with no configured key/)
        expect(yield* envelopes).toEqual(sealedB)
        for (const r of [moved, again, lost]) {
          for (const secret of [given, a, b, c, sealedA[0]?.envelope ?? "", sealedB[0]?.envelope ?? ""]) {
            expect(`${r.stdout}${r.stderr}${r.line}`).not.toContain(secret)
          }
        }
        // without a current key: refused, nothing changed
        const noKey = yield* run(["reseal"], { WEBHOOK_SECRET_ENCRYPTION_PREVIOUS_KEYS: b })
        expect(noKey.code).toBe(1)
        expect(noKey.line).toContain("WEBHOOK_SECRET_ENCRYPTION_KEY")
        expect(yield* envelopes).toEqual(sealedB)
      }),
    { timeout: 60_000 }
  )
})
