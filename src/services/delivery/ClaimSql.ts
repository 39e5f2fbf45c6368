/**
 * The claim of the delivery store's SQL driver (DeliveryStoreSql.ts): the claimed row as the
 * database returns it, the fragments the driver's statements share, and the claim's statements
 * (its plan, the window and the origin walk that each pick rows, the statement that leases them,
 * and the result). See DeliveryStore.ts for the leases and the per-origin fairness it implements.
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import type * as Statement from "@effect/sql/Statement"
import { ORIGIN_SQL } from "../matching/Origin.js"
import type { OutboxOperation } from "../matching/OutboxStatus.js"
import { toReconcileStatus, toSigningMode } from "../registry/RegistryStore.js"
import {
  CANDIDATE_FACTOR,
  CANDIDATE_MAX,
  CLAIM_MAX,
  type ClaimedRow,
  type ClaimOptions,
  type ClaimResult,
  ORIGIN_WALK_MAX,
  PARK_ORIGINS_MAX,
  SCAN_MAX,
  type SubscriptionSnapshot
} from "./DeliveryStore.js"
import { clampInt } from "./SettleRequests.js"

export interface ClaimDbRow {
  readonly cand_count: number
  readonly over_room: number
  readonly win_count: number | null
  readonly walked: number
  readonly walk_last: string | null
  readonly delivery_id: string | null
  readonly event_id: string | null
  readonly owner_did: string | null
  readonly webhook_rkey: string | null
  readonly match_kind: string | null
  readonly event_did: string | null
  readonly event_collection: string | null
  readonly event_rkey: string | null
  readonly event_operation: string | null
  readonly target_url: string | null
  readonly signing_mode: string | null
  readonly secret_id: string | null
  readonly fingerprint: string | null
  readonly attempt_count: number | null
  readonly lease_token: string | null
  readonly origin: string | null
  readonly age_ms: number | null
  readonly first_attempt: boolean | null
  readonly reclaimed: boolean | null
  readonly crash_count: number | null
  readonly body: string | null
  readonly sub_exists: boolean | null
  readonly sub_active: boolean | null
  readonly sub_enabled: boolean | null
  readonly sub_gone: boolean | null
  readonly sub_auto_disabled: boolean | null
  readonly sub_url: string | null
  readonly sub_fingerprint: string | null
  readonly sub_signing_mode: string | null
  readonly sub_secret_id: string | null
  readonly sub_secret: string | null
  readonly owner_status: string | null
}

const toOperation = (s: string | null): OutboxOperation =>
  s === "update" || s === "delete" || s === "test" ? s : "create"

export type SnapshotDbRow = Pick<
  ClaimDbRow,
  | "sub_exists"
  | "sub_active"
  | "sub_enabled"
  | "sub_gone"
  | "sub_auto_disabled"
  | "sub_url"
  | "sub_fingerprint"
  | "sub_signing_mode"
  | "sub_secret_id"
  | "sub_secret"
  | "owner_status"
>

export const snapshotFrom = (r: SnapshotDbRow): SubscriptionSnapshot => ({
  exists: r.sub_exists === true,
  active: r.sub_active === true,
  enabled: r.sub_enabled === true,
  gone: r.sub_gone === true,
  autoDisabled: r.sub_auto_disabled === true,
  url: r.sub_url ?? "",
  fingerprint: r.sub_fingerprint ?? "",
  signingMode: toSigningMode(r.sub_signing_mode),
  secretId: r.sub_secret_id ?? undefined,
  recordSecret: r.sub_secret ?? undefined,
  ownerStatus: toReconcileStatus(r.owner_status)
})

export const MISSING_SUBSCRIPTION: SubscriptionSnapshot = snapshotFrom({
  sub_exists: false,
  sub_active: null,
  sub_enabled: null,
  sub_gone: null,
  sub_auto_disabled: null,
  sub_url: null,
  sub_fingerprint: null,
  sub_signing_mode: null,
  sub_secret_id: null,
  sub_secret: null,
  owner_status: null
})

const fromClaim = (r: ClaimDbRow): ClaimedRow | undefined => {
  if (r.delivery_id === null || r.lease_token === null) return undefined
  return {
    deliveryId: r.delivery_id,
    eventId: r.event_id ?? "",
    ownerDid: r.owner_did ?? "",
    webhookRkey: r.webhook_rkey ?? "",
    matchKind: r.match_kind === "backlink" ? "backlink" : "direct",
    eventDid: r.event_did ?? "",
    eventCollection: r.event_collection ?? "",
    eventRkey: r.event_rkey ?? "",
    eventOperation: toOperation(r.event_operation),
    targetUrl: r.target_url ?? "",
    signingMode: toSigningMode(r.signing_mode),
    secretId: r.secret_id ?? undefined,
    fingerprint: r.fingerprint ?? "",
    attemptCount: Number(r.attempt_count ?? 0),
    leaseToken: r.lease_token,
    origin: r.origin ?? "",
    ageMs: Math.max(0, Number(r.age_ms ?? 0)),
    firstAttempt: r.first_attempt === true,
    reclaimed: r.reclaimed === true,
    crashCount: Number(r.crash_count ?? 0),
    body: r.body ?? undefined,
    snapshot: snapshotFrom(r)
  }
}

// ---------------------------------------------------------------------------------------------
// Fragments

/** The subscription and owner state of a claimed row or of a key (`w` = webhooks, `ow` = owners). */
const SUBSCRIPTION_COLUMNS = `(w.owner_did IS NOT NULL) AS sub_exists, w.active AS sub_active,
        w.enabled AS sub_enabled, (w.gone_at IS NOT NULL) AS sub_gone,
        (w.auto_disabled_at IS NOT NULL) AS sub_auto_disabled, w.url AS sub_url,
        w.fingerprint AS sub_fingerprint, w.signing_mode AS sub_signing_mode, w.secret_id AS sub_secret_id,
        w.record->>'secret' AS sub_secret, ow.reconcile_status AS owner_status`

