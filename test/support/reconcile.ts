/**
 * The reconciliation stack for tests: a fake PLC and a fake PDS (real HTTP servers on 127.0.0.1),
 * SafeHttp in insecure development mode, Identity, the PostgreSQL ReconcileStore and the Reconciler
 * on top of the matching pipeline (`sqlStack`) on a fresh database.
 */
import { Context, Effect, Layer } from "effect"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import { StoreError } from "../../src/services/platform/Persistence.js"
import * as Identity from "../../src/services/reconciliation/Identity.js"
import * as Reconciler from "../../src/services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../../src/services/reconciliation/ReconcileStore.js"
import { fakePlc, type FakeRepo, type FakeServer, fakeServer, pdsHandler } from "./fakeAtproto.js"
import { sqlStack } from "./stack.js"

export interface FakesShape {
  readonly plc: FakeServer
  readonly pds: FakeServer
  readonly docs: Map<string, unknown>
  readonly repos: Map<string, FakeRepo>
  /** the default PDS behaviour over `repos` (restore it after a custom handler) */
  readonly defaultPds: FakeServer["handler"]
}

export class Fakes extends Context.Tag("test/Fakes")<Fakes, FakesShape>() {}

/**
 * The PostgreSQL store failing every call with a StoreError while `down.value` is true (the
 * database unreachable).
 */
export const downableStore = (
  real: ReconcileStore.ReconcileStoreShape,
  down: { value: boolean }
): ReconcileStore.ReconcileStoreShape => {
  const g = <A>(eff: Effect.Effect<A, StoreError>): Effect.Effect<A, StoreError> =>
    Effect.suspend(() => (down.value ? Effect.fail(new StoreError({ op: "test", code: "57P01" })) : eff))
  return {
    begin: (did, o) => g(real.begin(did, o)),
    saveSnapshotRev: (did, t, r) => g(real.saveSnapshotRev(did, t, r)),
    applyPage: (did, t, r, rows, refused) => g(real.applyPage(did, t, r, rows, refused)),
    deleteOlder: (did, t, r, l) => g(real.deleteOlder(did, t, r, l)),
    pruneTombstones: (did, t, r, ms, l) => g(real.pruneTombstones(did, t, r, ms, l)),
    complete: (did, t, r, e) => g(real.complete(did, t, r, e)),
    withOwnerLock: (did, e) => g(real.withOwnerLock(did, e)),
    markFailed: (did, t, k) => g(real.markFailed(did, t, k)),
    markFailedIdle: (did, k) => g(real.markFailedIdle(did, k)),
    ownerState: (did) => g(real.ownerState(did)),
    addOwners: (dids, s) => g(real.addOwners(dids, s)),
    ownersPage: (after, limit) => g(real.ownersPage(after, limit)),
    passState: (p) => g(real.passState(p)),
    startPass: (p) => g(real.startPass(p)),
    savePass: (p, c, n) => g(real.savePass(p, c, n)),
    completePass: (p, n) => g(real.completePass(p, n)),
    retryCandidates: (o) => g(real.retryCandidates(o)),
    completedCursor: (m) => g(real.completedCursor(m)),
    completedSince: (c, l, ms) => g(real.completedSince(c, l, ms)),
    summary: (l) => g(real.summary(l))
  }
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
