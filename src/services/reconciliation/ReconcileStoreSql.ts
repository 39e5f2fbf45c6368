/**
 * The PostgreSQL driver of the `ReconcileStore` port (see ReconcileStore.ts for the fencing it
 * implements). Reached through ReconcileStore.ts, which builds `layerSql` from `makeSql`: this
 * module reads the port's constants only when it runs.
 *
 * Revs (TIDs) compare bytewise, as `compareTid` does on the live path: every comparison says
 * `COLLATE "C"` (the columns keep the database's default collation: changing a column's collation
 * changes the result type of an older process's prepared statements during a rolling upgrade).
 * Under the database's default collation (the host's locale for the embedded PostgreSQL; an
 * Estonian one sorts `z` between `s` and `t`) an older stored rev could compare as newer than the
 * snapshot's: its row was neither updated nor deleted.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { SqlError } from "@effect/sql/SqlError"
import { Effect } from "effect"
import { KEY_TEXT_FORMAT } from "../operator/ListKey.js"
import { type StoreError, storeOp } from "../platform/Persistence.js"
import { toReconcileStatus, WEBHOOK_COLUMNS, type WebhookRow } from "../registry/RegistryStore.js"
import { clearOlderStatement, recordCtes, type RefusedVersion } from "../registry/RejectedStore.js"
import { backfillState, passState } from "./BackfillStateSql.js"
import {
  COMPLETION_SETTLE_MS,
  INITIAL_PASS,
  type OwnerReconcileState,
  RECONCILE_LOCK_KEY,
  type ReconcileStoreShape
} from "./ReconcileStore.js"

interface OwnerDbRow {
  readonly did: string
  readonly generation: string | number
  readonly reconcile_status: string
  readonly scan_generation: string | number | null
  readonly snapshot_rev: string | null
  readonly failure_count: number
  readonly last_failure_kind: string | null
  readonly scan_started_at: Date | null
  readonly completed_at: Date | null
  readonly failed_at: Date | null
  /** selected by `ownerState` only */
  readonly reconcile_requested?: boolean
}

interface CountRow {
  readonly n: number
}

const toDate = (v: unknown): Date | undefined => v instanceof Date ? v : typeof v === "string" ? new Date(v) : undefined

const ownerFromDb = (r: OwnerDbRow): OwnerReconcileState => ({
  did: r.did,
  generation: Number(r.generation),
  status: toReconcileStatus(r.reconcile_status),
  scanGeneration: r.scan_generation === null ? undefined : Number(r.scan_generation),
  snapshotRev: r.snapshot_rev ?? undefined,
  failureCount: Number(r.failure_count),
  lastFailureKind: r.last_failure_kind ?? undefined,
  scanStartedAt: toDate(r.scan_started_at),
  completedAt: toDate(r.completed_at),
  failedAt: toDate(r.failed_at),
  reconcileRequested: r.reconcile_requested === true
})

/** The `[completedAt, did]` keyset of `completedSince`; the beginning when unreadable. */
const parseCursor = (cursor: string): readonly [string, string] => {
  let parsed: unknown
  try {
    parsed = JSON.parse(cursor)
  } catch {
    return ["-infinity", ""]
  }
  return Array.isArray(parsed) && typeof parsed[0] === "string" && typeof parsed[1] === "string"
    ? [parsed[0], parsed[1]]
    : ["-infinity", ""]
}

const seconds = (ms: number): number => Math.max(0, ms) / 1000

/** The page rows as the JSON document `jsonb_to_recordset` reads. */
const pageJson = (rows: ReadonlyArray<WebhookRow>): string =>
  JSON.stringify(
    rows.map((r) => ({
      rkey: r.rkey,
      cid: r.cid ?? null,
      record: r.record,
      scope_uri: r.scopeUri,
      scope_did: r.scopeDid,
      backlinks: r.backlinks,
      url: r.url,
      events: r.events.join(","),
      enabled: r.enabled,
      signing_mode: r.signingMode,
      secret_id: r.secretId ?? null,
      fingerprint: r.fingerprint
    }))
  )

// ---------------------------------------------------------------------------------------------
// Fencing

