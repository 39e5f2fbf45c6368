/**
 * The service: composes the parts of the process's roles (SPEC §6.4) in the startup order of
 * §6.1 and registers their drains for the shutdown order of §6.3. The HTTP server layer is a
 * parameter (Bun in production, `NodeHttpServer.layerTest` in tests), so this module never imports
 * a runtime adapter.
 *
 * What each role starts (besides the health server, which every process runs):
 * - `intake`: the registry loaded in memory, the matching Processor, Intake under leader election
 *   (whose leader follows the registry changes other processes make, RegistrySync), and the
 *   invalidation of identity caches on `#identity`/`#account` events: its own when it has one, and
 *   every other process's through a notification (IdentityInvalidations);
 * - `delivery`: the worker with its store, SafeHttp, secrets, destinations and publisher (no
 *   registry in memory: every attempt reads its subscription from the store); or, when main passes
 *   `deliveryProcess` (DELIVERY_PROCESS), the supervisor of a child process that runs it;
 * - `reconcile`: identity (following the invalidations intake sends), the reconciler, the retry
 *   scheduler, the backfill;
 * - `maintenance`: maintenance (one runner across replicas);
 * - `api`: the owners' XRPC listener, its identity cache following the invalidations, its live
 *   tail fed by the outcomes of this process's worker and (PostgreSQL LISTEN) every other's.
 *
 * `delivery` and `api` share the process's `DeliveryOutcomes` (the live tail's feed): a `delivery`
 * process NOTIFYs the outcomes it settles on `firehook_outcomes`, an `api` process LISTENs.
 */
import * as HttpServer from "@effect/platform/HttpServer"
import { Context, Duration, Effect, ExecutionStrategy, Exit, Layer, Option, Scope } from "effect"
import { parseCidrs } from "../schemas/Net.js"
import * as Api from "../services/api/Api.js"
import * as Delivery from "../services/delivery/Delivery.js"
import * as DeliveryOutcomes from "../services/delivery/DeliveryOutcomes.js"
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
import * as DatabaseHealth from "../services/platform/DatabaseHealth.js"
import * as Health from "../services/platform/Health.js"
import { SafeHttp } from "../services/platform/http/SafeHttp.js"
import * as Lifecycle from "../services/platform/Lifecycle.js"
import * as Listener from "../services/platform/Listener.js"
import { Tx } from "../services/platform/Persistence.js"
import * as RolesConfig from "../services/platform/RolesConfig.js"
import * as Backfill from "../services/reconciliation/Backfill.js"
import { Identity } from "../services/reconciliation/Identity.js"
import * as IdentityInvalidations from "../services/reconciliation/IdentityInvalidations.js"
import * as Registry from "../services/registry/Registry.js"
import * as RegistryChanges from "../services/registry/RegistryChanges.js"
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

/**
 * The delivery worker and what it needs, from the configuration. It uses the in-memory `Registry`
 * when the context has one (a 410 then drops the webhook from this process's matching at once).
 * `destinations`: the presets (SPEC §4.4; an embedding program's own, `Destinations.layerWith`),
 * the built-in ones by default.
 */
export const deliveryLayer = (
  config: FirehookConfigShape,
  destinations: Layer.Layer<Destinations> = Destinations.layer
) => {
  const allowCidrs = parseCidrs(config.delivery.allowCidrs)
  return Delivery.layer().pipe(
    Layer.provide(
      Layer.mergeAll(
        DeliveryStore.layerSql,
        RegistryStore.layerSql,
        Secrets.layerSql,
        SafeHttp.layerDefault({ allowInsecureDev: config.allowInsecureDev, allowCidrs }),
        destinations,
        Publisher.layer(publisherOptions(config)).pipe(Layer.orDie)
      )
    )
  )
}

/**
 * Registry (loaded) + Processor on the PostgreSQL stores, with the registry's change feed (which
 * intake's leader follows, RegistrySync). Requires config, health, SqlClient, PgClient.
 */
export const matchingLayer = Processor.layer().pipe(
  Layer.provideMerge(Registry.layer),
  Layer.provideMerge(RegistryChanges.layerSql),
  Layer.provideMerge(sqlStores)
)

/**
 * `E`, `R`: the API listener's error and requirements; `D`: what the delivery supervisor needs
 * beyond the core services (main's needs `Database.DatabaseUrl`); nothing when there is none, so a
 * program that provides its own `SqlClient` / `PgClient` need not provide a URL.
 */
