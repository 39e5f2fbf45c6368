/**
 * The owners' API client behind `firehook hooks status|deliveries|show|…|secrets` (SPEC §8.6).
 *
 * - The service is `--service URL` / `FIREHOOK_SERVICE_URL` (an origin: https://, or http:// to a
 *   loopback host); its DID is `--service-did` / `FIREHOOK_SERVICE_DID`, else read from the
 *   service's `/.well-known/did.json` (before signing in: a wrong service costs no password use),
 *   and then only the did:web of the URL's host and port is taken: a service that names another
 *   DID there would get tokens addressed to that other service (`ServiceDidMismatch`, exit 1).
 * - Every call gets its own service token from the owner's PDS (`getServiceAuth`, aud = the service
 *   DID, lxm = the method, 60 s), sent as `Authorization: Bearer` and never printed or logged.
 * - Parameters and bodies are checked with the method's Effect Schema (the lexicon) BEFORE signing
 *   in (a bad argument is `HooksInvalid`: exit code 2); responses are decoded with it.
 * - Every request is bounded (`DEFAULT_API_TIMEOUT`), redirects are not followed (the token goes to
 *   the named service only), response bodies are read up to `MAX_RESPONSE_BYTES`.
 * - A refusal is `ApiFailed` (exit code 1): the XRPC error name and the service's message, one line.
 *
 * @since 0.1.0
 */
import { Data, Duration, Effect, Option, ParseResult, Redacted, Schema } from "effect"
import { DidDocument } from "../schemas/DidDocument.js"
import type { XrpcContract } from "../schemas/XrpcContract.js"
import { didWebOf, isServiceDid, parsePublicUrl } from "../services/api/ApiConfig.js"
import { type HooksInvalid, invalid } from "./HookErrors.js"
import type { HooksFailed, HooksShape } from "./HookRecords.js"

// ---------------------------------------------------------------------------------------------
// Bounds

/** every request to the service is bounded by this */
export const DEFAULT_API_TIMEOUT = Duration.seconds(20)
/** response bodies are read up to this many bytes */
export const MAX_RESPONSE_BYTES = 8 * 1024 * 1024
/** the service's DID document is read up to this many bytes */
export const MAX_DID_DOCUMENT_BYTES = 64 * 1024
/** a server message is shown up to this many characters */
const MAX_MESSAGE_LENGTH = 300

// ---------------------------------------------------------------------------------------------
// Errors

/** The service refused a call, or could not be reached (the CLI's exit code 1). Never a token. */
export class ApiFailed extends Data.TaggedError("ApiFailed")<{
  /** the XRPC error name (`NotFound`, `InvalidToken`, …), or a client-side kind */
  readonly error: string
  readonly status: number | undefined
  readonly text: string
}> {
  override get message(): string {
    return this.text
  }
}

/** Printable, one line, bounded: a value from the network never moves the terminal. */
export const printable = (s: string, max = MAX_MESSAGE_LENGTH): string =>
  s.replace(/[\u0000-\u001f\u007f-\u009f]+/g, " ").trim().slice(0, max)

const errorName = (s: string): string => {
  const clean = s.replace(/[^A-Za-z0-9_.-]/g, "").slice(0, 64)
  return clean.length > 0 ? clean : "Error"
}

const apiFailed = (error: string, status: number | undefined, text: string) => new ApiFailed({ error, status, text })

// ---------------------------------------------------------------------------------------------
// The service

export interface ServiceGiven {
  readonly service: Option.Option<string>
  readonly serviceDid: Option.Option<string>
}

export interface Service {
  /** the origin, `https://host[:port]` */
  readonly url: string
  /** given, or None: read from `/.well-known/did.json` */
  readonly did: Option.Option<string>
}

const fromEnv = (name: string): Option.Option<string> => {
  const v = process.env[name]
  return v === undefined || v.length === 0 ? Option.none() : Option.some(v)
}

