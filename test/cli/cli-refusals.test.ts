/**
 * The CLI's refusals say what is wrong, where the value came from and when to try again (the audit
 * of 6 December 2026): times finer than the millisecond are refused, not rounded; a row leased by a
 * worker is refused with what frees it; a bad value from the environment names its variable; a 429's
 * `Retry-After` is shown; the owners' commands state the rule an argument broke; a choice option's
 * bad value and a missing required option name the option.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { ConfigProvider, Effect, Either, Option, Redacted } from "effect"
import * as Http from "node:http"
import type * as Net from "node:net"
import { deliveries } from "../../src/cli/DeliveriesCommand.js"
import { optionValueLine } from "../../src/cli/Help.js"
import * as Hooks from "../../src/cli/HookRecords.js"
import { hooks } from "../../src/cli/HooksCommand.js"
import * as OwnerApi from "../../src/cli/OwnerApi.js"
import * as WebhookLexicon from "../../src/schemas/WebhookLexicon.js"
import * as Database from "../../src/services/platform/Database.js"
import { runCli } from "../support/proc.js"
import { expectOneLineError } from "./cli-expect.js"
import { ALICE, seededDatabase } from "./cli-seed.js"
import { type InProcessRun, runInProcess } from "./inProcess.js"
import { OWNER } from "./owner-api-client-support.js"

/** Nothing listens there: a command that gets past its argument checks fails to connect (code 1). */
const UNREACHABLE = "postgres://firehook@127.0.0.1:1/none"

const runDeliveries = (args: ReadonlyArray<string>, databaseUrl: string = UNREACHABLE): Effect.Effect<InProcessRun> =>
  runInProcess(deliveries, args, { DATABASE_URL: databaseUrl })

const expectConnectAttempt = (r: InProcessRun) => {
  expect(r.code, r.line).toBe(1)
  expect(r.line).toMatch(/^database: could not connect/)
}

describe("--since / --until: exact to the millisecond", () => {
  it.live("a time finer than a millisecond is refused (exit 2), not rounded; trailing zeros pass", () =>
    Effect.gen(function*() {
      const rule =
        "at most millisecond precision (3 fraction digits, 2026-01-02T03:04:05.123Z): a finer time is refused, not rounded"
      for (
        const t of ["2026-12-06T22:38:01.0345678Z", "2026-12-06T22:38:01.034530", "2026-12-06T22:38:01.0340001+01:00"]
      ) {
        expect(yield* runDeliveries(["list", "--until", t]), t).toEqual({
          code: 2,
          line: `invalid --until: ${rule}`,
          stdout: "",
          stderr: ""
        })
      }
      expect(
        (yield* runDeliveries(["replay", "--status", "dead_letter", "--since", "2026-12-06T22:38:01.0000001Z"])).line
      )
        .toBe(`invalid --since: ${rule}`)
      expectConnectAttempt(yield* runDeliveries(["list", "--until", "2026-12-06T22:38:01.034000000Z"]))
      expectConnectAttempt(yield* runDeliveries(["list", "--until", "2026-12-06T22:38:01.034"]))
      expectConnectAttempt(yield* runDeliveries(["list", "--until", "2026-12-06T22:38:01.5Z"]))
    }))

  it.scopedLive(
    "a row enqueued at .034530 is before --until .035 and at or after --since .034, and nowhere else",
    () =>
      Effect.gen(function*() {
        const db = yield* seededDatabase((sql) =>
          sql`UPDATE outbox SET created_at = '2026-12-06T22:38:01.034530Z' WHERE owner_did = ${ALICE}`
        )
        const url = Redacted.value(db.url)
        const count = (args: ReadonlyArray<string>) =>
          Effect.map(
            runDeliveries(["list", "--owner", ALICE, "--json", ...args], url),
            (r) => (JSON.parse(r.stdout) as ReadonlyArray<unknown>).length
          )
        expect(yield* count(["--until", "2026-12-06T22:38:01.035Z"])).toBe(2)
        expect(yield* count(["--until", "2026-12-06T22:38:01.034Z"])).toBe(0)
        expect(yield* count(["--since", "2026-12-06T22:38:01.034Z"])).toBe(2)
        expect(yield* count(["--since", "2026-12-06T22:38:01.035Z"])).toBe(0)
      }),
    { timeout: 60_000 }
  )
})

