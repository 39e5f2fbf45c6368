/**
 * Shared pieces of the delivery worker tests: real HTTP receivers on 127.0.0.1 that verify every
 * signature (the `standardwebhooks` library, plus an independent recomputation of the wisp
 * `sha256=` header), the worker layer over a database, and bounded database polling.
 */
import type * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { expect } from "@effect/vitest"
import { Context, Data, Duration, Effect, Either, Layer, Option, type Redacted } from "effect"
import type { Scope } from "effect"
import { createHmac } from "node:crypto"
import * as Http from "node:http"
import type * as Net from "node:net"
import { Webhook } from "standardwebhooks"
import type { StreamEvent } from "../../src/schemas/RecordEvent.js"
import * as Delivery from "../../src/services/delivery/Delivery.js"
import type { DeliveryOutcomes } from "../../src/services/delivery/DeliveryOutcomes.js"
import * as DeliveryStore from "../../src/services/delivery/DeliveryStore.js"
import { Destinations } from "../../src/services/delivery/Destinations.js"
import { type AuditEvent, Publisher } from "../../src/services/delivery/Publisher.js"
import { Secrets } from "../../src/services/delivery/Secrets.js"
import { Processor } from "../../src/services/matching/Processor.js"
import * as WebhookState from "../../src/services/operator/WebhookState.js"
import { FirehookConfig, type FirehookConfigShape, layerValue } from "../../src/services/platform/Config.js"
import * as Database from "../../src/services/platform/Database.js"
import * as Health from "../../src/services/platform/Health.js"
import { parseAllowCidrs, SafeHttp } from "../../src/services/platform/http/SafeHttp.js"
import * as Lifecycle from "../../src/services/platform/Lifecycle.js"
import * as Metrics from "../../src/services/platform/Metrics.js"
import * as RegistryStore from "../../src/services/registry/RegistryStore.js"
import { freePort } from "../support/proc.js"

// ---------------------------------------------------------------------------------------------
// Receivers

export interface Received {
  readonly method: string
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  /** header names in the order received, lowercased */
  readonly headerNames: ReadonlyArray<string>
  readonly body: Buffer
  /** performance.now() at arrival */
  readonly at: number
  /** undefined when no secret is known for the request's webhook */
  readonly verified: { readonly standard: boolean; readonly wisp: boolean } | undefined
}

export interface Receiver {
  readonly url: string
  readonly port: number
  readonly received: Array<Received>
  /** requests per `webhook-id` (= delivery id) */
  readonly hits: Map<string, number>
}

/** What a request gets: a status, headers and a body (after `delayMs`, default at once); or `"hang"` (never answered). */
export type Reply = {
  readonly status: number
  readonly headers?: Record<string, string>
  readonly body?: string | Buffer
  readonly delayMs?: number
} | "hang"

/**
 * The default replies by path: `/status/<code>`, `/retry-after/<seconds>` (503 + Retry-After),
 * `/redirect` (302), `/big` (200 with a 70 KiB body), `/hang`, anything else 200 `ok`.
 */
export const routeByPath = (path: string): Reply => {
  const status = /^\/status\/(\d{3})/.exec(path)
  if (status !== null) return { status: Number(status[1]) }
  const retryAfter = /^\/retry-after\/(\d+)/.exec(path)
  if (retryAfter !== null) return { status: 503, headers: { "retry-after": retryAfter[1] ?? "1" } }
  if (path.startsWith("/redirect")) return { status: 302, headers: { location: "http://127.0.0.1:1/elsewhere" } }
  if (path.startsWith("/big")) return { status: 200, body: Buffer.alloc(70 * 1024, 0x61) }
  if (path.startsWith("/hang")) return "hang"
  return { status: 200, body: "ok" }
}

const verify = (secret: string, body: Buffer, headers: Http.IncomingHttpHeaders) => {
  const plain: Record<string, string> = {}
  for (const [k, v] of Object.entries(headers)) if (typeof v === "string") plain[k] = v
  const wh = secret.startsWith("whsec_") ? new Webhook(secret) : new Webhook(secret, { format: "raw" })
  const standard = Either.isRight(Either.try(() => wh.verify(body.toString("utf8"), plain)))
  const expected = "sha256=" + createHmac("sha256", Buffer.from(secret, "utf8")).update(body).digest("hex")
  return { standard, wisp: headers["x-webhook-signature"] === expected }
}

