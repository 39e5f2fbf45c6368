/**
 * Maintenance (SPEC §4.9): prune every table that grows, in bounded batches, on one replica at a
 * time.
 *
 * The runner role is a PostgreSQL session advisory lock held on a dedicated connection
 * (`sql.reserve`): a replica that dies, or whose connection dies, loses the lock with its session,
 * and a standby (which retries every interval) takes over. The holder pings its connection every
 * interval; when the ping fails it gives the role up and competes for it again. When the scope
 * closes, the lock is released before the connection goes back to the pool.
 *
 * Every rule deletes at most `batchSize` rows per statement, makes up to `maxBatches` statements a
 * run, then more while they come back full and the run is within `runBudget` (half the interval),
 * at most `BUDGET_BATCH_FACTOR` × `maxBatches`: one run is bounded whatever the backlog, and prunes
 * far more than a minute of peak writes; the next run continues. Every statement has a timeout
 * (`statementTimeout`): a statement stuck on a lock is cancelled, its rule fails (code
 * `timeout`), the other rules still run, and the next run starts afresh. Ages are measured with
 * the database's `now()`, never the process clock. Rows that another transaction is changing are
 * skipped (`FOR UPDATE SKIP LOCKED`) and their conditions re-checked under the row lock, so a
 * replay of a dead letter or a refreshed prior reference is never deleted under its writer.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import type { Fragment } from "@effect/sql/Statement"
import { Clock, Context, Duration, Effect, Layer, Metric, Option, Ref, Stream, SubscriptionRef } from "effect"
import type { Scope } from "effect"
import { PARKED_KIND } from "../delivery/WebhookHealthSql.js"
import { Health, statsSection } from "../platform/Health.js"
import { leaderErrorCode, type Role, runAsLeader } from "../platform/Leader.js"
import * as LockKeys from "../platform/LockKeys.js"
import { labelledCounterFamily } from "../platform/Metrics.js"
import { StoreError, storeOpWithin } from "../platform/Persistence.js"
import { REJECTED_LIMITS } from "../registry/RejectedStore.js"
import { DEFAULT_EVENT_SWEEP_WINDOW, type SweepCursor, sweepEvents, type SweepKey } from "./EventSweep.js"
import { KEY_TEXT_FORMAT } from "./ListKey.js"
import type { TerminalStatus } from "./Operator.js"
import * as OperatorConfig from "./OperatorConfig.js"
import { unparkCtes } from "./ParkedRoom.js"
import * as PruneAttempts from "./PruneAttempts.js"
import { type AttemptCursor, type Batch, batched, tombstoneBatch } from "./PruneBatches.js"

/** The tables maintenance prunes (also the `table` label of the pruned metric). */
export const PRUNED_TABLES = [
  "outbox",
  "delivery_attempts",
  "delivery_events",
  "audit",
  "tombstones",
  "prior_refs",
  "quarantine",
  "rejected_records"
] as const
export type PrunedTable = (typeof PRUNED_TABLES)[number]

/** Rows deleted per table by one run. */
export type PruneCounts = { readonly [T in PrunedTable]: number }

export interface RetentionOptions {
  /** outbox rows `delivered` longer than this (by `finished_at`) — default 7 days */
  readonly delivered: Duration.DurationInput
  /** outbox rows `dead_letter` — default 30 days */
  readonly deadLetter: Duration.DurationInput
  /** outbox rows `cancelled` — default 7 days */
  readonly cancelled: Duration.DurationInput
  /** audit rows — default 30 days */
  readonly audit: Duration.DurationInput
  /** audit keeps at most this many newest rows — default 100,000 */
  readonly auditMaxRows: number
  /** tombstones (except those of owners being reconciled) — default 7 days */
  readonly tombstones: Duration.DurationInput
  /**
   * tombstones keep at most this many newest rows (by `deleted_at`), whoever the owner — default
   * 100,000 (SPEC §3.4)
   */
  readonly tombstonesMaxRows: number
  /** quarantine rows, and refused-record entries (by last sighting) — default 30 days */
  readonly quarantine: Duration.DurationInput
  /** quarantine keeps at most this many newest rows — default 100,000 */
  readonly quarantineMaxRows: number
  /** refused-record entries keep at most this many newest rows — default 1,000,000 */
  readonly rejectedMaxRows: number
  /** event bodies no outbox row references — default 7 days */
  readonly deliveryEvents: Duration.DurationInput
  /** event bodies walked per statement (EventSweep.ts) — default 10,000 */
  readonly eventSweepWindow: number
  /** rows per DELETE — default 1,000 */
  readonly batchSize: number
  /** DELETE statements every rule makes per run (when its batches come back full) — default 100 */
  readonly maxBatches: number
  /**
   * beyond `maxBatches`, full batches go on while the run is younger than this (up to
   * `BUDGET_BATCH_FACTOR` × `maxBatches`) — default 30 s, the runner's half its interval; 0: none
   */
  readonly runBudget: Duration.DurationInput
  /** bound on each statement (SPEC §7); a statement past it is cancelled — default 30 s */
  readonly statementTimeout: Duration.DurationInput
}

