/**
 * The delivery side of the outbox (SPEC §4.1–4.3, §4.7): claiming due rows under a lease, renewing
 * leases, and settling rows, behind a Tag with a PostgreSQL implementation.
 *
 * Leases. `claim` moves due rows (`pending` with `next_attempt_at <= now()`, or `leased` with an
 * expired `leased_until`: the reaper) to `leased` in ONE statement, with a lease token
 * `<workerId>:<uuid>` per row and `leased_until = now() + lease`. The candidate rows are read in
 * `next_attempt_at` order; the chosen ones are then locked `FOR UPDATE SKIP LOCKED` and re-checked,
 * so any number of workers (processes) can claim from one table and never get the same row while
 * its lease is valid. Every later write (`heartbeat` and the settle operations) is guarded by
 * `status = 'leased' AND lease_token = <mine>` and answers whether it applied: a worker that lost
 * its lease (expired and reclaimed) can never overwrite the row.
 *
 * Per-origin fairness. The claim is told how many more rows of each URL origin the worker may hold
 * (`rooms`; `defaultRoom` for origins it holds none of) and which origins are full (`fullOrigins`,
 * skipped while reading candidates, within a bounded read of `scanMax` rows). Rows over an origin's
 * room are left pending for later claims, so one busy origin cannot fill a worker's pool.
 *
 * The claim also returns, per row, the subscription and owner state it read in the same statement
 * ({@link SubscriptionSnapshot}), so a worker that attempts the row right away needs no extra
 * round trip to check that the subscription is unchanged.
 *
 * Settling. Terminal operations (`markDelivered`, `deadLetter`, `cancel`) set `finished_at` and
 * write the audit row (URL always `[redacted]`) in the same statement as the guarded update; an
 * attempt record (`delivery_attempts`, response excerpt ≤ 1 KiB) can ride along with any settle
 * operation. So either the whole settle happened or none of it did. Concurrent settles are applied
 * in batches (one statement, one commit per batch; see `runBatch`), each row still guarded by its
 * own token.
 *
 * Times stored in the database are computed by the database (`now()` + a delay in ms), so every
 * worker agrees on them whatever its own clock says. Every operation has a timeout.
 */
import { SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Cause, Clock, Context, Duration, Effect, Exit, Layer, Option, Queue, Ref, Scope, Stream } from "effect"
import type { Connection } from "@effect/sql/SqlConnection"
import type { SqlError } from "@effect/sql/SqlError"
import type { SigningMode } from "../matching/WebhookIndex.js"
import type { Operation } from "../../schemas/RecordEvent.js"
import { NOTIFY_CHANNEL, ORIGIN_SQL, originKey, type OutboxRow } from "../matching/Outbox.js"
import { codeOf, StoreError, storeOpWithin } from "../platform/Persistence.js"

export { originKey }

// ---------------------------------------------------------------------------------------------
// Model

/** A claimed outbox row (the enqueued row's fields, `targetUrl` being the URL at enqueue time, so a
 * changed URL cancels the row) with its lease and payload body. */
export interface ClaimedRow extends OutboxRow {
  /** attempts already spent */
  readonly attemptCount: number
  /** this claim's lease token `<workerId>:<uuid>` */
  readonly leaseToken: string
  /** the origin key of `targetUrl` ({@link originKey}) */
  readonly origin: string
  /** ms since the row was enqueued (database clock) at claim time */
  readonly ageMs: number
  /** the stored canonical body; undefined if the body row is missing */
  readonly body: string | undefined
  /** the subscription and its owner as they were when the row was claimed (same statement) */
  readonly snapshot: SubscriptionSnapshot
}

/**
 * The subscription a claimed row belongs to, read by the claim statement itself (so a fresh claim
 * needs no further round trip to check it). `exists: false` = no webhook row.
 */
export interface SubscriptionSnapshot {
  readonly exists: boolean
  readonly active: boolean
  readonly enabled: boolean
  readonly gone: boolean
  readonly url: string
  readonly fingerprint: string
  readonly signingMode: SigningMode
  readonly secretId: string | undefined
  /** the record's inline secret (signing mode `record_secret`) */
  readonly recordSecret: string | undefined
  /** the owner's reconciliation status (`unknown` when the owner has no row) */
  readonly ownerStatus: "unknown" | "scanning" | "complete" | "failed"
}

/** A subscription's key: its owner and the record key of its `place.wisp.v2.wh` record. */
export interface SubscriptionKey {
  readonly ownerDid: string
  readonly rkey: string
}

export interface ClaimOptions {
  /** origins the worker already holds rows of, with how many more it may take (> 0) */
  readonly rooms?: ReadonlyArray<{ readonly origin: string; readonly room: number }>
  /** origins the worker may take no more rows of */
  readonly fullOrigins?: ReadonlyArray<string>
  /** how many rows of an origin not listed above may be taken (default: no limit) */
  readonly defaultRoom?: number
  /**
   * whether the claim reads each row's subscription and owner state (`ClaimedRow.snapshot`);
   * default true. A worker that reads them when each attempt starts passes false (the snapshot is
   * then `exists: false` and must not be used).
   */
  readonly withSubscriptions?: boolean
}

