/**
 * The operator command line (SPEC §4.8): `bun src/cli/main.ts …`, `npm run cli -- …`, `npx firehook …`.
 *
 *   firehook deliveries list [--owner DID] [--webhook RKEY] [--status S] [--since T] [--until T] [--limit N] [--json] [--show-urls]
 *   firehook deliveries show <id> [--json] [--show-urls]
 *   firehook deliveries redeliver <id> [--json]
 *   firehook deliveries replay --status dead_letter [--owner DID] [--webhook RKEY] [--since T] [--until T] [--json]
 *   firehook secrets create <did> <name> [--token T]
 *   firehook secrets rotate <did> <name> [--token T]
 *   firehook secrets delete <did> <name> [--json]
 *   firehook secrets list <did> [--json]
 *   firehook owners add <did> [--json]
 *   firehook owners reconcile <did> [--json]
 *   firehook owners status [--limit N] [--json]
 *   firehook status [--json]
 *
 * `--since` / `--until` filter on the delivery's enqueue time (`created_at`), as [since, until);
 * `--since` must be earlier than `--until`. `replay` replays the dead letters as of its start, each
 * at most once. `show` prints the newest 1,000 attempts and says how many older ones it left out.
 * `redeliver` refuses a row a worker holds a valid lease on; a row whose lease has expired (its
 * worker stopped) is redelivered. `replay` and `redeliver` say how many rows belong to a
 * subscription that is no longer active as enqueued (the worker cancels those without a request).
 * `status` prints the database counts and, when the service's health endpoint
 * (HEALTH_HOST:HEALTH_PORT) answers within 2 s, its phase, readiness, intake, delivery and redis.
 *
 * Webhook owners (talk only to a PDS; no database, no service configuration):
 *
 *   firehook hooks create (--scope AT-URI | --collection NSID) --url URL [--backlinks]
 *                         [--events create,update,delete] [--secret S | --secret-id NAME | --generate-secret]
 *                         [--disabled] [--rkey RKEY] [--json]
 *   firehook hooks list [--json] [--show-urls]
 *   firehook hooks enable <rkey> | disable <rkey> | delete <rkey> [--json]
 *   every hooks command: [--pds URL] [--identifier ID] [--password P]; defaults from ATPROTO_PDS
 *   (else https://bsky.social), ATPROTO_IDENTIFIER, ATPROTO_APP_PASSWORD (preferred to --password).
 *   Records are checked with the service's validation (WEBHOOK_ALLOW_INSECURE_DEV and NODE_ENV as
 *   the service reads them) before anything is written. `create --generate-secret` prints the
 *   secret once. The password and secrets are never printed; URLs only with `list --show-urls`.
 *
 * Operator commands use the same configuration as the service (the environment, `Config.load`)
 * and the same database (`DATABASE_URL`, or the embedded PostgreSQL in `FIREHOOK_DATA_DIR`, adopted
 * when the service is running). Output is a human-readable table, or JSON with `--json`. Webhook
 * URLs are shown only with `--show-urls`. `secrets create`/`rotate` print the token, once, as the
 * only line on stdout. A `--token` on the command line is visible to other local users (ps);
 * prefer the generated token.
 *
 * Exit codes: 0 success; 2 invalid arguments (one line on stderr); 1 operational failure (one line
 * on stderr). Logs: warnings and errors only, on stderr (`--log-level` raises the verbosity).
 */
import { Args, Command, HelpDoc, Options, ValidationError } from "@effect/cli"
import { BunContext, BunRuntime } from "@effect/platform-bun"
import { Cause, Clock, Console, Data, Effect, Either, Exit, Layer, Logger, LogLevel, Option, Redacted } from "effect"
import pkg from "../../package.json" with { type: "json" }
import * as SecretBox from "../services/delivery/SecretBox.js"
import * as Hooks from "./HookRecords.js"
import { isCanonicalDid, isRkey } from "../schemas/AtUri.js"
import * as Config from "../services/platform/Config.js"
import * as Database from "../services/platform/Database.js"
import * as Identity from "../services/reconciliation/Identity.js"
import * as Operator from "../services/operator/Operator.js"
import * as ReconcileStore from "../services/reconciliation/ReconcileStore.js"
import * as Reconciler from "../services/reconciliation/Reconciler.js"
import { SafeHttp } from "../services/platform/http/SafeHttp.js"
import { SECRET_NAME, Secrets, SecretsError } from "../services/delivery/Secrets.js"

// ---------------------------------------------------------------------------------------------
// Errors and exit codes

/** Invalid arguments: exit code 2. */
class UsageError extends Data.TaggedError("UsageError")<{ readonly text: string }> {
  override get message(): string {
    return this.text
  }
}

/** An operation that could not be done: exit code 1. */
class Failed extends Data.TaggedError("Failed")<{ readonly text: string }> {
  override get message(): string {
    return this.text
  }
}

const USAGE_SECRET_REASONS: ReadonlySet<string> = new Set(["invalid_owner", "invalid_name", "invalid_token"])

const ANSI = new RegExp(String.raw`\u001b\[[0-9;]*[A-Za-z]`, "g")

/** One line of text: ANSI codes removed, whitespace collapsed, bounded. */
const oneLine = (s: string): string => s.replace(ANSI, "").replace(/\s+/g, " ").trim().slice(0, 500)

/** Options whose values are never echoed. */
const SENSITIVE_OPTIONS: ReadonlyArray<string> = ["--token", "--password", "--secret"]

/**
 * Values that must never be echoed: the `--token`, `--password` and `--secret` values, anything
 * token-like, and the app password from the environment.
 */
