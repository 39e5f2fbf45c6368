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

/** What the next claim may take: room per origin held, the origins that are full, and those open. */
export const claimOptions = (env: WorkerEnv) => {
  const rooms: Array<{ origin: string; room: number }> = []
  const fullOrigins: Array<string> = []
  for (const [origin, slot] of env.state.origins) {
    const room = env.perOriginHold - slot.held
    if (room > 0) rooms.push({ origin, room })
    else fullOrigins.push(origin)
  }
  // open circuits (and outstanding probes): none of their rows is claimed (Parking.ts moves them)
  const openOrigins = env.breaker.held(env.clock.unsafeCurrentTimeMillis()).map((h) => h.origin)
  return {
    rooms,
    fullOrigins,
    openOrigins,
    defaultRoom: env.perOriginHold,
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
