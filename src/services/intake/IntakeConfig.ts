/**
 * Intake's configuration (SPEC §3.3, §6.5): the queue and batch bounds, the in-place batch retry,
 * the reconnect backoff, and the source (Jetstream or a relay) with its URL. Each variable's name,
 * default and range live here once; `load` reads them in the order `Config.load` always has.
 */
import { Effect } from "effect"
import type { FirehookConfigShape } from "../platform/Config.js"
import {
  ConfigInvalid,
  isStreamUrl,
  noQueryOrFragment,
  notBelow,
  readEnumVar,
  readIntVar,
  readStringAll,
  type StringRule,
  URL_MAX_LENGTH,
  urlLength
} from "../platform/ConfigRead.js"
import * as RegistryConfig from "../registry/RegistryConfig.js"

export const SOURCES = ["jetstream", "relay"] as const
export type Source = (typeof SOURCES)[number]

/** With `FIREHOSE_SOURCE=jetstream`, `REGISTRY_ACTIVE_SUBSCRIPTIONS_MAX` may be at most this. */
export const JETSTREAM_ACTIVE_MAX = 10000

// SPEC §3.3: a failing batch is tried 3 times, 250 ms × attempt apart; reconnects back off from
// 1 s up to 5 min (full jitter); a poison frame waits at least 10 s
export const intake = {
  queueMax: { env: "WEBHOOK_INTAKE_QUEUE_MAX", default: 512, min: 1, max: 65536 },
  /** at most `queueMax` */
  batchMax: { env: "WEBHOOK_INTAKE_BATCH_MAX", default: 128, min: 1, max: 4096 },
  eventMaxBytes: { env: "WEBHOOK_INTAKE_EVENT_MAX_BYTES", default: 1048576, min: 1024, max: 8388608 },
  source: { env: "FIREHOSE_SOURCE", default: "jetstream", values: SOURCES },
  jetstreamUrl: { env: "JETSTREAM_URL", default: "wss://jetstream2.us-east.bsky.network/subscribe" },
  relayUrl: { env: "RELAY_URL", default: "wss://bsky.network" },
  batchAttempts: { env: "WEBHOOK_INTAKE_BATCH_ATTEMPTS", default: 3, min: 1, max: 20 },
  batchRetryBaseMs: { env: "WEBHOOK_INTAKE_BATCH_RETRY_BASE_MS", default: 250, min: 1, max: 60_000 },
  backoffBaseMs: { env: "WEBHOOK_INTAKE_BACKOFF_BASE_MS", default: 1000, min: 100, max: 600_000 },
  /** at least `backoffBaseMs` */
  backoffMaxMs: { env: "WEBHOOK_INTAKE_BACKOFF_MAX_MS", default: 300_000, min: 100, max: 3_600_000 },
  poisonBackoffMs: { env: "WEBHOOK_INTAKE_POISON_BACKOFF_MS", default: 10_000, min: 1000, max: 3_600_000 }
} as const

/** The stream URL rule: wss:// anywhere; ws:// only to a loopback host in insecure development mode. */
const streamUrlRule = (insecure: boolean): StringRule => ({
  test: (s: string) => isStreamUrl(s, insecure),
  text: insecure
    ? "must be a wss:// URL (ws:// only to a loopback host)"
    : "must be a wss:// URL (ws:// needs WEBHOOK_ALLOW_INSECURE_DEV=1 and a loopback host)"
})

/**
 * No `user:password@` (listed before the stream URL rule so that such a value is told why; a value
 * that does not parse is left to that rule).
 */
const noCredentials: StringRule = {
  test: (s) => {
    if (!URL.canParse(s)) return true
    const u = new URL(s)
    return u.username === "" && u.password === ""
  },
  text: "must be a wss:// URL without credentials (user:password@)"
}

/**
 * `JETSTREAM_URL` / `RELAY_URL`: the length bound, no query and no fragment (SPEC §6.5: a query
 * would be dropped silently), no credentials, then the stream URL rule.
 */
const readStreamUrl = (v: { readonly env: string; readonly default: string }, insecure: boolean) =>
  readStringAll(v.env, v.default, [
    urlLength(URL_MAX_LENGTH),
    noQueryOrFragment,
    noCredentials,
    streamUrlRule(insecure)
  ])

/** `registry` is checked against the source (Jetstream takes at most {@link JETSTREAM_ACTIVE_MAX} subscriptions). */
export const load = (options: {
  readonly allowInsecureDev: boolean
  readonly registry: FirehookConfigShape["registry"]
}): Effect.Effect<FirehookConfigShape["intake"], ConfigInvalid> =>
  Effect.gen(function*() {
    const queueMax = yield* readIntVar(intake.queueMax)
    const batchMax = yield* readIntVar(intake.batchMax)
    if (batchMax > queueMax) {
      return yield* Effect.fail(
        new ConfigInvalid({ variable: intake.batchMax.env, rule: `must not exceed ${intake.queueMax.env}` })
      )
    }
    const eventMaxBytes = yield* readIntVar(intake.eventMaxBytes)
    const batchAttempts = yield* readIntVar(intake.batchAttempts)
    const batchRetryBaseMs = yield* readIntVar(intake.batchRetryBaseMs)
    const backoffBaseMs = yield* readIntVar(intake.backoffBaseMs)
    const backoffMaxMs = yield* readIntVar(intake.backoffMaxMs)
    yield* notBelow(intake.backoffMaxMs.env, backoffMaxMs, intake.backoffBaseMs.env, backoffBaseMs)
    const poisonBackoffMs = yield* readIntVar(intake.poisonBackoffMs)
    const source = yield* readEnumVar(intake.source)
    if (source === "jetstream" && options.registry.activeMax > JETSTREAM_ACTIVE_MAX) {
      return yield* Effect.fail(
        new ConfigInvalid({
          variable: RegistryConfig.registry.activeMax.env,
          rule: `must be at most ${JETSTREAM_ACTIVE_MAX} with FIREHOSE_SOURCE=jetstream`
        })
      )
    }
    const jetstreamUrl = yield* readStreamUrl(intake.jetstreamUrl, options.allowInsecureDev)
    const relayUrl = yield* readStreamUrl(intake.relayUrl, options.allowInsecureDev)
    return {
      queueMax,
      batchMax,
      eventMaxBytes,
      source,
      jetstreamUrl,
      relayUrl,
      batchAttempts,
      batchRetryBaseMs,
      backoffBaseMs,
      backoffMaxMs,
      poisonBackoffMs
    }
  })
