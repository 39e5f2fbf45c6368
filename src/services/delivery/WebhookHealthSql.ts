/**
 * The delivery state of each registration (SPEC §4.3 auto-disable, §8.5 `list`), kept from the
 * settle path of the SQL `DeliveryStore` driver: ONE statement updates the `webhooks` rows
 * (migration 0009) of the registrations whose state settle batches changed, when they changed any
 * (a healthy busy webhook costs one such statement a minute, not one per batch).
 *
 * The store's {@link makeWriter} runs that statement off the settle flusher: the flusher only
 * merges a batch's changes into a bounded buffer (O(items), never waits); one fiber of the store's
 * scope writes the buffer, one statement at a time. Changes that wait are merged per registration
 * as if their batches had been applied one after the other (the newest 2xx restarts the streak,
 * failures add up, the latest failure wins); a full buffer drops a new registration's changes
 * (counted, logged rate-limited). The writer's statement skips the rows another session holds
 * (`SKIP LOCKED`): their changes are carried to the next run (at the latest
 * {@link WRITE_RETRY} later), so one held row never stalls the others. A settle whose batch
 * changed the state waits for that write at most {@link WRITE_WAIT} (its callers see the state
 * of their own settles in the normal case).
 *
 * - Failure streak: `failing_since` (the first failed attempt after the last 2xx) and
 *   `failed_attempts` (failed attempts since then). A 2xx ends the streak. Only failures that say
 *   something about the receiver count ({@link RECEIVER_FAILURES}: HTTP answers other than 2xx, and
 *   the transport's failures); firehook's own (`secret_unavailable`, `subscription_unavailable`,
 *   `transform_failed`, `payload_missing`, `internal`) do not.
 * - The rule: a streak at least `autoDisableAfterMs` long (from its first failure to this one) with
 *   at least {@link AUTO_DISABLE_MIN_FAILURES} failed attempts sets `auto_disabled_at`. SPEC §4.3's
 *   "no 2xx for the period while ≥ 20 attempts failed in that time" is read as "the streak": the
 *   period without a 2xx starts at the first failure after the last 2xx. A 2xx later does not clear
 *   it (only `resume`, the operator command, or a new fingerprint do).
 * - Times are the workers' Clock (the attempt's end), so a `TestClock` drives the rule.
 * - Parked rows (`parked`, `parked_dropped`) are counted by the settle statement itself
 *   (DeliveryStoreSql.ts), under the webhook row's lock; {@link makeRecorder} (the direct
 *   statement) still counts the parks it is given, the store's writer does not.
 * - A 2xx is written when this process saw the webhook fail since, or did not write one for it in
 *   the last {@link SUCCESS_WRITE_EVERY_MS} (so `lastSuccessAt` lags by at most that much).
 * - The statement locks the rows in key order first (two processes cannot deadlock on them), with
 *   `FOR NO KEY UPDATE` (what its UPDATE takes anyway: it never waits for a key-share lock). Its
 *   failure never fails the settles (it is logged, rate-limited): the state then misses those changes.
 * - The transition to auto-disabled is logged once (owner DID and rkey, never the URL) and counted.
 *
 * @since 0.1.0
 */
import type * as SqlClient from "@effect/sql/SqlClient"
import { Duration, Effect, Metric, Option, Queue, type Scope } from "effect"
import type { MetricLabel } from "effect"
import { FirehookConfig } from "../platform/Config.js"
import { safeHttpErrorKinds } from "../platform/http/Errors.js"
import { storeOpWithin } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import * as DeliveryConfig from "./DeliveryConfig.js"
import type { AttemptRecord } from "./DeliveryStore.js"