const sensitiveArgs = (argv: ReadonlyArray<string>): ReadonlyArray<string> => {
  const out: Array<string> = []
  const envPassword = process.env["ATPROTO_APP_PASSWORD"] ?? ""
  if (envPassword.length >= 6) out.push(envPassword)
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i] ?? ""
    const eq = a.indexOf("=")
    const flag = eq < 0 ? a : a.slice(0, eq)
    if (SENSITIVE_OPTIONS.includes(flag)) {
      if (eq >= 0) out.push(a.slice(eq + 1))
      else if (i + 1 < argv.length) out.push(argv[i + 1] ?? "")
    } else if (a.length >= 32 && !a.startsWith("-") && !isCanonicalDid(a) && !a.startsWith("whd_")) out.push(a)
  }
  return out.filter((s) => s.length > 0).sort((a, b) => b.length - a.length)
}

const redactArgs = (text: string, argv: ReadonlyArray<string>): string => {
  let t = text
  for (const s of sensitiveArgs(argv)) t = t.split(s).join("[redacted]")
  return t
}

/** The exit code and the one line for a failure of the program. */
const describeFailure = (cause: Cause.Cause<unknown>): { readonly code: number; readonly line: string } => {
  const failure = Cause.failureOption(cause)
  if (Option.isNone(failure)) {
    return Cause.isInterruptedOnly(cause) ? { code: 130, line: "interrupted" } : { code: 1, line: "unexpected internal error" }
  }
  const e = failure.value
  if (ValidationError.isValidationError(e)) {
    const text = oneLine(HelpDoc.toAnsiText(e.error))
    return { code: 2, line: text.length > 0 ? `${text} (see --help)` : "invalid arguments (see --help)" }
  }
  if (e instanceof UsageError || e instanceof Operator.InvalidArgument || e instanceof Hooks.HooksInvalid) {
    return { code: 2, line: e.message }
  }
  if (e instanceof SecretsError) return { code: USAGE_SECRET_REASONS.has(e.reason) ? 2 : 1, line: e.message }
  const message =
    typeof e === "object" && e !== null && "message" in e && typeof e.message === "string" && e.message.length > 0
      ? e.message
      : "operation failed"
  return { code: 1, line: message }
}

// ---------------------------------------------------------------------------------------------
// Output

const write = (stream: NodeJS.WriteStream, text: string) => Effect.sync(() => void stream.write(text))
const out = (text: string) => write(process.stdout, text.endsWith("\n") ? text : `${text}\n`)
const printJson = (value: unknown) => out(JSON.stringify(value, null, 2))

/** Wait until everything written so far has been handed to the OS (before the process exits). */
const flush = (stream: NodeJS.WriteStream) =>
  Effect.async<void>((resume) => {
    stream.write("", () => resume(Effect.void))
  })

/** A table cell: control characters never reach the terminal. */
const cell = (v: string | number | undefined): string =>
  v === undefined ? "-" : String(v).replace(/[\u0000-\u001f\u007f-\u009f]/g, " ")

const table = (headers: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = headers.map((h, i) => rows.reduce((w, r) => Math.max(w, (r[i] ?? "").length), h.length))
  const line = (r: ReadonlyArray<string>) =>
    r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i] ?? 0))).join("  ").trimEnd()
  return [line(headers), ...rows.map(line)].join("\n")
}

const iso = (d: Date | undefined): string | undefined => d?.toISOString()

const REDACTED_URL = "[redacted]"

const deliveryJson = (d: Operator.Delivery, showUrls: boolean) => ({
  deliveryId: d.deliveryId,
  eventId: d.eventId,
  ownerDid: d.ownerDid,
  webhookRkey: d.webhookRkey,
  matchKind: d.matchKind,
  eventDid: d.eventDid,
  eventCollection: d.eventCollection,
  eventRkey: d.eventRkey,
  eventOperation: d.eventOperation,
  targetUrl: showUrls ? d.targetUrl : REDACTED_URL,
  signingMode: d.signingMode,
  secretId: d.secretId ?? null,
  status: d.status,
  attemptCount: d.attemptCount,
  nextAttemptAt: d.nextAttemptAt.toISOString(),
  leasedUntil: iso(d.leasedUntil) ?? null,
  lastErrorKind: d.lastErrorKind ?? null,
  lastHttpStatus: d.lastHttpStatus ?? null,
  createdAt: d.createdAt.toISOString(),
  updatedAt: d.updatedAt.toISOString(),
  finishedAt: iso(d.finishedAt) ?? null
})

const lastError = (d: Operator.Delivery): string | undefined =>
  d.lastErrorKind === undefined && d.lastHttpStatus === undefined
    ? undefined
    : [d.lastErrorKind, d.lastHttpStatus].filter((x) => x !== undefined).join(" ")

// ---------------------------------------------------------------------------------------------
// Argument parsing beyond @effect/cli

const usage = (text: string) => Effect.fail(new UsageError({ text }))

const RELATIVE = /^([1-9][0-9]{0,5})(m|h|d)$/
const ISO_DATE = /^\d{4}-\d{2}-\d{2}$/
const ISO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})?$/

/**
 * A time argument: RFC 3339 / ISO 8601 (`2026-01-02`, `2026-01-02T03:04:05Z`, an offset, or no
 * offset = UTC), or a duration before now (`30m`, `12h`, `7d`).
 */
const parseTime = (flag: string, value: Option.Option<string>): Effect.Effect<Date | undefined, UsageError> =>
  Effect.gen(function* () {
    if (Option.isNone(value)) return undefined
    const s = value.value.trim()
    const rel = RELATIVE.exec(s)
    if (rel !== null) {
      const n = Number(rel[1])
      const unit = rel[2] === "m" ? 60_000 : rel[2] === "h" ? 3_600_000 : 86_400_000
      const now = yield* Clock.currentTimeMillis
      return new Date(now - n * unit)
    }
    const text = ISO_DATE.test(s) ? `${s}T00:00:00Z` : ISO_TIME.test(s) ? (/(Z|[+-]\d{2}:\d{2})$/.test(s) ? s : `${s}Z`) : ""
    const ms = text === "" ? Number.NaN : Date.parse(text)
    if (Number.isNaN(ms)) {
      return yield* usage(`invalid --${flag}: expected an ISO 8601 time (2026-01-02, 2026-01-02T03:04:05Z) or a duration ago (30m, 12h, 7d)`)
    }
    return new Date(ms)
  })

