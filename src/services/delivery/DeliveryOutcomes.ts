/**
 * Terminal outcomes of deliveries as they settle (delivered, dead_letter, cancelled), for the
 * owners' live tail (SPEC §8.5 `subscribeDeliveries`). Optional for the worker: the settle path
 * publishes to it only when the process has one, and never waits for it.
 *
 * - In process: a bounded, dropping `PubSub` ({@link PUBSUB_CAPACITY}); the API's tail hub of the
 *   same process subscribes to it. A full PubSub drops the outcome (counted): the tail is best
 *   effort, the delivery log (`listDeliveries`) is the record.
 * - Across replicas (`notify`, the processes that settle): outcomes also go into a sliding queue
 *   ({@link QUEUE_MAX}), drained by one fiber that sends them, ≤ {@link BATCH_MAX} per
 *   `pg_notify('firehook_outcomes', …)`, each payload under {@link PAYLOAD_MAX_BYTES} (PostgreSQL's
 *   limit is 8,000). The payload is compact JSON: this process's origin id and, per outcome, the
 *   delivery id, owner DID, webhook rkey, event, status, HTTP status, error kind and time. Never a
 *   URL, a body, a header or a secret.
 * - `listen` (the processes that serve the API): `LISTEN firehook_outcomes`, payloads of other
 *   origins are published to the local PubSub (this process's own are already there: deduped by
 *   origin). A LISTEN that fails is opened again with backoff (1 s → 30 s).
 * - Demand (`OutcomesTransport.demand`; the PostgreSQL layer has it). Outcomes are notified only
 *   while some other process wants them: a process whose tail has an open connection
 *   ({@link DeliveryOutcomesShape.demand}) sends `pg_notify('firehook_tail_demand', <origin>)` at
 *   once and every {@link DEMAND_EVERY_MS}; a notifying process that heard another origin's demand
 *   within {@link DEMAND_TTL_MS} notifies its outcomes, and otherwise sends nothing. Without it
 *   every settle of every delivery process cost a JSON encoding, a share of a `pg_notify`, and a
 *   decode in every API process, whether anybody tailed or not (a fifth of the end-to-end
 *   throughput: docs/benchmarks.md). An outcome settled in the moment between a tail's first
 *   connection and its demand reaching the other processes is not on that tail (best effort).
 *
 * Best effort by design: a notification lost (LISTEN down, a full queue) is a missed tail frame,
 * never a missed delivery.
 */
import * as PgClient from "@effect/sql-pg/PgClient"
import * as SqlClient from "@effect/sql/SqlClient"
import { Chunk, Clock, Context, Duration, Effect, Either, Layer, Metric, PubSub, Queue, Schema, Stream } from "effect"
import type { Scope } from "effect"
import { randomBytes } from "node:crypto"
import { isCanonicalDid } from "../../schemas/AtUri.js"
import { OUTCOME_EVENTS } from "../../schemas/WebhookLexicon.js"
import { reportableStatus } from "../../schemas/XrpcContract.js"
import { TERMINAL_STATUSES, type TerminalStatus } from "../matching/OutboxStatus.js"
import * as ListenLoop from "../platform/ListenLoop.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"

export const CHANNEL = "firehook_outcomes"
/** Outcomes held for local subscribers at most (dropping beyond). */
export const PUBSUB_CAPACITY = 4_096
/** Outcomes waiting to be notified at most (a sliding queue: the oldest go first). */
export const QUEUE_MAX = 4_096
/** Outcomes per notification at most. */
export const BATCH_MAX = 256
/** A notification's payload at most (PostgreSQL's limit is 8,000 bytes). */
export const PAYLOAD_MAX_BYTES = 7_000
/** The channel on which processes with open tails say that they want the others' outcomes. */
export const DEMAND_CHANNEL = "firehook_tail_demand"
/** A process with open tails repeats its demand this often. */
export const DEMAND_EVERY_MS = 1_000
/** A demand heard this long ago or less keeps this process notifying. */
export const DEMAND_TTL_MS = 3_000

export type OutcomeEvent = (typeof OUTCOME_EVENTS)[number]

/** One terminal outcome of a delivery. */
export interface Outcome {
  readonly id: string
  /** the webhook's owner: the only caller who may see it */
  readonly owner: string
  /** the webhook's record key */
  readonly rkey: string
  readonly event: OutcomeEvent
  readonly status: TerminalStatus
  readonly httpStatus: number | undefined
  readonly errorKind: string | undefined
  /** when it settled, epoch ms */
  readonly atMs: number
}

