/**
 * Health (SPEC §6.2): `/live`, `/health`, `/metrics` on one listener; 404 for anything else.
 *
 * Health never imports the services it reports on: each service registers a section (a name and
 * an effect producing `{ ready, body }`) for the lifetime of its scope. `/health` is ready when the
 * phase is `reconciling-live` or `live`, every registered section is ready, and every section the
 * process's roles require is registered ({@link ready}; `required` comes from
 * `RolesConfig.requiredSections`): a part a process does not run registers nothing and gates
 * nothing, a part it runs gates readiness from its start. Bodies hold counts, booleans and fixed
 * enumerations only; every number is clamped to 0..1,000,000.
 */
import * as HttpRouter from "@effect/platform/HttpRouter"
import * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Context, Duration, Effect, Layer, Option, Ref } from "effect"
import type { Scope } from "effect"
import { Lifecycle, type Phase } from "./Lifecycle.js"
import * as Metrics from "./Metrics.js"

export type HealthValue = number | boolean | string | null | { readonly [k: string]: HealthValue }

export interface HealthSection {
  /** whether this part allows readiness (parts that must not gate readiness return true) */
  readonly ready: boolean
  readonly body: { readonly [k: string]: HealthValue }
}

export interface HealthReport {
  readonly ready: boolean
  readonly body: { readonly [k: string]: HealthValue }
}

export interface HealthShape {
  /** Add a section for as long as the calling scope is open. */
  readonly register: (name: string, section: Effect.Effect<HealthSection>) => Effect.Effect<void, never, Scope.Scope>
  readonly report: Effect.Effect<HealthReport>
  /**
   * Serve another process's metrics with this one's on `/metrics` for as long as the calling scope
   * is open (the delivery child's: DeliveryProcess). `source` is asked at each scrape; `None` (it
   * did not answer in time) leaves its series out of that scrape.
   */
  readonly registerMetrics: (
    source: Effect.Effect<Option.Option<Metrics.ForeignExposition>>
  ) => Effect.Effect<void, never, Scope.Scope>
  /** `/metrics`: this process's metrics and those of every registered source. */
  readonly metrics: Effect.Effect<string>
}

export class Health extends Context.Tag("firehook/Health")<Health, HealthShape>() {}

export const CLAMP_MAX = 1_000_000

/** Clamp every number to 0..1,000,000 (integers stay integers; NaN becomes 0). */
export const clamp = (v: HealthValue): HealthValue => {
  if (typeof v === "number") return Number.isNaN(v) ? 0 : Math.min(CLAMP_MAX, Math.max(0, v))
  if (v === null || typeof v !== "object") return v
  const out: { [k: string]: HealthValue } = {}
  for (const [k, x] of Object.entries(v)) out[k] = clamp(x)
  return out
}

/**
 * A section whose body is the fields `keys` of a stats value, in that order (the one way services
 * turn their stats into a section instead of copying fields one by one). `ready` decides whether it
 * allows readiness (default: always).
 */
export const statsSection = <S extends { readonly [P in K]: HealthValue }, K extends string>(
  stats: Effect.Effect<S>,
  keys: ReadonlyArray<K>,
  ready: (s: S) => boolean = () => true
): Effect.Effect<HealthSection> =>
  Effect.map(stats, (s) => {
    const body: { [k: string]: HealthValue } = {}
    for (const k of keys) body[k] = s[k]
    return { ready: ready(s), body }
  })

const READY_PHASES: ReadonlySet<Phase> = new Set(["reconciling-live", "live"])

/**
 * The readiness rule (SPEC §6.2, §6.4): the phase is `reconciling-live` or `live`, every registered
 * section is ready (`sections`: name → ready), and every `required` section is registered.
 */
export const ready = (
  phase: Phase,
  sections: ReadonlyMap<string, boolean>,
  required: ReadonlyArray<string>
): boolean =>
  READY_PHASES.has(phase) && [...sections.values()].every((r) => r) && required.every((name) => sections.has(name))

/** The longest a scrape waits for another process's metrics. */
const SOURCE_TIMEOUT = Duration.seconds(2)

export interface HealthOptions {
  /** sections that must be registered (and ready) for readiness (default none) */
  readonly required?: ReadonlyArray<string>
}