/** `--since` and `--until` (the enqueue time, created_at): a range [since, until) that is not empty. */
const parseRange = (sinceArg: Option.Option<string>, untilArg: Option.Option<string>) =>
  Effect.gen(function* () {
    const sinceT = yield* parseTime("since", sinceArg)
    const untilT = yield* parseTime("until", untilArg)
    if (sinceT !== undefined && untilT !== undefined && sinceT.getTime() >= untilT.getTime()) {
      return yield* usage(
        `invalid --since/--until: --since (${sinceT.toISOString()}) must be earlier than --until (${untilT.toISOString()})`
      )
    }
    return { sinceT, untilT }
  })

const checkDid = (flag: string, value: string) =>
  isCanonicalDid(value) ? Effect.void : usage(`invalid ${flag}: must be a canonical DID (did:plc:… or did:web:…)`)

const checkRkey = (flag: string, value: string) =>
  isRkey(value) ? Effect.void : usage(`invalid ${flag}: must be a record key`)

const checkName = (value: string) =>
  SECRET_NAME.test(value) ? Effect.void : usage("invalid <name>: must match ^[A-Za-z0-9._-]{1,64}$")

const DELIVERY_ID = /^[A-Za-z0-9_]{1,128}$/
const checkDeliveryId = (value: string) =>
  DELIVERY_ID.test(value) ? Effect.void : usage("invalid <id>: expected a delivery id (whd_v1_…)")

// ---------------------------------------------------------------------------------------------
// Services (built only when a command runs, so --help needs neither configuration nor database)

const servicesFor = (config: Config.FirehookConfigShape) =>
  Layer.mergeAll(Operator.layer, Secrets.layerSql).pipe(
    Layer.provideMerge(Database.layer({ maxConnections: 2, applicationName: "firehook-cli" })),
    Layer.provideMerge(Config.layerValue(config))
  )

const withServices = <A, E>(eff: Effect.Effect<A, E, Operator.Operator | Secrets>) =>
  Effect.flatMap(Config.load({ isTty: false }), (config) => Effect.provide(eff, servicesFor(config)))

/**
 * Reconciliation from the command line: the reconcile store, and a reconciler that writes the
 * database only (a running service swaps the owner into its memory within one retry round).
 */
const ownerServices = Effect.gen(function* () {
  const config = yield* Config.load({ isTty: false })
  return Reconciler.layerWithoutRegistry().pipe(
    Layer.provideMerge(Identity.layer()),
    Layer.provideMerge(ReconcileStore.layerSql),
    Layer.provideMerge(SafeHttp.layerDefault({ allowInsecureDev: config.allowInsecureDev, allowCidrs: [] })),
    Layer.provideMerge(Database.layer({ maxConnections: 2, applicationName: "firehook-cli" })),
    Layer.provideMerge(Config.layerValue(config))
  )
})

const withOwnerServices = <A, E>(eff: Effect.Effect<A, E, ReconcileStore.ReconcileStore | Reconciler.Reconciler>) =>
  Effect.flatMap(ownerServices, (layer) => Effect.provide(eff, layer))

// ---------------------------------------------------------------------------------------------
// Options shared by commands

const json = Options.boolean("json").pipe(Options.withDescription("machine-readable JSON output"))
const showUrls = Options.boolean("show-urls").pipe(
  Options.withDescription("show webhook target URLs (hidden by default)")
)
const owner = Options.text("owner").pipe(Options.withPseudoName("DID"), Options.withDescription("owner DID"), Options.optional)
const webhook = Options.text("webhook").pipe(Options.withPseudoName("RKEY"), Options.withDescription("webhook record key"), Options.optional)
const since = Options.text("since").pipe(
  Options.withPseudoName("TIME"),
  Options.withDescription(
    "enqueue time (created_at) at or after (ISO 8601, or 30m / 12h / 7d ago); earlier than --until"
  ),
  Options.optional
)
const until = Options.text("until").pipe(
  Options.withPseudoName("TIME"),
  Options.withDescription("enqueue time (created_at) before (ISO 8601, or 30m / 12h / 7d ago)"),
  Options.optional
)
const deliveryId = Args.text({ name: "id" }).pipe(Args.withDescription("delivery id (whd_v1_…)"))
const didArg = Args.text({ name: "did" }).pipe(Args.withDescription("owner DID"))
const nameArg = Args.text({ name: "name" }).pipe(Args.withDescription("secret name (the record's secretId)"))
const token = Options.redacted("token").pipe(
  Options.withPseudoName("TOKEN"),
  Options.withDescription(
    "use this token (32-256 printable ASCII characters) instead of a generated one; visible to other local users (ps)"
  ),
  Options.optional
)

// ---------------------------------------------------------------------------------------------
// deliveries