export interface DeliveryOutcomesShape {
  /** Offer an outcome. Never waits: dropped (counted) when the buffers are full. */
  readonly publish: (outcome: Outcome) => Effect.Effect<void>
  /** Every outcome from now on (this process's and, with `listen`, the other processes'), for the scope. */
  readonly subscribe: Effect.Effect<Queue.Dequeue<Outcome>, never, Scope.Scope>
  /**
   * For as long as the scope is open, this process wants the other processes' outcomes (the tail
   * hub holds one per open connection): with a demand transport, they are asked to notify them.
   */
  readonly demand: Effect.Effect<void, never, Scope.Scope>
  /** Whether this process's outcomes are currently sent to the other processes. */
  readonly notifying: Effect.Effect<boolean>
}

export class DeliveryOutcomes extends Context.Tag("firehook/DeliveryOutcomes")<
  DeliveryOutcomes,
  DeliveryOutcomesShape
>() {}

const dropped = Metric.counter("firehook_outcomes_dropped_total", {
  description: "Delivery outcomes not passed to the live tail (full buffers, oversized): best effort"
})
const notified = Metric.counter("firehook_outcomes_notified_total", {
  description: "Delivery outcomes sent to the other processes (pg_notify firehook_outcomes)"
})
const received = Metric.counter("firehook_outcomes_received_total", {
  description: "Delivery outcomes received from other processes (LISTEN firehook_outcomes)"
})
const failures = Metric.counter("firehook_outcomes_failures_total", {
  description: "Outcome notifications that could not be sent or received (best effort)"
})

// ---------------------------------------------------------------------------------------------
// The payload

/**
 * One outcome as notified: [id, owner, rkey, event, status, httpStatus|null, errorKind|null, atMs].
 * The HTTP status only when it is one the tail can show (100–599, `reportableStatus`): a receiver's
 * 999 is notified as null (its `http_5xx` says it), and read as none from a process that sent it.
 */
const Row = Schema.Tuple(
  Schema.String.pipe(Schema.maxLength(128)),
  Schema.String.pipe(Schema.maxLength(2048), Schema.filter(isCanonicalDid)),
  Schema.String.pipe(Schema.maxLength(512)),
  Schema.Literal(...OUTCOME_EVENTS),
  Schema.Literal(...TERMINAL_STATUSES),
  Schema.NullOr(Schema.Int),
  Schema.NullOr(Schema.String.pipe(Schema.maxLength(64))),
  // epoch ms within Date's range (±8.64e15): a time the tail cannot render is a row that does not decode
  Schema.Int.pipe(Schema.between(0, 8_640_000_000_000_000))
)
/** The rows are decoded one by one: a row that does not decode is skipped, not the payload. */
const Payload = Schema.parseJson(
  Schema.Struct({ o: Schema.String, d: Schema.Array(Schema.Unknown).pipe(Schema.maxItems(BATCH_MAX)) })
)
const decodePayload = Schema.decodeUnknownEither(Payload)
const decodeRow = Schema.decodeUnknownEither(Row)

const rowOf = (o: Outcome): typeof Row.Type => [
  o.id,
  o.owner,
  o.rkey,
  o.event,
  o.status,
  reportableStatus(o.httpStatus) ?? null,
  o.errorKind ?? null,
  o.atMs
]

/**
 * The payloads of `outcomes` from `origin`, each at most `maxBytes` (UTF-8) and {@link BATCH_MAX}
 * outcomes; an outcome too large on its own is left out (counted by the caller: `skipped`).
 */
export const encodePayloads = (
  origin: string,
  outcomes: Iterable<Outcome>,
  maxBytes = PAYLOAD_MAX_BYTES
): {
  readonly payloads: ReadonlyArray<{ readonly text: string; readonly count: number }>
  readonly skipped: number
} => {
  const head = `{"o":${JSON.stringify(origin)},"d":[`
  const out: Array<{ readonly text: string; readonly count: number }> = []
  let parts: Array<string> = []
  let bytes = Buffer.byteLength(head) + 2
  let skipped = 0
  const flush = () => {
    if (parts.length > 0) out.push({ text: `${head}${parts.join(",")}]}`, count: parts.length })
    parts = []
    bytes = Buffer.byteLength(head) + 2
  }
  for (const o of outcomes) {
    const text = JSON.stringify(rowOf(o))
    const size = Buffer.byteLength(text) + 1
    if (Buffer.byteLength(head) + 2 + size > maxBytes) {
      skipped++
      continue
    }
    if (bytes + size > maxBytes || parts.length >= BATCH_MAX) flush()
    parts.push(text)
    bytes += size
  }
  flush()
  return { payloads: out, skipped }
}

