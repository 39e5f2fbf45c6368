/**
 * The intake leader's registry follows the changes other processes make (SPEC §6.4, issue 16).
 *
 * With roles split over processes, the registry in memory lives only where intake runs, while
 * reconciliation (completing an owner, SPEC §5.3 step 5) and delivery (a 410 marking a webhook
 * gone, §4.3) may run elsewhere. Their changes reach the leader through {@link RegistryChanges}:
 * - a notification per changed owner (at the writer's commit): the owner is synced at once;
 * - every {@link CATCH_UP_INTERVAL} the changes since the last round's horizon are read again (in
 *   pages of {@link CATCH_UP_MAX}, keyset on the transaction id), so a notification missed while the
 *   LISTEN connection was down costs seconds, never a wrong registry. A change the previous rounds
 *   already synced (same owner, same transaction: remembered while it is at or above the horizon)
 *   is not synced again; more than {@link CATCH_UP_MAX} new ones → the whole registry is reloaded,
 *   and the changes that reload covered are remembered like synced ones. So a horizon held back by
 *   a transaction left open anywhere in the cluster (another application, an operator's session, a
 *   prepared transaction) costs a re-read of the changes since, not a reload per round.
 * - More changes at or above the horizon than a round remembers ({@link CATCH_UP_SEEN_PAGES} pages),
 *   or more than a page of owners in one transaction: the round cannot tell new changes from old
 *   ones and reloads; the next such reload waits 1, 2, 4 … {@link OVERFLOW_WAIT_MAX} rounds while
 *   the horizon stays where it was (a round that finds it moved goes on at once).
 * - Each sync holds the owner's row lock and runs `Registry.syncOwner`: a scanning or failed
 *   owner keeps its pre-scan registrations (gone ones included: gone only affects delivery); any
 *   other is swapped for the store's, fenced like the reconciler's own swap. A change found on a
 *   scanning owner may be a completion followed at once by its next scan, which this process then
 *   never swapped in: the owner is synced again every round, `afterScan`, until that scan ends
 *   (complete: the reconciled set; failed: the store's rows, as a load takes them, SPEC §5.3 step 5).
 *   This needs a registry that reports what its sync did ({@link SyncOutcome}); one that reports
 *   nothing is taken as having swapped.
 * The leader starts following from a horizon taken before it loaded the registry, so nothing
 * committed between the load and the first read is missed. Why nothing is missed for good: the
 * horizon only moves after a round that read every change at or above it and synced (or reloaded)
 * each new one; a change read below the next horizon had committed before that round's first read;
 * an owner's row rewritten while the round pages on carries a transaction at or above the next
 * horizon, read again next round. A round that waits (above) moves nothing; the reload it defers
 * covers every change committed before it. A sync that fails (the database) fails its round, which
 * the next one runs again.
 *
 * Logs carry counts and codes, never DIDs above debug.
 */
import { Duration, Effect, Metric, Stream } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import * as Backoff from "../platform/Backoff.js"
import * as ListenLoop from "../platform/ListenLoop.js"
import { StoreError } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import { type Change, RegistryChanges, type RegistryChangesShape } from "./RegistryChanges.js"

/** How often the changes are read again (the bound on a missed notification's delay). */
export const CATCH_UP_INTERVAL = Duration.seconds(5)
/** Owners synced one by one per round at most (and the page of a read); more new changes → the whole registry is reloaded. */
export const CATCH_UP_MAX = 1_024
/**
 * The changes at or above the horizon a round reads and remembers at most, in pages of
 * `maxPerRound` (65,536 owners by default): what tells a change already synced from a new one while
 * the horizon is held back.
 */
export const CATCH_UP_SEEN_PAGES = 64
/** Rounds at most between two whole reloads while the changes at a held horizon exceed what a round remembers (5 min). */
export const OVERFLOW_WAIT_MAX = 60

const syncs = Metric.counter("firehook_registry_sync_total", {
  description: "Owners the intake leader re-read after another process changed them, by trigger"
})
const syncFailures = Metric.counter("firehook_registry_sync_failures_total", {
  description: "Registry syncs (an owner, a catch-up round) that failed and are retried by the next round"
})

export type SyncTrigger = "notification" | "catch_up" | "after_scan" | "reload"

/** What a catch-up round did: read (and synced what was new), reloaded, or waited (a held horizon). */
export type RoundOutcome = "read" | "reload" | "wait"

/**
 * What `Registry.syncOwner` did: swapped the owner for the store's rows, or kept its registrations
 * because it is scanning or failed.
 */