export interface ClaimResult {
  readonly rows: ReadonlyArray<ClaimedRow>
  /**
   * true when more due rows were probably left behind: the claim was full, the candidate window
   * was full, or rows were skipped because of an origin's room.
   */
  readonly moreDue: boolean
}

/** One row of `delivery_attempts`. The sequence number is assigned by the store. */
export interface AttemptRecord {
  /** epoch ms (the worker's Clock) */
  readonly startedAtMs: number
  readonly durationMs: number
  /** `delivered` · `retry` · `dead_letter` · `skipped` (transform answered no request) */
  readonly outcome: "delivered" | "retry" | "dead_letter" | "skipped"
  readonly errorKind: string | undefined
  readonly httpStatus: number | undefined
  /** at most {@link RESPONSE_EXCERPT_BYTES} bytes of the response body; truncated by the store */
  readonly responseExcerpt: string | undefined
}

export interface AuditEntry {
  readonly deliveryId: string
  readonly eventId: string
  readonly ownerDid: string
  readonly webhookRkey: string
  readonly eventDid: string
  readonly eventCollection: string
  readonly eventRkey: string
  readonly eventOperation: Operation
  readonly status: "delivered" | "dead_letter" | "cancelled"
  readonly httpStatus: number | undefined
  readonly errorKind: string | undefined
}

export interface DeliveryCounts {
  readonly pending: number
  readonly leased: number
  readonly deadLetter: number
}

export interface DeliveryStoreShape {
  /** Lease up to `limit` due rows for `leaseMs` (see the module documentation). */
  readonly claim: (
    workerId: string,
    limit: number,
    leaseMs: number,
    options?: ClaimOptions
  ) => Effect.Effect<ClaimResult, StoreError>
  /** Extend my lease to now + `leaseMs`; false when the lease is no longer mine. */
  readonly heartbeat: (deliveryId: string, token: string, leaseMs: number) => Effect.Effect<boolean, StoreError>
  /** `heartbeat` for many rows in one statement; answers the tokens whose lease was extended. */
  readonly heartbeatMany: (
    leases: ReadonlyArray<{ readonly deliveryId: string; readonly token: string }>,
    leaseMs: number
  ) => Effect.Effect<ReadonlySet<string>, StoreError>
  /** → `delivered` (+ audit). `attemptCount` is the new total. */
  readonly markDelivered: (
    deliveryId: string,
    token: string,
    outcome: {
      readonly attemptCount: number
      readonly httpStatus: number | undefined
      readonly attempt?: AttemptRecord | undefined
    }
  ) => Effect.Effect<boolean, StoreError>
  /** → `pending` again after `delayMs`, attempt spent, lease cleared. */
  readonly reschedule: (
    deliveryId: string,
    token: string,
    retry: {
      readonly attemptCount: number
      readonly delayMs: number
      readonly errorKind: string
      readonly httpStatus: number | undefined
      readonly attempt?: AttemptRecord | undefined
    }
  ) => Effect.Effect<boolean, StoreError>
  /** → `pending` again after `delayMs` WITHOUT spending an attempt (owner scanning, circuit open, release). */
  readonly defer: (deliveryId: string, token: string, delayMs: number) => Effect.Effect<boolean, StoreError>
  /** → `dead_letter` (+ audit). */
  readonly deadLetter: (
    deliveryId: string,
    token: string,
    failure: {
      readonly attemptCount: number
      readonly errorKind: string
      readonly httpStatus: number | undefined
      readonly attempt?: AttemptRecord | undefined
    }
  ) => Effect.Effect<boolean, StoreError>
  /** → `cancelled` with `reason` as `last_error_kind` (+ audit). */
  readonly cancel: (deliveryId: string, token: string, reason: string) => Effect.Effect<boolean, StoreError>
  /** Append one attempt record (outside a settle). */
  readonly recordAttempt: (deliveryId: string, attempt: AttemptRecord) => Effect.Effect<void, StoreError>
  /** Append one audit row (outside a settle). The URL is always `[redacted]`. */
  readonly insertAudit: (entry: AuditEntry) => Effect.Effect<void, StoreError>
  /**
   * The current subscription and owner state of each key, in the order of `keys` (one statement
   * for all of them): the per-attempt check of SPEC §4.2 step 1, batched across attempts.
   */
  readonly subscriptions: (
    keys: ReadonlyArray<SubscriptionKey>
  ) => Effect.Effect<ReadonlyArray<SubscriptionSnapshot>, StoreError>
  /** Row counts for health (cached for a few seconds; each count stops at 1,000,001). */
  readonly counts: Effect.Effect<DeliveryCounts, StoreError>
  /** One element per outbox notification (`LISTEN firehook_outbox`). */
  readonly wakeups: Stream.Stream<void, StoreError>
  /** Send one outbox notification (used to confirm that LISTEN is established). */
  readonly notify: Effect.Effect<void, StoreError>
}

export class DeliveryStore extends Context.Tag("firehook/DeliveryStore")<DeliveryStore, DeliveryStoreShape>() {}

