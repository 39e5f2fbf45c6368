/**
 * Admission of claimed rows (SPEC §4.1): claimed rows wait in claim order; a row starts when a
 * request slot is free (`concurrency` in flight) and its origin has fewer than
 * `perOriginConcurrency` rows in flight. The admission is synchronous bookkeeping: a waiting row has
 * no fiber and takes no semaphore; a started row gets a fiber, and frees its slot before it is
 * settled, so a slow database never holds a request slot. Origin slots live in a map that holds only
 * origins with claimed rows, so it is bounded by the number of held rows. Counted suspects (rows
 * reclaimed after a death that caught them already reclaimed once: Suspects.isSerialSuspect) also
 * wait for the worker's one suspect slot.
 *
 * @since 0.1.0
 */
import { Duration, Effect, Option } from "effect"
import { attemptSafe } from "./Attempt.js"
import type { ClaimedRow } from "./DeliveryStore.js"
import { settle } from "./Settlement.js"
import { attemptSuspect, isSerialSuspect, SUSPECTS_HELD } from "./Suspects.js"
import { countNotAttempted, logRecurring, setInFlight } from "./Telemetry.js"
import type { RowEntry, WorkerEnv } from "./WorkerState.js"

/** Rows held per process = HOLD_FACTOR × concurrency (in flight + prefetch + settling). */
export const HOLD_FACTOR = 4
/** Rows of one origin held per process = ORIGIN_HOLD_FACTOR × perOriginConcurrency. */
export const ORIGIN_HOLD_FACTOR = 8
/**
 * Rows a worker may hold beyond its hold (HOLD_FACTOR × concurrency), START_HOLD_FACTOR ×
 * concurrency, taken only by a start-only claim ({@link claimPlan}): rows that start at once in
 * idle request slots. Slow receivers at their per-origin cap can fill the hold with rows that wait
 * for them (8 origins × 8 × their cap of 4 = 256 rows with 32 in flight); the other origins' rows
 * are still claimed then. A worker holds at most (HOLD_FACTOR + START_HOLD_FACTOR) × concurrency rows.
 */
export const START_HOLD_FACTOR = 1
/** Handing a row back (stop, interruption before it started) is abandoned after this long. */
export const RELEASE_TIMEOUT = Duration.seconds(2)

/** A claimed row is held: it waits for a request slot. */
export const dispatch = (env: WorkerEnv, row: ClaimedRow, claimedAtMs: number, claimedAtMonotonicMs: number): void => {
  const state = env.state
  let slot = state.origins.get(row.origin)
  if (slot === undefined) {
    slot = { held: 0, active: 0 }
    state.origins.set(row.origin, slot)
  }
  slot.held++
  state.held++
  if (isSerialSuspect(row)) state.suspectsHeld++
  const entry: RowEntry = {
    row,
    claimedAtMs,
    slot,
    renewedAt: claimedAtMonotonicMs,
    started: false,
    settling: false,
    fiber: undefined
  }
  state.entries.set(row.leaseToken, entry)
  state.waiting.push(entry)
}

/**
 * The next claim, if the worker may claim now: how many rows at most, and whether it is a
 * start-only claim (rows that start at once: {@link claimOptions}).
 *
 * - A claim within the hold (`maxHeld` rows): in batches of at least `minBatch` rows, or for any
 *   room left while fewer rows than request slots are held, or while at least half the request
 *   slots are idle (no held row can take them: a freed slot starts the next startable row
 *   synchronously, so the held rows wait for origins at their cap: slow receivers).
 * - A start-only claim, when the hold is used up and at least half the request slots are idle: at
 *   most as many rows as slots are idle, each of an origin below its cap, up to
 *   {@link START_HOLD_FACTOR} × concurrency rows beyond the hold.
 *
 * Half, not one: slow origins hold at most ORIGIN_HOLD_FACTOR rows per request slot they use, so
 * rows waiting for them can fill the hold only while at most `maxHeld / ORIGIN_HOLD_FACTOR` (half
 * the slots) are theirs; a claim at any idle slot made a busy worker (rows briefly between a
 * finished request and the next start) claim a few rows at every wake-up instead of batches, which
 * cost the e2e bench about a third of its deliveries a second (docs/benchmarks.md, stop 56).
 */
export const claimPlan = (
  env: Pick<WorkerEnv, "state" | "concurrency" | "maxHeld" | "minBatch">,
  batchMax: number
): { readonly limit: number; readonly startOnly: boolean } | undefined => {
  const held = env.state.held
  const idle = env.concurrency - env.state.inFlight
  const starved = idle > 0 && idle * 2 >= env.concurrency
  const capacity = env.maxHeld - held
  if (capacity > 0 && (capacity >= env.minBatch || held < env.concurrency || starved)) {
    return { limit: Math.min(capacity, batchMax), startOnly: false }
  }
  const beyond = env.maxHeld + START_HOLD_FACTOR * env.concurrency - held
  if (starved && beyond > 0) return { limit: Math.min(idle, beyond, batchMax), startOnly: true }
  return undefined
}

/**
 * What the next claim may take: room per origin held, the origins that are full, and those open.
 * A start-only claim ({@link claimPlan}) takes rows of an origin only up to its in-flight cap
 * (`perOrigin` rows held, the rows being settled included), so that every row it takes can start.
 */
