/**
 * `#identity` and `#account` events invalidate the identity caches of every process that resolves
 * DIDs (SPEC §2.1, §5.1, §6.4), not only the intake leader's own: with roles split over processes,
 * the reconciler that reads an owner's PDS usually runs elsewhere.
 *
 * - {@link publisher} (intake): the DIDs of committed identity/account events go into a sliding
 *   queue ({@link QUEUE_MAX}; the oldest are dropped under a flood, counted), drained by one fiber
 *   that sends them, de-duplicated, ≤ {@link BATCH_MAX} per `pg_notify('firehook_identity', …)`
 *   (space-separated, under NOTIFY's 8,000-byte payload limit). Intake never waits for it.
 * - {@link follow} (every process with an identity cache): invalidates each DID notified; a LISTEN
 *   that fails is opened again with backoff.
 * Best effort by design: a notification missed (a LISTEN down, a dropped DID) leaves an entry to the
 * cache's own bounds (stale after 1 h, expired after 24 h), and a reconciliation that finds the repo
 * gone from the cached PDS invalidates it itself (`pds_moved`, retried).
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { Chunk, Effect, Metric, Queue } from "effect"
import type { Scope } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import * as ListenLoop from "../platform/ListenLoop.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import type { IdentityShape } from "./Identity.js"

export const CHANNEL = "firehook_identity"
/** DIDs waiting to be sent at most (a sliding queue: the oldest go first). */
export const QUEUE_MAX = 4_096
/** DIDs per notification at most. */
export const BATCH_MAX = 256
/** A notification's payload at most (PostgreSQL's limit is 8,000 bytes). */
const PAYLOAD_MAX_BYTES = 7_000

const sent = Metric.counter("firehook_identity_invalidations_sent_total", {
  description: "DIDs of identity/account events sent to the other processes' identity caches"
})
const received = Metric.counter("firehook_identity_invalidations_received_total", {
  description: "DIDs invalidated in this process's identity cache on another process's notification"
})
const failures = Metric.counter("firehook_identity_invalidations_failures_total", {
  description: "Identity invalidation notifications that could not be sent or received (best effort)"
})

/** Space-separated payloads of at most `maxBytes` each (DIDs are ASCII). */
export const payloads = (dids: Iterable<string>, maxBytes = PAYLOAD_MAX_BYTES): ReadonlyArray<string> => {
  const out: Array<string> = []
  let current = ""
  for (const did of dids) {
    if (current.length > 0 && current.length + 1 + did.length > maxBytes) {
      out.push(current)
      current = ""
    }
    current = current.length === 0 ? did : `${current} ${did}`
  }
  if (current.length > 0) out.push(current)
  return out
}

/** The DIDs of a payload (canonical ones only, at most {@link BATCH_MAX}). */
export const parsePayload = (payload: string): ReadonlyArray<string> =>
  payload.split(" ").filter(isCanonicalDid).slice(0, BATCH_MAX)

/**
 * The sending side, for the lifetime of the scope: `offer(did)` never waits (intake calls it after
 * each committed batch for its identity and account events).
 */
export const publisher: Effect.Effect<(did: string) => Effect.Effect<void>, never, SqlClient.SqlClient | Scope.Scope> =
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const queue = yield* Queue.sliding<string>(QUEUE_MAX)
    const log = RateLimitedLog.make()
    const send = (payload: string) =>
      ListenLoop.notifyBestEffort(sql`SELECT pg_notify(${CHANNEL}, ${payload})`, {
        failures,
        log,
        key: "send",
        message: "identity invalidations not sent"
      })
    const drain = Effect.forever(
      Effect.gen(function*() {
        const dids = new Set(Chunk.toReadonlyArray(yield* Queue.takeBetween(queue, 1, BATCH_MAX)))
        for (const payload of payloads(dids)) yield* send(payload)
        yield* Metric.incrementBy(sent, dids.size)
      })
    )
    yield* Effect.forkScoped(drain)
    return (did: string) => Queue.offer(queue, did).pipe(Effect.asVoid)
  })

/** Invalidate every DID notified, until interrupted (LISTEN reopened with backoff 1 s → 30 s). */
export const follow = (identity: Pick<IdentityShape, "invalidate">): Effect.Effect<never, never, PgClient.PgClient> =>
  Effect.gen(function*() {
    const pg = yield* PgClient.PgClient
    const log = RateLimitedLog.make()
    const onPayload = (payload: string) =>
      Effect.gen(function*() {
        const dids = parsePayload(payload)
        for (const did of dids) yield* identity.invalidate(did)
        yield* Metric.incrementBy(received, dids.length)
      })
    return yield* ListenLoop.follow(pg.listen(CHANNEL), onPayload, {
      failures,
      log,
      message: "identity invalidations: LISTEN failed; reopening"
    })
  })