/** The fragments the statements share, made once per store. */
export interface Fragments {
  readonly origin: Statement.Fragment
  readonly duePending: Statement.Fragment
  readonly subscriptionColumns: Statement.Fragment
  readonly noSubscriptionColumns: Statement.Fragment
  readonly subscriptionJoins: Statement.Fragment
}

export const fragments = (sql: SqlClient.SqlClient): Fragments => ({
  // the stored origin; computed from the URL for rows enqueued before `outbox.origin` existed
  origin: sql.literal(`COALESCE(origin, ${ORIGIN_SQL})`),
  duePending: sql.literal(`status = 'pending' AND next_attempt_at <= now()`),
  subscriptionColumns: sql.literal(SUBSCRIPTION_COLUMNS),
  noSubscriptionColumns: sql.literal(`false AS sub_exists, NULL::boolean AS sub_active,
        NULL::boolean AS sub_enabled, NULL::boolean AS sub_gone,
        NULL::boolean AS sub_auto_disabled, NULL::text AS sub_url,
        NULL::text AS sub_fingerprint, NULL::text AS sub_signing_mode, NULL::text AS sub_secret_id,
        NULL::text AS sub_secret, NULL::text AS owner_status`),
  subscriptionJoins: sql.literal(`LEFT JOIN webhooks w ON w.owner_did = u.owner_did AND w.rkey = u.webhook_rkey
      LEFT JOIN owners ow ON ow.did = u.owner_did`)
})

// ---------------------------------------------------------------------------------------------
// Claim

/** A claim's bounds, from its arguments. */
export interface ClaimPlan {
  readonly workerId: string
  /** rows at most (> 0) */
  readonly n: number
  /** candidate rows read at most, per branch */
  readonly scan: number
  readonly rooms: ReadonlyArray<{ readonly origin: string; readonly room: number }>
  readonly full: ReadonlyArray<string>
  /** origins whose circuit is open: none of their rows (stored origin) is read */
  readonly open: ReadonlyArray<string>
  /** expired-lease candidates counted before (`crash_count ≥ 1`) read at most (≤ scan) */
  readonly reclaim: number
  readonly defaultRoom: number
  readonly lease: number
  readonly options: ClaimOptions
}

