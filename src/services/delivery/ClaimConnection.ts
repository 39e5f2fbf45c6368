/**
 * The claim connection of the delivery store's SQL driver. Plan guard: right after a burst (an
 * event fan-out, a replay of dead letters) the planner's statistics still describe a small outbox,
 * and it picks a bitmap scan of EVERY due row plus a sort over the ordered `outbox_due` index scan
 * that the LIMIT needs (far slower per claim, growing with the backlog; figures in
 * docs/benchmarks.md).
 * Claims therefore run on one connection reserved from the pool with `enable_bitmapscan = off`
 * for its session (one round trip per claim; a transaction with `SET LOCAL` costs three more).
 * The same session has `plan_cache_mode = force_custom_plan`: a claim sent as a named prepared
 * statement (PreparedStatements.ts) is planned with its values each time. PostgreSQL otherwise may
 * switch it to a generic plan after five runs, which for the claim (its limits are parameters) is
 * far worse at volume: forced for every statement, an end-to-end run fell from about 2,500 to 123
 * deliveries/s, PostgreSQL spending 8 ms per delivery, and 3 of 15 runs of `bench/e2e.ts` hit it on
 * their own (stop 53, docs/benchmarks.md).
 * Claims of this store take turns on it. After a failed claim the connection is given back
 * (setting reset first) and the next claim reserves a fresh one; the layer's scope gives it back
 * at shutdown.
 *
 * Liveness marks (SPEC §4.1). The claim connection also holds the liveness mark of each worker
 * claiming through it: the session advisory lock `(WORKER_ALIVE, hashtext(workerId))` in SHARED
 * mode, taken before the worker's first claim on each claim connection (a set lookup per claim
 * afterwards) and confirmed every few seconds by `holdMark` (the worker's reclaim loop), which
 * re-takes it on a fresh connection after the old one was lost. The mark dies with the connection,
 * so with the process. A claim (or confirmation) that fails replaces the connection: the marks it
 * held are taken on a fresh one FIRST (shared, so both sessions hold them for a moment), and only
 * then is the old one given back (its marks released); with no fresh connection marked within
 * {@link MARK_AGAIN_TIMEOUT} the old one is kept. So at no moment does a live worker look dead to
 * another process's reclaim (which reads the granted marks of `pg_locks`, any mode). The
 * connection is given back with its setting reset and its marks released; when that fails or
 * times out it is discarded (it could still hold a mark); after a shutdown that was not
 * clean (Lifecycle.tidyDatabase) it is discarded at once, with no statement sent. With a pool of one connection
 * the mark is held by that connection (confirmed every few seconds, since the pool may replace it).
 *
 * No TCP keepalive settings (unlike the leader's lock session, Leader.LOCK_SESSION_KEEPALIVE): a
 * claim session ended by the server's keepalives ~25 s into a network cut would make a worker
 * that still holds and sends its rows look dead; its rows must wait their lease (which the worker
 * gives up at 2/3 of it), not be freed and sent by another worker meanwhile.
 *
 * Part of the SQL driver of the `DeliveryStore` port (DeliveryStoreSql.ts).
 */
import type * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import type { SqlError } from "@effect/sql/SqlError"
import { Duration, Effect, Exit, Scope } from "effect"
import * as Lifecycle from "../platform/Lifecycle.js"
import { WORKER_ALIVE } from "../platform/LockKeys.js"
import { endClient } from "../platform/PooledConnection.js"

/** Runs a claim statement of `workerId` on the claim connection (or, with a pool of one, in a transaction). */
export type OnClaimConnection = <A>(
  workerId: string,
  statement: Effect.Effect<A, SqlError, never>
) => Effect.Effect<A, SqlError, never>

export interface ClaimConnection {
  readonly run: OnClaimConnection
  /**
   * Takes, or confirms, the liveness mark of `workerId` on the claim connection (one round trip):
   * true when it holds it; false when another session does (another process whose worker id hashes
   * alike: this worker then looks alive as long as that one is, and falls back to lease expiry).
   */
  readonly holdMark: (workerId: string) => Effect.Effect<boolean, SqlError, never>
}

/**
 * The claims' plan settings in one statement: no bitmap scans, a plan made with the values each
 * time; for the session, or (`local`) for the transaction.
 */