/**
 * The origin and outcomes of a payload, or undefined when it is not one; `skipped`: its rows that
 * are not outcomes (left out, the others kept).
 */
export const decode = (
  payload: string
): { readonly origin: string; readonly outcomes: ReadonlyArray<Outcome>; readonly skipped: number } | undefined => {
  const r = decodePayload(payload)
  if (Either.isLeft(r)) return undefined
  const outcomes: Array<Outcome> = []
  for (const row of r.right.d) {
    const d = decodeRow(row)
    if (Either.isLeft(d)) continue
    const [id, owner, rkey, event, status, httpStatus, errorKind, atMs] = d.right
    outcomes.push({
      id,
      owner,
      rkey,
      event,
      status,
      httpStatus: reportableStatus(httpStatus),
      errorKind: errorKind ?? undefined,
      atMs
    })
  }
  return { origin: r.right.o, outcomes, skipped: r.right.d.length - outcomes.length }
}

// ---------------------------------------------------------------------------------------------
// The service

export interface OutcomesTransport {
  /** send one payload to the other processes (pg_notify) */
  readonly send?: (payload: string) => Effect.Effect<void, unknown>
  /** the payloads the other processes send (LISTEN); it ends or fails when the connection does */
  readonly listen?: Stream.Stream<string, unknown>
  /**
   * The demand channel. Without it, `send` sends every outcome (as if always wanted). With it, a
   * process with `send` notifies only while another process's demand is fresh (it follows
   * `demand.listen`), and a process with `listen` sends its demand while one of its scopes holds it.
   */
  readonly demand?: {
    readonly send: (origin: string) => Effect.Effect<void, unknown>
    readonly listen: Stream.Stream<string, unknown>
  }
}

