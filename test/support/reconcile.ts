/**
 * The reconciliation stack for tests: a fake PLC and a fake PDS (real HTTP servers on 127.0.0.1),
 * SafeHttp in insecure development mode, Identity, the PostgreSQL ReconcileStore and the Reconciler
 * on top of the matching pipeline (`sqlStack`) on a fresh database.
 */
import { Clock, Context, Effect, Layer } from "effect"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Reconciler from "../../src/services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../../src/services/reconciliation/ReconcileStore.js"
import { fakePlc, type FakeRepo, type FakeServer, fakeServer, pdsHandler } from "./fakeAtproto.js"
import { sqlStack } from "./stack.js"

/** A reconciliation that completed with nothing to do (one empty page of a repo that exists). */
export const COMPLETE: Reconciler.ReconcileOutcome = {
  _tag: "complete",
  records: 0,
  invalid: 0,
  written: 0,
  deleted: 0,
  pages: 1,
  repoFound: true
}

export interface FakesShape {
  readonly plc: FakeServer
  readonly pds: FakeServer
  readonly docs: Map<string, unknown>
  readonly repos: Map<string, FakeRepo>
  /** the default PDS behaviour over `repos` (restore it after a custom handler) */
  readonly defaultPds: FakeServer["handler"]
}

export class Fakes extends Context.Tag("test/Fakes")<Fakes, FakesShape>() {}

/** The port's operations, by name (a wrapper may single one out). */
export type StoreOp = keyof ReconcileStore.ReconcileStoreShape

/**
 * `real` with every call passed through `around` (the one list of the port's operations the test
 * wrappers share).
 */
export const wrapStore = (
  real: ReconcileStore.ReconcileStoreShape,
  around: <A>(op: StoreOp, eff: Effect.Effect<A, StoreError>) => Effect.Effect<A, StoreError>
): ReconcileStore.ReconcileStoreShape => ({
  begin: (did, o) => around("begin", real.begin(did, o)),
  saveSnapshotRev: (did, t, r) => around("saveSnapshotRev", real.saveSnapshotRev(did, t, r)),
  applyPage: (did, t, r, rows, refused) => around("applyPage", real.applyPage(did, t, r, rows, refused)),
  deleteOlder: (did, t, r, l) => around("deleteOlder", real.deleteOlder(did, t, r, l)),
  pruneTombstones: (did, t, r, ms, l) => around("pruneTombstones", real.pruneTombstones(did, t, r, ms, l)),
  complete: (did, t, r, e) => around("complete", real.complete(did, t, r, e)),
  withOwnerLock: (did, e) => around("withOwnerLock", real.withOwnerLock(did, e)),
  markFailed: (did, t, k) => around("markFailed", real.markFailed(did, t, k)),
  markFailedIdle: (did, k) => around("markFailedIdle", real.markFailedIdle(did, k)),
  ownerState: (did) => around("ownerState", real.ownerState(did)),
  addOwners: (dids, s) => around("addOwners", real.addOwners(dids, s)),
  ownersPage: (after, limit) => around("ownersPage", real.ownersPage(after, limit)),
  passState: (p) => around("passState", real.passState(p)),
  startPass: (p, seen) => around("startPass", real.startPass(p, seen)),
  claimPage: (ref, after, dids, holder) => around("claimPage", real.claimPage(ref, after, dids, holder)),
  beatClaim: (ref, last, holder) => around("beatClaim", real.beatClaim(ref, last, holder)),
  takeClaim: (ref, seen, holder) => around("takeClaim", real.takeClaim(ref, seen, holder)),
  finishPage: (ref, last, holder) => around("finishPage", real.finishPage(ref, last, holder)),
  releaseClaim: (ref, last, holder) => around("releaseClaim", real.releaseClaim(ref, last, holder)),
  completePass: (ref, frontier) => around("completePass", real.completePass(ref, frontier)),
  retryCandidates: (o) => around("retryCandidates", real.retryCandidates(o)),
  requestReconcile: (dids, max) => around("requestReconcile", real.requestReconcile(dids, max)),
  reconcileRequests: (o) => around("reconcileRequests", real.reconcileRequests(o)),
  completedCursor: (m) => around("completedCursor", real.completedCursor(m)),
  completedSince: (c, l, ms) => around("completedSince", real.completedSince(c, l, ms)),
  summary: (l) => around("summary", real.summary(l))
})