export const claimOptions = (env: WorkerEnv, startOnly = false) => {
  const rooms: Array<{ origin: string; room: number }> = []
  const fullOrigins: Array<string> = []
  const hold = startOnly ? Math.min(env.perOrigin, env.perOriginHold) : env.perOriginHold
  for (const [origin, slot] of env.state.origins) {
    const room = hold - slot.held
    if (room > 0) rooms.push({ origin, room })
    else fullOrigins.push(origin)
  }
  // open circuits (and outstanding probes): none of their rows is claimed (Parking.ts moves them)
  const openOrigins = env.breaker.held(env.clock.unsafeCurrentTimeMillis()).map((h) => h.origin)
  return {
    rooms,
    fullOrigins,
    openOrigins,
    defaultRoom: hold,
    reclaimRoom: Math.max(0, SUSPECTS_HELD - env.state.suspectsHeld),
    withSubscriptions: env.snapshotMaxAgeMs > 0,
    // a stopping worker waits for one statement of a claim in progress, not two
    mayWalk: () => !env.state.stopping
  }
}

/** Hands a row back at once (no attempt spent). */
export const release = (env: WorkerEnv, row: ClaimedRow) =>
  env.store.defer(row.deliveryId, row.leaseToken, 0).pipe(
    Effect.timeout(RELEASE_TIMEOUT),
    Effect.zipRight(Effect.sync(() => countNotAttempted("released"))),
    Effect.ignore
  )

/** The row is no longer held (settled, handed back or given up). */
export const forgetNow = (env: WorkerEnv, entry: RowEntry): void => {
  const state = env.state
  const slot = entry.slot
  state.entries.delete(entry.row.leaseToken)
  state.held--
  slot.held--
  if (slot.held <= 0) state.origins.delete(entry.row.origin)
  // a counted suspect gone: the next claim may take another (the claim left them for later, see
  // reclaimRoom)
  if (isSerialSuspect(entry.row)) {
    state.suspectsHeld--
    state.notified = true
  }
  state.freed = true
  env.wake.unsafeOffer(undefined)
}
export const forget = (env: WorkerEnv, entry: RowEntry) => Effect.sync(() => forgetNow(env, entry))

/** A started row: the attempt holds a request slot; the settlement runs after it is freed. */
const runRow = (env: WorkerEnv, entry: RowEntry): Effect.Effect<void> => {
  const row = entry.row
  const serial = isSerialSuspect(row)
  let holding = true
  /** Gives the request slot (and a suspect's slot) back (once) and starts the next waiting rows. */
  const freeSlot = (): void => {
    if (!holding) return
    holding = false
    env.state.inFlight--
    entry.slot.active--
    if (serial) env.state.suspectActive = false
    setInFlight(env)
    pumpNow(env)
  }
  const attempted = row.reclaimed
    ? attemptSuspect(env, entry)
    : Effect.map(attemptSafe(env, row, entry.claimedAtMs, entry), Option.some)
  return attempted.pipe(
    // the settlement runs after the request slot is freed
    Effect.flatMap((settlement) => {
      freeSlot()
      return Option.isSome(settlement) ? settle(env, row, settlement.value) : Effect.void
    }),
    Effect.catchAllDefect(() =>
      logRecurring(env, "defect", "delivery settlement failed unexpectedly", { deliveryId: row.deliveryId })
    ),
    // however it ended (interrupted when its lease was lost, or at shutdown): not held any more
    Effect.onExit(() =>
      Effect.sync(() => {
        forgetNow(env, entry)
        freeSlot()
      })
    )
  )
}

/**
 * Starts waiting rows while request slots are free: the first waiting row (claim order) whose
 * origin is under its cap, and which is not a counted suspect while another one runs. Admission is
 * synchronous bookkeeping (no semaphore, and no fiber for a row until it starts), so a held row
 * costs nothing while it waits.
 */
export const pumpNow = (env: WorkerEnv): void => {
  const state = env.state
  const waiting = state.waiting
  const concurrency = env.concurrency
  if (state.stopping || waiting.length === 0 || state.inFlight >= concurrency) return
  let started = false
  let i = 0
  while (state.inFlight < concurrency && i < waiting.length) {
    const entry = waiting[i]
    if (entry === undefined) break
    const serial = isSerialSuspect(entry.row)
    if (entry.slot.active >= env.perOrigin || (serial && state.suspectActive)) {
      i++
      continue
    }
    waiting.splice(i, 1)
    entry.started = true
    entry.slot.active++
    if (serial) state.suspectActive = true
    state.inFlight++
    started = true
    // scheduled like a fork (not run inside this loop, which it could re-enter)
    entry.fiber = env.runInRows(runRow(env, entry), { immediate: false })
  }
  if (started) setInFlight(env)
}

/** Hands back rows that have not started (stop, scope close). */
export const releaseWaiting = (env: WorkerEnv) =>
  Effect.suspend(() => {
    const waiting = env.state.waiting
    const back = waiting.splice(0, waiting.length)
    for (const e of back) e.settling = true
    return Effect.forEach(back, (e) => Effect.ensuring(release(env, e.row), forget(env, e)), {
      concurrency: "unbounded",
      discard: true
    })
  })
