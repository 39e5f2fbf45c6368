/**
 * The service: composes the parts in the startup order of SPEC §6.1 and registers their drains for
 * the shutdown order of §6.3. The HTTP server layer is a parameter (Bun in production,
 * `NodeHttpServer.layerTest` in tests), so this module never imports a runtime adapter.
 */
import * as HttpServer from "@effect/platform/HttpServer"
import { Context, Duration, Effect, ExecutionStrategy, Exit, Layer, Option, Scope } from "effect"
import { parseCidr } from "../schemas/Net.js"
import * as Api from "../services/api/Api.js"
import * as Delivery from "../services/delivery/Delivery.js"
import * as DeliveryStore from "../services/delivery/DeliveryStore.js"
import { Destinations } from "../services/delivery/Destinations.js"
import * as Publisher from "../services/delivery/Publisher.js"
import { Secrets } from "../services/delivery/Secrets.js"
import * as CursorStore from "../services/intake/CursorStore.js"
import * as Intake from "../services/intake/Intake.js"
import * as Outbox from "../services/matching/Outbox.js"
import * as PriorRefsStore from "../services/matching/PriorRefsStore.js"
import * as Processor from "../services/matching/Processor.js"
import * as Maintenance from "../services/operator/Maintenance.js"
import { FirehookConfig, type FirehookConfigShape } from "../services/platform/Config.js"
import * as Config from "../services/platform/Config.js"
import * as Database from "../services/platform/Database.js"
import * as Health from "../services/platform/Health.js"
import { SafeHttp } from "../services/platform/http/SafeHttp.js"
import * as Lifecycle from "../services/platform/Lifecycle.js"
import { Tx } from "../services/platform/Persistence.js"
import * as Backfill from "../services/reconciliation/Backfill.js"
import * as Registry from "../services/registry/Registry.js"
import * as RegistryStore from "../services/registry/RegistryStore.js"
import * as Reconciliation from "./Reconciliation.js"

/** The PostgreSQL stores behind the matching pipeline. */
export const sqlStores = Layer.mergeAll(
  RegistryStore.layerSql,
  PriorRefsStore.layerSql,
  Outbox.layerSql,
  CursorStore.layerSql,
  Tx.layerSql
)

/** The Redis publisher's options from the configuration (`REDIS_*`, `WEBHOOK_EVENTS_CHANNEL`; SPEC §4.7). */
export const publisherOptions = (config: FirehookConfigShape): Publisher.PublisherOptions => ({
  url: Option.getOrUndefined(config.redis.url),
  channel: config.redis.channel,
  maxMessageBytes: config.redis.publishMaxBytes,
  maxInFlight: config.redis.publishMaxInFlight,
  replyTimeout: Duration.millis(config.redis.publishTimeoutMs)
})

/** Maintenance's options from the configuration (`MAINTENANCE_INTERVAL_MS`, `RETENTION_*`; SPEC §4.9). */
export const maintenanceOptions = (config: FirehookConfigShape): Maintenance.MaintenanceOptions => {
  const r = config.retention
  return {
    interval: Duration.millis(config.maintenanceIntervalMs),
    delivered: Duration.millis(r.deliveredMs),
    deadLetter: Duration.millis(r.deadLetterMs),
    cancelled: Duration.millis(r.cancelledMs),
    audit: Duration.millis(r.auditMs),
    auditMaxRows: r.auditMaxRows,
    tombstones: Duration.millis(r.tombstonesMs),
    tombstonesMaxRows: r.tombstonesMaxRows,
    quarantine: Duration.millis(r.quarantineMs),
    quarantineMaxRows: r.quarantineMaxRows,
    deliveryEvents: Duration.millis(r.eventBodiesMs)
  }
}

/** The delivery worker and what it needs, from the configuration. */
export const deliveryLayer = (config: FirehookConfigShape) => {
  const allowCidrs = config.delivery.allowCidrs.flatMap((c) => {
    const parsed = parseCidr(c)
    return parsed === undefined ? [] : [parsed]
  })
  return Delivery.layer().pipe(
    Layer.provide(
      Layer.mergeAll(
        DeliveryStore.layerSql,
        Secrets.layerSql,
        SafeHttp.layerDefault({ allowInsecureDev: config.allowInsecureDev, allowCidrs }),
        Destinations.layer,
        Publisher.layer(publisherOptions(config)).pipe(Layer.orDie)
      )
    )
  )
}

/** Registry (loaded) + Processor on the PostgreSQL stores. Requires config, health, SqlClient. */
export const matchingLayer = Processor.layer().pipe(Layer.provideMerge(Registry.layer), Layer.provideMerge(sqlStores))

