/**
 * The method table of the owners' API: NSID → a contract (kind and Effect Schemas, from
 * `schemas/*Lexicon`) and a handler that receives the authenticated caller DID. `method` ties a
 * typed handler to its contract and returns an entry the pipeline (`Xrpc.ts`) runs without knowing
 * its types: it decodes the parameters and the body (a failure is `InvalidRequest`), runs the
 * handler, and encodes its output (an output the Schema refuses is a bug: 500).
 *
 * A subscription's handler gets the caller at the WebSocket upgrade (the token was verified from
 * the upgrade request's `Authorization` header) and answers the upgrade itself
 * (`HttpServerRequest.upgrade`); the pipeline applies no deadline to it.
 */
import type * as HttpServerRequest from "@effect/platform/HttpServerRequest"
import * as HttpServerResponse from "@effect/platform/HttpServerResponse"
import { Effect, ParseResult, Schema } from "effect"
import type { Scope } from "effect"
import type { XrpcContract } from "../../schemas/XrpcContract.js"
import type { AnyContract, RawParams } from "../../schemas/XrpcContract.js"
import { internal, invalidRequest, type XrpcFailure } from "./XrpcError.js"

/** What a handler receives. `caller` is the only owner the call can see or act on. */
export interface Call<P, I> {
  readonly caller: string
  readonly params: P
  readonly input: I
}

/** A decoded call, ready to run for its caller. */
export interface Prepared<R> {
  readonly respond: (
    caller: string
  ) => Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    XrpcFailure,
    R | HttpServerRequest.HttpServerRequest | Scope.Scope
  >
}

export interface ApiMethod<R> {
  readonly contract: AnyContract
  /** Decode the query parameters and (for a procedure) the JSON body. */
  readonly prepare: (params: RawParams, body: unknown) => Effect.Effect<Prepared<R>, XrpcFailure>
}

export type MethodTable<R> = ReadonlyArray<ApiMethod<R>>

/** Issues walked down at most (the tree follows the Schema, never the value's depth). */
const MAX_ISSUE_DEPTH = 256

/**
 * The first schema issue as a short text (the path and the rule, never the value). The issue tree
 * is walked here rather than through a formatter: the formatters render the refused value into
 * their messages, and a deeply nested JSON body (5,000 arrays in 10 KB) overflowed the stack there,
 * a 500 where SPEC §8.3 says 400.
 */
const describe = (e: ParseResult.ParseError): string => {
  let issue: ParseResult.ParseIssue = e.issue
  const path: Array<PropertyKey> = []
  for (let i = 0; i < MAX_ISSUE_DEPTH; i++) {
    if (issue._tag === "Pointer") {
      path.push(...(Array.isArray(issue.path) ? issue.path : [issue.path]))
      issue = issue.issue
    } else if (issue._tag === "Composite") {
      const first: ParseResult.ParseIssue | undefined = Array.isArray(issue.issues) ? issue.issues[0] : issue.issues
      if (first === undefined) break
      issue = first
    } else if (issue._tag === "Refinement" || issue._tag === "Transformation") {
      issue = issue.issue
    } else {
      break
    }
  }
  const where = path.length === 0 ? "" : `${path.map(String).join(".")}: `
  return `${where}${
    issue._tag === "Missing" ? "is missing" : issue._tag === "Unexpected" ? "is not allowed" : "is invalid"
  }`
}

const decode = <A>(schema: Schema.Schema<A, unknown>, what: string, value: unknown) =>
  Schema.decodeUnknown(schema)(value).pipe(Effect.mapError((e) => invalidRequest(`${what} ${describe(e)}`)))

const NO_STORE = { "cache-control": "no-store" } as const

/**
 * A top-level field of a method's output sent as stored JSON text (a JSON object's text) instead of
 * its encoded value: the value is still checked by the contract's Schema, but `JSON.stringify`
 * would round integers beyond 2^53 that the text keeps exactly (`getDelivery`'s payload).
 */
export interface RawField {
  readonly key: string
  readonly json: string
}

export interface MethodOptions<O> {
  /** The field of `out` to send as its stored text, if any. */
  readonly raw?: (out: O) => RawField | undefined
}

/** The encoded output as JSON text, `raw`'s field first with its stored text. */
const withRawField = (encoded: unknown, raw: RawField): string | undefined => {
  if (typeof encoded !== "object" || encoded === null || Array.isArray(encoded)) return undefined
  // `undefined` members are left out by JSON.stringify
  const rest = JSON.stringify({ ...encoded, [raw.key]: undefined })
  const field = `${JSON.stringify(raw.key)}:${raw.json}`
  return rest === "{}" ? `{${field}}` : `{${field},${rest.slice(1)}`
}

const respondJson = (encoded: unknown, raw: RawField | undefined) => {
  const text = raw === undefined ? undefined : withRawField(encoded, raw)
  return text === undefined
    ? HttpServerResponse.unsafeJson(encoded, { headers: NO_STORE })
    : HttpServerResponse.text(text, { contentType: "application/json", headers: NO_STORE })
}

/** A query or procedure: the handler's output, encoded by the contract, as the JSON response. */
export const method = <P, I, O, R>(
  contract: XrpcContract<P, I, O>,
  handler: (call: Call<P, I>) => Effect.Effect<O, XrpcFailure, R>,
  options: MethodOptions<O> = {}
): ApiMethod<R> => {
  const encode = Schema.encode(contract.output)
  return {
    contract,
    prepare: (raw, body) =>
      Effect.gen(function*() {
        const params = yield* decode(contract.params, "parameter", raw)
        const input = contract.input === undefined
          ? (undefined as I)
          : yield* decode(contract.input, "input", body)
        return {
          respond: (caller) =>
            handler({ caller, params, input }).pipe(
              Effect.flatMap((out) =>
                encode(out).pipe(
                  Effect.tapError(() =>
                    Effect.logError("api: a handler's output does not match its lexicon").pipe(
                      Effect.annotateLogs({ nsid: contract.nsid })
                    )
                  ),
                  Effect.mapError(() => internal()),
                  Effect.map((json) => respondJson(json, options.raw?.(out)))
                )
              )
            )
        }
      })
  }
}

/** A subscription: the handler answers the WebSocket upgrade for the verified caller. */
export const subscription = <P, O, R>(
  contract: XrpcContract<P, unknown, O>,
  handler: (call: Call<P, undefined>) => Effect.Effect<HttpServerResponse.HttpServerResponse, XrpcFailure, R>
): ApiMethod<Exclude<R, HttpServerRequest.HttpServerRequest | Scope.Scope>> => ({
  contract,
  prepare: (raw) =>
    Effect.map(decode(contract.params, "parameter", raw), (params) => ({
      respond: (caller) => upgradeContext(handler({ caller, params, input: undefined }))
    }))
})

/**
 * `R` is always within `Exclude<R, HttpServerRequest | Scope> | HttpServerRequest | Scope`; the
 * compiler cannot see it for a generic `R`, so the requirement type is restated here, once.
 */
const upgradeContext = <A, E, R>(
  effect: Effect.Effect<A, E, R>
): Effect.Effect<
  A,
  E,
  Exclude<R, HttpServerRequest.HttpServerRequest | Scope.Scope> | HttpServerRequest.HttpServerRequest | Scope.Scope
> => effect as Effect.Effect<A, E, never>
