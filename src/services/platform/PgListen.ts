/**
 * PostgreSQL `LISTEN` on a connection of firehook's own: what `PgClient.listen` is on the pools
 * firehook builds (Database.ts puts it in place of `@effect/sql-pg`'s).
 *
 * `@effect/sql-pg`'s `listen` (0.50) has three faults this replaces:
 * - a lost connection is never seen: its `error` handler does nothing and `end` has none, so after
 *   a PostgreSQL restart every `LISTEN` stream stays open and silent for the life of the process
 *   (measured: `pg_terminate_backend` on its backend, then a `NOTIFY`, and the stream neither
 *   fails nor delivers);
 * - the notification handler is attached only after the `LISTEN` has answered, so a notification
 *   arriving in that moment is lost;
 * - two `LISTEN`s at once queue a query on a busy `pg` client, which `pg` 8 reports as deprecated.
 *
 * Here:
 * - one connection per pool, opened by the first stream and ended when the last one ends; every
 *   channel of the process shares it;
 * - a stream's subscription is in place before its `LISTEN` is sent, and `LISTEN`/`UNLISTEN` (and
 *   the liveness probe) go one at a time;
 * - the connection's `error` or `end`, a `LISTEN` that fails or times out, or a liveness probe
 *   (`SELECT 1` every {@link PROBE_EVERY}) that does not answer within {@link QUERY_TIMEOUT}, fails
 *   every stream on it with a `SqlError`. Their followers (ListenLoop, RegistrySync, the delivery
 *   worker) open them again with their backoff, on a new connection, and cover the gap as they
 *   already do (polling, catch-up, TTLs): a notification is a hint, never the record;
 * - each stream buffers at most {@link BUFFER} payloads (dropping beyond), and notifications with
 *   an empty payload are not delivered (as before);
 * - after a shutdown that was not clean (Lifecycle.tidyDatabase) a stream's end sends no `UNLISTEN`
 *   (the database may be what hung): the connection is ended, which ends its `LISTEN`s.
 */
import { SqlError } from "@effect/sql/SqlError"
import { Duration, Effect, ExecutionStrategy, Exit, Scope, Stream } from "effect"
import type { StreamEmit } from "effect"
import Pg from "pg"
import * as Lifecycle from "./Lifecycle.js"

/** How often an idle connection is asked `SELECT 1`. */
export const PROBE_EVERY = Duration.seconds(30)
/** The bound on connecting, on one `LISTEN`/`UNLISTEN`, and on a probe. */
export const QUERY_TIMEOUT = Duration.seconds(10)
/** Payloads a stream holds for a slow reader at most (dropping beyond). */
export const BUFFER = 4_096
/** How long ending the connection may take. */
const END_TIMEOUT = Duration.seconds(1)

export interface PgListenOptions {
  /** the probe's interval ({@link PROBE_EVERY}) */
  readonly probeEvery?: Duration.DurationInput
  /** the bound on connecting, one command and a probe ({@link QUERY_TIMEOUT}) */
  readonly queryTimeout?: Duration.DurationInput
  /**
   * the class each connection is made with, given `config` (`Pg.Client` by default); Database.ts's
   * parses `DATABASE_URL` again for each (DatabaseSsl.connectingClient)
   */
  readonly Client?: typeof Pg.Client
}

type Emit = StreamEmit.EmitOpsPush<SqlError, string>

interface Connection {
  readonly client: Pg.Client
  /** the subscriptions of each channel listened to */
  readonly channels: Map<string, Set<Emit>>
  /** holds the probe fiber */
  readonly scope: Scope.CloseableScope
  users: number
  dead: boolean
}

const lost = (cause: unknown, message: string) => new SqlError({ cause, message })
/** an error of this module's own, with the code its followers log (ErrorCode: never the message) */
const coded = (message: string, code: string) => Object.assign(new Error(message), { code })
const gone = () => lost(coded("connection lost", "connection_lost"), "LISTEN connection lost")
const timedOut = () => lost(coded("timed out", "timeout"), "LISTEN timed out")

/**
 * A `listen` on connections made with `config` (a `pg` client's settings) by `options.Client`, for
 * the life of the scope.
 */