/** The service from the command line or the environment; a usage error when absent or malformed. */
export const service = (given: ServiceGiven): Effect.Effect<Service, HooksInvalid> =>
  Effect.gen(function*() {
    const urlText = Option.orElse(given.service, () => fromEnv("FIREHOOK_SERVICE_URL"))
    if (Option.isNone(urlText)) {
      return yield* invalid("missing --service (or FIREHOOK_SERVICE_URL): the firehook service's URL")
    }
    const urlSource = Option.isSome(given.service) ? "--service" : "--service (FIREHOOK_SERVICE_URL)"
    const url = parsePublicUrl(urlText.value, true)
    if (url === undefined) {
      return yield* invalid(
        `invalid ${urlSource}: must be an https:// origin (http:// only to a loopback host: localhost, 127.0.0.0/8 or [::1]) without credentials, path, query or fragment`
      )
    }
    const did = Option.orElse(given.serviceDid, () => fromEnv("FIREHOOK_SERVICE_DID"))
    if (Option.isSome(did) && !isServiceDid(did.value)) {
      const didSource = Option.isSome(given.serviceDid) ? "--service-did" : "--service-did (FIREHOOK_SERVICE_DID)"
      return yield* invalid(
        `invalid ${didSource}: must be a canonical did:plc or did:web (did:web:host%3Aport allowed)`
      )
    }
    return { url, did }
  })

/** Read a response body up to `max` bytes (a larger one is cancelled and refused). */
const readBounded = (res: Response, max: number, what: string): Effect.Effect<string, ApiFailed> =>
  Effect.tryPromise({
    try: async (signal) => {
      const reader = res.body?.getReader()
      if (reader === undefined) return ""
      const onAbort = () => void reader.cancel().catch(() => undefined)
      signal.addEventListener("abort", onAbort)
      const chunks: Array<Uint8Array> = []
      let size = 0
      try {
        for (let i = 0; i < 1_000_000; i++) {
          const { done, value } = await reader.read()
          if (done) break
          size += value.byteLength
          if (size > max) {
            await reader.cancel().catch(() => undefined)
            return undefined
          }
          chunks.push(value)
        }
      } finally {
        signal.removeEventListener("abort", onAbort)
      }
      return Buffer.concat(chunks).toString("utf8")
    },
    catch: () => apiFailed("Unreachable", undefined, `the connection to the service broke while reading ${what}`)
  }).pipe(
    Effect.flatMap((text) =>
      text === undefined
        ? Effect.fail(apiFailed("InvalidResponse", res.status, `the service's answer to ${what} is too large`))
        : Effect.succeed(text)
    )
  )

const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text) as unknown
  } catch {
    return undefined
  }
}

/** One bounded HTTP exchange with the service: status and the parsed JSON body (undefined if none). */
const exchange = (
  url: string,
  init: RequestInit,
  what: string,
  timeout: Duration.Duration,
  maxBytes: number
): Effect.Effect<
  { readonly status: number; readonly json: unknown; readonly retryAfter: string | null },
  ApiFailed
> => {
  const host = new URL(url).host
  const seconds = Math.round(Duration.toMillis(timeout) / 100) / 10
  return Effect.tryPromise({
    try: (signal) => fetch(url, { ...init, redirect: "manual", signal }),
    catch: () => apiFailed("Unreachable", undefined, `could not reach the firehook service at ${host} (${what})`)
  }).pipe(
    Effect.flatMap((res) =>
      Effect.map(readBounded(res, maxBytes, what), (text) => ({
        status: res.status,
        json: parseJson(text),
        retryAfter: res.headers.get("retry-after")
      }))
    ),
    Effect.interruptible,
    Effect.timeoutFail({
      duration: timeout,
      onTimeout: () =>
        apiFailed("Timeout", undefined, `the firehook service at ${host} did not answer ${what} within ${seconds} s`)
    })
  )
}

const LOOPBACK = /^(localhost|127(\.\d{1,3}){3}|\[::1\])$/

/**
 * The DIDs a service at `url` (an origin) may name itself in its `/.well-known/did.json`: the
 * did:web of its host and port (what firehook publishes: the did:web of its `PUBLIC_URL`), and for
 * a loopback URL also `did:web:localhost[%3A<port>]` (a service whose `PUBLIC_URL` is
 * `http://localhost:<port>`, reached at 127.0.0.1: the same machine and port).
 */
export const ownServiceDids = (url: string): ReadonlyArray<string> => {
  const own = didWebOf(url)
  const u = new URL(url)
  const local = LOOPBACK.test(u.hostname)
    ? didWebOf(`${u.protocol}//localhost${u.port === "" ? "" : `:${u.port}`}`)
    : undefined
  return [...new Set([own, local].filter((d): d is string => d !== undefined))]
}

/**
 * The service DID: as given, else the `id` of `<service>/.well-known/did.json`, which must be the
 * did:web of the service's URL ({@link ownServiceDids}); any other DID there is refused, since the
 * owner's PDS would mint tokens addressed to it (`--service-did` names another DID deliberately).
 */