/** Lock the owner row if it is still scanning with this token; false = fenced. */
const lockScan = (sql: SqlClient.SqlClient, did: string, token: number) =>
  sql<{ did: string }>`
      SELECT did FROM owners
      WHERE did = ${did} AND reconcile_status = 'scanning' AND scan_generation = ${token}
      FOR UPDATE`.pipe(Effect.map((rows) => rows.length > 0))

const count = (rows: ReadonlyArray<CountRow>): number => Number(rows[0]?.n ?? 0)

/**
 * One write of the scan `token`, in its own transaction that first locks the owner row: the
 * count `statement` answers, or undefined when the scan is fenced (nothing done).
 */
const fencedCount = (
  sql: SqlClient.SqlClient,
  did: string,
  token: number,
  statement: () => Effect.Effect<ReadonlyArray<CountRow>, SqlError>
): Effect.Effect<number | undefined, SqlError> =>
  sql.withTransaction(
    Effect.gen(function*() {
      if (!(yield* lockScan(sql, did, token))) return undefined
      return count(yield* statement())
    })
  )

// ---------------------------------------------------------------------------------------------
// Statements

const begin = (
  sql: SqlClient.SqlClient,
  did: string,
  options: { readonly maxOtherScanning: number; readonly staleScanMs: number }
) =>
  sql
    .withTransaction(
      Effect.gen(function*() {
        yield* sql`SELECT pg_advisory_xact_lock(${RECONCILE_LOCK_KEY})`
        const others = count(
          yield* sql<CountRow>`
                SELECT count(*)::int AS n FROM owners
                WHERE reconcile_status = 'scanning' AND did <> ${did}
                  AND scan_started_at > now() - make_interval(secs => ${
            seconds(options.staleScanMs)
          }::double precision)`
        )
        if (others >= options.maxOtherScanning) return { _tag: "busy" } as const
        const rows = yield* sql<{ generation: string | number; started_ms: number }>`
              INSERT INTO owners (did, generation, reconcile_status, scan_generation, scan_started_at)
              VALUES (${did}, 1, 'scanning', 1, now())
              ON CONFLICT (did) DO UPDATE SET
                generation = owners.generation + 1, reconcile_status = 'scanning',
                scan_generation = owners.generation + 1, scan_started_at = now(), updated_at = now(),
                reconcile_requested_at = NULL
              RETURNING generation, (extract(epoch FROM scan_started_at) * 1000)::float8 AS started_ms`
        const startedMs = Number(rows[0]?.started_ms)
        return {
          _tag: "begun",
          token: Number(rows[0]?.generation ?? 0),
          startedAtMs: Number.isFinite(startedMs) ? startedMs : undefined
        } as const
      })
    )
    .pipe(storeOp("reconcile.begin"))

/**
 * Step 2: the snapshot's rev, stored with the owner; live writes since begin that are not newer
 * than it are restamped below the token (the snapshot decides their keys). Revs compare bytewise.
 */
const saveSnapshotRev = (sql: SqlClient.SqlClient, did: string, token: number, snapshotRev: string) =>
  sql
    .withTransaction(
      Effect.gen(function*() {
        if (!(yield* lockScan(sql, did, token))) return false
        yield* sql`UPDATE owners SET snapshot_rev = ${snapshotRev}, updated_at = now() WHERE did = ${did}`
        yield* sql`
              UPDATE webhooks SET generation = ${token - 1}
              WHERE owner_did = ${did} AND generation > ${token} AND rev COLLATE "C" <= ${snapshotRev}`
        yield* sql`
              UPDATE tombstones SET generation = ${token - 1}
              WHERE owner_did = ${did} AND generation > ${token} AND rev COLLATE "C" <= ${snapshotRev}`
        return true
      })
    )
    .pipe(storeOp("reconcile.saveSnapshotRev"))

