/**
 * The operator CLI as operators run it: `bun src/cli/main.ts …` as a child process, configured from the
 * environment, against a fresh PostgreSQL database. Exit codes (0 / 1 operational / 2 arguments),
 * one-line errors, the token printed once and alone, replay counts, JSON output, hidden URLs.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Context, Effect, Fiber, Layer, Redacted } from "effect"
import { randomBytes } from "node:crypto"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Database from "../../src/services/platform/Database.js"
import * as Db from "../support/db.js"
import { eventually } from "../support/eventually.js"
import { type CliResult, freePort, runCli, spawnCli } from "../support/proc.js"
import { expectOneLineError, lines } from "./cli-expect.js"
import { ALICE, CAROL, seededDatabase, seedFourDeliveries, seedLayer } from "./cli-seed.js"

const KEY = randomBytes(32).toString("base64")

type Result = CliResult

const cli = (args: ReadonlyArray<string>, env: Record<string, string>): Effect.Effect<Result> =>
  Effect.promise(() => runCli(args, env))

/**
 * {@link seededDatabase}; the CLI's environment for it (nothing listens on its health port).
 */
const seededCliDatabase = <E>(adjust: (sql: SqlClient.SqlClient) => Effect.Effect<unknown, E>) =>
  Effect.gen(function*() {
    const db = yield* seededDatabase(adjust)
    const env = { DATABASE_URL: Redacted.value(db.url), HEALTH_PORT: String(yield* closedPort) }
    return { db, env }
  })

/** A local HTTP server answering `GET /health` with `body` (status 200 or 503), for the test's scope. */
const healthServer = (status: number, body: unknown) =>
  Effect.acquireRelease(
    Effect.async<Http.Server & { readonly port: number }>((resume) => {
      const server = Http.createServer((req, res) => {
        if (req.url === "/health") {
          res.writeHead(status, { "content-type": "application/json", "cache-control": "no-store" })
          res.end(JSON.stringify(body))
        } else {
          res.writeHead(404).end()
        }
      })
      server.listen(0, "127.0.0.1", () =>
        resume(Effect.succeed(Object.assign(server, { port: (server.address() as AddressInfo).port }))))
    }),
    (server) =>
      Effect.async<void>((resume) =>
        void server.close(() => resume(Effect.void))
      )
  )

/**
 * A loopback port nothing listens on: bindable a moment ago, below the kernel's ephemeral range
 * (freePort), where no other test's listener on port 0 can land while the CLI runs.
 */
const closedPort = Effect.promise(freePort)

