/**
 * How long and how many rows are kept: the configuration knobs reach their services through the
 * same construction the App uses: `RETENTION_*` (maintenance, via `App.maintenanceOptions`) and the
 * SPEC §2.4 prior-reference bounds read by `Processor.make` (`PRIOR_REFS_TTL_MS`,
 * `PRIOR_REFS_MAX_ROWS`). Each test sets values other than the defaults and observes the behaviour
 * they change. The other knobs: config-wiring-publisher-intake and config-wiring-reconciliation.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { describe, expect, it } from "@effect/vitest"
import { Duration, Effect } from "effect"
import * as App from "../../src/layers/App.js"
import { defaultPriorRefLimits, priorLimitsFromConfig, Processor } from "../../src/services/matching/Processor.js"
import * as Maintenance from "../../src/services/operator/Maintenance.js"
import * as Db from "../support/db.js"
import { ev, memoryStack, plc, rev, sqlStack, testConfig, whEv, whRecordValue } from "../support/stack.js"

// ---------------------------------------------------------------------------------------------
// Maintenance: RETENTION_*

const HOUR = 3_600_000

/** Seven distinct retentions (1 h … 7 h), so that a value landing on the wrong rule shows. */
const retentionEnv = {
  RETENTION_DELIVERED_MS: String(1 * HOUR),
  RETENTION_DEAD_LETTER_MS: String(2 * HOUR),
  RETENTION_CANCELLED_MS: String(3 * HOUR),
  RETENTION_AUDIT_MS: String(4 * HOUR),
  RETENTION_TOMBSTONES_MS: String(5 * HOUR),
  RETENTION_QUARANTINE_MS: String(6 * HOUR),
  RETENTION_EVENT_BODIES_MS: String(7 * HOUR),
  RETENTION_AUDIT_MAX_ROWS: "1000",
  RETENTION_TOMBSTONES_MAX_ROWS: "1001",
  RETENTION_QUARANTINE_MAX_ROWS: "1002"
}

const ZERO = Maintenance.ZERO_PRUNE_COUNTS

const sql = SqlClient.SqlClient

const reset = Effect.flatMap(
  sql,
  (s) => s`TRUNCATE outbox, delivery_attempts, delivery_events, audit, tombstones, prior_refs, quarantine, owners`
)

/** A terminal outbox row finished `minutes` ago. */
const outbox = (id: string, status: string, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
                          event_rkey, event_operation, target_url, signing_mode, fingerprint, status, created_at,
                          finished_at)
      VALUES (${id}, ${`ev-${id}`}, 'did:plc:owner', 'w1', 'direct', 'did:plc:subject', 'app.bsky.feed.post', 'p1',
              'create', 'https://receiver.invalid/hook', 'none', 'fp', ${status}, now() - interval '40 days',
              now() - make_interval(mins => ${minutes}))`
  )

const eventBody = (id: string, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO delivery_events (event_id, body, body_sha256, created_at)
      VALUES (${id}, '{}', 'sha', now() - make_interval(mins => ${minutes}))`
  )

/** `n` audit rows `minutes` old, delivery ids `<prefix><g>`. */
const audit = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO audit (delivery_id, event_id, owner_did, webhook_rkey, event_did, event_collection, event_rkey,
                         event_operation, status, created_at)
      SELECT ${prefix} || g, 'e' || g, 'did:plc:owner', 'w1', 'did:plc:subject', 'app.bsky.feed.post', 'p' || g,
             'create', 'delivered', now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** `n` quarantine rows `minutes` old, hashes `<prefix><g>`. */
const quarantine = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO quarantine (stream, relay, reason, event_hash, created_at)
      SELECT 'direct', 'wss://relay.invalid', 'payload_invalid', ${prefix} || g, now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** `n` tombstones `minutes` old (an owner not being reconciled), rkeys `<prefix><g>`. */
const tombstones = (prefix: string, n: number, minutes: number) =>
  Effect.flatMap(
    sql,
    (s) =>
      s`
      INSERT INTO tombstones (owner_did, rkey, rev, generation, deleted_at)
      SELECT 'did:plc:owner', ${prefix} || g, '3kabc', 1, now() - make_interval(mins => ${minutes})
      FROM generate_series(1, ${n}) AS g`
  )

