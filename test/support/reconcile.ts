/**
 * The reconciliation stack for tests: a fake PLC and a fake PDS (real HTTP servers on 127.0.0.1),
 * SafeHttp in insecure development mode, Identity, the PostgreSQL ReconcileStore and the Reconciler
 * on top of the matching pipeline (`sqlStack`) on a fresh database.
 */
import { Context, Effect, Layer } from "effect"
import { SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
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

export const reconcileStack = (
  options: { readonly limits?: Partial<Reconciler.ReconcileLimits>; readonly env?: Record<string, string> } = {}
) =>
  Layer.unwrapScoped(
    Effect.gen(function*() {
      const docs = new Map<string, unknown>()
      const repos = new Map<string, FakeRepo>()
      const plc = yield* fakePlc(docs)
      const defaultPds = pdsHandler(repos)
      const pds = yield* fakeServer(defaultPds)
      const env = { WEBHOOK_ALLOW_INSECURE_DEV: "1", PLC_DIRECTORY_URL: plc.url, ...options.env }
      return Reconciler.layer(options.limits).pipe(
        Layer.provideMerge(Identity.layer()),
        Layer.provideMerge(ReconcileStore.layerSql),
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