export const makeWith = (options: HealthOptions) =>
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle
    const required = options.required ?? []
    const sections = yield* Ref.make<ReadonlyMap<string, Effect.Effect<HealthSection>>>(new Map())
    const metricSources = yield* Ref.make<ReadonlyArray<Effect.Effect<Option.Option<Metrics.ForeignExposition>>>>([])
    const shape: HealthShape = {
      registerMetrics: (source) =>
        Effect.acquireRelease(
          Ref.update(metricSources, (all) => [...all, source]),
          () => Ref.update(metricSources, (all) => all.filter((s) => s !== source))
        ),
      metrics: Effect.gen(function*() {
        const sources = yield* Ref.get(metricSources)
        // each source bounds its own wait; this bound only keeps a scrape from hanging on one that does not
        const answers = yield* Effect.all(
          sources.map((source) =>
            source.pipe(Effect.timeoutTo({ duration: SOURCE_TIMEOUT, onTimeout: Option.none, onSuccess: (a) => a }))
          ),
          { concurrency: "unbounded" }
        )
        return yield* Metrics.exposeWith(answers.flatMap((a) => Option.isSome(a) ? [a.value] : []))
      }),
      register: (name, section) =>
        Effect.acquireRelease(
          Ref.update(sections, (m) => new Map(m).set(name, section)),
          () =>
            Ref.update(sections, (m) => {
              const next = new Map(m)
              next.delete(name)
              return next
            })
        ),
      report: Effect.gen(function*() {
        const phase = yield* lifecycle.phase
        const current = yield* Ref.get(sections)
        const readiness = new Map<string, boolean>()
        const body: { [k: string]: HealthValue } = {}
        const names = [...current.keys()].sort()
        for (const name of names) {
          const get = current.get(name)
          if (get === undefined) continue
          const section = yield* get
          readiness.set(name, section.ready)
          body[name] = clamp(section.body)
        }
        const isReady = ready(phase, readiness, required)
        return { ready: isReady, body: { status: isReady ? "ok" : "unavailable", phase, ...body } }
      })
    }
    return shape
  })

export const make = makeWith({})

export const layer = Layer.effect(Health, make)

/** Health with `options` (main: the sections the process's roles require). */
export const layerWith = (options: HealthOptions) => Layer.effect(Health, makeWith(options))

const NO_STORE = { "cache-control": "no-store" } as const

/** SPEC §6.2: `/live` says `live`, `stopping` from the moment shutdown begins, `failed` (503) only when failed. */
export const liveStatus = (phase: Phase): "live" | "stopping" | "failed" =>
  phase === "failed" ? "failed" : phase === "stopping" || phase === "stopped" ? "stopping" : "live"

/**
 * SPEC §6.2 "anything else → 404": paths match exactly as received, case-sensitive, without the
 * router's defaults of ignoring a trailing slash and repeated slashes (`/LIVE`, `/live/`, `//live`
 * answered 200). Only GET: every other method, HEAD too, is 404 (docs/decisions.md). Dot
 * segments (`/x/../live`) are resolved by the server's URL parser (Bun's WHATWG URL) before any
 * handler sees the path: to HTTP that is the same path (RFC 3986 §6.2.2.3).
 */
const EXACT_PATHS = { caseSensitive: true, ignoreTrailingSlash: false, ignoreDuplicateSlashes: false } as const

const NOT_FOUND = HttpServerResponse.unsafeJson({ error: "not_found" }, { status: 404 })

/**
 * The router (find-my-way) also cuts a path at `;` (`/live;x` matched `/live`), a rule of its own
 * that no option turns off: a path holding `;` before its query is another path, so 404.
 */
const exactly = <E, R>(
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>
): Effect.Effect<HttpServerResponse.HttpServerResponse, E, R | HttpServerRequest.HttpServerRequest> =>
  Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) => {
    const query = request.url.indexOf("?")
    const path = query < 0 ? request.url : request.url.slice(0, query)
    return path.includes(";") ? Effect.succeed(NOT_FOUND) : handler
  })

const routes = HttpRouter.empty.pipe(
  HttpRouter.get(
    "/live",
    exactly(Effect.gen(function*() {
      const phase = yield* (yield* Lifecycle).phase
      return HttpServerResponse.unsafeJson({ status: liveStatus(phase) }, {
        status: phase === "failed" ? 503 : 200,
        headers: NO_STORE
      })
    }))
  ),
  HttpRouter.get(
    "/health",
    exactly(Effect.gen(function*() {
      const report = yield* (yield* Health).report
      return HttpServerResponse.unsafeJson(report.body, { status: report.ready ? 200 : 503, headers: NO_STORE })
    }))
  ),
  HttpRouter.get(
    "/metrics",
    exactly(Effect.map(Effect.flatMap(Health, (h) => h.metrics), (text) =>
      HttpServerResponse.text(text, {
        contentType: "text/plain; version=0.0.4; charset=utf-8",
        headers: NO_STORE
      })))
  ),
  HttpRouter.all("*", Effect.succeed(NOT_FOUND))
)

/**
 * The app served on HEALTH_HOST:HEALTH_PORT. The router reads its matching rules when it is first
 * run and keeps them, so it is run only here, with {@link EXACT_PATHS}.
 */
export const router = HttpRouter.withRouterConfig(routes, EXACT_PATHS)