/**
 * A receiver on 127.0.0.1 for the lifetime of the scope. `secretFor` maps the `X-Firehook-Webhook`
 * header to the webhook's secret; every signed request is verified both ways.
 */
export const receiver = (options: {
  readonly reply?: (path: string, req: Received) => Reply
  readonly secretFor?: (webhookUri: string) => string | undefined
} = {}): Effect.Effect<Receiver, never, Scope.Scope> =>
  Effect.gen(function*() {
    const received: Array<Received> = []
    const hits = new Map<string, number>()
    const handle = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
      const chunks: Array<Buffer> = []
      req.on("data", (c: Buffer) => chunks.push(c))
      req.on("end", () => {
        const body = Buffer.concat(chunks)
        const webhook = req.headers["x-firehook-webhook"]
        const secret = typeof webhook === "string" ? options.secretFor?.(webhook) : undefined
        const headerNames: Array<string> = []
        for (let i = 0; i < req.rawHeaders.length; i += 2) headerNames.push((req.rawHeaders[i] ?? "").toLowerCase())
        const entry: Received = {
          method: req.method ?? "",
          path: req.url ?? "",
          headers: req.headers,
          headerNames,
          body,
          at: performance.now(),
          verified: secret === undefined ? undefined : verify(secret, body, req.headers)
        }
        received.push(entry)
        const id = req.headers["webhook-id"] ?? req.headers["idempotency-key"]
        if (typeof id === "string") hits.set(id, (hits.get(id) ?? 0) + 1)
        const reply = (options.reply ?? ((p: string) => routeByPath(p)))(entry.path, entry)
        if (reply === "hang") return
        const answer = () => {
          if (res.destroyed) return
          res.writeHead(reply.status, reply.headers ?? {})
          res.end(reply.body ?? "")
        }
        if (reply.delayMs === undefined || reply.delayMs <= 0) answer()
        else setTimeout(answer, reply.delayMs)
      })
    }
    const { port, url } = yield* loopbackServer(handle, { keepAliveTimeout: 5_000 })
    return { url, port, received, hits }
  })

/**
 * An HTTP server on a loopback port of the system's choosing for the scope: its open sockets are
 * destroyed and it is closed when the scope closes (a stalled answer never holds the close up).
 */
export const loopbackServer = (
  handle: (req: Http.IncomingMessage, res: Http.ServerResponse) => void,
  options: { readonly keepAliveTimeout?: number } = {}
): Effect.Effect<{ readonly port: number; readonly url: string }, never, Scope.Scope> =>
  Effect.acquireRelease(
    Effect.async<{ server: Http.Server; sockets: Set<Net.Socket>; port: number }>((resume) => {
      const sockets = new Set<Net.Socket>()
      const server = Http.createServer(handle)
      if (options.keepAliveTimeout !== undefined) server.keepAliveTimeout = options.keepAliveTimeout
      server.on("connection", (s: Net.Socket) => {
        sockets.add(s)
        s.on("close", () => sockets.delete(s))
      })
      server.listen(0, "127.0.0.1", () => {
        const addr = server.address()
        resume(Effect.succeed({ server, sockets, port: typeof addr === "object" && addr !== null ? addr.port : 0 }))
      })
    }),
    ({ server, sockets }) =>
      Effect.async<void>((resume) => {
        for (const s of sockets) s.destroy()
        server.close(() => resume(Effect.void))
      })
  ).pipe(Effect.map(({ port }) => ({ port, url: `http://127.0.0.1:${port}` })))

/**
 * A loopback port nothing listens on: bindable a moment ago, and below the kernel's ephemeral range
 * (proc.ts freePort), where no other test's listener on port 0 can land before the connection. A
 * port of that range (bound to 0, then closed) could be taken by one, and the refused connection
 * be answered instead.
 */
export const closedPort = Effect.promise(freePort)

/** A fresh `whsec_` secret (32 fixed bytes derived from `n`). */
export const whsec = (n: number): string => "whsec_" + Buffer.alloc(32, n).toString("base64")

// ---------------------------------------------------------------------------------------------
// The worker

export const recordingPublisher = () => {
  const events: Array<AuditEvent> = []
  const layer = Layer.succeed(Publisher, {
    publish: (e: AuditEvent) =>
      Effect.sync(() => {
        events.push(e)
      }),
    stats: Effect.succeed({ configured: false, connected: false, dropped: 0, published: events.length })
  })
  return { events, layer }
}