/** SPEC §4.3: failed attempts a streak needs before it can auto-disable. */
export const AUTO_DISABLE_MIN_FAILURES = 20
/** SPEC §4.3: rows parked per webhook at most while it is disabled or gone (beyond: dropped). */
export const PARK_MAX = 10_000
/** The kind of a parked row (`last_error_kind`). */
export const PARKED_KIND = "webhook_disabled"
/** A healthy webhook's 2xx is written at most this often per process. */
export const SUCCESS_WRITE_EVERY_MS = 60_000
/** Webhooks remembered by the success throttle at most (emptied when full). */
const THROTTLE_MAX = 10_000
/** Registrations whose changes the writer's buffer holds at most (beyond: a new one's are dropped). */
export const PENDING_MAX = 10_000
/** Registrations one statement of the writer updates at most (the rest: the next statement). */
export const WRITE_ROWS_MAX = 1_000
/** The longest a change skipped on a held row waits for its next try when nothing new comes. */
export const WRITE_RETRY = Duration.seconds(1)
/** The longest a settle waits for the write of the state its batch changed. */
export const WRITE_WAIT = Duration.seconds(1)
/** The bound of one statement of the webhook state. */
const WRITE_TIMEOUT = Duration.seconds(15)

/** Failure kinds that say the receiver is failing (they feed the streak). */
export const RECEIVER_FAILURES: ReadonlySet<string> = new Set<string>([
  "http_5xx",
  "http_429",
  "gone",
  "http_4xx",
  "redirect",
  ...safeHttpErrorKinds
])

/** What one settle item tells the webhook state. */
export interface HealthInput {
  readonly token: string
  readonly attempt: AttemptRecord | undefined
  readonly park: boolean
}

/** What the settle statement answered for an applied row. */
export interface SettledRow {
  readonly lease_token: string
  readonly owner_did: string
  readonly webhook_rkey: string
  readonly fingerprint: string
  readonly status: string
}

/** The changes of one registration in one batch. */
interface Change {
  readonly ownerDid: string
  readonly rkey: string
  readonly fingerprint: string
  okMs: number | undefined
  /** failures, each with its time, kind and status (in batch order) */
  readonly failures: Array<{ readonly ms: number; readonly kind: string; readonly http: number | undefined }>
  parked: number
  dropped: number
}

const NO_TAGS: ReadonlyArray<MetricLabel.MetricLabel> = []
const autoDisabledTotal = Metric.counter("firehook_webhooks_auto_disabled_total", {
  description: "Webhooks auto-disabled (SPEC §4.3)",
  incremental: true
})
const parkedTotal = Metric.counter("firehook_delivery_parked_total", {
  description: "Deliveries parked as dead letters (webhook_disabled) while their webhook was disabled or gone",
  incremental: true
})
const parkDroppedTotal = Metric.counter("firehook_delivery_park_dropped_total", {
  description: "Deliveries dropped (cancelled) beyond the 10,000 parked rows of a disabled or gone webhook",
  incremental: true
})

const endOf = (a: AttemptRecord): number => a.startedAtMs + Math.max(0, a.durationMs)

/** The state of a webhook as the statement writes it. */
interface Row {
  readonly owner_did: string
  readonly rkey: string
  readonly fingerprint: string
  readonly ok_ms: number | null
  readonly fails: number
  readonly fail_from_ms: number | null
  readonly fail_ms: number | null
  readonly fail_kind: string | null
  readonly fail_http: number | null
  readonly parked: number
  readonly dropped: number
}

const toRow = (c: Change): Row => {
  const after = c.okMs === undefined ? c.failures : c.failures.filter((f) => f.ms > (c.okMs ?? 0))
  let last: Change["failures"][number] | undefined = undefined
  for (const f of c.failures) if (last === undefined || f.ms >= last.ms) last = f
  let from: number | undefined = undefined
  for (const f of after) if (from === undefined || f.ms < from) from = f.ms
  return {
    owner_did: c.ownerDid,
    rkey: c.rkey,
    fingerprint: c.fingerprint,
    ok_ms: c.okMs ?? null,
    fails: after.length,
    fail_from_ms: from ?? null,
    fail_ms: last?.ms ?? null,
    fail_kind: last?.kind ?? null,
    fail_http: last?.http ?? null,
    parked: c.parked,
    dropped: c.dropped
  }
}

