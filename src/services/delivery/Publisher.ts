/**
 * The optional Redis publisher (SPEC §4.7): every terminal outcome's audit event is `PUBLISH`ed as
 * JSON on a channel (default `webhook:events`).
 *
 * Redis never affects delivery or readiness, so the publisher never buffers and never blocks:
 * `publish` returns at once; a message is dropped (and counted) when it is larger than 8 KiB, when
 * there is no connection, when 4 messages are already in flight, or when its reply takes more than
 * 1 s (the connection is then reset: a server that stops answering is usually a half-open socket).
 * A background fiber, owned by the layer's scope, keeps one connection and reconnects lazily with
 * full-jitter exponential backoff (base 500 ms, cap 30 s). Connection errors are logged at most
 * once a minute, with a kind and an errno-like code only: never the URL or the password.
 *
 * The RESP2 client is written here (on `node:net` / `node:tls`): it needs only AUTH, SELECT and
 * PUBLISH, replies are matched to commands in order, and the read buffer is bounded.
 */
import {
  Clock,
  Context,
  Data,
  Deferred,
  Duration,
  Effect,
  Either,
  Exit,
  FiberSet,
  Layer,
  Metric,
  Option,
  Redacted,
  Ref,
  Schedule,
  Stream,
  SubscriptionRef
} from "effect"
import type { Scope } from "effect"
import * as Net from "node:net"
import * as Tls from "node:tls"
import type { OutboxOperation, TerminalStatus } from "../matching/OutboxStatus.js"
import * as Backoff from "../platform/Backoff.js"
import * as ErrorCode from "../platform/ErrorCode.js"
import { Health, statsSection } from "../platform/Health.js"
import { labelledCounterFamily } from "../platform/Metrics.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"
import * as DeliveryConfig from "./DeliveryConfig.js"

// ---------------------------------------------------------------------------------------------
// The event

/** One audit row as published (SPEC §4.7). The URL is never published. */
export interface AuditEvent {
  readonly deliveryId: string
  readonly eventId: string
  readonly ownerDid: string
  readonly webhookRkey: string
  readonly did: string
  readonly collection: string
  readonly rkey: string
  readonly operation: OutboxOperation
  readonly status: TerminalStatus
  readonly httpStatus: number | null
  readonly errorKind: string | null
  readonly url: "[redacted]"
  /** ISO 8601 */
  readonly time: string
}

/**
 * The JSON text of an event. Only the known fields are copied (in a fixed order), so a caller's
 * object carrying more (a URL, a body) can never leak through, and `url` is always `[redacted]`.
 */
export const encodeEvent = (e: AuditEvent): string =>
  JSON.stringify({
    deliveryId: e.deliveryId,
    eventId: e.eventId,
    ownerDid: e.ownerDid,
    webhookRkey: e.webhookRkey,
    did: e.did,
    collection: e.collection,
    rkey: e.rkey,
    operation: e.operation,
    status: e.status,
    httpStatus: e.httpStatus,
    errorKind: e.errorKind,
    url: "[redacted]",
    time: e.time
  })

// ---------------------------------------------------------------------------------------------
// REDIS_URL: parsed in its own module (the configuration reads it too)

export { parseRedisUrl, type RedisTarget, RedisUrlInvalid } from "./RedisUrl.js"
import { parseRedisUrl, type RedisTarget, RedisUrlInvalid } from "./RedisUrl.js"

// ---------------------------------------------------------------------------------------------
// RESP2

export type RespReply =
  | { readonly _tag: "Simple"; readonly value: string }
  | { readonly _tag: "Error"; readonly value: string }
  | { readonly _tag: "Integer"; readonly value: number }
  | { readonly _tag: "Bulk"; readonly value: string | null }
  | { readonly _tag: "Array"; readonly value: ReadonlyArray<RespReply> | null }

export type RespParse =
  | { readonly _tag: "Done"; readonly reply: RespReply; readonly next: number }
  | { readonly _tag: "Incomplete" }
  | { readonly _tag: "Invalid"; readonly reason: string }

/** Bounds of the parser: no reply this service reads comes near them. */
export const RESP_LIMITS = { maxLine: 4096, maxBulk: 1024 * 1024, maxArray: 1024, maxDepth: 4 } as const

const INCOMPLETE: RespParse = { _tag: "Incomplete" }
const invalidParse = (reason: string): RespParse => ({ _tag: "Invalid", reason })
const INTEGER_TEXT = /^-?\d{1,15}$/