/** The claim's bounds; undefined when there is nothing to claim. */
export const claimPlan = (
  workerId: string,
  limit: number,
  leaseMs: number,
  options: ClaimOptions
): ClaimPlan | undefined => {
  const n = clampInt(limit, 0, CLAIM_MAX)
  if (n === 0) return undefined
  const scan = Math.min(CANDIDATE_MAX, n * CANDIDATE_FACTOR)
  const rooms = (options.rooms ?? []).filter((r) => r.room > 0)
  const full = options.fullOrigins ?? []
  const open = (options.openOrigins ?? []).slice(0, PARK_ORIGINS_MAX)
  const defaultRoom = clampInt(options.defaultRoom ?? CLAIM_MAX, 0, CLAIM_MAX)
  const lease = clampInt(leaseMs, 1, 24 * 3_600_000)
  const reclaim = clampInt(options.reclaimRoom ?? scan, 0, scan)
  return { workerId, n, scan, rooms, full, open, reclaim, defaultRoom, lease, options }
}

/** Each origin's room as a table `r(origin, room)`; an origin not in it has the default room. */
const roomTable = (sql: SqlClient.SqlClient, p: ClaimPlan) =>
  sql`unnest(${p.rooms.map((r) => r.origin)}::text[], ${p.rooms.map((r) => r.room)}::int[]) AS r(origin, room)`

/**
 * The claim, in two statements. The first reads candidates from the oldest ≤ `SCAN_MAX` due rows
 * (the window) less those of full or open origins, and ranks them per origin against each origin's
 * room. When that leaves the claim short while rows may lie beyond what it read (the window or the
 * candidate limit was reached: {@link walkAfter}), one origin's backlog could be hiding every
 * other origin's rows (a burst to one receiver, a slow one whose backlog grows). The second
 * statement then walks the origins that have pending rows (a skip scan of `outbox_origin_due`, ≤
 * `ORIGIN_WALK_MAX` origins after `cursor`, wrapping once and ending with `cursor` itself, so that
 * with two origins the one walked last is walked again) and takes the oldest due rows, up to each
 * origin's room, of every walked origin the first one took nothing of (and that is neither full
 * nor open). A claim that is not short runs the first statement only, unchanged but for one count.
 */
export const windowHead = (sql: SqlClient.SqlClient, f: Fragments, p: ClaimPlan) =>
  sql`win AS (
        SELECT delivery_id, next_attempt_at, ${f.origin} AS origin, origin AS stored FROM outbox
        WHERE ${f.duePending}
        ORDER BY next_attempt_at LIMIT ${SCAN_MAX}
      ),
      cand AS (
        (SELECT p.delivery_id, p.next_attempt_at, p.origin FROM win p
         WHERE p.origin <> ALL(${p.full}::text[]) AND (p.stored IS NULL OR p.stored <> ALL(${p.open}::text[]))
         LIMIT ${p.scan})
        UNION ALL
        -- expired leases: a first reclaim (crash_count <= 0) as many as fit, rows counted before
        -- (suspects attempted one at a time: Suspects.ts) at most the reclaim room
        (SELECT x.delivery_id, x.next_attempt_at, x.origin FROM (
           SELECT l.delivery_id, l.next_attempt_at, l.origin, l.leased_until, l.counted,
             row_number() OVER (PARTITION BY l.counted ORDER BY l.leased_until) AS rn
           FROM (
             SELECT delivery_id, next_attempt_at, ${f.origin} AS origin, origin AS stored, leased_until,
               crash_count > 0 AS counted FROM outbox
             WHERE status = 'leased' AND leased_until < now()
             ORDER BY leased_until LIMIT ${SCAN_MAX}
           ) l WHERE l.origin <> ALL(${p.full}::text[]) AND (l.stored IS NULL OR l.stored <> ALL(${p.open}::text[]))
         ) x WHERE NOT x.counted OR x.rn <= ${p.reclaim}
         ORDER BY x.leased_until LIMIT ${p.scan})
      ),
      ranked AS (
        SELECT c.delivery_id, c.next_attempt_at, c.origin,
          row_number() OVER (PARTITION BY c.origin ORDER BY c.next_attempt_at, c.delivery_id) AS rn,
          COALESCE(r.room, ${p.defaultRoom}::int) AS room
        FROM cand c
        LEFT JOIN ${roomTable(sql, p)} ON r.origin = c.origin
      ),
      picked AS (
        SELECT delivery_id FROM ranked WHERE rn <= room ORDER BY next_attempt_at, delivery_id LIMIT ${p.n}
      ),
      stats AS (
        SELECT c.n AS cand_count,
               (SELECT count(*) FROM ranked WHERE rn > room)::int AS over_room,
               -- the window's size matters only when the candidates did not fill their limit, and the
               -- window was then read whole already
               CASE WHEN c.n >= ${p.scan} THEN NULL ELSE (SELECT count(*) FROM win)::int END AS win_count,
               0 AS walked, NULL::text AS walk_last
        FROM (SELECT count(*)::int AS n FROM cand) c
      )`