const deliveriesList = Command.make(
  "list",
  {
    owner,
    webhook,
    status: Options.choice("status", Operator.DELIVERY_STATUSES).pipe(Options.optional),
    since,
    until,
    limit: Options.integer("limit").pipe(
      Options.withPseudoName("N"),
      Options.withDescription(`rows at most (1..${Operator.MAX_LIST_LIMIT}, default ${Operator.DEFAULT_LIST_LIMIT})`),
      Options.optional
    ),
    json,
    showUrls
  },
  (o) =>
    Effect.gen(function* () {
      if (Option.isSome(o.owner)) yield* checkDid("--owner", o.owner.value)
      if (Option.isSome(o.webhook)) yield* checkRkey("--webhook", o.webhook.value)
      const limit = Option.getOrElse(o.limit, () => Operator.DEFAULT_LIST_LIMIT)
      if (limit < 1 || limit > Operator.MAX_LIST_LIMIT) {
        return yield* usage(`invalid --limit: must be in 1..${Operator.MAX_LIST_LIMIT}`)
      }
      const { sinceT, untilT } = yield* parseRange(o.since, o.until)
      const rows = yield* withServices(
        Effect.flatMap(Operator.Operator, (op) =>
          op.listDeliveries({
            limit,
            ...(Option.isSome(o.owner) ? { owner: o.owner.value } : {}),
            ...(Option.isSome(o.webhook) ? { webhook: o.webhook.value } : {}),
            ...(Option.isSome(o.status) ? { status: o.status.value } : {}),
            ...(sinceT === undefined ? {} : { since: sinceT }),
            ...(untilT === undefined ? {} : { until: untilT })
          })
        )
      )
      if (o.json) return yield* printJson(rows.map((d) => deliveryJson(d, o.showUrls)))
      if (rows.length === 0) return yield* out("no deliveries")
      const headers = ["DELIVERY", "STATUS", "ATTEMPTS", "OWNER", "WEBHOOK", "EVENT", "CREATED", "LAST ERROR"]
      yield* out(
        table(
          o.showUrls ? [...headers, "URL"] : headers,
          rows.map((d) => {
            const r = [
              d.deliveryId,
              d.status,
              String(d.attemptCount),
              d.ownerDid,
              d.webhookRkey,
              `${d.eventOperation} ${d.eventCollection}/${d.eventRkey}`,
              d.createdAt.toISOString(),
              lastError(d)
            ].map(cell)
            return o.showUrls ? [...r, cell(d.targetUrl)] : r
          })
        )
      )
      if (rows.length === limit) yield* out(`(${rows.length} rows: the limit; narrow the filter or raise --limit)`)
    })
).pipe(Command.withDescription("list deliveries, newest first (time filters: the enqueue time, created_at)"))

const deliveriesShow = Command.make("show", { id: deliveryId, json, showUrls }, (o) =>
  Effect.gen(function* () {
    yield* checkDeliveryId(o.id)
    const found = yield* withServices(Effect.flatMap(Operator.Operator, (op) => op.showDelivery(o.id)))
    if (Option.isNone(found)) return yield* Effect.fail(new Failed({ text: "no such delivery" }))
    const { attempts, delivery, olderAttemptsNotShown } = found.value
    const attemptsJson = attempts.map((a) => ({
      attempt: a.attempt,
      startedAt: a.startedAt.toISOString(),
      durationMs: a.durationMs,
      outcome: a.outcome,
      errorKind: a.errorKind ?? null,
      httpStatus: a.httpStatus ?? null,
      responseExcerpt: a.responseExcerpt ?? null
    }))
    if (o.json) {
      return yield* printJson({ delivery: deliveryJson(delivery, o.showUrls), attempts: attemptsJson, olderAttemptsNotShown })
    }
    const d = deliveryJson(delivery, o.showUrls)
    const fields: ReadonlyArray<[string, string | number | null]> = Object.entries(d)
    const width = fields.reduce((w, [k]) => Math.max(w, k.length), 0)
    yield* out(fields.map(([k, v]) => `${k.padEnd(width)}  ${cell(v === null ? undefined : v)}`).join("\n"))
    yield* out("")
    if (attempts.length === 0) return yield* out("no attempts")
    if (olderAttemptsNotShown > 0) {
      yield* out(
        `${olderAttemptsNotShown} older ${olderAttemptsNotShown === 1 ? "attempt" : "attempts"} not shown (the newest ${attempts.length} follow)`
      )
    }
    yield* out(
      table(
        ["ATTEMPT", "STARTED", "DURATION", "OUTCOME", "ERROR", "HTTP", "RESPONSE"],
        attempts.map((a) =>
          [
            String(a.attempt),
            a.startedAt.toISOString(),
            `${a.durationMs} ms`,
            a.outcome,
            a.errorKind,
            a.httpStatus,
            a.responseExcerpt === undefined ? undefined : JSON.stringify(a.responseExcerpt.slice(0, 120))
          ].map(cell)
        )
      )
    )
  })
).pipe(Command.withDescription("show one delivery with its newest 1,000 attempts"))

const INACTIVE_NOTE = "belongs to a subscription that is no longer active as enqueued and will be cancelled without a request"

const deliveriesRedeliver = Command.make("redeliver", { id: deliveryId, json }, (o) =>
  Effect.gen(function* () {
    yield* checkDeliveryId(o.id)
    const result = yield* withServices(Effect.flatMap(Operator.Operator, (op) => op.redeliver(o.id)))
    switch (result._tag) {
      case "Missing":
        return yield* Effect.fail(new Failed({ text: "no such delivery" }))
      case "Leased":
        return yield* Effect.fail(
          new Failed({
            text: `the delivery is being attempted right now (leased${
              result.leasedUntil === undefined ? "" : ` until ${result.leasedUntil.toISOString()}`
            }); try again after that attempt settles`
          })
        )
      case "Redelivered":
        break
    }
    if (o.json) {
      return yield* printJson({
        deliveryId: o.id,
        redelivered: true,
        previousStatus: result.previousStatus,
        leaseExpired: result.leaseExpired,
        subscriptionInactive: result.subscriptionInactive
      })
    }
    const was = result.leaseExpired
      ? "it was leased by a worker that stopped (its lease had expired); that worker can no longer settle it"
      : result.previousStatus === "pending"
        ? "it was pending: its next attempt is now due, and its earlier attempts no longer count"
        : result.previousStatus === "cancelled"
          ? "it was cancelled"
          : `it was ${result.previousStatus}`
    yield* out(`redelivering ${o.id} (pending, fresh attempt budget; ${was})`)
    if (result.subscriptionInactive) yield* out(`note: this delivery ${INACTIVE_NOTE}`)
  })
).pipe(
  Command.withDescription(
    "deliver one delivery again (same delivery id, fresh attempt budget); refused while a worker holds a valid lease on it"
  )
)

