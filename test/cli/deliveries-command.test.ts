/**
 * `firehook deliveries …` run in-process (the command of `src/cli/DeliveriesCommand.ts` through
 * @effect/cli, its failure described as `main.ts` describes it: code 2 for invalid arguments, 1 for
 * an operation that could not be done), with what it writes to stdout and stderr captured. Faster
 * than spawning the CLI (test/cli/cli.test.ts does that), for the options' checks and filters.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { deliveries } from "../../src/cli/DeliveriesCommand.js"
import * as Database from "../../src/services/platform/Database.js"
import { ALICE, CAROL, seededDatabase } from "./cli-seed.js"
import { type InProcessRun, runInProcess } from "./inProcess.js"

/** Nothing listens there: a command that gets past its argument checks fails to connect (code 1). */
const UNREACHABLE = "postgres://firehook@127.0.0.1:1/none"

type Run = InProcessRun

/** `firehook deliveries <args>` with DATABASE_URL = `databaseUrl`: its exit code, error line and output. */
const run = (args: ReadonlyArray<string>, databaseUrl: string = UNREACHABLE): Effect.Effect<Run> =>
  runInProcess(deliveries, args, { DATABASE_URL: databaseUrl })

/** Code 2 with `line`, nothing written. */
const expectUsage = (r: Run, line: string) => {
  expect(r, line).toEqual({ code: 2, line, stdout: "", stderr: "" })
}

/** Past the argument checks: the (unreachable) database is what failed. */
const expectConnectAttempt = (r: Run) => {
  expect(r.code, r.line).toBe(1)
  expect(r.line).toMatch(/^database: could not connect/)
}

/** {@link seededDatabase}'s URL. */
const seeded = <E>(adjust: (sql: SqlClient.SqlClient) => Effect.Effect<unknown, E>) =>
  Effect.map(seededDatabase(adjust), (db) => Redacted.value(db.url))