/** The key of a registration's changes. */
const keyOf = (r: Row): string => `${r.owner_did} ${r.rkey} ${r.fingerprint}`

/**
 * `older` then `newer`, as one change: what applying them one after the other does to the row
 * (the statement's rules below), but for the auto-disable check, which sees the merged change as
 * it sees one batch.
 */
const merge = (older: Row, newer: Row): Row => {
  const reset = newer.ok_ms !== null
  const newerFailure = newer.fail_ms !== null && (older.fail_ms === null || newer.fail_ms >= older.fail_ms)
  const last = newerFailure ? newer : older
  return {
    owner_did: newer.owner_did,
    rkey: newer.rkey,
    fingerprint: newer.fingerprint,
    ok_ms: newer.ok_ms === null ? older.ok_ms : Math.max(older.ok_ms ?? newer.ok_ms, newer.ok_ms),
    fails: reset ? newer.fails : older.fails + newer.fails,
    fail_from_ms: reset ? newer.fail_from_ms : (older.fail_from_ms ?? newer.fail_from_ms),
    fail_ms: last.fail_ms,
    fail_kind: last.fail_kind,
    fail_http: last.fail_http,
    parked: older.parked + newer.parked,
    dropped: older.dropped + newer.dropped
  }
}

/**
 * The rows' update. Answers the rows that became auto-disabled, and (with `skipLocked`) those
 * skipped because another session held them (registrations gone or at another fingerprint are
 * neither: their changes are dropped).
 */
const statement = (sql: SqlClient.SqlClient, rows: ReadonlyArray<Row>, afterMs: number, skipLocked: boolean) => {
  const col = <A>(f: (r: Row) => A): Array<A> => rows.map(f)
  const at = (column: string) => sql.literal(`to_timestamp(h.${column} / 1000.0)`)
  const lastFailure = sql`h.fail_ms IS NOT NULL AND (w.last_failure_at IS NULL OR ${
    at("fail_ms")
  } >= w.last_failure_at)`
  const lock = sql.literal(skipLocked ? "FOR NO KEY UPDATE OF w SKIP LOCKED" : "FOR NO KEY UPDATE OF w")
  return sql<{ owner_did: string; rkey: string; fingerprint: string; disabled_now: boolean }>`
    WITH h AS (
      SELECT * FROM unnest(
        ${col((r) => r.owner_did)}::text[], ${col((r) => r.rkey)}::text[], ${col((r) => r.fingerprint)}::text[],
        ${col((r) => r.ok_ms)}::float8[], ${col((r) => r.fails)}::int[], ${col((r) => r.fail_from_ms)}::float8[],
        ${col((r) => r.fail_ms)}::float8[], ${col((r) => r.fail_kind)}::text[], ${col((r) => r.fail_http)}::int[],
        ${col((r) => r.parked)}::int[], ${col((r) => r.dropped)}::int[]
      ) AS t(owner_did, rkey, fingerprint, ok_ms, fails, fail_from_ms, fail_ms, fail_kind, fail_http, parked, dropped)
    ),
    lk AS (
      SELECT w.owner_did, w.rkey FROM webhooks w
      JOIN h ON w.owner_did = h.owner_did AND w.rkey = h.rkey AND w.fingerprint = h.fingerprint
      ORDER BY w.owner_did, w.rkey
      ${lock}
    ),
    upd AS (
      UPDATE webhooks w SET
        last_success_at = CASE WHEN h.ok_ms IS NULL THEN w.last_success_at
                               ELSE GREATEST(w.last_success_at, ${at("ok_ms")}) END,
        failing_since = CASE WHEN h.ok_ms IS NOT NULL THEN ${at("fail_from_ms")}
                             WHEN h.fails > 0 THEN COALESCE(w.failing_since, ${at("fail_from_ms")})
                             ELSE w.failing_since END,
        failed_attempts = CASE WHEN h.ok_ms IS NOT NULL THEN h.fails ELSE w.failed_attempts + h.fails END,
        last_failure_at = CASE WHEN ${lastFailure} THEN ${at("fail_ms")} ELSE w.last_failure_at END,
        last_failure_kind = CASE WHEN ${lastFailure} THEN h.fail_kind ELSE w.last_failure_kind END,
        last_failure_http = CASE WHEN ${lastFailure} THEN h.fail_http ELSE w.last_failure_http END,
        auto_disabled_at = CASE
          WHEN w.auto_disabled_at IS NULL AND h.ok_ms IS NULL AND h.fails > 0 AND ${afterMs}::float8 > 0
            AND w.failed_attempts + h.fails >= ${AUTO_DISABLE_MIN_FAILURES}
            AND COALESCE(w.failing_since, ${at("fail_from_ms")})
                <= ${at("fail_ms")} - ${afterMs}::float8 * interval '1 millisecond'
          THEN ${at("fail_ms")} ELSE w.auto_disabled_at END,
        parked = LEAST(w.parked + h.parked, 2147483647),
        parked_dropped = w.parked_dropped + h.dropped
      FROM h, lk
      WHERE w.owner_did = h.owner_did AND w.rkey = h.rkey AND w.fingerprint = h.fingerprint
        AND lk.owner_did = w.owner_did AND lk.rkey = w.rkey
      RETURNING w.owner_did, w.rkey,
        (h.ok_ms IS NULL AND h.fail_ms IS NOT NULL AND w.auto_disabled_at = ${at("fail_ms")}) AS disabled_now
    )
    SELECT h.owner_did, h.rkey, h.fingerprint, COALESCE(u.disabled_now, false) AS disabled_now
    FROM h JOIN webhooks w ON w.owner_did = h.owner_did AND w.rkey = h.rkey AND w.fingerprint = h.fingerprint
    LEFT JOIN upd u ON u.owner_did = h.owner_did AND u.rkey = h.rkey
    WHERE u.owner_did IS NULL OR u.disabled_now`
}