export const DEFAULT_RETENTION: RetentionOptions = {
  delivered: Duration.millis(OperatorConfig.retention.deliveredMs.default),
  deadLetter: Duration.millis(OperatorConfig.retention.deadLetterMs.default),
  cancelled: Duration.millis(OperatorConfig.retention.cancelledMs.default),
  audit: Duration.millis(OperatorConfig.retention.auditMs.default),
  auditMaxRows: OperatorConfig.retention.auditMaxRows.default,
  tombstones: Duration.millis(OperatorConfig.retention.tombstonesMs.default),
  tombstonesMaxRows: OperatorConfig.retention.tombstonesMaxRows.default,
  quarantine: Duration.millis(OperatorConfig.retention.quarantineMs.default),
  quarantineMaxRows: OperatorConfig.retention.quarantineMaxRows.default,
  rejectedMaxRows: REJECTED_LIMITS.maxRows,
  deliveryEvents: Duration.millis(OperatorConfig.retention.eventBodiesMs.default),
  eventSweepWindow: DEFAULT_EVENT_SWEEP_WINDOW,
  batchSize: 1_000,
  maxBatches: 100,
  runBudget: Duration.seconds(30),
  statementTimeout: Duration.seconds(30)
}

export interface MaintenanceOptions extends Partial<RetentionOptions> {
  /** time between runs, and between attempts to become the runner — default 60 s */
  readonly interval?: Duration.DurationInput
  /** the advisory lock key (a safe integer; default `MAINTENANCE_LOCK_KEY`) */
  readonly lockKey?: number
  /** bound on each ping of the runner's lock connection — default 10 s */
  readonly pingTimeout?: Duration.DurationInput
}

/** The advisory lock key of the maintenance runner role (next to `MIGRATION_LOCK_KEY`). */
export const MAINTENANCE_LOCK_KEY = LockKeys.MAINTENANCE
export const DEFAULT_INTERVAL = Duration.millis(OperatorConfig.maintenanceIntervalMs.default)

/** Bound on each ping of the runner's lock connection. */
const LOCK_OP_TIMEOUT = Duration.seconds(10)
/** How often the runner pings its lock's connection (at most: never less often than the interval). */
const RUNNER_PING_INTERVAL = Duration.seconds(2)

// ---------------------------------------------------------------------------------------------
// Metrics

/** `{ table }`: a pruned table */
const prunedTotal = labelledCounterFamily("firehook_maintenance_pruned_total", {
  description: "Rows deleted by maintenance, by table",
  incremental: true
})
const runsTotal = Metric.counter("firehook_maintenance_runs_total", {
  description: "Maintenance runs",
  incremental: true
})
const failedRunsTotal = Metric.counter("firehook_maintenance_failed_runs_total", {
  description: "Maintenance runs in which at least one rule failed",
  incremental: true
})
/** `{ rule, kind }` */
const ruleFailuresTotal = labelledCounterFamily("firehook_maintenance_rule_failures_total", {
  description: "Maintenance rules that failed, by rule and kind (timeout: a statement exceeded statementTimeout)",
  incremental: true
})

// ---------------------------------------------------------------------------------------------
// One run

const seconds = (d: Duration.DurationInput): number => Duration.toSeconds(Duration.decode(d))

/** Audit/quarantine bound: 10 × batchSize rows a statement (a minute at peak = 380,700 audit rows) */
const BOUND_BATCH_FACTOR = 10
/** the largest bigint: "no upper id" in a range delete */
const MAX_BIGINT = "9223372036854775807"
const resolve = (options: Partial<RetentionOptions>): RetentionOptions => ({ ...DEFAULT_RETENTION, ...options })