/**
 * The PostgreSQL store failing every call with a StoreError while `down.value` is true (the
 * database unreachable).
 */
export const downableStore = (
  real: ReconcileStore.ReconcileStoreShape,
  down: { value: boolean }
): ReconcileStore.ReconcileStoreShape =>
  wrapStore(
    real,
    (_op, eff) => Effect.suspend(() => (down.value ? Effect.fail(new StoreError({ op: "test", code: "57P01" })) : eff))
  )

/**
 * The store with every call on the live clock, for a caller that runs under `TestClock`: the
 * calls' own timeouts (`storeOp`) stay real, and only the caller's sleeps wait for the test.
 */
export const liveClockStore = (real: ReconcileStore.ReconcileStoreShape): ReconcileStore.ReconcileStoreShape => {
  const live = Clock.make()
  return wrapStore(real, (_op, eff) => Effect.withClock(eff, live))
}

export const reconcileStack = (
  options: {
    readonly limits?: Partial<Reconciler.ReconcileLimits>
    readonly env?: Record<string, string>
    /** wraps the PostgreSQL store the reconciler uses (e.g. {@link downableStore}) */
    readonly wrapStore?: (real: ReconcileStore.ReconcileStoreShape) => ReconcileStore.ReconcileStoreShape
  } = {}
) =>
  Layer.unwrapScoped(
    Effect.gen(function*() {
      const docs = new Map<string, unknown>()
      const repos = new Map<string, FakeRepo>()
      const plc = yield* fakePlc(docs)
      const defaultPds = pdsHandler(repos)
      const pds = yield* fakeServer(defaultPds)
      const env = { WEBHOOK_ALLOW_INSECURE_DEV: "1", PLC_DIRECTORY_URL: plc.url, ...options.env }
      const wrap = options.wrapStore
      const store = wrap === undefined
        ? ReconcileStore.layerSql
        : Layer.effect(ReconcileStore.ReconcileStore, Effect.map(ReconcileStore.makeSql, wrap))
      return Reconciler.layer(options.limits).pipe(
        Layer.provideMerge(Identity.layer()),
        Layer.provideMerge(store),
        Layer.provideMerge(SafeHttp.layerDefault({ allowInsecureDev: true, allowCidrs: [] })),
        Layer.provideMerge(sqlStack({ env })),
        Layer.merge(Layer.succeed(Fakes, { plc, pds, docs, repos, defaultPds }))
      )
    })
  )

/** Poll (live clock) until `cond` holds; fails after `timeoutMs`. */
export const waitFor = (cond: () => boolean, timeoutMs = 10_000) =>
  Effect.gen(function*() {
    for (let waited = 0; waited < timeoutMs; waited += 10) {
      if (cond()) return
      yield* Effect.sleep("10 millis")
    }
    return yield* Effect.dieMessage("condition not reached in time")
  })

/**
 * Hold the fake PDS's answers to `path` for `did` (the `repo` or `did` parameter) until the returned
 * function is called (which also restores the default PDS); the requests are logged at once.
 */
export const holdPdsPath = (path: string, did: string) =>
  Effect.gen(function*() {
    const fakes = yield* Fakes
    let release: () => void = () => undefined
    const gate = new Promise<void>((resolve) => (release = resolve))
    fakes.pds.handler = async (req) => {
      if (req.path === path && (req.query.get("repo") ?? req.query.get("did")) === did) await gate
      return fakes.defaultPds(req)
    }
    return () => {
      release()
      fakes.pds.handler = fakes.defaultPds
    }
  })