/** Per webhook: when this process last wrote a 2xx, or `failing` after it saw a failure. */
type Written = Map<string, number | "failing">

/** What a batch changes: the rows of the statement, and the parked and dropped counts. */
const collect = <I extends HealthInput>(
  items: ReadonlyArray<I>,
  applied: ReadonlyArray<SettledRow>,
  written: Written,
  countParks: boolean
): { readonly rows: ReadonlyArray<Row>; readonly parked: number; readonly dropped: number } => {
  const byToken = new Map<string, SettledRow>()
  for (const r of applied) byToken.set(r.lease_token, r)
  const changes = new Map<string, Change>()
  const changeOf = (r: SettledRow, key: string): Change => {
    const known = changes.get(key)
    if (known !== undefined) return known
    const c: Change = {
      ownerDid: r.owner_did,
      rkey: r.webhook_rkey,
      fingerprint: r.fingerprint,
      okMs: undefined,
      failures: [],
      parked: 0,
      dropped: 0
    }
    changes.set(key, c)
    return c
  }
  const remember = (key: string, value: number | "failing") => {
    if (written.size >= THROTTLE_MAX) written.clear()
    written.set(key, value)
  }
  let parked = 0
  let dropped = 0
  for (const item of items) {
    const r = byToken.get(item.token)
    if (r === undefined) continue
    const key = `${r.owner_did} ${r.webhook_rkey} ${r.fingerprint}`
    const a = item.attempt
    if (item.park) {
      if (r.status === "dead_letter") {
        if (countParks) changeOf(r, key).parked++
        parked++
      } else {
        if (countParks) changeOf(r, key).dropped++
        dropped++
      }
    } else if (a !== undefined && a.outcome === "delivered" && a.httpStatus !== undefined) {
      const last = written.get(key)
      const ms = endOf(a)
      if (last !== undefined && last !== "failing" && ms - last < SUCCESS_WRITE_EVERY_MS) continue
      const c = changeOf(r, key)
      c.okMs = Math.max(c.okMs ?? ms, ms)
      remember(key, ms)
    } else if (
      a !== undefined && (a.outcome === "retry" || a.outcome === "dead_letter") && a.errorKind !== undefined &&
      RECEIVER_FAILURES.has(a.errorKind)
    ) {
      changeOf(r, key).failures.push({ ms: endOf(a), kind: a.errorKind, http: a.httpStatus })
      remember(key, "failing")
    }
  }
  return { rows: [...changes.values()].map(toRow), parked, dropped }
}