export interface ServiceOptions<E = never, R = never> {
  /** called once with the shutdown report (main uses it for the exit code) */
  readonly onShutdown?: (report: Lifecycle.ShutdownReport) => Effect.Effect<void>
  /** the owners' API listener (SPEC §8.1, `API_HOST:API_PORT`); none: the API is not served */
  readonly api?: Layer.Layer<HttpServer.HttpServer, E, R>
}

/** Start the parts in order and register their drains. Requires the core services. */
export const service = <E, R>(
  server: Layer.Layer<HttpServer.HttpServer, E, R>,
  options: ServiceOptions<E, R> = {}
) =>
  Layer.scopedDiscard(
    Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      const config = yield* FirehookConfig
      const scope = yield* Effect.scope
      const startup = Effect.gen(function*() {
        // 3. the health server, in a scope of its own so that shutdown can stop it at its stage
        const httpScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
        const httpContext = yield* Layer.buildWithScope(
          HttpServer.serve(Health.router).pipe(Layer.provideMerge(server)),
          httpScope
        )
        const address = yield* HttpServer.addressFormattedWith((a) => Effect.succeed(a)).pipe(
          Effect.provide(httpContext)
        )
        yield* Effect.logInfo("health server listening").pipe(Effect.annotateLogs({ address }))
        yield* lifecycle.registerStop("http", "http", Scope.close(httpScope, Exit.void))
        // 3b. the owners' API listener (SPEC §8.1): a scope of its own, stopped at the health
        //     listener's stage
        if (options.api !== undefined) yield* Api.start(options.api, scope)
        // 4. the registry, loaded into memory (bounded), and the matching pipeline
        const matching = yield* Layer.buildWithScope(matchingLayer, scope)
        const registryStats = yield* Effect.flatMap(Registry.Registry, (r) => r.stats).pipe(Effect.provide(matching))
        yield* Effect.logInfo("registry ready").pipe(Effect.annotateLogs({ active: registryStats.active }))
        // the delivery worker (before intake, SPEC §6.1), with its transport, secrets and publisher
        yield* Layer.buildWithScope(deliveryLayer(config), scope).pipe(Effect.provide(matching))
        // maintenance (one runner across replicas)
        yield* Layer.buildWithScope(Maintenance.layer(maintenanceOptions(config)), scope)
        // identity (DID → PDS, cached) before intake: `#identity`/`#account` events invalidate it
        const identity = yield* Layer.buildWithScope(Reconciliation.identityLayer(config), scope)
        // intake, under leader election (one intake leader across replicas); its tuning
        // (`WEBHOOK_INTAKE_*`) is read from the configuration by Intake itself
        yield* Layer.buildWithScope(Intake.layer(), scope).pipe(Effect.provide(Context.merge(matching, identity)))
        // 5. the retry scheduler, then the initial backfill in the background: `reconciling-live`
        //    until the first pass completes, then `live`
        const recon = yield* Layer.buildWithScope(Reconciliation.reconciliationLayer(), scope).pipe(
          Effect.provide(Context.merge(matching, identity))
        )
        yield* lifecycle.setPhase("reconciling-live")
        const backfill = Context.get(recon, Backfill.Backfill)
        yield* backfill.start
        yield* Effect.forkIn(backfill.awaitInitialPass.pipe(Effect.zipRight(lifecycle.setPhase("live"))), scope)
      })
      yield* startup.pipe(Effect.tapErrorCause(() => lifecycle.setPhase("failed")))
      // Added last, so it runs first when the scope closes: the ordered, deadline-bound shutdown.
      yield* Effect.addFinalizer(() =>
        lifecycle.shutdown.pipe(Effect.flatMap((report) => options.onShutdown?.(report) ?? Effect.void))
      )
    })
  )

/**
 * The core services every part needs: lifecycle, health, database (with migrations). `lifecycle`:
 * one made beforehand (main makes it first, so that a signal during startup reaches its shutdown).
 */
export const core = (config: FirehookConfigShape, lifecycle?: Lifecycle.LifecycleShape) => {
  const ConfigLive = Config.layerValue(config)
  const LifecycleLive = lifecycle === undefined
    ? Lifecycle.layer({ shutdownTimeout: Duration.millis(config.shutdownTimeoutMs) })
    : Layer.succeed(Lifecycle.Lifecycle, lifecycle)
  const HealthLive = Health.layer.pipe(Layer.provide(LifecycleLive))
  return Database.layer().pipe(Layer.provideMerge(Layer.mergeAll(ConfigLive, LifecycleLive, HealthLive)))
}
