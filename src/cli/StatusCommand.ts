/**
 * `firehook status`: the service's /health and the database counts.
 */
import { Command } from "@effect/cli"
import { Effect, Either } from "effect"
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
const HEALTH_MAX_CHUNKS = 10_000

/** Where to ask: HEALTH_HOST:HEALTH_PORT, a wildcard bind address asked on loopback. */
const healthTarget = (host: string, port: number) => {
  const h = host === "0.0.0.0" ? "127.0.0.1" : host === "::" || host === "[::]" ? "::1" : host
  const bracketed = h.includes(":") && !h.startsWith("[") ? `[${h}]` : h
  return { address: `${bracketed}:${port}`, url: `http://${bracketed}:${port}/health` }
}

/** The body, or undefined beyond `max` bytes (a bounded read; the rest is cancelled). */
const readBounded = async (res: Response, max: number): Promise<string | undefined> => {
  const reader = res.body?.getReader()
  if (reader === undefined) return ""
  const chunks: Array<Uint8Array> = []
  let size = 0
  for (let i = 0; i < HEALTH_MAX_CHUNKS; i++) {
    const { done, value } = await reader.read()
    if (done) return Buffer.concat(chunks).toString("utf8")
    size += value.byteLength
    if (size > max) break
    chunks.push(value)
  }
  await reader.cancel()
  return undefined
}

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
    try: async (signal) => {
      const res = await fetch(target.url, { signal, redirect: "manual", headers: { accept: "application/json" } })
      const text = await readBounded(res, HEALTH_MAX_BYTES)
      return { status: res.status, text }
    },
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
    const [s, service] = yield* Effect.all(
      [
        Effect.provide(Effect.flatMap(Operator.Operator, (op) => op.status), servicesFor(config)),
        fetchHealth(config.healthHost, config.healthPort)
      ],
      { concurrency: 2 }
    )
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