const deliveriesReplay = Command.make(
  "replay",
  {
    status: Options.choice("status", ["dead_letter"] as const).pipe(
      Options.withDescription("which deliveries to replay (only dead_letter)")
    ),
    owner,
    webhook,
    since,
    until,
    json
  },
  (o) =>
    Effect.gen(function* () {
      if (Option.isSome(o.owner)) yield* checkDid("--owner", o.owner.value)
      if (Option.isSome(o.webhook)) yield* checkRkey("--webhook", o.webhook.value)
      const { sinceT, untilT } = yield* parseRange(o.since, o.until)
      const result = yield* withServices(
        Effect.flatMap(Operator.Operator, (op) =>
          op.replayDeadLetters({
            ...(Option.isSome(o.owner) ? { owner: o.owner.value } : {}),
            ...(Option.isSome(o.webhook) ? { webhook: o.webhook.value } : {}),
            ...(sinceT === undefined ? {} : { since: sinceT }),
            ...(untilT === undefined ? {} : { until: untilT })
          })
        )
      )
      const { complete, inactiveSubscription: inactive, replayed } = result
      if (o.json) return yield* printJson({ replayed, inactiveSubscription: inactive, complete })
      const of = inactive === 0 ? "" : ` (${inactive} of them ${inactive === 1 ? "belongs" : "belong"} to a subscription that is no longer active as enqueued and will be cancelled without a request)`
      yield* out(`replayed ${replayed} dead-lettered ${replayed === 1 ? "delivery" : "deliveries"}${of}`)
      if (!complete) yield* out("(stopped at its statement bound; run the same command again for the rest)")
    })
).pipe(
  Command.withDescription(
    "make dead-lettered deliveries pending again (same ids, fresh attempt budget; the dead letters as of the start, each once; time filters: the enqueue time, created_at)"
  )
)

const deliveries = Command.make("deliveries", {}, () =>
  usage("missing subcommand: list, show, redeliver or replay")
).pipe(
  Command.withDescription("inspect, redeliver and replay deliveries"),
  Command.withSubcommands([deliveriesList, deliveriesShow, deliveriesRedeliver, deliveriesReplay])
)

// ---------------------------------------------------------------------------------------------
// secrets

const tokenValue = (t: Option.Option<Redacted.Redacted<string>>) =>
  Effect.gen(function* () {
    if (Option.isNone(t)) return undefined
    const v = Redacted.value(t.value)
    if (!SecretBox.validateCallerToken(v)) {
      return yield* usage("invalid --token: must be 32-256 printable ASCII characters without whitespace")
    }
    return v
  })

const secretsCreate = Command.make("create", { did: didArg, name: nameArg, token }, (o) =>
  Effect.gen(function* () {
    yield* checkDid("<did>", o.did)
    yield* checkName(o.name)
    const given = yield* tokenValue(o.token)
    const created = yield* withServices(Effect.flatMap(Secrets, (s) => s.create(o.did, o.name, given)))
    yield* out(created)
  })
).pipe(Command.withDescription("create a server-managed secret; prints the token once"))

const secretsRotate = Command.make("rotate", { did: didArg, name: nameArg, token }, (o) =>
  Effect.gen(function* () {
    yield* checkDid("<did>", o.did)
    yield* checkName(o.name)
    const given = yield* tokenValue(o.token)
    const rotated = yield* withServices(Effect.flatMap(Secrets, (s) => s.rotate(o.did, o.name, given)))
    yield* out(rotated)
  })
).pipe(Command.withDescription("replace a secret's token; prints the new token once"))

const secretsDelete = Command.make("delete", { did: didArg, name: nameArg, json }, (o) =>
  Effect.gen(function* () {
    yield* checkDid("<did>", o.did)
    yield* checkName(o.name)
    const removed = yield* withServices(Effect.flatMap(Secrets, (s) => s.remove(o.did, o.name)))
    if (!removed) return yield* Effect.fail(new Failed({ text: "no such secret" }))
    if (o.json) return yield* printJson({ deleted: true })
    yield* out(`deleted secret ${o.name}`)
  })
).pipe(Command.withDescription("delete a secret"))

const secretsList = Command.make("list", { did: didArg, json }, (o) =>
  Effect.gen(function* () {
    yield* checkDid("<did>", o.did)
    const rows = yield* withServices(Effect.flatMap(Secrets, (s) => s.list(o.did)))
    if (o.json) {
      return yield* printJson(
        rows.map((r) => ({ name: r.name, createdAt: r.createdAt.toISOString(), rotatedAt: iso(r.rotatedAt) ?? null }))
      )
    }
    if (rows.length === 0) return yield* out("no secrets")
    yield* out(
      table(
        ["NAME", "CREATED", "ROTATED"],
        rows.map((r) => [r.name, r.createdAt.toISOString(), iso(r.rotatedAt)].map(cell))
      )
    )
  })
).pipe(Command.withDescription("list an owner's secrets (names and times, never tokens)"))

const secrets = Command.make("secrets", {}, () => usage("missing subcommand: create, rotate, delete or list")).pipe(
  Command.withDescription("manage server-managed signing secrets"),
  Command.withSubcommands([secretsCreate, secretsRotate, secretsDelete, secretsList])
)

// ---------------------------------------------------------------------------------------------
// owners

const ownersAdd = Command.make("add", { did: didArg, json }, (o) =>
  Effect.gen(function* () {
    yield* checkDid("<did>", o.did)
    yield* withOwnerServices(Effect.flatMap(ReconcileStore.ReconcileStore, (s) => s.addOwners([o.did], "operator")))
    if (o.json) return yield* printJson({ did: o.did, added: true })
    yield* out(`added ${o.did} (reconciled by every backfill pass)`)
  })
).pipe(Command.withDescription("add an owner to the operator list (reconciled by every backfill pass)"))

const outcomeJson = (did: string, outcome: Reconciler.ReconcileOutcome) => {
  switch (outcome._tag) {
    case "complete":
      return {
        did,
        outcome: outcome._tag,
        repoFound: outcome.repoFound,
        records: outcome.records,
        invalid: outcome.invalid,
        written: outcome.written,
        deleted: outcome.deleted,
        pages: outcome.pages
      }
    case "failed":
      return { did, outcome: outcome._tag, kind: outcome.kind }
    default:
      return { did, outcome: outcome._tag }
  }
}