/**
 * Step 3: one page of the snapshot (see the port's module documentation for the rules): its rows,
 * the refused-record entries of their keys cleared, and its refused records recorded at the
 * snapshot's rev where no newer state of the key is stored (the rows' guard). A tombstone holds a
 * listed key back only when a live delete wrote it since begin (generation > token): an older
 * tombstone cannot outrank a record the PDS lists now, whatever its rev (one an earlier scan wrote
 * at its scan-start TID, for an account that was deactivated then, is ahead of the PDS's revs
 * until the owner commits again).
 */
const applyPage = (
  sql: SqlClient.SqlClient,
  did: string,
  token: number,
  snapshotRev: string,
  rows: ReadonlyArray<WebhookRow>,
  refused: ReadonlyArray<RefusedVersion>
) =>
  fencedCount(sql, did, token, () =>
    rows.length === 0 && refused.length === 0
      ? Effect.succeed([])
      : sql<CountRow>`
                WITH input AS (
                  SELECT * FROM jsonb_to_recordset(${pageJson(rows)}::jsonb) AS r(
                    rkey text, cid text, record jsonb, scope_uri text, scope_did text, backlinks boolean,
                    url text, events text, enabled boolean, signing_mode text, secret_id text, fingerprint text)
                ), upserted AS (
                  INSERT INTO webhooks (${sql.literal(WEBHOOK_COLUMNS)})
                  SELECT ${did}, i.rkey, ${snapshotRev}, ${token}, i.cid, i.record, i.scope_uri, i.scope_did,
                    i.backlinks, i.url, string_to_array(i.events, ','), i.enabled, i.enabled, i.signing_mode,
                    i.secret_id, i.fingerprint, NULL
                  FROM input i
                  WHERE NOT EXISTS (
                    SELECT 1 FROM tombstones t
                    WHERE t.owner_did = ${did} AND t.rkey = i.rkey
                      AND (t.generation > ${token} OR (t.live AND t.rev COLLATE "C" > ${snapshotRev})))
                  ON CONFLICT (owner_did, rkey) DO UPDATE SET
                    rev = EXCLUDED.rev, generation = EXCLUDED.generation, cid = EXCLUDED.cid,
                    record = EXCLUDED.record, scope_uri = EXCLUDED.scope_uri, scope_did = EXCLUDED.scope_did,
                    backlinks = EXCLUDED.backlinks, url = EXCLUDED.url, events = EXCLUDED.events,
                    enabled = EXCLUDED.enabled, active = EXCLUDED.active, signing_mode = EXCLUDED.signing_mode,
                    secret_id = EXCLUDED.secret_id, fingerprint = EXCLUDED.fingerprint,
                    gone_at = CASE
                      WHEN webhooks.cid IS NOT DISTINCT FROM EXCLUDED.cid AND webhooks.fingerprint = EXCLUDED.fingerprint
                      THEN webhooks.gone_at ELSE NULL END,
                    updated_at = now()
                  WHERE webhooks.generation <= ${token} AND webhooks.rev COLLATE "C" <= ${snapshotRev}
                  RETURNING rkey
                ), cleared AS (
                  DELETE FROM tombstones t USING upserted u
                  WHERE t.owner_did = ${did} AND t.rkey = u.rkey
                  RETURNING 1
                ), refusals_cleared AS (
                  DELETE FROM rejected_records r USING upserted u
                  WHERE r.owner_did = ${did} AND r.rkey = u.rkey AND r.rev COLLATE "C" <= ${snapshotRev}
                  RETURNING 1
                ), ${
        recordCtes(
          sql,
          did,
          snapshotRev,
          "reconciliation",
          refused,
          sql`NOT EXISTS (
                    SELECT 1 FROM tombstones t
                    WHERE t.owner_did = ${did} AND t.rkey = i.rkey
                      AND (t.generation > ${token} OR (t.live AND t.rev COLLATE "C" > ${snapshotRev})))
                  AND NOT EXISTS (
                    SELECT 1 FROM webhooks w
                    WHERE w.owner_did = ${did} AND w.rkey = i.rkey
                      AND (w.generation > ${token} OR w.rev COLLATE "C" > ${snapshotRev}))`
        )
      }
                SELECT count(*)::int AS n FROM upserted`).pipe(
      Effect.map((written) => (written === undefined ? { fenced: true, written: 0 } : { fenced: false, written })),
      storeOp("reconcile.applyPage")
    )

