/**
 * The replay store of service tokens shared by every API replica (SPEC §8.2: a `jti` is accepted
 * once per `iss` while the token lives): table `api_jti (iss, jti, expires_at)`, primary key
 * `(iss, jti)`. A token is claimed by inserting its row: no row written → it was seen before
 * (replayed). A row whose token has expired is taken over (a new token may reuse an old `jti`).
 *
 * Expiry is decided by the database's `now()`, the one clock every replica shares (SPEC §6.4): a
 * token whose expiry (`exp` + leeway) the database's clock has passed is never claimed (`expired`),
 * whatever the replica's own clock says. Before, a replica whose clock was behind accepted such a
 * token, and so did every other such replica (the row it wrote had already lapsed, so each took it
 * over): one token, several accepted calls.
 *
 * The process's in-memory `ReplayCache` stays in front of it (a replay to the same replica is
 * refused without a round trip). When the database cannot answer, the claim fails and the call
 * answers 503: an unchecked `jti` is never accepted.
 *
 * Expired rows are pruned by a background fiber of the layer, every {@link PRUNE_EVERY}, at most
 * {@link PRUNE_MAX_ROWS} per statement and {@link PRUNE_MAX_STATEMENTS} statements (the next one
 * only when the last deleted a full batch), so the pruning keeps up with far more tokens than an
 * API process can verify (every replica prunes; the statements are idempotent).
 *
 * The table is bounded ({@link JtiBounds}): the same fiber counts its live rows (at once, then after
 * each prune; one statement that reads at most `liveRows + 1` index entries, never a count per
 * call), and the process adds the rows it claims itself until the next count. A new token is
 * refused (`full`, the API answers 503) while the rows counted reach `liveRows` (1,000,000), and a
 * long-lived one (its row lives more than {@link LONG_LIVED_AFTER} from its claim) while the rows of
 * long-lived tokens reach `longLivedRows` (500,000): whoever fills the table with 1-hour tokens
 * locks out only other long-lived tokens, while the 60 s tokens PDSes mint (the CLI's, a proxied
 * call's) are accepted until the whole table is at its bound, which takes about 9,000 short tokens
 * a second, sustained, across the replicas. A replay is never accepted and no row is forgotten early.
 */
import * as SqlClient from "@effect/sql/SqlClient"
import { Clock, Context, Duration, Effect, Layer } from "effect"
import { codeOf, type StoreError, storeOpWithin } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"

/** A claim is one statement within the call's 10 s deadline. */
export const CLAIM_TIMEOUT = Duration.seconds(3)
export const PRUNE_EVERY = Duration.minutes(1)
export const PRUNE_MAX_ROWS = 10_000
/** Statements per prune at most: 600,000 rows a minute, per replica. */
export const PRUNE_MAX_STATEMENTS = 60
const PRUNE_TIMEOUT = Duration.seconds(30)
const COUNT_TIMEOUT = Duration.seconds(30)

/** The rows the table may hold (see the module documentation). */
export interface JtiBounds {
  /** live rows, past which no new token is accepted — default 1,000,000 */
  readonly liveRows: number
  /** live rows of long-lived tokens, past which no new long-lived token is accepted — default 500,000 */
  readonly longLivedRows: number
}

export const DEFAULT_BOUNDS: JtiBounds = { liveRows: 1_000_000, longLivedRows: 500_000 }

/**
 * A token whose row lives longer than this from its claim is long-lived. A PDS's tokens live 60 s
 * (their rows: `exp` + 31 s); SPEC §8.2 allows up to 1 h.
 */
export const LONG_LIVED_AFTER = Duration.minutes(2)

/** The live rows as last counted, plus this process's claims since. */
export interface LiveRows {
  readonly live: number
  readonly longLived: number
}

/**
 * `fresh`: recorded now; `replayed`: seen before; `expired`: not recorded, past `expiresAtMs` by the
 * database's clock; `full`: not recorded, the table is at its bound.
 */
export type ClaimVerdict = "fresh" | "replayed" | "expired" | "full"

export interface JtiStoreShape {
  /**
   * Record `(iss, jti)` until `expiresAtMs` (epoch ms), unless it was seen (a replay), has expired by
   * the database's clock, or the table is at its bound.
   */
  readonly claim: (iss: string, jti: string, expiresAtMs: number) => Effect.Effect<ClaimVerdict, StoreError>
  /** Delete expired rows (at most {@link PRUNE_MAX_STATEMENTS} × {@link PRUNE_MAX_ROWS}); answers how many. */
  readonly prune: Effect.Effect<number, StoreError>
  /** Count the live rows (at most the bound + 1) and claim against that count from now on. */
  readonly recount: Effect.Effect<LiveRows, StoreError>
}

export class JtiStore extends Context.Tag("firehook/JtiStore")<JtiStore, JtiStoreShape>() {}

