/**
 * The poison-row guard ("crash suspects"). An attempt cut off by the death of its process (a crash,
 * a killed delivery child) spends no attempt, so without a guard a request that reliably crashes the
 * delivery process would be retried after every reclaim, for ever, and take the service down with
 * it each time (the parent gives up on a child that exits six times in 10 minutes).
 *
 * - A claimed row whose lease had expired (`ClaimedRow.reclaimed`: its previous holder died, or
 *   stalled past its lease, while holding it) is a suspect.
 * - Before a suspect's request, one guarded statement counts it (`markSuspect`: `crash_count + 1`,
 *   committed first), so a death during the request finds it counted.
 * - A suspect not counted yet (`crashCount ≤ 0` when claimed: the first reclaim after a death) runs
 *   like a fresh row, at the worker's full concurrency: a dead process's rows are delivered within
 *   seconds however slow their receivers (SPEC §4.1), and a death among them counts every one then
 *   in flight.
 * - A suspect counted before ({@link isSerialSuspect}: it was in flight in a death after its first
 *   reclaim) starts one at a time per worker: Admission gives these one slot of their own, taken
 *   when the suspect starts and given back when its outcome is known (before its settle commits);
 *   fresh rows keep every request slot. A worker holds at most {@link SUSPECTS_HELD} of them (the
 *   claim's `reclaimRoom`), so waiting suspects never fill the rows it holds; the other workers
 *   take the rest.
 * - A count over {@link CRASH_LIMIT} means the row was in flight in three deaths of its worker (once
 *   fresh, once at its first reclaim, once as the only counted suspect in flight): it is not sent
 *   again but dead-lettered, kind `crashed`, no attempt spent ({@link Crashed}); a replay sends it
 *   again.
 * - Blame is serial only from the second reclaim: a death while a counted suspect is in flight is
 *   counted against that suspect alone; an innocent row in flight during an earlier death runs alone
 *   then, and its outcome clears it (the next claim from `pending` resets the count, and a terminal
 *   row never comes back but by a replay, which resets it too).
 * - No statement for fresh rows: a normal delivery costs nothing more than its claim.
 *
 * @since 0.1.0
 */
import { Effect, Either, Option } from "effect"
import { attemptSafe } from "./Attempt.js"
import { Crashed, type Settled } from "./Settlement.js"
import { countNotAttempted, logRecurring, logStoreError } from "./Telemetry.js"
import type { RowEntry, WorkerEnv } from "./WorkerState.js"

/** A suspect whose count (attempts as a suspect, this one included) exceeds this is not sent again. */
export const CRASH_LIMIT = 2
/** Counted suspects one worker holds at most (waiting or in flight; one in flight at a time). */
export const SUSPECTS_HELD = 4

/**
 * A suspect counted before (in flight in a death after its first reclaim): attempted one at a time
 * per worker. A first reclaim (`crashCount ≤ 0`; below 0 after an orderly stop cut it short) runs at
 * full concurrency.
 */
export const isSerialSuspect = (row: { readonly reclaimed: boolean; readonly crashCount: number }): boolean =>
  row.reclaimed && row.crashCount > 0

/** What a suspect's new count decides: `Crashed` over the limit, otherwise undefined (attempt it). */
export const judgeSuspect = (crashes: number): Settled | undefined =>
  crashes > CRASH_LIMIT ? Crashed({ crashes }) : undefined

/**
 * A suspect's attempt: counted first, then attempted or dead-lettered. None when nothing is to be
 * settled: the lease is gone (as for a lost lease: not sent, counted `lease_lost`), or the count
 * could not be written (not sent; the row stays leased until its lease ends, as after a failed
 * settle, and comes back as a suspect with its count unchanged).
 */
export const attemptSuspect = (env: WorkerEnv, entry: RowEntry): Effect.Effect<Option.Option<Settled>> =>
  Effect.gen(function*() {
    const row = entry.row
    const marked = yield* Effect.either(env.store.markSuspect(row.deliveryId, row.leaseToken))
    if (Either.isLeft(marked)) {
      entry.settling = true
      yield* logStoreError(env, marked.left)
      return Option.none()
    }
    const crashes = marked.right
    if (crashes === undefined) {
      entry.settling = true
      countNotAttempted("lease_lost")
      yield* logRecurring(env, "lease_lost", "delivery lease lost; attempt abandoned", { deliveryId: row.deliveryId })
      return Option.none()
    }
    const judged = judgeSuspect(crashes)
    if (judged !== undefined) {
      entry.settling = true
      return Option.some(judged)
    }
    return Option.some(yield* attemptSafe(env, row, entry.claimedAtMs, entry))
  })