const planGuard = (local: boolean) =>
  `SELECT set_config('enable_bitmapscan', 'off', ${local}), set_config('plan_cache_mode', 'force_custom_plan', ${local})`

/** How long giving the connection back (reset, marks released) may take before it is discarded. */
const GIVE_BACK_TIMEOUT = Duration.seconds(2)
/** How long taking the marks again on a new connection after a failed statement may take. */
const MARK_AGAIN_TIMEOUT = Duration.seconds(5)

/**
 * Takes the mark unless this session holds it already (session locks stack; this one never does).
 * Shared: the next claim connection takes it while the one it replaces still holds it. False only
 * while another session holds (or waits for) it in exclusive mode (none of firehook's does).
 */
const markStatement = (sql: SqlClient.SqlClient, workerId: string) =>
  sql<{ readonly held: boolean }>`
    SELECT CASE WHEN EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.pid = pg_backend_pid() AND l.granted AND l.objsubid = 2
          AND l.classid = ${WORKER_ALIVE}::oid AND l.objid = hashtext(${workerId})::oid
      ) THEN true ELSE pg_try_advisory_lock_shared(${WORKER_ALIVE}::int, hashtext(${workerId})) END AS held`.pipe(
    Effect.map((rows) => rows[0]?.held === true)
  )