// ---------------------------------------------------------------------------------------------
// Limits

/** Bytes of response body kept in `delivery_attempts.response_excerpt`. */
export const RESPONSE_EXCERPT_BYTES = 1024
/** Largest `limit` one claim accepts. */
export const CLAIM_MAX = 1000
/**
 * Candidate rows read per claim: `CANDIDATE_FACTOR × limit`, at most `CANDIDATE_MAX`. Rows of full
 * origins are skipped while reading (they never count), so the window only has to absorb origins
 * whose room is smaller than their due rows; 2 read half as many rows per claim as 4 did
 * (PostgreSQL CPU per delivery 0.29 → 0.27 ms in bench/delivery), and a claim that filled its
 * window reports `moreDue`, so the worker claims again at once.
 */
export const CANDIDATE_FACTOR = 2
export const CANDIDATE_MAX = 2000
/** Rows read at most, per branch, while skipping the rows of full origins. */
export const SCAN_MAX = 4000
/** Settles applied by one statement at most. */
export const SETTLE_BATCH_MAX = 256
/**
 * Settle statements in flight at once. One: settles that arrive while a statement runs wait for the
 * next one (group commit), so batches grow with the load: 37 rows per statement instead of 9.5
 * with four flushers in bench/delivery (PostgreSQL CPU per delivery 0.41 → 0.30 ms).
 */
export const SETTLE_FLUSHERS = 1
/** Health counts stop counting here (health clamps at 1,000,000 anyway). */
export const COUNT_CAP = 1_000_001
/** How long health counts are cached. */
export const COUNTS_TTL_MS = 5_000
/** Every statement of this store is abandoned after this long. */
export const STATEMENT_TIMEOUT = Duration.seconds(15)

/** UTF-8 text of at most `RESPONSE_EXCERPT_BYTES` bytes, without NULs (PostgreSQL text refuses them). */
export const excerpt = (bytes: Uint8Array): string =>
  new TextDecoder("utf-8", { fatal: false })
    .decode(bytes.subarray(0, RESPONSE_EXCERPT_BYTES))
    .replace(/\u0000/g, "")
    .replace(/\uFFFD+$/, "")

const boundExcerpt = (s: string | undefined): string | null => {
  if (s === undefined) return null
  const bytes = Buffer.from(s, "utf8")
  return bytes.length <= RESPONSE_EXCERPT_BYTES ? s.replace(/\u0000/g, "") : excerpt(bytes)
}

const clampInt = (n: number, min: number, max: number): number =>
  Number.isFinite(n) ? Math.min(max, Math.max(min, Math.floor(n))) : min

/** Map a failure to a `StoreError` and bound the statement's time. */
const op = (name: string) => storeOpWithin(name, STATEMENT_TIMEOUT)

// ---------------------------------------------------------------------------------------------
// PostgreSQL


interface ClaimDbRow {
  readonly cand_count: number
  readonly over_room: number
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
  readonly body: string | null
  readonly sub_exists: boolean | null
  readonly sub_active: boolean | null
  readonly sub_enabled: boolean | null
  readonly sub_gone: boolean | null
  readonly sub_url: string | null
  readonly sub_fingerprint: string | null
  readonly sub_signing_mode: string | null
  readonly sub_secret_id: string | null
  readonly sub_secret: string | null
  readonly owner_status: string | null
}

/** One settle request (every settle operation is one of these, applied in batches). */
interface Settle {
  readonly deliveryId: string
  readonly token: string
  readonly status: "pending" | "delivered" | "dead_letter" | "cancelled"
  /** new total; undefined = unchanged */
  readonly attemptCount: number | undefined
  /** next attempt after this many ms; undefined = unchanged */
  readonly delayMs: number | undefined
  /** whether `last_error_kind` is set (to `errorKind`, possibly NULL) */
  readonly setError: boolean
  readonly errorKind: string | undefined
  /** whether `last_http_status` is set (to `httpStatus`, possibly NULL) */
  readonly setHttp: boolean
  readonly httpStatus: number | undefined
  /** terminal: `finished_at` and an audit row */
  readonly terminal: boolean
  readonly attempt: AttemptRecord | undefined
}

const toOperation = (s: string | null): Operation => (s === "update" || s === "delete" ? s : "create")
const toSigningMode = (s: string | null): SigningMode => (s === "record_secret" || s === "secret_id" ? s : "none")

type SnapshotDbRow = Pick<
  ClaimDbRow,
  | "sub_exists"
  | "sub_active"
  | "sub_enabled"
  | "sub_gone"
  | "sub_url"
  | "sub_fingerprint"
  | "sub_signing_mode"
  | "sub_secret_id"
  | "sub_secret"
  | "owner_status"
>

const snapshotFrom = (r: SnapshotDbRow): SubscriptionSnapshot => ({
  exists: r.sub_exists === true,
  active: r.sub_active === true,
  enabled: r.sub_enabled === true,
  gone: r.sub_gone === true,
  url: r.sub_url ?? "",
  fingerprint: r.sub_fingerprint ?? "",
  signingMode: toSigningMode(r.sub_signing_mode),
  secretId: r.sub_secret_id ?? undefined,
  recordSecret: r.sub_secret ?? undefined,
  ownerStatus:
    r.owner_status === "scanning" || r.owner_status === "complete" || r.owner_status === "failed"
      ? r.owner_status
      : "unknown"
})