/** The values of `column` in `table`, sorted (both fixed names written in this file). */
const keys = (table: string, column: string) =>
  Effect.flatMap(
    sql,
    (s) =>
      Effect.map(s.unsafe<{ k: string }>(`SELECT ${column}::text AS k FROM ${table} ORDER BY 1`), (rows) =>
        rows.map((r) => r.k))
  )

const count = (table: string) =>
  Effect.flatMap(
    sql,
    (s) => Effect.map(s<{ n: number }>`SELECT count(*)::int AS n FROM ${s(table)}`, (rows) => rows[0]?.n ?? 0)
  )

describe("RETENTION_* reach maintenance (App.maintenanceOptions)", () => {
  it.layer(Db.layer())("on PostgreSQL", (it) => {
    it.effect("each retention prunes its own table at its own age", () =>
      Effect.gen(function*() {
        const configured = App.maintenanceOptions(testConfig(retentionEnv))
        const defaults = App.maintenanceOptions(testConfig())
        expect(Duration.toMillis(Duration.decode(configured.interval ?? 0))).toBe(60_000)
        yield* reset
        // for the retention of N hours: a row N h − 30 min old stays, one N h + 30 min old goes
        yield* outbox("delivered-kept", "delivered", 30)
        yield* outbox("delivered-gone", "delivered", 90)
        yield* outbox("dead-kept", "dead_letter", 90)
        yield* outbox("dead-gone", "dead_letter", 150)
        yield* outbox("cancelled-kept", "cancelled", 150)
        yield* outbox("cancelled-gone", "cancelled", 210)
        yield* audit("audit-kept-", 1, 210)
        yield* audit("audit-gone-", 1, 270)
        yield* tombstones("tomb-kept-", 1, 270)
        yield* tombstones("tomb-gone-", 1, 330)
        yield* quarantine("quar-kept-", 1, 330)
        yield* quarantine("quar-gone-", 1, 390)
        yield* eventBody("body-kept", 390)
        yield* eventBody("body-gone", 450)
        // the defaults (days) prune none of them
        expect(yield* Maintenance.runOnce(defaults)).toEqual(ZERO)
        expect(yield* Maintenance.runOnce(configured)).toEqual({
          ...ZERO,
          outbox: 3,
          delivery_events: 1,
          audit: 1,
          tombstones: 1,
          quarantine: 1
        })
        expect(yield* keys("outbox", "delivery_id")).toEqual(["cancelled-kept", "dead-kept", "delivered-kept"])
        expect(yield* keys("audit", "delivery_id")).toEqual(["audit-kept-1"])
        expect(yield* keys("tombstones", "rkey")).toEqual(["tomb-kept-1"])
        expect(yield* keys("quarantine", "event_hash")).toEqual(["quar-kept-1"])
        expect(yield* keys("delivery_events", "event_id")).toEqual(["body-kept"])
      }))

    it.effect("each row bound keeps its own number of newest rows", () =>
      Effect.gen(function*() {
        yield* reset
        yield* audit("a", 1003, 10)
        yield* tombstones("t", 1003, 10)
        yield* quarantine("q", 1003, 10)
        expect(yield* Maintenance.runOnce(App.maintenanceOptions(testConfig()))).toEqual(ZERO)
        expect(yield* Maintenance.runOnce(App.maintenanceOptions(testConfig(retentionEnv)))).toEqual({
          ...ZERO,
          audit: 3,
          tombstones: 2,
          quarantine: 1
        })
        expect([yield* count("audit"), yield* count("tombstones"), yield* count("quarantine")]).toEqual([
          1000,
          1001,
          1002
        ])
      }))
  })
})

// ---------------------------------------------------------------------------------------------
// Processor: PRIOR_REFS_TTL_MS / PRIOR_REFS_MAX_ROWS