/** The origin walk's bounds: the first statement's plan, less what it took. */
export interface WalkPlan {
  readonly plan: ClaimPlan
  /** rows still wanted (> 0) */
  readonly n: number
  /** full and open origins, and those the first statement took rows of */
  readonly exclude: ReadonlyArray<string>
  readonly cursor: string
}

export const walkHead = (sql: SqlClient.SqlClient, w: WalkPlan) =>
  sql`RECURSIVE walk (origin, step, wrapped) AS (
        SELECT ${w.cursor}::text, 0, false
        UNION ALL
        SELECT nx.origin, w.step + 1, nx.wrapped FROM walk w
        CROSS JOIN LATERAL (SELECT (SELECT o.origin FROM outbox o WHERE o.status = 'pending' AND o.origin > w.origin
                                    ORDER BY o.origin LIMIT 1) AS after OFFSET 0) a
        CROSS JOIN LATERAL (SELECT
            CASE WHEN a.after IS NOT NULL OR w.wrapped THEN a.after
                 ELSE (SELECT o.origin FROM outbox o WHERE o.status = 'pending' AND o.origin IS NOT NULL
                       ORDER BY o.origin LIMIT 1) END AS origin,
            (w.wrapped OR a.after IS NULL) AS wrapped) nx
        WHERE w.step < ${ORIGIN_WALK_MAX} AND nx.origin IS NOT NULL AND NOT (nx.wrapped AND nx.origin > ${w.cursor}::text)
      ),
      picked AS (
        SELECT x.delivery_id FROM walk w
        LEFT JOIN ${roomTable(sql, w.plan)} ON r.origin = w.origin
        CROSS JOIN LATERAL (
          SELECT o.delivery_id, o.next_attempt_at FROM outbox o
          WHERE o.status = 'pending' AND o.origin = w.origin AND o.next_attempt_at <= now()
          ORDER BY o.next_attempt_at LIMIT LEAST(COALESCE(r.room, ${w.plan.defaultRoom}::int), ${w.n}::int)
        ) x
        WHERE w.step > 0 AND w.origin <> ALL(${w.exclude}::text[])
        ORDER BY x.next_attempt_at, x.delivery_id LIMIT ${w.n}
      ),
      stats AS (
        SELECT 0 AS cand_count, 0 AS over_room, NULL::int AS win_count,
               (SELECT count(*) FROM walk WHERE step > 0)::int AS walked,
               (SELECT origin FROM walk WHERE step > 0 ORDER BY step DESC LIMIT 1) AS walk_last
      )`

