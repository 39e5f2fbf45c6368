/**
 * The PostgreSQL driver of the `DeliveryStore` port (see DeliveryStore.ts for the leases, the
 * per-origin fairness and the settling it implements): its statements, each a module-level
 * function of the `SqlClient` (the claim in ClaimSql.ts, the lease statements in LeaseSql.ts, the park statements in ParkSql.ts, the settle requests in SettleRequests.ts), and `makeSql`, which holds the claim connection
 * (ClaimConnection.ts) and the settle batcher (SettleBatcher.ts). Reached
 * through DeliveryStore.ts, which builds `layerSql` from `makeSql`: this module reads the port's
 * limits only when it runs.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import type * as Statement from "@effect/sql/Statement"
import { Effect, Either, type Scope, Stream } from "effect"
import { NOTIFY_CHANNEL, notifyStatement } from "../matching/OutboxNotify.js"
import { codeOr } from "../platform/ErrorCode.js"
import { StoreError, storeOpWithin } from "../platform/Persistence.js"
import { makeClaimConnection } from "./ClaimConnection.js"
import {
  claimPart,
  claimPlan,
  claimResult,
  type Fragments,
  fragments,
  MISSING_SUBSCRIPTION,
  type SnapshotDbRow,
  snapshotFrom,
  takeStatement,
  walkAfter,
  walkHead,
  windowHead
} from "./ClaimSql.js"
import {
  COUNT_CAP,
  COUNTS_TIMEOUT,
  type DeliveryCounts,
  type DeliveryStoreShape,
  excerpt,
  RESPONSE_EXCERPT_BYTES,
  STATEMENT_TIMEOUT,
  type SubscriptionKey,
  type SubscriptionSnapshot
} from "./DeliveryStore.js"
import {
  cutShortStatement,
  heartbeatManyStatement,
  heartbeatStatement,
  markSuspectStatement,
  reclaimStatement
} from "./LeaseSql.js"
import { makeParkClock, parkStatement, unparkStatement } from "./ParkSql.js"
import { makeSettleBatcher } from "./SettleBatcher.js"
import {
  cancelled,
  clampInt,
  deadLettered,
  deferred,
  delivered,
  parked,
  rescheduled,
  type Settle
} from "./SettleRequests.js"
import { PARK_MAX, type SettledRow, writerFor } from "./WebhookHealthSql.js"

const boundExcerpt = (s: string | undefined): string | null => {
  if (s === undefined) return null
  const bytes = Buffer.from(s, "utf8")
  return bytes.length <= RESPONSE_EXCERPT_BYTES ? s.replace(/\u0000/g, "") : excerpt(bytes)
}

/** Settled items' webhook-state tickets held at most (see `makeSql`). */
const TICKETS_MAX = 4 * 256

/** Map a failure to a `StoreError` and bound the statement's time. */
const op = (name: string) => storeOpWithin(name, STATEMENT_TIMEOUT)

// ---------------------------------------------------------------------------------------------
// Settle

/**
 * A cancel `subscription_changed` of a row the outbox move marked (`moved_to`, 0018; see
 * matching/OutboxSql.ts): the worker's screen saw the newer version the row is to move to. Read
 * from the row in the UPDATE's SET (not from a snapshot CTE), so a move committed while the settle
 * waited for the row's lock is seen.
 */
const MOVING = `(v.status = 'cancelled' AND v.error_kind = 'subscription_changed' AND o.moved_to IS NOT NULL)`

/**
 * Settles are batched: concurrent calls are collected and applied by ONE guarded statement per
 * batch (update + attempt rows + audit rows), so a busy worker pays one round trip and one commit
 * per batch instead of per row. A batch starts as soon as the flusher is free (no added delay);
 * batches grow while a statement runs.
 *
 * A row with `moved_to` set (a leased row, claimed before any attempt, whose event a newer version
 * of its webhook matched since) that is cancelled `subscription_changed` is moved instead: the new
 * version's fields, `pending`, due now, not terminal (no audit row), `moved` in the result (answered
 * as not applied: it was not cancelled; the caller wakes the workers). Every other settle clears
 * `moved_to` (the old version was tried, or the screen found it current), except a deferral
 * without an attempt (an owner `scanning` defers before the version is compared): the row waits,
 * untried, for its next claim and screen.
 *
 * Parks (SPEC §4.3: at most {@link PARK_MAX} parked rows per webhook) are decided and counted here,
 * in one statement: the parked rows' webhooks are locked in key order (`pw`), each park's place is
 * the locked `parked` plus its rank, and `parked` / `parked_dropped` are raised for the rows that
 * became dead letters / were dropped (`pc`), so a count is never lost or read stale. Batches
 * without a park lock no webhook row.
 */