export const make = (
  config: Pg.ClientConfig,
  options: PgListenOptions = {}
): Effect.Effect<(channel: string) => Stream.Stream<string, SqlError>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const probeEvery = Duration.decode(options.probeEvery ?? PROBE_EVERY)
    const timeout = Duration.decode(options.queryTimeout ?? QUERY_TIMEOUT)
    const Client = options.Client ?? Pg.Client
    const outer = yield* Effect.scope
    // after an unclean shutdown no UNLISTEN is sent: ending the connection ends its LISTENs
    const tidy = Lifecycle.tidyDatabase(yield* Effect.serviceOption(Lifecycle.Lifecycle))
    // one connection is opened or closed at a time; one command is sent on it at a time
    const opening = yield* Effect.makeSemaphore(1)
    const commands = yield* Effect.makeSemaphore(1)
    let current: Connection | undefined

    /** Fail every stream on `conn` and forget it (idempotent; called from `pg`'s events too). */
    const kill = (conn: Connection, error: SqlError): void => {
      if (conn.dead) return
      conn.dead = true
      if (current === conn) current = undefined
      const subscribers = [...conn.channels.values()].flatMap((set) => [...set])
      conn.channels.clear()
      for (const emit of subscribers) emit.fail(error)
    }

    const end = (conn: Connection) =>
      Effect.zipRight(
        Scope.close(conn.scope, Exit.void),
        Effect.promise(() => conn.client.end().catch(() => undefined)).pipe(
          Effect.interruptible,
          Effect.timeoutOption(END_TIMEOUT)
        )
      )

    /** Mark `conn` closed (failing whatever still listens on it) and end it. */
    const close = (conn: Connection) => Effect.zipRight(Effect.sync(() => kill(conn, lost(null, "closed"))), end(conn))

    /** One command on `conn`, bounded; a failure or timeout ends the connection for every stream. */
    const command = (conn: Connection, text: string) =>
      Effect.suspend(() =>
        conn.dead
          ? Effect.fail(gone())
          : Effect.tryPromise({ try: () => conn.client.query(text), catch: (e) => lost(e, "LISTEN command failed") })
      ).pipe(
        // commands run inside acquireRelease's uninterruptible steps too: the timeout must be able to
        // abandon the promise there, or a silent peer would hold them forever
        Effect.interruptible,
        Effect.timeoutFail({ duration: timeout, onTimeout: timedOut }),
        Effect.tapError((e) => Effect.sync(() => kill(conn, e))),
        commands.withPermits(1)
      )

    const probe = (conn: Connection) =>
      Effect.sleep(probeEvery).pipe(
        Effect.zipRight(command(conn, "SELECT 1")),
        Effect.forever,
        Effect.ignore
      )

    const open = Effect.gen(function*() {
      // made when the connection is opened: a Client that reads its settings then sees them as they are now
      const client = new Client({ ...config, connectionTimeoutMillis: Duration.toMillis(timeout) })
      const scope = yield* Scope.fork(outer, ExecutionStrategy.sequential)
      const conn: Connection = { client, channels: new Map(), scope, users: 0, dead: false }
      client.on("notification", (msg) => {
        if (msg.payload === undefined || msg.payload === "") return
        const set = conn.channels.get(msg.channel)
        if (set !== undefined) { for (const emit of set) emit.single(msg.payload) }
      })
      client.on("error", (e) => kill(conn, lost(e, "LISTEN connection lost")))
      client.on("end", () => kill(conn, lost(coded("connection ended", "connection_lost"), "LISTEN connection lost")))
      yield* Effect.tryPromise({ try: () => client.connect(), catch: (e) => lost(e, "LISTEN could not connect") })
        .pipe(
          Effect.interruptible,
          Effect.timeoutFail({ duration: timeout, onTimeout: timedOut }),
          Effect.tapError(() => close(conn))
        )
      // `open` runs in acquireRelease's uninterruptible acquire, which a forked fiber would inherit:
      // the probe must stay interruptible, or closing its scope would wait for it forever
      yield* Effect.forkIn(Effect.interruptible(probe(conn)), scope)
      return conn
    })

    const acquire = opening.withPermits(1)(Effect.suspend(() => {
      const reuse = current !== undefined && !current.dead ? current : undefined
      return (reuse === undefined ? Effect.tap(open, (c) => Effect.sync(() => (current = c))) : Effect.succeed(reuse))
        .pipe(Effect.tap((c) => Effect.sync(() => c.users++)))
    }))
    const release = (conn: Connection) =>
      opening.withPermits(1)(Effect.suspend(() => {
        conn.users--
        return conn.users > 0 ? Effect.void : close(conn)
      }))

    // a closing scope ends whatever is still open (its streams are gone by then)
    yield* Effect.addFinalizer(() => Effect.suspend(() => (current === undefined ? Effect.void : close(current))))

    const subscribe = (conn: Connection, channel: string, emit: Emit) =>
      Effect.suspend(() => {
        if (conn.dead) return Effect.fail(gone())
        const set = conn.channels.get(channel)
        if (set !== undefined) {
          set.add(emit)
          return Effect.void
        }
        conn.channels.set(channel, new Set([emit]))
        return command(conn, `LISTEN ${Pg.escapeIdentifier(channel)}`)
      })
    const unsubscribe = (conn: Connection, channel: string, emit: Emit) =>
      Effect.suspend(() => {
        const set = conn.channels.get(channel)
        if (set === undefined || !set.delete(emit) || set.size > 0) return Effect.void
        conn.channels.delete(channel)
        return Effect.flatMap(
          tidy,
          (yes) => yes ? command(conn, `UNLISTEN ${Pg.escapeIdentifier(channel)}`).pipe(Effect.ignore) : Effect.void
        )
      })

    return (channel: string) =>
      Stream.asyncPush<string, SqlError>(
        (emit) =>
          Effect.gen(function*() {
            const conn = yield* Effect.acquireRelease(acquire, release)
            // a failed subscribe leaves nothing behind: a dead connection adds nothing, and a failed
            // LISTEN ends the connection, clearing every channel (`kill`)
            yield* Effect.acquireRelease(subscribe(conn, channel, emit), () => unsubscribe(conn, channel, emit))
          }),
        { bufferSize: BUFFER, strategy: "dropping" }
      )
  })
