/**
 * The production side of the delivery child (issue 16 item 2): how the parent starts it and looks
 * at its health, and how the child follows its parent.
 *
 * - {@link spawner}: `<runtime> <entry>` (main passes Bun and `src/main.ts`) with the parent's
 *   environment plus {@link childEnv}: the delivery role only, the marker, a health listener on
 *   127.0.0.1 at a free port (never the parent's ports; no API role), the parent's database URL
 *   (the embedded PostgreSQL's when the parent started it).
 * - {@link probe}: GET the child's `/health` on loopback with a 1 s timeout, at most 64 KiB read.
 * - {@link metrics}: GET the child's `/metrics` the same way (at most 4 MiB), for the parent's own
 *   `/metrics` (DeliveryProcess registers it with Health).
 * - {@link followParent}: in the child, when the parent is gone (stdin closed, re-parented), a
 *   SIGTERM to itself: the same ordered shutdown as an operator's signal. And the parent's shutdown
 *   deadline: the parent writes DeliveryProcess.deadlineLine on the child's stdin before its SIGTERM
 *   (DeliveryProcess), and the child's own shutdown ends {@link parentMarginMs} before it
 *   (Lifecycle.capDeadline): the parent SIGKILLs a child still running at its deadline, and the
 *   child's deadline, counted from its own SIGTERM, was up to the parent's earlier stages later.
 */
import { Clock, Deferred, Duration, Effect, Option, Redacted, Schema } from "effect"
import type { Scope } from "effect"
import * as ChildProcess from "./ChildProcess.js"
import * as DeliveryProcess from "./DeliveryProcess.js"
import * as DeliveryProcessConfig from "./DeliveryProcessConfig.js"
import type { HealthValue } from "./Health.js"
import type { LifecycleShape } from "./Lifecycle.js"
import * as PlatformConfig from "./PlatformConfig.js"
import { freeLoopbackPort } from "./Ports.js"
import * as RolesConfig from "./RolesConfig.js"

/**
 * The variables the parent sets in its child's environment (the rest is the parent's own):
 * `FIREHOOK_ROLES=delivery`, `DELIVERY_PROCESS=inline`, the marker, `HEALTH_HOST=127.0.0.1`,
 * `HEALTH_PORT`, `DATABASE_URL`.
 */
export const childEnv = (options: {
  readonly healthPort: number
  readonly databaseUrl: string
}): Readonly<Record<string, string>> => ({
  [RolesConfig.roles.env]: "delivery",
  [DeliveryProcessConfig.deliveryProcess.env]: "inline",
  [DeliveryProcessConfig.childMarker.env]: "1",
  [PlatformConfig.healthHost.env]: "127.0.0.1",
  [PlatformConfig.healthPort.env]: String(options.healthPort),
  [PlatformConfig.databaseUrl.env]: options.databaseUrl
})

const PROBE_TIMEOUT = Duration.seconds(1)
const PROBE_MAX_BYTES = 64 * 1024

const HealthValueSchema: Schema.Schema<HealthValue> = Schema.Union(
  Schema.Number,
  Schema.Boolean,
  Schema.String,
  Schema.Null,
  Schema.Record({ key: Schema.String, value: Schema.suspend(() => HealthValueSchema) })
)
const HealthBody = Schema.Record({ key: Schema.String, value: HealthValueSchema })
const decodeBody = Schema.decodeUnknownOption(Schema.parseJson(HealthBody))

/**
 * The body of `res` as text when it is at most `maxBytes`; `undefined` when it is longer: the read
 * stops there and the rest is never read (the connection is given up), so a listener that answers
 * without end (another process on the port) costs at most `maxBytes`.
 */
const textAtMost = async (res: Response, maxBytes: number): Promise<string | undefined> => {
  const reader = res.body?.getReader()
  if (reader === undefined) return ""
  const chunks: Array<Uint8Array> = []
  let size = 0
  // bounded by the size (each read brings at least one byte but the last) and by a count
  for (let i = 0; i < 1_000_000; i++) {
    const { done, value } = await reader.read()
    if (done) return Buffer.concat(chunks).toString("utf8")
    size += value.byteLength
    if (size > maxBytes) break
    chunks.push(value)
  }
  await reader.cancel().catch(() => undefined)
  return undefined
}

/**
 * One GET of `path` on the child's loopback listener: its status and text (at most `maxBytes`),
 * `None` when it does not answer within {@link PROBE_TIMEOUT} or answers more.
 */
const get = (
  port: number,
  path: string,
  maxBytes: number
): Effect.Effect<Option.Option<{ status: number; text: string }>> =>
  Effect.tryPromise({
    try: async (signal) => {
      const res = await fetch(`http://127.0.0.1:${port}${path}`, { signal, redirect: "manual" })
      const text = await textAtMost(res, maxBytes)
      return text === undefined ? Option.none() : Option.some({ status: res.status, text })
    },
    catch: () => "unreachable" as const
  }).pipe(
    Effect.timeout(PROBE_TIMEOUT),
    Effect.orElseSucceed(() => Option.none())
  )

