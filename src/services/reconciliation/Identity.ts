/**
 * Identity (SPEC §5.1): DID → PDS endpoint and `#atproto` signing key (SPEC §8.2), with a bounded
 * cache of the validated parts of DID documents.
 *
 * - `did:plc:<id>` → `GET <PLC_DIRECTORY_URL>/<did>`; `did:web:<host>` →
 *   `https://<host>/.well-known/did.json`; `did:web:<host>:<p1>:<p2>` → `https://<host>/p1/p2/did.json`.
 *   Every request goes through {@link SafeHttp} (10 s, 1 MiB).
 * - The document is decoded with a Schema; its `id` must be the DID asked for. The PDS is the first
 *   service whose id ends with `#atproto_pds` and whose type is `AtprotoPersonalDataServer`; its
 *   endpoint must pass the URL rules (SPEC §1.2: https and public; http/loopback only in insecure
 *   development mode), so a document pointing at a private address is refused before any PDS call.
 *   The signing key is the first `#atproto` verification method with a multibase key
 *   ({@link atprotoSigningKey}); the owners' API verifies service tokens with it.
 * - Cache: at most `maxEntries` DIDs (least recently used evicted). An entry older than `staleAfter`
 *   (`IDENTITY_CACHE_STALE_MS`, default 1 h; `expireAfter`: `IDENTITY_CACHE_MAX_AGE_MS`, default 24 h)
 *   is served and refreshed in the background (one refresh per DID, at most
 *   `maxBackgroundRefreshes` at a time, fibers owned by the layer's scope); older than
 *   `expireAfter` it is fetched again before answering. `invalidate(did)` drops the entry (intake
 *   calls it on `#identity`/`#account` events, the reconciler on "repo not found"); a lookup that
 *   started before an invalidation, in the background or in the foreground, never writes its
 *   (possibly stale) answer back (a foreground one still answers its own caller).
 * - Concurrent foreground lookups of one DID share one fetch (its callers wait for the same answer,
 *   success or failure); the fetch runs in a fiber of the layer's scope, so a caller that gives up
 *   does not cancel it for the others (the transport's timeout bounds it). A lookup begun after an
 *   invalidation does not join a fetch begun before it.
 * - What is cached is a fetched, valid document's parts: its PDS (or why it has none usable:
 *   `no_pds` / `pds_unsafe`, answered from the cache like the PDS itself) and its signing key.
 *   A failed fetch is never cached. Times come from the Effect `Clock`.
 * - `isCached(did)` says, without fetching or touching the LRU order, whether a normal lookup of
 *   `did` would make no fetch of its own (the owners' API charges its lookup budget by it).
 * - `resolveSigningKey(did, { fresh: true })` is the verifier's "fetch once more" after a signature
 *   failed with the cached key (the owner may have rotated it): it fetches the document again, in
 *   the foreground, unless this DID's document was fetched (or such a refetch began) within the
 *   last {@link FRESH_REFETCH_MIN_INTERVAL_MS}, so forged tokens cannot make firehook hammer a
 *   PLC directory or a did:web host.
 *
 * - A document host (the PLC directory, a did:web host) that answers 429 or 503 with `Retry-After`
 *   is held for that long (at most an hour; scheme, host and port of the document's URL, in a
 *   {@link PdsCooldown} of this layer's own): until then no DID on it is fetched, in the foreground
 *   or the background, and a lookup that would fetch fails at once as `identity_unavailable` with
 *   `held` and the time left (`retryAfterMs`; the fetch that met the 429 carries the whole wait).
 *   A sweep over a cold cache thus sends a rate-limited directory one request, not one per owner;
 *   the reconciler fails such owners as `identity_cooling` and the retry scheduler waits the time
 *   left. A held lookup is not counted in `firehook_identity_failures_total` (nothing was fetched).
 *
 * Errors are kinds only ({@link IdentityError}): never the DID document, the endpoint or a URL.
 */
