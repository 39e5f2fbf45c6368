/**
 * Request and response headers of the transport (SafeHttp): the caller's headers checked, bounded
 * and framed (`Host`, `Content-Length`); the response's lowercased.
 *
 * @since 0.1.0
 */
import { Either } from "effect"
import type * as Http from "node:http"
import { MAX_REQUEST_HEADER_BYTES } from "./Limits.js"

/**
 * Sets an own enumerable property, even for a name such as `__proto__` (header names are data).
 * Plain assignment creates an own data property for every other name; `defineProperty` on every
 * header turned the objects into slow dictionaries that node:http then copies.
 */
export const setOwn = (target: Record<string, string>, name: string, value: string): void => {
  if (name === "__proto__") {
    Object.defineProperty(target, name, { value, enumerable: true, writable: true, configurable: true })
  } else {
    target[name] = value
  }
}

// ---------------------------------------------------------------------------------------------
// Request headers

/** RFC 9110 token. */
const HEADER_NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/
/** What Node accepts in a header value (it throws on anything else). */
const HEADER_VALUE_INVALID = /[^\t\x20-\x7e\x80-\xff]/

/** Framing and hop-by-hop headers owned by the transport: a caller's value is dropped. */
const TRANSPORT_HEADERS: ReadonlySet<string> = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "proxy-connection",
  "upgrade",
  "te",
  "trailer",
  "expect",
  "http2-settings"
])

export const buildHeaders = (
  headers: Readonly<Record<string, string>>,
  hostHeader: string,
  contentLength: number | undefined
): Either.Either<Record<string, string>, "invalid_target" | "request_too_large"> => {
  const out: Record<string, string> = {}
  let bytes = 0
  for (const name of Object.keys(headers)) {
    const value: unknown = Object.getOwnPropertyDescriptor(headers, name)?.value
    if (typeof value !== "string") return Either.left("invalid_target")
    if (!HEADER_NAME.test(name) || HEADER_VALUE_INVALID.test(value)) return Either.left("invalid_target")
    bytes += name.length + value.length + 4
    if (bytes > MAX_REQUEST_HEADER_BYTES) return Either.left("request_too_large")
    if (TRANSPORT_HEADERS.has(name.toLowerCase())) continue
    setOwn(out, name, value)
  }
  setOwn(out, "Host", hostHeader)
  if (contentLength !== undefined) setOwn(out, "Content-Length", String(contentLength))
  return Either.right(out)
}

export const lowerHeaders = (headers: Http.IncomingHttpHeaders): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const name of Object.keys(headers)) {
    const v = headers[name]
    if (v === undefined) continue
    setOwn(out, name.toLowerCase(), typeof v === "string" ? v : v.join(", "))
  }
  return out
}
