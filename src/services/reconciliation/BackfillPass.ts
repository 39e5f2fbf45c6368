/**
 * One backfill pass (SPEC §5.2), and how the passes of several replicas share one sweep without
 * ever scanning the same page of owners at once (SPEC §6.4).
 *
 * - A pass claims a page before it scans it: it reads the sweep's frontier (the last DID of the last
 *   page claimed), the next keyset page of known owners after it, and claims those owners with a
 *   compare-and-swap on the frontier. A pass that loses the race reads again; the frontier only
 *   moves forward.
 * - The holder bumps its page's beat every `heartbeat` while it scans; at the end it finishes the
 *   page (the claim is dropped, the owners counted). A holder whose beat finds the page taken over,
 *   or that could not beat for `abandonedAfter` − `heartbeat`, stops scanning it at once. Interrupted first (shutdown), it gives the page
 *   back, bounded by {@link RELEASE_TIMEOUT}; a page not given back is abandoned (below).
 * - Before a new page, a pass takes over a claimed page that needs a scanner: one given back, one
 *   an earlier pass of this replica left (it failed or was interrupted), or one abandoned — its beat
 *   has not moved for `abandonedAfter` as this replica saw it (by its own clock: no clock is
 *   compared across replicas). So the page of a replica that died is rescanned within
 *   `abandonedAfter` + one `pollInterval` of its last beat by a replica waiting for the sweep's
 *   end, or after its current page by one still scanning: a crash replays at most one page.
 * - With no owner left after the frontier, the pass completes the sweep when no page is claimed;
 *   otherwise it waits (`pollInterval`) for the claimed pages to be finished or to need a scanner,
 *   so a sweep completes only once every page of it was scanned.
 * - Every write is fenced by the sweep's number: a pass that finds its sweep completed or restarted
 *   elsewhere ends as completed, and a late write of it changes nothing.
 */
import { Clock, Duration, Effect, Either, Metric, Random } from "effect"
import { StoreError } from "../platform/Persistence.js"
import * as Metrics from "./ReconcileMetrics.js"
import { INITIAL_PASS, type PageClaim, type ReconcileStoreShape, type SweepRef } from "./ReconcileStore.js"

export interface PassResult {
  /** owners handled by this pass */
  readonly owners: number
  readonly failed: number
  /** true when the sweep is complete (false: capped, to be continued by the next pass) */
  readonly completed: boolean
}

export interface ClaimTimings {
  /** the holder bumps its page's beat this often */
  readonly heartbeat: Duration.Duration
  /** a page whose beat has not moved for this long is taken over */
  readonly abandonedAfter: Duration.Duration
  /** a pass waiting for claimed pages looks again this often */
  readonly pollInterval: Duration.Duration
}

export const DEFAULT_CLAIM_TIMINGS: ClaimTimings = {
  heartbeat: Duration.seconds(5),
  abandonedAfter: Duration.seconds(30),
  pollInterval: Duration.seconds(5)
}

/** How long an interrupted pass tries to give its page back. */
export const RELEASE_TIMEOUT = Duration.seconds(2)

/** Waits and lost races one pass allows besides its pages; then it ends as capped (the sweep goes on). */
const MAX_WAITS = 1_000

/** How this replica last saw a claimed page, and since when (its clock). */
export interface Sighting {
  readonly holder: string | undefined
  readonly beat: number
  readonly since: number
}

/** Why a claimed page is taken over. */
export type TakeReason = "given_back" | "own" | "abandoned"

/**
 * The claimed page to take over, if any (given back, left by one of this replica's ended passes,
 * or abandoned: the same holder and beat seen for `abandonedAfterMs`), and the sightings to keep
 * (by page; those of pages no longer claimed dropped). Pure: `now` is passed in.
 */
