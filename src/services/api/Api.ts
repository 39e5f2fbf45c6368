/**
 * The owners' API (SPEC §8): the service that holds the pipeline's state (the verifier with its
 * replay cache, the rate limiters, the counters), registers the `api` health section
 * (`configured`, `calls`, `authFailures`, `rateLimited`: counts only), and serves the HTTP app
 * ({@link Xrpc.app}) on its own listener (`API_HOST:API_PORT`), which stops at the shutdown stage
 * of the health listener (`http`, SPEC §6.3).
 *
 * The method table is a parameter: {@link SERVED_METHODS} is what firehook serves; a method is
 * added by adding its entry (`Methods.method(contract, handler)`), and every generic test (the
 * lexicon check, the random-input property test) covers it from then on.
 */
import * as HttpServer from "@effect/platform/HttpServer"
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import type * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import type * as PgClient from "@effect/sql-pg/PgClient"
import type * as SqlClient from "@effect/sql/SqlClient"
import { Context, Duration, Effect, ExecutionStrategy, Exit, Layer, Option, Scope } from "effect"
import type { DeliveryOutcomes } from "../delivery/DeliveryOutcomes.js"
import { Secrets } from "../delivery/Secrets.js"
import * as Outbox from "../matching/Outbox.js"
import type { OutboxStore } from "../matching/Outbox.js"
import * as Operator from "../operator/Operator.js"
import * as WebhookState from "../operator/WebhookState.js"
import { FirehookConfig, type FirehookConfigShape } from "../platform/Config.js"
import { Health, statsSection } from "../platform/Health.js"
import { SafeHttp } from "../platform/http/SafeHttp.js"
import { Lifecycle } from "../platform/Lifecycle.js"
import * as Listener from "../platform/Listener.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import * as IdentityService from "../reconciliation/Identity.js"
import * as IdentityInvalidations from "../reconciliation/IdentityInvalidations.js"
import * as RegistryStore from "../registry/RegistryStore.js"
import * as RejectedStoreModule from "../registry/RejectedStore.js"
import type { RejectedStore } from "../registry/RejectedStore.js"
import * as ApiConfig from "./ApiConfig.js"
import { ApiLog } from "./ApiLog.js"
import { DELIVERY_METHODS } from "./DeliveryMethods.js"
import * as Jti from "./JtiStore.js"
import { JtiStore } from "./JtiStore.js"
import type { ApiMethod, MethodTable } from "./Methods.js"
import { type ApiLimits, DEFAULT_LIMITS, makeBuckets } from "./RateLimiter.js"
import { SECRET_METHODS } from "./SecretMethods.js"
import * as ServiceAuth from "./ServiceAuth.js"
import * as TailHub from "./Tail.js"
import { Tail } from "./Tail.js"
import { TAIL_METHODS } from "./TailMethods.js"
import { WEBHOOK_METHODS } from "./WebhookMethods.js"
import * as Xrpc from "./Xrpc.js"

/** What the served methods need (their production drivers: {@link methodsLayerSql}). */
export type ServedRequirements =
  | Secrets
  | Operator.Operator
  | OutboxStore
  | RegistryStore.RegistryStore
  | Tail
  | WebhookState.WebhookStateStore
  | RejectedStore
  | FirehookConfig

/** The methods firehook serves today (SPEC §8.4, §8.5). */
export const SERVED_METHODS: MethodTable<ServedRequirements> = [
  ...SECRET_METHODS,
  ...DELIVERY_METHODS,
  ...TAIL_METHODS,
  ...WEBHOOK_METHODS
]

/**
 * The stores the served methods use, on PostgreSQL (the secret store's keyring from the
 * configuration, which the caller provides); the live tail's hub (`Tail`) is the API layer's own.
 */
export const methodsLayerSql: Layer.Layer<
  Exclude<ServedRequirements, Tail | FirehookConfig>,
  never,
  FirehookConfig | SqlClient.SqlClient
> = Layer.mergeAll(
  Secrets.layerSql,
  Operator.layer,
  Outbox.layerSql,
  RegistryStore.layerSql,
  WebhookState.layerSql,
  RejectedStoreModule.layerSql
)