type CountRow = { readonly n: number }
type OutboxRow = { readonly n: number; readonly attempts: number }
type CutRow = { readonly cut: string }
type KeyedCutRow = { readonly at: string; readonly owner_did: string; readonly rkey: string }

const onlyRows = <E, R>(eff: Effect.Effect<ReadonlyArray<CountRow>, E, R>) =>
  Effect.map(eff, (rows) => ({ rows: rows[0]?.n ?? 0, extra: 0 }))

/** One run's: where the walks resume (none: the oldest); whether its time budget lasts (none: no). */
export interface RunContext {
  readonly eventCursor?: SweepCursor | undefined
  readonly attemptCursor?: AttemptCursor | undefined
  readonly attemptBounds?: PruneAttempts.AttemptBoundCursors | undefined
  readonly withinBudget?: Effect.Effect<boolean> | undefined
}

/**
 * The rules, each a bounded loop of batches. Exported for tests; `runOnce` is the entry point.
 */
export const makeRules = (sql: SqlClient.SqlClient, o: RetentionOptions, run: RunContext = {}) => {
  const b = o.batchSize
  const longest = Math.max(seconds(o.delivered), seconds(o.deadLetter), seconds(o.cancelled))
  const withinBudget = run.withinBudget ?? Effect.succeed(false)
  const loop = <E, R>(batch: Effect.Effect<Batch, E, R>, options: RetentionOptions = o) =>
    batched(options, withinBudget, batch)

  /**
   * One statement, bounded by `statementTimeout`. Interrupting a query cancels it on the server
   * (`pg_cancel_backend`), so a statement stuck behind a lock neither keeps its locks nor its
   * connection.
   */
  const timed = <A>(statement: Effect.Effect<A, SqlError | StoreError>): Effect.Effect<A, StoreError> =>
    storeOpWithin("maintenance", o.statementTimeout)(Effect.interruptible(statement))

  /**
   * One batch of rows picked by `doomed` (at most `batchSize`, oldest first where it says so),
   * locked, skipping rows another transaction holds (`FOR UPDATE [OF lockOf] SKIP LOCKED`), then
   * deleted from `target` (aliased as in `match`) where `match` still holds under the lock.
   */
  const deleteLocked = (doomed: Fragment, lockOf: string | undefined, target: string, match: Fragment) =>
    onlyRows(timed(sql<CountRow>`
      WITH doomed AS (
        ${doomed}
        LIMIT ${b}
        FOR UPDATE ${sql.literal(lockOf === undefined ? "" : `OF ${lockOf} `)}SKIP LOCKED
      ), gone AS (
        DELETE FROM ${sql.literal(target)} USING doomed d
        WHERE ${match}
        RETURNING 1
      )
      SELECT count(*)::int AS n FROM gone`))

  /**
   * Terminal outbox rows older than `retention`, with their attempts. Pruned parked dead letters
   * (`webhook_disabled`) give their webhook's parking room back ({@link unparkCtes}): the 10,000
   * rows a gone or auto-disabled webhook may keep parked are those a replay can still find.
   */
  const outbox = (status: TerminalStatus, retention: Duration.DurationInput) =>
    loop(
      Effect.map(
        timed(sql<OutboxRow>`
          WITH doomed AS (
            SELECT delivery_id FROM outbox
            WHERE status = ${status}
              AND finished_at < now() - make_interval(secs => ${seconds(retention)}::double precision)
            LIMIT ${b}
            FOR UPDATE SKIP LOCKED
          ), gone AS (
            DELETE FROM outbox o USING doomed d
            WHERE o.delivery_id = d.delivery_id AND o.status = ${status}
            RETURNING o.delivery_id, o.owner_did, o.webhook_rkey, o.fingerprint, o.finished_at,
              (o.status = 'dead_letter' AND o.last_error_kind IS NOT DISTINCT FROM ${PARKED_KIND}) AS was_parked
          ), ${unparkCtes(sql, "gone")}, attempts AS (
            DELETE FROM delivery_attempts a USING gone g
            WHERE a.delivery_id = g.delivery_id
            RETURNING 1
          )
          SELECT (SELECT count(*) FROM gone)::int AS n, (SELECT count(*) FROM attempts)::int AS attempts`),
        (rows) => ({ rows: rows[0]?.n ?? 0, extra: rows[0]?.attempts ?? 0 })
      )
    )

  /**
   * Attempts, each rule walked from its cursor (PruneAttempts.ts): `orphans`, whose outbox row is
   * gone (written by anything but this module), older than the longest outbox retention; `excess`,
   * beyond their delivery's newest 100; `aged`, older than the longest retention but their delivery's newest.
   */
  const attempts = (which: PruneAttempts.AttemptRule) =>
    PruneAttempts.rule(sql, which, {
      batchSize: b,
      olderThanSeconds: longest,
      cursor: which === "orphans" ? run.attemptCursor : run.attemptBounds?.[which],
      timed,
      loop
    })
  const orphanAttempts = () => attempts("orphans")

  /** Event bodies older than the retention that no outbox row references, walked from a cursor (EventSweep.ts). */
  const deliveryEvents = () =>
    Effect.flatMap(
      run.eventCursor === undefined ? Ref.make<SweepKey | undefined>(undefined) : Effect.succeed(run.eventCursor),
      (cursor) =>
        sweepEvents(sql, {
          retentionSeconds: seconds(o.deliveryEvents),
          window: o.eventSweepWindow,
          maxBatches: o.maxBatches,
          cursor,
          timed
        })
    ).pipe(Effect.map((rows) => ({ rows, extra: 0 })))

  /**
   * The `size` lowest ids of `table` where `where` holds, as one range delete (`id <=` the last of
   * them), never a join with a subquery of ids: a join planned from statistics that call the table
   * empty (an ANALYZE during a bulk insert) rescans the subquery per row, quadratic in the table
   * (docs/decisions.md, "Maintenance statements and stale statistics"); a range delete is one pass.
   */
  const rangeBatch = (table: "audit" | "quarantine", where: Fragment, size: number) =>
    onlyRows(timed(sql<CountRow>`
      WITH gone AS (
        DELETE FROM ${sql(table)} WHERE ${where} AND id <= COALESCE(
          (SELECT id FROM ${sql(table)} WHERE ${where} ORDER BY id OFFSET ${size - 1} LIMIT 1), ${MAX_BIGINT}::bigint)
        RETURNING 1)
      SELECT count(*)::int AS n FROM gone`))

  /** An append-only table with a bigserial `id` and `created_at`: age first, then the row bound. */
  const appendOnly = (table: "audit" | "quarantine", retention: Duration.DurationInput, maxRows: number) =>
    Effect.gen(function*() {
      const t = sql(table)
      const old = sql`created_at < now() - make_interval(secs => ${seconds(retention)}::double precision)`
      const byAge = yield* loop(rangeBatch(table, old, b))
      // the newest row beyond the bound: it and every older row go
      const cut = yield* timed(sql<CutRow>`SELECT id::text AS cut FROM ${t} ORDER BY id DESC OFFSET ${maxRows} LIMIT 1`)
      const first = cut[0]
      if (first === undefined) return byAge
      const bb = b * BOUND_BATCH_FACTOR
      const byCount = yield* loop(rangeBatch(table, sql`id <= ${first.cut}::bigint`, bb), { ...o, batchSize: bb })
      return { rows: byAge.rows + byCount.rows, extra: 0 }
    })

  /**
   * A table keyed by (`owner_did`, `rkey`) with a time column `at`: first the rows older than
   * `retention`, then the row bound, oldest first, in batches of `batch(where)` (over the table
   * aliased `t`, oldest first).
   *
   * The bound's cut is the newest row beyond the `maxRows` newest, in the order (`at`, `owner_did`,
   * `rkey`): `at` alone has ties (it is the writing transaction's `now()`, shared by every row a
   * transaction writes), and a bound that deleted every tie of the cut would prune more than it
   * must. The cut is read once per run (a backward scan of the table's `at` index over `maxRows`
   * entries); each batch then walks that index from the oldest. A row refreshed since the cut was
   * read (its `at` is now newer) fails the re-check under its row lock and is kept, and one locked
   * by a writer is skipped: pruning never undoes a write in progress.
   */
  const agedThenBounded = (
    table: "tombstones" | "rejected_records",
    at: "deleted_at" | "last_seen_at",
    retention: Duration.DurationInput,
    maxRows: number,
    batch: (where: Fragment) => Effect.Effect<{ readonly rows: number; readonly extra: number }, StoreError>
  ) =>
    Effect.gen(function*() {
      const col = sql(at)
      const byAge = yield* loop(
        batch(sql`t.${col} < now() - make_interval(secs => ${seconds(retention)}::double precision)`)
      )
      // the newest row beyond the bound: it and every older one go. Its time is read as UTC text
      // of a fixed format (ListKey.ts), never `::text`, whose form follows the session's DateStyle
      // and TimeZone (`07/12/2026 13:54:17.067702 IST` is read back as Israel's time)
      const cut = yield* timed(sql<KeyedCutRow>`
        SELECT to_char(${col} AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) AS at, owner_did, rkey FROM ${sql(table)}
        ORDER BY ${col} DESC, owner_did DESC, rkey DESC
        OFFSET ${maxRows} LIMIT 1`)
      const first = cut[0]
      if (first === undefined) return byAge
      const byCount = yield* loop(
        batch(sql`t.${col} <= ${first.at}::timestamptz
          AND (t.${col}, t.owner_did, t.rkey) <= (${first.at}::timestamptz, ${first.owner_did}, ${first.rkey})`)
      )
      return { rows: byAge.rows + byCount.rows, extra: 0 }
    })

  /**
   * Tombstones: first those older than the retention, then the row bound, oldest `deleted_at`
   * first, whoever the owner (a bound that an owner kept `scanning` could escape would be no
   * bound), never those of owners being reconciled (`scanning`, SPEC §3.4): the table may exceed
   * the bound by theirs while their scans run (a crashed scan is marked failed by the retry
   * scheduler, so this cannot hold the bound off for ever).
   * Each batch locks its owners and re-checks them under the lock ({@link tombstoneBatch}).
   */
  const tombstones = () =>
    agedThenBounded(
      "tombstones",
      "deleted_at",
      o.tombstones,
      o.tombstonesMaxRows,
      (where) => onlyRows(timed(tombstoneBatch(sql, where, b)))
    )

  /**
   * The owners' refused records (SPEC §8.5): last seen longer ago than the quarantine's retention,
   * then beyond `rejectedMaxRows` (each owner's newest 100 are kept by their writers).
   */
  const rejectedRecords = () =>
    agedThenBounded("rejected_records", "last_seen_at", o.quarantine, o.rejectedMaxRows, (where) =>
      deleteLocked(
        sql`SELECT t.owner_did, t.rkey FROM rejected_records t WHERE ${where} ORDER BY t.last_seen_at`,
        "t",
        "rejected_records t",
        sql`t.owner_did = d.owner_did AND t.rkey = d.rkey`
      ))

  /** Prior references past their TTL. */
  const priorRefs = () =>
    loop(
      deleteLocked(
        sql`SELECT record_uri FROM prior_refs
          WHERE expires_at < now()`,
        undefined,
        "prior_refs p",
        sql`p.record_uri = d.record_uri`
      )
    )

  return { outbox, orphanAttempts, attempts, deliveryEvents, appendOnly, tombstones, priorRefs, rejectedRecords }
}