/**
 * Step 4: ≤ `limit` rows the snapshot did not contain (older than the scan: generation below its
 * token, rev not newer than its snapshot), each leaving a tombstone at the snapshot's rev.
 */
const deleteOlderStatement = (
  sql: SqlClient.SqlClient,
  did: string,
  token: number,
  snapshotRev: string,
  limit: number
) =>
  sql<CountRow>`
        WITH doomed AS (
          SELECT rkey FROM webhooks
          WHERE owner_did = ${did} AND generation < ${token} AND rev COLLATE "C" <= ${snapshotRev}
          ORDER BY rkey
          LIMIT ${limit}
          FOR UPDATE
        ), gone AS (
          DELETE FROM webhooks w USING doomed d
          WHERE w.owner_did = ${did} AND w.rkey = d.rkey
          RETURNING w.rkey
        ), stones AS (
          INSERT INTO tombstones (owner_did, rkey, rev, generation, live)
          SELECT ${did}, g.rkey, ${snapshotRev}, ${token}, false FROM gone g
          ON CONFLICT (owner_did, rkey) DO UPDATE SET
            rev = EXCLUDED.rev, generation = EXCLUDED.generation, live = false, deleted_at = now()
          RETURNING 1
        )
        SELECT count(*)::int AS n FROM gone`

/** Step 4, in small durable transactions (fenced): {@link deleteOlderStatement}. */
const deleteOlder = (sql: SqlClient.SqlClient, did: string, token: number, snapshotRev: string, limit: number) =>
  fencedCount(sql, did, token, () => deleteOlderStatement(sql, did, token, snapshotRev, limit)).pipe(
    Effect.map((deleted) => (deleted === undefined ? { fenced: true, deleted: 0 } : { fenced: false, deleted })),
    storeOp("reconcile.deleteOlder")
  )

/**
 * Rows the completion deletes once more under the owner's lock: those live writes held back by this
 * scan stored below its token after step 4's last transaction (`Registry.heldBackGeneration`; one
 * per live write in that window, so a few at most). Any beyond stay until the owner's next scan.
 */
export const COMPLETION_SWEEP_MAX = 1_000

/** Step 4: the owner's tombstones older than the snapshot, not this scan's, past the retention. */
const pruneTombstones = (
  sql: SqlClient.SqlClient,
  did: string,
  token: number,
  snapshotRev: string,
  retentionMs: number,
  limit: number
) =>
  fencedCount(sql, did, token, () =>
    sql<CountRow>`
                WITH doomed AS (
                  SELECT rkey FROM tombstones
                  WHERE owner_did = ${did} AND rev COLLATE "C" < ${snapshotRev} AND generation < ${token}
                    AND deleted_at < now() - make_interval(secs => ${seconds(retentionMs)}::double precision)
                  ORDER BY rkey
                  LIMIT ${limit}
                  FOR UPDATE
                ), gone AS (
                  DELETE FROM tombstones t USING doomed d
                  WHERE t.owner_did = ${did} AND t.rkey = d.rkey
                  RETURNING 1
                )
                SELECT count(*)::int AS n FROM gone`).pipe(
      Effect.map((pruned) => (pruned === undefined ? { fenced: true, pruned: 0 } : { fenced: false, pruned })),
      storeOp("reconcile.pruneTombstones")
    )

const complete = (
  sql: SqlClient.SqlClient,
  did: string,
  token: number,
  snapshotRev: string,
  whileLocked: Effect.Effect<void, StoreError>
) =>
  sql
    .withTransaction(
      Effect.gen(function*() {
        if (!(yield* lockScan(sql, did, token))) return false
        yield* sql`
              UPDATE owners SET reconcile_status = 'complete', snapshot_rev = ${snapshotRev},
                completed_snapshot_rev = ${snapshotRev}, completed_at = now(),
                failure_count = 0, last_failure_kind = NULL, updated_at = now()
              WHERE did = ${did}`
        // a live write held back by this scan may have been stored below its token since step 4's
        // last transaction: the snapshot decides its key too
        yield* deleteOlderStatement(sql, did, token, snapshotRev, COMPLETION_SWEEP_MAX)
        yield* clearOlderStatement(sql, did, snapshotRev)
        yield* whileLocked
        return true
      })
    )
    .pipe(storeOp("reconcile.complete"))

