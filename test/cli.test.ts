/**
 * The operator CLI as operators run it: `bun src/cli.ts …` as a child process, configured from the
 * environment, against a fresh PostgreSQL database. Exit codes (0 / 1 operational / 2 arguments),
 * one-line errors, the token printed once and alone, replay counts, JSON output, hidden URLs.
 */
import { SqlClient } from "@effect/sql"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import * as App from "../src/layers/App.js"
import * as Config from "../src/services/Config.js"
import * as Database from "../src/services/Database.js"
import { Processor } from "../src/services/Processor.js"
import * as Db from "./support/db.js"
import { type CliResult, runCli } from "./support/proc.js"
import { ev, plc, rev, testConfig, whEv, whRecordValue } from "./support/stack.js"

const ALICE = plc(1)
const BOB = plc(2)
const CAROL = plc(3)
const POST = "app.bsky.feed.post"
const KEY = randomBytes(32).toString("base64")

type Result = CliResult

const cli = (args: ReadonlyArray<string>, env: Record<string, string>): Effect.Effect<Result> =>
  Effect.promise(() => runCli(args, env))

const lines = (s: string) => s.split("\n").filter((l) => l.length > 0)

/** One line on stderr, nothing on stdout. */
const expectOneLineError = (r: Result, code: number) => {
  expect(r.code, r.stderr).toBe(code)
  expect(r.stdout).toBe("")
  expect(lines(r.stderr)).toHaveLength(1)
  expect(r.stderr).toMatch(/^firehook: \S/)
}

/** The matching pipeline on the database at `url` (to make outbox rows with the real processor). */
const seedLayer = (url: Redacted.Redacted<string>) =>
  App.matchingLayer.pipe(Layer.provideMerge(Layer.mergeAll(Database.layerUrl(url), Config.layerValue(testConfig()))))