export type SyncOutcome = "swapped" | "scanning" | "failed"

export interface SyncOwnerOptions {
  /**
   * A change of the owner was found while it was scanning and its scan has ended since: its
   * registrations may predate its last completion, so a failed owner is swapped too.
   */
  readonly afterScan?: boolean
}

/** The registry a follower syncs (`Registry`; its `syncOwner` may report nothing: taken as `swapped`). */
export interface SyncedRegistry {
  readonly syncOwner: (
    ownerDid: string,
    options?: SyncOwnerOptions
  ) => Effect.Effect<SyncOutcome | void, StoreError>
}

export interface FollowOptions {
  /** the horizon taken before the registry was loaded */
  readonly from: string
  readonly registry: SyncedRegistry
  /** reload the whole registry (between units of intake's work: `Processor.reload`) */
  readonly reloadAll: Effect.Effect<void, StoreError>
  readonly interval?: Duration.DurationInput
  readonly maxPerRound?: number
  /** changes at or above the horizon a round remembers at most (default `CATCH_UP_SEEN_PAGES` × `maxPerRound`) */
  readonly maxSeen?: number
  /** follow the notifications too (default true; false: the catch-up alone, in tests) */
  readonly listen?: boolean
  /** called after each owner synced (and each whole reload) */
  readonly onSynced?: (trigger: SyncTrigger, did: string | undefined) => Effect.Effect<void>
  /** called after each catch-up round that did not fail */
  readonly onRound?: (outcome: RoundOutcome) => Effect.Effect<void>
}

/** The changes at or above a horizon, as one round read them. */
export interface ChangesRead {
  /** the horizon of the round's first read: the next round starts there */
  readonly horizon: string
  /** owner → the transaction of its change, as last read */
  readonly seen: ReadonlyMap<string, string>
  /** every change at or above the horizon was read (false: more than `maxSeen`, or more than a page in one transaction) */
  readonly complete: boolean
}

/**
 * Read every change at or above `from`, in pages of `pageSize` (keyset: the next page starts at the
 * last transaction read, whose owners it reads again), until they end, `maxSeen` are read, or a
 * page holds a single transaction (no further page can start past it).
 */
export const readChanges = (
  changes: Pick<RegistryChangesShape, "since">,
  from: string,
  pageSize: number,
  maxSeen: number
): Effect.Effect<ChangesRead, StoreError> =>
  Effect.gen(function*() {
    const first = yield* changes.since(from, pageSize)
    const seen = new Map<string, string>()
    const maxPages = 2 * Math.ceil(maxSeen / pageSize) + 1
    let page = first
    let cursor = from
    for (let i = 0; i < maxPages; i++) {
      for (const c of page.changes) seen.set(c.did, c.xid)
      if (!page.more) return { horizon: first.horizon, seen, complete: true }
      const last: Change | undefined = page.changes[page.changes.length - 1]
      if (last === undefined || last.xid === cursor || seen.size >= maxSeen) break
      cursor = last.xid
      page = yield* changes.since(cursor, pageSize)
    }
    return { horizon: first.horizon, seen, complete: false }
  })

/** The changes of a read that were not synced yet (by owner, oldest transaction first). */
const newChanges = (read: ChangesRead, handled: ReadonlyMap<string, string>): Array<string> => {
  const fresh: Array<string> = []
  for (const [did, xid] of read.seen) if (handled.get(did) !== xid) fresh.push(did)
  return fresh
}

/** While a read cannot be complete: the horizon of the last reload it caused and the rounds to wait after it. */
interface Overflow {
  readonly at: string
  readonly attempt: number
  readonly wait: number
  waited: number
}

/** The wait after a reload for an incomplete read at `horizon`: doubled while the horizon stays where it was. */
const nextOverflow = (previous: Overflow | undefined, horizon: string): Overflow => {
  const attempt = previous !== undefined && previous.at === horizon ? previous.attempt + 1 : 0
  return { at: horizon, attempt, wait: Backoff.ceilingMillis(1, OVERFLOW_WAIT_MAX, attempt), waited: 0 }
}