const settleStatement = (sql: SqlClient.SqlClient, items: ReadonlyArray<Settle>) => {
  const col = <A>(f: (x: Settle) => A): Array<A> => items.map(f)
  const moving = sql.literal(MOVING)
  return sql<SettledRow & { readonly delivery_id: string; readonly moved: boolean }>`
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
      pw AS (
        SELECT w.owner_did, w.rkey, w.parked, w.fingerprint, w.gone_at, w.auto_disabled_at FROM webhooks w
        WHERE (w.owner_did, w.rkey) IN (
          SELECT o.owner_did, o.webhook_rkey FROM v JOIN outbox o ON o.delivery_id = v.delivery_id
          WHERE v.status = 'park')
        ORDER BY w.owner_did, w.rkey
        FOR NO KEY UPDATE OF w
      ),
      pk AS (
        SELECT v.delivery_id, COALESCE(w.parked, 0)
          + row_number() OVER (PARTITION BY o.owner_did, o.webhook_rkey ORDER BY v.delivery_id) AS n,
          (w.fingerprint = o.fingerprint AND w.gone_at IS NULL AND w.auto_disabled_at IS NULL) AS cleared
        FROM v JOIN outbox o ON o.delivery_id = v.delivery_id
        LEFT JOIN pw w ON w.owner_did = o.owner_did AND w.rkey = o.webhook_rkey
        WHERE v.status = 'park' AND o.status = 'leased' AND o.lease_token = v.token
      ),
      upd AS (
        UPDATE outbox o SET
          status = CASE WHEN ${moving} THEN 'pending' WHEN v.status <> 'park' THEN v.status
                        WHEN pk.cleared THEN 'pending' WHEN pk.n <= ${PARK_MAX} THEN 'dead_letter' ELSE 'cancelled' END,
          attempt_count = COALESCE(v.attempt_count, o.attempt_count),
          next_attempt_at = CASE WHEN pk.cleared OR ${moving} THEN now() WHEN v.delay_ms IS NULL THEN o.next_attempt_at
                                 ELSE now() + v.delay_ms * interval '1 millisecond' END,
          last_error_kind = CASE WHEN ${moving} THEN NULL WHEN pk.cleared THEN o.last_error_kind
                                 WHEN v.set_error THEN v.error_kind ELSE o.last_error_kind END,
          last_http_status = CASE WHEN ${moving} THEN NULL WHEN pk.cleared THEN o.last_http_status
                                  WHEN v.set_http THEN v.http_status ELSE o.last_http_status END,
          finished_at = CASE WHEN ${moving} THEN NULL
                             WHEN v.terminal AND pk.cleared IS NOT TRUE THEN now() ELSE o.finished_at END,
          match_kind = CASE WHEN ${moving} THEN o.moved_to->>'match_kind' ELSE o.match_kind END,
          target_url = CASE WHEN ${moving} THEN o.moved_to->>'target_url' ELSE o.target_url END,
          signing_mode = CASE WHEN ${moving} THEN o.moved_to->>'signing_mode' ELSE o.signing_mode END,
          secret_id = CASE WHEN ${moving} THEN o.moved_to->>'secret_id' ELSE o.secret_id END,
          fingerprint = CASE WHEN ${moving} THEN o.moved_to->>'fingerprint' ELSE o.fingerprint END,
          origin = CASE WHEN ${moving} THEN o.moved_to->>'origin' ELSE o.origin END,
          moved_to = CASE WHEN v.status = 'pending' AND v.attempt_count IS NULL THEN o.moved_to END,
          lease_token = NULL, leased_until = NULL, updated_at = now()
        FROM v LEFT JOIN pk ON pk.delivery_id = v.delivery_id
        WHERE o.delivery_id = v.delivery_id AND o.status = 'leased' AND o.lease_token = v.token
        RETURNING o.delivery_id, o.event_id, o.owner_did, o.webhook_rkey, o.fingerprint, o.event_did, o.event_collection,
          o.event_rkey, o.event_operation, v.token, o.status, v.error_kind, v.http_status,
          (v.terminal AND pk.cleared IS NOT TRUE AND NOT (v.status = 'cancelled' AND o.status = 'pending')) AS terminal,
          (pk.cleared IS TRUE) AS unparked, (v.status = 'cancelled' AND o.status = 'pending') AS moved,
          (v.status = 'park') AS park,
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
      ),
      pc AS (
        UPDATE webhooks w SET parked = LEAST(w.parked + c.parked, 2147483647), parked_dropped = w.parked_dropped + c.dropped
        FROM (SELECT u.owner_did, u.webhook_rkey, u.fingerprint,
                count(*) FILTER (WHERE u.status = 'dead_letter')::int AS parked,
                count(*) FILTER (WHERE u.status = 'cancelled')::int AS dropped
              FROM upd u WHERE u.park AND NOT u.unparked GROUP BY u.owner_did, u.webhook_rkey, u.fingerprint) c
        WHERE w.owner_did = c.owner_did AND w.rkey = c.webhook_rkey AND w.fingerprint = c.fingerprint
      )
      SELECT delivery_id, token AS lease_token, owner_did, webhook_rkey, fingerprint, status, moved FROM upd
      WHERE NOT unparked`.pipe(
    op("delivery.settle")
  )
}