const readLine = (
  buf: Buffer,
  offset: number
): { readonly line: string; readonly next: number } | "incomplete" | "invalid" => {
  const end = buf.indexOf("\r\n", offset, "latin1")
  if (end < 0) return buf.length - offset > RESP_LIMITS.maxLine ? "invalid" : "incomplete"
  if (end - offset > RESP_LIMITS.maxLine) return "invalid"
  return { line: buf.toString("utf8", offset, end), next: end + 2 }
}

/** Parse one RESP2 reply starting at `offset`. Never throws; bounded in size and depth. */
export const parseReply = (buf: Buffer, offset = 0, depth = 0): RespParse => {
  if (offset >= buf.length) return INCOMPLETE
  if (depth > RESP_LIMITS.maxDepth) return invalidParse("nesting")
  const type = buf[offset]
  const header = readLine(buf, offset + 1)
  if (header === "incomplete") return INCOMPLETE
  if (header === "invalid") return invalidParse("line")
  const { line, next } = header
  switch (type) {
    case 0x2b: // +
      return { _tag: "Done", reply: { _tag: "Simple", value: line }, next }
    case 0x2d: // -
      return { _tag: "Done", reply: { _tag: "Error", value: line }, next }
    case 0x3a: // :
      return INTEGER_TEXT.test(line)
        ? { _tag: "Done", reply: { _tag: "Integer", value: Number(line) }, next }
        : invalidParse("integer")
    case 0x24: {
      // $
      if (!INTEGER_TEXT.test(line)) return invalidParse("bulk length")
      const len = Number(line)
      if (len === -1) return { _tag: "Done", reply: { _tag: "Bulk", value: null }, next }
      if (len < 0 || len > RESP_LIMITS.maxBulk) return invalidParse("bulk length")
      if (buf.length < next + len + 2) return INCOMPLETE
      if (buf[next + len] !== 0x0d || buf[next + len + 1] !== 0x0a) return invalidParse("bulk terminator")
      return {
        _tag: "Done",
        reply: { _tag: "Bulk", value: buf.toString("utf8", next, next + len) },
        next: next + len + 2
      }
    }
    case 0x2a: {
      // *
      if (!INTEGER_TEXT.test(line)) return invalidParse("array length")
      const len = Number(line)
      if (len === -1) return { _tag: "Done", reply: { _tag: "Array", value: null }, next }
      if (len < 0 || len > RESP_LIMITS.maxArray) return invalidParse("array length")
      const items: Array<RespReply> = []
      let at = next
      for (let i = 0; i < len; i++) {
        const item = parseReply(buf, at, depth + 1)
        if (item._tag !== "Done") return item
        items.push(item.reply)
        at = item.next
      }
      return { _tag: "Done", reply: { _tag: "Array", value: items }, next: at }
    }
    default:
      return invalidParse("type")
  }
}

/** Encode a command as a RESP2 array of bulk strings. */
export const encodeCommand = (args: ReadonlyArray<string>): Buffer => {
  const parts: Array<Buffer> = [Buffer.from(`*${args.length}\r\n`, "latin1")]
  for (const arg of args) {
    const bytes = Buffer.from(arg, "utf8")
    parts.push(Buffer.from(`$${bytes.length}\r\n`, "latin1"), bytes, Buffer.from("\r\n", "latin1"))
  }
  return Buffer.concat(parts)
}

// ---------------------------------------------------------------------------------------------
// A connection

export const REDIS_ERROR_KINDS = ["connect", "closed", "timeout", "protocol", "auth", "reply", "busy"] as const
export type RedisErrorKind = (typeof REDIS_ERROR_KINDS)[number]

/** A Redis failure: a kind and an errno-like or Redis error code; never a URL, password or payload. */
export class RedisError
  extends Data.TaggedError("RedisError")<{ readonly kind: RedisErrorKind; readonly code: string }>
{
  override get message(): string {
    return `redis ${this.kind} (${this.code})`
  }
}

const errnoCode = (e: unknown): string => ErrorCode.ownCode(e) ?? "unknown"

/** The first word of a Redis error reply (`ERR`, `WRONGPASS`, `NOAUTH`, …): the rest may echo input. */
const replyCode = (text: string): string => {
  const word = /^[A-Z][A-Z0-9_-]{0,31}/.exec(text)
  return word?.[0] ?? "unknown"
}

