/**
 * `firehook status`: the service's /health and the database counts.
 */
import { Command } from "@effect/cli"
import { Effect, Either } from "effect"
import * as Http from "node:http"
import * as Operator from "../services/operator/Operator.js"
import * as Config from "../services/platform/Config.js"
import { json } from "./Arguments.js"
import { cell, out, printJson } from "./Output.js"
import { servicesFor } from "./Services.js"

// ---------------------------------------------------------------------------------------------
// status

/** The service's health endpoint: answered within this, or "not reachable". */
const HEALTH_TIMEOUT = "2 seconds"
const HEALTH_MAX_BYTES = 256 * 1024

/**
 * Where to ask: HEALTH_HOST:HEALTH_PORT, a wildcard bind address asked on loopback. `host` is what
 * the socket connects to (an IPv6 address without brackets, with its zone when it has one);
 * `address` is how the output names it.
 */
const healthTarget = (host: string, port: number) => {
  const h = host === "0.0.0.0" ? "127.0.0.1" : host === "::" || host === "[::]" ? "::1" : host
  const bracketed = h.includes(":") && !h.startsWith("[") ? `[${h}]` : h
  return { host: h, address: `${bracketed}:${port}` }
}

/**
 * GET /health with `node:http` rather than `fetch`: a URL cannot carry an IPv6 zone (WHATWG URLs
 * refuse `[fe80::1%25eth0]`), and a link-local HEALTH_HOST needs one, while a socket's host takes
 * `fe80::1%eth0` as it is. No redirect is followed; a body over `max` bytes is cut off
 * (`text` undefined). Ends when `signal` aborts.
 */
const getHealth = (
  host: string,
  port: number,
  max: number,
  signal: AbortSignal
): Promise<{ readonly status: number; readonly text: string | undefined }> =>
  new Promise((resolve, reject) => {
    const request = Http.get(
      { host, port, path: "/health", headers: { accept: "application/json" }, agent: false, signal },
      (res) => {
        const chunks: Array<Buffer> = []
        let size = 0
        res.on("data", (chunk: Buffer) => {
          size += chunk.length
          if (size > max) {
            res.destroy()
            resolve({ status: res.statusCode ?? 0, text: undefined })
          } else {
            chunks.push(chunk)
          }
        })
        res.on("end", () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString("utf8") }))
        res.on("error", reject)
      }
    )
    request.on("error", reject)
  })

interface ServiceHealth {
  readonly reachable: boolean
  readonly address: string
  readonly httpStatus?: number
  readonly ready?: boolean
  readonly health?: unknown
}

/** GET /health on the configured listener, within {@link HEALTH_TIMEOUT}; never fails. */
const fetchHealth = (host: string, port: number): Effect.Effect<ServiceHealth> => {
  const target = healthTarget(host, port)
  const unreachable: ServiceHealth = { reachable: false, address: target.address }
  if (port === 0) return Effect.succeed(unreachable)
  return Effect.tryPromise({
    try: (signal) => getHealth(target.host, port, HEALTH_MAX_BYTES, signal),
    catch: () => "unreachable" as const
  }).pipe(
    Effect.timeout(HEALTH_TIMEOUT),
    Effect.map(({ status, text }): ServiceHealth => {
      if (text === undefined || (status !== 200 && status !== 503)) return unreachable
      const body = Either.getOrUndefined(Either.try(() => JSON.parse(text) as unknown))
      const o = asObject(body)
      if (o === undefined) return unreachable
      return { reachable: true, address: target.address, httpStatus: status, ready: status === 200, health: o }
    }),
    Effect.orElseSucceed(() => unreachable)
  )
}

const asObject = (v: unknown): { readonly [k: string]: unknown } | undefined =>
  typeof v === "object" && v !== null && !Array.isArray(v) ? (v as { readonly [k: string]: unknown }) : undefined

/** One value of the health body for a terminal line. */
const hv = (v: unknown): string =>
  typeof v === "boolean" ? (v ? "yes" : "no") : typeof v === "number" || typeof v === "string" ? cell(v) : "-"