export const pickClaim = (
  claims: ReadonlyArray<PageClaim>,
  seen: ReadonlyMap<string, Sighting>,
  now: number,
  abandonedAfterMs: number,
  ownEnded: (holder: string) => boolean
): {
  readonly take: { readonly claim: PageClaim; readonly reason: TakeReason } | undefined
  readonly seen: ReadonlyMap<string, Sighting>
} => {
  const next = new Map<string, Sighting>()
  let take: { readonly claim: PageClaim; readonly reason: TakeReason } | undefined
  for (const claim of claims) {
    const before = seen.get(claim.last)
    const since = before !== undefined && before.holder === claim.holder && before.beat === claim.beat
      ? before.since
      : now
    next.set(claim.last, { holder: claim.holder, beat: claim.beat, since })
    if (take !== undefined) continue
    const reason: TakeReason | undefined = claim.holder === undefined
      ? "given_back"
      : ownEnded(claim.holder)
      ? "own"
      : now - since >= abandonedAfterMs
      ? "abandoned"
      : undefined
    if (reason !== undefined) take = { claim, reason }
  }
  return { take, seen: next }
}

/** What a replica keeps between its passes. */
export interface Replica {
  /** random, for the holder ids of its passes */
  readonly id: string
  passes: number
  /** holders of its passes that ended (≤ 16): a page one of them still holds needs a scanner now */
  readonly ended: Array<string>
  sightings: { readonly sweep: number; readonly pages: ReadonlyMap<string, Sighting> }
}

export const makeReplica: Effect.Effect<Replica> = Effect.map(
  Effect.all([Random.nextIntBetween(0, 2 ** 31), Random.nextIntBetween(0, 2 ** 31)]),
  ([a, b]) => ({
    id: `${a.toString(36)}${b.toString(36)}`,
    passes: 0,
    ended: [],
    sightings: { sweep: -1, pages: new Map() }
  })
)

export interface PassDeps {
  readonly store: ReconcileStoreShape
  /** reconcile one owner; true when it failed */
  readonly reconcileOwner: (did: string) => Effect.Effect<boolean, StoreError>
  /** owners of a page reconciled at once */
  readonly concurrency: number
  readonly pageSize: number
  readonly maxOwnersPerPass: number
  readonly timings: ClaimTimings
  /** before this pass starts a new sweep (records the operator's owners and the relay's) */
  readonly beforeSweep: Effect.Effect<void, StoreError>
}

/** The current sweep, or a new one when the last completed (another pass may start it first). */
const joinSweep = (deps: PassDeps) =>
  Effect.gen(function*() {
    const stored = yield* deps.store.passState(INITIAL_PASS)
    if (stored !== undefined && stored.startedAt !== undefined && stored.completedAt === undefined) {
      return stored.sweep
    }
    yield* deps.beforeSweep
    const { state } = yield* deps.store.startPass(INITIAL_PASS, stored?.sweep ?? 0)
    return state.sweep
  })

/**
 * The holder's heartbeat on its page while it scans. It ends when the page is no longer its own
 * (`lost`: a beat found it taken over, or its sweep ended) or when no beat was taken for
 * `abandonedAfter` − `heartbeat` (`silent`: the database did not answer, so another replica may
 * see the page abandoned and take it over at `abandonedAfter`); a beat is waited for only until
 * then. Either way the scan of the page stops (SPEC §6.4: never two replicas on one page at once).
 * A beat's time is taken when it is sent (the database stamps the page at or after that), and the
 * wait before the next beat never passes the silence deadline: a beat that failed just before it
 * is not followed a whole heartbeat later, when another replica may already have taken the page.
 */