/** Nothing pruned: every count zero. */
export const ZERO_PRUNE_COUNTS: PruneCounts = {
  outbox: 0,
  delivery_attempts: 0,
  delivery_events: 0,
  audit: 0,
  tombstones: 0,
  prior_refs: 0,
  quarantine: 0,
  rejected_records: 0
}
const ZERO = ZERO_PRUNE_COUNTS

/**
 * One pruning pass over every table (no lock: safe to run beside a runner, e.g. from the CLI).
 * A failing rule does not stop the others; the run then fails with the first error, after the
 * other rules have run (their deletions are counted in the metric).
 */
export const runOnce = (
  options: Partial<RetentionOptions> = {},
  /** where the event-body walk resumes (the runner's, kept between its runs); none: from the oldest */
  eventCursor?: SweepCursor,
  /** where the orphan-attempt walk resumes (the runner's); none: from the oldest */
  attemptCursor?: AttemptCursor,
  /** where the excess- and aged-attempt walks resume (the runner's); none: from the oldest */
  attemptBounds?: PruneAttempts.AttemptBoundCursors
): Effect.Effect<PruneCounts, StoreError, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const o = resolve(options)
    const started = yield* Clock.currentTimeMillis
    const budgetMs = Duration.toMillis(Duration.decode(o.runBudget))
    const withinBudget = Effect.map(Clock.currentTimeMillis, (now) => now - started < budgetMs)
    const rules = makeRules(sql, o, { eventCursor, attemptCursor, attemptBounds, withinBudget })
    const counts: { [T in PrunedTable]: number } = { ...ZERO }
    let firstError: Option.Option<StoreError> = Option.none()

    const step = (
      name: string,
      table: PrunedTable,
      rule: Effect.Effect<{ readonly rows: number; readonly extra: number }, StoreError>,
      extraTable?: PrunedTable
    ) =>
      rule.pipe(
        Effect.mapError((e) => new StoreError({ op: `maintenance.${name}`, code: e.code })),
        Effect.matchEffect({
          onFailure: (e) =>
            Effect.gen(function*() {
              if (Option.isNone(firstError)) firstError = Option.some(e)
              const kind = e.code === "timeout" ? "timeout" : "error"
              yield* Metric.increment(ruleFailuresTotal({ rule: name, kind }))
              yield* Effect.logWarning("maintenance rule failed").pipe(
                Effect.annotateLogs({ rule: name, kind, code: e.code })
              )
            }),
          onSuccess: ({ rows, extra }) =>
            Effect.gen(function*() {
              counts[table] += rows
              if (rows > 0) yield* Metric.incrementBy(prunedTotal({ table }), rows)
              if (extraTable !== undefined) {
                counts[extraTable] += extra
                if (extra > 0) yield* Metric.incrementBy(prunedTotal({ table: extraTable }), extra)
              }
            })
        })
      )

    // outbox first: its deletions are what leaves event bodies unreferenced
    yield* step("outbox.delivered", "outbox", rules.outbox("delivered", o.delivered), "delivery_attempts")
    yield* step("outbox.dead_letter", "outbox", rules.outbox("dead_letter", o.deadLetter), "delivery_attempts")
    yield* step("outbox.cancelled", "outbox", rules.outbox("cancelled", o.cancelled), "delivery_attempts")
    yield* step("delivery_attempts.orphans", "delivery_attempts", rules.orphanAttempts())
    yield* step("delivery_attempts.excess", "delivery_attempts", rules.attempts("excess"))
    yield* step("delivery_attempts.aged", "delivery_attempts", rules.attempts("aged"))
    yield* step("delivery_events", "delivery_events", rules.deliveryEvents())
    yield* step("audit", "audit", rules.appendOnly("audit", o.audit, o.auditMaxRows))
    yield* step("tombstones", "tombstones", rules.tombstones())
    yield* step("prior_refs", "prior_refs", rules.priorRefs())
    yield* step("quarantine", "quarantine", rules.appendOnly("quarantine", o.quarantine, o.quarantineMaxRows))
    yield* step("rejected_records", "rejected_records", rules.rejectedRecords())

    yield* Metric.increment(runsTotal)
    if (Option.isSome(firstError)) {
      yield* Metric.increment(failedRunsTotal)
      return yield* Effect.fail(firstError.value)
    }
    const total = PRUNED_TABLES.reduce((n, t) => n + counts[t], 0)
    yield* (total > 0 ? Effect.logInfo("maintenance pruned") : Effect.logDebug("maintenance pruned")).pipe(
      Effect.annotateLogs({ ...counts })
    )
    return counts
  }).pipe(Effect.withSpan("Maintenance.runOnce"))