const safeHttpFromConfig = Layer.unwrapEffect(
  Effect.map(FirehookConfig, (c) =>
    SafeHttp.layerDefault({
      allowInsecureDev: c.allowInsecureDev,
      allowCidrs: Either.getOrElse(parseAllowCidrs(c.delivery.allowCidrs.join(",")), () => [])
    }))
)

export interface WorkerSetup {
  readonly options?: Delivery.DeliveryOptions
  readonly secrets?: ReadonlyArray<{ readonly ownerDid: string; readonly name: string; readonly token: string }>
  readonly publisher?: Layer.Layer<Publisher>
  /** the delivery store (default: the PostgreSQL one), e.g. a wrapper that records claims */
  readonly store?: Layer.Layer<DeliveryStore.DeliveryStore, never, SqlClient.SqlClient | PgClient.PgClient>
  /** the live tail's feed the worker publishes terminal outcomes to (none: the worker has none) */
  readonly outcomes?: Layer.Layer<DeliveryOutcomes>
  /** the Lifecycle's shutdown deadline (default 10 s) */
  readonly shutdownTimeoutMs?: number
}

/**
 * The worker and everything it needs except the database and the configuration. Outputs the
 * worker, Health and Lifecycle (so tests can read health and run a shutdown).
 */
export const workerLayer = (setup: WorkerSetup = {}) =>
  Delivery.layer(setup.options).pipe(
    Layer.provideMerge(
      Layer.mergeAll(
        setup.store ?? DeliveryStore.layerSql,
        RegistryStore.layerSql,
        Secrets.layerMemory(setup.secrets ?? []),
        safeHttpFromConfig,
        Destinations.layer,
        setup.publisher ?? recordingPublisher().layer,
        setup.outcomes ?? Layer.empty,
        Health.layer.pipe(
          Layer.provideMerge(Lifecycle.layer({ shutdownTimeout: Duration.millis(setup.shutdownTimeoutMs ?? 10_000) }))
        )
      )
    )
  )

export interface Worker {
  readonly delivery: Delivery.DeliveryShape
  readonly health: Health.HealthShape
  readonly lifecycle: Lifecycle.LifecycleShape
}

/** Start a worker for the lifetime of the scope. */
export const startWorker = (
  setup: WorkerSetup = {}
): Effect.Effect<Worker, never, Scope.Scope | SqlClient.SqlClient | PgClient.PgClient | FirehookConfig> =>
  Effect.map(Layer.build(workerLayer(setup)), (ctx) => ({
    delivery: Context.get(ctx, Delivery.Delivery),
    health: Context.get(ctx, Health.Health),
    lifecycle: Context.get(ctx, Lifecycle.Lifecycle)
  }))

/** Process a batch as the intake's registry writer would (webhook records and events alike). */
export const run = (batch: ReadonlyArray<StreamEvent>) =>
  Effect.flatMap(Processor, (p) => p.processEvents(batch, { registryWriter: true }))

// ---------------------------------------------------------------------------------------------
// Database helpers

export class TimedOut extends Data.TaggedError("TimedOut")<{ readonly what: string }> {}

/** Re-run `eff` every 25 ms until `until` holds; fails after `timeoutMs`. */
export const eventually = <A, E, R>(
  what: string,
  eff: Effect.Effect<A, E, R>,
  until: (a: A) => boolean,
  timeoutMs = 10_000
): Effect.Effect<A, E | TimedOut, R> => {
  const loop: Effect.Effect<A, E, R> = Effect.flatMap(
    eff,
    (a) => until(a) ? Effect.succeed(a) : Effect.zipRight(Effect.sleep(Duration.millis(25)), Effect.suspend(() => loop))
  )
  return loop.pipe(
    Effect.timeoutFail({ duration: Duration.millis(timeoutMs), onTimeout: () => new TimedOut({ what }) })
  )
}

export interface OutboxState {
  readonly delivery_id: string
  readonly webhook_rkey: string
  readonly status: string
  readonly attempt_count: number
  readonly last_error_kind: string | null
  readonly last_http_status: number | null
  readonly lease_token: string | null
  readonly finished_at: Date | null
  /** next_attempt_at − updated_at, seconds */
  readonly delay_s: number
  /** next_attempt_at − now(), seconds */
  readonly due_in_s: number
}

export const outboxRows = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<OutboxState>`
    SELECT delivery_id, webhook_rkey, status, attempt_count, last_error_kind, last_http_status, lease_token, finished_at,
      extract(epoch FROM next_attempt_at - updated_at)::float8 AS delay_s,
      extract(epoch FROM next_attempt_at - now())::float8 AS due_in_s
    FROM outbox ORDER BY webhook_rkey, delivery_id`).pipe(Effect.orDie)