import { Clock, Context, Data, Deferred, Duration, Effect, Either, FiberSet, Layer, Metric } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { atprotoSigningKey, DidDocument, pdsEndpoint, type SigningKey } from "../../schemas/DidDocument.js"
import { validateWebhookUrl } from "../../schemas/WebhookUrl.js"
import { decodeJsonBody } from "../../schemas/Xrpc.js"
import { FirehookConfig } from "../platform/Config.js"
import { parseRetryAfter } from "../platform/http/RetryAfter.js"
import { MAX_SERVICE_URL_LENGTH, SafeHttp } from "../platform/http/SafeHttp.js"
import * as PdsCooldown from "./PdsCooldown.js"
import * as Metrics from "./ReconcileMetrics.js"
import * as ReconciliationConfig from "./ReconciliationConfig.js"

/** Why a DID could not be resolved (kinds only). */
export const IDENTITY_ERROR_KINDS = [
  /** not a canonical did:plc / did:web */
  "invalid_did",
  /** the directory or host says the DID does not exist (404 / 410) */
  "did_not_found",
  /** transport failure, timeout, or another status */
  "identity_unavailable",
  /** not a DID document for this DID */
  "identity_invalid",
  /** no `#atproto_pds` service of type `AtprotoPersonalDataServer` */
  "no_pds",
  /** the PDS endpoint breaks the URL rules (scheme, private address, credentials, query …) */
  "pds_unsafe"
] as const
export type IdentityErrorKind = (typeof IDENTITY_ERROR_KINDS)[number]

export class IdentityError extends Data.TaggedError("IdentityError")<{
  readonly kind: IdentityErrorKind
  /**
   * the document host's wait (ms): its `Retry-After` on a 429 or 503 (`identity_unavailable`), or
   * what is left of it when the host was not asked (`held`)
   */
  readonly retryAfterMs?: number | undefined
  /** true: no request was made, the document's host is cooling down after its `Retry-After` */
  readonly held?: boolean | undefined
}> {
  override get message(): string {
    return `identity resolution failed: ${this.kind}`
  }
}

export interface IdentityOptions {
  readonly staleAfter?: Duration.DurationInput
  readonly expireAfter?: Duration.DurationInput
  readonly maxEntries?: number
  readonly maxBackgroundRefreshes?: number
  readonly timeoutMs?: number
  readonly maxResponseBytes?: number
}

/** The SPEC §5.1 defaults of `IDENTITY_CACHE_STALE_MS` and `IDENTITY_CACHE_MAX_AGE_MS`. */
export const DEFAULT_STALE_AFTER = Duration.millis(ReconciliationConfig.identity.cacheStaleMs.default)
export const DEFAULT_EXPIRE_AFTER = Duration.millis(ReconciliationConfig.identity.cacheMaxAgeMs.default)
export const DEFAULT_MAX_ENTRIES = 10_000
export const DEFAULT_MAX_BACKGROUND_REFRESHES = 16
export const IDENTITY_TIMEOUT_MS = 10_000
/** A forced refetch (`fresh`) within this long of the last fetch of the DID serves the cache. */
export const FRESH_REFETCH_MIN_INTERVAL_MS = 10_000
export const IDENTITY_MAX_RESPONSE_BYTES = 1024 * 1024

export interface IdentityStats {
  readonly entries: number
  readonly hits: number
  readonly misses: number
  readonly refreshes: number
  readonly failures: number
}

export interface IdentityShape {
  /** The PDS base URL (`scheme://host[:port][/path]`, no trailing slash) of a DID. */
  readonly resolvePds: (did: string) => Effect.Effect<string, IdentityError>
  /**
   * The `#atproto` signing key of a DID (`undefined`: its document publishes none). `fresh`: fetch
   * the document once more (after a signature failed with the cached key).
   */
  readonly resolveSigningKey: (
    did: string,
    options?: { readonly fresh?: boolean }
  ) => Effect.Effect<SigningKey | undefined, IdentityError>
  /**
   * Whether a (non-`fresh`) `resolveSigningKey` / `resolvePds` of `did` made now would make no
   * fetch of its own: its document is cached and not expired, or a foreground fetch of it is in
   * flight (the lookup would join it). Reads only: no fetch, no change to the LRU order. The
   * answer may be stale by the time a lookup runs (an eviction in between: one fetch the caller
   * did not expect). Optional for fakes: a caller treats an Identity without it as "never cached".
   */
  readonly isCached?: (did: string) => Effect.Effect<boolean>
  /** Forget what is cached for `did` (an `#identity` / `#account` event, or "repo not found"). */
  readonly invalidate: (did: string) => Effect.Effect<void>
  readonly stats: Effect.Effect<IdentityStats>
}