// ---------------------------------------------------------------------------------------------
// The service

export interface MaintenanceStatus {
  /** this process holds the runner lock */
  readonly runner: boolean
  /** the last run of this process succeeded (true before any run) */
  readonly lastRunOk: boolean
  /** runs made by this process as the runner */
  readonly runs: number
  /** attempts to take the runner lock */
  readonly lockAttempts: number
  /** times the runner lock was taken */
  readonly acquisitions: number
}

export interface MaintenanceShape {
  /** One pruning pass now (whether or not this process is the runner). */
  readonly runOnce: Effect.Effect<PruneCounts, StoreError>
  readonly status: Effect.Effect<MaintenanceStatus>
}

export class Maintenance extends Context.Tag("firehook/Maintenance")<Maintenance, MaintenanceShape>() {}

/** What `make` returns: the service plus a way to wait for a state (tests, the CLI). */
export interface MaintenanceHandle extends MaintenanceShape {
  readonly awaitStatus: (predicate: (s: MaintenanceStatus) => boolean) => Effect.Effect<MaintenanceStatus>
}

/**
 * The maintenance loop, for the lifetime of the calling scope: a background fiber competes for the
 * runner lock every `interval` and, while it holds it, runs `runOnce` every `interval`. Registers
 * the `maintenance` health section (never gating readiness).
 */
