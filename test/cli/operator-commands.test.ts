/**
 * `firehook secrets | owners | webhooks | status` run in-process (the commands of `src/cli/*Command.ts`
 * through @effect/cli, a failure described as `main.ts` describes it: code 2 for invalid arguments, 1
 * for an operation that could not be done), with what they write to stdout and stderr captured.
 * Faster than spawning the CLI (cli.test.ts, owners-cli.test.ts, webhooks-cli.test.ts do that), for
 * the argument checks, the messages and the JSON fields (SPEC §4.8, README "Operator CLI").
 */
import { Command } from "@effect/cli"
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Redacted, TestClock } from "effect"
import { randomBytes } from "node:crypto"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { owners } from "../../src/cli/OwnersCommand.js"
import { secrets } from "../../src/cli/SecretsCommand.js"
import { status } from "../../src/cli/StatusCommand.js"
import { webhooks } from "../../src/cli/WebhooksCommand.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { plc } from "../support/stack.js"
import { insertDelivery, insertWebhook } from "../support/webhookRows.js"
import { type InProcessRun, runInProcess } from "./inProcess.js"

/** Nothing listens there: a command that gets past its argument checks fails to connect (code 1). */
const UNREACHABLE = "postgres://firehook@127.0.0.1:1/none"
const KEY = randomBytes(32).toString("hex")
const ALICE = plc(1)

type Run = InProcessRun

const firehook = Command.make("firehook").pipe(Command.withSubcommands([secrets, owners, webhooks, status]))

/** `firehook <args>` with the environment `env` (DATABASE_URL unreachable unless given). */
const run = (args: ReadonlyArray<string>, env: Readonly<Record<string, string>> = {}): Effect.Effect<Run> =>
  runInProcess(firehook, args, { DATABASE_URL: UNREACHABLE, ...env })

const expectUsage = (r: Run, line: string) => {
  expect(r, line).toEqual({ code: 2, line, stdout: "", stderr: "" })
}

const expectConnectAttempt = (r: Run) => {
  expect(r.code, r.line).toBe(1)
  expect(r.line).toMatch(/^database: could not connect/)
}

/** Code 0, `stdout` exactly, nothing on stderr. */
const expectOut = (r: Run, stdout: string) => {
  expect(r, stdout).toEqual({ code: 0, line: "", stdout, stderr: "" })
}

const json = (r: Run): unknown => {
  expect(r.code, r.line).toBe(0)
  return JSON.parse(r.stdout)
}

/** A fresh database, its URL, and `sql` on it. */
const freshDb = Effect.gen(function*() {
  const db = yield* Db.freshDatabase
  const exec = <A>(f: Effect.Effect<A, unknown, SqlClient.SqlClient>) =>
    f.pipe(Effect.provide(Database.layerUrl(db.url)), Effect.orDie)
  return { url: Redacted.value(db.url), exec }
})

const DID_ERROR = "invalid <did>: must be a canonical DID (did:plc:… or did:web:…)"