export interface RespConnection {
  /** Send a command and wait for its reply (no timeout: callers add theirs). Error replies fail. */
  readonly command: (args: ReadonlyArray<string>) => Effect.Effect<RespReply, RedisError>
  /** Completes (with the reason) when the connection is closed, for any reason. */
  readonly closed: Effect.Effect<RedisError>
  /** Close now (idempotent, synchronous, so bounded); pending commands fail with `closed`. */
  readonly destroy: Effect.Effect<void>
  /** Close now with `why` as the reason (`closed` completes with it, pending commands fail with it). */
  readonly abort: (why: RedisError) => Effect.Effect<void>
}

export interface ConnectOptions {
  /** connect + TLS + AUTH + SELECT (default 5 s) */
  readonly connectTimeout?: Duration.DurationInput
  /** bytes buffered while waiting for the end of a reply (default 64 KiB) */
  readonly maxReadBuffer?: number
  /** commands awaiting a reply (default 16); more fail with `busy` */
  readonly maxPending?: number
  /** receives replies nobody asked for (the messages of a SUBSCRIBE); without it they close the connection */
  readonly onPush?: (reply: RespReply) => void
}

/**
 * Open a connection, authenticate (AUTH with the URL's password; without one, a PING that a server
 * requiring a password refuses) and select the database. The socket is destroyed when the scope
 * closes (or earlier, on any error).
 */