const ownersReconcile = Command.make("reconcile", { did: didArg, json }, (o) =>
  Effect.gen(function* () {
    yield* checkDid("<did>", o.did)
    const outcome = yield* withOwnerServices(Effect.flatMap(Reconciler.Reconciler, (r) => r.reconcile(o.did)))
    if (o.json) yield* printJson(outcomeJson(o.did, outcome))
    switch (outcome._tag) {
      case "complete":
        if (!o.json) {
          yield* out(
            outcome.repoFound
              ? `reconciled ${o.did}: ${outcome.records} records (${outcome.invalid} invalid omitted), ${outcome.written} written, ${outcome.deleted} deleted`
              : `reconciled ${o.did}: the PDS has no such repo; ${outcome.deleted} webhooks deleted`
          )
        }
        return
      case "failed":
        return yield* Effect.fail(new Failed({ text: `reconciliation failed: ${outcome.kind}` }))
      case "busy":
        return yield* Effect.fail(new Failed({ text: "too many owners are being reconciled right now; try again later" }))
      case "superseded":
        return yield* Effect.fail(new Failed({ text: "another reconciliation of this owner started meanwhile" }))
    }
  })
).pipe(Command.withDescription("reconcile one owner against its PDS now and print the outcome"))

const ownersStatus = Command.make(
  "status",
  {
    limit: Options.integer("limit").pipe(
      Options.withPseudoName("N"),
      Options.withDescription("failed and scanning owners listed at most (1..1000, default 20)"),
      Options.optional
    ),
    json
  },
  (o) =>
    Effect.gen(function* () {
      const limit = Option.getOrElse(o.limit, () => 20)
      if (limit < 1 || limit > 1000) return yield* usage("invalid --limit: must be in 1..1000")
      const s = yield* withOwnerServices(Effect.flatMap(ReconcileStore.ReconcileStore, (st) => st.summary(limit)))
      const pass =
        s.pass === undefined
          ? null
          : {
            continuation: s.pass.continuation ?? null,
            ownersDone: s.pass.ownersDone,
            startedAt: iso(s.pass.startedAt) ?? null,
            completedAt: iso(s.pass.completedAt) ?? null
          }
      if (o.json) {
        return yield* printJson({
          counts: s.counts,
          failed: s.failed.map((f) => ({
            did: f.did,
            failureCount: f.failureCount,
            lastFailureKind: f.lastFailureKind ?? null,
            failedAt: iso(f.failedAt) ?? null
          })),
          scanning: s.scanning.map((x) => ({ did: x.did, scanStartedAt: iso(x.scanStartedAt) ?? null })),
          backfill: pass
        })
      }
      const c = s.counts
      const lines = [
        `owners    unknown ${c.unknown}  scanning ${c.scanning}  complete ${c.complete}  failed ${c.failed}`,
        pass === null
          ? "backfill  no pass yet"
          : pass.completedAt !== null
            ? `backfill  last pass completed ${pass.completedAt} (${pass.ownersDone} owners)`
            : `backfill  pass in progress since ${cell(pass.startedAt ?? undefined)} (${pass.ownersDone} owners done)`
      ]
      yield* out(lines.join("\n"))
      if (s.failed.length > 0) {
        yield* out("")
        yield* out(
          table(
            ["FAILED OWNER", "FAILURES", "LAST KIND", "FAILED AT"],
            s.failed.map((f) => [f.did, String(f.failureCount), f.lastFailureKind, iso(f.failedAt)].map(cell))
          )
        )
      }
      if (s.scanning.length > 0) {
        yield* out("")
        yield* out(
          table(["SCANNING OWNER", "STARTED"], s.scanning.map((x) => [x.did, iso(x.scanStartedAt)].map(cell)))
        )
      }
    })
).pipe(Command.withDescription("reconciliation state: counts, failed and scanning owners, the backfill pass"))

const owners = Command.make("owners", {}, () => usage("missing subcommand: add, reconcile or status")).pipe(
  Command.withDescription("owners: discovery list and reconciliation against their PDS"),
  Command.withSubcommands([ownersAdd, ownersReconcile, ownersStatus])
)

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

/** `k v  k v` for the scalar fields of a section, in order (`only`: just these keys). */
const scalars = (section: { readonly [k: string]: unknown }, only?: ReadonlyArray<string>): string =>
  (only ?? Object.keys(section))
    .filter((k) => only !== undefined || asObject(section[k]) === undefined)
    .map((k) => `${cell(k)} ${hv(section[k])}`)
    .join("  ")

const SECTION_WIDTH = 12
const label = (name: string) => cell(name).padEnd(SECTION_WIDTH - 1)

const healthLines = (h: ServiceHealth): ReadonlyArray<string> => {
  const body = asObject(h.health)
  if (!h.reachable || body === undefined) return [`service: not reachable at ${h.address}`]
  const lines = [
    `${label("service")} ${h.address}  status ${hv(body["status"])}  ready ${h.ready === true ? "yes" : "no"}  phase ${hv(body["phase"])}`
  ]
  const intake = asObject(body["intake"])
  if (intake !== undefined) {
    lines.push(`${label("intake")} ${scalars(intake, ["role", "connected", "progressing", "queued"])}`)
    const streams = asObject(intake["streams"]) ?? {}
    for (const name of Object.keys(streams).slice(0, 32)) {
      const st = asObject(streams[name]) ?? {}
      lines.push(
        `  stream ${cell(name)}  ${scalars(st, ["connected", "quarantined", "failureKind", "cursorAgeSeconds", "queued"])}`
      )
    }
  }
  const delivery = asObject(body["delivery"])
  if (delivery !== undefined) {
    lines.push(`${label("delivery")} ${scalars(delivery, ["pending", "leased", "deadLetter", "inFlight", "openCircuits"])}`)
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

const status = Command.make("status", { json }, (o) =>
  Effect.gen(function* () {
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
        `webhooks    active ${s.webhooks.active}  total ${s.webhooks.total}  gone ${s.webhooks.gone}`,
        `owners      unknown ${s.owners.unknown}  scanning ${s.owners.scanning}  complete ${s.owners.complete}  failed ${s.owners.failed}`,
        `quarantine  ${s.quarantine}`,
        `secrets     ${s.secrets}`
      ].join("\n")
    )
  })
).pipe(
  Command.withDescription(
    "health summary: the service's /health (phase, readiness, intake, delivery, redis; 2 s timeout) and the database counts"
  )
)