const MISSING_SUBSCRIPTION: SubscriptionSnapshot = snapshotFrom({
  sub_exists: false,
  sub_active: null,
  sub_enabled: null,
  sub_gone: null,
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
    body: r.body ?? undefined,
    snapshot: snapshotFrom(r)
  }
}

export const makeSql: Effect.Effect<
  DeliveryStoreShape,
  never,
  SqlClient.SqlClient | PgClient.PgClient | Scope.Scope
> = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const pg = yield* PgClient.PgClient
  // the stored origin; computed from the URL for rows enqueued before `outbox.origin` existed
  const origin = sql.literal(`COALESCE(origin, ${ORIGIN_SQL})`)
  const DUE_PENDING = sql.literal(`status = 'pending' AND next_attempt_at <= now()`)
  const SUBSCRIPTION_COLUMNS = sql.literal(`(w.owner_did IS NOT NULL) AS sub_exists, w.active AS sub_active,
        w.enabled AS sub_enabled, (w.gone_at IS NOT NULL) AS sub_gone, w.url AS sub_url,
        w.fingerprint AS sub_fingerprint, w.signing_mode AS sub_signing_mode, w.secret_id AS sub_secret_id,
        w.record->>'secret' AS sub_secret, ow.reconcile_status AS owner_status`)
  const NO_SUBSCRIPTION_COLUMNS = sql.literal(`false AS sub_exists, NULL::boolean AS sub_active,
        NULL::boolean AS sub_enabled, NULL::boolean AS sub_gone, NULL::text AS sub_url,
        NULL::text AS sub_fingerprint, NULL::text AS sub_signing_mode, NULL::text AS sub_secret_id,
        NULL::text AS sub_secret, NULL::text AS owner_status`)
  const SUBSCRIPTION_JOINS = sql.literal(`LEFT JOIN webhooks w ON w.owner_did = u.owner_did AND w.rkey = u.webhook_rkey
      LEFT JOIN owners ow ON ow.did = u.owner_did`)

  // The claim connection. Plan guard: right after a burst (an event fan-out, a replay of dead
  // letters) the planner's statistics still describe a small outbox, and it picks a bitmap scan of
  // EVERY due row plus a sort over the ordered `outbox_due` index scan that the LIMIT needs
  // (measured: 44 ms instead of ~1 ms per claim at 25,000 due rows, growing with the backlog).
  // Claims therefore run on one connection reserved from the pool with `enable_bitmapscan = off`
  // for its session (one round trip per claim; a transaction with `SET LOCAL` costs three more).
  // Claims of this store take turns on it. After a failed claim the connection is given back
  // (setting reset first) and the next claim reserves a fresh one; the layer's scope gives it back
  // at shutdown.
  const claimLock = yield* Effect.makeSemaphore(1)
  let claimConn: { readonly conn: Connection; readonly scope: Scope.CloseableScope } | undefined
  const releaseClaimConn = Effect.suspend(() => {
    const held = claimConn
    claimConn = undefined
    return held === undefined ? Effect.void : Scope.close(held.scope, Exit.void)
  })
  yield* Effect.addFinalizer(() => releaseClaimConn)
  const claimConnection = Effect.suspend(() => {
    const held = claimConn
    if (held !== undefined) return Effect.succeed(held.conn)
    return Effect.flatMap(Scope.make(), (scope) =>
      Scope.extend(sql.reserve, scope).pipe(
        Effect.tap((conn) =>
          Effect.zipRight(
            conn.executeUnprepared("SET enable_bitmapscan = off", [], undefined),
            // runs before the pool release added by `reserve` (finalizers run in reverse order)
            Scope.addFinalizer(
              scope,
              conn.executeUnprepared("RESET enable_bitmapscan", [], undefined).pipe(
                Effect.timeout(Duration.seconds(2)),
                Effect.ignore
              )
            )
          )
        ),
        Effect.tap((conn) => Effect.sync(() => (claimConn = { conn, scope }))),
        Effect.onError((cause) => Scope.close(scope, Exit.failCause(cause)))
      )
    )
  })
  // A pool of one connection cannot give one away for good: there the claim runs in a transaction
  // of its own with `SET LOCAL` (three more round trips per claim, as before the reserved connection).
  const reserveForClaims = (pg.config.maxConnections ?? 10) >= 2
  const onClaimConnection = <A>(statement: Effect.Effect<A, SqlError, never>) =>
    !reserveForClaims
      ? sql.withTransaction(Effect.zipRight(sql`SET LOCAL enable_bitmapscan = off`, statement))
      : claimLock.withPermits(1)(
      Effect.flatMap(claimConnection, (conn) =>
        Effect.provideService(statement, SqlClient.TransactionConnection, [conn, 0] as const)
      ).pipe(Effect.onError(() => releaseClaimConn))
    )

  const claim: DeliveryStoreShape["claim"] = (workerId, limit, leaseMs, options = {}) => {
    const n = clampInt(limit, 0, CLAIM_MAX)
    if (n === 0) return Effect.succeed({ rows: [], moreDue: false })
    const scan = Math.min(CANDIDATE_MAX, n * CANDIDATE_FACTOR)
    const rooms = (options.rooms ?? []).filter((r) => r.room > 0)
    const full = options.fullOrigins ?? []
    const defaultRoom = clampInt(options.defaultRoom ?? CLAIM_MAX, 0, CLAIM_MAX)
    const lease = clampInt(leaseMs, 1, 24 * 3_600_000)
    const claimStatement = sql<ClaimDbRow>`
      WITH cand AS (
        (SELECT p.delivery_id, p.next_attempt_at, p.origin FROM (
           SELECT delivery_id, next_attempt_at, ${origin} AS origin FROM outbox
           WHERE ${DUE_PENDING}
           ORDER BY next_attempt_at LIMIT ${SCAN_MAX}
         ) p WHERE p.origin <> ALL(${full}::text[]) LIMIT ${scan})
        UNION ALL
        (SELECT l.delivery_id, l.next_attempt_at, l.origin FROM (
           SELECT delivery_id, next_attempt_at, ${origin} AS origin FROM outbox
           WHERE status = 'leased' AND leased_until < now()
           ORDER BY leased_until LIMIT ${SCAN_MAX}
         ) l WHERE l.origin <> ALL(${full}::text[]) LIMIT ${scan})
      ),
      ranked AS (
        SELECT c.delivery_id, c.next_attempt_at, c.origin,
          row_number() OVER (PARTITION BY c.origin ORDER BY c.next_attempt_at, c.delivery_id) AS rn,
          COALESCE(r.room, ${defaultRoom}::int) AS room
        FROM cand c
        LEFT JOIN unnest(${rooms.map((r) => r.origin)}::text[], ${rooms.map((r) => r.room)}::int[]) AS r(origin, room)
          ON r.origin = c.origin
      ),
      picked AS (
        SELECT delivery_id FROM ranked WHERE rn <= room ORDER BY next_attempt_at, delivery_id LIMIT ${n}
      ),
      locked AS (
        SELECT o.delivery_id FROM outbox o
        WHERE o.delivery_id IN (SELECT delivery_id FROM picked)
          AND ((o.status = 'pending' AND o.next_attempt_at <= now()) OR (o.status = 'leased' AND o.leased_until < now()))
        FOR UPDATE OF o SKIP LOCKED
      ),
      upd AS (
        UPDATE outbox o SET
          status = 'leased',
          lease_token = ${workerId} || ':' || gen_random_uuid()::text,
          leased_until = now() + ${lease}::int * interval '1 millisecond',
          updated_at = now()
        FROM locked
        WHERE o.delivery_id = locked.delivery_id
        RETURNING o.delivery_id, o.event_id, o.owner_did, o.webhook_rkey, o.match_kind, o.event_did,
          o.event_collection, o.event_rkey, o.event_operation, o.target_url, o.signing_mode, o.secret_id,
          o.fingerprint, o.attempt_count, o.lease_token, o.next_attempt_at,
          ${sql.literal(`COALESCE(o.origin, ${ORIGIN_SQL.replace("target_url", "o.target_url")})`)} AS origin,
          (extract(epoch FROM (now() - o.created_at)) * 1000)::float8 AS age_ms
      ),
      stats AS (
        SELECT (SELECT count(*) FROM cand)::int AS cand_count,
               (SELECT count(*) FROM ranked WHERE rn > room)::int AS over_room
      )
      SELECT stats.cand_count, stats.over_room, u.delivery_id, u.event_id, u.owner_did, u.webhook_rkey,
        u.match_kind, u.event_did, u.event_collection, u.event_rkey, u.event_operation, u.target_url,
        u.signing_mode, u.secret_id, u.fingerprint, u.attempt_count, u.lease_token, u.origin, u.age_ms, e.body,
        ${options.withSubscriptions === false ? NO_SUBSCRIPTION_COLUMNS : SUBSCRIPTION_COLUMNS}
      FROM stats
      LEFT JOIN upd u ON true
      LEFT JOIN delivery_events e ON e.event_id = u.event_id
      ${options.withSubscriptions === false ? sql.literal("") : SUBSCRIPTION_JOINS}
      ORDER BY u.next_attempt_at`
    return onClaimConnection(claimStatement).pipe(
      Effect.map((dbRows) => {
        const rows: Array<ClaimedRow> = []
        let candCount = 0
        let overRoom = 0
        for (const r of dbRows) {
          candCount = Number(r.cand_count)
          overRoom = Number(r.over_room)
          const row = fromClaim(r)
          if (row !== undefined) rows.push(row)
        }
        const moreDue = rows.length >= n || candCount >= scan || overRoom > 0
        const result: ClaimResult = { rows, moreDue }
        return result
      }),
      op("delivery.claim")
    )
  }

  // The heartbeat never waits for a row lock: it renews the rows it can lock at once (`SKIP LOCKED`)
  // and reports the others by reading them (a row locked right now by this worker's settle, or by a
  // claim taking over an expired lease, still shows its committed state: leased with our token, so
  // it counts as held this round; a lease really taken over shows another token next round). With
  // no statement of a worker waiting on another, a settle batch and the heartbeat cannot deadlock
  // (they did, 40P01, when both locked the shared rows in the order their joins produced), and the
  // settle needs no separate ordered lock of its rows (about 8 % of PostgreSQL's time per delivery).
  const heartbeatMany: DeliveryStoreShape["heartbeatMany"] = (leases, leaseMs) =>
    leases.length === 0
      ? Effect.succeed(new Set<string>())
      : sql<{ lease_token: string }>`
          WITH v AS (
            SELECT * FROM unnest(${leases.map((l) => l.deliveryId)}::text[], ${leases.map((l) => l.token)}::text[])
              AS v(delivery_id, token)
          ),
          lk AS (
            SELECT o.delivery_id FROM outbox o JOIN v ON v.delivery_id = o.delivery_id
            WHERE o.status = 'leased' AND o.lease_token = v.token
            FOR UPDATE OF o SKIP LOCKED
          ),
          upd AS (
            UPDATE outbox o SET leased_until = now() + ${clampInt(leaseMs, 1, 24 * 3_600_000)}::int * interval '1 millisecond',
              updated_at = now()
            FROM lk WHERE o.delivery_id = lk.delivery_id
            RETURNING o.lease_token
          ),
          busy AS (
            SELECT o.lease_token FROM outbox o JOIN v ON v.delivery_id = o.delivery_id
            WHERE o.status = 'leased' AND o.lease_token = v.token
              AND o.delivery_id NOT IN (SELECT delivery_id FROM lk)
          )
          SELECT lease_token FROM upd UNION ALL SELECT lease_token FROM busy`.pipe(
          Effect.map((rows): ReadonlySet<string> => new Set(rows.map((r) => r.lease_token))),
          op("delivery.heartbeatMany")
        )

  const heartbeat: DeliveryStoreShape["heartbeat"] = (deliveryId, token, leaseMs) =>
    sql<{ delivery_id: string }>`
      UPDATE outbox SET leased_until = now() + ${clampInt(leaseMs, 1, 24 * 3_600_000)}::int * interval '1 millisecond',
        updated_at = now()
      WHERE delivery_id = ${deliveryId} AND status = 'leased' AND lease_token = ${token}
      RETURNING delivery_id`.pipe(
      Effect.map((rows) => rows.length > 0),
      op("delivery.heartbeat")
    )

  /**
   * Settles are batched: concurrent calls are collected and applied by ONE guarded statement per
   * batch (update + attempt rows + audit rows), so a busy worker pays one round trip and one commit
   * per batch instead of per row. A batch starts as soon as the flusher is free (no added delay);
   * batches grow while a statement runs.
   */
  const runBatch = (items: ReadonlyArray<Settle>) => {
    const col = <A>(f: (x: Settle) => A): Array<A> => items.map(f)
    return sql<{ delivery_id: string; lease_token: string }>`
      WITH v AS (
        SELECT * FROM unnest(
          ${col((x) => x.deliveryId)}::text[], ${col((x) => x.token)}::text[], ${col((x) => x.status)}::text[],
          ${col((x) => x.attemptCount ?? null)}::int[], ${col((x) => x.delayMs ?? null)}::bigint[],
          ${col((x) => x.setError)}::boolean[], ${col((x) => x.errorKind ?? null)}::text[],
          ${col((x) => x.setHttp)}::boolean[], ${col((x) => x.httpStatus ?? null)}::int[],
          ${col((x) => x.terminal)}::boolean[], ${col((x) => x.attempt !== undefined)}::boolean[],
          ${col((x) => x.attempt?.startedAtMs ?? null)}::float8[],
          ${col((x) => (x.attempt === undefined ? null : clampInt(x.attempt.durationMs, 0, 2_147_483_647)))}::int[],
          ${col((x) => x.attempt?.outcome ?? null)}::text[], ${col((x) => x.attempt?.errorKind ?? null)}::text[],
          ${col((x) => x.attempt?.httpStatus ?? null)}::int[],
          ${col((x) => boundExcerpt(x.attempt?.responseExcerpt))}::text[]
        ) AS t(delivery_id, token, status, attempt_count, delay_ms, set_error, error_kind, set_http, http_status,
               terminal, has_attempt, a_started_ms, a_duration_ms, a_outcome, a_error_kind, a_http_status, a_excerpt)
      ),
      upd AS (
        UPDATE outbox o SET
          status = v.status,
          attempt_count = COALESCE(v.attempt_count, o.attempt_count),
          next_attempt_at = CASE WHEN v.delay_ms IS NULL THEN o.next_attempt_at
                                 ELSE now() + v.delay_ms * interval '1 millisecond' END,
          last_error_kind = CASE WHEN v.set_error THEN v.error_kind ELSE o.last_error_kind END,
          last_http_status = CASE WHEN v.set_http THEN v.http_status ELSE o.last_http_status END,
          finished_at = CASE WHEN v.terminal THEN now() ELSE o.finished_at END,
          lease_token = NULL, leased_until = NULL, updated_at = now()
        FROM v
        WHERE o.delivery_id = v.delivery_id AND o.status = 'leased' AND o.lease_token = v.token
        RETURNING o.delivery_id, o.event_id, o.owner_did, o.webhook_rkey, o.event_did, o.event_collection,
          o.event_rkey, o.event_operation, v.token, v.status, v.error_kind, v.http_status, v.terminal,
          v.has_attempt, v.a_started_ms, v.a_duration_ms, v.a_outcome, v.a_error_kind, v.a_http_status, v.a_excerpt
      ),
      att AS (
        INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status, response_excerpt)
        SELECT u.delivery_id,
          COALESCE((SELECT max(a.attempt) FROM delivery_attempts a WHERE a.delivery_id = u.delivery_id), 0) + 1,
          to_timestamp(u.a_started_ms / 1000), u.a_duration_ms, u.a_outcome, u.a_error_kind, u.a_http_status, u.a_excerpt
        FROM upd u WHERE u.has_attempt
      ),
      aud AS (
        INSERT INTO audit (delivery_id, event_id, owner_did, webhook_rkey, event_did, event_collection, event_rkey,
          event_operation, status, http_status, error_kind, url)
        SELECT u.delivery_id, u.event_id, u.owner_did, u.webhook_rkey, u.event_did, u.event_collection, u.event_rkey,
          u.event_operation, u.status, u.http_status, u.error_kind, '[redacted]'
        FROM upd u WHERE u.terminal
      )
      SELECT delivery_id, token AS lease_token FROM upd`.pipe(op("delivery.settle"))
  }

  type Waiter = { readonly item: Settle; readonly resume: (result: Effect.Effect<boolean, StoreError>) => void }
  const queue: Array<Waiter> = []
  const work = yield* Queue.sliding<void>(1)
  const APPLIED = Effect.succeed(true)
  const NOT_APPLIED = Effect.succeed(false)
  const flusher = Effect.gen(function* () {
    while (true) {
      if (queue.length === 0) {
        yield* Queue.take(work)
        continue
      }
      const batch = queue.splice(0, SETTLE_BATCH_MAX)
      // more work left: let another flusher take it while this one runs
      if (queue.length > 0) yield* Queue.offer(work, undefined)
      // every outcome, even a defect, completes every waiter of the batch
      const result = yield* Effect.exit(runBatch(batch.map((b) => b.item)))
      if (Exit.isSuccess(result)) {
        const applied = new Set(result.value.map((r) => r.lease_token))
        for (const b of batch) b.resume(applied.has(b.item.token) ? APPLIED : NOT_APPLIED)
      } else {
        const error = Effect.fail(
          Option.getOrElse(Cause.failureOption(result.cause), () => new StoreError({ op: "delivery.settle", code: "defect" }))
        )
        for (const b of batch) b.resume(error)
      }
    }
  })
  for (let i = 0; i < SETTLE_FLUSHERS; i++) yield* Effect.forkScoped(flusher)
  // settles still queued when the store's scope closes are answered, not left waiting
  yield* Effect.addFinalizer(() =>
    Effect.sync(() => {
      const left = queue.splice(0, queue.length)
      const error = Effect.fail(new StoreError({ op: "delivery.settle", code: "shutdown" }))
      for (const b of left) b.resume(error)
    })
  )

  /** Queue a settle for the next batch; completes with whether the guarded update applied. */
  const settle = (item: Settle): Effect.Effect<boolean, StoreError> =>
    Effect.async<boolean, StoreError>((resume) => {
      queue.push({ item, resume })
      work.unsafeOffer(undefined)
    })

  const delayMs = (ms: number) => clampInt(ms, 0, 366 * 24 * 3_600_000)

  const counts = yield* Ref.make<{ readonly at: number; readonly value: DeliveryCounts } | undefined>(undefined)
  const readCounts = sql<{ pending: number; leased: number; dead_letter: number }>`
    SELECT
      (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'pending' LIMIT ${COUNT_CAP}) s)::int AS pending,
      (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'leased' LIMIT ${COUNT_CAP}) s)::int AS leased,
      (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'dead_letter' LIMIT ${COUNT_CAP}) s)::int AS dead_letter`.pipe(
    Effect.map((rows): DeliveryCounts => ({
      pending: Number(rows[0]?.pending ?? 0),
      leased: Number(rows[0]?.leased ?? 0),
      deadLetter: Number(rows[0]?.dead_letter ?? 0)
    })),
    op("delivery.counts")
  )

  const subscriptions: DeliveryStoreShape["subscriptions"] = (keys) =>
    keys.length === 0
      ? Effect.succeed([])
      : sql<SnapshotDbRow & { readonly i: number }>`
          SELECT k.i::int AS i,
            (w.owner_did IS NOT NULL) AS sub_exists, w.active AS sub_active, w.enabled AS sub_enabled,
            (w.gone_at IS NOT NULL) AS sub_gone, w.url AS sub_url, w.fingerprint AS sub_fingerprint,
            w.signing_mode AS sub_signing_mode, w.secret_id AS sub_secret_id, w.record->>'secret' AS sub_secret,
            ow.reconcile_status AS owner_status
          FROM unnest(${keys.map((k) => k.ownerDid)}::text[], ${keys.map((k) => k.rkey)}::text[])
            WITH ORDINALITY AS k(owner_did, rkey, i)
          LEFT JOIN webhooks w ON w.owner_did = k.owner_did AND w.rkey = k.rkey
          LEFT JOIN owners ow ON ow.did = k.owner_did`.pipe(
          Effect.map((rows) => {
            const out: Array<SubscriptionSnapshot> = keys.map(() => MISSING_SUBSCRIPTION)
            for (const r of rows) {
              const at = Number(r.i) - 1
              if (at >= 0 && at < out.length) out[at] = snapshotFrom(r)
            }
            return out
          }),
          op("delivery.subscriptions")
        )

  const store: DeliveryStoreShape = {
    claim,
    subscriptions,
    heartbeat,
    heartbeatMany,
    markDelivered: (deliveryId, token, o) =>
      settle({
        deliveryId,
        token,
        status: "delivered",
        attemptCount: o.attemptCount,
        delayMs: undefined,
        setError: true,
        errorKind: undefined,
        setHttp: true,
        httpStatus: o.httpStatus,
        terminal: true,
        attempt: o.attempt
      }),
    reschedule: (deliveryId, token, r) =>
      settle({
        deliveryId,
        token,
        status: "pending",
        attemptCount: r.attemptCount,
        delayMs: delayMs(r.delayMs),
        setError: true,
        errorKind: r.errorKind,
        setHttp: true,
        httpStatus: r.httpStatus,
        terminal: false,
        attempt: r.attempt
      }),
    defer: (deliveryId, token, ms) =>
      settle({
        deliveryId,
        token,
        status: "pending",
        attemptCount: undefined,
        delayMs: delayMs(ms),
        setError: false,
        errorKind: undefined,
        setHttp: false,
        httpStatus: undefined,
        terminal: false,
        attempt: undefined
      }),
    deadLetter: (deliveryId, token, f) =>
      settle({
        deliveryId,
        token,
        status: "dead_letter",
        attemptCount: f.attemptCount,
        delayMs: undefined,
        setError: true,
        errorKind: f.errorKind,
        setHttp: true,
        httpStatus: f.httpStatus,
        terminal: true,
        attempt: f.attempt
      }),
    cancel: (deliveryId, token, reason) =>
      settle({
        deliveryId,
        token,
        status: "cancelled",
        attemptCount: undefined,
        delayMs: undefined,
        setError: true,
        errorKind: reason,
        setHttp: false,
        httpStatus: undefined,
        terminal: true,
        attempt: undefined
      }),
    recordAttempt: (deliveryId, a) =>
      sql`
        INSERT INTO delivery_attempts (delivery_id, attempt, started_at, duration_ms, outcome, error_kind, http_status, response_excerpt)
        VALUES (${deliveryId},
          COALESCE((SELECT max(x.attempt) FROM delivery_attempts x WHERE x.delivery_id = ${deliveryId}), 0) + 1,
          to_timestamp(${a.startedAtMs}::float8 / 1000), ${clampInt(a.durationMs, 0, 2_147_483_647)}::int,
          ${a.outcome}, ${a.errorKind ?? null}, ${a.httpStatus ?? null}::int, ${boundExcerpt(a.responseExcerpt)})`.pipe(
        Effect.asVoid,
        op("delivery.recordAttempt")
      ),
    insertAudit: (e) =>
      sql`
        INSERT INTO audit (delivery_id, event_id, owner_did, webhook_rkey, event_did, event_collection, event_rkey,
          event_operation, status, http_status, error_kind, url)
        VALUES (${e.deliveryId}, ${e.eventId}, ${e.ownerDid}, ${e.webhookRkey}, ${e.eventDid}, ${e.eventCollection},
          ${e.eventRkey}, ${e.eventOperation}, ${e.status}, ${e.httpStatus ?? null}::int, ${e.errorKind ?? null},
          '[redacted]')`.pipe(Effect.asVoid, op("delivery.insertAudit")),
    counts: Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const cached = yield* Ref.get(counts)
      if (cached !== undefined && now - cached.at < COUNTS_TTL_MS) return cached.value
      const value = yield* readCounts
      yield* Ref.set(counts, { at: now, value })
      return value
    }),
    wakeups: pg.listen(NOTIFY_CHANNEL).pipe(
      Stream.map((): void => undefined),
      Stream.mapError((e) => new StoreError({ op: "delivery.listen", code: codeOf(e) }))
    ),
    notify: sql`SELECT pg_notify(${NOTIFY_CHANNEL}, '1')`.pipe(Effect.asVoid, op("delivery.notify"))
  }
  return store
})

/** The PostgreSQL store. Requires the `PgClient` (for LISTEN) and its `SqlClient`. */
export const layerSql: Layer.Layer<DeliveryStore, never, SqlClient.SqlClient | PgClient.PgClient> = Layer.scoped(
  DeliveryStore,
  makeSql
)