/** The store on PostgreSQL, bounded by `bounds` (default {@link DEFAULT_BOUNDS}). */
export const makeSqlWith = (bounds: Partial<JtiBounds> = {}) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const { liveRows, longLivedRows } = { ...DEFAULT_BOUNDS, ...bounds }
    const longAfterMs = Duration.toMillis(LONG_LIVED_AFTER)
    let counted: LiveRows = { live: 0, longLived: 0 }
    const insert = (iss: string, jti: string, expiresAtMs: number) => {
      const expiresAt = new Date(expiresAtMs)
      return sql<{ readonly fresh: number; readonly expired: boolean }>`
        WITH ins AS (
          INSERT INTO api_jti (iss, jti, expires_at)
          SELECT ${iss}, ${jti}, ${expiresAt}::timestamptz WHERE ${expiresAt}::timestamptz >= now()
          ON CONFLICT (iss, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at
            WHERE api_jti.expires_at < now()
          RETURNING 1
        )
        SELECT (SELECT count(*) FROM ins)::int AS fresh, ${expiresAt}::timestamptz < now() AS expired`.pipe(
        Effect.map((rows): "fresh" | "replayed" | "expired" =>
          rows[0]?.expired === true ? "expired" : Number(rows[0]?.fresh ?? 0) > 0 ? "fresh" : "replayed"
        ),
        storeOpWithin("api.jti.claim", CLAIM_TIMEOUT)
      )
    }
    const pruneBatch = sql<{ readonly n: number }>`
      WITH gone AS (
        DELETE FROM api_jti WHERE ctid IN (
          SELECT ctid FROM api_jti WHERE expires_at < now() LIMIT ${PRUNE_MAX_ROWS}
        ) RETURNING 1
      ) SELECT count(*)::int AS n FROM gone`.pipe(
      Effect.map((rows) => rows[0]?.n ?? 0),
      storeOpWithin("api.jti.prune", PRUNE_TIMEOUT)
    )
    /** Batches while each deletes a full one, at most `statements`; `done` rows deleted so far. */
    const pruneFrom = (statements: number, done: number): Effect.Effect<number, StoreError> =>
      Effect.flatMap(pruneBatch, (n) =>
        n >= PRUNE_MAX_ROWS && statements > 1 ? pruneFrom(statements - 1, done + n) : Effect.succeed(done + n))
    const shape: JtiStoreShape = {
      claim: (iss, jti, expiresAtMs) =>
        Effect.flatMap(Clock.currentTimeMillis, (now) => {
          const long = expiresAtMs - now > longAfterMs
          if (counted.live >= liveRows || (long && counted.longLived >= longLivedRows)) {
            return Effect.succeed<ClaimVerdict>("full")
          }
          return Effect.map(insert(iss, jti, expiresAtMs), (verdict): ClaimVerdict => {
            if (verdict !== "fresh") {
              return verdict
            }
            counted = { live: counted.live + 1, longLived: counted.longLived + (long ? 1 : 0) }
            return "fresh"
          })
        }),
      prune: pruneFrom(PRUNE_MAX_STATEMENTS, 0),
      // newest expiry first (the index api_jti_expires_at), so the long-lived rows are all among the
      // rows read whenever the total is under its bound
      recount: sql<{ readonly live: number; readonly long_lived: number }>`
        SELECT count(*)::int AS live,
          (count(*) FILTER (WHERE expires_at > now() + make_interval(secs => ${longAfterMs / 1000})))::int AS long_lived
        FROM (
          SELECT expires_at FROM api_jti WHERE expires_at >= now() ORDER BY expires_at DESC LIMIT ${liveRows + 1}
        ) AS live_rows`.pipe(
        Effect.map((rows): LiveRows => ({ live: rows[0]?.live ?? 0, longLived: rows[0]?.long_lived ?? 0 })),
        Effect.tap((rows) =>
          Effect.sync(() => void (counted = rows))
        ),
        storeOpWithin("api.jti.count", COUNT_TIMEOUT)
      )
    }
    return shape
  })

/** {@link makeSqlWith} with the default bounds. */
export const makeSql = makeSqlWith()

/** The store on PostgreSQL, with its pruning and counting fiber (owned by the layer's scope). */
export const layerSqlWith = (bounds: Partial<JtiBounds> = {}): Layer.Layer<JtiStore, never, SqlClient.SqlClient> =>
  Layer.scoped(
    JtiStore,
    Effect.gen(function*() {
      const store = yield* makeSqlWith(bounds)
      const log = RateLimitedLog.make()
      const logged = (what: "prune" | "count", message: string) => (e: StoreError) =>
        log.run(
          what,
          (suppressed) => Effect.logWarning(message).pipe(Effect.annotateLogs({ code: codeOf(e), suppressed }))
        )
      const pruneOnce = store.prune.pipe(Effect.catchAll(logged("prune", "api: expired token ids could not be pruned")))
      const countOnce = store.recount.pipe(
        Effect.asVoid,
        Effect.catchAll(logged("count", "api: live token ids could not be counted"))
      )
      yield* Effect.forkScoped(
        countOnce.pipe(Effect.zipRight(Effect.forever(
          Effect.sleep(PRUNE_EVERY).pipe(
            Effect.zipRight(pruneOnce),
            Effect.zipRight(countOnce)
          )
        )))
      )
      return store
    })
  )

/** {@link layerSqlWith} with the default bounds. */
export const layerSql: Layer.Layer<JtiStore, never, SqlClient.SqlClient> = layerSqlWith()