describe("firehook CLI", () => {
  it.live(
    "invalid arguments: exit 2, one line on stderr, nothing on stdout, no database touched",
    () =>
      Effect.gen(function*() {
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
          // inverted or empty ranges of the enqueue time
          ["deliveries", "list", "--since", "2026-01-03", "--until", "2026-01-02"],
          ["deliveries", "list", "--since", "2026-01-02", "--until", "2026-01-02"],
          ["deliveries", "replay", "--status", "dead_letter", "--since", "1h", "--until", "2h"],
          // dates that do not exist (Date.parse would roll them over to the next day or month)
          ["deliveries", "list", "--since", "2026-02-30"],
          ["deliveries", "list", "--since", "2026-02-29T10:00:00Z"],
          ["deliveries", "replay", "--status", "dead_letter", "--until", "2026-04-31T12:00:00Z"],
          ["deliveries", "list", "--since", "2026-01-01T24:00Z"],
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
      }),
    { timeout: 60_000 }
  )

  it.live("an unreachable database is an operational failure: exit 1, one line", () =>
    Effect.gen(function*() {
      const r = yield* cli(["status"], { DATABASE_URL: "postgres://firehook:pw@127.0.0.1:1/none" })
      expectOneLineError(r, 1)
      expect(r.stderr).not.toContain("pw@")
      expect(r.stderr).toBe(
        "firehook: database: could not connect (ECONNREFUSED: nothing listens at that host and port)\n"
      )
    }), { timeout: 60_000 })

  it.live("a database the server does not have is said in words, never with the URL", () =>
    Effect.gen(function*() {
      const base = new URL(process.env["DATABASE_URL"] ?? "postgresql://postgres@127.0.0.1:5432/postgres")
      base.pathname = `/firehook_missing_${randomBytes(6).toString("hex")}`
      const missing = yield* cli(["deliveries", "list"], { DATABASE_URL: base.toString() })
      expectOneLineError(missing, 1)
      expect(missing.stderr).toBe(
        "firehook: database: could not connect (3D000: no database of that name on the server)\n"
      )
      expect(missing.stderr).not.toContain("firehook_missing_")
    }), { timeout: 60_000 })

  it.scopedLive(
    "secrets, replay, list, show, redeliver and status against a fresh database",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        // nothing listens on the health port: status prints the counts all the same
        const env = {
          DATABASE_URL: Redacted.value(db.url),
          WEBHOOK_SECRET_ENCRYPTION_KEY: KEY,
          HEALTH_PORT: String(yield* closedPort)
        }

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
        const secrets = JSON.parse(listed.stdout) as Array<
          { name: string; createdAt: string; rotatedAt: string | null }
        >
        expect(secrets.map((s) => s.name)).toEqual(["main"])
        expect(secrets[0]?.rotatedAt).not.toBeNull()
        expect(listed.stdout).not.toContain(token)
        expect(listed.stdout).not.toContain(given)
        const table = yield* cli(["secrets", "list", ALICE], env)
        expect(lines(table.stdout)[0]).toMatch(/^NAME\s+CREATED\s+ROTATED$/)
        expect((yield* cli(["secrets", "delete", ALICE, "main"], env)).code).toBe(0)
        expectOneLineError(yield* cli(["secrets", "delete", ALICE, "main"], env), 1)

        // --- outbox rows through the real processor, then dead-lettered
        yield* Effect.gen(function*() {
          yield* seedFourDeliveries
          const sql = yield* SqlClient.SqlClient
          yield* sql`UPDATE outbox SET status = 'dead_letter', attempt_count = 12, last_error_kind = 'http_5xx',
                     last_http_status = 503, finished_at = now()`
        }).pipe(Effect.provide(seedLayer(db.url)), Effect.scoped)

        // --- replay: the count, and only the owner's rows
        const replay = yield* cli(["deliveries", "replay", "--status", "dead_letter", "--owner", ALICE], env)
        expect(replay.code, replay.stderr).toBe(0)
        expect(replay.stdout).toBe("replayed 2 dead-lettered deliveries\n")
        const replayJson = yield* cli([
          "deliveries",
          "replay",
          "--status",
          "dead_letter",
          "--owner",
          CAROL,
          "--since",
          "1h",
          "--json"
        ], env)
        expect(replayJson.code).toBe(0)
        expect(JSON.parse(replayJson.stdout)).toEqual({ replayed: 2, inactiveSubscription: 0, complete: true })
        expect(JSON.parse((yield* cli(["deliveries", "replay", "--status", "dead_letter", "--json"], env)).stdout))
          .toEqual({
            replayed: 0,
            inactiveSubscription: 0,
            complete: true
          })

        // --- status --json parses and counts
        const status = yield* cli(["status", "--json"], env)
        expect(status.code, status.stderr).toBe(0)
        const summary = JSON.parse(status.stdout) as {
          deliveries: Record<string, number>
          webhooks: Record<string, number>
        }
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
        expect(listJson.every((d) => d.targetUrl === "[redacted]" && d.status === "pending" && d.attemptCount === 0))
          .toBe(true)
        // a JSON list cut at --limit: stdout is still the array, stderr says it was cut
        const cut = yield* cli(["deliveries", "list", "--json", "--limit", "3"], env)
        expect(JSON.parse(cut.stdout)).toHaveLength(3)
        expect(cut.stderr).toContain("3 rows: the limit")
        expect((yield* cli(["deliveries", "list", "--json", "--limit", "5"], env)).stderr).toBe("")
        // exactly --limit rows and none beyond: the list is complete, so nothing says it was cut
        expect((yield* cli(["deliveries", "list", "--json", "--limit", "4"], env)).stderr).toBe("")
        const exact = yield* cli(["deliveries", "list", "--limit", "4"], env)
        expect(lines(exact.stdout)).toHaveLength(5)
        expect(exact.stdout).not.toContain("the limit")
        const cutHuman = yield* cli(["deliveries", "list", "--limit", "3"], env)
        expect(lines(cutHuman.stdout)).toHaveLength(5)
        expect(lines(cutHuman.stdout)[4]).toMatch(/^\(3 rows: the limit; more exist/)
        expect((yield* cli(["deliveries", "list", "--json", "--limit", "1"], env)).stderr).toMatch(
          /^\(1 row: the limit; more exist: add --cursor \S+ for the next page\)\n$/
        )
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
          olderAttemptsNotShown: number
        }
        expect(showJson.delivery.deliveryId).toBe(id)
        expect(showJson.attempts).toEqual([])
        expect(showJson.olderAttemptsNotShown).toBe(0)
        expectOneLineError(yield* cli(["deliveries", "show", "whd_v1_missing"], env), 1)
        const redeliver = yield* cli(["deliveries", "redeliver", id], env)
        expect(redeliver.code).toBe(0)
        expect(redeliver.stdout).toContain(id)
        expectOneLineError(yield* cli(["deliveries", "redeliver", "whd_v1_missing"], env), 1)
      }),
    { timeout: 120_000 }
  )
})

