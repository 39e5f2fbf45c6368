/**
 * The outbox's PostgreSQL driver ({@link OutboxStore}): bodies, rows, quarantine and NOTIFY as
 * data-modifying CTEs of one statement where they fit.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type * as Statement from "@effect/sql/Statement"
import { Effect } from "effect"
import * as CursorStore from "../intake/CursorStore.js"
import { storeOp } from "../platform/Persistence.js"
import { originKey } from "./Origin.js"
import type { CorruptionCandidate, EventBody, OutboxRow, OutboxStoreShape, QuarantineRow } from "./Outbox.js"
import { notifyStatement } from "./OutboxNotify.js"
import * as PriorRefsStore from "./PriorRefsStore.js"

interface BatchResultRow {
  readonly inserted: number | string | null
  readonly existing: unknown
}

const stringSet = (v: unknown): ReadonlySet<string> => {
  const out = new Set<string>()
  const parsed: unknown = typeof v === "string" ? JSON.parse(v) : v
  if (Array.isArray(parsed)) { for (const x of parsed) if (typeof x === "string") out.add(x) }
  return out
}

const existingOf = (v: unknown): ReadonlyMap<string, string> => {
  const existing = new Map<string, string>()
  const pairs: unknown = typeof v === "string" ? JSON.parse(v) : v
  if (Array.isArray(pairs)) {
    for (const p of pairs) {
      if (Array.isArray(p) && typeof p[0] === "string" && typeof p[1] === "string") existing.set(p[0], p[1])
    }
  }
  return existing
}

/**
 * The rows given, as the relation `outbox_rows` (one CTE, read by the insert and by the move).
 */
const rowsCte = (sql: SqlClient.SqlClient, c: ReturnType<typeof columns>) =>
  sql`outbox_rows AS (
      SELECT * FROM unnest(${c.deliveryId}::text[], ${c.eventId}::text[], ${c.ownerDid}::text[],
        ${c.webhookRkey}::text[], ${c.matchKind}::text[], ${c.eventDid}::text[], ${c.eventCollection}::text[],
        ${c.eventRkey}::text[], ${c.eventOperation}::text[], ${c.targetUrl}::text[], ${c.signingMode}::text[],
        ${c.secretId}::text[], ${c.fingerprint}::text[], ${c.origin}::text[])
        AS r(delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection, event_rkey,
          event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
    )`

/**
 * `outbox_moved`: an existing row of the same delivery id (event + owner + rkey: an earlier match of
 * the event by another version of the webhook, e.g. the direct stream read a post before the
 * registry stream read the webhook's new URL) is moved to the given, newer registration when that
 * matters and nothing of it was tried: not attempted (`attempt_count = 0`) and either `pending`
 * (not leased) with another fingerprint, or cancelled `subscription_changed` (`delivery/Attempt.ts`:
 * the check at delivery saw another version) whatever its fingerprint (a webhook that came back to
 * the row's version, URL1 → URL2 → URL1 or a pause then a resume, was cancelled at the middle
 * version and matches again now). Such a row is pending and due now, like a new one, and counts as
 * inserted (it wakes the workers). A `leased` row not attempted, of another fingerprint, is claimed
 * by a worker that has not sent it yet: its status and lease are kept (the worker holds it) and the
 * new version is written to `moved_to` only (0018): the worker's screen then sees the new version
 * and cancels the row `subscription_changed`, which the settle (delivery/DeliveryStoreSql.ts)
 * applies as this move instead; any other settle clears it (the old version was tried or sent).
 * Such a row does not count as inserted (nothing is claimable yet). A row attempted, delivered or
 * dead-lettered, or cancelled for another reason, is kept (at least once: its version was tried).
 * An UPDATE, not `ON CONFLICT DO UPDATE`: that would lock every conflicting row (a replay's, which
 * the workers are settling) until the commit, whether or not it moves; this locks only the rows it
 * moves (and the rare leased untried rows it marks: their settle waits for this commit), and reads
 * the table only for the ids the insert (`outbox_new`, which it cannot see: one snapshot) did not
 * take, by the primary key (`= ANY` of an array built first: a join of the batch's rows let the
 * planner pick a scan of the whole outbox for a large batch, doubling PostgreSQL's CPU per delivery
 * in the e2e bench), so a batch without conflicts reads nothing. One UPDATE for both kinds (each
 * column chosen by the row's old status) so a replay reads each conflicting row once.
 * `valid`: the rows' condition of the insert (a body that matches).
 */