/**
 * The applied rows of a settle batch without its moved ones (a cancel applied as the outbox move:
 * answered as not applied, so the worker publishes no `cancelled`), waking the workers when any
 * moved (pending and due now, as an enqueue does). The wake-up's failure fails nothing: the
 * workers' poll finds the row.
 */
const movedApart =
  (sql: SqlClient.SqlClient) =>
  <R extends { readonly moved: boolean }>(rows: ReadonlyArray<R>): Effect.Effect<ReadonlyArray<R>> =>
    rows.some((r) => r.moved)
      ? Effect.as(Effect.ignore(notifyStatement(sql).pipe(op("delivery.notify"))), rows.filter((r) => !r.moved))
      : Effect.succeed(rows)

// ---------------------------------------------------------------------------------------------
// Reads

const countsStatement = (sql: SqlClient.SqlClient) =>
  sql<{ pending: number; leased: number; dead_letter: number; auto_disabled: number; gone: number }>`
    SELECT
      (SELECT count(*) FROM webhooks WHERE auto_disabled_at IS NOT NULL)::int AS auto_disabled,
      (SELECT count(*) FROM webhooks WHERE gone_at IS NOT NULL)::int AS gone,
      (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'pending' LIMIT ${COUNT_CAP}) s)::int AS pending,
      (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'leased' LIMIT ${COUNT_CAP}) s)::int AS leased,
      (SELECT count(*) FROM (SELECT 1 FROM outbox WHERE status = 'dead_letter' LIMIT ${COUNT_CAP}) s)::int AS dead_letter`
    .pipe(
      Effect.map((rows): DeliveryCounts => ({
        pending: Number(rows[0]?.pending ?? 0),
        leased: Number(rows[0]?.leased ?? 0),
        deadLetter: Number(rows[0]?.dead_letter ?? 0),
        autoDisabledWebhooks: Number(rows[0]?.auto_disabled ?? 0),
        goneWebhooks: Number(rows[0]?.gone ?? 0)
      })),
      storeOpWithin("delivery.counts", COUNTS_TIMEOUT)
    )