const retryCandidates = (sql: SqlClient.SqlClient, options: Parameters<ReconcileStoreShape["retryCandidates"]>[0]) =>
  sql`
        UPDATE owners SET reconcile_status = 'failed', failed_at = now(), failure_count = failure_count + 1,
          last_failure_kind = 'scan_crashed', snapshot_rev = completed_snapshot_rev, updated_at = now()
        WHERE reconcile_status = 'scanning'
          AND scan_started_at < now() - make_interval(secs => ${seconds(options.staleScanMs)}::double precision)
          AND did NOT IN (SELECT jsonb_array_elements_text(${JSON.stringify(options.exclude)}::jsonb))`.pipe(
    Effect.zipRight(sql<{ did: string; reconcile_status: string; failure_count: number }>`
        SELECT did, reconcile_status, failure_count FROM owners
        WHERE (reconcile_status = 'failed'
            OR (reconcile_status = 'scanning'
                AND scan_started_at < now() - make_interval(secs => ${seconds(options.staleScanMs)}::double precision)))
          AND did NOT IN (SELECT jsonb_array_elements_text(${JSON.stringify(options.exclude)}::jsonb))
        ORDER BY CASE WHEN reconcile_status = 'failed' THEN 0 ELSE 1 END,
          failed_at ASC NULLS LAST, scan_started_at ASC NULLS LAST, did
        LIMIT ${options.limit}`),
    Effect.map((rows) =>
      rows.map((r) => ({
        did: r.did,
        status: r.reconcile_status === "failed" ? ("failed" as const) : ("scanning" as const),
        failureCount: Number(r.failure_count)
      }))
    ),
    storeOp("reconcile.retryCandidates")
  )

/**
 * Stamp the known owners among `dids` that have no pending request, as many as fit under
 * `pendingMax` pending (in DID order); `marked = false` rows are those left out by the cap.
 */
const requestReconcile = (sql: SqlClient.SqlClient, dids: ReadonlyArray<string>, pendingMax: number) =>
  (dids.length === 0
    ? Effect.succeed({ requested: [], overCap: 0 })
    : sql<{ did: string; marked: boolean }>`
        WITH eligible AS (
          SELECT o.did FROM owners o
          WHERE o.did IN (SELECT jsonb_array_elements_text(${JSON.stringify(dids)}::jsonb))
            AND o.reconcile_requested_at IS NULL
        ), room AS (
          SELECT GREATEST(0, ${pendingMax}::int - count(*))::int AS n
          FROM owners WHERE reconcile_requested_at IS NOT NULL
        ), marked AS (
          UPDATE owners SET reconcile_requested_at = now()
          WHERE did IN (SELECT did FROM eligible ORDER BY did LIMIT (SELECT n FROM room))
            AND reconcile_requested_at IS NULL
          RETURNING did
        )
        SELECT did, true AS marked FROM marked
        UNION ALL
        SELECT did, false AS marked FROM eligible WHERE did NOT IN (SELECT did FROM marked)`.pipe(
      Effect.map((rows) => ({
        requested: rows.filter((r) => r.marked).map((r) => r.did).sort(),
        overCap: rows.filter((r) => !r.marked).length
      }))
    )).pipe(storeOp("reconcile.requestReconcile"))

const reconcileRequests = (
  sql: SqlClient.SqlClient,
  options: Parameters<ReconcileStoreShape["reconcileRequests"]>[0]
) =>
  sql<{ did: string }>`
        SELECT did FROM owners
        WHERE reconcile_requested_at IS NOT NULL
          AND (reconcile_status <> 'scanning'
            OR scan_started_at < now() - make_interval(secs => ${seconds(options.staleScanMs)}::double precision))
          AND did NOT IN (SELECT jsonb_array_elements_text(${JSON.stringify(options.exclude)}::jsonb))
          ${
    options.only === undefined
      ? sql``
      : sql`AND did IN (SELECT jsonb_array_elements_text(${JSON.stringify(options.only)}::jsonb))`
  }
        ORDER BY reconcile_requested_at, did
        LIMIT ${options.limit}`.pipe(
    Effect.map((rows) => rows.map((r) => r.did)),
    storeOp("reconcile.reconcileRequests")
  )

