/**
 * The owners' API configuration (SPEC §8.1, §6.5): its listener, the public URL it is reached at,
 * the service DID owners' tokens are addressed to, and whether a proxy's `X-Forwarded-For` is
 * trusted. Each variable's name, default and rule live here once; `load` reads them in this order.
 *
 * - `API_HOST` / `API_PORT` (default `127.0.0.1:3004`): an IP literal or `localhost` (the rule
 *   `HEALTH_HOST` shares).
 * - `PUBLIC_URL`: the origin (`https://host[:port]`, nothing after it but an optional `/`) at which
 *   the operator's TLS proxy serves the API; `http://` only to a loopback host in insecure
 *   development mode. No credentials, path, query or fragment: atproto clients and PDS proxies
 *   append `/xrpc/<nsid>` to the service endpoint's origin.
 * - `SERVICE_DID` (default `did:web:<host of PUBLIC_URL>`, with the port as `%3A<port>` when the
 *   URL names one, as did:web does): a canonical `did:plc`/`did:web`, or a `did:web` with a port.
 *   Without `PUBLIC_URL`, `SERVICE_DID` alone configures the API (no `/.well-known/did.json`).
 *   A `did:web` with a port on a host other than `localhost` is kept (a PDS proxying calls still
 *   resolves it), but atproto PDSes mint no service-auth tokens for it (`getServiceAuth` refuses
 *   the `aud`), so owners cannot get tokens themselves: `Api.start` logs one warning
 *   ({@link startupWarnings}).
 * - `API_TRUST_PROXY` (`0`/`1`): `1` takes the client address from the first `X-Forwarded-For` hop.
 * - The numbers of SPEC §8.2 and §8.3 (defaults as there; the SPEC's preamble makes every number
 *   configurable): the rate limits per minute (`API_AUTH_FAILURES_PER_MINUTE` per client address,
 *   `API_CALLS_PER_MINUTE` per caller DID, `API_TEST_PER_MINUTE` / `API_REPLAY_PER_MINUTE` for those
 *   two methods), the per-call deadline (`API_CALL_TIMEOUT_MS`), the procedure body bound
 *   (`API_BODY_MAX_BYTES`) and the process's `jti` cache (`API_JTI_CACHE_MAX`).
 */
import { Effect, Option } from "effect"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { isLoopbackHost } from "../../schemas/Net.js"
import {
  ConfigInvalid,
  listenHost,
  readEnumVar,
  readIntVar,
  readIntVars,
  readListenHost,
  readString,
  readStringAll,
  type StringRule,
  URL_MAX_LENGTH,
  urlLength,
  urlText
} from "../platform/ConfigRead.js"

export const apiHost = { env: "API_HOST", default: "127.0.0.1", rule: listenHost } as const

export const apiPort = { env: "API_PORT", default: 3004, min: 0, max: 65535 } as const

/** unset: the API is configured only by `SERVICE_DID` (or not at all) */
export const publicUrl = { env: "PUBLIC_URL", default: "" } as const

/** unset: `did:web:<host of PUBLIC_URL>` */
export const serviceDid = { env: "SERVICE_DID", default: "" } as const

export const trustProxy = { env: "API_TRUST_PROXY", default: "0", values: ["0", "1"] } as const

/** SPEC §8.2 / §8.3's numbers (the defaults are `RateLimiter.DEFAULT_LIMITS`, `Xrpc`'s and `ReplayCache`'s). */
export const limits = {
  authFailuresPerMinute: { env: "API_AUTH_FAILURES_PER_MINUTE", default: 30, min: 1, max: 1_000_000 },
  callsPerMinute: { env: "API_CALLS_PER_MINUTE", default: 120, min: 1, max: 1_000_000 },
  testPerMinute: { env: "API_TEST_PER_MINUTE", default: 10, min: 1, max: 1_000_000 },
  replayPerMinute: { env: "API_REPLAY_PER_MINUTE", default: 2, min: 1, max: 1_000_000 },
  callTimeoutMs: { env: "API_CALL_TIMEOUT_MS", default: 10_000, min: 1_000, max: 60_000 },
  bodyMaxBytes: { env: "API_BODY_MAX_BYTES", default: 65_536, min: 1_024, max: 1_048_576 },
  jtiCacheMax: { env: "API_JTI_CACHE_MAX", default: 100_000, min: 1_000, max: 10_000_000 }
} as const

/** The values of {@link limits}. */
export type ApiLimitsSection = { readonly [K in keyof typeof limits]: number }

/** The API's part of the configuration. */
export interface ApiSection {
  /** `API_HOST` */
  readonly host: string
  /** `API_PORT` */
  readonly port: number
  /** `PUBLIC_URL`, normalized to its origin (no trailing slash) */
  readonly publicUrl: Option.Option<string>
  /** the effective service DID: `SERVICE_DID`, else derived from `PUBLIC_URL`; None = not configured */
  readonly serviceDid: Option.Option<string>
  /** `API_TRUST_PROXY=1` */
  readonly trustProxy: boolean
  /** rate limits, deadline and bounds ({@link limits}) */
  readonly limits: ApiLimitsSection
}

