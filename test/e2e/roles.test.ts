/**
 * Process roles (SPEC §6.4, issue 16) as operators meet them: real `bun src/main.ts` processes on
 * one PostgreSQL database and a local Jetstream.
 * - An invalid `FIREHOOK_ROLES` is one line on stderr and exit code 1.
 * - An `intake` process enqueues and delivers nothing; an `api` process delivers nothing either
 *   (no claim: the rows stay pending, no liveness mark; no LISTEN on the outbox channel, best-effort); a
 *   `delivery` process opens no stream and no API listener, is ready without intake or backfill,
 *   and delivers the rows. `/health` shows each process's roles and only the sections of its parts
 *   (and every process's `database` section).
 */
import { afterAll, describe, expect, it } from "vitest"
import { e2eResources, query, startDeployment, waitUntil } from "../support/e2e.js"
import { commitFrame, startFakeJetstream } from "../support/fakeJetstream.js"
import { exitWithin, freePort, startFirehook, waitFor } from "../support/proc.js"
import { startReceiver } from "../support/receiver.js"

const OWNER = "did:plc:rolesrolesrolesrolesrole"
const T0 = 1_750_000_000_000_000
const WH = "place.wisp.v2.wh"
const ROWS = 20

const res = e2eResources()
afterAll(() => res.cleanup())

const health = async (url: string): Promise<Record<string, unknown>> =>
  (await (await fetch(url, { signal: AbortSignal.timeout(2000) })).json()) as Record<string, unknown>

const count = async (db: string, where: string) =>
  Number((await query<{ n: string }>(db, `SELECT count(*)::text AS n FROM outbox WHERE ${where}`))[0]?.n ?? "0")

/** whether something accepts TCP connections on 127.0.0.1:port */
/**
 * Whether an XRPC API answers on `port` (an unknown method's XRPC error). A port that nothing
 * listens on, or where another server answers (the suite's processes pick their ports from one
 * range, so a health server of another test can take this one once it is free), is not an API.
 */
const servesApi = async (port: number): Promise<boolean> => {
  try {
    const res = await fetch(`http://127.0.0.1:${port}/xrpc/com.example.none`, { signal: AbortSignal.timeout(5_000) })
    const body: unknown = await res.json().catch(() => undefined)
    return typeof body === "object" && body !== null && typeof Reflect.get(body, "error") === "string"
  } catch {
    return false
  }
}

const sections = (body: Record<string, unknown>) =>
  Object.keys(body).filter((k) => k !== "status" && k !== "phase").sort()