describe("redeliver of a row leased by a worker", () => {
  it.scopedLive(
    "says when the lease ends and what frees it sooner, not that an attempt is running",
    () =>
      Effect.gen(function*() {
        let id = ""
        const db = yield* seededDatabase((sql) =>
          Effect.gen(function*() {
            const rows = yield* sql<{ delivery_id: string }>`
            UPDATE outbox SET status = 'leased', lease_token = 'dead-worker:1',
              leased_until = '2099-01-01T00:00:00Z'
            WHERE delivery_id = (SELECT min(delivery_id) FROM outbox) RETURNING delivery_id`
            id = rows[0]?.delivery_id ?? ""
          })
        )
        const r = yield* runDeliveries(["redeliver", id], Redacted.value(db.url))
        expect(r).toEqual({
          code: 1,
          line:
            "the delivery is leased by a worker until 2099-01-01T00:00:00.000Z; if that worker has stopped, a running delivery worker frees the row within seconds (or at 2099-01-01T00:00:00.000Z); try again then",
          stdout: "",
          stderr: ""
        })
        // untouched
        const left = yield* Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          return yield* sql<{ status: string }>`SELECT status FROM outbox WHERE delivery_id = ${id}`
        }).pipe(Effect.provide(Database.layerUrl(db.url)), Effect.scoped)
        expect(left.map((x) => x.status)).toEqual(["leased"])
      }),
    { timeout: 60_000 }
  )
})

describe("a bad value from the environment names its variable", () => {
  const withProcessEnv = async <A>(env: Record<string, string>, f: () => Promise<A>): Promise<A> => {
    const saved = Object.keys(env).map((k) => [k, process.env[k]] as const)
    Object.assign(process.env, env)
    try {
      return await f()
    } finally {
      for (const [k, v] of saved) {
        if (v === undefined) delete process.env[k]
        else process.env[k] = v
      }
    }
  }
  const serviceRefusal = (given: OwnerApi.ServiceGiven, env: Record<string, string>) =>
    withProcessEnv(
      env,
      () => Effect.runPromise(Effect.either(OwnerApi.service(given))).then((r) => Either.isLeft(r) ? r.left.text : "")
    )

  it("FIREHOOK_SERVICE_URL, FIREHOOK_SERVICE_DID; the flags as themselves", async () => {
    const none = { service: Option.none(), serviceDid: Option.none() }
    expect(await serviceRefusal(none, { FIREHOOK_SERVICE_URL: "http://example.com" })).toMatch(
      /^invalid --service \(FIREHOOK_SERVICE_URL\): must be an https:\/\/ origin/
    )
    expect(
      await serviceRefusal(none, { FIREHOOK_SERVICE_URL: "https://hooks.example.com", FIREHOOK_SERVICE_DID: "nope" })
    ).toBe(
      "invalid --service-did (FIREHOOK_SERVICE_DID): must be a canonical did:plc or did:web (did:web:host%3Aport allowed)"
    )
    expect(
      await serviceRefusal({ service: Option.some("http://example.com"), serviceDid: Option.none() }, {
        FIREHOOK_SERVICE_URL: "https://hooks.example.com"
      })
    ).toMatch(/^invalid --service: must be/)
    expect(
      await serviceRefusal({ service: Option.some("https://hooks.example.com"), serviceDid: Option.some("nope") }, {})
    ).toMatch(/^invalid --service-did: must be/)
  })

  it.effect("ATPROTO_PDS and ATPROTO_IDENTIFIER; --pds as itself", () =>
    Effect.gen(function*() {
      const given = (pds?: string) => ({
        pds: Option.fromNullable(pds),
        identifier: Option.none(),
        password: Option.none()
      })
      const refusal = (env: Record<string, string>, pds?: string) =>
        Hooks.connection(given(pds)).pipe(
          Effect.withConfigProvider(ConfigProvider.fromMap(new Map(Object.entries(env)))),
          Effect.flip,
          Effect.map((e) => e.text)
        )
      expect(yield* refusal({ ATPROTO_PDS: "http://example.com" })).toMatch(
        /^invalid --pds \(ATPROTO_PDS\): must be an https:\/\/ URL/
      )
      expect(yield* refusal({ ATPROTO_PDS: "https://pds.example.com" }, "http://example.com")).toMatch(
        /^invalid --pds: must be/
      )
      expect(yield* refusal({ ATPROTO_IDENTIFIER: "a b", ATPROTO_APP_PASSWORD: "pw" })).toMatch(
        /^invalid --identifier \(ATPROTO_IDENTIFIER\): must be/
      )
    }))
})

