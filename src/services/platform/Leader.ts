/**
 * Singleton roles across replicas (SPEC §6.4): a role is held by the replica that holds a
 * PostgreSQL session advisory lock on a dedicated (reserved) connection. Standbys retry every few
 * seconds; the leader pings its connection and gives the role up when the connection fails (its
 * lock is gone with it), or at once when the driver reports the connection gone (the server ended
 * the session), so a standby takes over within seconds of the leader's death. A lock
 * whose unlock fails or times out dies with its connection, which is discarded
 * ({@link unlockOrDiscard}), never given back to the pool holding the lock. After a shutdown that
 * was not clean the connection is ended without an unlock (the lock dies with it).
 *
 * The lock's server session detects a dead or cut-off leader by TCP keepalives set on it before
 * the lock is asked for ({@link LOCK_SESSION_KEEPALIVE}): the server's defaults (first probe after
 * 2 h) would let an orphaned session keep the role for about 2 h 11 min after its host died or was
 * partitioned, with no replica able to lead; with these, within about 30 s of the last answer.
 * A frozen leader (SIGSTOP, a paused VM) still answers keepalives from its kernel: a standby ends
 * the session of a holder that has not pinged for {@link STALE_LEADER_AFTER}.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import type { Connection } from "@effect/sql/SqlConnection"
import { Cause, Duration, Effect, Exit, Fiber, Option, Ref, Schedule, Scope } from "effect"
import * as Lifecycle from "./Lifecycle.js"
import { codeOf } from "./Persistence.js"
import { endClient, whenLost } from "./PooledConnection.js"
import * as RateLimitedLog from "./RateLimitedLog.js"

export type Role = "leader" | "standby"

/** How long an unlock, and each step of discarding a connection, may take. */
const UNLOCK_TIMEOUT = Duration.seconds(2)

/**
 * The `pg_locks` rows (alias `l`) of the session advisory lock whose 64-bit key is the statement's
 * first parameter, granted, in this database (a bigint key is stored as classid = high 32 bits,
 * objid = low 32 bits, objsubid 1).
 */
const HOLDS_LOCK_KEY_1 = `l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
       AND l.classid = ($1::bigint >> 32)::oid AND l.objid = ($1::bigint & 4294967295)::oid
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())`

/**
 * Gives the session lock `key` back on `conn`, bounded. When that fails or times out, the
 * connection may still hold the lock: it is discarded (SPEC §6.4), never returned to the pool
 * holding it (no replica could lead again): its client is ended, and the server session that holds
 * the lock (`pid`, when known) is terminated from another connection.
 */
export const unlockOrDiscard = (
  sql: SqlClient.SqlClient,
  conn: Connection,
  key: number,
  pid: number | undefined,
  /** false after an unclean shutdown (Lifecycle.tidyDatabase): the connection is ended at once */
  tidy: Effect.Effect<boolean> = Effect.succeed(true)
): Effect.Effect<void> => {
  const terminate = pid === undefined ? Effect.void : sql.unsafe(
    `SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.pid = $2 AND ${HOLDS_LOCK_KEY_1}`,
    [key, pid]
  ).pipe(
    Effect.interruptible,
    Effect.timeoutOption(UNLOCK_TIMEOUT),
    Effect.ignore
  )
  const discard = Effect.zipRight(endClient(conn), terminate)
  // interruptible: this runs in finalizers (uninterruptible), where a timeout could not end a hung query
  const unlock = conn.executeValues("SELECT pg_advisory_unlock($1)", [key]).pipe(
    Effect.interruptible,
    Effect.timeoutOption(UNLOCK_TIMEOUT),
    Effect.matchEffect({
      onFailure: () => discard,
      // answered (true, or false when the lock was never taken): the session holds it no more
      onSuccess: (done) => (Option.isSome(done) ? Effect.void : discard)
    })
  )
  // after an unclean shutdown the database may be what hung: the lock dies with the ended client
  // (no unlock, no terminate from another connection, each of which could wait out its bound)
  return Effect.flatMap(tidy, (yes) => (yes ? unlock : endClient(conn)))
}

/**
 * Server-side TCP settings of a lock session (session-level, set by the session itself: no
 * privilege needed; ignored on a Unix-domain socket): first keepalive probe after 10 s idle, then
 * every 5 s, the session ends after 3 unanswered; and data unacknowledged for 20 s ends it too.
 */