// ---------------------------------------------------------------------------------------------
// hooks (webhook owners: their own place.wisp.v2.wh records on their PDS; no database)

const pdsOption = Options.text("pds").pipe(
  Options.withPseudoName("URL"),
  Options.withDescription(`the PDS (or entryway) to sign in to; default $ATPROTO_PDS, else ${Hooks.DEFAULT_PDS}`),
  Options.optional
)
const identifierOption = Options.text("identifier").pipe(
  Options.withPseudoName("ID"),
  Options.withDescription("handle, DID or email to sign in as; default $ATPROTO_IDENTIFIER"),
  Options.optional
)
const passwordOption = Options.redacted("password").pipe(
  Options.withPseudoName("PASSWORD"),
  Options.withDescription("app password; prefer $ATPROTO_APP_PASSWORD (arguments are visible to other local users)"),
  Options.optional
)
const connectionOptions = { pds: pdsOption, identifier: identifierOption, password: passwordOption }
const rkeyArg = Args.text({ name: "rkey" }).pipe(Args.withDescription("the webhook record's key (see hooks list)"))

/** Connection, insecure-development flag, sign-in, then `f` with the signed-in service. */
const withHooks = <A, E>(
  given: {
    readonly pds: Option.Option<string>
    readonly identifier: Option.Option<string>
    readonly password: Option.Option<Redacted.Redacted<string>>
  },
  f: (hooks: Hooks.HooksShape) => Effect.Effect<A, E>
) =>
  Effect.gen(function* () {
    const allowInsecureDev = yield* Hooks.allowInsecureDevFromEnv
    const conn = yield* Hooks.connection(given)
    return yield* Effect.provide(Effect.flatMap(Hooks.Hooks, f), Hooks.layer(conn, { allowInsecureDev }))
  })

const hooksCreate = Command.make(
  "create",
  {
    scope: Options.text("scope").pipe(
      Options.withPseudoName("AT-URI"),
      Options.withDescription("what to watch: at://<did>[/<collection>[/<rkey>]] (a canonical DID, not a handle)"),
      Options.optional
    ),
    collection: Options.text("collection").pipe(
      Options.withPseudoName("NSID"),
      Options.withDescription("shorthand for --scope at://<your did>/<NSID> (a glob like app.bsky.feed.* works)"),
      Options.optional
    ),
    backlinks: Options.boolean("backlinks").pipe(
      Options.withDescription("also fire for records in any repo that reference the scope")
    ),
    events: Options.text("events").pipe(
      Options.withPseudoName("LIST"),
      Options.withDescription("comma-separated create,update,delete (default: all)"),
      Options.optional
    ),
    url: Options.text("url").pipe(Options.withPseudoName("URL"), Options.withDescription("the receiver (https://)")),
    secret: Options.redacted("secret").pipe(
      Options.withPseudoName("SECRET"),
      Options.withDescription("inline signing secret (1-256 characters); stored in your public repo"),
      Options.optional
    ),
    secretId: Options.text("secret-id").pipe(
      Options.withPseudoName("NAME"),
      Options.withDescription("name of a secret the firehook operator manages for you"),
      Options.optional
    ),
    generateSecret: Options.boolean("generate-secret").pipe(
      Options.withDescription("generate an inline whsec_ secret and print it once")
    ),
    disabled: Options.boolean("disabled").pipe(Options.withDescription("create it paused (enabled: false)")),
    rkey: Options.text("rkey").pipe(
      Options.withPseudoName("RKEY"),
      Options.withDescription("record key (default: a TID chosen by the PDS); never replaces an existing record"),
      Options.optional
    ),
    json,
    ...connectionOptions
  },
  (o) =>
    Effect.gen(function* () {
      const signingFlags = [Option.isSome(o.secret), Option.isSome(o.secretId), o.generateSecret].filter((b) => b).length
      if (signingFlags > 1) return yield* usage("choose at most one of --secret, --secret-id, --generate-secret")
      if (Option.isSome(o.scope) === Option.isSome(o.collection)) return yield* usage("give exactly one of --scope, --collection")
      const draft: Hooks.Draft = {
        scope: Option.isSome(o.scope)
          ? { _tag: "AtUri", aturi: o.scope.value }
          : { _tag: "Collection", collection: Option.getOrElse(o.collection, () => "") },
        backlinks: o.backlinks,
        events: Option.match(o.events, { onNone: () => [], onSome: Hooks.parseEvents }),
        url: o.url,
        signing: Option.isSome(o.secret)
          ? { _tag: "Secret", secret: o.secret.value }
          : Option.isSome(o.secretId)
            ? { _tag: "SecretId", name: o.secretId.value }
            : o.generateSecret
              ? { _tag: "Generate" }
              : { _tag: "None" },
        enabled: !o.disabled,
        rkey: o.rkey
      }
      // every argument is checked before the password is used
      yield* Hooks.checkDraft(draft, yield* Hooks.allowInsecureDevFromEnv)
      const created = yield* withHooks(o, (h) => h.create(draft))
      const secret = Option.map(created.secret, Redacted.value)
      if (o.json) {
        return yield* printJson({
          did: created.did,
          uri: created.uri,
          rkey: created.rkey,
          cid: created.cid,
          enabled: draft.enabled,
          ...(Option.isSome(secret) ? { secret: secret.value } : {})
        })
      }
      yield* out(`created webhook ${created.rkey}${draft.enabled ? "" : " (disabled)"}: ${created.uri}`)
      if (Option.isSome(secret)) yield* out(`signing secret (shown once): ${secret.value}`)
    })
).pipe(Command.withDescription("create a webhook record in your repo (checked as firehook checks it, before writing)"))