export const connect = (
  target: RedisTarget,
  options: ConnectOptions = {}
): Effect.Effect<RespConnection, RedisError, Scope.Scope> =>
  Effect.gen(function*() {
    const maxReadBuffer = options.maxReadBuffer ?? 64 * 1024
    const maxPending = options.maxPending ?? 16
    const ready = yield* Deferred.make<void, RedisError>()
    const closed = yield* Deferred.make<RedisError>()
    const pending: Array<Deferred.Deferred<RespReply, RedisError>> = []
    let reason: RedisError | undefined = undefined
    let buffer: Buffer = Buffer.alloc(0)
    let socket: Net.Socket | undefined = undefined

    const shutdown = (why: RedisError): void => {
      if (reason !== undefined) return
      reason = why
      buffer = Buffer.alloc(0)
      const waiting = pending.splice(0, pending.length)
      for (const d of waiting) Deferred.unsafeDone(d, Exit.fail(why))
      Deferred.unsafeDone(ready, Exit.fail(why))
      Deferred.unsafeDone(closed, Exit.succeed(why))
      socket?.destroy()
    }

    const onData = (chunk: Buffer): void => {
      if (reason !== undefined) return
      buffer = buffer.length === 0 ? chunk : Buffer.concat([buffer, chunk])
      if (buffer.length > maxReadBuffer) return shutdown(new RedisError({ kind: "protocol", code: "read_buffer" }))
      let offset = 0
      while (reason === undefined) {
        const parsed = parseReply(buffer, offset)
        if (parsed._tag === "Incomplete") break
        if (parsed._tag === "Invalid") return shutdown(new RedisError({ kind: "protocol", code: parsed.reason }))
        offset = parsed.next
        const waiter = pending.shift()
        if (waiter !== undefined) Deferred.unsafeDone(waiter, Exit.succeed(parsed.reply))
        else if (options.onPush !== undefined) options.onPush(parsed.reply)
        else return shutdown(new RedisError({ kind: "protocol", code: "unexpected_reply" }))
      }
      if (reason === undefined) buffer = offset >= buffer.length ? Buffer.alloc(0) : buffer.subarray(offset)
    }

    // The socket is created and every listener attached in one synchronous step, so an early
    // `error` event can never find the socket without a listener.
    const open = (): Net.Socket => {
      const s = target.tls
        ? Tls.connect({
          host: target.host,
          port: target.port,
          // explicit, so NODE_TLS_REJECT_UNAUTHORIZED=0 in the environment cannot turn verification
          // off (the password would go to any server); NODE_EXTRA_CA_CERTS adds a private CA
          rejectUnauthorized: true,
          ...(Net.isIP(target.host) === 0 ? { servername: target.host } : {})
        })
        : Net.connect({ host: target.host, port: target.port })
      socket = s
      s.on("data", onData)
      s.on("error", (e) => shutdown(new RedisError({ kind: "connect", code: errnoCode(e) })))
      s.on("close", () => shutdown(new RedisError({ kind: "closed", code: "closed" })))
      s.once(target.tls ? "secureConnect" : "connect", () => {
        s.setNoDelay(true)
        s.setKeepAlive(true, 30_000)
        Deferred.unsafeDone(ready, Exit.void)
      })
      return s
    }
    const sock = yield* Effect.acquireRelease(Effect.sync(open), (s) => Effect.sync(() => s.destroy()))

    const command = (args: ReadonlyArray<string>): Effect.Effect<RespReply, RedisError> =>
      Effect.flatMap(Deferred.make<RespReply, RedisError>(), (d) =>
        Effect.suspend(() => {
          if (reason !== undefined) return Effect.fail(reason)
          if (pending.length >= maxPending) return Effect.fail(new RedisError({ kind: "busy", code: "pending" }))
          pending.push(d)
          sock.write(encodeCommand(args))
          return Deferred.await(d)
        })).pipe(
          Effect.flatMap((reply) =>
            reply._tag === "Error"
              ? Effect.fail(new RedisError({ kind: "reply", code: replyCode(reply.value) }))
              : Effect.succeed(reply)
          )
        )

    const conn: RespConnection = {
      command,
      closed: Deferred.await(closed),
      destroy: Effect.sync(() => shutdown(new RedisError({ kind: "closed", code: "local" }))),
      abort: (why) => Effect.sync(() => shutdown(why))
    }

    const handshake = Effect.gen(function*() {
      yield* Deferred.await(ready)
      if (target.password !== undefined || target.username !== undefined) {
        // a user name alone is an ACL user without a password (`nopass`): AUTH <user> "" logs in
        // as that user (PING would run as `default`, refused when it is off, or unbounded by the
        // user's ACL)
        const password = target.password === undefined ? "" : Redacted.value(target.password)
        const args = target.username !== undefined ? ["AUTH", target.username, password] : ["AUTH", password]
        yield* command(args).pipe(
          Effect.mapError((e) => (e.kind === "reply" ? new RedisError({ kind: "auth", code: e.code }) : e))
        )
      } else {
        // without a password nothing has asked the server yet whether it lets us in: one that
        // requires a password answers every command with NOAUTH, so the connection fails here
        // (logged, retried with backoff) instead of counting as connected while each PUBLISH fails
        const refused = (e: RedisError) => e.kind === "reply" && e.code === "NOAUTH"
        yield* command(["PING"]).pipe(
          Effect.mapError((e) => (refused(e) ? new RedisError({ kind: "auth", code: e.code }) : e))
        )
      }
      if (target.db !== 0) yield* command(["SELECT", String(target.db)])
    })
    yield* handshake.pipe(
      Effect.timeoutFail({
        duration: options.connectTimeout ?? Duration.seconds(5),
        onTimeout: () => new RedisError({ kind: "timeout", code: "connect" })
      }),
      Effect.tapError((e) => Effect.sync(() => shutdown(e)))
    )
    return conn
  })

// ---------------------------------------------------------------------------------------------
// The service

export interface PublisherStats {
  readonly configured: boolean
  readonly connected: boolean
  readonly dropped: number
  readonly published: number
}

export interface PublisherShape {
  /** Publish an audit event; returns at once, never fails: a message that cannot go out is dropped. */
  readonly publish: (event: AuditEvent) => Effect.Effect<void>
  readonly stats: Effect.Effect<PublisherStats>
}

export class Publisher extends Context.Tag("firehook/Publisher")<Publisher, PublisherShape>() {}

/** What `make` returns: the service plus a way to wait for a state (tests, the CLI). */
export interface PublisherHandle extends PublisherShape {
  readonly awaitStats: (predicate: (s: PublisherStats) => boolean) => Effect.Effect<PublisherStats>
}

export interface PublisherOptions {
  /** `REDIS_URL`; unset → a no-op publisher (`configured: false`) */
  readonly url: Redacted.Redacted<string> | undefined
  /** `WEBHOOK_EVENTS_CHANNEL` (default `webhook:events`) */
  readonly channel: string
  readonly maxMessageBytes?: number
  readonly maxInFlight?: number
  readonly replyTimeout?: Duration.DurationInput
  readonly connectTimeout?: Duration.DurationInput
  readonly backoffBase?: Duration.DurationInput
  readonly backoffCap?: Duration.DurationInput
}