export const serviceDid = (s: Service, timeout: Duration.DurationInput = DEFAULT_API_TIMEOUT) =>
  Option.match(s.did, {
    onSome: Effect.succeed,
    onNone: () =>
      exchange(
        `${s.url}/.well-known/did.json`,
        { method: "GET", headers: { accept: "application/json" } },
        "/.well-known/did.json",
        Duration.decode(timeout),
        MAX_DID_DOCUMENT_BYTES
      ).pipe(
        Effect.flatMap(({ json, status }) => {
          const doc = Schema.decodeUnknownOption(DidDocument)(json)
          if (status === 200 && Option.isSome(doc) && isServiceDid(doc.value.id)) {
            const id = doc.value.id
            const expected = ownServiceDids(s.url)
            if (expected.includes(id)) return Effect.succeed(id)
            return Effect.fail(
              apiFailed(
                "ServiceDidMismatch",
                status,
                `the service at ${new URL(s.url).host} names itself ${
                  printable(id, 2048)
                } in /.well-known/did.json, not ${
                  expected[0] ?? "the did:web of its host"
                }: refusing to get a token addressed to another service (give --service-did or FIREHOOK_SERVICE_DID to name it deliberately)`
              )
            )
          }
          return Effect.fail(
            apiFailed(
              "NoServiceDid",
              status,
              `the service at ${
                new URL(s.url).host
              } publishes no DID document (${status}); give --service-did (or FIREHOOK_SERVICE_DID)`
            )
          )
        })
      )
  })

// ---------------------------------------------------------------------------------------------
// Requests: checked before signing in

/** A call decided from the arguments: valid for its method's lexicon. */
export interface ApiRequest<O> {
  readonly nsid: string
  readonly kind: "query" | "procedure"
  /** the query string (queries), `""` when none */
  readonly query: string
  /** the JSON body (procedures) */
  readonly body: string | undefined
  readonly output: Schema.Schema<O, unknown>
}

/** The first schema issue as a short text (the field and the rule, never the value). */
const describeIssue = (e: ParseResult.ParseError): string => {
  const issue = ParseResult.ArrayFormatter.formatErrorSync(e)[0]
  if (issue === undefined) return "is invalid"
  const path = issue.path.length === 0 ? "" : `${issue.path.map(String).join(".")} `
  return `${path}${issue._tag === "Missing" ? "is missing" : "is invalid"}`
}

/**
 * A field's command-line spelling (`--rkey`), or its spelling and the rule a refusal states
 * (`["<id>", "expected a delivery id (whd_v1_…)"]`).
 */
export type FlagSpelling = string | readonly [flag: string, rule: string]

/**
 * A request for `contract` from raw arguments (query parameters as strings; a procedure's input),
 * checked with the method's Schemas: a usage error names the argument (`flags` maps a field to its
 * command-line spelling, and the rule to state when one is given).
 */
export const request = <P, I, O>(
  contract: XrpcContract<P, I, O>,
  raw: {
    readonly params?: Readonly<Record<string, string | undefined>>
    readonly input?: Readonly<Record<string, unknown>>
  },
  flags: Readonly<Record<string, FlagSpelling>> = {}
): Effect.Effect<ApiRequest<O>, HooksInvalid> =>
  Effect.gen(function*() {
    if (contract.kind === "subscription") return yield* invalid(`${contract.nsid} is a subscription`)
    const params: Record<string, string> = {}
    for (const [k, v] of Object.entries(raw.params ?? {})) if (v !== undefined) params[k] = v
    const bad = (e: ParseResult.ParseError) => {
      const issue = ParseResult.ArrayFormatter.formatErrorSync(e)[0]
      const field = issue?.path[0]
      const spelling = typeof field === "string" ? flags[field] ?? field : undefined
      if (spelling === undefined) return invalid(`invalid arguments: ${describeIssue(e)}`)
      return invalid(typeof spelling === "string" ? `invalid ${spelling}` : `invalid ${spelling[0]}: ${spelling[1]}`)
    }
    yield* Schema.decodeUnknown(contract.params)(params).pipe(Effect.mapError(bad))
    let body: string | undefined
    if (contract.input !== undefined) {
      const input: Record<string, unknown> = {}
      for (const [k, v] of Object.entries(raw.input ?? {})) if (v !== undefined) input[k] = v
      const decoded = yield* Schema.decodeUnknown(contract.input)(input).pipe(Effect.mapError(bad))
      body = JSON.stringify(yield* Schema.encode(contract.input)(decoded).pipe(Effect.mapError(bad)))
    }
    return {
      nsid: contract.nsid,
      kind: contract.kind,
      query: new URLSearchParams(params).toString(),
      body,
      output: contract.output
    }
  })