const subscriptionsStatement = (
  sql: SqlClient.SqlClient,
  f: Fragments,
  keys: ReadonlyArray<SubscriptionKey>
): Effect.Effect<ReadonlyArray<SubscriptionSnapshot>, StoreError> =>
  keys.length === 0
    ? Effect.succeed([])
    : sql<SnapshotDbRow & { readonly i: number }>`
          SELECT k.i::int AS i,
            ${f.subscriptionColumns}
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

// ---------------------------------------------------------------------------------------------
// The store

export const makeSql: Effect.Effect<
  DeliveryStoreShape,
  never,
  SqlClient.SqlClient | PgClient.PgClient | Scope.Scope
> = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const pg = yield* PgClient.PgClient
  const f = fragments(sql)
  const claimConnection = yield* makeClaimConnection(sql, pg)
  // cool-down ends (the process's clock) go to the database's clock, which the claim compares with
  const parkClock = makeParkClock(sql)
  const health = yield* writerFor(sql)
  // the ticket of the webhook-state write each settled item waits for (set by the flusher, taken
  // by the item's caller; cleared if ever left this full by interrupted callers)
  const tickets = new Map<string, number>()
  // where the next jammed claim's origin walk starts: after the last origin the previous one
  // visited, so that every origin is reached in turn however many there are
  const walk = { cursor: "" }
  // the webhook state follows each batch: the flusher only hands the batch's changes to the
  // writer (WebhookHealthSql.makeWriter: its own fiber and statement, whose failure never fails
  // the settles); each settle whose batch changed the state waits for that write, briefly
  const batch = yield* makeSettleBatcher((items: ReadonlyArray<Settle>) =>
    Effect.map(Effect.flatMap(settleStatement(sql, items), movedApart(sql)), (rows) => {
      const ticket = health.offer(items.map((i) => ({ ...i, park: i.status === "park" })), rows)
      if (ticket > 0) {
        if (tickets.size > TICKETS_MAX) tickets.clear()
        for (const i of items) tickets.set(i.token, ticket)
      }
      return rows
    })
  )
  const settle = (item: Settle): Effect.Effect<boolean, StoreError> =>
    Effect.tap(batch(item), () => {
      const ticket = tickets.get(item.token)
      if (ticket === undefined) return Effect.void
      tickets.delete(item.token)
      return health.written(ticket)
    })

  const store: DeliveryStoreShape = {
    claim: (workerId, limit, leaseMs, options = {}) => {
      const p = claimPlan(workerId, limit, leaseMs, options)
      if (p === undefined) return Effect.succeed({ rows: [], moreDue: false })
      const take = (head: Statement.Fragment) =>
        Effect.map(claimConnection.run(workerId, takeStatement(sql, f, p, head)), claimPart)
      // each statement commits its leases on its own, so each has its own bound: a walk that fails
      // after the window's rows were leased hands those rows over all the same (with the failure),
      // instead of leaving them leased to this worker, unknown to it, until their lease expires
      return Effect.gen(function*() {
        const first = yield* take(windowHead(sql, f, p)).pipe(op("delivery.claim"))
        const w = walkAfter(p, first, walk.cursor)
        if (w === undefined || options.mayWalk?.() === false) return claimResult(p, first, undefined)
        const walked = yield* Effect.either(take(walkHead(sql, w)).pipe(op("delivery.claim")))
        if (Either.isLeft(walked)) return { ...claimResult(p, first, undefined), failure: walked.left }
        if (walked.right.walked > 0 && walked.right.walkLast !== undefined) walk.cursor = walked.right.walkLast
        return claimResult(p, first, walked.right)
      })
    },
    reclaimAbandoned: (workerId) =>
      Effect.gen(function*() {
        const held = yield* claimConnection.holdMark(workerId).pipe(op("delivery.mark"))
        const freed = yield* reclaimStatement(sql, workerId)
        // the freed rows are due now: every worker's claim loop is woken (as by an enqueue)
        if (freed > 0) yield* notifyStatement(sql).pipe(op("delivery.notify"))
        return { held, freed }
      }),
    subscriptions: (keys) => subscriptionsStatement(sql, f, keys),
    markSuspect: (deliveryId, token) => markSuspectStatement(sql, deliveryId, token),
    cutShort: (tokens) => tokens.length === 0 ? Effect.succeed(0) : cutShortStatement(sql, tokens),
    heartbeat: (deliveryId, token, leaseMs) => heartbeatStatement(sql, deliveryId, token, leaseMs),
    heartbeatMany: (leases, leaseMs) => heartbeatManyStatement(sql, leases, leaseMs),
    markDelivered: (deliveryId, token, o) => settle(delivered(deliveryId, token, o)),
    reschedule: (deliveryId, token, r) => settle(rescheduled(deliveryId, token, r)),
    defer: (deliveryId, token, ms) => settle(deferred(deliveryId, token, ms)),
    park: (origins) => Effect.flatMap(parkClock.shift(origins), (o) => parkStatement(sql, o)),
    unpark: (origins) => Effect.flatMap(parkClock.shift(origins), (o) => unparkStatement(sql, o)),
    deadLetter: (deliveryId, token, failure) => settle(deadLettered(deliveryId, token, failure)),
    cancel: (deliveryId, token, reason) => settle(cancelled(deliveryId, token, reason)),
    parkDisabled: (deliveryId, token) => settle(parked(deliveryId, token)),
    counts: countsStatement(sql),
    wakeups: pg.listen(NOTIFY_CHANNEL).pipe(
      Stream.map((): void => undefined),
      Stream.mapError((e) => new StoreError({ op: "delivery.listen", code: codeOr(e) }))
    ),
    // a non-empty payload: listen() (PgListen.ts) drops notifications whose payload is empty
    notify: notifyStatement(sql).pipe(Effect.asVoid, op("delivery.notify"))
  }
  return store
})