const heartbeat = (deps: PassDeps, ref: SweepRef, last: string, holder: string) =>
  Effect.flatMap(Clock.currentTimeMillis, (start) => {
    const heartbeatMs = Duration.toMillis(deps.timings.heartbeat)
    const silentAfterMs = Math.max(0, Duration.toMillis(deps.timings.abandonedAfter) - heartbeatMs)
    let taken = start
    const beat = Effect.flatMap(
      Clock.currentTimeMillis,
      (before): Effect.Effect<"mine" | "lost" | "silent"> =>
        silentAfterMs > 0 && before - taken >= silentAfterMs
          ? Effect.succeed("silent")
          : deps.store.beatClaim(ref, last, holder).pipe(
            Effect.timeout(Duration.millis(Math.max(1, taken + silentAfterMs - before))),
            Effect.either,
            Effect.flatMap((answer) =>
              Effect.map(Clock.currentTimeMillis, (now): "mine" | "lost" | "silent" => {
                if (Either.isRight(answer)) {
                  if (!answer.right) return "lost"
                  taken = before
                  return "mine"
                }
                // a beat the database did not take (failed, or not answered in time): the next one may
                return now - taken >= silentAfterMs ? "silent" : "mine"
              })
            )
          )
    )
    // the next beat a heartbeat later, or at the silence deadline if that comes first (timings
    // without a margin, abandonedAfter ≤ heartbeat, beat every heartbeat as before)
    const wait = Effect.flatMap(
      Clock.currentTimeMillis,
      (now) =>
        Effect.sleep(Duration.millis(
          silentAfterMs > 0 ? Math.min(heartbeatMs, Math.max(0, taken + silentAfterMs - now)) : heartbeatMs
        ))
    )
    return Effect.zipRight(wait, beat).pipe(
      Effect.repeat({ while: (state) => state === "mine" }),
      Effect.map((state) => (state === "lost" ? "lost" as const : "silent" as const))
    )
  })

/** An interrupted holder gives its page back (bounded; if not, the page is abandoned). */
const giveBack = (deps: PassDeps, ref: SweepRef, last: string, holder: string) =>
  Effect.interruptible(deps.store.releaseClaim(ref, last, holder)).pipe(
    Effect.timeoutFail({
      duration: RELEASE_TIMEOUT,
      onTimeout: () => new StoreError({ op: "reconcile.releaseClaim", code: "timeout" })
    }),
    Effect.catchAll((e) =>
      Effect.logWarning("backfill page not given back; another replica takes it over when its beat stops").pipe(
        Effect.annotateLogs({ code: e.code })
      )
    ),
    Effect.asVoid
  )

/**
 * Scan a claimed page and finish it, while the page is this holder's: once its heartbeat ends (the
 * page taken over, or no beat taken for too long) the owners not scanned yet are left to the
 * replica that takes the page over, and an owner's scan in progress is interrupted. The owners
 * scanned, and of those the number that failed.
 */
const scanPage = (
  deps: PassDeps,
  ref: SweepRef,
  page: { readonly last: string; readonly dids: ReadonlyArray<string> },
  holder: string
) =>
  Effect.gen(function*() {
    const done = { owners: 0, failed: 0 }
    const scanned = Effect.forEach(page.dids, (did) =>
      Effect.map(deps.reconcileOwner(did), (failed) => {
        done.owners++
        if (failed) done.failed++
      }), { concurrency: deps.concurrency, discard: true })
    const ended = yield* Effect.raceFirst(
      Effect.as(scanned, "scanned" as const),
      heartbeat(deps, ref, page.last, holder)
    )
    if (ended === "scanned") {
      if (!(yield* deps.store.finishPage(ref, page.last, holder))) {
        yield* Effect.logInfo("backfill page taken over by another replica or its sweep ended; not counted here")
      }
    } else {
      // not given back: the page is taken over once its beat has not moved for `abandonedAfter`
      // (by this pass too), as after a crash
      yield* Effect.logWarning("backfill page scan stopped: the page is no longer this replica's").pipe(
        Effect.annotateLogs({ reason: ended, scanned: done.owners, owners: page.dids.length })
      )
    }
    return done
  }).pipe(Effect.onInterrupt(() => giveBack(deps, ref, page.last, holder)))