/**
 * `k v  k v` for the scalar fields of a section: `first` in that order (`-` when absent), then every
 * other scalar field the service reports, in its order (a field of a newer service, or one such as
 * the delivery counts' `stale`, is never dropped).
 */
const scalars = (section: { readonly [k: string]: unknown }, first: ReadonlyArray<string> = []): string =>
  [...first, ...Object.keys(section).filter((k) => !first.includes(k) && asObject(section[k]) === undefined)]
    .slice(0, 64)
    .map((k) => `${cell(k)} ${hv(section[k])}`)
    .join("  ")

const SECTION_WIDTH = 12
const label = (name: string) => cell(name).padEnd(SECTION_WIDTH - 1)

const healthLines = (h: ServiceHealth): ReadonlyArray<string> => {
  const body = asObject(h.health)
  if (!h.reachable || body === undefined) return [`service: not reachable at ${h.address}`]
  const lines = [
    `${label("service")} ${h.address}  status ${hv(body["status"])}  ready ${h.ready === true ? "yes" : "no"}  phase ${
      hv(body["phase"])
    }`
  ]
  const intake = asObject(body["intake"])
  if (intake !== undefined) {
    lines.push(`${label("intake")} ${scalars(intake, ["role", "connected", "progressing", "queued"])}`)
    const streams = asObject(intake["streams"]) ?? {}
    for (const name of Object.keys(streams).slice(0, 32)) {
      const st = asObject(streams[name]) ?? {}
      lines.push(
        `  stream ${cell(name)}  ${
          scalars(st, ["connected", "quarantined", "failureKind", "cursorAgeSeconds", "queued"])
        }`
      )
    }
  }
  const delivery = asObject(body["delivery"])
  if (delivery !== undefined) {
    lines.push(
      `${label("delivery")} ${scalars(delivery, ["pending", "leased", "deadLetter", "inFlight", "openCircuits"])}`
    )
  }
  const redis = asObject(body["redis"])
  if (redis !== undefined) lines.push(`${label("redis")} ${scalars(redis, ["configured", "connected", "dropped"])}`)
  // other sections (backfill, retryScheduler, maintenance …): their scalar fields
  for (const name of Object.keys(body).slice(0, 32)) {
    if (["status", "phase", "intake", "delivery", "redis"].includes(name)) continue
    const section = asObject(body[name])
    if (section !== undefined) lines.push(`${label(name)} ${scalars(section)}`)
  }
  return lines
}

export const status = Command.make("status", { json }, (o) =>
  Effect.gen(function*() {
    const config = yield* Config.load({ isTty: false })
    const counts = Effect.provide(Effect.flatMap(Operator.Operator, (op) => op.status), servicesFor(config))
    const health = fetchHealth(config.healthHost, config.healthPort)
    const [counted, service] = yield* Effect.all([Effect.either(counts), health], { concurrency: 2 })
    if (Either.isLeft(counted)) {
      // a database that cannot be reached must not hide what the service says about itself: its
      // lines, when it answered (with --json its `service` object, whether it answered or not),
      // then the database's one-line error
      if (o.json) yield* printJson({ service })
      else if (service.reachable) yield* out(healthLines(service).join("\n"))
      return yield* Effect.fail(counted.left)
    }
    const s = counted.right
    if (o.json) return yield* printJson({ ...s, service })
    const d = s.deliveries
    yield* out(
      [
        ...healthLines(service),
        "",
        `deliveries  pending ${d.pending} (due ${d.due})  leased ${d.leased}  delivered ${d.delivered}  dead_letter ${d.dead_letter}  cancelled ${d.cancelled}`,
        `webhooks    active ${s.webhooks.active}  total ${s.webhooks.total}  gone ${s.webhooks.gone}  autoDisabled ${s.autoDisabledWebhooks}`,
        `owners      unknown ${s.owners.unknown}  scanning ${s.owners.scanning}  complete ${s.owners.complete}  failed ${s.owners.failed}`,
        `quarantine  ${s.quarantine}`,
        `secrets     ${s.secrets}`
      ].join("\n")
    )
  })).pipe(
    Command.withDescription(
      "health summary: the service's /health (phase, readiness, intake, delivery, redis; 2 s timeout) and the database counts"
    )
  )
