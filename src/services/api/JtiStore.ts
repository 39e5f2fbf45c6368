/**
 * The replay store of service tokens shared by every API replica (SPEC §8.2: a `jti` is accepted
 * once per `iss` while the token lives): table `api_jti (iss, jti, expires_at)`, primary key
 * `(iss, jti)`. A token is claimed by inserting its row: no row written → it was seen before
 * (replayed). A row whose token has expired is taken over (a new token may reuse an old `jti`).
 *
 * The process's in-memory `ReplayCache` stays in front of it (a replay to the same replica is
 * refused without a round trip). When the database cannot answer, the claim fails and the call
 * answers 503: an unchecked `jti` is never accepted.
 *
 * Expired rows are pruned by a background fiber of the layer, every {@link PRUNE_EVERY}, at most
 * {@link PRUNE_MAX_ROWS} per statement (every replica prunes; the statements are idempotent).
 */
import { SqlClient } from "@effect/sql"
import { Context, Duration, Effect, Layer } from "effect"
import { codeOf, type StoreError, storeOpWithin } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"

/** A claim is one statement within the call's 10 s deadline. */
export const CLAIM_TIMEOUT = Duration.seconds(3)
export const PRUNE_EVERY = Duration.minutes(1)
export const PRUNE_MAX_ROWS = 10_000
const PRUNE_TIMEOUT = Duration.seconds(30)

export interface JtiStoreShape {
  /** Record `(iss, jti)` until `expiresAtMs`: true when it is new, false when it was seen (replay). */
  readonly claim: (iss: string, jti: string, expiresAtMs: number) => Effect.Effect<boolean, StoreError>
  /** Delete expired rows (at most {@link PRUNE_MAX_ROWS}); answers how many. */
  readonly prune: Effect.Effect<number, StoreError>
}

export class JtiStore extends Context.Tag("firehook/JtiStore")<JtiStore, JtiStoreShape>() {}

export const makeSql = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const shape: JtiStoreShape = {
    claim: (iss, jti, expiresAtMs) =>
      sql<{ readonly ok: number }>`
        INSERT INTO api_jti (iss, jti, expires_at) VALUES (${iss}, ${jti}, ${new Date(expiresAtMs)})
        ON CONFLICT (iss, jti) DO UPDATE SET expires_at = EXCLUDED.expires_at
          WHERE api_jti.expires_at < now()
        RETURNING 1 AS ok`.pipe(
        Effect.map((rows) => rows.length > 0),
        storeOpWithin("api.jti.claim", CLAIM_TIMEOUT)
      ),
    prune: sql<{ readonly n: number }>`
      WITH gone AS (
        DELETE FROM api_jti WHERE ctid IN (
          SELECT ctid FROM api_jti WHERE expires_at < now() LIMIT ${PRUNE_MAX_ROWS}
        ) RETURNING 1
      ) SELECT count(*)::int AS n FROM gone`.pipe(
      Effect.map((rows) => rows[0]?.n ?? 0),
      storeOpWithin("api.jti.prune", PRUNE_TIMEOUT)
    )
  }
  return shape
})

/** The store on PostgreSQL, with its pruning fiber (owned by the layer's scope). */
export const layerSql: Layer.Layer<JtiStore, never, SqlClient.SqlClient> = Layer.scoped(
  JtiStore,
  Effect.gen(function*() {
    const store = yield* makeSql
    const log = RateLimitedLog.make()
    const pruneOnce = store.prune.pipe(
      Effect.catchAll((e) =>
        log.run("prune", (suppressed) =>
          Effect.logWarning("api: expired token ids could not be pruned").pipe(
            Effect.annotateLogs({ code: codeOf(e), suppressed })
          ))
      )
    )
    yield* Effect.forkScoped(Effect.forever(Effect.zipRight(Effect.sleep(PRUNE_EVERY), pruneOnce)))
    return store
  })
)