/** A claimed page this pass should take over now (and the sightings updated). */
const claimToTake = (deps: PassDeps, replica: Replica, sweep: number, claims: ReadonlyArray<PageClaim>) =>
  Effect.map(Clock.currentTimeMillis, (now) => {
    const seen = replica.sightings.sweep === sweep ? replica.sightings.pages : new Map<string, Sighting>()
    const picked = pickClaim(
      claims,
      seen,
      now,
      Duration.toMillis(deps.timings.abandonedAfter),
      (h) => replica.ended.includes(h)
    )
    replica.sightings = { sweep, pages: picked.seen }
    return picked.take
  })

const finished = (tally: { readonly owners: number; readonly failed: number }, result: "completed" | "capped") =>
  Metric.increment(Metrics.backfillPasses({ result })).pipe(
    Effect.as<PassResult>({ owners: tally.owners, failed: tally.failed, completed: result === "completed" })
  )

const pass = (deps: PassDeps, replica: Replica, holder: string) =>
  Effect.gen(function*() {
    const ref: SweepRef = { pass: INITIAL_PASS, sweep: yield* joinSweep(deps) }
    const tally = { owners: 0, failed: 0 }
    const scan = (page: { readonly last: string; readonly dids: ReadonlyArray<string> }) =>
      Effect.map(scanPage(deps, ref, page, holder), (done) => {
        tally.owners += done.owners
        tally.failed += done.failed
      })
    // the frontier after which no owner was found (the sweep's end, unless the frontier moves)
    let endAt: { readonly frontier: string | undefined } | undefined
    for (let step = 0; step < deps.maxOwnersPerPass + MAX_WAITS; step++) {
      const now = yield* deps.store.passState(INITIAL_PASS)
      if (now === undefined || now.sweep !== ref.sweep || now.completedAt !== undefined) {
        return yield* finished(tally, "completed")
      }
      if (tally.owners >= deps.maxOwnersPerPass) return yield* finished(tally, "capped")
      const take = yield* claimToTake(deps, replica, ref.sweep, now.claims)
      if (take !== undefined) {
        if (yield* deps.store.takeClaim(ref, take.claim, holder)) {
          yield* Metric.increment(Metrics.backfillPageTakeovers({ reason: take.reason }))
          yield* Effect.logInfo("backfill page taken over").pipe(
            Effect.annotateLogs({ reason: take.reason, owners: take.claim.dids.length })
          )
          yield* scan(take.claim)
        }
        continue
      }
      if (endAt === undefined || endAt.frontier !== now.frontier) {
        const limit = Math.min(deps.pageSize, deps.maxOwnersPerPass - tally.owners)
        const dids = yield* deps.store.ownersPage(now.frontier, limit)
        const last = dids[dids.length - 1]
        if (last !== undefined) {
          if (yield* deps.store.claimPage(ref, now.frontier, dids, holder)) {
            yield* scan({ last, dids })
            if (dids.length < limit) endAt = { frontier: last }
          }
          continue
        }
        endAt = { frontier: now.frontier }
      }
      // no owner after the frontier: complete the sweep, or wait for its claimed pages
      if (now.claims.length === 0) {
        if (yield* deps.store.completePass(ref, now.frontier)) return yield* finished(tally, "completed")
        continue
      }
      yield* Effect.sleep(deps.timings.pollInterval)
    }
    return yield* finished(tally, "capped")
  })

/**
 * One pass from the sweep's frontier (≤ `maxOwnersPerPass` owners): a new sweep when the last one
 * completed. Its holder id is `replica.id` and the pass's number; once it ends, a page it still
 * holds is taken over by the replica's next pass at once.
 */
export const runPass = (deps: PassDeps, replica: Replica): Effect.Effect<PassResult, StoreError> =>
  Effect.suspend(() => {
    replica.passes++
    const holder = `${replica.id}-${replica.passes}`
    return pass(deps, replica, holder).pipe(
      Effect.ensuring(Effect.sync(() => {
        replica.ended.push(holder)
        if (replica.ended.length > 16) replica.ended.shift()
      }))
    )
  }).pipe(Effect.withSpan("Backfill.runPass"))