const movedCte = (sql: SqlClient.SqlClient, valid: Statement.Fragment) =>
  sql`outbox_moved AS (
      UPDATE outbox o SET
        match_kind = CASE WHEN o.status = 'leased' THEN o.match_kind ELSE r.match_kind END,
        target_url = CASE WHEN o.status = 'leased' THEN o.target_url ELSE r.target_url END,
        signing_mode = CASE WHEN o.status = 'leased' THEN o.signing_mode ELSE r.signing_mode END,
        secret_id = CASE WHEN o.status = 'leased' THEN o.secret_id ELSE r.secret_id END,
        fingerprint = CASE WHEN o.status = 'leased' THEN o.fingerprint ELSE r.fingerprint END,
        origin = CASE WHEN o.status = 'leased' THEN o.origin ELSE r.origin END,
        moved_to = CASE WHEN o.status = 'leased' THEN jsonb_build_object('match_kind', r.match_kind,
          'target_url', r.target_url, 'signing_mode', r.signing_mode, 'secret_id', r.secret_id,
          'fingerprint', r.fingerprint, 'origin', r.origin) END,
        status = CASE WHEN o.status = 'leased' THEN o.status ELSE 'pending' END,
        next_attempt_at = CASE WHEN o.status = 'leased' THEN o.next_attempt_at ELSE now() END,
        lease_token = CASE WHEN o.status = 'leased' THEN o.lease_token END,
        leased_until = CASE WHEN o.status = 'leased' THEN o.leased_until END,
        last_error_kind = CASE WHEN o.status = 'leased' THEN o.last_error_kind END,
        last_http_status = CASE WHEN o.status = 'leased' THEN o.last_http_status END,
        finished_at = CASE WHEN o.status = 'leased' THEN o.finished_at END,
        crash_count = CASE WHEN o.status = 'leased' THEN o.crash_count ELSE 0 END,
        updated_at = CASE WHEN o.status = 'leased' THEN o.updated_at ELSE now() END
      FROM outbox_rows r
      WHERE o.delivery_id = ANY (ARRAY(
          SELECT x.delivery_id FROM outbox_rows x WHERE x.delivery_id NOT IN (SELECT delivery_id FROM outbox_new)
        ))
        AND r.delivery_id = o.delivery_id AND ${valid} AND o.attempt_count = 0
        AND ((o.status IN ('pending', 'leased') AND o.fingerprint IS DISTINCT FROM r.fingerprint)
          OR (o.status = 'cancelled' AND o.last_error_kind = 'subscription_changed'))
      RETURNING o.delivery_id, o.status
    ), outbox_inserted AS (
      SELECT delivery_id FROM outbox_new UNION ALL SELECT delivery_id FROM outbox_moved WHERE status = 'pending'
    )`

/**
 * One row per delivery id, in first-seen order with the last one's values (what two statements
 * would leave): `ON CONFLICT DO UPDATE` cannot touch a row twice in one statement.
 */
const uniqueRows = (rows: ReadonlyArray<OutboxRow>): ReadonlyArray<OutboxRow> => {
  const byId = new Map<string, OutboxRow>()
  for (const r of rows) byId.set(r.deliveryId, r)
  return byId.size === rows.length ? rows : [...byId.values()]
}

const quarantineInsert = (sql: SqlClient.SqlClient, rows: ReadonlyArray<QuarantineRow>) =>
  sql`INSERT INTO quarantine ${
    sql.insert(
      rows.map((r) => ({
        stream: r.stream,
        relay: r.relay,
        reason: r.reason,
        event_hash: r.eventHash,
        cursor: r.cursor === undefined ? null : r.cursor.toString()
      }))
    )
  }`

/**
 * Bodies, rows and NOTIFY as data-modifying CTEs (`outbox_bodies`, `outbox_events`,
 * `outbox_inserted`, `outbox_count`, `outbox_notified`, `outbox_corrupt`): the body insert touches
 * an existing body (see `insertEvents`); rows are inserted (or an untried row moved to a new
 * version, `onConflict`) only for events whose stored body is the one given; the NOTIFY runs only
 * when a row was inserted; each `corruption` row whose event's stored body differs is inserted
 * into the quarantine.
 */