/** Leases the rows of `picked` (the head's) and returns them with the head's `stats`. */
export const takeStatement = (sql: SqlClient.SqlClient, f: Fragments, p: ClaimPlan, head: Statement.Fragment) =>
  sql<ClaimDbRow>`
      WITH ${head},
      locked AS (
        SELECT o.delivery_id, o.updated_at AS touched_at, o.status AS was_status, o.lease_token AS was_token FROM outbox o
        WHERE o.delivery_id IN (SELECT delivery_id FROM picked)
          AND ((o.status = 'pending' AND o.next_attempt_at <= now()) OR (o.status = 'leased' AND o.leased_until < now()))
        FOR UPDATE OF o SKIP LOCKED
      ),
      upd AS (
        UPDATE outbox o SET
          status = 'leased',
          lease_token = ${p.workerId} || ':' || gen_random_uuid()::text,
          leased_until = now() + ${p.lease}::int * interval '1 millisecond',
          -- a row taken from pending starts clean (replays, retries and deferrals reset it); one
          -- taken from an expired lease keeps it (Suspects.ts counts its attempts as a suspect)
          crash_count = CASE WHEN locked.was_status = 'pending' THEN 0 ELSE o.crash_count END,
          updated_at = now()
        FROM locked
        WHERE o.delivery_id = locked.delivery_id
        RETURNING o.delivery_id, o.event_id, o.owner_did, o.webhook_rkey, o.match_kind, o.event_did,
          o.event_collection, o.event_rkey, o.event_operation, o.target_url, o.signing_mode, o.secret_id,
          o.fingerprint, o.attempt_count, o.lease_token, o.next_attempt_at,
          ${sql.literal(`COALESCE(o.origin, ${ORIGIN_SQL.replace("target_url", "o.target_url")})`)} AS origin,
          (extract(epoch FROM (now() - o.created_at)) * 1000)::float8 AS age_ms,
          -- no request yet: untouched since its enqueue, or touched (deferred, moved, reclaimed,
          -- reset) without an attempt recorded; a replayed or redelivered row has its attempts
          CASE WHEN o.attempt_count > 0 THEN false WHEN locked.touched_at = o.created_at THEN true
               ELSE NOT EXISTS (SELECT 1 FROM delivery_attempts a WHERE a.delivery_id = o.delivery_id) END
            AS first_attempt,
          -- taken over from another worker (an id is new at every start): this worker's own expired
          -- lease (a settle that failed through a database outage, a stall) is no death
          (locked.was_status = 'leased' AND NOT starts_with(locked.was_token, ${p.workerId} || ':')) AS reclaimed,
          o.crash_count
      )
      SELECT stats.cand_count, stats.over_room, stats.win_count, stats.walked, stats.walk_last, u.delivery_id,
        u.event_id, u.owner_did, u.webhook_rkey,
        u.match_kind, u.event_did, u.event_collection, u.event_rkey, u.event_operation, u.target_url,
        u.signing_mode, u.secret_id, u.fingerprint, u.attempt_count, u.lease_token, u.origin, u.age_ms,
        u.first_attempt, u.reclaimed, u.crash_count, e.body,
        ${p.options.withSubscriptions === false ? f.noSubscriptionColumns : f.subscriptionColumns}
      FROM stats
      LEFT JOIN upd u ON true
      LEFT JOIN delivery_events e ON e.event_id = u.event_id
      ${p.options.withSubscriptions === false ? sql.literal("") : f.subscriptionJoins}
      ORDER BY u.next_attempt_at`

export interface ClaimPart {
  readonly rows: ReadonlyArray<ClaimedRow>
  readonly candCount: number
  readonly overRoom: number
  readonly winCount: number | undefined
  readonly walked: number
  readonly walkLast: string | undefined
}

export const claimPart = (dbRows: ReadonlyArray<ClaimDbRow>): ClaimPart => {
  const rows: Array<ClaimedRow> = []
  let stats: ClaimDbRow | undefined
  for (const r of dbRows) {
    stats = r
    const row = fromClaim(r)
    if (row !== undefined) rows.push(row)
  }
  return {
    rows,
    candCount: Number(stats?.cand_count ?? 0),
    overRoom: Number(stats?.over_room ?? 0),
    winCount: stats?.win_count === null || stats?.win_count === undefined ? undefined : Number(stats.win_count),
    walked: Number(stats?.walked ?? 0),
    walkLast: stats?.walk_last ?? undefined
  }
}

/**
 * The walk that should follow the first statement, if any: it was short (fewer rows than it may
 * take) while rows may lie beyond what it read (its candidates filled their limit, or its window
 * was full).
 */
export const walkAfter = (p: ClaimPlan, first: ClaimPart, cursor: string): WalkPlan | undefined => {
  const short = first.rows.length < p.n
  const beyond = first.candCount >= p.scan || (first.winCount ?? 0) >= SCAN_MAX
  if (!short || !beyond) return undefined
  const exclude = new Set([...p.full, ...p.open])
  for (const r of first.rows) exclude.add(r.origin)
  return { plan: p, n: p.n - first.rows.length, exclude: [...exclude], cursor }
}

/** Both parts as one claim; `moreDue` also when a walk used all its steps (origins left unvisited). */
export const claimResult = (p: ClaimPlan, first: ClaimPart, walked: ClaimPart | undefined): ClaimResult => {
  const rows = walked === undefined ? first.rows : [...first.rows, ...walked.rows]
  const moreDue = rows.length >= p.n || first.candCount >= p.scan || first.overRoom > 0 ||
    (walked !== undefined && walked.walked >= ORIGIN_WALK_MAX)
  return { rows, moreDue }
}