/** The logging and counting shared by the recorder and the writer. */
const reporter = (afterMs: number) => {
  const log = RateLimitedLog.make({ everyMs: 60_000 })
  const disabled = (d: { readonly owner_did: string; readonly rkey: string }) =>
    Effect.zipRight(
      Effect.sync(() => autoDisabledTotal.unsafeUpdate(1, NO_TAGS)),
      Effect.logWarning("webhook auto-disabled: no 2xx for the auto-disable period").pipe(
        Effect.annotateLogs({ ownerDid: d.owner_did, rkey: d.rkey, afterMs })
      )
    )
  const counted = (parked: number, dropped: number) => {
    if (parked > 0) parkedTotal.unsafeUpdate(parked, NO_TAGS)
    if (dropped > 0) parkDroppedTotal.unsafeUpdate(dropped, NO_TAGS)
  }
  /** Run the statement; answers the rows it skipped (never fails: a failure is logged). */
  const write = (sql: SqlClient.SqlClient, rows: ReadonlyArray<Row>, skipLocked: boolean) =>
    statement(sql, rows, afterMs, skipLocked).pipe(
      storeOpWithin("delivery.webhookState", WRITE_TIMEOUT),
      Effect.flatMap((answered) =>
        Effect.as(
          Effect.forEach(answered.filter((a) => a.disabled_now), disabled, { discard: true }),
          answered.filter((a) => !a.disabled_now)
        )
      ),
      Effect.catchAll((e) =>
        Effect.as(
          log.run(`webhookState:${e.code}`, () =>
            Effect.logWarning("delivery: the webhook state update failed").pipe(
              Effect.annotateLogs({ op: e.op, code: e.code })
            )),
          []
        )
      )
    )
  return { counted, write, log }
}

/**
 * The recorder applied directly: `record(items, applied)` runs the statement for one settle
 * batch and returns when it is done (never fails; waits for rows another session holds, within
 * the statement's bound). Parks given to it are counted (the store's writer leaves them to the
 * settle statement). `afterMs` = `DELIVERY_AUTO_DISABLE_AFTER_MS` (0 = never).
 */
export const makeRecorder = (sql: SqlClient.SqlClient, afterMs: number) => {
  const written: Written = new Map()
  const { counted, write } = reporter(afterMs)
  return <I extends HealthInput>(items: ReadonlyArray<I>, applied: ReadonlyArray<SettledRow>): Effect.Effect<void> =>
    Effect.suspend(() => {
      const { dropped, parked, rows } = collect(items, applied, written, true)
      counted(parked, dropped)
      return rows.length === 0 ? Effect.void : Effect.asVoid(write(sql, rows, false))
    })
}

/** The store's writer of the webhook state (see the module documentation). */
export interface Writer {
  /**
   * Merge a settle batch's changes into the buffer (never waits). Answers the ticket of the write
   * that will hold them, 0 when the batch changed nothing.
   */
  readonly offer: <I extends HealthInput>(items: ReadonlyArray<I>, applied: ReadonlyArray<SettledRow>) => number
  /** Wait until the write of `ticket` is done, {@link WRITE_WAIT} at most (never fails). */
  readonly written: (ticket: number) => Effect.Effect<void>
}

/**
 * The writer of one store: its fiber runs in the caller's scope. `afterMs` =
 * `DELIVERY_AUTO_DISABLE_AFTER_MS` (0 = never).
 */