// ---------------------------------------------------------------------------------------------
// Calls

export interface OwnerApiShape {
  /** the caller (the signed-in account) */
  readonly did: string
  readonly serviceUrl: string
  readonly serviceDid: string
  readonly call: <O>(req: ApiRequest<O>) => Effect.Effect<O, ApiFailed | HooksFailed>
  /** a fresh token for one call of `nsid` (a subscription's upgrade) */
  readonly token: (nsid: string) => Effect.Effect<Redacted.Redacted<string>, HooksFailed>
  /** the service's XRPC error for a GET of `nsid` with a fresh token, if it answers with one */
  readonly probe: (nsid: string) => Effect.Effect<Option.Option<ApiFailed>, HooksFailed>
  readonly timeout: Duration.Duration
}

/** The longest wait a `Retry-After` is shown with (a larger or malformed one is left out). */
const MAX_RETRY_AFTER_SECONDS = 86_400

/**
 * ` (try again in N s)` for a `Retry-After` in whole seconds (1..1 day); nothing for none, an
 * HTTP date or anything else.
 */
const retryHint = (retryAfter: string | null): string => {
  const text = retryAfter?.trim() ?? ""
  if (!/^\d{1,6}$/.test(text)) return ""
  const n = Number(text)
  return n >= 1 && n <= MAX_RETRY_AFTER_SECONDS ? ` (try again in ${n} s)` : ""
}

/**
 * The refusal an XRPC error answer stands for: `<Error>: <message>`, with the service's
 * `Retry-After` (a 429) as `(try again in N s)`.
 */
const refusal = (status: number, json: unknown, nsid: string, retryAfter: string | null = null): ApiFailed => {
  const o = typeof json === "object" && json !== null ? json as Record<string, unknown> : {}
  const error = typeof o["error"] === "string" ? errorName(o["error"]) : undefined
  const message = typeof o["message"] === "string" ? printable(o["message"]) : ""
  if (error === undefined) {
    return apiFailed(
      status >= 300 && status < 400 ? "Redirect" : "HttpError",
      status,
      `the firehook service answered ${status} to ${nsid}`
    )
  }
  const text = message.length > 0 ? `${error}: ${message}` : `${error} (${status} from ${nsid})`
  return apiFailed(error, status, `${text}${retryHint(retryAfter)}`)
}

/** The client for the signed-in owner (`hooks`) at the service `url` / `did`. */
export const make = (
  hooks: HooksShape,
  url: string,
  did: string,
  timeoutInput: Duration.DurationInput = DEFAULT_API_TIMEOUT
): OwnerApiShape => {
  const timeout = Duration.decode(timeoutInput)
  const token = (nsid: string) => hooks.serviceToken(did, nsid)
  const send = (nsid: string, method: "GET" | "POST", query: string, body: string | undefined, t: Duration.Duration) =>
    Effect.flatMap(token(nsid), (bearer) =>
      exchange(
        `${url}/xrpc/${nsid}${query === "" ? "" : `?${query}`}`,
        {
          method,
          headers: {
            accept: "application/json",
            authorization: `Bearer ${Redacted.value(bearer)}`,
            ...(body === undefined ? {} : { "content-type": "application/json" })
          },
          ...(body === undefined ? {} : { body })
        },
        nsid,
        t,
        MAX_RESPONSE_BYTES
      ))
  const call = <O>(req: ApiRequest<O>) =>
    send(req.nsid, req.kind === "query" ? "GET" : "POST", req.query, req.body, timeout).pipe(
      Effect.flatMap(({ json, retryAfter, status }) =>
        status === 200
          ? Schema.decodeUnknown(req.output)(json).pipe(
            Effect.mapError(() =>
              apiFailed("InvalidResponse", status, `the firehook service sent an invalid answer to ${req.nsid}`)
            )
          )
          : Effect.fail(refusal(status, json, req.nsid, retryAfter))
      ),
      Effect.withSpan("OwnerApi.call", { attributes: { nsid: req.nsid } })
    )
  const probe = (nsid: string) =>
    send(nsid, "GET", "", undefined, Duration.seconds(5)).pipe(
      Effect.map(({ json, retryAfter, status }) =>
        status >= 400 ? Option.some(refusal(status, json, nsid, retryAfter)) : Option.none()
      ),
      Effect.catchTag("ApiFailed", (e) => Effect.succeed(Option.some(e)))
    )
  return { did: hooks.did, serviceUrl: url, serviceDid: did, call, token, probe, timeout }
}