export const make = (
  options: MaintenanceOptions = {}
): Effect.Effect<MaintenanceHandle, never, SqlClient.SqlClient | Health | Scope.Scope> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const health = yield* Health
    const interval = options.interval ?? DEFAULT_INTERVAL
    const lockKey = options.lockKey ?? MAINTENANCE_LOCK_KEY
    const eventCursor: SweepCursor = yield* Ref.make<SweepKey | undefined>(undefined)
    const attemptCursor = yield* PruneAttempts.newCursor
    const attemptBounds = yield* PruneAttempts.newBoundCursors
    // a run's budget is half the interval: the runner is never busy for more than about that
    const runBudget = options.runBudget ?? Duration.times(Duration.decode(interval), 0.5)
    const run = runOnce({ ...options, runBudget }, eventCursor, attemptCursor, attemptBounds).pipe(
      Effect.provideService(SqlClient.SqlClient, sql)
    )
    const state = yield* SubscriptionRef.make<MaintenanceStatus>({
      runner: false,
      lastRunOk: true,
      runs: 0,
      lockAttempts: 0,
      acquisitions: 0
    })
    const update = (f: (s: MaintenanceStatus) => MaintenanceStatus) => SubscriptionRef.update(state, f)

    // the runner role (Leader): a standby competes every interval; the runner pings its lock
    // connection every interval, runs at once and then every interval
    const work = Effect.forever(
      Effect.gen(function*() {
        const result = yield* Effect.either(run)
        yield* update((s) => ({ ...s, runs: s.runs + 1, lastRunOk: result._tag === "Right" }))
        yield* Effect.sleep(interval)
      })
    )
    const connectionFailed = (e: unknown) =>
      Effect.logWarning("maintenance: database connection failed").pipe(
        Effect.annotateLogs({ code: leaderErrorCode(e) })
      )
    const role = yield* Ref.make<Role>("standby")
    const leader = runAsLeader(
      {
        key: lockKey,
        name: "maintenance",
        retryInterval: interval,
        // the runner sees a lost lock within seconds, not after a whole interval in which a standby
        // may already run too (SPEC §4.9: one runner at a time)
        pingInterval: Duration.min(Duration.decode(interval), RUNNER_PING_INTERVAL),
        pingTimeout: options.pingTimeout ?? LOCK_OP_TIMEOUT,
        events: {
          attempt: update((s) => ({ ...s, lockAttempts: s.lockAttempts + 1 })),
          acquired: update((s) => ({ ...s, runner: true, acquisitions: s.acquisitions + 1 })).pipe(
            Effect.zipRight(Effect.logInfo("maintenance runner role taken"))
          ),
          lost: (reason, e) => (reason === "connection" ? connectionFailed(e) : Effect.void),
          failed: connectionFailed,
          ended: update((s) => (s.runner ? { ...s, runner: false } : s))
        }
      },
      role,
      work
    )
    yield* Effect.forkScoped(Effect.provideService(leader, SqlClient.SqlClient, sql))

    const status = SubscriptionRef.get(state)
    yield* health.register("maintenance", statsSection(status, ["runner", "lastRunOk"]))
    const awaitStatus = (predicate: (s: MaintenanceStatus) => boolean) =>
      state.changes.pipe(
        Stream.filter(predicate),
        Stream.runHead,
        Effect.flatMap(Option.match({ onNone: () => status, onSome: Effect.succeed }))
      )
    return { runOnce: run, status, awaitStatus }
  })

/** The maintenance layer (the Tag): the loop runs for the lifetime of the layer's scope. */
export const layer = (
  options: MaintenanceOptions = {}
): Layer.Layer<Maintenance, never, SqlClient.SqlClient | Health> => Layer.scoped(Maintenance, make(options))
