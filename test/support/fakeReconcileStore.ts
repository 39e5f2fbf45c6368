/**
 * Fakes of the ReconcileStore port. `fakeReconcileStore`, for the retry scheduler's tests: every
 * operation the scheduler does not use dies; `withOwnerLock` runs its effect, and by default no
 * owner has completed elsewhere and none has a reconciliation requested. `overrides` supply the
 * operations a test observes (e.g. `retryCandidates`). `memoryPassState`: the backfill pass operations in memory, with the
 * PostgreSQL driver's fencing (sweep number, compare-and-swap claims), for tests of Backfill that
 * do not need a database.
 */
import { Effect } from "effect"
import type { StoreError } from "../../src/services/platform/Persistence.js"
import {
  doneThrough,
  type PageClaim,
  type PassState,
  type ReconcileStoreShape,
  type SweepRef
} from "../../src/services/reconciliation/ReconcileStore.js"

const unused = () => Effect.die("not used by this test")

export const fakeReconcileStore = (overrides: Partial<ReconcileStoreShape>): ReconcileStoreShape => ({
  begin: unused,
  saveSnapshotRev: unused,
  applyPage: unused,
  deleteOlder: unused,
  pruneTombstones: unused,
  complete: unused,
  withOwnerLock: <A>(_did: string, eff: Effect.Effect<A, StoreError>) => eff,
  markFailed: unused,
  markFailedIdle: unused,
  ownerState: unused,
  addOwners: unused,
  ownersPage: unused,
  passState: unused,
  startPass: unused,
  claimPage: unused,
  beatClaim: unused,
  takeClaim: unused,
  finishPage: unused,
  releaseClaim: unused,
  completePass: unused,
  retryCandidates: unused,
  requestReconcile: unused,
  reconcileRequests: () => Effect.succeed([]),
  completedCursor: () => Effect.succeed("0"),
  completedSince: () => Effect.succeed({ dids: [], cursor: "0" }),
  summary: unused,
  ...overrides
})

type PassOps =
  | "passState"
  | "startPass"
  | "claimPage"
  | "beatClaim"
  | "takeClaim"
  | "finishPage"
  | "releaseClaim"
  | "completePass"

interface PassRow {
  frontier: string | undefined
  ownersDone: number
  startedAt: Date | undefined
  completedAt: Date | undefined
  sweep: number
  claims: Array<PageClaim>
}

/** The backfill pass operations of the port, in memory (one process: no concurrency to fence but its own). */
export const memoryPassState = (): Pick<ReconcileStoreShape, PassOps> => {
  const rows = new Map<string, PassRow>()
  const view = (pass: string, r: PassRow): PassState => ({
    pass,
    continuation: doneThrough(r.frontier, r.claims),
    frontier: r.frontier,
    ownersDone: r.ownersDone,
    startedAt: r.startedAt,
    completedAt: r.completedAt,
    sweep: r.sweep,
    claims: [...r.claims]
  })
  /** The row of the sweep `ref` while it is unfinished. */
  const running = (ref: SweepRef) => {
    const r = rows.get(ref.pass)
    return r !== undefined && r.sweep === ref.sweep && r.completedAt === undefined ? r : undefined
  }
  /** Change the claim `last` of `ref` when `expected` holds of it; true when changed. */
  const onClaim = (
    ref: SweepRef,
    last: string,
    expected: (c: PageClaim) => boolean,
    change: (r: PassRow, i: number, c: PageClaim) => void
  ) =>
    Effect.sync(() => {
      const r = running(ref)
      const i = r === undefined ? -1 : r.claims.findIndex((c) => c.last === last)
      const c = r?.claims[i]
      if (r === undefined || c === undefined || !expected(c)) return false
      change(r, i, c)
      return true
    })
  return {
    passState: (pass) =>
      Effect.sync(() => {
        const r = rows.get(pass)
        return r === undefined ? undefined : view(pass, r)
      }),
    startPass: (pass, seen) =>
      Effect.sync(() => {
        const r = rows.get(pass)
        const started = r === undefined ||
          (r.sweep === seen && (r.completedAt !== undefined || r.startedAt === undefined))
        const next: PassRow = started
          ? {
            frontier: undefined,
            ownersDone: 0,
            startedAt: new Date(),
            completedAt: undefined,
            sweep: (r?.sweep ?? seen) + 1,
            claims: []
          }
          : r
        rows.set(pass, next)
        return { started, state: view(pass, next) }
      }),
    claimPage: (ref, after, dids, holder) =>
      Effect.sync(() => {
        const r = running(ref)
        const last = dids[dids.length - 1]
        if (r === undefined || last === undefined || r.frontier !== after) return false
        if (after !== undefined && last <= after) return false
        r.frontier = last
        r.claims.push({ last, after, dids: [...dids], holder, beat: 0 })
        return true
      }),
    beatClaim: (ref, last, holder) =>
      onClaim(ref, last, (c) => c.holder === holder, (r, i, c) => void (r.claims[i] = { ...c, beat: c.beat + 1 })),
    takeClaim: (ref, seen, holder) =>
      onClaim(
        ref,
        seen.last,
        (c) => c.holder === seen.holder && c.beat === seen.beat,
        (r, i, c) => void (r.claims[i] = { ...c, holder, beat: c.beat + 1 })
      ),
    releaseClaim: (ref, last, holder) =>
      onClaim(ref, last, (c) => c.holder === holder, (r, i, c) => void (r.claims[i] = { ...c, holder: undefined })),
    finishPage: (ref, last, holder) =>
      onClaim(ref, last, (c) => c.holder === holder, (r, i, c) => {
        r.claims.splice(i, 1)
        r.ownersDone += c.dids.length
      }),
    completePass: (ref, frontier) =>
      Effect.sync(() => {
        const r = running(ref)
        if (r === undefined || r.claims.length > 0 || r.frontier !== frontier) return false
        r.frontier = undefined
        r.completedAt = new Date()
        return true
      })
  }
}
