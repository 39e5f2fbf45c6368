/**
 * The owner side's errors (HookRecords): invalid arguments, and operations that could not be done,
 * a PDS's failure among them as one line (its status and error name only).
 *
 * @since 0.1.0
 */
import { Data } from "effect"
import { isLoopbackHost } from "../schemas/Net.js"

// ---------------------------------------------------------------------------------------------
// Errors

/** Invalid arguments or environment (the CLI's exit code 2). Never carries a secret or a URL. */
export class HooksInvalid extends Data.TaggedError("HooksInvalid")<{ readonly text: string }> {
  override get message(): string {
    return this.text
  }
}

export type HooksFailureReason =
  | "login"
  | "unreachable"
  | "timeout"
  | "rate_limited"
  | "not_found"
  | "exists"
  | "conflict"
  | "invalid_record"
  | "invalid_response"
  | "pds"

/** The operation could not be done (the CLI's exit code 1). Never carries a secret or a URL. */
export class HooksFailed extends Data.TaggedError("HooksFailed")<{
  readonly reason: HooksFailureReason
  readonly text: string
}> {
  override get message(): string {
    return this.text
  }
}

/**
 * A redirect from the PDS, refused by the session's fetch (never followed: the password and the
 * session's tokens go to the named PDS only). Rejected from the fetch, it reaches `classify` as the
 * cause of the client's error.
 */
export class PdsRedirect extends Data.TaggedError("PdsRedirect")<{ readonly status: number }> {}

/** `fetch` that follows no redirect: a 3xx answer rejects with `PdsRedirect` */
export const fetchNoRedirect = (input: Parameters<typeof fetch>[0], init?: RequestInit): Promise<Response> =>
  fetch(input, { ...init, redirect: "manual" }).then(async (r) => {
    if (r.type !== "opaqueredirect" && (r.status < 300 || r.status >= 400 || r.status === 304)) return r
    await r.body?.cancel().catch(() => undefined)
    return Promise.reject(new PdsRedirect({ status: r.status }))
  })

/**
 * Whether the session may be sent to a DID document's PDS endpoint: https://, or http:// to a
 * loopback host (as `--pds`); none (`undefined`: the named PDS is used) is.
 */
export const isSafeEndpoint = (url: URL | undefined): boolean =>
  url === undefined || url.protocol === "https:" || (url.protocol === "http:" && isLoopbackHost(url.hostname))

export const invalid = (text: string) => new HooksInvalid({ text })
export const failed = (reason: HooksFailureReason, text: string) => new HooksFailed({ reason, text })

/** an own data property (never a getter, never inherited) */
export const own = (o: unknown, key: string): unknown => {
  if (typeof o !== "object" || o === null) return undefined
  const desc = Object.getOwnPropertyDescriptor(o, key)
  return desc !== undefined && "value" in desc ? desc.value : undefined
}

interface XrpcLike {
  readonly status: number
  readonly error: string
}

const xrpcOf = (e: unknown): XrpcLike | undefined => {
  if (typeof e !== "object" || e === null) return undefined
  const status = own(e, "status")
  const error = own(e, "error")
  return typeof status === "number" ? { status, error: typeof error === "string" ? error : "" } : undefined
}

/** an error name from the PDS, safe to print */
const errorName = (s: string): string => {
  const clean = s.replace(/[^A-Za-z0-9_.-]/g, "").slice(0, 64)
  return clean.length > 0 ? clean : "error"
}

export type Operation =
  | "login"
  | "logout"
  | "listRecords"
  | "getRecord"
  | "createRecord"
  | "putRecord"
  | "deleteRecord"
  | "getServiceAuth"

/** Any failure of a call as one line: status and error name only, never the PDS's free text. */
export const classify = (op: Operation, host: string, e: unknown): HooksFailed => {
  const redirect = e instanceof PdsRedirect ? e : own(e, "cause")
  if (redirect instanceof PdsRedirect) {
    return op === "login"
      ? failed("login", `login failed: the PDS answered ${redirect.status}, a redirect (not followed)`)
      : failed("pds", `the PDS refused ${op} (${redirect.status}, a redirect, not followed)`)
  }
  const x = xrpcOf(e)
  if (x === undefined || x.status < 100) {
    if (x?.status === 2) return failed("invalid_response", `the PDS sent an invalid response to ${op}`)
    return failed("unreachable", `could not reach the PDS at ${host} (${op})`)
  }
  if (x.status === 429) return failed("rate_limited", `the PDS rate-limited ${op} (429); try again later`)
  if (op === "login") {
    // by name first: the reference PDS sends both with 401, which is not a wrong password
    if (x.error === "AuthFactorTokenRequired") {
      return failed("login", "login failed: the account requires a sign-in code; use an app password")
    }
    if (x.error === "AccountTakedown") return failed("login", "login failed: the account is taken down")
    if (x.status === 401) return failed("login", "login failed: invalid identifier or password")
    return failed("login", `login failed: the PDS answered ${x.status} ${errorName(x.error)}`)
  }
  if (x.error === "RecordNotFound") return failed("not_found", "no such webhook record")
  if (x.error === "InvalidSwap") {
    return failed("conflict", "the record changed meanwhile (or already exists); nothing written")
  }
  if (x.status === 401 || x.status === 403) {
    return failed("login", `the PDS refused ${op} (${x.status} ${errorName(x.error)})`)
  }
  return failed("pds", `the PDS refused ${op} (${x.status} ${errorName(x.error)})`)
}