describe("PRIOR_REFS_* reach the processor (Processor.make reads them from the configuration)", () => {
  const owner = plc(401)
  const subject = plc(402)
  const post = `at://${subject}/app.bsky.feed.post/p1`
  /** A backlink webhook on `subject`, then `n` posts of another DID referencing `subject`'s post (batches of 100). */
  const referencingPosts = (n: number) =>
    Effect.gen(function*() {
      const p = yield* Processor
      yield* p.processEvents([
        whEv(owner, "bl", whRecordValue(`at://${subject}`, { backlinks: true }), { rev: rev(1) })
      ], {
        registryWriter: true
      })
      const author = plc(403)
      for (let start = 0; start < n; start += 100) {
        const batch = Array.from({ length: Math.min(100, n - start) }, (_, i) =>
          ev(author, "app.bsky.feed.post", `r${start + i}`, { rev: rev(10 + start + i), record: { ref: post } }))
        yield* p.processEvents(batch, { registryWriter: true })
      }
      const stats = yield* p.stats
      return { keys: stats.priorRefKeys, refused: stats.priorRefsRefused, complete: stats.priorRefIndexComplete }
    })

  it("the limits of a configuration map each variable to its field; the defaults are the processor's", () => {
    expect(priorLimitsFromConfig(testConfig({}).priorRefs)).toEqual(defaultPriorRefLimits)
    expect(priorLimitsFromConfig(testConfig({ PRIOR_REFS_TTL_MS: "7200500", PRIOR_REFS_MAX_ROWS: "1234" }).priorRefs))
      .toEqual({
        ...defaultPriorRefLimits,
        ttlSeconds: 7200.5,
        maxRows: 1234
      })
  })

  // the webhook record references `subject` too, so it is a key as well: 1,001 keys in all
  it.effect(
    "1,000 rows: of 1,001 new keys the last one is refused; the default (100,000) stores them all",
    () =>
      Effect.gen(function*() {
        const configured = yield* referencingPosts(1000).pipe(
          Effect.provide(memoryStack({ env: { PRIOR_REFS_MAX_ROWS: "1000" } }))
        )
        expect(configured).toEqual({ keys: 1000, refused: 1, complete: true })
        const byDefault = yield* referencingPosts(1000).pipe(Effect.provide(memoryStack()))
        expect(byDefault).toEqual({ keys: 1001, refused: 0, complete: true })
        // an explicit option still wins over the configuration
        const explicit = yield* referencingPosts(1000).pipe(
          Effect.provide(
            memoryStack({
              env: { PRIOR_REFS_MAX_ROWS: "1000" },
              priorLimits: { ...defaultPriorRefLimits, maxRows: 1001 }
            })
          )
        )
        expect(explicit).toEqual({ keys: 1001, refused: 0, complete: true })
      }),
    { timeout: 60_000 }
  )

  /** Seconds from now to the stored row's expiry, after one referencing post. */
  const expiresInSeconds = (env: Record<string, string>) =>
    Effect.gen(function*() {
      yield* referencingPosts(1)
      const s = yield* sql
      const rows = yield* s<{ secs: number }>`
        SELECT extract(epoch FROM expires_at - now())::float8 AS secs FROM prior_refs WHERE record_uri LIKE ${`at://${
        plc(403)
      }/%`}`
      return rows.map((r) => Number(r.secs))
    }).pipe(Effect.provide(sqlStack({ env })))

  it.effect(
    "a TTL of 2 h (and half a second) sets the stored row's expiry (what maintenance prunes by); the default is 7 days",
    () =>
      Effect.gen(function*() {
        const configured = yield* expiresInSeconds({ PRIOR_REFS_TTL_MS: "7200500" })
        expect(configured).toHaveLength(1)
        expect(configured[0]).toBeGreaterThan(7200.5 - 60)
        expect(configured[0]).toBeLessThanOrEqual(7200.5)
        const byDefault = yield* expiresInSeconds({})
        expect(byDefault).toHaveLength(1)
        expect(byDefault[0]).toBeGreaterThan(604_800 - 60)
        expect(byDefault[0]).toBeLessThanOrEqual(604_800)
      }),
    { timeout: 120_000 }
  )
})