export interface ServiceOptions<E = never, R = never, D = never> {
  /** called once with the shutdown report (main uses it for the exit code) */
  readonly onShutdown?: (report: Lifecycle.ShutdownReport) => Effect.Effect<void>
  /** the owners' API listener (SPEC §8.1, `API_HOST:API_PORT`); none: the API is not served */
  readonly api?: Layer.Layer<HttpServer.HttpServer, E, R>
  /**
   * role `delivery` in a child process (issue 16 item 2): the supervisor main builds
   * (`DeliveryProcess.supervise`) run in place of the worker; none: the worker runs in this process
   */
  readonly deliveryProcess?: Effect.Effect<void, never, Lifecycle.Lifecycle | Health.Health | Scope.Scope | D>
  /**
   * the delivery presets (SPEC §4.4: "an embedding program can add or override presets by providing
   * its own layer"), e.g. `Destinations.layerWith([...])`; the built-in ones by default. Used by
   * the worker in this process (not by a delivery child, which runs firehook's own entry point)
   */
  readonly destinations?: Layer.Layer<Destinations>
}

/** 3. The health server, in a scope of its own so that shutdown can stop it at its stage (`http`). */
const startHealthServer = <E, R>(server: Layer.Layer<HttpServer.HttpServer, E, R>, scope: Scope.Scope) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.Lifecycle
    const httpScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
    const httpContext = yield* Layer.buildWithScope(
      HttpServer.serve(Health.router).pipe(Layer.provideMerge(server)),
      httpScope
    )
    const address = yield* HttpServer.addressWith((a) => Effect.succeed(Listener.logAddress(a))).pipe(
      Effect.provide(httpContext)
    )
    yield* Effect.logInfo("health server listening").pipe(Effect.annotateLogs({ address }))
    yield* lifecycle.registerStop("http", "http", Scope.close(httpScope, Exit.void))
  })

/** 4. The registry, loaded into memory (bounded), and the matching pipeline (role `intake`). */
const startMatching = (scope: Scope.Scope) =>
  Effect.gen(function*() {
    const matching = yield* Layer.buildWithScope(matchingLayer, scope)
    const registryStats = yield* Effect.flatMap(Registry.Registry, (r) => r.stats).pipe(Effect.provide(matching))
    yield* Effect.logInfo("registry ready").pipe(Effect.annotateLogs({ active: registryStats.active }))
    return matching
  })

/**
 * 4. The parts of step 4 that the roles ask for, in the order of SPEC §6.1: the registry and the
 * matching pipeline (`intake`), the delivery worker or its child process (`delivery`, before intake), maintenance
 * (`maintenance`, one runner across replicas), identity (`reconcile`: the reconciler's DID → PDS
 * cache, built before intake, which invalidates it on `#identity`/`#account` events; it also
 * follows the events other processes' intake forwards), intake under leader election (`intake`; its
 * tuning, `WEBHOOK_INTAKE_*`, is read by Intake itself; it forwards `#identity`/`#account` events to
 * every process's identity cache). Returns the identity context, for step 5.
 */
const startParts = <E, R, D>(
  config: FirehookConfigShape,
  scope: Scope.Scope,
  options: ServiceOptions<E, R, D>,
  outcomes: Context.Context<never>
) =>
  Effect.gen(function*() {
    const runs = (role: RolesConfig.Role) => RolesConfig.runs(config.roles, role)
    const matching = runs("intake") ? Option.some(yield* startMatching(scope)) : Option.none()
    // what the later parts use when this process has it (the registry in memory), typed as nothing
    const optional: Context.Context<never> = Option.getOrElse(matching, () => Context.empty())
    if (runs("delivery")) {
      // the worker publishes its terminal outcomes to the live tail's feed (DeliveryOutcomes); with
      // a delivery child (DELIVERY_PROCESS), the child's own feed NOTIFYs them
      if (options.deliveryProcess !== undefined) yield* options.deliveryProcess.pipe(Scope.extend(scope))
      else {
        yield* Layer.buildWithScope(deliveryLayer(config, options.destinations), scope).pipe(
          Effect.provide(Context.merge(optional, outcomes))
        )
      }
    }
    if (runs("maintenance")) yield* Layer.buildWithScope(Maintenance.layer(maintenanceOptions(config)), scope)
    const identity = runs("reconcile")
      ? Option.some(yield* Layer.buildWithScope(Reconciliation.identityLayer(config), scope))
      : Option.none()
    // every identity cache follows the `#identity`/`#account` events intake commits, whichever
    // process runs intake (IdentityInvalidations)
    if (Option.isSome(identity)) {
      yield* Effect.forkIn(IdentityInvalidations.follow(Context.get(identity.value, Identity)), scope)
    }
    if (Option.isSome(matching)) {
      const withIdentity: Context.Context<never> = Option.getOrElse(identity, () => Context.empty())
      const forward = yield* IdentityInvalidations.publisher.pipe(Scope.extend(scope))
      yield* Layer.buildWithScope(Intake.layer({ onIdentity: forward }), scope).pipe(
        Effect.provide(Context.merge(matching.value, withIdentity))
      )
    }
    return { identity, optional }
  })

/**
 * 5. Role `reconcile`: the retry scheduler, then the initial backfill in the background:
 * `reconciling-live` until the first pass completes, then `live`.
 */