describe("FIREHOOK_ROLES", () => {
  for (const value of ["intake,bogus", "intake,,delivery", "delivery,delivery", "all,intake", "Intake"]) {
    it(`FIREHOOK_ROLES=${JSON.stringify(value)}: one line on stderr, exit 1`, async () => {
      const running = startFirehook({ FIREHOOK_ROLES: value, FIREHOOK_DATA_DIR: res.tempDir() })
      const exit = await exitWithin(running, 30_000)
      expect(exit.code).toBe(1)
      const lines = running.stderr().trim().split("\n")
      expect(lines).toHaveLength(1)
      expect(lines[0]).toMatch(/^firehook: invalid configuration: FIREHOOK_ROLES /)
      expect(running.stdout()).toBe("")
    })
  }

  it(
    "intake enqueues only; api delivers nothing; delivery opens no stream and no API listener and delivers",
    async () => {
      const rx = await startReceiver()
      const js = await startFakeJetstream()
      const db = await res.freshDb()
      const base = {
        DATABASE_URL: db,
        NODE_ENV: "test",
        WEBHOOK_ALLOW_INSECURE_DEV: "1",
        JETSTREAM_URL: js.url,
        DELIVERY_RETRY_BASE_MS: "100"
      }
      const intake = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "intake" })
      await waitFor(intake.health, 200, intake.running, 60_000)
      const intakeBody = await health(intake.health)
      expect(intakeBody["roles"]).toEqual({
        intake: true,
        delivery: false,
        reconcile: false,
        maintenance: false,
        api: false
      })
      expect(intakeBody["phase"]).toBe("live")
      expect(sections(intakeBody)).toEqual(["database", "intake", "matching", "registry", "roles"])
      js.publish([
        commitFrame(OWNER, T0, WH, "hook", "create", {
          $type: WH,
          scope: { aturi: `at://${OWNER}/app.bsky.feed.post` },
          url: rx.url,
          createdAt: "2026-01-01T00:00:00Z"
        }),
        ...Array.from(
          { length: ROWS },
          (_, i) => commitFrame(OWNER, T0 + 1000 + i * 10, "app.bsky.feed.post", `p${i}`, "create")
        )
      ])
      await waitUntil(async () => (await count(db, "status = 'pending'")) === ROWS, 30_000, "rows enqueued")
      const streams = js.connections.length
      expect(streams).toBeGreaterThan(0)

      // api: ready, starts nothing that delivers
      const apiPort = await freePort()
      const api = await startDeployment(res.tempDir(), { ...base, FIREHOOK_ROLES: "api", API_PORT: String(apiPort) })
      await waitFor(api.health, 200, api.running, 60_000)
      const apiBody = await health(api.health)
      expect(apiBody["roles"]).toEqual({
        intake: false,
        delivery: false,
        reconcile: false,
        maintenance: false,
        api: true
      })
      expect(sections(apiBody)).toEqual(["api", "database", "roles"])
      // the owners' API listener answers (NotConfigured: no SERVICE_DID/PUBLIC_URL here)
      expect((await fetch(`http://127.0.0.1:${apiPort}/xrpc/place.wisp.v2.secret.list`)).status).toBe(503)
      expect(await servesApi(apiPort)).toBe(true)
      // no delivery worker anywhere: no liveness mark (the guard: every delivery worker holds it
      // while it runs), no rows claimed or delivered (below)
      expect(
        await query(
          db,
          `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND classid = 7231005 AND objsubid = 2
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`
        )
      ).toEqual([])
      // best-effort only: no backend's last statement is a LISTEN on the outbox channel. PostgreSQL
      // shows no other session's channels (pg_listening_channels() is the caller's own, and
      // pg_stat_statements is not loaded here); pg_stat_activity keeps only a session's last
      // statement, and a process LISTENs on its one connection on several channels and probes it
      // with SELECT 1, so a LISTEN followed by another statement is not seen here
      expect(
        await query(
          db,
          "SELECT 1 FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%firehook_outbox%'"
        ),
        "a session whose last statement LISTENs on the outbox channel"
      ).toEqual([])
      expect(await count(db, "status = 'pending'")).toBe(ROWS)
      expect(rx.total()).toBe(0)
      expect(js.connections.length).toBe(streams)

      // delivery: no stream, no API listener, ready without intake or backfill; delivers the rows
      const deliveryApiPort = await freePort()
      const delivery = await startDeployment(res.tempDir(), {
        ...base,
        FIREHOOK_ROLES: "delivery",
        API_PORT: String(deliveryApiPort)
      })
      await waitFor(delivery.health, 200, delivery.running, 60_000)
      const deliveryBody = await health(delivery.health)
      expect(deliveryBody["roles"]).toEqual({
        intake: false,
        delivery: true,
        reconcile: false,
        maintenance: false,
        api: false
      })
      expect(deliveryBody["phase"]).toBe("live")
      expect(sections(deliveryBody)).toEqual(["database", "delivery", "redis", "roles"])
      await waitUntil(async () => (await count(db, "status = 'delivered'")) === ROWS, 30_000, "rows delivered")
      expect(rx.hits.size).toBe(ROWS)
      expect(js.connections.length).toBe(streams)
      expect(await servesApi(deliveryApiPort)).toBe(false)

      for (const d of [delivery, api, intake]) {
        d.running.child.kill("SIGTERM")
        expect((await exitWithin(d.running, 20_000)).code).toBe(0)
      }
      await js.close()
      await rx.close()
    },
    240_000
  )
})