/** The service over a transport (none: this process only). Its fibers live in the scope. */
export const make = (transport: OutcomesTransport = {}): Effect.Effect<DeliveryOutcomesShape, never, Scope.Scope> =>
  Effect.gen(function*() {
    const origin = randomBytes(9).toString("base64url")
    const pubsub = yield* PubSub.dropping<Outcome>(PUBSUB_CAPACITY)
    yield* Effect.addFinalizer(() => PubSub.shutdown(pubsub))
    const log = RateLimitedLog.make()
    const local = (o: Outcome) =>
      Effect.flatMap(PubSub.publish(pubsub, o), (ok) => ok ? Effect.void : Metric.increment(dropped))

    // demand: when another origin last asked for outcomes (epoch ms), and how many scopes here ask
    const demandTransport = transport.demand
    let demandHeardAt = Number.NEGATIVE_INFINITY
    let demanders = 0
    const wanted: Effect.Effect<boolean> = demandTransport === undefined
      ? Effect.succeed(true)
      : Effect.map(Clock.currentTimeMillis, (now) => now - demandHeardAt <= DEMAND_TTL_MS)

    let toNotify: Queue.Queue<Outcome> | undefined
    if (transport.send !== undefined) {
      const send = transport.send
      const queue = yield* Queue.sliding<Outcome>(QUEUE_MAX)
      toNotify = queue
      const sendOne = (payload: string, n: number) =>
        ListenLoop.notifyBestEffort(Effect.zipRight(send(payload), Metric.incrementBy(notified, n)), {
          failures,
          log,
          key: "send",
          message: "delivery outcomes not notified"
        })
      yield* Effect.forkScoped(Effect.forever(
        Effect.gen(function*() {
          const batch = Chunk.toReadonlyArray(yield* Queue.takeBetween(queue, 1, BATCH_MAX))
          const { payloads, skipped } = encodePayloads(origin, batch)
          if (skipped > 0) yield* Metric.incrementBy(dropped, skipped)
          for (const p of payloads) yield* sendOne(p.text, p.count)
        })
      ))
    }

    if (transport.listen !== undefined) {
      const onPayload = (payload: string) =>
        Effect.gen(function*() {
          const parsed = decode(payload)
          if (parsed === undefined) return yield* Metric.increment(failures)
          // this process's own outcomes are already in the PubSub
          if (parsed.origin === origin) return
          for (const o of parsed.outcomes) yield* local(o)
          yield* Metric.incrementBy(received, parsed.outcomes.length)
          if (parsed.skipped > 0) {
            yield* Metric.incrementBy(dropped, parsed.skipped)
            yield* log.run("row", (suppressed) =>
              Effect.logWarning("delivery outcomes: notified outcomes that do not decode were skipped").pipe(
                Effect.annotateLogs({ skipped: parsed.skipped, suppressed })
              ))
          }
        })
      yield* Effect.forkScoped(
        ListenLoop.follow(transport.listen, onPayload, {
          failures,
          log,
          message: "delivery outcomes: LISTEN failed; reopening"
        })
      )
    }

    // the demand: heard by the processes that notify, sent by the ones that listen
    const demandWake = yield* Queue.sliding<void>(1)
    if (demandTransport !== undefined && transport.send !== undefined) {
      yield* Effect.forkScoped(
        ListenLoop.follow(
          demandTransport.listen,
          (from) =>
            from === origin ? Effect.void : Effect.map(Clock.currentTimeMillis, (now) => {
              demandHeardAt = now
            }),
          { failures, log, message: "delivery outcomes: LISTEN for tail demand failed; reopening" }
        )
      )
    }
    if (demandTransport !== undefined && transport.listen !== undefined) {
      const sendDemand = ListenLoop.notifyBestEffort(demandTransport.send(origin), {
        failures,
        log,
        key: "demand",
        message: "delivery outcomes: tail demand not sent"
      })
      // while anything here demands: at once, then every DEMAND_EVERY_MS; otherwise wait for a demand
      yield* Effect.forkScoped(Effect.forever(
        Effect.suspend(() =>
          demanders > 0
            ? Queue.takeAll(demandWake).pipe(
              Effect.zipRight(sendDemand),
              Effect.zipRight(Queue.take(demandWake).pipe(Effect.timeoutOption(Duration.millis(DEMAND_EVERY_MS))))
            )
            : Queue.take(demandWake)
        )
      ))
    }
    const demand: Effect.Effect<void, never, Scope.Scope> = Effect.acquireRelease(
      Effect.sync(() => {
        demanders++
        if (demanders === 1) demandWake.unsafeOffer(undefined)
      }),
      () =>
        Effect.sync(() => {
          demanders--
        })
    )

    const notify = toNotify
    const shape: DeliveryOutcomesShape = {
      publish: (o) =>
        notify === undefined
          ? local(o)
          : Effect.zipRight(
            local(o),
            Effect.flatMap(wanted, (w) => w ? Queue.offer(notify, o) : Effect.succeed(false))
          ).pipe(Effect.asVoid),
      subscribe: PubSub.subscribe(pubsub),
      demand,
      notifying: notify === undefined ? Effect.succeed(false) : wanted
    }
    return shape
  })

/** This process only (tests, an embedder with the worker and the API in one process). */
export const layerMemory: Layer.Layer<DeliveryOutcomes> = Layer.scoped(DeliveryOutcomes, make())

export interface SqlOptions {
  /** notify the other processes of this process's outcomes (the delivery role) */
  readonly notify: boolean
  /** receive the other processes' outcomes (the api role) */
  readonly listen: boolean
}

/** Across processes over PostgreSQL `NOTIFY` / `LISTEN` on {@link CHANNEL}. */
export const layerSql = (
  options: SqlOptions
): Layer.Layer<DeliveryOutcomes, never, SqlClient.SqlClient | PgClient.PgClient> =>
  Layer.scoped(
    DeliveryOutcomes,
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const pg = yield* PgClient.PgClient
      return yield* make({
        ...(options.notify ? { send: (payload: string) => sql`SELECT pg_notify(${CHANNEL}, ${payload})` } : {}),
        ...(options.listen ? { listen: pg.listen(CHANNEL) } : {}),
        demand: {
          send: (origin: string) => sql`SELECT pg_notify(${DEMAND_CHANNEL}, ${origin})`,
          listen: pg.listen(DEMAND_CHANNEL)
        }
      })
    })
  )