describe("firehook deliveries (in-process)", () => {
  it.live(
    "argument errors: code 2 and one line, before any database connection; the bounds themselves pass",
    () =>
      Effect.gen(function*() {
        const limit = "invalid --limit: must be in 1..1000"
        expectUsage(yield* run(["list", "--limit", "0"]), limit)
        expectUsage(yield* run(["list", "--limit", "1001"]), limit)
        expectConnectAttempt(yield* run(["list", "--limit", "1"]))
        expectConnectAttempt(yield* run(["list", "--limit", "1000"]))
        expectUsage(yield* run(["list", "--webhook", "a/b"]), "invalid --webhook: must be a record key")
        const owner = "invalid --owner: must be a canonical DID (did:plc:… or did:web:…)"
        expectUsage(yield* run(["replay", "--status", "dead_letter", "--owner", "alice.bsky.social"]), owner)
        expectUsage(
          yield* run(["replay", "--status", "dead_letter", "--webhook", "a/b"]),
          "invalid --webhook: must be a record key"
        )
        const id = "invalid <id>: expected a delivery id (whd_v1_…)"
        expectUsage(yield* run(["show", "whd v1"]), id)
        expectUsage(yield* run(["redeliver", "whd/v1"]), id)
        expectUsage(yield* run([]), "missing subcommand: list, show, redeliver or replay")
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "list: --status, --webhook, --since and --until filter the rows; an empty list says so; 100 rows by default",
    () =>
      Effect.gen(function*() {
        const url = yield* seeded((sql) =>
          sql`UPDATE outbox SET status = 'delivered', finished_at = now() WHERE owner_did = ${ALICE}`
        )
        const owners = (r: Run) => (JSON.parse(r.stdout) as Array<{ ownerDid: string }>).map((d) => d.ownerDid)

        const delivered = yield* run(["list", "--status", "delivered", "--json"], url)
        expect(delivered.code, delivered.line).toBe(0)
        expect(owners(delivered)).toEqual([ALICE, ALICE])
        expect(owners(yield* run(["list", "--webhook", "w2", "--json"], url))).toEqual([CAROL, CAROL])
        // every row was enqueued a moment ago: none before 2020, none an hour from now
        expect(yield* run(["list", "--until", "2020-01-01T00:00:00Z"], url)).toEqual({
          code: 0,
          line: "",
          stdout: "no deliveries\n",
          stderr: ""
        })
        const later = new Date(Date.now() + 3_600_000).toISOString()
        expect((yield* run(["list", "--since", later, "--json"], url)).stdout).toBe("[]\n")
        expect(owners(yield* run(["list", "--since", "1h", "--json"], url))).toHaveLength(4)

        // 101 rows: the default --limit (100) shows 100 and says more exist
        yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          yield* sql`
            INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
              event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, created_at)
            SELECT delivery_id || '_' || g, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
              event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint,
              created_at - g * interval '1 millisecond'
            FROM (SELECT * FROM outbox LIMIT 1) one, generate_series(1, 97) g`
        }).pipe(Effect.provide(Database.layerUrl(Redacted.make(url))), Effect.scoped)
        const byDefault = yield* run(["list", "--json"], url)
        expect(byDefault.code, byDefault.line).toBe(0)
        expect(JSON.parse(byDefault.stdout)).toHaveLength(100)
        expect(byDefault.stderr).toMatch(/^\(100 rows: the limit; more exist: add --cursor \S+ for the next page\)\n$/)
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "list --cursor: the next page from the last row shown, through rows that share one enqueue time; a bad cursor is exit 2",
    () =>
      Effect.gen(function*() {
        // one enqueue time for every row, as an intake batch's rows have
        const url = yield* seeded((sql) => sql`UPDATE outbox SET created_at = '2026-01-01T00:00:00Z'`)
        const all = JSON.parse((yield* run(["list", "--json"], url)).stdout) as Array<{ deliveryId: string }>
        expect(all.length).toBeGreaterThan(2)
        const seen: Array<string> = []
        let cursor: Array<string> = []
        for (let page = 0; page < all.length + 1; page++) {
          const r = yield* run(["list", "--json", "--limit", "1", ...cursor], url)
          expect(r.code, r.line).toBe(0)
          seen.push(...(JSON.parse(r.stdout) as Array<{ deliveryId: string }>).map((d) => d.deliveryId))
          const next = /--cursor (\S+) for the next page/.exec(r.stderr)?.[1]
          if (next === undefined) break
          cursor = ["--cursor", next]
        }
        expect(seen).toEqual(all.map((d) => d.deliveryId))
        expectUsage(
          yield* run(["list", "--cursor", "nope"]),
          "invalid --cursor: not a cursor printed by `firehook deliveries list`"
        )
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "show: the URL only with --show-urls, in the table and in JSON; older attempts are counted only when some were left out",
    () =>
      Effect.gen(function*() {
        let ids: ReadonlyArray<string> = []
        const url = yield* seeded((sql) =>
          Effect.gen(function*() {
            const rows = yield* sql<{ delivery_id: string }>`
              SELECT delivery_id FROM outbox WHERE owner_did = ${ALICE} ORDER BY delivery_id`
            ids = rows.map((r) => r.delivery_id)
            // the first: two attempts; the second: 1,001 (one more than show prints)
            yield* sql`
              INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status)
              SELECT ${ids[0] ?? ""}, g, now() - make_interval(secs => 10 - g), 1, 'failed', 'http_5xx', 503
              FROM generate_series(1, 2) g`
            yield* sql`
              INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status)
              SELECT ${ids[1] ?? ""}, g, now() - make_interval(secs => 2000 - g), 1, 'failed', 'http_5xx', 503
              FROM generate_series(1, 1001) g`
          })
        )
        const [two, many] = ids
        if (two === undefined || many === undefined) return expect.unreachable()
        const hook = "https://alice.example/hook"

        const hidden = yield* run(["show", two], url)
        expect(hidden.code, hidden.line).toBe(0)
        expect(hidden.stdout).toMatch(/^targetUrl\s+\[redacted\]$/m)
        expect(hidden.stdout).not.toContain("older")
        expect(hidden.stdout).toMatch(/^2\s+\d{4}-/m)
        expect((yield* run(["show", two, "--show-urls"], url)).stdout).toMatch(
          /^targetUrl\s+https:\/\/alice\.example\/hook$/m
        )
        const targetUrl = (r: Run) => (JSON.parse(r.stdout) as { delivery: { targetUrl: string } }).delivery.targetUrl
        expect(targetUrl(yield* run(["show", two, "--json"], url))).toBe("[redacted]")
        expect(targetUrl(yield* run(["show", two, "--json", "--show-urls"], url))).toBe(hook)

        const cut = yield* run(["show", many], url)
        expect(cut.code, cut.line).toBe(0)
        expect(cut.stdout).toContain("\n1 older attempt not shown (the newest 1000 follow)\n")
      }),
    { timeout: 60_000 }
  )

  it.scopedLive(
    "replay: one row in the singular, and the inactive-subscription note only when some row has one",
    () =>
      Effect.gen(function*() {
        const url = yield* seeded((sql) =>
          Effect.gen(function*() {
            // one dead letter of each owner; CAROL's webhook is disabled since
            yield* sql`UPDATE outbox SET status = 'delivered', finished_at = now()`
            yield* sql`
              UPDATE outbox SET status = 'dead_letter', attempt_count = 12
              WHERE delivery_id IN (SELECT min(delivery_id) FROM outbox GROUP BY owner_did)`
            yield* sql`UPDATE webhooks SET enabled = false, active = false WHERE owner_did = ${CAROL}`
          })
        )
        expect(yield* run(["replay", "--status", "dead_letter", "--owner", CAROL], url)).toEqual({
          code: 0,
          line: "",
          stdout:
            "replayed 1 dead-lettered delivery (1 of them belongs to a subscription that is no longer active as enqueued, or gone or auto-disabled, and will not be sent)\n",
          stderr: ""
        })
        expect(yield* run(["replay", "--status", "dead_letter", "--owner", ALICE], url)).toEqual({
          code: 0,
          line: "",
          stdout: "replayed 1 dead-lettered delivery\n",
          stderr: ""
        })
        expect((yield* run(["replay", "--status", "dead_letter"], url)).stdout).toBe(
          "replayed 0 dead-lettered deliveries\n"
        )
      }),
    { timeout: 60_000 }
  )
})