describe("firehook CLI (operator defects)", () => {
  const HEALTH = {
    status: "ok",
    phase: "live",
    backfill: { running: true, passes: 2 },
    intake: {
      role: "leader",
      connected: true,
      progressing: true,
      queued: 3,
      streams: {
        direct: { connected: true, quarantined: false, failureKind: null, cursorAgeSeconds: 4, queued: 1 },
        registry: { connected: false, quarantined: false, failureKind: "network", cursorAgeSeconds: 97, queued: 2 }
      },
      admission: { rejectedTotal: 0 }
    },
    delivery: { pending: 5, leased: 1, deadLetter: 2, inFlight: 1, openCircuits: 0 },
    redis: { configured: true, connected: false, dropped: 7 }
  }

  it.scopedLive(
    "status: the service's /health when it answers (2 s timeout), 'not reachable' when nothing listens",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        const server = yield* healthServer(200, HEALTH)
        const env = { DATABASE_URL: Redacted.value(db.url), HEALTH_HOST: "127.0.0.1", HEALTH_PORT: String(server.port) }
        const human = yield* cli(["status"], env)
        expect(human.code, human.stderr).toBe(0)
        const out = lines(human.stdout)
        expect(out[0]).toMatch(
          new RegExp(`^service\\s+127\\.0\\.0\\.1:${server.port}\\s+status ok\\s+ready yes\\s+phase live$`)
        )
        expect(human.stdout).toMatch(/intake\s+role leader {2}connected yes {2}progressing yes {2}queued 3/)
        expect(human.stdout).toContain(
          "stream direct  connected yes  quarantined no  failureKind -  cursorAgeSeconds 4"
        )
        expect(human.stdout).toContain(
          "stream registry  connected no  quarantined no  failureKind network  cursorAgeSeconds 97"
        )
        expect(human.stdout).toMatch(/delivery\s+pending 5 {2}leased 1 {2}deadLetter 2 {2}inFlight 1 {2}openCircuits 0/)
        expect(human.stdout).toMatch(/redis\s+configured yes {2}connected no {2}dropped 7/)
        expect(human.stdout).toMatch(/backfill\s+running yes {2}passes 2/)
        expect(human.stdout).toMatch(/^deliveries\s+pending 0/m)
        const json = yield* cli(["status", "--json"], env)
        expect(json.code, json.stderr).toBe(0)
        const parsed = JSON.parse(json.stdout) as {
          deliveries: Record<string, number>
          service: { reachable: boolean; address: string; httpStatus: number; ready: boolean; health: unknown }
        }
        expect(parsed.deliveries).toMatchObject({ pending: 0 })
        expect(parsed.service).toEqual({
          reachable: true,
          address: `127.0.0.1:${server.port}`,
          httpStatus: 200,
          ready: true,
          health: HEALTH
        })

        // a service that is up but not ready answers 503 with the same body
        const starting = yield* healthServer(503, { ...HEALTH, status: "unavailable", phase: "starting" })
        const notReady = yield* cli(["status"], { ...env, HEALTH_PORT: String(starting.port) })
        expect(notReady.code, notReady.stderr).toBe(0)
        expect(lines(notReady.stdout)[0]).toMatch(/status unavailable\s+ready no\s+phase starting$/)

        // nothing listening: said so, the counts all the same
        const port = yield* closedPort
        const down = yield* cli(["status"], { ...env, HEALTH_PORT: String(port) })
        expect(down.code, down.stderr).toBe(0)
        expect(lines(down.stdout)[0]).toBe(`service: not reachable at 127.0.0.1:${port}`)
        expect(down.stdout).toMatch(/^deliveries\s+pending 0/m)
        const downJson = JSON.parse(
          (yield* cli(["status", "--json"], { ...env, HEALTH_PORT: String(port) })).stdout
        ) as {
          service: unknown
          deliveries: unknown
        }
        expect(downJson.service).toEqual({ reachable: false, address: `127.0.0.1:${port}` })
        expect(downJson.deliveries).toBeDefined()
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "replay, redeliver and show say what they did: inactive subscriptions, expired leases, older attempts",
    () =>
      Effect.gen(function*() {
        const { db, env } = yield* seededCliDatabase((sql) =>
          Effect.gen(function*() {
            yield* sql`UPDATE outbox SET status = 'dead_letter', attempt_count = 12, finished_at = now()`
            // CAROL's webhook is disabled since: her two rows would be cancelled without a request
            yield* sql`UPDATE webhooks SET enabled = false, active = false WHERE owner_did = ${CAROL}`
          })
        )

        const replay = yield* cli(["deliveries", "replay", "--status", "dead_letter"], env)
        expect(replay.code, replay.stderr).toBe(0)
        expect(replay.stdout).toBe(
          "replayed 4 dead-lettered deliveries (2 of them belong to a subscription that is no longer active as enqueued, or gone or auto-disabled, and will not be sent)\n"
        )

        const list = JSON.parse((yield* cli(["deliveries", "list", "--owner", ALICE, "--json"], env)).stdout) as Array<
          { deliveryId: string }
        >
        const [a, b] = list.map((d) => d.deliveryId)
        if (a === undefined || b === undefined) return expect.unreachable()
        const carol =
          (JSON.parse((yield* cli(["deliveries", "list", "--owner", CAROL, "--json"], env)).stdout) as Array<
            { deliveryId: string }
          >)[0]?.deliveryId ?? ""

        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          // a: left leased by a worker that stopped (its lease expired); b: leased right now
          yield* sql`UPDATE outbox SET status = 'leased', lease_token = 'gone:1', leased_until = now() - interval '2 minutes' WHERE delivery_id = ${a}`
          yield* sql`UPDATE outbox SET status = 'leased', lease_token = 'w:1', leased_until = now() + interval '5 minutes' WHERE delivery_id = ${b}`
          yield* sql`UPDATE outbox SET status = 'cancelled', finished_at = now() WHERE delivery_id = ${carol}`
          yield* sql`
          INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status)
          SELECT ${a}, g, now() - make_interval(secs => 2000 - g), 1, 'failed', 'http_5xx', 503 FROM generate_series(1, 1003) g`
        }).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.scoped)

        const expired = yield* cli(["deliveries", "redeliver", a], env)
        expect(expired.code, expired.stderr).toBe(0)
        expect(expired.stdout).toContain("lease had expired")
        expect(expired.stdout).not.toContain("being attempted")
        const leased = yield* cli(["deliveries", "redeliver", b], env)
        expectOneLineError(leased, 1)
        expect(leased.stderr).toMatch(/leased by a worker until \d{4}-.*; if that worker has stopped, /)
        const pending = yield* cli(["deliveries", "redeliver", a, "--json"], env)
        expect(JSON.parse(pending.stdout)).toEqual({
          deliveryId: a,
          redelivered: true,
          previousStatus: "pending",
          leaseExpired: false,
          subscriptionInactive: false
        })
        expect((yield* cli(["deliveries", "redeliver", a], env)).stdout).toContain("it was pending")
        const cancelled = yield* cli(["deliveries", "redeliver", carol], env)
        expect(cancelled.code).toBe(0)
        expect(lines(cancelled.stdout)).toEqual([
          `redelivering ${carol} (pending, fresh attempt budget; it was cancelled)`,
          "note: this delivery belongs to a subscription that is no longer active as enqueued (or is gone or auto-disabled) and will not be sent"
        ])

        const show = yield* cli(["deliveries", "show", a], env)
        expect(show.code, show.stderr).toBe(0)
        expect(show.stdout).toContain("3 older attempts not shown (the newest 1000 follow)")
        expect(show.stdout).toMatch(/^4\s+\d{4}-/m)
        expect(show.stdout).toMatch(/^1003\s/m)
        expect(show.stdout).not.toMatch(/^3\s+\d{4}-/m)
        const showJson = JSON.parse((yield* cli(["deliveries", "show", a, "--json"], env)).stdout) as {
          attempts: Array<{ attempt: number }>
          olderAttemptsNotShown: number
        }
        expect(showJson.olderAttemptsNotShown).toBe(3)
        expect(showJson.attempts.map((x) => x.attempt)).toEqual(Array.from({ length: 1000 }, (_, i) => i + 4))
      }),
    { timeout: 120_000 }
  )

  it.scopedLive(
    "status shows every delivery field of /health (stale, auto-disabled and gone webhooks) and the database's auto-disabled webhooks",
    () =>
      Effect.gen(function*() {
        const db = yield* Db.freshDatabase
        yield* Effect.gen(function*() {
          yield* seedFourDeliveries
          const sql = yield* SqlClient.SqlClient
          // ALICE's webhook auto-disabled by its failure streak (SPEC §4.3), CAROL's gone (a 410)
          yield* sql`UPDATE webhooks SET auto_disabled_at = now() WHERE owner_did = ${ALICE}`
          yield* sql`UPDATE webhooks SET gone_at = now() WHERE owner_did = ${CAROL}`
        }).pipe(Effect.provide(seedLayer(db.url)), Effect.scoped)
        const server = yield* healthServer(200, {
          status: "ok",
          phase: "live",
          delivery: {
            pending: 5,
            leased: 1,
            deadLetter: 2,
            inFlight: 1,
            openCircuits: 0,
            autoDisabledWebhooks: 3,
            goneWebhooks: 4,
            stale: true
          }
        })
        const env = { DATABASE_URL: Redacted.value(db.url), HEALTH_HOST: "127.0.0.1", HEALTH_PORT: String(server.port) }
        const human = yield* cli(["status"], env)
        expect(human.code, human.stderr).toBe(0)
        // the service's counts are a cache: one older than 5 s is marked stale, and status says so
        expect(human.stdout).toMatch(
          /delivery\s+pending 5 {2}leased 1 {2}deadLetter 2 {2}inFlight 1 {2}openCircuits 0 {2}autoDisabledWebhooks 3 {2}goneWebhooks 4 {2}stale yes/
        )
        // the database's webhooks: an auto-disabled one is counted (it still has active = true)
        expect(human.stdout).toMatch(/^webhooks\s+active 2 {2}total 2 {2}gone 1 {2}autoDisabled 1$/m)
        const json = JSON.parse((yield* cli(["status", "--json"], env)).stdout) as { autoDisabledWebhooks: number }
        expect(json.autoDisabledWebhooks).toBe(1)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "list: a delivered row has no last error (its 200 is not shown as one); a failed row's kind and status are",
    () =>
      Effect.gen(function*() {
        const { env } = yield* seededCliDatabase((sql) =>
          Effect.gen(function*() {
            // as the worker's settle writes them: delivered keeps the 2xx status and clears the kind
            yield* sql`UPDATE outbox SET status = 'delivered', attempt_count = 2, last_error_kind = NULL,
                       last_http_status = 200, finished_at = now() WHERE owner_did = ${ALICE}`
            yield* sql`UPDATE outbox SET status = 'pending', attempt_count = 1, last_error_kind = 'http_5xx',
                       last_http_status = 503 WHERE owner_did = ${CAROL}`
          })
        )
        const list = yield* cli(["deliveries", "list"], env)
        expect(list.code, list.stderr).toBe(0)
        const rows = lines(list.stdout).slice(1)
        expect(rows).toHaveLength(4)
        for (const row of rows.filter((r) => r.includes(ALICE))) expect(row).toMatch(/\sdelivered\s.*\s-$/)
        for (const row of rows.filter((r) => r.includes(CAROL))) expect(row).toMatch(/\spending\s.*\shttp_5xx 503$/)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "replay and list --error-kind: only the dead letters of that last error kind; an unknown kind is exit 2",
    () =>
      Effect.gen(function*() {
        const { db, env } = yield* seededCliDatabase((sql) =>
          Effect.gen(function*() {
            yield* sql`UPDATE outbox SET status = 'dead_letter', attempt_count = 12, finished_at = now(),
                         last_error_kind = 'timeout' WHERE owner_did = ${ALICE}`
            yield* sql`UPDATE outbox SET status = 'dead_letter', finished_at = now(),
                         last_error_kind = 'webhook_disabled' WHERE owner_did = ${CAROL}`
          })
        )

        const listed = yield* cli(["deliveries", "list", "--error-kind", "webhook_disabled", "--json"], env)
        expect(listed.code, listed.stderr).toBe(0)
        const rows = JSON.parse(listed.stdout) as Array<{ ownerDid: string }>
        expect(rows.map((r) => r.ownerDid)).toEqual([CAROL, CAROL])

        const bad = yield* cli(["deliveries", "replay", "--status", "dead_letter", "--error-kind", "http_500"], env)
        expectOneLineError(bad, 2)
        const replay = yield* cli(["deliveries", "replay", "--status", "dead_letter", "--error-kind", "timeout"], env)
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
          "carol dead_letter",
          "carol dead_letter"
        ])
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "an interrupted replay prints how many rows its committed statements replayed (exit 130); the rest stay dead letters",
    () =>
      Effect.gen(function*() {
        const { db, env } = yield* seededCliDatabase((sql) =>
          Effect.gen(function*() {
            // 2,500 dead letters: the four rows and 624 copies of each, enqueued a millisecond apart
            yield* sql`
              INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, created_at)
              SELECT delivery_id || '_' || g, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint,
                created_at + g * interval '1 millisecond'
              FROM outbox, generate_series(1, 624) g`
            yield* sql`UPDATE outbox SET status = 'dead_letter', attempt_count = 12, finished_at = now(),
                         last_error_kind = 'http_5xx', updated_at = now() - interval '1 minute'`
          })
        )

        // a row of the second statement's range (rows 1,001–2,000 in key order) is locked: the replay
        // commits its first 1,000 rows and then waits there until it is interrupted
        const sql = Context.get(yield* Layer.build(Database.layerUrl(db.url)), SqlClient.SqlClient)
        const counts = sql<{ status: string; n: number }>`
        SELECT status, count(*)::int AS n FROM outbox GROUP BY status ORDER BY status`
        const locked = yield* Effect.forkScoped(
          sql.withTransaction(Effect.gen(function*() {
            // (the row alone: rows an OFFSET skips would be locked too)
            yield* sql`SELECT 1 FROM outbox WHERE delivery_id =
              (SELECT delivery_id FROM outbox ORDER BY created_at, delivery_id OFFSET 1500 LIMIT 1) FOR UPDATE`
            yield* Effect.never
          }))
        )
        yield* eventually(
          Effect.map(
            sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'transactionid' AND granted`,
            (r) => (r[0]?.n ?? 0) >= 1
          ),
          "the row lock"
        )
        const replaying = spawnCli(["deliveries", "replay", "--status", "dead_letter"], env)
        yield* eventually(
          Effect.map(
            sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR UPDATE%'`,
            (r) => (r[0]?.n ?? 0) === 1
          ),
          "the replay's second statement waiting on the locked row",
          30_000
        )
        expect(yield* counts).toEqual([{ status: "dead_letter", n: 1500 }, { status: "pending", n: 1000 }])
        replaying.child.kill("SIGINT")
        expect(yield* Effect.promise(() => replaying.exit)).toBe(130)
        expect(replaying.stdout()).toBe(
          "interrupted: replayed at least 1000 dead-lettered deliveries; the others are still dead letters (run the same command again for them)\n"
        )
        yield* Fiber.interrupt(locked)
        // the statement cut short was cancelled: nothing beyond the first 1,000 rows moved
        expect(yield* counts).toEqual([{ status: "dead_letter", n: 1500 }, { status: "pending", n: 1000 }])
      }),
    { timeout: 90_000 }
  )
})