export const LOCK_SESSION_KEEPALIVE = `SELECT set_config('tcp_keepalives_idle', '10', false),
  set_config('tcp_keepalives_interval', '5', false), set_config('tcp_keepalives_count', '3', false),
  set_config('tcp_user_timeout', '20000', false)`

/** How long one election may wait for a connection and for its lock query. */
const ELECTION_TIMEOUT = Duration.seconds(10)
/** Logged as `code: timeout` by the election's error handler ({@link leaderErrorCode}). */
const electionTimeout = () => ({ code: "timeout" }) as const

/**
 * A holder of the lock whose session has been idle this long is taken for frozen and its session
 * is terminated by the standby that found it (default of {@link LeaderOptions.staleAfter}). A
 * leader pings its lock session every 2 s (each ping moves the session's `state_change`), so a
 * live one is never idle for more than a few seconds; a frozen one (SIGSTOP, a paused VM, a hung
 * runtime) is, while its kernel still answers the server's keepalives, so the session would hold
 * the role for as long as the freeze lasts, every replica a standby.
 */
export const STALE_LEADER_AFTER = Duration.seconds(30)

/**
 * Ends the session that holds the lock `key` when it has been idle (no ping) for `staleMs`
 * (the database's clock on both sides); answers whether one was ended. Sessions of another
 * database role are not visible (`state_change` is then NULL) and never ended.
 */
const endStaleHolder = (conn: Connection, key: number, staleMs: number) =>
  conn.executeValues(
    `SELECT pg_terminate_backend(a.pid) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE ${HOLDS_LOCK_KEY_1}
       AND a.pid <> pg_backend_pid() AND a.state = 'idle'
       AND a.state_change < now() - $2::int * interval '1 millisecond'`,
    [key, staleMs]
  ).pipe(
    Effect.timeoutFail({ duration: ELECTION_TIMEOUT, onTimeout: electionTimeout }),
    Effect.map((rows) => rows.some((r) => r[0] === true))
  )

/**
 * Another replica holds the lock: it may be frozen (its session idle past `staleMs`, no ping). Its
 * session is then ended, so that the lock is free at the next election (the thawed holder finds
 * its connection gone and gives the role up); best effort, like any election step.
 */
const endIfFrozen = (conn: Connection, key: number, staleMs: number, name: string) =>
  Effect.flatMap(Effect.either(endStaleHolder(conn, key, staleMs)), (ended) =>
    ended._tag === "Right" && ended.right
      ? Effect.logWarning("role holder unresponsive; its database session was ended").pipe(
        Effect.annotateLogs({ role: name, idleMs: staleMs })
      )
      : Effect.void)

/**
 * The code of an election or ping failure: `timeout` for the bounds of this module (an election
 * or a ping that took too long), else the driver's code ({@link codeOf}).
 */
export const leaderErrorCode = (e: unknown): string =>
  e === "timeout" || (typeof e === "object" && e !== null && Reflect.get(e, "code") === "timeout")
    ? "timeout"
    : codeOf(e)

/**
 * Why a leader's work ended, by kind and code only (a cause's messages and values may carry a
 * URL, a secret or an SQL value): `failure` (its typed error's code) or `defect` (the defect's
 * code, e.g. that of a `StoreError` died with `Effect.orDie`), `interrupted`; nothing when it
 * returned.
 */
export const workEndOf = (
  cause: Cause.Cause<unknown> | undefined
): { readonly kind: "failure" | "defect" | "interrupted"; readonly code?: string } | undefined => {
  if (cause === undefined || Cause.isEmpty(cause)) return undefined
  const failure = Cause.failureOption(cause)
  if (Option.isSome(failure)) return { kind: "failure", code: leaderErrorCode(failure.value) }
  const defect = Cause.dieOption(cause)
  if (Option.isSome(defect)) return { kind: "defect", code: leaderErrorCode(defect.value) }
  return { kind: "interrupted" }
}

/**
 * What happens at each step of a term, for roles that report their own way (their own state,
 * their own log lines). Every hook is optional; the defaults are the log lines of this module.
 */
