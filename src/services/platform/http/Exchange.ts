/**
 * The request/response exchange of the transport (SafeHttp) over node:http/https: one exchange
 * against one validated address, with the response cap; the addresses tried in order inside one
 * deadline.
 *
 * @since 0.1.0
 */
import { type Clock, Effect } from "effect"
import * as Http from "node:http"
import * as Https from "node:https"
import type * as Net from "node:net"
import { ownCode } from "../ErrorCode.js"
import type { Agents } from "./Agents.js"
import { deadlineNow, type Deadlines, type Pending } from "./Deadlines.js"
import { SafeHttpError, type SafeHttpErrorKind } from "./Errors.js"
import { lowerHeaders } from "./Headers.js"
import type { SafeResponse } from "./SafeHttp.js"
import type { Target } from "./TargetPlan.js"

/** Connect-phase errors after which the next address is tried. */
const CONNECT_ERRORS: ReadonlySet<string> = new Set([
  "ECONNREFUSED",
  "ECONNRESET",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EHOSTDOWN",
  "ENETDOWN",
  "ETIMEDOUT",
  "EADDRNOTAVAIL",
  "EAFNOSUPPORT",
  "EACCES",
  "EPERM"
])

/** Why one attempt against one address failed. */
type AttemptFailure =
  /** before the connection was established: try the next address */
  | { readonly _tag: "ConnectFailed"; readonly kind: "network" | "timeout" }
  /** a reused keep-alive socket was closed by the server before any response: retry once */
  | { readonly _tag: "Stale" }
  | { readonly _tag: "Final"; readonly kind: SafeHttpErrorKind }

/** The largest response head (status line and headers) read: 64 KiB, the response body's cap too. */
const MAX_RESPONSE_HEAD_BYTES = 64 * 1024

const connectFailed = (kind: "network" | "timeout"): AttemptFailure => ({ _tag: "ConnectFailed", kind })
const STALE: AttemptFailure = { _tag: "Stale" }
const final = (kind: SafeHttpErrorKind): AttemptFailure => ({ _tag: "Final", kind })

const DECIMAL = /^\d{1,15}$/

/** The outcome of one exchange against one address. */
type ExchangeOutcome =
  | { readonly _tag: "Ok"; readonly response: SafeResponse }
  | { readonly _tag: "Failed"; readonly failure: AttemptFailure }

interface ExchangeHooks {
  /** The connection is established (socket connected, or a response arrived). At most once. */
  readonly connected: () => void
  /** The exchange ended. Exactly once (possibly synchronously from {@link startExchange}). */
  readonly settle: (outcome: ExchangeOutcome) => void
}

interface Exchange {
  /** Destroys the request, response and socket unless the exchange finished cleanly. */
  readonly release: () => void
  /**
   * The deadline passed: with `truncate`, once the response head has arrived, settle with the
   * status and the body read so far (`truncated: true`) and answer true; otherwise false.
   */
  readonly cutShort: () => boolean
}

export interface ExchangeSpec {
  readonly agents: Agents
  readonly target: Target
  readonly address: string
  readonly family: 4 | 6
  readonly method: "GET" | "POST"
  readonly headers: Record<string, string>
  /** sent as UTF-8 (Content-Length is its UTF-8 length) */
  readonly body: string | undefined
  readonly maxResponseBytes: number
  /**
   * Over `maxResponseBytes`: false → `response_too_large`; true → the response as read so far
   * (`truncated: true`), the rest cancelled. Also, once the head has arrived, a body that fails
   * (reset, error) or outlasts the deadline ends the read instead of failing the request: the
   * status is the answer.
   */
  readonly truncate: boolean
  /** With `truncate`: body bytes kept (the first ones, ≤ `maxResponseBytes`); the rest read is dropped. */
  readonly keepResponseBytes: number
}

const NOOP_EXCHANGE: Exchange = { release: () => undefined, cutShort: () => false }

/**
 * Starts one HTTP exchange against one address. Node callbacks only call the two hooks (each at most
 * once); every listener stays attached for the life of the objects, so a late error can never go
 * unhandled.
 */