/** The claim connection of one store; given back when the store's scope closes. */
export const makeClaimConnection = (
  sql: SqlClient.SqlClient,
  pg: PgClient.PgClient
): Effect.Effect<ClaimConnection, never, Scope.Scope> =>
  Effect.gen(function*() {
    const claimLock = yield* Effect.makeSemaphore(1)
    // after an unclean shutdown: no reset, no unlock; the connection is ended (its marks die with it)
    const tidy = Lifecycle.tidyDatabase(yield* Effect.serviceOption(Lifecycle.Lifecycle))
    let claimConn:
      | {
        readonly conn: Connection
        readonly scope: Scope.CloseableScope
        /** workers whose mark this connection holds (taken, answered held) */
        readonly marks: Set<string>
      }
      | undefined
    const releaseClaimConn = Effect.suspend(() => {
      const held = claimConn
      claimConn = undefined
      return held === undefined ? Effect.void : Scope.close(held.scope, Exit.void)
    })
    // With a pool of one connection: the workers whose mark that connection holds.
    const poolMarks = new Set<string>()
    yield* Effect.addFinalizer(() =>
      Effect.zipRight(
        releaseClaimConn,
        Effect.flatMap(tidy, (yes) =>
          Effect.forEach(yes ? poolMarks : [], (id) =>
            sql`SELECT pg_advisory_unlock_shared(${WORKER_ALIVE}::int, hashtext(${id}))`.pipe(
              Effect.interruptible,
              Effect.timeoutOption(GIVE_BACK_TIMEOUT),
              Effect.ignore
            ), { discard: true }))
      )
    )
    /** A new claim connection (not yet the store's); its scope gives it back. */
    const reserveClaimConn = Effect.flatMap(Scope.make(), (scope) =>
      Scope.extend(sql.reserve, scope).pipe(
        Effect.tap((conn) =>
          Effect.zipRight(
            conn.executeUnprepared(planGuard(false), [], undefined),
            // runs before the pool release added by `reserve` (finalizers run in reverse order);
            // interruptible, or the timeout could not end a hung statement inside the finalizer
            Scope.addFinalizer(
              scope,
              Effect.flatMap(tidy, (yes) =>
                !yes ? endClient(conn) : Effect.zipRight(
                  Effect.zipRight(
                    conn.executeUnprepared("RESET enable_bitmapscan", [], undefined),
                    conn.executeUnprepared("RESET plan_cache_mode", [], undefined)
                  ),
                  conn.executeUnprepared("SELECT pg_advisory_unlock_all()", [], undefined)
                ).pipe(
                  Effect.interruptible,
                  Effect.timeoutOption(GIVE_BACK_TIMEOUT),
                  // not given back in a known state (it may still hold marks): discarded
                  Effect.matchEffect({
                    onFailure: () => endClient(conn),
                    onSuccess: (done) => (done._tag === "Some" ? Effect.void : endClient(conn))
                  })
                ))
            )
          )
        ),
        Effect.map((conn) => ({ conn, scope, marks: new Set<string>() })),
        Effect.onError((cause) => Scope.close(scope, Exit.failCause(cause)))
      ))
    const claimConnection = Effect.suspend(() => {
      const held = claimConn
      if (held !== undefined) return Effect.succeed(held)
      return Effect.tap(reserveClaimConn, (fresh) => Effect.sync(() => (claimConn = fresh)))
    })
    // A pool of one connection cannot give one away for good: there the claim runs in a transaction
    // of its own with `SET LOCAL` (three more round trips per claim, as before the reserved connection).
    const reserveForClaims = (pg.config.maxConnections ?? 10) >= 2
    const onHeld = <A>(
      held: { readonly conn: Connection },
      statement: Effect.Effect<A, SqlError, never>
    ) => Effect.provideService(statement, SqlClient.TransactionConnection, [held.conn, 0] as const)
    /** Takes (or confirms) the mark; remembered in `marks` only when this session holds it. */
    const takeMark = (marks: Set<string>, workerId: string) =>
      Effect.tap(markStatement(sql, workerId), (held) => Effect.sync(() => held && marks.add(workerId)))
    const markOnce = (marks: Set<string>, workerId: string) =>
      marks.has(workerId) ? Effect.void : Effect.asVoid(takeMark(marks, workerId))
    /**
     * After a failed statement the connection is replaced: a fresh one is reserved and takes the
     * marks the old one held (shared mode: both hold them for that moment), and only then is the
     * old one given back (its marks released). When no fresh connection is marked within
     * {@link MARK_AGAIN_TIMEOUT} (none to be had, the statements fail or hang), the fresh one is
     * given back and the old one is kept with its marks: a failure on a healthy connection
     * (statement timeout, cancel, lock wait, interruption) must never leave the worker without its
     * marks, or another process's reclaim frees the rows it is sending (they were, before: the
     * old connection was given back first). A dead old connection fails the next claim, which
     * replaces it again.
     */
    const replaceClaimConn = Effect.suspend(() => {
      const old = claimConn
      const ids = old === undefined ? [] : [...old.marks]
      if (old === undefined || ids.length === 0) return releaseClaimConn
      const markAll = (fresh: { readonly conn: Connection; readonly marks: Set<string> }) =>
        Effect.forEach(ids, (id) => onHeld(fresh, markOnce(fresh.marks, id)), { discard: true })
      const marked = Effect.flatMap(reserveClaimConn, (fresh) =>
        markAll(fresh).pipe(
          Effect.as(fresh),
          // not taken in time (or failed): the fresh connection is given back, its marks released
          Effect.onError(() => Scope.close(fresh.scope, Exit.void))
        ))
      return marked.pipe(
        Effect.interruptible,
        Effect.timeoutOption(MARK_AGAIN_TIMEOUT),
        Effect.option,
        Effect.flatMap((done) => {
          if (done._tag === "None" || done.value._tag === "None") {
            return Effect.void
          }
          claimConn = done.value.value
          return Scope.close(old.scope, Exit.void)
        })
      )
    })
    const onConn = <A>(
      use: (
        held: { readonly conn: Connection; readonly marks: Set<string> }
      ) => Effect.Effect<A, SqlError, never>
    ) =>
      claimLock.withPermits(1)(
        Effect.flatMap(claimConnection, (held) => onHeld(held, use(held))).pipe(
          // after an unclean shutdown nothing is asked of the database: the connection is ended
          Effect.onError(() => Effect.flatMap(tidy, (yes) => (yes ? replaceClaimConn : releaseClaimConn)))
        )
      )
    const run: OnClaimConnection = <A>(workerId: string, statement: Effect.Effect<A, SqlError, never>) =>
      !reserveForClaims
        ? sql.withTransaction(
          Effect.zipRight(
            markOnce(poolMarks, workerId),
            Effect.zipRight(sql.unsafe(planGuard(true)), statement)
          )
        )
        : onConn((held) => Effect.zipRight(markOnce(held.marks, workerId), statement))
    const holdMark = (workerId: string) =>
      !reserveForClaims
        ? takeMark(poolMarks, workerId)
        : onConn((held) => takeMark(held.marks, workerId))
    const shape: ClaimConnection = { run, holdMark }
    return shape
  })