export interface LeaderEvents {
  /** a connection was had and the lock is about to be asked for (default: nothing) */
  readonly attempt?: Effect.Effect<void>
  /** the lock was taken, before `work` starts (default: log `role acquired`) */
  readonly acquired?: Effect.Effect<void>
  /**
   * the role was given up: its connection failed (`error`: the ping's) or `work` ended (`error`:
   * the work's `Cause` when it failed, died or was interrupted, `undefined` when it returned; see
   * {@link workEndOf}) (default: log `role lost`)
   */
  readonly lost?: (reason: "connection" | "worker-ended", error: unknown) => Effect.Effect<void>
  /** an election failed: no connection, or the lock query failed or timed out (default: log `role election failed`) */
  readonly failed?: (error: unknown) => Effect.Effect<void>
  /** the term is over, whichever way, and `role` is back to `standby` (default: nothing) */
  readonly ended?: Effect.Effect<void>
}

export interface LeaderOptions {
  readonly key: number
  readonly name: string
  /** how often a standby retries (default 2 s) */
  readonly retryInterval?: Duration.DurationInput
  /** how often the leader pings its lock connection (default 2 s) */
  readonly pingInterval?: Duration.DurationInput
  /** bound on one ping (default: the ping interval) */
  readonly pingTimeout?: Duration.DurationInput
  /**
   * a holder of the lock whose session has been idle this long is ended by a standby (default
   * {@link STALE_LEADER_AFTER}); it must be well above the holders' `pingInterval`
   */
  readonly staleAfter?: Duration.DurationInput
  /** how the steps of a term are reported (default: the log lines of this module) */
  readonly events?: LeaderEvents
  /**
   * Each election's outcome, besides `events`: `leader` (the lock was taken), `standby` (another
   * replica holds it), `failed` (no connection, or the lock query failed or timed out)
   */
  readonly onElection?: (outcome: "leader" | "standby" | "failed") => Effect.Effect<void>
}

/**
 * Run `work` whenever this replica holds the lock `key`; forever (until interrupted). `work` is
 * interrupted when leadership is lost, and started again when it is regained. `role` is updated.
 * A term whose `work` ended gives the lock back and competes again after `retryInterval`, like a
 * standby (a lost connection competes again at once).
 */