export const DEFAULTS = {
  channel: DeliveryConfig.redis.channel.default,
  maxMessageBytes: DeliveryConfig.redis.publishMaxBytes.default,
  maxInFlight: DeliveryConfig.redis.publishMaxInFlight.default,
  replyTimeout: Duration.millis(DeliveryConfig.redis.publishTimeoutMs.default),
  connectTimeout: Duration.seconds(5),
  backoffBase: Duration.millis(500),
  backoffCap: Duration.seconds(30)
} as const

/**
 * Full-jitter exponential backoff: the n-th delay is uniform in [0, min(cap, base · 2ⁿ)).
 * Randomness comes from Effect's `Random`, time from its `Clock` ({@link Backoff.fullJitterSchedule}).
 */
export const fullJitterBackoff = (base: Duration.DurationInput, cap: Duration.DurationInput) =>
  Backoff.fullJitterSchedule({ base, cap })

/** Why a message was dropped (the `reason` label of `firehook_redis_dropped_total`). */
export const DROP_REASONS = ["oversize", "not_connected", "in_flight", "timeout", "error"] as const
type DropReason = (typeof DROP_REASONS)[number]

const publishedTotal = Metric.counter("firehook_redis_published_total", {
  description: "Audit events published to Redis",
  incremental: true
})
/** `{ reason }`: a {@link DropReason} */
const droppedTotal = labelledCounterFamily("firehook_redis_dropped_total", {
  description: "Audit events not published to Redis, by reason",
  incremental: true
})

const healthSection = (stats: Effect.Effect<PublisherStats>) =>
  statsSection(stats, ["configured", "connected", "dropped"])

/**
 * The publisher, for the lifetime of the calling scope: its connection fiber and in-flight
 * messages are interrupted, and its socket destroyed, when the scope closes. Registers the `redis`
 * health section (never gating readiness). Fails only on an invalid URL.
 */