/**
 * `times` more pending rows like the first outbox row of webhook `rkey` (delivery ids `<its id>_<tag><n>`,
 * the same stored origin), all due an hour ago, so they come first in claim order.
 */
export const copyDueRows = (rkey: string, times: number, tag = "c") =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql`
    INSERT INTO outbox (delivery_id, event_id, owner_did, webhook_rkey, match_kind, event_did, event_collection,
      event_rkey, event_operation, target_url, signing_mode, secret_id, fingerprint, origin, next_attempt_at, created_at)
    SELECT o.delivery_id || '_' || ${tag} || g, o.event_id, o.owner_did, o.webhook_rkey, o.match_kind, o.event_did,
      o.event_collection, o.event_rkey, o.event_operation, o.target_url, o.signing_mode, o.secret_id, o.fingerprint,
      o.origin, now() - interval '1 hour' + g * interval '1 millisecond', now() - interval '1 hour'
    FROM (SELECT * FROM outbox WHERE webhook_rkey = ${rkey} ORDER BY length(delivery_id), delivery_id LIMIT 1) o
    CROSS JOIN generate_series(1, ${times}) g`.pipe(Effect.orDie))

/** An outbox row as the parking tests read it. */
export interface EventRow {
  readonly delivery_id: string
  readonly webhook_rkey: string
  readonly status: string
  readonly attempt_count: number
  readonly last_error_kind: string | null
}

/** The outbox rows of the event with record key `eventRkey`, by webhook. */
export const rowsOfEvent = (eventRkey: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) =>
      sql<EventRow>`SELECT delivery_id, webhook_rkey, status, attempt_count, last_error_kind FROM outbox
      WHERE event_rkey = ${eventRkey} ORDER BY webhook_rkey`
  ).pipe(Effect.orDie)

/**
 * Resume the webhook `rkey` with replay: it is cleared and its one parked row is replayed, and that
 * row (of the event `eventRkey`, still `parkedId`) is then delivered.
 */
export const resumeReplaysParked = (owner: string, rkey: string, eventRkey: string, parkedId: string) =>
  Effect.gen(function*() {
    const states = yield* WebhookState.WebhookStateStore
    const resumed = yield* states.resume(owner, rkey, { replay: true })
    expect(Option.map(resumed, (r) => [r.cleared, r.replayed])).toEqual(Option.some([true, 1]))
    const after = yield* eventually(
      "parked row delivered",
      rowsOfEvent(eventRkey),
      (rs) => rs.find((r) => r.webhook_rkey === rkey)?.status === "delivered",
      20_000
    )
    expect(after.find((r) => r.webhook_rkey === rkey)?.delivery_id).toBe(parkedId)
  })

export const countWhere = (table: string, where: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql.unsafe<{ n: number }>(`SELECT count(*)::int AS n FROM ${table} WHERE ${where}`)
  ).pipe(
    Effect.map((r) => Number(r[0]?.n ?? 0)),
    Effect.orDie
  )

/**
 * Start a worker on its own connection pool to the database at `url` (a second "process"), in
 * `scope` (closing it interrupts the worker like a crash would: nothing is handed back).
 */
export const startWorkerOn = (
  url: Redacted.Redacted<string>,
  config: FirehookConfigShape,
  setup: WorkerSetup,
  scope: Scope.Scope
): Effect.Effect<Worker> =>
  Effect.map(
    Layer.buildWithScope(
      workerLayer(setup).pipe(
        Layer.provide(Layer.mergeAll(Database.layerUrl(url, { maxConnections: 16 }), layerValue(config)))
      ),
      scope
    ),
    (ctx) => ({
      delivery: Context.get(ctx, Delivery.Delivery),
      health: Context.get(ctx, Health.Health),
      lifecycle: Context.get(ctx, Lifecycle.Lifecycle)
    })
  ).pipe(Effect.orDie)

/** The enqueue → first attempt histogram's count and sum, from the metrics exposition. */
export const firstAttemptLatency = Effect.map(Metrics.exposition, (text) => {
  const value = (name: string) => {
    const line = text.split("\n").find((l) => l.startsWith(`${name} `))
    return line === undefined ? 0 : Number(line.slice(name.length + 1))
  }
  return {
    count: value("firehook_delivery_first_attempt_latency_ms_count"),
    sum: value("firehook_delivery_first_attempt_latency_ms_sum")
  }
})