describe("firehook CLI", () => {
  it.live("invalid arguments: exit 2, one line on stderr, nothing on stdout, no database touched", () =>
    Effect.gen(function* () {
      // an unreachable database: argument errors must be reported before any connection attempt
      const env = { DATABASE_URL: "postgres://firehook@127.0.0.1:1/none" }
      const cases: ReadonlyArray<ReadonlyArray<string>> = [
        ["deliveries", "list", "--limit", "abc"],
        ["deliveries", "list", "--limit", "5000"],
        ["deliveries", "list", "--since", "yesterday"],
        ["deliveries", "list", "--owner", "alice.bsky.social"],
        ["deliveries", "replay", "--status", "pending"],
        ["deliveries", "replay", "--owner", ALICE],
        ["deliveries", "show"],
        ["secrets", "create", "not-a-did", "main"],
        ["secrets", "create", ALICE, "bad/name"],
        ["secrets", "create", ALICE, "main", "--token", "short"],
        ["nosuchcommand"],
        []
      ]
      const results = yield* Effect.forEach(cases, (args) => cli(args, env), { concurrency: 4 })
      results.forEach((r) => expectOneLineError(r, 2))
      // a token given by mistake is never echoed back
      const token = `tok_${randomBytes(24).toString("hex")}`
      const echoed = yield* cli(["secrets", "create", ALICE, "main", token], env)
      expectOneLineError(echoed, 2)
      expect(echoed.stderr).not.toContain(token)
      const badToken = yield* cli(["secrets", "create", ALICE, "main", "--token", `${token} with spaces`], env)
      expectOneLineError(badToken, 2)
      expect(badToken.stderr).not.toContain(token)
    }), { timeout: 60_000 })

  it.live("an unreachable database is an operational failure: exit 1, one line", () =>
    Effect.gen(function* () {
      const r = yield* cli(["status"], { DATABASE_URL: "postgres://firehook:pw@127.0.0.1:1/none" })
      expectOneLineError(r, 1)
      expect(r.stderr).not.toContain("pw@")
    }), { timeout: 60_000 })

  it.scopedLive("secrets, replay, list, show, redeliver and status against a fresh database", () =>
    Effect.gen(function* () {
      const db = yield* Db.freshDatabase
      const env = { DATABASE_URL: Redacted.value(db.url), WEBHOOK_SECRET_ENCRYPTION_KEY: KEY }

      // --- secrets: the token once, alone on stdout
      const created = yield* cli(["secrets", "create", ALICE, "main"], env)
      expect(created.code, created.stderr).toBe(0)
      expect(created.stderr).toBe("")
      expect(lines(created.stdout)).toHaveLength(1)
      const token = created.stdout.trim()
      expect(token).toMatch(/^whsec_[A-Za-z0-9+/]{43}=$/)
      expect(created.stdout).toBe(`${token}\n`)
      const again = yield* cli(["secrets", "create", ALICE, "main"], env)
      expectOneLineError(again, 1)
      const noKey = yield* cli(["secrets", "create", ALICE, "other"], { DATABASE_URL: env.DATABASE_URL })
      expectOneLineError(noKey, 1)
      expect(noKey.stderr).toContain("WEBHOOK_SECRET_ENCRYPTION_KEY")
      const given = "G".repeat(40)
      const rotated = yield* cli(["secrets", "rotate", ALICE, "main", "--token", given], env)
      expect(rotated.code).toBe(0)
      expect(rotated.stdout).toBe(`${given}\n`)
      const listed = yield* cli(["secrets", "list", ALICE, "--json"], env)
      expect(listed.code).toBe(0)
      const secrets = JSON.parse(listed.stdout) as Array<{ name: string; createdAt: string; rotatedAt: string | null }>
      expect(secrets.map((s) => s.name)).toEqual(["main"])
      expect(secrets[0]?.rotatedAt).not.toBeNull()
      expect(listed.stdout).not.toContain(token)
      expect(listed.stdout).not.toContain(given)
      const table = yield* cli(["secrets", "list", ALICE], env)
      expect(lines(table.stdout)[0]).toMatch(/^NAME\s+CREATED\s+ROTATED$/)
      expect((yield* cli(["secrets", "delete", ALICE, "main"], env)).code).toBe(0)
      expectOneLineError(yield* cli(["secrets", "delete", ALICE, "main"], env), 1)

      // --- outbox rows through the real processor, then dead-lettered
      yield* Effect.gen(function* () {
        const processor = yield* Processor
        yield* processor.processEvents(
          [
            whEv(ALICE, "w1", whRecordValue(`at://${BOB}`, { url: "https://alice.example/hook" }), { rev: rev(1) }),
            whEv(CAROL, "w2", whRecordValue(`at://${BOB}`, { url: "https://carol.example/hook" }), { rev: rev(1) })
          ],
          { registryWriter: true }
        )
        const r = yield* processor.processEvents(
          [ev(BOB, POST, "p1", { rev: rev(10) }), ev(BOB, POST, "p2", { rev: rev(11) })],
          { registryWriter: true }
        )
        expect(r.inserted).toBe(4)
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE outbox SET status = 'dead_letter', attempt_count = 12, last_error_kind = 'http_5xx',
                     last_http_status = 503, finished_at = now()`
      }).pipe(Effect.provide(seedLayer(db.url)), Effect.scoped)

      // --- replay: the count, and only the owner's rows
      const replay = yield* cli(["deliveries", "replay", "--status", "dead_letter", "--owner", ALICE], env)
      expect(replay.code, replay.stderr).toBe(0)
      expect(replay.stdout).toBe("replayed 2 dead-lettered deliveries\n")
      const replayJson = yield* cli(["deliveries", "replay", "--status", "dead_letter", "--owner", CAROL, "--since", "1h", "--json"], env)
      expect(replayJson.code).toBe(0)
      expect(JSON.parse(replayJson.stdout)).toEqual({ replayed: 2 })
      expect(JSON.parse((yield* cli(["deliveries", "replay", "--status", "dead_letter", "--json"], env)).stdout)).toEqual({ replayed: 0 })

      // --- status --json parses and counts
      const status = yield* cli(["status", "--json"], env)
      expect(status.code, status.stderr).toBe(0)
      const summary = JSON.parse(status.stdout) as { deliveries: Record<string, number>; webhooks: Record<string, number> }
      expect(summary.deliveries).toMatchObject({ pending: 4, dead_letter: 0 })
      expect(summary.webhooks).toMatchObject({ active: 2 })
      const human = yield* cli(["status"], env)
      expect(human.code).toBe(0)
      expect(human.stdout).toContain("pending 4")

      // --- list: URLs hidden unless --show-urls
      const list = yield* cli(["deliveries", "list", "--owner", ALICE], env)
      expect(list.code).toBe(0)
      expect(lines(list.stdout)).toHaveLength(3)
      expect(lines(list.stdout)[0]).toMatch(/^DELIVERY\s+STATUS\s+ATTEMPTS/)
      expect(list.stdout).not.toContain("alice.example")
      const listJson = JSON.parse((yield* cli(["deliveries", "list", "--json"], env)).stdout) as Array<{
        deliveryId: string
        targetUrl: string
        status: string
        attemptCount: number
      }>
      expect(listJson).toHaveLength(4)
      expect(listJson.every((d) => d.targetUrl === "[redacted]" && d.status === "pending" && d.attemptCount === 0)).toBe(true)
      const withUrls = yield* cli(["deliveries", "list", "--owner", ALICE, "--show-urls"], env)
      expect(withUrls.stdout).toContain("https://alice.example/hook")

      // --- show and redeliver
      const id = listJson[0]?.deliveryId ?? ""
      const show = yield* cli(["deliveries", "show", id], env)
      expect(show.code).toBe(0)
      expect(show.stdout).toContain(id)
      expect(show.stdout).toContain("[redacted]")
      expect(show.stdout).toContain("no attempts")
      const showJson = JSON.parse((yield* cli(["deliveries", "show", id, "--json"], env)).stdout) as {
        delivery: { deliveryId: string }
        attempts: Array<unknown>
      }
      expect(showJson.delivery.deliveryId).toBe(id)
      expect(showJson.attempts).toEqual([])
      expectOneLineError(yield* cli(["deliveries", "show", "whd_v1_missing"], env), 1)
      const redeliver = yield* cli(["deliveries", "redeliver", id], env)
      expect(redeliver.code).toBe(0)
      expect(redeliver.stdout).toContain(id)
      expectOneLineError(yield* cli(["deliveries", "redeliver", "whd_v1_missing"], env), 1)
    }), { timeout: 120_000 })
})
