/**
 * The live tail's hub (SPEC §8.5 `subscribeDeliveries`): one subscription to the process's
 * {@link DeliveryOutcomes} (this process's settles and, over PostgreSQL LISTEN, every other
 * replica's), fanned out to the connections of each outcome's owner, and to nobody else.
 *
 * - At most {@link MAX_CONNECTIONS_PER_DID} open connections per caller DID in this process
 *   (the fifth is refused: `TooManyConnections`), and at most {@link MAX_CONNECTIONS} in all (one
 *   did:web host can name any number of DIDs): past it every new connection is refused the same
 *   way. A connection's place (per DID and in all) is given back when its scope closes, however it
 *   ended; the open connections are the gauge `firehook_tail_connections`.
 * - Each connection has a bounded buffer ({@link BUFFER_FRAMES} outcome frames): a reader that
 *   does not keep up loses the newest outcomes, counted, and gets one `#info` frame
 *   (`DeliveriesDropped`, `dropped: n`) after the frames it kept. Never unbounded memory: {@link pump}
 *   takes frames only when its `room` allows (the socket's own buffer is under its bound:
 *   `TailSocket.room`), so a slow reader's frames wait here, not in the runtime's socket buffer.
 * - Each open connection holds the process's outcome demand ({@link DeliveryOutcomes}): the
 *   other processes notify their outcomes only while some process has a connection open.
 * - {@link pump} serves one connection until it has lived {@link MAX_LIFETIME} (24 h, on the
 *   Effect Clock) or the hub closes (the API listener's scope: shutdown).
 * - One outcome never stops the hub: one whose frame cannot be rendered (a time outside Date's range
 *   from another process, or any failure while it is handed out) is skipped alone, counted as
 *   dropped on each of its owner's connections (their next `#info`) and in `firehook_tail_frames_dropped_total`,
 *   and logged at most once a minute, without its values.
 */
import { Context, Data, Duration, Effect, Either, Layer, Metric, Option, Queue } from "effect"
import type { Scope } from "effect"
import { reportableStatus } from "../../schemas/XrpcContract.js"
import { DeliveryOutcomes, type Outcome } from "../delivery/DeliveryOutcomes.js"
import * as RateLimitedLog from "../platform/RateLimitedLog.js"

export const MAX_CONNECTIONS_PER_DID = 4
/** Open connections in this process, whatever their DIDs. */
export const MAX_CONNECTIONS = 1_000
export const BUFFER_FRAMES = 256
export const MAX_LIFETIME = Duration.hours(24)

export const OUTCOME_TYPE = "dev.firehook.webhook.subscribeDeliveries#outcome" as const
export const INFO_TYPE = "dev.firehook.webhook.subscribeDeliveries#info" as const

export interface OutcomeFrame {
  readonly $type: typeof OUTCOME_TYPE
  readonly id: string
  readonly rkey: string
  readonly event: Outcome["event"]
  readonly status: Outcome["status"]
  readonly httpStatus?: number
  readonly errorKind?: string
  readonly at: string
}

export interface InfoFrame {
  readonly $type: typeof INFO_TYPE
  readonly name: "DeliveriesDropped"
  readonly message?: string
  readonly dropped: number
}

export type Frame = OutcomeFrame | InfoFrame

/**
 * The frame of an outcome (the owner is not in it: a connection only ever sees its own). A status
 * outside 100–599 (a receiver's 999, classified `http_5xx`) is left out: the error kind says it.
 * `o.atMs` must be within Date's range: {@link renderFrame} checks it.
 */
export const frameOf = (o: Outcome): OutcomeFrame => {
  const httpStatus = reportableStatus(o.httpStatus)
  return {
    $type: OUTCOME_TYPE,
    id: o.id,
    rkey: o.rkey,
    event: o.event,
    status: o.status,
    ...(httpStatus === undefined ? {} : { httpStatus }),
    ...(o.errorKind === undefined ? {} : { errorKind: o.errorKind.slice(0, 64) }),
    at: new Date(o.atMs).toISOString()
  }
}

/** The frame of an outcome, or `undefined` when its time is outside Date's range (it has no ISO form). */
export const renderFrame = (o: Outcome): OutcomeFrame | undefined =>
  Number.isNaN(new Date(o.atMs).getTime()) ? undefined : frameOf(o)

export const infoFrame = (dropped: number): InfoFrame => ({
  $type: INFO_TYPE,
  name: "DeliveriesDropped",
  message: "the connection's buffer was full",
  dropped
})

/** Refused: the caller's DID has its connections (`did`), or the process has its (`process`). */
export class TooManyConnections extends Data.TaggedError("TooManyConnections")<{
  readonly limit: "did" | "process"
}> {}

/** One open connection of a caller. */
export interface Connection {
  /** The next frames (at least one); interrupted when the hub closes. */
  readonly take: Effect.Effect<ReadonlyArray<Frame>>
}

export interface TailStats {
  readonly connections: number
  readonly dropped: number
}

export interface TailShape {
  /** Open a connection for `owner` for the scope (refused past the per-DID or the process's limit). */
  readonly connect: (owner: string) => Effect.Effect<Connection, TooManyConnections, Scope.Scope>
  readonly stats: Effect.Effect<TailStats>
}

export class Tail extends Context.Tag("firehook/Tail")<Tail, TailShape>() {}

export interface TailOptions {
  readonly maxConnectionsPerDid?: number
  /** open connections in this process — default {@link MAX_CONNECTIONS} */
  readonly maxConnections?: number
  readonly bufferFrames?: number
}

const openConnections = Metric.gauge("firehook_tail_connections", {
  description: "Live tail connections open in this process"
})