export class Identity extends Context.Tag("firehook/Identity")<Identity, IdentityShape>() {}

/** The parts of one fetched, valid DID document that firehook uses. */
interface Resolved {
  /** the PDS base URL, or why the document has none usable */
  readonly pds: Either.Either<string, "no_pds" | "pds_unsafe">
  readonly key: SigningKey | undefined
}

interface Entry {
  readonly resolved: Resolved
  readonly fetchedAt: number
  refreshing: boolean
  /** when a forced refetch of this DID began (`fresh`) */
  forcedAt: number | undefined
}

/**
 * A foreground fetch in flight, shared by every caller that asks for its DID meanwhile;
 * `invalidated` once its DID is invalidated after it started (its answer is then not cached, and a
 * later caller starts a fetch of its own).
 */
interface Flight {
  readonly answer: Deferred.Deferred<Resolved, IdentityError>
  invalidated: boolean
}

/** The document URL of a canonical DID (pure). */
export const didDocumentUrl = (did: string, plcDirectoryUrl: string): string | undefined => {
  if (!isCanonicalDid(did)) return undefined
  if (did.startsWith("did:plc:")) return `${plcDirectoryUrl}/${did}`
  if (did.startsWith("did:web:")) {
    const [host, ...path] = did.slice("did:web:".length).split(":")
    if (host === undefined || host.length === 0) return undefined
    return path.length === 0 ? `https://${host}/.well-known/did.json` : `https://${host}/${path.join("/")}/did.json`
  }
  return undefined
}

/**
 * The PDS base URL from an endpoint string, if it passes the URL rules (SPEC §1.2 / §5.1):
 * origin plus path without trailing slashes; no query.
 */
export const normalizePdsEndpoint = (endpoint: string, allowInsecureDev: boolean): string | undefined => {
  const checked = validateWebhookUrl(endpoint, { allowInsecureDev })
  if (Either.isLeft(checked)) return undefined
  const url = checked.right
  if (url.search.length > 0) return undefined
  const path = url.pathname.replace(/\/+$/, "")
  return `${url.origin}${path}`
}