export interface ApiStats {
  readonly configured: boolean
  readonly calls: number
  readonly authFailures: number
  readonly rateLimited: number
}

export interface ApiShape {
  /** the HTTP app of the API listener */
  readonly app: Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    never,
    HttpServerRequest.HttpServerRequest | Scope.Scope
  >
  readonly stats: Effect.Effect<ApiStats>
}

export class Api extends Context.Tag("firehook/Api")<Api, ApiShape>() {}

/** What a caller sets over the configuration's values (`API_*`, SPEC §8.2's and §8.3's by default). */
export interface ApiOptions {
  /** the rate limits (default the configuration's) */
  readonly limits?: Partial<ApiLimits>
  /** per call — default `API_CALL_TIMEOUT_MS` */
  readonly deadline?: Duration.DurationInput
  /** procedure bodies — default `API_BODY_MAX_BYTES` */
  readonly maxBodyBytes?: number
  /** jti replay cache entries — default `API_JTI_CACHE_MAX` */
  readonly replayCapacity?: number
}

/** The rate limits of a configuration (`API_*_PER_MINUTE`); the key bound is {@link DEFAULT_LIMITS}'. */
export const limitsOf = (section: ApiConfig.ApiLimitsSection): ApiLimits => ({
  ...DEFAULT_LIMITS,
  failedAuthPerAddress: { limit: section.authFailuresPerMinute, perMs: MINUTE_MS },
  callsPerCaller: { limit: section.callsPerMinute, perMs: MINUTE_MS },
  methodRates: {
    "dev.firehook.webhook.test": { limit: section.testPerMinute, perMs: MINUTE_MS },
    "dev.firehook.webhook.replay": { limit: section.replayPerMinute, perMs: MINUTE_MS }
  }
})

const MINUTE_MS = 60_000

/** `/.well-known/did.json` (SPEC §8.1), when the service DID is the did:web of `PUBLIC_URL`. */
export const didDocumentOf = (api: FirehookConfigShape["api"]): unknown => {
  if (Option.isNone(api.publicUrl) || Option.isNone(api.serviceDid)) return undefined
  if (ApiConfig.didWebOf(api.publicUrl.value) !== api.serviceDid.value) return undefined
  return {
    "@context": ["https://www.w3.org/ns/did/v1"],
    id: api.serviceDid.value,
    service: [{ id: `#${ServiceAuth.SERVICE_ID}`, type: "FirehookService", serviceEndpoint: api.publicUrl.value }]
  }
}

export const make = <R>(methods: MethodTable<R>, options: ApiOptions = {}) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const health = yield* Health
    const context = yield* Effect.context<R>()
    const limits: ApiLimits = { ...limitsOf(config.api.limits), ...options.limits }
    // the replay store shared by the replicas, when the process has one (layerSql)
    const shared = yield* Effect.serviceOption(JtiStore)
    const auth = Option.isSome(config.api.serviceDid)
      ? yield* ServiceAuth.make({
        serviceDid: config.api.serviceDid.value,
        replayCapacity: options.replayCapacity ?? config.api.limits.jtiCacheMax,
        ...(Option.isSome(shared) ? { sharedReplay: shared.value } : {})
      })
      : undefined
    const counters: Xrpc.ApiCounters = { calls: 0, authFailures: 0, rateLimited: 0 }
    // recurring warnings of the pipeline and of the methods (ApiLog): once a minute per kind
    const log = RateLimitedLog.make()
    const byNsid = new Map<string, ApiMethod<R>>()
    for (const m of methods) byNsid.set(m.contract.nsid, m)
    const deps: Xrpc.PipelineDeps<R> = {
      methods: byNsid,
      auth,
      trustProxy: config.api.trustProxy,
      didDocument: didDocumentOf(config.api),
      limiters: {
        failedAuth: makeBuckets(limits.failedAuthPerAddress, limits.maxKeys),
        calls: makeBuckets(limits.callsPerCaller, limits.maxKeys),
        methods: new Map(
          Object.entries(limits.methodRates).map(([nsid, rate]) => [nsid, makeBuckets(rate, limits.maxKeys)])
        )
      },
      counters,
      log,
      deadline: Duration.decode(options.deadline ?? Duration.millis(config.api.limits.callTimeoutMs)),
      maxBodyBytes: options.maxBodyBytes ?? config.api.limits.bodyMaxBytes
    }
    const stats = Effect.sync((): ApiStats => ({ configured: auth !== undefined, ...counters }))
    yield* health.register("api", statsSection(stats, ["configured", "calls", "authFailures", "rateLimited"]))
    // the request's own services win over the layer's: above all its Scope (the layer's context
    // holds the layer's scope, and what a call acquires must be released when the call ends)
    const app = Xrpc.app(deps).pipe(
      Effect.mapInputContext((request: Context.Context<HttpServerRequest.HttpServerRequest | Scope.Scope>) =>
        Context.merge(Context.add(context, ApiLog, log), request)
      )
    )
    const shape: ApiShape = { app, stats }
    return shape
  })