describe("a refusal with Retry-After", () => {
  /** A service answering every call with `status`, `body` and the `headers`. */
  const serve = (status: number, body: unknown, headers: Record<string, string>) =>
    new Promise<{ url: string; close: () => Promise<void> }>((resolve) => {
      const conns = new Set<Net.Socket>()
      const server = Http.createServer((_req, res) => {
        res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body))
      })
      server.on("connection", (s: Net.Socket) => {
        conns.add(s)
        s.on("close", () => conns.delete(s))
      })
      server.listen(0, "127.0.0.1", () => {
        const port = (server.address() as Net.AddressInfo).port
        resolve({
          url: `http://127.0.0.1:${port}`,
          close: () =>
            new Promise<void>((r) => {
              for (const s of conns) s.destroy()
              server.close(() => r())
            })
        })
      })
    })

  const hooksShape: Hooks.HooksShape = {
    did: OWNER,
    create: () => Effect.die("unused"),
    list: Effect.die("unused"),
    setEnabled: () => Effect.die("unused"),
    remove: () => Effect.die("unused"),
    serviceToken: () => Effect.succeed(Redacted.make("a.b.c"))
  }

  const refusalWith = async (headers: Record<string, string>) => {
    const s = await serve(429, { error: "RateLimitExceeded", message: "too many calls" }, headers)
    try {
      const api = OwnerApi.make(hooksShape, s.url, "did:web:fake-firehook.test")
      const req = await Effect.runPromise(OwnerApi.request(WebhookLexicon.replay, { input: {} }))
      const r = await Effect.runPromise(Effect.either(api.call(req)))
      return Either.isLeft(r) ? r.left.message : "accepted"
    } finally {
      await s.close()
    }
  }

  it("says when to try again; a missing, zero, huge or date Retry-After is left out", async () => {
    expect(await refusalWith({ "retry-after": "42" })).toBe("RateLimitExceeded: too many calls (try again in 42 s)")
    expect(await refusalWith({ "retry-after": " 7 " })).toBe("RateLimitExceeded: too many calls (try again in 7 s)")
    for (const bad of ["0", "86401", "1.5", "-3", "Wed, 21 Oct 2026 07:28:00 GMT", "1e3"]) {
      expect(await refusalWith({ "retry-after": bad }), bad).toBe("RateLimitExceeded: too many calls")
    }
    expect(await refusalWith({})).toBe("RateLimitExceeded: too many calls")
  })
})

describe("the owners' commands state the rule an argument broke", () => {
  const runHooks = (args: ReadonlyArray<string>) =>
    runInProcess(hooks, [...args, "--service", "https://hooks.example.com"], {})

  it.live("<id>, <rkey>, --rkey, <name>", () =>
    Effect.gen(function*() {
      const usage = (line: string) => ({ code: 2, line, stdout: "", stderr: "" })
      const id = "invalid <id>: expected a delivery id (whd_v1_…)"
      expect(yield* runHooks(["show", "bad id"])).toEqual(usage(id))
      expect(yield* runHooks(["redeliver", "bad id"])).toEqual(usage(id))
      expect(yield* runHooks(["replay", "--rkey", "bad/rkey"])).toEqual(usage("invalid --rkey: must be a record key"))
      expect(yield* runHooks(["deliveries", "bad/rkey"])).toEqual(usage("invalid <rkey>: must be a record key"))
      expect(yield* runHooks(["test", "bad/rkey"])).toEqual(usage("invalid <rkey>: must be a record key"))
      expect(yield* runHooks(["resume", ".."])).toEqual(usage("invalid <rkey>: must be a record key"))
      const name = "invalid <name>: must match ^[A-Za-z0-9._-]{1,64}$, not . or .."
      expect(yield* runHooks(["secrets", "delete", "a b"])).toEqual(usage(name))
      expect(yield* runHooks(["secrets", "create", "."])).toEqual(usage(name))
    }))
})

