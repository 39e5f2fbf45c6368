/**
 * A fake ReconcileStore for the retry scheduler's tests: every operation the scheduler does not
 * use dies; `withOwnerLock` runs its effect, and by default no owner has completed elsewhere.
 * `overrides` supply the operations a test observes (e.g. `retryCandidates`).
 */
import { Effect } from "effect"
import type { StoreError } from "../../src/services/platform/Persistence.js"
import type { ReconcileStoreShape } from "../../src/services/reconciliation/ReconcileStore.js"

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
  savePass: unused,
  completePass: unused,
  retryCandidates: unused,
  completedCursor: () => Effect.succeed("0"),
  completedSince: () => Effect.succeed({ dids: [], cursor: "0" }),
  summary: unused,
  ...overrides
})