const outboxCtes = (
  sql: SqlClient.SqlClient,
  bodies: ReadonlyArray<EventBody>,
  rows: ReadonlyArray<OutboxRow>,
  corruption: ReadonlyArray<CorruptionCandidate>
) => {
  const c = columns(uniqueRows(rows))
  const q = {
    eventId: corruption.map((x) => x.eventId),
    stream: corruption.map((x) => x.row.stream),
    relay: corruption.map((x) => x.row.relay),
    eventHash: corruption.map((x) => x.row.eventHash),
    cursor: corruption.map((x) => (x.row.cursor === undefined ? null : x.row.cursor.toString()))
  }
  return sql`outbox_bodies AS (
      SELECT * FROM unnest(${bodies.map((x) => x.eventId)}::text[], ${bodies.map((x) => x.body)}::text[],
        ${bodies.map((x) => x.sha256)}::text[]) AS b(event_id, body, body_sha256)
    ), outbox_events AS (
      INSERT INTO delivery_events (event_id, body, body_sha256) SELECT event_id, body, body_sha256 FROM outbox_bodies
      ON CONFLICT (event_id) DO UPDATE SET created_at = now()
      RETURNING event_id, body_sha256, (xmax = 0) AS inserted
    ), outbox_mismatch AS (
      SELECT e.event_id FROM outbox_events e JOIN outbox_bodies b USING (event_id) WHERE e.body_sha256 <> b.body_sha256
    ), ${rowsCte(sql, c)}, outbox_new AS (
      INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
        event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
      SELECT r.* FROM outbox_rows r
      WHERE r.event_id NOT IN (SELECT event_id FROM outbox_mismatch)
      ON CONFLICT (delivery_id) DO NOTHING
      RETURNING delivery_id
    ), ${movedCte(sql, sql`r.event_id NOT IN (SELECT event_id FROM outbox_mismatch)`)}, outbox_count AS (
      SELECT count(*)::int AS c FROM outbox_inserted
    ), outbox_notified AS (
      ${notifyStatement(sql)} FROM outbox_count WHERE c > 0
    ), outbox_corrupt AS (
      INSERT INTO quarantine (stream, relay, reason, event_hash, cursor)
      SELECT q.stream, q.relay, 'corruption', q.event_hash, q.cursor
      FROM unnest(${q.eventId}::text[], ${q.stream}::text[], ${q.relay}::text[], ${q.eventHash}::text[],
        ${q.cursor}::bigint[]) WITH ORDINALITY AS q(event_id, stream, relay, event_hash, cursor, n)
      WHERE q.event_id IN (SELECT event_id FROM outbox_mismatch)
      ORDER BY q.n
      RETURNING 1
    )`
}

/** The result columns of `outboxCtes` (referencing `outbox_notified` is what runs the NOTIFY). */
const outboxColumns = (sql: SqlClient.SqlClient) =>
  sql`(SELECT c FROM outbox_count) AS inserted, (SELECT count(*)::int FROM outbox_notified) AS notified,
    (SELECT coalesce(json_agg(json_build_array(event_id, body_sha256)), '[]'::json) FROM outbox_events WHERE NOT inserted)
      AS existing`