describe("a choice option's bad value and a missing required option are said with the option's name", () => {
  const help = [
    "  - deliveries list [--status pending | leased | delivered | dead_letter | cancelled] [--error-kind gone | dns] [--limit N]  l",
    "  - deliveries replay --status dead_letter [--error-kind gone | dns] [--json]  r",
    ""
  ].join("\n")

  it("pure: the option whose usage lists exactly those cases and whose value is none of them", () => {
    const cases = "Expected one of the following cases: pending, leased, delivered, dead_letter, cancelled"
    expect(optionValueLine(`${cases} (see --help)`, ["list", "--status", "bogus"], help)).toBe(
      "invalid --status: 'bogus' is not one of pending, leased, delivered, dead_letter, cancelled (see --help)"
    )
    expect(optionValueLine(`${cases} (see --help)`, ["list", "--status=bogus"], help)).toBe(
      "invalid --status: 'bogus' is not one of pending, leased, delivered, dead_letter, cancelled (see --help)"
    )
    expect(
      optionValueLine(
        "Expected one of the following cases: gone, dns (see --help)",
        ["list", "--status", "leased", "--error-kind", "x"],
        help
      )
    ).toBe("invalid --error-kind: 'x' is not one of gone, dns (see --help)")
    // two bad values: @effect/cli's lines joined; the first is said
    expect(
      optionValueLine(
        `${cases} Expected one of the following cases: gone, dns (see --help)`,
        ["list", "--status", "bogus", "--error-kind", "x"],
        help
      )
    ).toBe("invalid --status: 'bogus' is not one of pending, leased, delivered, dead_letter, cancelled (see --help)")
    expect(
      optionValueLine(
        "Expected one of the following cases: dead_letter (see --help)",
        ["replay", "--status", "x"],
        help
      )
    ).toBe("invalid --status: 'x' is not one of dead_letter (see --help)")
    expect(optionValueLine("Expected to find option: '--status' (see --help)", ["replay"], help)).toBe(
      "missing --status (see --help)"
    )
    // no option of the command line fits: @effect/cli's line stands
    expect(optionValueLine(`${cases} (see --help)`, ["list", "--limit", "5"], help)).toBeUndefined()
  })

  it(
    "the CLI: deliveries list --status / --error-kind, replay without --status, hooks deliveries --status",
    async () => {
      const env = { DATABASE_URL: UNREACHABLE }
      const statuses = "pending, leased, delivered, dead_letter, cancelled"
      const results = await Promise.all([
        runCli(["deliveries", "list", "--status", "bogus"], env),
        runCli(["deliveries", "list", "--error-kind=bogus"], env),
        runCli(["deliveries", "replay"], env),
        runCli(["deliveries", "replay", "--status", "pending"], env),
        runCli(["hooks", "deliveries", "--status", "bogus"], {})
      ])
      for (const r of results) expectOneLineError(r, 2)
      const [list, kind, replay, replayStatus, hooksList] = results.map((r) => r.stderr)
      expect(list).toBe(`firehook: invalid --status: 'bogus' is not one of ${statuses} (see --help)\n`)
      expect(kind).toMatch(
        /^firehook: invalid --error-kind: 'bogus' is not one of http_5xx, .*crashed, subscription_changed \(see --help\)\n$/
      )
      expect(replay).toBe("firehook: missing --status (see --help)\n")
      expect(replayStatus).toBe("firehook: invalid --status: 'pending' is not one of dead_letter (see --help)\n")
      expect(hooksList).toBe(`firehook: invalid --status: 'bogus' is not one of ${statuses} (see --help)\n`)
    },
    120_000
  )
})