const completedSince = (sql: SqlClient.SqlClient, cursor: string, limit: number, settleMs = COMPLETION_SETTLE_MS) =>
  Effect.gen(function*() {
    const [at, after] = parseCursor(cursor)
    const rows = yield* sql<{ did: string; at: string }>`
          SELECT did, to_char(completed_at AT TIME ZONE 'UTC', ${KEY_TEXT_FORMAT}) AS at FROM owners
          WHERE reconcile_status = 'complete' AND completed_at IS NOT NULL
            AND (completed_at, did) > (${at}::timestamptz, ${after})
            AND completed_at <= now() - make_interval(secs => ${seconds(settleMs)}::double precision)
          ORDER BY completed_at, did
          LIMIT ${limit}`
    const last = rows[rows.length - 1]
    return {
      dids: rows.map((r) => r.did),
      cursor: last === undefined ? cursor : JSON.stringify([last.at, last.did])
    }
  }).pipe(storeOp("reconcile.completedSince"))

const summary = (sql: SqlClient.SqlClient, limit: number) =>
  Effect.gen(function*() {
    const counts = { unknown: 0, scanning: 0, complete: 0, failed: 0 }
    const rows = yield* sql<{ reconcile_status: string; n: number }>`
          SELECT reconcile_status, count(*)::int AS n FROM owners GROUP BY reconcile_status`
    for (const r of rows) counts[toReconcileStatus(r.reconcile_status)] += Number(r.n)
    const failed = yield* sql<OwnerDbRow>`
          SELECT did, generation, reconcile_status, scan_generation, snapshot_rev, failure_count, last_failure_kind,
            scan_started_at, completed_at, failed_at
          FROM owners WHERE reconcile_status = 'failed' ORDER BY failed_at DESC NULLS LAST, did LIMIT ${limit}`
    const scanning = yield* sql<OwnerDbRow>`
          SELECT did, generation, reconcile_status, scan_generation, snapshot_rev, failure_count, last_failure_kind,
            scan_started_at, completed_at, failed_at
          FROM owners WHERE reconcile_status = 'scanning' ORDER BY scan_started_at NULLS LAST, did LIMIT ${limit}`
    const pass = yield* passState(sql, INITIAL_PASS)
    return {
      counts,
      failed: failed.map(ownerFromDb).map((o) => ({
        did: o.did,
        failureCount: o.failureCount,
        lastFailureKind: o.lastFailureKind,
        failedAt: o.failedAt
      })),
      scanning: scanning.map(ownerFromDb).map((o) => ({ did: o.did, scanStartedAt: o.scanStartedAt })),
      pass
    }
  }).pipe(storeOp("reconcile.summary"))

// ---------------------------------------------------------------------------------------------
// The store