const startExchange = (spec: ExchangeSpec, hooks: ExchangeHooks): Exchange => {
  let isConnected = false
  let responded = false
  let finished = false
  let clean = false
  let req: Http.ClientRequest | undefined
  let res: Http.IncomingMessage | undefined
  /** the response head, once it arrived */
  let head: { readonly status: number; readonly headers: Record<string, string> } | undefined
  /** the body bytes kept (at most `keepMax`), and how many were read */
  const chunks: Array<Uint8Array> = []
  let kept = 0
  let total = 0
  const max = spec.maxResponseBytes
  const keepMax = spec.truncate ? Math.min(max, spec.keepResponseBytes) : max

  const markConnected = (): void => {
    if (isConnected || finished) return
    isConnected = true
    hooks.connected()
  }
  const settle = (outcome: ExchangeOutcome): void => {
    if (finished) return
    finished = true
    isConnected = true
    hooks.settle(outcome)
  }
  const failWith = (failure: AttemptFailure): void => settle({ _tag: "Failed", failure })
  const destroy = (): void => {
    res?.destroy()
    req?.destroy()
  }
  const keep = (bytes: Uint8Array): void => {
    const room = keepMax - kept
    if (room <= 0) return
    const part = bytes.length > room ? bytes.subarray(0, room) : bytes
    chunks.push(part)
    kept += part.length
  }
  /** Settles with the response read so far; `cut`: the body did not end cleanly (or was cut at the cap). */
  const succeed = (cut: boolean): void => {
    if (head === undefined || finished) return
    const body = new Uint8Array(kept)
    let at = 0
    for (const c of chunks) {
      body.set(c, at)
      at += c.length
    }
    chunks.length = 0
    settle({
      _tag: "Ok",
      response: { status: head.status, headers: head.headers, body, truncated: cut || kept < total }
    })
  }
  /** The body failed after the head arrived: with `truncate` the status stands, else a network error. */
  const bodyFailed = (kind: SafeHttpErrorKind): void => {
    if (spec.truncate && head !== undefined) succeed(true)
    else failWith(final(kind))
  }

  const onError = (err: unknown): void => {
    const code = ownCode(err)
    if (!isConnected) {
      failWith(
        code !== undefined && CONNECT_ERRORS.has(code)
          ? connectFailed(code === "ETIMEDOUT" ? "timeout" : "network")
          : final("network")
      )
      return
    }
    if (!responded && req?.reusedSocket === true && (code === "ECONNRESET" || code === "EPIPE")) {
      failWith(STALE)
      return
    }
    bodyFailed(code === "ETIMEDOUT" ? "timeout" : "network")
  }

  const onResponse = (response: Http.IncomingMessage): void => {
    res = response
    responded = true
    markConnected()
    response.on("error", () => bodyFailed("network"))
    const declared = response.headers["content-length"]
    if (!spec.truncate && declared !== undefined && DECIMAL.test(declared) && Number(declared) > max) {
      failWith(final("response_too_large"))
      destroy()
      return
    }
    head = { status: response.statusCode ?? 0, headers: lowerHeaders(response.headers) }
    response.on("data", (chunk: Uint8Array | string) => {
      if (finished) return
      const bytes = typeof chunk === "string" ? Buffer.from(chunk, "utf8") : chunk
      const room = max - total
      if (bytes.length > room) {
        if (spec.truncate) {
          if (room > 0) keep(bytes.subarray(0, room))
          total = max
          succeed(true)
        } else {
          failWith(final("response_too_large"))
        }
        destroy()
        return
      }
      keep(bytes)
      total += bytes.length
    })
    response.on("end", () => {
      if (finished) return
      clean = true
      succeed(false)
    })
    response.on("close", () => bodyFailed("network"))
  }

  /**
   * A 101 (Switching Protocols) ends the exchange: node:http hands the connection to an `upgrade`
   * listener and, without one, destroys it before any `response` (which read as a `network` error,
   * retried). The status is the answer (SPEC §4.3: 1xx → `redirect`); the switched connection is
   * closed, never used or pooled.
   */
  const onUpgrade = (response: Http.IncomingMessage, socket: Net.Socket): void => {
    socket.destroy()
    res = response
    responded = true
    markConnected()
    head = { status: response.statusCode ?? 0, headers: lowerHeaders(response.headers) }
    succeed(false)
  }

  const mod = spec.target.protocol === "https:" ? Https : Http
  const options: Https.RequestOptions = {
    agent: spec.target.protocol === "https:" ? spec.agents.https : spec.agents.http,
    host: spec.address,
    family: spec.family,
    port: spec.target.port,
    path: spec.target.path,
    method: spec.method,
    headers: spec.headers,
    setHost: false,
    insecureHTTPParser: false,
    // the status alone classifies (SPEC §4.3): a receiver's 2xx with a head over node:http's default
    // 16 KiB must not read as a network error (retried, a duplicate); larger heads still are
    maxHeaderSize: MAX_RESPONSE_HEAD_BYTES
  }
  if (spec.target.servername !== undefined) options.servername = spec.target.servername
  try {
    req = mod.request(options)
  } catch {
    // option validation (headers and path were validated before; this is a last resort)
    failWith(final("network"))
    return NOOP_EXCHANGE
  }
  req.on("error", onError)
  req.on("response", onResponse)
  req.on("upgrade", onUpgrade)
  req.once("socket", (socket: Net.Socket) => {
    if (!socket.connecting) markConnected()
    else socket.once("connect", markConnected)
  })
  req.on("close", () => {
    if (!responded) failWith(final("network"))
  })
  if (spec.body === undefined) req.end()
  else req.end(spec.body, "utf8")

  return {
    release: () => {
      if (!clean) destroy()
    },
    cutShort: () => {
      if (finished || !spec.truncate || head === undefined) return false
      succeed(true)
      return true
    }
  }
}