const summaryJson = (w: Hooks.WebhookSummary, showUrls: boolean) => ({
  rkey: w.rkey,
  uri: w.uri,
  cid: w.cid,
  scope: w.scope ?? null,
  backlinks: w.backlinks,
  events: w.events.length === 0 ? ["create", "update", "delete"] : w.events,
  enabled: w.enabled,
  signing: w.signing,
  secretId: w.secretId ?? null,
  createdAt: w.createdAt ?? null,
  url: showUrls ? w.url ?? null : REDACTED_URL,
  accepted: w.validation === "ok",
  invalid: w.validation === "ok" ? null : w.validation
})

const hooksList = Command.make("list", { json, showUrls, ...connectionOptions }, (o) =>
  Effect.gen(function* () {
    const listed = yield* withHooks(o, (h) => h.list)
    if (o.json) {
      return yield* printJson({
        did: listed.did,
        webhooks: listed.webhooks.map((w) => summaryJson(w, o.showUrls)),
        truncated: listed.truncated
      })
    }
    if (listed.webhooks.length === 0) return yield* out(`no webhooks in ${listed.did}`)
    const headers = ["RKEY", "SCOPE", "EVENTS", "ENABLED", "SIGNING", "FIREHOOK"]
    yield* out(
      table(
        o.showUrls ? [...headers, "URL"] : headers,
        listed.webhooks.map((w) => {
          const r = [
            w.rkey,
            w.scope === undefined ? undefined : `${w.scope}${w.backlinks ? " +backlinks" : ""}`,
            w.events.length === 0 ? "all" : w.events.join(","),
            w.enabled ? "yes" : "no",
            w.signing === "secretId" ? `secretId:${w.secretId ?? "?"}` : w.signing,
            w.validation === "ok" ? "accepted" : `rejected (${w.validation})`
          ].map(cell)
          return o.showUrls ? [...r, cell(w.url)] : r
        })
      )
    )
    if (listed.truncated) yield* out(`(the first ${listed.webhooks.length} records; more exist)`)
  })
).pipe(Command.withDescription("list your webhook records (never the secrets; URLs only with --show-urls)"))

const hooksToggle = (name: "enable" | "disable", enabled: boolean) =>
  Command.make(name, { rkey: rkeyArg, json, ...connectionOptions }, (o) =>
    Effect.gen(function* () {
      yield* Hooks.checkRkey(o.rkey)
      const t = yield* withHooks(o, (h) => h.setEnabled(o.rkey, enabled))
      if (o.json) return yield* printJson({ rkey: t.rkey, uri: t.uri, cid: t.cid, enabled: t.enabled, changed: t.changed })
      yield* out(t.changed ? `${name}d webhook ${t.rkey}` : `webhook ${t.rkey} is already ${name}d`)
    })
  ).pipe(
    Command.withDescription(
      enabled ? "resume a paused webhook (enabled: true)" : "pause a webhook (enabled: false; kept, never matched)"
    )
  )

const hooksDelete = Command.make("delete", { rkey: rkeyArg, json, ...connectionOptions }, (o) =>
  Effect.gen(function* () {
    yield* Hooks.checkRkey(o.rkey)
    const d = yield* withHooks(o, (h) => h.remove(o.rkey))
    if (o.json) return yield* printJson({ rkey: d.rkey, uri: d.uri, deleted: true })
    yield* out(`deleted webhook ${d.rkey}`)
  })
).pipe(Command.withDescription("delete a webhook record"))

const hooks = Command.make("hooks", {}, () =>
  usage("missing subcommand: create, list, enable, disable or delete")
).pipe(
  Command.withDescription("your own webhook records (place.wisp.v2.wh) on your PDS; needs no firehook database"),
  Command.withSubcommands([hooksCreate, hooksList, hooksToggle("enable", true), hooksToggle("disable", false), hooksDelete])
)

// ---------------------------------------------------------------------------------------------
// the app

const firehook = Command.make("firehook", {}, () =>
  usage("missing command: deliveries, secrets, owners, status or hooks")
).pipe(
  Command.withDescription("operate a firehook deployment; manage your own webhook records (hooks)"),
  Command.withSubcommands([deliveries, secrets, owners, status, hooks])
)

const cli = Command.run(firehook, { name: "firehook", version: pkg.version })

/** @effect/cli prints parse errors as multi-line help on Console.error; we print one line instead. */
const quietConsole = Effect.map(Console.consoleWith(Effect.succeed), (c): Console.Console => ({
  ...c,
  error: () => Effect.void,
  unsafe: { ...c.unsafe, error: () => {} }
}))

/** Warnings and errors only, as logfmt on stderr. */
const stderrLogger = Logger.map(Logger.logfmtLogger, (line) => {
  process.stderr.write(`${line}\n`)
})

const program = (argv: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const console = yield* quietConsole
    const exit = yield* cli(argv).pipe(Effect.withConsole(console), Effect.exit)
    const result = Exit.isSuccess(exit) ? { code: 0, line: "" } : describeFailure(exit.cause)
    if (result.code !== 0) yield* write(process.stderr, `firehook: ${redactArgs(result.line, argv)}\n`)
    yield* flush(process.stdout)
    yield* flush(process.stderr)
    return result.code
  }).pipe(
    Effect.provide(
      Layer.mergeAll(
        BunContext.layer,
        Logger.replace(Logger.defaultLogger, stderrLogger),
        Logger.minimumLogLevel(LogLevel.Warning)
      )
    )
  )

BunRuntime.runMain(program(process.argv), {
  disableErrorReporting: true,
  disablePrettyLogger: true,
  teardown: (exit, onExit) => onExit(Exit.isSuccess(exit) && typeof exit.value === "number" ? exit.value : 1)
})
