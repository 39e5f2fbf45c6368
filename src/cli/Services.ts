/**
 * The services operator commands run with, built only when a command runs (so --help needs neither
 * configuration nor database).
 */
import { Effect, Layer } from "effect"
import { Secrets } from "../services/delivery/Secrets.js"
import * as Operator from "../services/operator/Operator.js"
import * as WebhookState from "../services/operator/WebhookState.js"
import * as Config from "../services/platform/Config.js"
import * as Database from "../services/platform/Database.js"
import { SafeHttp } from "../services/platform/http/SafeHttp.js"
import * as Identity from "../services/reconciliation/Identity.js"
import * as Reconciler from "../services/reconciliation/Reconciler.js"
import * as ReconcileStore from "../services/reconciliation/ReconcileStore.js"

// ---------------------------------------------------------------------------------------------
// Services (built only when a command runs, so --help needs neither configuration nor database)

export const servicesFor = (config: Config.FirehookConfigShape) =>
  Layer.mergeAll(Operator.layer, Secrets.layerSql, WebhookState.layerSql).pipe(
    Layer.provideMerge(Database.layer({ maxConnections: 2, applicationName: "firehook-cli" })),
    Layer.provideMerge(Config.layerValue(config))
  )

export const withServices = <A, E>(
  eff: Effect.Effect<A, E, Operator.Operator | Secrets | WebhookState.WebhookStateStore>
) => Effect.flatMap(Config.load({ isTty: false }), (config) => Effect.provide(eff, servicesFor(config)))

/**
 * Reconciliation from the command line: the reconcile store, and a reconciler that writes the
 * database only (a running service swaps the owner into its memory within one retry round).
 */
const ownerServices = Effect.gen(function*() {
  const config = yield* Config.load({ isTty: false })
  return Reconciler.layerWithoutRegistry().pipe(
    Layer.provideMerge(Identity.layer()),
    Layer.provideMerge(ReconcileStore.layerSql),
    Layer.provideMerge(SafeHttp.layerDefault({ allowInsecureDev: config.allowInsecureDev, allowCidrs: [] })),
    Layer.provideMerge(Database.layer({ maxConnections: 2, applicationName: "firehook-cli" })),
    Layer.provideMerge(Config.layerValue(config))
  )
})

export const withOwnerServices = <A, E>(
  eff: Effect.Effect<A, E, ReconcileStore.ReconcileStore | Reconciler.Reconciler>
) => Effect.flatMap(ownerServices, (layer) => Effect.provide(eff, layer))