/**
 * Tries the validated addresses in order (SPEC §4.6) inside one deadline. The connect phase of every
 * address but the last gets an equal share of the time left, so one black-holed address cannot use
 * up the whole deadline; a reused keep-alive socket the server had closed is retried once.
 *
 * One `Effect.async` for the whole exchange: no fibers, no Deferreds. Interruption destroys the
 * request in progress.
 */
export const exchangeAll = (
  deadlines: Deadlines,
  clock: Clock.Clock,
  addresses: ReadonlyArray<{ readonly address: string; readonly family: 4 | 6 }>,
  base: Omit<ExchangeSpec, "address" | "family">,
  deadline: number
): Effect.Effect<SafeResponse, SafeHttpError> =>
  Effect.async<SafeResponse, SafeHttpError>((resume) =>
    runAddresses(deadlines, clock, addresses, base, deadline, resume)
  )

/**
 * The body of {@link exchangeAll}'s `Effect.async`: starts the first exchange, calls `resume` once
 * with the outcome, and returns the canceller run on interruption.
 */
const runAddresses = (
  deadlines: Deadlines,
  clock: Clock.Clock,
  addresses: ReadonlyArray<{ readonly address: string; readonly family: 4 | 6 }>,
  base: Omit<ExchangeSpec, "address" | "family">,
  deadline: number,
  resume: (result: Effect.Effect<SafeResponse, SafeHttpError>) => void
): Effect.Effect<void> => {
  let index = 0
  let staleRetried = false
  let lastKind: SafeHttpErrorKind = "network"
  let current: Exchange | undefined
  /** bumped per exchange, so a late hook of an abandoned exchange is ignored */
  let generation = 0
  let done = false

  const finish = (result: Effect.Effect<SafeResponse, SafeHttpError>): void => {
    if (done) return
    done = true
    deadlines.remove(entry)
    const ex = current
    current = undefined
    ex?.release()
    resume(result)
  }
  const failKind = (kind: SafeHttpErrorKind): void => finish(Effect.fail(new SafeHttpError({ kind })))

  /** The current exchange failed before it was connected (or its connect budget ran out). */
  const nextAddress = (kind: "network" | "timeout"): void => {
    lastKind = kind
    const ex = current
    current = undefined
    ex?.release()
    index++
    start()
  }

  const start = (): void => {
    if (done) return
    const target = addresses[index]
    if (target === undefined) return failKind(lastKind)
    const remaining = addresses.length - index
    const now = deadlineNow(clock)
    if (now >= deadline) return failKind("timeout")
    entry.connectDeadline = remaining > 1 ? now + Math.max(0, Math.floor((deadline - now) / remaining)) : undefined
    const gen = ++generation
    const spec: ExchangeSpec = { ...base, address: target.address, family: target.family }
    const ex = startExchange(spec, {
      connected: () => {
        if (gen === generation) entry.connectDeadline = undefined
      },
      settle: (outcome) => {
        if (gen !== generation || done) return
        if (outcome._tag === "Ok") return finish(Effect.succeed(outcome.response))
        const failure = outcome.failure
        switch (failure._tag) {
          case "ConnectFailed":
            return nextAddress(failure.kind)
          case "Stale": {
            if (staleRetried) return failKind("network")
            staleRetried = true
            const old = current
            current = undefined
            old?.release()
            return start()
          }
          case "Final":
            return failKind(failure.kind)
        }
      }
    })
    // the hooks may have run synchronously (and moved on); only keep a live exchange
    if (gen === generation && !done) current = ex
    else ex.release()
  }

  const entry: Pending = {
    deadline,
    connectDeadline: undefined,
    expire: (now) => {
      if (done) return
      if (now >= deadline) {
        // a truncating read whose head arrived ends with that status (cutShort settles it)
        if (current?.cutShort() === true) return
        return failKind("timeout")
      }
      // the connect budget of this address ran out: next address
      generation++
      nextAddress("timeout")
    }
  }
  deadlines.add(entry)
  start()
  return Effect.sync(() => {
    if (done) return
    done = true
    deadlines.remove(entry)
    generation++
    const ex = current
    current = undefined
    ex?.release()
  })
}