export const runAsLeader = <E, R>(
  options: LeaderOptions,
  role: Ref.Ref<Role>,
  work: Effect.Effect<void, E, R>
): Effect.Effect<never, never, R | SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const tidy = Lifecycle.tidyDatabase(yield* Effect.serviceOption(Lifecycle.Lifecycle))
    const retry = Duration.decode(options.retryInterval ?? "2 seconds")
    const ping = Duration.decode(options.pingInterval ?? "2 seconds")
    const pingTimeout = options.pingTimeout === undefined ? ping : Duration.decode(options.pingTimeout)
    const staleMs = Math.max(1, Math.round(Duration.toMillis(options.staleAfter ?? STALE_LEADER_AFTER)))
    const events = options.events ?? {}
    const onElection = options.onElection ?? (() => Effect.void)
    // a work that keeps ending at once (intake's reload failing, say) takes the lock again every
    // `retry`, two lines a term: `role acquired` right after a term whose work ended, and `role
    // lost` of a work that ended (per kind and code of its end), are logged at most once a minute
    // (with `suppressed`). Any other acquisition (the first, one after standing by, after a failed
    // election or after a lost connection: a change of leader) and a lost connection: at once.
    const termLog = RateLimitedLog.make()
    const previous = yield* Ref.make<"none" | "not-leader" | "connection-lost" | "worker-ended">("none")
    const acquiredLine = (suppressed: number | undefined) =>
      Effect.logInfo("role acquired").pipe(
        Effect.annotateLogs(suppressed === undefined ? { role: options.name } : { role: options.name, suppressed })
      )
    const acquiredEvent = events.acquired ??
      Effect.flatMap(Ref.get(previous), (before) =>
        before === "worker-ended"
          ? termLog.run("acquired", acquiredLine)
          : acquiredLine(undefined))
    const lostEvent = events.lost ??
      ((reason: "connection" | "worker-ended", error: unknown) => {
        if (reason === "connection") {
          return Effect.logWarning("role lost").pipe(
            Effect.annotateLogs({ role: options.name, reason, code: leaderErrorCode(error) })
          )
        }
        const end = workEndOf(Cause.isCause(error) ? error : undefined)
        const key = end === undefined ? "worker-ended" : `worker-ended ${end.kind} ${end.code ?? ""}`
        return termLog.run(key, (suppressed) =>
          Effect.logWarning("role lost").pipe(
            Effect.annotateLogs({ role: options.name, reason, ...end, suppressed })
          ))
      })
    // a database outage fails an election every `retry`: logged once a minute per code
    const failedLog = RateLimitedLog.make()
    const failedEvent = events.failed ??
      ((e: unknown) => {
        const code = leaderErrorCode(e)
        return failedLog.run(code, (suppressed) =>
          Effect.logWarning("role election failed").pipe(
            Effect.annotateLogs({ role: options.name, code, suppressed })
          ))
      })
    const term = Effect.gen(function*() {
      const scope = yield* Scope.make()
      const ended = yield* Effect.gen(function*() {
        // bounded (SPEC §7): a connection that cannot be had, or a lock query that hangs, is a
        // failed election, retried after `retry`, never a standby stuck for good
        const conn = yield* sql.reserve.pipe(
          Scope.extend(scope),
          Effect.timeoutFail({ duration: ELECTION_TIMEOUT, onTimeout: electionTimeout })
        )
        if (events.attempt !== undefined) yield* events.attempt
        // best effort: a server that refuses the settings still elects (with its own keepalives);
        // one that does not answer in time fails the election, as the lock query would
        yield* conn.executeValues(LOCK_SESSION_KEEPALIVE, []).pipe(
          Effect.either,
          Effect.timeoutFail({ duration: ELECTION_TIMEOUT, onTimeout: electionTimeout })
        )
        const rows = yield* conn
          .executeValues("SELECT pg_try_advisory_lock($1), pg_backend_pid()", [options.key])
          .pipe(
            Effect.timeoutFail({ duration: ELECTION_TIMEOUT, onTimeout: electionTimeout }),
            // the lock may have been taken on the server after we stopped waiting: release it on
            // this connection (queued behind the lock query) before the connection goes back to
            // the pool, or it would hold the role for nobody (and when that fails too, the
            // connection is discarded)
            Effect.tapError(() => unlockOrDiscard(sql, conn, options.key, undefined))
          )
        const ok = rows[0]?.[0] === true
        if (!ok) {
          yield* endIfFrozen(conn, options.key, staleMs, options.name)
          yield* onElection("standby")
          return "not-leader" as const
        }
        const pid = Number(rows[0]?.[1])
        yield* Scope.addFinalizer(
          scope,
          unlockOrDiscard(sql, conn, options.key, Number.isFinite(pid) ? pid : undefined, tidy)
        )
        yield* Ref.set(role, "leader")
        yield* onElection("leader")
        yield* acquiredEvent
        const worker = yield* Effect.forkIn(work, scope)
        // the watchdog: a failed ping means the lock's connection is gone; so does the client's
        // report that the server ended the session (its lock with it), seen at once: waiting for
        // the next ping let another replica lead while this one still did (measured: about 1 s
        // of two leaders after `pg_terminate_backend` of the lock's session)
        const lost = yield* conn
          .executeValues("SELECT 1", [])
          .pipe(
            Effect.timeoutFail({ duration: pingTimeout, onTimeout: () => "timeout" as const }),
            Effect.repeat(Schedule.spaced(ping)),
            Effect.zipRight(Effect.never),
            Effect.raceFirst(Effect.flatMap(whenLost(conn), ({ error }) => Effect.fail(error))),
            // the work's end, with its cause (logged by kind and code, never its values)
            Effect.raceFirst(Fiber.await(worker)),
            Effect.either
          )
        if (lost._tag === "Left") {
          yield* lostEvent("connection", lost.left)
          return "connection-lost" as const
        }
        yield* lostEvent("worker-ended", Exit.isFailure(lost.right) ? lost.right.cause : undefined)
        return "worker-ended" as const
      }).pipe(
        Effect.catchAll((e) => Effect.as(Effect.zipRight(onElection("failed"), failedEvent(e)), "not-leader" as const)),
        Effect.ensuring(
          events.ended === undefined
            ? Ref.set(role, "standby")
            : Effect.zipRight(Ref.set(role, "standby"), events.ended)
        ),
        Effect.onExit(() => Scope.close(scope, Exit.void))
      )
      yield* Ref.set(previous, ended)
      // a lost connection competes again at once (the old session's lock is gone or going); any
      // other end waits `retry`: a standby, a failed election, and a term whose work ended (a work
      // that dies at once, e.g. intake's reload failing, would otherwise take and give up the lock
      // in a loop as fast as the database answers, logging each time, and no standby could lead)
      if (ended !== "connection-lost") yield* Effect.sleep(retry)
    })
    return yield* Effect.forever(term)
  })
