/**
 * A listener that could not start (SPEC §6.1: a startup failure is one line naming what failed).
 *
 * `Bun.serve` throws when it cannot bind (`Error EADDRINUSE listen`, a defect inside
 * `BunHttpServer`), which main could only report as `startup failed (unexpected Error EADDRINUSE
 * listen)`, naming neither the listener nor its variable. {@link guard} wraps a server layer so
 * that a bind error becomes a typed {@link ListenerUnavailable} whose message names the variable to
 * change and the address: `HEALTH_PORT 127.0.0.1:3003 is in use (EADDRINUSE)`. Any other failure
 * passes through unchanged.
 */
import type * as HttpServer from "@effect/platform/HttpServer"
import { Cause, Data, Layer, Option } from "effect"
import * as ErrorCode from "./ErrorCode.js"

/** Which listener: its variables (`HEALTH_HOST` / `HEALTH_PORT`) and the address it was given. */
export interface ListenerAddress {
  readonly hostVariable: string
  readonly portVariable: string
  readonly host: string
  readonly port: number
}

/** The bind errors {@link guard} names, each with the variable to blame and what it means. */
const BIND_ERRORS = {
  EADDRINUSE: { blame: "port", says: "is in use" },
  EADDRNOTAVAIL: { blame: "host", says: "is not an address of this machine" },
  EACCES: { blame: "port", says: "may not be listened on by this user" },
  // an IPv6 address whose zone names no interface of this machine (`fe80::1%nosuch`), or a
  // link-local address without the zone it needs (`fe80::1`)
  EINVAL: {
    blame: "host",
    says: "cannot be listened on (a link-local address without its zone, %eth0, or a zone that names no interface?)"
  }
} as const
type BindCode = keyof typeof BIND_ERRORS
const isBindCode = (code: string): code is BindCode => Object.hasOwn(BIND_ERRORS, code)

export class ListenerUnavailable extends Data.TaggedError("ListenerUnavailable")<{
  readonly variable: string
  /** `host:port`, an IPv6 host in brackets */
  readonly address: string
  readonly code: BindCode
}> {
  override get message(): string {
    return `${this.variable} ${this.address} ${BIND_ERRORS[this.code].says} (${this.code})`
  }
}

/** `host:port` as a URL writes it (`[::1]:3003`). */
export const formatAddress = (host: string, port: number): string =>
  `${host.includes(":") ? `[${host}]` : host}:${port}`

/**
 * A listening server's address for its log line: `http://host:port` with an IPv6 host in brackets
 * (`http://[::1]:3003`, as a URL writes it; Effect's own formatting leaves them out), or
 * `unix://path`.
 */
export const logAddress = (address: HttpServer.Address): string =>
  address._tag === "UnixAddress"
    ? `unix://${address.path}`
    : `http://${formatAddress(address.hostname, address.port)}`

/**
 * The bind error behind `error` (a server's thrown error, or a typed failure wrapping it as its
 * `cause`), named for `listener`; `None` when it is not one.
 */
export const describe = (error: unknown, listener: ListenerAddress): Option.Option<ListenerUnavailable> => {
  const code = ErrorCode.ownCode(error) ?? ErrorCode.driverCode(error)
  if (code === undefined || !isBindCode(code)) return Option.none()
  return Option.some(
    new ListenerUnavailable({
      variable: BIND_ERRORS[code].blame === "host" ? listener.hostVariable : listener.portVariable,
      address: formatAddress(listener.host, listener.port),
      code
    })
  )
}

/**
 * `server` (e.g. `BunHttpServer.layer({ hostname, port })`), with a bind error while it is built
 * turned into a {@link ListenerUnavailable} for `listener`; every other failure, defect or
 * interruption is left as it was.
 */
export const guard = <A, E, R>(
  server: Layer.Layer<A, E, R>,
  listener: ListenerAddress
): Layer.Layer<A, E | ListenerUnavailable, R> =>
  Layer.catchAllCause(server, (cause): Layer.Layer<A, E | ListenerUnavailable> => {
    if (Cause.isInterruptedOnly(cause)) return Layer.failCause(cause)
    const named = describe(Cause.squash(cause), listener)
    return Option.isSome(named) ? Layer.fail(named.value) : Layer.failCause(cause)
  })