export const makeSql = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const store: OutboxStoreShape = {
    insertEvents: (bodies) =>
      Effect.gen(function*() {
        if (bodies.length === 0) return new Map<string, string>()
        // an existing body is touched (created_at refreshed, row locked until commit) so that
        // maintenance cannot prune it between this statement and the commit of its outbox rows
        const rows = yield* sql<{ event_id: string; body_sha256: string; inserted: boolean }>`
          INSERT INTO delivery_events ${
          sql.insert(
            bodies.map((b) => ({ event_id: b.eventId, body: b.body, body_sha256: b.sha256 }))
          )
        }
          ON CONFLICT (event_id) DO UPDATE SET created_at = now()
          RETURNING event_id, body_sha256, (xmax = 0) AS inserted`
        const out = new Map<string, string>()
        for (const r of rows) if (!r.inserted) out.set(r.event_id, r.body_sha256)
        return out
      }).pipe(storeOp("outbox.insertEvents")),
    insertRows: (rows) =>
      rows.length === 0
        ? Effect.succeed(0)
        : sql<{ delivery_id: string }>`WITH ${rowsCte(sql, columns(uniqueRows(rows)))}, outbox_new AS (
            INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did,
              event_collection, event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin)
            SELECT r.* FROM outbox_rows r
            ON CONFLICT (delivery_id) DO NOTHING
            RETURNING delivery_id
          ), ${movedCte(sql, sql`true`)}
          SELECT delivery_id FROM outbox_inserted`.pipe(
          Effect.map((r) => r.length),
          storeOp("outbox.insertRows")
        ),
    insertQuarantine: (rows) =>
      rows.length === 0
        ? Effect.void
        : quarantineInsert(sql, rows).pipe(Effect.asVoid, storeOp("outbox.insertQuarantine")),
    // a non-empty payload: listen() (PgListen.ts) drops notifications whose payload is empty
    notify: notifyStatement(sql).pipe(Effect.asVoid, storeOp("outbox.notify")),
    insertBatch: (bodies, rows) =>
      bodies.length === 0
        ? Effect.succeed({ existing: new Map<string, string>(), inserted: 0 })
        : sql<BatchResultRow>`WITH ${outboxCtes(sql, bodies, rows, [])}
            SELECT ${outboxColumns(sql)}`.pipe(
          Effect.map((result) => ({
            existing: existingOf(result[0]?.existing),
            inserted: Number(result[0]?.inserted ?? 0)
          })),
          storeOp("outbox.insertBatch")
        ),
    commitBatch: (c) => {
      const ctes: Array<Statement.Fragment> = []
      const withPrior = c.prior !== undefined && (c.prior.upserts.length > 0 || c.prior.deletes.length > 0)
      if (c.prior !== undefined && withPrior) ctes.push(PriorRefsStore.writeCtes(sql, c.prior))
      c.cursors.forEach((w, k) =>
        ctes.push(sql`${sql.literal(`cursor_saved_${k}`)} AS (${CursorStore.saveStatement(sql, w)} RETURNING 1)`)
      )
      if (c.quarantine.length > 0) ctes.push(sql`quarantined AS (${quarantineInsert(sql, c.quarantine)} RETURNING 1)`)
      const withOutbox = c.bodies.length > 0
      if (withOutbox) ctes.push(outboxCtes(sql, c.bodies, c.rows, c.corruption))
      if (ctes.length === 0) {
        return Effect.succeed({
          existing: new Map<string, string>(),
          inserted: 0,
          insertedIds: new Set<string>(),
          priorWritten: new Set<string>()
        })
      }
      return sql<BatchResultRow & { inserted_ids: unknown; prior_written: unknown }>`WITH ${sql.csv(ctes)}
        SELECT ${withOutbox ? outboxColumns(sql) : sql`0 AS inserted, '[]'::json AS existing`},
          ${
        withOutbox ? sql`(SELECT coalesce(json_agg(delivery_id), '[]'::json) FROM outbox_inserted)` : sql`'[]'::json`
      }
            AS inserted_ids,
          ${withPrior ? sql`(SELECT coalesce(json_agg(record_uri), '[]'::json) FROM prior_written)` : sql`'[]'::json`}
            AS prior_written`.pipe(
        Effect.map((result) => {
          const r = result[0]
          return {
            existing: existingOf(r?.existing),
            inserted: Number(r?.inserted ?? 0),
            insertedIds: stringSet(r?.inserted_ids),
            priorWritten: stringSet(r?.prior_written)
          }
        }),
        storeOp("outbox.commitBatch")
      )
    }
  }
  return store
})

/** rows as column arrays (for `unnest`) */
const columns = (rows: ReadonlyArray<OutboxRow>) => {
  const n = rows.length
  const c = {
    deliveryId: new Array<string>(n),
    eventId: new Array<string>(n),
    ownerDid: new Array<string>(n),
    webhookRkey: new Array<string>(n),
    matchKind: new Array<string>(n),
    eventDid: new Array<string>(n),
    eventCollection: new Array<string>(n),
    eventRkey: new Array<string>(n),
    eventOperation: new Array<string>(n),
    targetUrl: new Array<string>(n),
    signingMode: new Array<string>(n),
    secretId: new Array<string | null>(n),
    fingerprint: new Array<string>(n),
    origin: new Array<string>(n)
  }
  for (let i = 0; i < n; i++) {
    const r = rows[i]
    if (r === undefined) continue
    c.deliveryId[i] = r.deliveryId
    c.eventId[i] = r.eventId
    c.ownerDid[i] = r.ownerDid
    c.webhookRkey[i] = r.webhookRkey
    c.matchKind[i] = r.matchKind
    c.eventDid[i] = r.eventDid
    c.eventCollection[i] = r.eventCollection
    c.eventRkey[i] = r.eventRkey
    c.eventOperation[i] = r.eventOperation
    c.targetUrl[i] = r.targetUrl
    c.signingMode[i] = r.signingMode
    c.secretId[i] = r.secretId ?? null
    c.fingerprint[i] = r.fingerprint
    c.origin[i] = originKey(r.targetUrl)
  }
  return c
}