/** The API over `methods`. Requires what the methods need, the configuration, health and Identity. */
export const layer = <R>(methods: MethodTable<R>, options: ApiOptions = {}) => Layer.scoped(Api, make(methods, options))

/**
 * The served API with its production dependencies: the secret store on PostgreSQL (keyring from
 * the configuration), the replay store shared by the replicas (`api_jti`), the live tail's hub over
 * the process's `DeliveryOutcomes`, and an Identity of its own (its own cache, over its own
 * SSRF-safe transport) that follows the identity invalidations intake sends (`firehook_identity`).
 */
export const layerSql = (
  config: FirehookConfigShape,
  options: ApiOptions = {}
): Layer.Layer<
  Api,
  never,
  FirehookConfig | Health | SqlClient.SqlClient | PgClient.PgClient | DeliveryOutcomes
> => {
  const identity = IdentityService.layer().pipe(
    Layer.provide(SafeHttp.layerDefault({ allowInsecureDev: config.allowInsecureDev, allowCidrs: [] }))
  )
  const following = Layer.scopedDiscard(
    Effect.flatMap(IdentityService.Identity, (id) => Effect.forkScoped(IdentityInvalidations.follow(id)))
  )
  return layer(SERVED_METHODS, options).pipe(
    Layer.provide(
      Layer.mergeAll(methodsLayerSql, Jti.layerSql, TailHub.layer(), following.pipe(Layer.provideMerge(identity)))
    )
  )
}

/** Serve the {@link Api} on `server`. */
export const serve = <A, E, R>(server: Layer.Layer<A | HttpServer.HttpServer, E, R>) =>
  Layer.unwrapEffect(Effect.map(Api, (api) => HttpServer.serve(api.app))).pipe(Layer.provideMerge(server))

/**
 * Start the API listener (SPEC §8.1) on `server`, in a scope of its own forked from `scope`, and
 * register its stop at the `http` stage of the shutdown (with the health listener): open live
 * tails are closed with it. Requires the core services (configuration, health, lifecycle,
 * database) and the process's `DeliveryOutcomes`.
 */
export const start = <E, R>(server: Layer.Layer<HttpServer.HttpServer, E, R>, scope: Scope.Scope) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const lifecycle = yield* Lifecycle
    yield* ApiConfig.logStartupWarnings(config.api)
    const apiScope = yield* Scope.fork(scope, ExecutionStrategy.sequential)
    const context = yield* Layer.buildWithScope(serve(server).pipe(Layer.provide(layerSql(config))), apiScope)
    const address = yield* HttpServer.addressWith((a) => Effect.succeed(Listener.logAddress(a))).pipe(
      Effect.provide(context)
    )
    yield* Effect.logInfo("api server listening").pipe(
      Effect.annotateLogs({ address, configured: Option.isSome(config.api.serviceDid) })
    )
    yield* lifecycle.registerStop("http", "api-http", Scope.close(apiScope, Exit.void))
  })
