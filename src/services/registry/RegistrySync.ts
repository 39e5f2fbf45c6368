/**
 * The intake leader's registry follows the changes other processes make (SPEC §6.4, issue 16).
 *
 * With roles split over processes, the registry in memory lives only where intake runs, while
 * reconciliation (completing an owner, SPEC §5.3 step 5) and delivery (a 410 marking a webhook
 * gone, §4.3) may run elsewhere. Their changes reach the leader through {@link RegistryChanges}:
 * - a notification per changed owner (at the writer's commit): the owner is synced at once;
 * - every {@link CATCH_UP_INTERVAL} the changes since the last read's horizon are read again (at
 *   most {@link CATCH_UP_MAX} owners; more → the whole registry is reloaded), so a notification
 *   missed while the LISTEN connection was down costs seconds, never a wrong registry. An owner
 *   whose change the previous round already synced (same transaction) is not synced again.
 * - Each sync holds the owner's row lock and runs {@link Registry.syncOwner}: a scanning or failed
 *   owner keeps its pre-scan registrations (gone ones included: gone only affects delivery); any
 *   other is swapped for the store's, fenced like the reconciler's own swap.
 * The leader starts following from a horizon taken before it loaded the registry, so nothing
 * committed between the load and the first read is missed. A sync that fails (the database) is
 * retried by the next round (the horizon only moves after a round that synced everything).
 *
 * Logs carry counts and codes, never DIDs above debug.
 */
import { Duration, Effect, Metric, Stream } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import * as Backoff from "../platform/Backoff.js"
import { StoreError } from "../platform/Persistence.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import type { RegistryShape } from "./Registry.js"
import { RegistryChanges } from "./RegistryChanges.js"

/** How often the changes are read again (the bound on a missed notification's delay). */
export const CATCH_UP_INTERVAL = Duration.seconds(5)
/** Owners synced one by one per round at most; more changed owners → the whole registry is reloaded. */
export const CATCH_UP_MAX = 1_024

const syncs = Metric.counter("firehook_registry_sync_total", {
  description: "Owners the intake leader re-read after another process changed them, by trigger"
})
const syncFailures = Metric.counter("firehook_registry_sync_failures_total", {
  description: "Registry syncs (an owner, a catch-up round) that failed and are retried by the next round"
})

export type SyncTrigger = "notification" | "catch_up" | "reload"

export interface FollowOptions {
  /** the horizon taken before the registry was loaded */
  readonly from: string
  readonly registry: Pick<RegistryShape, "syncOwner">
  /** reload the whole registry (between units of intake's work: `Processor.reload`) */
  readonly reloadAll: Effect.Effect<void, StoreError>
  readonly interval?: Duration.DurationInput
  readonly maxPerRound?: number
  /** follow the notifications too (default true; false: the catch-up alone, in tests) */
  readonly listen?: boolean
  /** called after each owner synced (and each whole reload) */
  readonly onSynced?: (trigger: SyncTrigger, did: string | undefined) => Effect.Effect<void>
}

/** Follow the changes until interrupted (run by the intake leader beside intake). */
export const follow = (options: FollowOptions): Effect.Effect<never, never, RegistryChanges> =>
  Effect.gen(function*() {
    const changes = yield* RegistryChanges
    const interval = Duration.decode(options.interval ?? CATCH_UP_INTERVAL)
    const maxPerRound = Math.max(1, Math.floor(options.maxPerRound ?? CATCH_UP_MAX))
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
    const syncOwner = (did: string) => changes.withOwnerLock(did, options.registry.syncOwner(did))

    let horizon = options.from
    /** the changes the previous round synced (did → transaction) */
    let handled = new Map<string, string>()
    const round = Effect.gen(function*() {
      const page = yield* changes.since(horizon, maxPerRound)
      if (page.more) {
        yield* options.reloadAll
        horizon = page.horizon
        handled = new Map()
        yield* synced("reload", undefined)
        return
      }
      const next = new Map<string, string>()
      for (const c of page.changes) {
        if (handled.get(c.did) !== c.xid) {
          yield* syncOwner(c.did)
          yield* synced("catch_up", c.did)
        }
        next.set(c.did, c.xid)
      }
      horizon = page.horizon
      handled = next
    })
    const catchUp = Effect.forever(
      Effect.zipRight(Effect.sleep(interval), round.pipe(Effect.catchAll((e) => failed("catch_up", e))))
    )

    const onNotification = (did: string) =>
      isCanonicalDid(did)
        ? syncOwner(did).pipe(
          Effect.zipRight(synced("notification", did)),
          Effect.catchAll((e) => failed("notification", e))
        )
        : Effect.void
    // a LISTEN that fails (or ends) is opened again (backoff 1 s → 30 s); the catch-up covers the gap
    const notified = changes.notifications.pipe(
      Stream.runForEach(onNotification),
      Effect.zipRight(Effect.fail(new StoreError({ op: "registryChanges.listen", code: "ended" }))),
      Effect.tapError((e) => failed("listen", e)),
      Effect.retry(Backoff.fullJitterSchedule({ base: "1 second", cap: "30 seconds" })),
      Effect.catchAll(() => Effect.never)
    )

    return yield* options.listen === false
      ? catchUp
      : Effect.raceFirst(catchUp, notified)
  }).pipe(Effect.withSpan("RegistrySync.follow"))