/** Follow the changes until interrupted (run by the intake leader beside intake). */
export const follow = (options: FollowOptions): Effect.Effect<never, never, RegistryChanges> =>
  Effect.gen(function*() {
    const changes = yield* RegistryChanges
    const interval = Duration.decode(options.interval ?? CATCH_UP_INTERVAL)
    const maxPerRound = Math.max(1, Math.floor(options.maxPerRound ?? CATCH_UP_MAX))
    const maxSeen = Math.max(1, Math.floor(options.maxSeen ?? CATCH_UP_SEEN_PAGES * maxPerRound))
    const log = RateLimitedLog.make()
    const synced = (trigger: SyncTrigger, did: string | undefined) =>
      Effect.zipRight(
        Metric.increment(Metric.tagged(syncs, "trigger", trigger)),
        options.onSynced?.(trigger, did) ?? Effect.void
      )
    const failed = (what: string, e: StoreError) =>
      Effect.zipRight(
        Metric.increment(syncFailures),
        log.run(what, (suppressed) =>
          Effect.logWarning("registry sync failed; the next round retries").pipe(
            Effect.annotateLogs({ what, op: e.op, code: e.code, suppressed })
          ))
      )
    const syncOwner = (did: string, syncOptions?: SyncOwnerOptions) =>
      changes.withOwnerLock(did, options.registry.syncOwner(did, syncOptions))

    let horizon = options.from
    /** the changes at or above the horizon that memory reflects (did → transaction) */
    let handled: ReadonlyMap<string, string> = new Map()
    /** owners whose change was found while they were scanning: synced `afterScan` once the scan ends */
    const pending = new Set<string>()
    let overflow: Overflow | undefined

    const reload = (read: ChangesRead) =>
      Effect.gen(function*() {
        yield* options.reloadAll
        // every change read is in the store the reload read, every owner as the store has it
        horizon = read.horizon
        handled = read.seen
        pending.clear()
        yield* synced("reload", undefined)
      })

    /** sync an owner waiting for its scan's end: it stops waiting once that scan has ended */
    const afterScan = (did: string) =>
      Effect.flatMap(syncOwner(did, { afterScan: true }), (outcome) => {
        if (outcome === "scanning") return Effect.void
        pending.delete(did)
        return synced("after_scan", did)
      })
    const afterScans = Effect.suspend(() => Effect.forEach([...pending], afterScan, { discard: true }))

    const round: Effect.Effect<RoundOutcome, StoreError> = Effect.gen(function*() {
      yield* afterScans
      if (overflow !== undefined && overflow.waited < overflow.wait) {
        if ((yield* changes.horizon) === overflow.at) {
          overflow.waited++
          return "wait"
        }
      }
      const read = yield* readChanges(changes, horizon, maxPerRound, maxSeen)
      if (!read.complete) {
        overflow = nextOverflow(overflow, read.horizon)
        const wait = overflow.wait
        yield* log.run("overflow", (suppressed) =>
          Effect.logWarning(
            "registry changes since the catch-up horizon exceed what a round tells apart (a transaction held open in the cluster?); whole reload"
          ).pipe(Effect.annotateLogs({ remembered: maxSeen, waitRounds: wait, suppressed })))
        yield* reload(read)
        return "reload"
      }
      overflow = undefined
      const fresh = newChanges(read, handled)
      if (fresh.length > maxPerRound) {
        yield* reload(read)
        return "reload"
      }
      let pendingFull = false
      for (const did of fresh) {
        const outcome = yield* syncOwner(did)
        if (outcome === "scanning") {
          if (pending.size < maxPerRound) pending.add(did)
          else pendingFull = true
        }
        yield* synced("catch_up", did)
      }
      if (pendingFull) {
        // more scanning owners to watch than a round syncs: the store's rows for every owner instead
        yield* reload(read)
        return "reload"
      }
      horizon = read.horizon
      handled = read.seen
      return "read"
    })
    const catchUp = Effect.forever(
      Effect.zipRight(
        Effect.sleep(interval),
        round.pipe(
          Effect.flatMap((outcome) => options.onRound?.(outcome) ?? Effect.void),
          Effect.catchAll((e) => failed("catch_up", e))
        )
      )
    )

    const onNotification = (did: string) =>
      isCanonicalDid(did)
        ? syncOwner(did).pipe(
          Effect.zipRight(synced("notification", did)),
          Effect.catchAll((e) => failed("notification", e))
        )
        : Effect.void
    // a LISTEN that fails (or ends) is opened again (backoff 1 s → 30 s, started over after a
    // session that stayed up 30 s: ListenLoop.reopen); the catch-up covers the gap
    const notified = changes.notifications.pipe(
      Stream.runForEach(onNotification),
      Effect.zipRight(Effect.fail(new StoreError({ op: "registryChanges.listen", code: "ended" }))),
      Effect.tapError((e) => failed("listen", e)),
      ListenLoop.reopen
    )

    return yield* options.listen === false
      ? catchUp
      : Effect.raceFirst(catchUp, notified)
  }).pipe(Effect.withSpan("RegistrySync.follow"))