/** One look at the child's `/health` on 127.0.0.1:`port`; `None` when it does not answer in time. */
export const probe = (port: number): Effect.Effect<Option.Option<DeliveryProcess.HealthAnswer>> =>
  Effect.map(
    get(port, "/health", PROBE_MAX_BYTES),
    (answer) =>
      Option.flatMap(answer, ({ status, text }) =>
        Option.map(decodeBody(text), (body) => {
          const { phase: _phase, status: _status, ...sections } = body
          return { ready: status === 200, sections }
        }))
  )

/** The child's `/metrics` is read up to this size (bytes); a larger answer is left out. */
const METRICS_MAX_BYTES = 4 * 1024 * 1024

/**
 * The text of the child's `/metrics` on 127.0.0.1:`port`; `None` when it does not answer in time,
 * answers other than 200, or answers more than {@link METRICS_MAX_BYTES}.
 */
export const metrics = (port: number): Effect.Effect<Option.Option<string>> =>
  Effect.map(
    get(port, "/metrics", METRICS_MAX_BYTES),
    (answer) => Option.flatMap(answer, ({ status, text }) => status === 200 ? Option.some(text) : Option.none())
  )

export interface SpawnerOptions {
  /** the runtime (`process.execPath`) and its arguments (the entry point) */
  readonly command: string
  readonly args: ReadonlyArray<string>
  /** the parent's environment */
  readonly env: Readonly<Record<string, string | undefined>>
  readonly databaseUrl: Redacted.Redacted<string>
  /** when the child's scope closes with it running (not the ordered shutdown): SIGTERM, this, SIGKILL */
  readonly stopGrace: Duration.DurationInput
}

/** Start `command args` as the delivery child on a free loopback health port. */
export const spawner = (options: SpawnerOptions): DeliveryProcess.Spawner => ({
  spawn: Effect.gen(function*() {
    // a port below the ephemeral range: the child binds it about a second later (Ports.ts)
    const port = yield* freeLoopbackPort
    if (port === 0) return yield* new ChildProcess.SpawnFailed({ reason: "no free port" })
    const env: Record<string, string> = {}
    for (const [k, v] of Object.entries(options.env)) if (v !== undefined) env[k] = v
    const handle = yield* ChildProcess.spawn({
      command: options.command,
      args: options.args,
      env: { ...env, ...childEnv({ healthPort: port, databaseUrl: Redacted.value(options.databaseUrl) }) },
      stopGrace: options.stopGrace
    })
    return { handle, health: probe(port), metrics: metrics(port) }
  }) satisfies Effect.Effect<DeliveryProcess.Spawned, ChildProcess.SpawnFailed, Scope.Scope>
})

/**
 * How long before the parent's deadline the child's shutdown ends: room for its exit after its
 * stages (its pool's close, the runtime's exit) and the parent's reaping: 500 ms, at most an eighth
 * of SHUTDOWN_TIMEOUT_MS.
 */
export const parentMarginMs = (shutdownTimeoutMs: number): number => Math.min(500, Math.floor(shutdownTimeoutMs / 8))

/** In the child: a line from the parent; its deadline (less the margin) caps the child's own. */
export const onParentLine = (lifecycle: LifecycleShape, shutdownTimeoutMs: number) => (line: string) =>
  Option.match(DeliveryProcess.parseDeadline(line), {
    onNone: () => Effect.void,
    onSome: (at) =>
      Effect.zipRight(
        lifecycle.capDeadline(at - parentMarginMs(shutdownTimeoutMs)),
        Effect.flatMap(Clock.currentTimeMillis, (now) =>
          Effect.logDebug("the parent's shutdown deadline").pipe(Effect.annotateLogs({ inMs: at - now })))
      )
  })

/**
 * How long the child's shutdown waits, at its start, for the parent's deadline line (the parent
 * writes it right before its SIGTERM, but the child may see the signal first): the line is in the
 * pipe by then, and is read in the next turn of the event loop. A SIGTERM from elsewhere (an
 * operator, the parent gone) costs this much.
 */
export const DEADLINE_LINE_WAIT = Duration.millis(50)

/**
 * In the child: when the parent is gone, log it and SIGTERM itself; the parent's deadline caps the
 * child's, and the shutdown's first stage waits for a deadline line written before the signal, at
 * most {@link DEADLINE_LINE_WAIT} (fork in the process's scope).
 */
export const followParent = (
  lifecycle: LifecycleShape,
  shutdownTimeoutMs: number,
  /** the parent's pipe (default `process.stdin`; a test's stream) */
  input?: NodeJS.ReadableStream
): Effect.Effect<void> =>
  Effect.gen(function*() {
    const told = yield* Deferred.make<void>()
    const apply = onParentLine(lifecycle, shutdownTimeoutMs)
    yield* lifecycle.registerStop(
      "startup",
      "parent-deadline",
      Effect.asVoid(Effect.timeoutOption(Deferred.await(told), DEADLINE_LINE_WAIT))
    )
    yield* ChildProcess.watchParent({
      onGone: Effect.logWarning("the parent process is gone: shutting down").pipe(
        Effect.zipRight(Effect.sync(() => process.kill(process.pid, "SIGTERM")))
      ),
      onLine: (line) =>
        Effect.zipRight(
          apply(line),
          Option.isSome(DeliveryProcess.parseDeadline(line)) ? Deferred.succeed(told, undefined) : Effect.void
        ),
      ...(input === undefined ? {} : { input })
    })
  })