export const makeWriter = (sql: SqlClient.SqlClient, afterMs: number): Effect.Effect<Writer, never, Scope.Scope> =>
  Effect.gen(function*() {
    const throttle: Written = new Map()
    const { counted, log, write } = reporter(afterMs)
    const wake = yield* Queue.sliding<void>(1)
    /** the changes not written yet, and those skipped on a held row (retried with the next) */
    const pending = new Map<string, Row>()
    const carried = new Map<string, Row>()
    const waiters = new Set<{ readonly ticket: number; readonly resume: () => void }>()
    let offered = 0
    let done = 0
    let lost = 0
    const put = (into: Map<string, Row>, row: Row, newer: boolean) => {
      const key = keyOf(row)
      const known = into.get(key)
      if (known !== undefined) into.set(key, newer ? merge(known, row) : merge(row, known))
      else if (into.size < PENDING_MAX) into.set(key, row)
      else lost++
    }
    const settleWaiters = () => {
      for (const w of waiters) {
        if (w.ticket <= done) {
          waiters.delete(w)
          w.resume()
        }
      }
    }
    const noteLost = Effect.suspend(() => {
      if (lost === 0) return Effect.void
      const n = lost
      lost = 0
      return log.run(
        "webhookState:full",
        () =>
          Effect.logWarning("delivery: webhook state changes dropped (the buffer is full)").pipe(
            Effect.annotateLogs({ dropped: n, max: PENDING_MAX })
          )
      )
    })
    const writer = Effect.gen(function*() {
      while (true) {
        if (pending.size === 0) {
          if (carried.size === 0) yield* Queue.take(wake)
          else yield* Effect.ignore(Effect.timeout(Queue.take(wake), WRITE_RETRY))
          for (const row of carried.values()) put(pending, row, false)
          carried.clear()
          continue
        }
        for (const row of carried.values()) put(pending, row, false)
        carried.clear()
        const upTo = offered
        const rows: Array<Row> = []
        for (const [key, row] of pending) {
          if (rows.length >= WRITE_ROWS_MAX) break
          rows.push(row)
          pending.delete(key)
        }
        const all = pending.size === 0
        const skipped = yield* write(sql, rows, true)
        if (skipped.length > 0) {
          const byKey = new Map(rows.map((r) => [keyOf(r), r]))
          for (const s of skipped) {
            const row = byKey.get(`${s.owner_did} ${s.rkey} ${s.fingerprint}`)
            if (row !== undefined) put(carried, row, false)
          }
        }
        yield* noteLost
        if (all) {
          done = upTo
          settleWaiters()
        }
      }
    })
    yield* Effect.forkScoped(writer)
    // settles still waiting when the store's scope closes are let go
    yield* Effect.addFinalizer(() =>
      Effect.sync(() => {
        done = Number.MAX_SAFE_INTEGER
        settleWaiters()
      })
    )
    const offer: Writer["offer"] = (items, applied) => {
      const { dropped, parked, rows } = collect(items, applied, throttle, false)
      counted(parked, dropped)
      if (rows.length === 0) return 0
      for (const row of rows) put(pending, row, true)
      offered++
      wake.unsafeOffer(undefined)
      return offered
    }
    const written: Writer["written"] = (ticket) =>
      ticket <= done ? Effect.void : Effect.async<void>((resume) => {
        const w = { ticket, resume: () => resume(Effect.void) }
        waiters.add(w)
        return Effect.sync(() => {
          waiters.delete(w)
        })
      }).pipe(Effect.timeout(WRITE_WAIT), Effect.ignore)
    return { offer, written }
  })

/**
 * The writer with `DELIVERY_AUTO_DISABLE_AFTER_MS` from the context's configuration (its default
 * when the store is built without one); its fiber runs in the caller's scope.
 */
export const writerFor = (sql: SqlClient.SqlClient) =>
  Effect.flatMap(Effect.serviceOption(FirehookConfig), (config) =>
    makeWriter(
      sql,
      Option.match(config, {
        onNone: () => DeliveryConfig.delivery.autoDisableAfterMs.default,
        onSome: (c) => c.delivery.autoDisableAfterMs
      })
    ))