describe("firehook secrets, owners, webhooks (in-process)", () => {
  it.live(
    "argument errors: code 2 and one line before any database connection, in every subcommand",
    () =>
      Effect.gen(function*() {
        for (
          const args of [
            ["secrets", "create", "alice.test", "main"],
            ["secrets", "rotate", "alice.test", "main"],
            ["secrets", "delete", "alice.test", "main"],
            ["secrets", "list", "alice.test"],
            ["owners", "add", "alice.test"],
            ["owners", "reconcile", "alice.test"],
            ["webhooks", "resume", "alice.test", "w1"]
          ]
        ) expectUsage(yield* run(args), DID_ERROR)
        const name = "invalid <name>: must match ^[A-Za-z0-9._-]{1,64}$"
        expectUsage(yield* run(["secrets", "rotate", ALICE, "a/b"]), name)
        expectUsage(yield* run(["secrets", "delete", ALICE, "a/b"]), name)
        expectUsage(yield* run(["secrets", "create", ALICE, "n".repeat(65)]), name)
        expectConnectAttempt(yield* run(["secrets", "delete", ALICE, "n".repeat(64)]))
        const token = "invalid --token: must be 32-256 printable ASCII characters without whitespace"
        expectUsage(yield* run(["secrets", "rotate", ALICE, "main", "--token", "t".repeat(31)]), token)
        expectUsage(yield* run(["secrets", "create", ALICE, "main", "--token", "t".repeat(257)]), token)
        expectConnectAttempt(yield* run(["secrets", "create", ALICE, "main", "--token", "t".repeat(32)]))
        expectConnectAttempt(yield* run(["secrets", "rotate", ALICE, "main", "--token", "t".repeat(256)]))
        expectUsage(yield* run(["webhooks", "resume", ALICE, "a/b"]), "invalid <rkey>: must be a record key")
        const limit = "invalid --limit: must be in 1..1000"
        expectUsage(yield* run(["owners", "status", "--limit", "0"]), limit)
        expectUsage(yield* run(["owners", "status", "--limit", "1001"]), limit)
        expectConnectAttempt(yield* run(["owners", "status", "--limit", "1"]))
        expectConnectAttempt(yield* run(["owners", "status", "--limit", "1000"]))
        expectUsage(yield* run(["secrets"]), "missing subcommand: create, rotate, delete, list or reseal")
        expectUsage(yield* run(["owners"]), "missing subcommand: add, reconcile or status")
        expectUsage(yield* run(["webhooks"]), "missing subcommand: resume")
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "secrets: the token alone on stdout; list and delete, in words and in JSON",
    () =>
      Effect.gen(function*() {
        const { url } = yield* freshDb
        const env = { DATABASE_URL: url, WEBHOOK_SECRET_ENCRYPTION_KEY: KEY }
        expectOut(yield* run(["secrets", "list", ALICE], env), "no secrets\n")
        expect(json(yield* run(["secrets", "list", ALICE, "--json"], env))).toEqual([])

        const given = "A".repeat(40)
        expectOut(yield* run(["secrets", "create", ALICE, "main", "--token", given], env), `${given}\n`)
        const listed = json(yield* run(["secrets", "list", ALICE, "--json"], env)) as Array<Record<string, unknown>>
        expect(listed).toEqual([{ name: "main", createdAt: expect.any(String), rotatedAt: null }])
        const created = listed[0]?.["createdAt"]
        const table = yield* run(["secrets", "list", ALICE], env)
        expectOut(table, `NAME  CREATED${" ".repeat(19)}ROTATED\nmain  ${String(created)}  -\n`)

        const rotated = yield* run(["secrets", "rotate", ALICE, "main"], env)
        expect(rotated.code, rotated.line).toBe(0)
        expect(rotated.stdout).toMatch(/^whsec_[A-Za-z0-9+/]{43}=\n$/)
        const after = json(yield* run(["secrets", "list", ALICE, "--json"], env)) as Array<Record<string, unknown>>
        const rotatedAt = after[0]?.["rotatedAt"]
        expect(typeof rotatedAt).toBe("string")
        expect(rotatedAt).not.toBe(created)
        expect((yield* run(["secrets", "list", ALICE], env)).stdout).toContain(
          `main  ${String(created)}  ${String(rotatedAt)}\n`
        )

        expectOut(yield* run(["secrets", "delete", ALICE, "main"], env), "deleted secret main\n")
        const missing = yield* run(["secrets", "delete", ALICE, "main"], env)
        expect(missing).toEqual({ code: 1, line: "no such secret", stdout: "", stderr: "" })
        expectOut(yield* run(["secrets", "create", ALICE, "other", "--token", given], env), `${given}\n`)
        expect(json(yield* run(["secrets", "delete", ALICE, "other", "--json"], env))).toEqual({ deleted: true })
        expect((yield* run(["secrets", "delete", ALICE, "other", "--json"], env)).code).toBe(1)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "owners add and status: the messages, the JSON, --limit and its default of 20",
    () =>
      Effect.gen(function*() {
        const { exec, url } = yield* freshDb
        const env = { DATABASE_URL: url }
        expectOut(yield* run(["owners", "add", ALICE], env), `added ${ALICE} (reconciled by every backfill pass)\n`)
        expect(json(yield* run(["owners", "add", plc(2), "--json"], env))).toEqual({ did: plc(2), added: true })
        expectOut(
          yield* run(["owners", "status"], env),
          "owners    unknown 2  scanning 0  complete 0  failed 0\nbackfill  no pass yet\n"
        )

        // 25 failed owners (the oldest failure first) and 2 scanning
        yield* exec(Effect.flatMap(SqlClient.SqlClient, (sql) =>
          Effect.gen(function*() {
            yield* sql`
            INSERT INTO owners (did, reconcile_status, failed_at, failure_count, last_failure_kind)
            SELECT 'did:plc:failed' || lpad(g::text, 20, '0'), 'failed',
              timestamptz '2026-01-01T00:00:00Z' + g * interval '1 minute', g, 'pds_unreachable'
            FROM generate_series(1, 25) g`
            yield* sql`
            INSERT INTO owners (did, reconcile_status, scan_started_at)
            SELECT 'did:plc:scanning' || lpad(g::text, 18, '0'), 'scanning',
              timestamptz '2026-01-02T00:00:00Z' + g * interval '1 minute'
            FROM generate_series(1, 2) g`
          })))
        interface Summary {
          readonly counts: Record<string, number>
          readonly failed: ReadonlyArray<Record<string, unknown>>
          readonly scanning: ReadonlyArray<Record<string, unknown>>
          readonly backfill: unknown
        }
        const byDefault = json(yield* run(["owners", "status", "--json"], env)) as Summary
        expect(byDefault.counts).toEqual({ unknown: 2, scanning: 2, complete: 0, failed: 25 })
        expect(byDefault.failed).toHaveLength(20)
        expect(byDefault.failed[0]).toEqual({
          did: expect.stringMatching(/^did:plc:failed0+\d+$/),
          failureCount: expect.any(Number),
          lastFailureKind: "pds_unreachable",
          failedAt: expect.stringMatching(/^2026-01-01T00:\d\d:00\.000Z$/)
        })
        expect(byDefault.scanning).toEqual([
          { did: `did:plc:scanning${"0".repeat(17)}1`, scanStartedAt: "2026-01-02T00:01:00.000Z" },
          { did: `did:plc:scanning${"0".repeat(17)}2`, scanStartedAt: "2026-01-02T00:02:00.000Z" }
        ])
        expect(byDefault.backfill).toBeNull()
        const one = json(yield* run(["owners", "status", "--limit", "1", "--json"], env)) as Summary
        expect([one.failed.length, one.scanning.length]).toEqual([1, 1])
        const all = json(yield* run(["owners", "status", "--limit", "1000", "--json"], env)) as Summary
        expect(all.failed).toHaveLength(25)

        const human = yield* run(["owners", "status", "--limit", "1"], env)
        expect(human.code, human.line).toBe(0)
        const lines = human.stdout.split("\n")
        expect(lines.slice(0, 3)).toEqual([
          "owners    unknown 2  scanning 2  complete 0  failed 25",
          "backfill  no pass yet",
          ""
        ])
        expect(lines[3]).toMatch(/^FAILED OWNER\s+FAILURES\s+LAST KIND\s+FAILED AT$/)
        expect(lines[4]).toMatch(/^did:plc:failed0+\d+\s+\d+\s+pds_unreachable\s+2026-01-01T00:\d\d:00\.000Z$/)
        expect(lines.slice(5)).toEqual([
          "",
          `${"SCANNING OWNER".padEnd(34)}  STARTED`,
          `did:plc:scanning${"0".repeat(17)}1  2026-01-02T00:01:00.000Z`,
          ""
        ])
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "webhooks resume: the message says what was cleared and replayed (one delivery, deliveries) and a disabled record; --json's fields",
    () =>
      Effect.gen(function*() {
        const { exec, url } = yield* freshDb
        const env = { DATABASE_URL: url }
        yield* exec(Effect.gen(function*() {
          yield* insertWebhook(ALICE, "one", { state: { auto_disabled_at: "now()" } })
          yield* insertDelivery(ALICE, "one", "p1", { status: "dead_letter", errorKind: "webhook_disabled" })
          yield* insertWebhook(ALICE, "two", { state: { gone_at: "now()" } })
          yield* insertDelivery(ALICE, "two", "q1", { status: "dead_letter", errorKind: "webhook_disabled" })
          yield* insertDelivery(ALICE, "two", "q2", { status: "dead_letter", errorKind: "webhook_disabled" })
          yield* insertWebhook(ALICE, "off", { enabled: false, state: { gone_at: "now()" } })
          yield* insertDelivery(ALICE, "off", "r1", { status: "dead_letter", errorKind: "webhook_disabled" })
          yield* insertWebhook(ALICE, "fine")
        }))
        expectOut(
          yield* run(["webhooks", "resume", ALICE, "one", "--replay"], env),
          `${ALICE} one: resumed; replayed 1 parked delivery\n`
        )
        expectOut(
          yield* run(["webhooks", "resume", ALICE, "two", "--replay"], env),
          `${ALICE} two: resumed; replayed 2 parked deliveries\n`
        )
        // without --replay the parked row stays parked
        expectOut(
          yield* run(["webhooks", "resume", ALICE, "off"], env),
          `${ALICE} off: resumed (note: the record itself is disabled or inactive)\n`
        )
        const parked = yield* exec(Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql<{ status: string }>`SELECT status FROM outbox WHERE delivery_id = 'r1'`))
        expect(parked).toEqual([{ status: "dead_letter" }])
        expectOut(
          yield* run(["webhooks", "resume", ALICE, "fine"], env),
          `${ALICE} fine: was not gone or auto-disabled; state reset\n`
        )
        // --replay with nothing parked: said all the same
        expectOut(
          yield* run(["webhooks", "resume", ALICE, "fine", "--replay"], env),
          `${ALICE} fine: was not gone or auto-disabled; state reset; replayed 0 parked deliveries\n`
        )
        expect(json(yield* run(["webhooks", "resume", ALICE, "off", "--json"], env))).toEqual({
          ownerDid: ALICE,
          rkey: "off",
          cleared: false,
          active: false,
          replayed: 0
        })
        expect(yield* run(["webhooks", "resume", ALICE, "nope"], env)).toEqual({
          code: 1,
          line: "no such webhook",
          stdout: "",
          stderr: ""
        })
      }),
    { timeout: 60_000 }
  )
})

/** A loopback server answering every request with `answer`, for the test's scope. */
const server = (answer: (res: Http.ServerResponse) => void) =>
  Effect.acquireRelease(
    Effect.async<Http.Server & { readonly port: number }>((resume) => {
      const s = Http.createServer((_req, res) => answer(res))
      s.listen(0, "127.0.0.1", () =>
        resume(Effect.succeed(Object.assign(s, { port: (s.address() as AddressInfo).port }))))
    }),
    (s) =>
      Effect.async<void>((resume) => {
        s.closeAllConnections()
        s.close(() =>
          resume(Effect.void)
        )
      })
  )

const answerJson = (status: number, body: string) => (res: Http.ServerResponse) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(body)
}

describe("firehook status (in-process)", () => {
  it.scopedLive(
    "the database counts in words; the service asked on loopback for a wildcard address",
    () =>
      Effect.gen(function*() {
        const { exec, url } = yield* freshDb
        // one secret, one webhook, two pending deliveries of which one is due
        const created = yield* run(["secrets", "create", ALICE, "main"], {
          DATABASE_URL: url,
          WEBHOOK_SECRET_ENCRYPTION_KEY: KEY
        })
        expect(created.code, created.line).toBe(0)
        yield* exec(Effect.gen(function*() {
          yield* insertWebhook(ALICE, "w1")
          yield* insertDelivery(ALICE, "w1", "d1", { status: "pending" })
          yield* insertDelivery(ALICE, "w1", "d2", { status: "pending" })
          const sql = yield* SqlClient.SqlClient
          yield* sql`UPDATE outbox SET next_attempt_at = now() + interval '1 hour' WHERE delivery_id = 'd2'`
        }))
        const health = yield* server(answerJson(200, JSON.stringify({ status: "ok", phase: "live" })))
        const human = yield* run(["status"], {
          DATABASE_URL: url,
          HEALTH_HOST: "0.0.0.0",
          HEALTH_PORT: String(health.port)
        })
        expectOut(
          human,
          [
            `service     127.0.0.1:${health.port}  status ok  ready yes  phase live`,
            "",
            "deliveries  pending 2 (due 1)  leased 0  delivered 0  dead_letter 0  cancelled 0",
            "webhooks    active 1  total 1  gone 0  autoDisabled 0",
            "owners      unknown 0  scanning 0  complete 0  failed 0",
            "quarantine  0",
            "secrets     1",
            ""
          ].join("\n")
        )
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "an unreachable database: the service's answer all the same (its lines; --json: its object), then exit 1",
    () =>
      Effect.gen(function*() {
        const health = yield* server(answerJson(503, JSON.stringify({ status: "unavailable", phase: "live" })))
        const env = { HEALTH_HOST: "127.0.0.1", HEALTH_PORT: String(health.port) }
        const human = yield* run(["status"], env)
        expect(human.code).toBe(1)
        expect(human.line).toMatch(/^database: could not connect/)
        expect(human.stdout).toContain(`service     127.0.0.1:${health.port}  status unavailable  ready no`)
        const asJson = yield* run(["status", "--json"], env)
        expect(asJson.code).toBe(1)
        expect(asJson.line).toMatch(/^database: could not connect/)
        expect(JSON.parse(asJson.stdout)).toEqual({
          service: {
            reachable: true,
            address: `127.0.0.1:${health.port}`,
            httpStatus: 503,
            ready: false,
            health: { status: "unavailable", phase: "live" }
          }
        })
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "a body that is not a JSON object, over 256 KiB, or another status: not reachable",
    () =>
      Effect.gen(function*() {
        const { url } = yield* freshDb
        const serviceOf = (port: number) =>
          Effect.map(
            run(["status", "--json"], { DATABASE_URL: url, HEALTH_HOST: "127.0.0.1", HEALTH_PORT: String(port) }),
            (r) => (json(r) as { service: unknown }).service
          )
        const unreachable = (port: number) => ({ reachable: false, address: `127.0.0.1:${port}` })
        const big = (n: number) => JSON.stringify({ status: "ok", pad: "x".repeat(n) })
        const under = yield* server(answerJson(200, big(256 * 1024 - 40)))
        expect(yield* serviceOf(under.port)).toMatchObject({ reachable: true, httpStatus: 200, ready: true })
        // up but not ready: 503 with the body, reachable and not ready
        const starting = yield* server(answerJson(503, JSON.stringify({ status: "unavailable", phase: "starting" })))
        expect(yield* serviceOf(starting.port)).toEqual({
          reachable: true,
          address: `127.0.0.1:${starting.port}`,
          httpStatus: 503,
          ready: false,
          health: { status: "unavailable", phase: "starting" }
        })
        for (
          const answer of [
            answerJson(200, "[1, 2]"),
            answerJson(200, "\"ok\""),
            answerJson(200, "{not json"),
            answerJson(200, big(256 * 1024)),
            answerJson(500, JSON.stringify({ status: "ok" })),
            answerJson(302, JSON.stringify({ status: "ok" }))
          ]
        ) {
          const s = yield* server(answer)
          expect(yield* serviceOf(s.port)).toEqual(unreachable(s.port))
        }
      }),
    { timeout: 60_000 }
  )

  it.scoped(
    "a service that does not answer within 2 s: not reachable, the counts all the same",
    () =>
      Effect.gen(function*() {
        const { url } = yield* freshDb
        const asked = yield* Deferred.make<void>()
        const silent = yield* server(() => Deferred.unsafeDone(asked, Exit.void))
        const fiber = yield* Effect.fork(
          run(["status", "--json"], { DATABASE_URL: url, HEALTH_HOST: "127.0.0.1", HEALTH_PORT: String(silent.port) })
        )
        yield* Deferred.await(asked)
        yield* TestClock.adjust("2 seconds")
        const r = yield* Fiber.join(fiber)
        const parsed = json(r) as { service: unknown; deliveries: unknown }
        expect(parsed.service).toEqual({ reachable: false, address: `127.0.0.1:${silent.port}` })
        expect(parsed.deliveries).toMatchObject({ pending: 0 })
      }),
    { timeout: 60_000 }
  )
})