const startReconciliation = (
  scope: Scope.Scope,
  identity: Context.Context<Identity | SafeHttp>,
  optional: Context.Context<never>
) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle.Lifecycle
    const recon = yield* Layer.buildWithScope(Reconciliation.reconciliationLayer(), scope).pipe(
      Effect.provide(Context.merge(identity, optional))
    )
    yield* lifecycle.setPhase("reconciling-live")
    const backfill = Context.get(recon, Backfill.Backfill)
    yield* backfill.start
    yield* Effect.forkIn(backfill.awaitInitialPass.pipe(Effect.zipRight(lifecycle.setPhase("live"))), scope)
  })

/**
 * Start the parts of the process's roles (`FIREHOOK_ROLES`, SPEC §6.4) in the startup order of
 * §6.1 and register their drains: the shutdown of §6.3 covers what was started (a part that is not
 * started registers no drain). The health server runs in every process, with a `roles` section and
 * a `database` section that gates readiness on the database answering (DatabaseHealth.ts).
 * Without `reconcile` there is no initial backfill: the phase goes to `live` once the parts are
 * started. Requires the core services.
 */
export const service = <E, R, D = never>(
  server: Layer.Layer<HttpServer.HttpServer, E, R>,
  options: ServiceOptions<E, R, D> = {}
) =>
  Layer.scopedDiscard(
    // the program's own client, if it transforms column names, is used without (Database.withoutTransforms)
    Database.withoutTransforms(Effect.gen(function*() {
      const lifecycle = yield* Lifecycle.Lifecycle
      const config = yield* FirehookConfig
      const health = yield* Health.Health
      const scope = yield* Effect.scope
      yield* health.register("roles", Effect.succeed({ ready: true, body: RolesConfig.rolesBody(config.roles) }))
      // every process: readiness needs the database to answer (DatabaseHealth.ts)
      yield* DatabaseHealth.register
      yield* Effect.logInfo("roles").pipe(Effect.annotateLogs({ roles: config.roles.join(",") }))
      const startup = Effect.gen(function*() {
        // 3. the health server (every process)
        yield* startHealthServer(server, scope)
        // the live tail's feed, shared by the worker (NOTIFY) and the API (LISTEN) of this process
        const serveApi = RolesConfig.runs(config.roles, "api") && options.api !== undefined
        const notify = RolesConfig.runs(config.roles, "delivery") && options.deliveryProcess === undefined
        const outcomes = serveApi || notify
          ? Option.some(yield* Layer.buildWithScope(DeliveryOutcomes.layerSql({ notify, listen: serveApi }), scope))
          : Option.none()
        // 3b. role `api`: the owners' XRPC listener on API_HOST:API_PORT (SPEC §8.1), in a scope
        //     of its own, started right after the health listener and stopped at its stage (`http`)
        if (serveApi && options.api !== undefined && Option.isSome(outcomes)) {
          yield* Api.start(options.api, scope).pipe(Effect.provide(outcomes.value))
        }
        // 4. the registry and matching, the delivery worker, maintenance, identity, intake
        const withOutcomes: Context.Context<never> = Option.getOrElse(outcomes, () => Context.empty())
        const parts = yield* startParts(config, scope, options, withOutcomes)
        // 5. the retry scheduler and the initial backfill (`reconcile`), or `live` at once
        if (Option.isSome(parts.identity)) yield* startReconciliation(scope, parts.identity.value, parts.optional)
        else yield* lifecycle.setPhase("live")
      })
      yield* startup.pipe(Effect.tapErrorCause(() => lifecycle.setPhase("failed")))
      // Added last, so it runs first when the scope closes: the ordered, deadline-bound shutdown.
      yield* Effect.addFinalizer(() =>
        lifecycle.shutdown.pipe(Effect.flatMap((report) => options.onShutdown?.(report) ?? Effect.void))
      )
    }))
  )

/**
 * The core services every part needs: lifecycle, health, database (with migrations). `lifecycle`:
 * one made beforehand (main makes it first, so that a signal during startup reaches its shutdown).
 */
export const core = (
  config: FirehookConfigShape,
  lifecycle?: Lifecycle.LifecycleShape,
  database: Pick<Database.DatabaseOptions, "onEmbeddedExit"> = {}
) => {
  const ConfigLive = Config.layerValue(config)
  const LifecycleLive = lifecycle === undefined
    ? Lifecycle.layer({ shutdownTimeout: Duration.millis(config.shutdownTimeoutMs) })
    : Layer.succeed(Lifecycle.Lifecycle, lifecycle)
  // readiness follows the roles: the sections of the parts this process runs (SPEC §6.2, §6.4)
  const HealthLive = Health.layerWith({ required: RolesConfig.requiredSections(config.roles) }).pipe(
    Layer.provide(LifecycleLive)
  )
  return Database.layer(database).pipe(Layer.provideMerge(Layer.mergeAll(ConfigLive, LifecycleLive, HealthLive)))
}