const droppedFrames = Metric.counter("firehook_tail_frames_dropped_total", {
  description:
    "Live tail outcome frames dropped because a connection's reader was slow (or the outcome could not be rendered)"
})

const UNRENDERED = "api: a tail outcome could not be rendered as a frame: skipped"

interface Entry {
  readonly queue: Queue.Queue<OutcomeFrame>
  dropped: number
}

export const make = (options: TailOptions = {}): Effect.Effect<TailShape, never, DeliveryOutcomes | Scope.Scope> =>
  Effect.gen(function*() {
    const outcomes = yield* DeliveryOutcomes
    const maxPerDid = options.maxConnectionsPerDid ?? MAX_CONNECTIONS_PER_DID
    const maxConnections = options.maxConnections ?? MAX_CONNECTIONS
    const capacity = options.bufferFrames ?? BUFFER_FRAMES
    const byOwner = new Map<string, Set<Entry>>()
    let connections = 0
    let droppedTotal = 0
    const log = RateLimitedLog.make()

    /** Hands `o` to its owner's connections: the frames lost (full buffers, or not rendered). */
    const deliver = (o: Outcome): { readonly lost: number; readonly unrendered: boolean } => {
      const entries = byOwner.get(o.owner)
      if (entries === undefined) return { lost: 0, unrendered: false }
      const frame = renderFrame(o)
      let lost = 0
      for (const e of entries) {
        if (frame === undefined || !e.queue.unsafeOffer(frame)) {
          e.dropped++
          lost++
        }
      }
      return { lost, unrendered: frame === undefined }
    }

    const feed = yield* outcomes.subscribe
    yield* Effect.forkScoped(Effect.forever(
      Effect.gen(function*() {
        const batch = yield* Queue.takeBetween(feed, 1, 1024)
        let lost = 0
        let unrendered = 0
        for (const o of batch) {
          // one outcome never ends the hub (every tail of the process): whatever fails is skipped alone
          const r = Either.try(() => deliver(o))
          if (Either.isLeft(r)) unrendered++
          else {
            lost += r.right.lost
            if (r.right.unrendered) unrendered++
          }
        }
        if (lost > 0) {
          droppedTotal += lost
          yield* Metric.incrementBy(droppedFrames, lost)
        }
        if (unrendered > 0) {
          yield* log.run(
            UNRENDERED,
            (suppressed) => Effect.logError(UNRENDERED).pipe(Effect.annotateLogs({ outcomes: unrendered, suppressed }))
          )
        }
      })
    ))

    // the hub closing (the API listener's scope) ends every connection
    yield* Effect.addFinalizer(() =>
      Effect.forEach([...byOwner.values()].flatMap((s) => [...s]), (e) => Queue.shutdown(e.queue), { discard: true })
    )

    const connect = (owner: string) =>
      Effect.acquireRelease(
        Effect.suspend(() => {
          const set = byOwner.get(owner) ?? new Set<Entry>()
          if (set.size >= maxPerDid) return Effect.fail(new TooManyConnections({ limit: "did" }))
          if (connections >= maxConnections) return Effect.fail(new TooManyConnections({ limit: "process" }))
          return Effect.map(Queue.dropping<OutcomeFrame>(capacity), (queue) => {
            const entry: Entry = { queue, dropped: 0 }
            set.add(entry)
            byOwner.set(owner, set)
            connections++
            openConnections.unsafeUpdate(connections, [])
            return entry
          })
        }),
        (entry) =>
          Effect.suspend(() => {
            const set = byOwner.get(owner)
            if (set !== undefined && set.delete(entry)) {
              connections--
              openConnections.unsafeUpdate(connections, [])
              if (set.size === 0) byOwner.delete(owner)
            }
            return Queue.shutdown(entry.queue)
          })
      ).pipe(
        // while the connection is open, the other processes are asked to notify their outcomes
        Effect.tap(() => outcomes.demand),
        Effect.map((entry): Connection => ({
          take: Effect.map(Queue.takeBetween(entry.queue, 1, capacity), (chunk) => {
            const frames: Array<Frame> = [...chunk]
            // the count follows every frame kept before the drops
            if (entry.dropped > 0 && Option.getOrElse(entry.queue.unsafeSize(), () => 0) === 0) {
              frames.push(infoFrame(entry.dropped))
              entry.dropped = 0
            }
            return frames
          })
        }))
      )

    const shape: TailShape = {
      connect,
      stats: Effect.sync(() => ({ connections, dropped: droppedTotal }))
    }
    return shape
  })

export const layer = (options: TailOptions = {}): Layer.Layer<Tail, never, DeliveryOutcomes> =>
  Layer.scoped(Tail, make(options))

/**
 * Serve `connection` through `write` until it has lived `lifetime` (then `"lifetime"`) or the hub
 * closes (interrupted). Before taking the next frames it waits for `room` (the socket's buffer
 * under its bound), so frames that cannot be sent wait in the connection's bounded queue. A write
 * or a `room` that fails ends it (the caller's socket is gone, or its reader took nothing for too long).
 */
export const pump = <E, R, E2 = never, R2 = never>(
  connection: Connection,
  write: (frames: ReadonlyArray<Frame>) => Effect.Effect<void, E, R>,
  lifetime: Duration.DurationInput = MAX_LIFETIME,
  room: Effect.Effect<void, E2, R2> = Effect.void
): Effect.Effect<"lifetime", E | E2, R | R2> =>
  // interruptible whatever the caller's region (the HTTP server runs a request uninterruptibly)
  Effect.interruptible(Effect.forever(room.pipe(Effect.zipRight(connection.take), Effect.flatMap(write)))).pipe(
    Effect.timeoutTo({ duration: lifetime, onSuccess: (never) => never, onTimeout: () => "lifetime" as const })
  )