export const makeSql = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const store: ReconcileStoreShape = {
    begin: (did, options) => begin(sql, did, options),
    saveSnapshotRev: (did, token, snapshotRev) => saveSnapshotRev(sql, did, token, snapshotRev),
    applyPage: (did, token, snapshotRev, rows, refused) => applyPage(sql, did, token, snapshotRev, rows, refused),
    deleteOlder: (did, token, snapshotRev, limit) => deleteOlder(sql, did, token, snapshotRev, limit),
    pruneTombstones: (did, token, snapshotRev, retentionMs, limit) =>
      pruneTombstones(sql, did, token, snapshotRev, retentionMs, limit),
    complete: (did, token, snapshotRev, whileLocked) => complete(sql, did, token, snapshotRev, whileLocked),
    withOwnerLock: (did, eff) =>
      sql
        .withTransaction(
          sql`SELECT did FROM owners WHERE did = ${did} FOR UPDATE`.pipe(Effect.zipRight(eff))
        )
        .pipe(storeOp("reconcile.withOwnerLock")),

    markFailed: (did, token, kind) =>
      sql<{ did: string }>`
        UPDATE owners SET reconcile_status = 'failed', failed_at = now(), failure_count = failure_count + 1,
          last_failure_kind = ${kind}, snapshot_rev = completed_snapshot_rev, updated_at = now()
        WHERE did = ${did} AND reconcile_status = 'scanning' AND scan_generation = ${token}
        RETURNING did`.pipe(
        Effect.map((rows) => rows.length > 0),
        storeOp("reconcile.markFailed")
      ),

    markFailedIdle: (did, kind) =>
      sql<{ did: string }>`
        INSERT INTO owners (did, reconcile_status, failed_at, failure_count, last_failure_kind)
        VALUES (${did}, 'failed', now(), 1, ${kind})
        ON CONFLICT (did) DO UPDATE SET reconcile_status = 'failed', failed_at = now(),
          failure_count = owners.failure_count + 1, last_failure_kind = EXCLUDED.last_failure_kind, updated_at = now()
        WHERE owners.reconcile_status <> 'scanning'
        RETURNING did`.pipe(
        Effect.map((rows) => rows.length > 0),
        storeOp("reconcile.markFailedIdle")
      ),

    ownerState: (did) =>
      sql<OwnerDbRow>`
        SELECT did, generation, reconcile_status, scan_generation, snapshot_rev, failure_count, last_failure_kind,
          scan_started_at, completed_at, failed_at, reconcile_requested_at IS NOT NULL AS reconcile_requested
        FROM owners WHERE did = ${did}`.pipe(
        Effect.map((rows) => (rows[0] === undefined ? undefined : ownerFromDb(rows[0]))),
        storeOp("reconcile.ownerState")
      ),

    addOwners: (dids, source) => {
      if (dids.length === 0) return Effect.void
      const list = JSON.stringify(dids)
      const query = source === "operator"
        ? sql`
              INSERT INTO owners (did, from_operator)
              SELECT d, true FROM jsonb_array_elements_text(${list}::jsonb) AS d
              ON CONFLICT (did) DO UPDATE SET from_operator = true, updated_at = now()
              WHERE NOT owners.from_operator`
        : sql`
              INSERT INTO owners (did, from_discovery)
              SELECT d, true FROM jsonb_array_elements_text(${list}::jsonb) AS d
              ON CONFLICT (did) DO UPDATE SET from_discovery = true, updated_at = now()
              WHERE NOT owners.from_discovery`
      return query.pipe(Effect.asVoid, storeOp("reconcile.addOwners"))
    },

    ownersPage: (after, limit) =>
      sql<{ did: string }>`
        SELECT did FROM (
          (SELECT did FROM owners
           WHERE (from_stream OR from_discovery OR from_operator) AND did > ${after ?? ""}
           ORDER BY did LIMIT ${limit})
          UNION
          (SELECT DISTINCT owner_did AS did FROM webhooks
           WHERE owner_did > ${after ?? ""}
           ORDER BY owner_did LIMIT ${limit})
        ) u
        ORDER BY did
        LIMIT ${limit}`.pipe(
        Effect.map((rows) => rows.map((r) => r.did)),
        storeOp("reconcile.ownersPage")
      ),

    ...backfillState(sql),

    retryCandidates: (options) => retryCandidates(sql, options),
    requestReconcile: (dids, pendingMax) => requestReconcile(sql, dids, pendingMax),
    reconcileRequests: (options) => reconcileRequests(sql, options),
    completedCursor: (marginMs) =>
      sql<{ at: string }>`
        SELECT to_char((now() - make_interval(secs => ${seconds(marginMs)}::double precision)) AT TIME ZONE 'UTC',
          ${KEY_TEXT_FORMAT}) AS at`.pipe(
        Effect.map((rows) => JSON.stringify([rows[0]?.at ?? "-infinity", ""])),
        storeOp("reconcile.completedCursor")
      ),

    completedSince: (cursor, limit, settleMs) => completedSince(sql, cursor, limit, settleMs),
    summary: (limit) => summary(sql, limit)
  }
  return store
})
