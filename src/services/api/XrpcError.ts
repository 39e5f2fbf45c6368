/**
 * The errors the owners' API answers with (SPEC §8.3): an HTTP status and the XRPC error body
 * `{error, message}`. A handler fails with {@link XrpcFailure}; the pipeline turns it into the
 * response. Messages are fixed texts: never a token, a secret, a URL or another owner's data.
 *
 * Custom errors a lexicon declares (`AlreadyExists`, `NotFound`, …) answer 400, as atproto's own
 * (`RecordNotFound`) do; the statuses of the generic ones follow XRPC's conventions.
 */
import { Schema } from "effect"

export class XrpcFailure extends Schema.TaggedError<XrpcFailure>()("XrpcFailure", {
  status: Schema.Int,
  error: Schema.String,
  message: Schema.String,
  /** 429 (or a 502 over the budget of identity lookups): the wait before the next call, in whole seconds */
  retryAfter: Schema.optional(Schema.Int),
  /** 405: the HTTP method the call needs */
  allow: Schema.optional(Schema.String)
}) {}

const failure = (status: number, error: string, message: string) => new XrpcFailure({ status, error, message })

export const invalidRequest = (message: string) => failure(400, "InvalidRequest", message)
/** A lexicon-declared error (400). */
export const declared = (error: string, message: string) => failure(400, error, message)
export const notConfigured = (message: string) => failure(503, "NotConfigured", message)
export const internal = () => failure(500, "InternalServerError", "internal error")
export const methodNotImplemented = () => failure(501, "MethodNotImplemented", "no such method")
export const wrongVerb = (allow: string) =>
  new XrpcFailure({ status: 405, error: "InvalidRequest", message: `use ${allow}`, allow })
export const rateLimited = (retryAfter: number) =>
  new XrpcFailure({ status: 429, error: "RateLimitExceeded", message: "too many calls", retryAfter })