export const make = (
  options: PublisherOptions
): Effect.Effect<PublisherHandle, RedisUrlInvalid, Health | Scope.Scope> =>
  Effect.gen(function*() {
    const health = yield* Health
    const state = yield* SubscriptionRef.make<PublisherStats>({
      configured: options.url !== undefined,
      connected: false,
      dropped: 0,
      published: 0
    })
    const stats = SubscriptionRef.get(state)
    const awaitStats = (predicate: (s: PublisherStats) => boolean) =>
      state.changes.pipe(
        Stream.filter(predicate),
        Stream.runHead,
        Effect.flatMap(Option.match({ onNone: () => stats, onSome: Effect.succeed }))
      )
    yield* health.register("redis", healthSection(stats))

    if (options.url === undefined) {
      return { publish: () => Effect.void, stats, awaitStats }
    }
    const target = yield* Either.match(parseRedisUrl(Redacted.value(options.url)), {
      onLeft: Effect.fail,
      onRight: Effect.succeed
    })

    const maxMessageBytes = options.maxMessageBytes ?? DEFAULTS.maxMessageBytes
    const maxInFlight = options.maxInFlight ?? DEFAULTS.maxInFlight
    const replyTimeout = options.replyTimeout ?? DEFAULTS.replyTimeout
    const backoffCapMs = Duration.toMillis(Duration.decode(options.backoffCap ?? DEFAULTS.backoffCap))
    const channel = options.channel

    const current = yield* Ref.make(Option.none<RespConnection>())
    const inFlight = yield* Ref.make(0)
    const fibers = yield* FiberSet.make<void, never>()
    // connection errors are logged at most once a minute
    const problems = RateLimitedLog.make()

    const drop = (reason: DropReason) =>
      SubscriptionRef.update(state, (s) => ({ ...s, dropped: s.dropped + 1 })).pipe(
        Effect.zipRight(Metric.increment(droppedTotal({ reason })))
      )

    /** Log a connection problem at most once a minute (kind and code only). */
    const logProblem = (message: string, e: RedisError) =>
      problems.run("connection", (suppressed) =>
        Effect.logWarning(message).pipe(Effect.annotateLogs({ kind: e.kind, code: e.code, suppressed })))

    /**
     * A PUBLISH the server answered with an error (an ACL's `NOPERM`, `OOM`, a `READONLY` replica):
     * the connection is fine and `/health` shows it connected, so without this line the only sign
     * is `firehook_redis_dropped_total{reason="error"}`. At most once a minute; the reply's first
     * word only (the rest may echo the channel or the message).
     */
    const logRefused = (e: RedisError) =>
      problems.run("refused", (suppressed) =>
        Effect.logWarning("redis refused a publish").pipe(
          Effect.annotateLogs({ kind: e.kind, code: e.code, suppressed })
        ))

    // One connection at a time; the backoff resets only after a connection that stayed up for a
    // whole backoff cap, so a server that accepts and then drops at once cannot make us spin.
    const connection = Effect.gen(function*() {
      const driver = yield* Schedule.driver(
        fullJitterBackoff(options.backoffBase ?? DEFAULTS.backoffBase, options.backoffCap ?? DEFAULTS.backoffCap)
      )
      const session = Effect.gen(function*() {
        // the connection's own bound on commands awaiting a reply is the publisher's in-flight bound
        // (its default, 16, would refuse messages 17.. of a larger REDIS_PUBLISH_MAX_IN_FLIGHT)
        const conn = yield* connect(target, {
          connectTimeout: options.connectTimeout ?? DEFAULTS.connectTimeout,
          maxPending: maxInFlight
        })
        const since = yield* Clock.currentTimeMillis
        yield* Ref.set(current, Option.some(conn))
        yield* SubscriptionRef.update(state, (s) => ({ ...s, connected: true }))
        yield* Effect.logDebug("redis connected")
        const why = yield* conn.closed
        const uptime = (yield* Clock.currentTimeMillis) - since
        return { why, uptime }
      }).pipe(
        Effect.scoped,
        Effect.ensuring(
          Ref.set(current, Option.none()).pipe(
            Effect.zipRight(SubscriptionRef.update(state, (s) => ({ ...s, connected: false })))
          )
        )
      )
      while (true) {
        const result = yield* Effect.either(session)
        if (Either.isRight(result)) {
          if (result.right.uptime >= backoffCapMs) {
            yield* driver.reset
          }
          yield* logProblem("redis connection lost", result.right.why)
        } else {
          yield* logProblem("redis connection failed", result.left)
        }
        yield* driver.next(undefined).pipe(Effect.ignore)
      }
    })
    yield* Effect.forkScoped(connection)

    const send = (conn: RespConnection, json: string) =>
      conn.command(["PUBLISH", channel, json]).pipe(
        Effect.timeoutFail({
          duration: replyTimeout,
          onTimeout: () =>
            new RedisError({ kind: "timeout", code: "reply" })
        }),
        Effect.matchEffect({
          onSuccess: () =>
            SubscriptionRef.update(state, (s) => ({ ...s, published: s.published + 1 })).pipe(
              Effect.zipRight(Metric.increment(publishedTotal))
            ),
          onFailure: (e) =>
            e.kind === "timeout"
              // a server that does not answer within the timeout is treated as gone: reset (and
              // logged as the timeout it was, not as a local close)
              ? Effect.zipRight(conn.abort(e), drop("timeout"))
              : e.kind === "reply"
              ? Effect.zipRight(logRefused(e), drop("error"))
              : drop("error")
        }),
        Effect.ensuring(Ref.update(inFlight, (n) => n - 1))
      )

    const publish = Effect.fn("Publisher.publish")(function*(event: AuditEvent) {
      const json = encodeEvent(event)
      if (Buffer.byteLength(json, "utf8") > maxMessageBytes) return yield* drop("oversize")
      const conn = yield* Ref.get(current)
      if (Option.isNone(conn)) return yield* drop("not_connected")
      const slot = yield* Ref.modify(inFlight, (n) => (n < maxInFlight ? [true, n + 1] : [false, n]))
      if (!slot) return yield* drop("in_flight")
      yield* FiberSet.run(fibers, send(conn.value, json))
    })

    return { publish, stats, awaitStats }
  })

/** The publisher layer (the Tag), for the lifetime of the layer's scope. */
export const layer = (options: PublisherOptions): Layer.Layer<Publisher, RedisUrlInvalid, Health> =>
  Layer.scoped(Publisher, make(options))

/** A publisher that publishes nothing and registers no health section (tests, embedding). */
export const layerNoop: Layer.Layer<Publisher> = Layer.succeed(Publisher, {
  publish: () => Effect.void,
  stats: Effect.succeed({ configured: false, connected: false, dropped: 0, published: 0 })
})