/**
 * `PUBLIC_URL` normalized to its origin, or undefined when it breaks the rule: https (http only to
 * a loopback host when `insecure`), a host, no credentials, nothing after the origin but `/`.
 */
export const parsePublicUrl = (s: string, insecure: boolean): string | undefined => {
  if (s.length > URL_MAX_LENGTH || !URL.canParse(s) || s.includes("?") || s.includes("#")) return undefined
  const u = new URL(s)
  if (u.username !== "" || u.password !== "" || u.hostname.length === 0) return undefined
  if (u.pathname !== "/" && u.pathname !== "") return undefined
  if (u.protocol === "https:") return u.origin
  return u.protocol === "http:" && insecure && isLoopbackHost(u.hostname) ? u.origin : undefined
}

const DID_WEB_WITH_PORT = /^did:web:([^:%]+)%3A(\d{1,5})$/

/** A DID the API accepts as its own: canonical `did:plc`/`did:web`, or a `did:web` with `%3A<port>`. */
export const isServiceDid = (s: string): boolean => {
  if (isCanonicalDid(s)) return true
  const m = DID_WEB_WITH_PORT.exec(s)
  return m !== null && Number(m[2]) <= 65535 && isCanonicalDid(`did:web:${m[1]}`)
}

/**
 * The `did:web` of an origin's host (`did:web:example.com`, `did:web:localhost%3A3004`), or
 * undefined when the host cannot form one (an IPv6 literal, a name outside the did:web grammar).
 */
export const didWebOf = (origin: string): string | undefined => {
  if (!URL.canParse(origin)) return undefined
  const u = new URL(origin)
  const did = u.port === "" ? `did:web:${u.hostname}` : `did:web:${u.hostname}%3A${u.port}`
  return isServiceDid(did) ? did : undefined
}

/**
 * Whether atproto refuses `did` as a service token's `aud`: a `did:web` with a port whose host is
 * not `localhost` (atproto allows a port in a did:web only for localhost).
 */
export const isPortDidRefusedByPds = (did: string): boolean => {
  const m = DID_WEB_WITH_PORT.exec(did)
  return m !== null && m[1] !== "localhost"
}

/** The warning of a service DID PDSes mint no tokens for (no URL or DID value in it). */
export const SERVICE_DID_PORT_WARNING =
  "SERVICE_DID is a did:web with a port (the default for a PUBLIC_URL with a port): atproto PDSes mint " +
  "no service-auth tokens for it, so owners' CLI commands fail; set SERVICE_DID"

/** The section's startup warnings (fixed texts: never a URL or a DID); `Api.start` logs them. */
export const startupWarnings = (section: Pick<ApiSection, "serviceDid">): ReadonlyArray<string> =>
  Option.exists(section.serviceDid, isPortDidRefusedByPds) ? [SERVICE_DID_PORT_WARNING] : []

/** Logs {@link startupWarnings}, one line each. */
export const logStartupWarnings = (section: Pick<ApiSection, "serviceDid">): Effect.Effect<void> =>
  Effect.forEach(startupWarnings(section), (w) => Effect.logWarning(w), { discard: true })

const publicUrlRule = (insecure: boolean): StringRule => ({
  test: (s) => parsePublicUrl(s, insecure) !== undefined,
  text: insecure
    ? "must be an https:// origin (http:// only to a loopback host) without credentials, path, query or fragment"
    : "must be an https:// origin without credentials, path, query or fragment"
})

const serviceDidRule: StringRule = {
  test: isServiceDid,
  text: "must be a canonical did:plc or did:web (a did:web may name a port as %3A<port>), without a fragment"
}

export const load = (options: { readonly allowInsecureDev: boolean }): Effect.Effect<ApiSection, ConfigInvalid> =>
  Effect.gen(function*() {
    const host = yield* readListenHost(apiHost)
    const port = yield* readIntVar(apiPort)
    const urlValue = yield* readStringAll(publicUrl.env, publicUrl.default, [
      urlText,
      urlLength(URL_MAX_LENGTH),
      publicUrlRule(options.allowInsecureDev)
    ])
    const didText = yield* readString(serviceDid.env, serviceDid.default, serviceDidRule)
    const trust = yield* readEnumVar(trustProxy)
    const numbers = yield* readIntVars(limits)
    const url = urlValue === "" ? undefined : parsePublicUrl(urlValue, options.allowInsecureDev)
    let did: string | undefined = didText === "" ? undefined : didText
    if (did === undefined && url !== undefined) {
      did = didWebOf(url)
      if (did === undefined) {
        return yield* Effect.fail(
          new ConfigInvalid({
            variable: publicUrl.env,
            rule: "has a host that cannot form a did:web (an IP v6 literal?): set SERVICE_DID"
          })
        )
      }
    }
    return {
      host,
      port,
      publicUrl: Option.fromNullable(url),
      serviceDid: Option.fromNullable(did),
      trustProxy: trust === "1",
      limits: numbers
    }
  })