export const make = (options: IdentityOptions = {}) =>
  Effect.gen(function*() {
    const config = yield* FirehookConfig
    const http = yield* SafeHttp
    const refreshers = yield* FiberSet.make<void, never>()
    // foreground fetches: owned by the layer's scope, so a caller that gives up (its deadline) does
    // not cancel a fetch that other callers share; each is bounded by the transport's timeout
    const fetchers = yield* FiberSet.make<void, never>()
    // `IDENTITY_CACHE_STALE_MS` / `IDENTITY_CACHE_MAX_AGE_MS` (defaults DEFAULT_STALE_AFTER /
    // DEFAULT_EXPIRE_AFTER); an explicit option wins
    const staleMs = Duration.toMillis(
      Duration.decode(options.staleAfter ?? Duration.millis(config.identity.cacheStaleMs))
    )
    const expireMs = Duration.toMillis(
      Duration.decode(options.expireAfter ?? Duration.millis(config.identity.cacheMaxAgeMs))
    )
    const maxEntries = Math.max(1, Math.floor(options.maxEntries ?? DEFAULT_MAX_ENTRIES))
    const maxRefreshes = Math.max(0, Math.floor(options.maxBackgroundRefreshes ?? DEFAULT_MAX_BACKGROUND_REFRESHES))
    const timeoutMs = options.timeoutMs ?? IDENTITY_TIMEOUT_MS
    const maxResponseBytes = options.maxResponseBytes ?? IDENTITY_MAX_RESPONSE_BYTES
    const insecure = config.allowInsecureDev

    const cache = new Map<string, Entry>()
    // the document hosts (PLC directory, did:web hosts) that asked for time (PdsCooldown.ts)
    const cooldown = PdsCooldown.make()
    // foreground fetches in flight, one per DID (emptied as they end)
    const flights = new Map<string, Flight>()
    let hits = 0
    let misses = 0
    let refreshes = 0
    let failures = 0

    const fail = (kind: IdentityErrorKind) => Effect.fail(new IdentityError({ kind }))
    const countFailure = (kind: IdentityErrorKind) =>
      Effect.sync(() => void failures++).pipe(Effect.zipRight(Metric.increment(Metrics.identityFailures({ kind }))))

    /** Fetch and validate the document: its PDS (or why not) and its signing key. */
    const fetchDocument = (did: string): Effect.Effect<Resolved, IdentityError> =>
      Effect.gen(function*() {
        const url = didDocumentUrl(did, config.backfill.plcDirectoryUrl)
        if (url === undefined) return yield* fail("invalid_did")
        // the host asked for time (a Retry-After to another DID's fetch): not asked until it has passed
        const held = cooldown.remaining(url, yield* Clock.currentTimeMillis)
        if (held !== undefined) {
          return yield* Effect.fail(new IdentityError({ kind: "identity_unavailable", retryAfterMs: held, held: true }))
        }
        const response = yield* http
          .request({
            url,
            method: "GET",
            headers: { accept: "application/did+ld+json, application/json" },
            timeoutMs,
            maxResponseBytes,
            // a did:web of up to 2,048 characters (SPEC §1.1) makes a longer did.json URL
            maxUrlLength: MAX_SERVICE_URL_LENGTH
          })
          .pipe(Effect.mapError(() => new IdentityError({ kind: "identity_unavailable" })))
        if (response.status === 404 || response.status === 410) return yield* fail("did_not_found")
        if (response.status < 200 || response.status > 299) {
          // a directory (or did:web host) that asks for time gets it: no DID on that host is looked
          // up until it has passed (a sweep over a cold cache would otherwise ask once per owner)
          const now = yield* Clock.currentTimeMillis
          const retryAfterMs = response.status === 429 || response.status === 503
            ? parseRetryAfter(response.headers["retry-after"], now)
            : undefined
          if (retryAfterMs !== undefined) cooldown.note(url, now, retryAfterMs)
          return yield* Effect.fail(
            new IdentityError(
              retryAfterMs === undefined
                ? { kind: "identity_unavailable" }
                : { kind: "identity_unavailable", retryAfterMs }
            )
          )
        }
        const doc = decodeJsonBody(DidDocument, response.body)
        if (doc === undefined || doc.id !== did) return yield* fail("identity_invalid")
        const endpoint = pdsEndpoint(doc)
        const pds = endpoint === undefined ? undefined : normalizePdsEndpoint(endpoint, insecure)
        const resolved: Resolved = {
          pds: endpoint === undefined
            ? Either.left("no_pds")
            : pds === undefined
            ? Either.left("pds_unsafe")
            : Either.right(pds),
          key: atprotoSigningKey(doc)
        }
        if (Either.isLeft(resolved.pds)) yield* countFailure(resolved.pds.left)
        return resolved
      }).pipe(
        // a host that was not asked (cooling down) made no fetch that failed
        Effect.tapError((e) => (e.held === true ? Effect.void : countFailure(e.kind))),
        Effect.withSpan("Identity.fetch")
      )

    const store = (did: string, resolved: Resolved, fetchedAt: number) => {
      cache.delete(did)
      while (cache.size >= maxEntries) {
        const oldest = cache.keys().next()
        if (oldest.done === true) break
        cache.delete(oldest.value)
      }
      cache.set(did, { resolved, fetchedAt, refreshing: false, forcedAt: undefined })
    }

    /** Background refresh of a stale entry: writes back only if the entry is still the same object. */
    const refresh = (did: string, entry: Entry) =>
      fetchDocument(did).pipe(
        Effect.flatMap((resolved) =>
          Effect.flatMap(Clock.currentTimeMillis, (now) =>
            Effect.sync(() => {
              refreshes++
              if (cache.get(did) === entry) store(did, resolved, now)
            }))
        ),
        Effect.catchAll(() =>
          // keep serving the stale entry until it expires; allow another refresh later
          Effect.sync(() => {
            entry.refreshing = false
          })
        )
      )

    /**
     * A foreground fetch, cached unless `did` was invalidated while it ran. Concurrent callers for
     * one DID share one fetch (a burst of calls from a new owner is one request to its directory).
     */
    const lookup = (did: string): Effect.Effect<Resolved, IdentityError> =>
      Effect.gen(function*() {
        const current = flights.get(did)
        if (current !== undefined && !current.invalidated) return yield* Deferred.await(current.answer)
        const flight: Flight = { answer: yield* Deferred.make<Resolved, IdentityError>(), invalidated: false }
        flights.set(did, flight)
        yield* FiberSet.run(
          fetchers,
          fetchDocument(did).pipe(
            Effect.tap((resolved) =>
              Effect.flatMap(Clock.currentTimeMillis, (fetchedAt) =>
                Effect.sync(() => {
                  if (!flight.invalidated) store(did, resolved, fetchedAt)
                }))
            ),
            Effect.onExit((exit) =>
              Effect.zipRight(
                Effect.sync(() => {
                  if (flights.get(did) === flight) flights.delete(did)
                }),
                Deferred.done(flight.answer, exit)
              )
            ),
            Effect.ignore
          )
        )
        return yield* Deferred.await(flight.answer)
      })

    /** The cached (or fetched) parts of a DID's document. */
    const resolve = (did: string): Effect.Effect<Resolved, IdentityError> =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const entry = cache.get(did)
        if (entry !== undefined) {
          const age = now - entry.fetchedAt
          if (age < expireMs) {
            // most recently used last
            cache.delete(did)
            cache.set(did, entry)
            hits++
            if (age >= staleMs && !entry.refreshing && (yield* FiberSet.size(refreshers)) < maxRefreshes) {
              entry.refreshing = true
              yield* FiberSet.run(refreshers, refresh(did, entry))
              yield* Metric.increment(Metrics.identityLookups({ result: "stale" }))
            } else {
              yield* Metric.increment(Metrics.identityLookups({ result: "hit" }))
            }
            return entry.resolved
          }
          cache.delete(did)
        }
        misses++
        yield* Metric.increment(Metrics.identityLookups({ result: "miss" }))
        return yield* lookup(did)
      })

    const resolvePds = (did: string): Effect.Effect<string, IdentityError> =>
      resolve(did).pipe(
        Effect.flatMap((r) =>
          Either.match(r.pds, { onLeft: (kind) => fail(kind), onRight: (pds) => Effect.succeed(pds) })
        ),
        Effect.withSpan("Identity.resolvePds")
      )

    /** A forced refetch, unless this DID's document was fetched, or one began, within the interval. */
    const refetch = (did: string): Effect.Effect<Resolved, IdentityError> =>
      Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const entry = cache.get(did)
        if (entry !== undefined) {
          const recent = Math.max(entry.fetchedAt, entry.forcedAt ?? entry.fetchedAt)
          if (now - recent < FRESH_REFETCH_MIN_INTERVAL_MS) return entry.resolved
          entry.forcedAt = now
        }
        misses++
        yield* Metric.increment(Metrics.identityLookups({ result: "miss" }))
        return yield* lookup(did)
      })

    const resolveSigningKey = (did: string, options: { readonly fresh?: boolean } = {}) =>
      (options.fresh === true ? refetch(did) : resolve(did)).pipe(
        Effect.map((r) => r.key),
        Effect.withSpan("Identity.resolveSigningKey")
      )

    const invalidate = (did: string) =>
      Effect.sync(() => {
        cache.delete(did)
        const flight = flights.get(did)
        if (flight !== undefined) {
          flight.invalidated = true
          flights.delete(did)
        }
      })

    const isCached = (did: string) =>
      Effect.map(Clock.currentTimeMillis, (now) => {
        const entry = cache.get(did)
        if (entry !== undefined && now - entry.fetchedAt < expireMs) return true
        const flight = flights.get(did)
        return flight !== undefined && !flight.invalidated
      })

    const shape: IdentityShape = {
      resolvePds,
      resolveSigningKey,
      isCached,
      invalidate,
      stats: Effect.sync(() => ({ entries: cache.size, hits, misses, refreshes, failures }))
    }
    return shape
  })

/** The identity service. Requires the configuration and the SSRF-safe transport. */
export const layer = (options: IdentityOptions = {}): Layer.Layer<Identity, never, FirehookConfig | SafeHttp> =>
  Layer.scoped(Identity, make(options))
