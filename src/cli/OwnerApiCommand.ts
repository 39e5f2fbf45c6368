/**
 * `firehook hooks status|deliveries|show|redeliver|replay|test|resume|tail|secrets …`: the owner's
 * side of the owners' API (SPEC §8.6), one XRPC call per command with a token from the owner's PDS.
 *
 * Every argument is checked (with the method's lexicon Schema) before anything is sent: a bad one
 * exits 2 without signing in. A refusal by the service exits 1 with its XRPC error name and message.
 * Output is a table (human) or, with `--json`, the decoded response. Tokens are never printed; a
 * secret's token only by `secrets create` / `rotate`, whose purpose it is. Webhook URLs only with
 * `--show-urls`.
 */
import { Args, Command, Options } from "@effect/cli"
import { Effect, Option, type Redacted } from "effect"
import * as SecretLexicon from "../schemas/SecretLexicon.js"
import * as WebhookLexicon from "../schemas/WebhookLexicon.js"
import { DELIVERY_STATUSES } from "../services/matching/OutboxStatus.js"
import {
  DELIVERY_ID_RULE,
  deliveryId,
  json,
  NAME_RULE,
  nameArg,
  optional,
  parseRange,
  RKEY_RULE,
  showUrls
} from "./Arguments.js"
import { usage } from "./Failure.js"
import { connectionOptions, rkeyArg } from "./HookOptions.js"
import * as Hooks from "./HookRecords.js"
import { cell, out, printJson, terminalJson, write } from "./Output.js"
import * as OwnerApi from "./OwnerApi.js"
import * as View from "./OwnerApiView.js"
import { tail } from "./OwnerTail.js"

// ---------------------------------------------------------------------------------------------
// The service and the sign-in

const serviceOptions = {
  service: optional(
    Options.text("service"),
    "URL",
    "the firehook service (its PUBLIC_URL); default $FIREHOOK_SERVICE_URL"
  ),
  serviceDid: optional(
    Options.text("service-did"),
    "DID",
    "the service's DID; default $FIREHOOK_SERVICE_DID, else read from <service>/.well-known/did.json"
  ),
  ...connectionOptions
}

interface ApiGiven {
  readonly service: Option.Option<string>
  readonly serviceDid: Option.Option<string>
  readonly pds: Option.Option<string>
  readonly identifier: Option.Option<string>
  readonly password: Option.Option<Redacted.Redacted<string>>
}

/**
 * The service and the credentials (usage errors first), the service DID (read from the service
 * before the password is used), the sign-in, then `f` with the owner's API client.
 */
const withApi = <A, E>(given: ApiGiven, f: (api: OwnerApi.OwnerApiShape) => Effect.Effect<A, E>) =>
  Effect.gen(function*() {
    const target = yield* OwnerApi.service(given)
    const allowInsecureDev = yield* Hooks.allowInsecureDevFromEnv
    const conn = yield* Hooks.connection(given)
    const did = yield* OwnerApi.serviceDid(target)
    return yield* Effect.provide(
      Effect.flatMap(Hooks.Hooks, (hooks) => f(OwnerApi.make(hooks, target.url, did))),
      Hooks.layer(conn, { allowInsecureDev })
    )
  })

/** One call: the request is built (and checked) first, then the sign-in and the call. */
const callWith = <O>(given: ApiGiven, req: OwnerApi.ApiRequest<O>) => withApi(given, (api) => api.call(req))

const isoOf = (d: Date | undefined): string | undefined => d?.toISOString()

/** The spellings (and rules) of the arguments a lexicon may refuse (`OwnerApi.request`). */
const ID = { id: ["<id>", DELIVERY_ID_RULE] } as const
const RKEY = { rkey: ["<rkey>", RKEY_RULE] } as const
const NAME = { name: ["<name>", `${NAME_RULE}, not . or ..`] } as const

// ---------------------------------------------------------------------------------------------
// Webhooks and deliveries

const status = Command.make("status", { json, showUrls, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const req = yield* OwnerApi.request(WebhookLexicon.list, {})
    const res = yield* callWith(o, req)
    const webhooks = res.webhooks.map((w) => (o.showUrls ? w : { ...w, url: View.REDACTED }))
    if (o.json) return yield* printJson({ webhooks })
    yield* out(View.statusTable(webhooks, o.showUrls))
  })).pipe(
    Command.withDescription(
      "firehook's view of your webhooks: accepted or rejected (and why), state, circuit, counts, last error"
    )
  )

const statusOption = Options.choice("status", DELIVERY_STATUSES).pipe(
  Options.withDescription("only deliveries in this status"),
  Options.optional
)

const deliveries = Command.make(
  "deliveries",
  {
    rkey: rkeyArg.pipe(Args.optional),
    status: statusOption,
    since: optional(Options.text("since"), "TIME", "created at or after (ISO 8601, or 30m / 12h / 7d ago)"),
    until: optional(Options.text("until"), "TIME", "created before (ISO 8601, or 30m / 12h / 7d ago)"),
    limit: optional(Options.integer("limit"), "N", "at most this many (1..100, default 50)"),
    cursor: optional(Options.text("cursor"), "CURSOR", "continue after the previous page (printed at its end)"),
    json,
    ...serviceOptions
  },
  (o) =>
    Effect.gen(function*() {
      const { sinceT, untilT } = yield* parseRange(o.since, o.until)
      const req = yield* OwnerApi.request(WebhookLexicon.listDeliveries, {
        params: {
          rkey: Option.getOrUndefined(o.rkey),
          status: Option.getOrUndefined(o.status),
          since: isoOf(sinceT),
          until: isoOf(untilT),
          limit: Option.getOrUndefined(Option.map(o.limit, String)),
          cursor: Option.getOrUndefined(o.cursor)
        }
      }, { rkey: ["<rkey>", RKEY_RULE], status: "--status", limit: "--limit (1..100)", cursor: "--cursor" })
      const res = yield* callWith(o, req)
      if (o.json) return yield* printJson(res)
      if (res.deliveries.length === 0) return yield* out("no deliveries")
      yield* out(View.deliveriesTable(res.deliveries))
      if (res.cursor !== undefined) yield* out(`(more: --cursor ${res.cursor})`)
    })
).pipe(Command.withDescription("your delivery log, newest first (all your webhooks, or the one <rkey>)"))

const show = Command.make("show", { id: deliveryId, json, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const req = yield* OwnerApi.request(WebhookLexicon.getDelivery, { params: { id: o.id } }, ID)
    const res = yield* callWith(o, req)
    if (o.json) return yield* printJson(res)
    yield* out(View.deliveryDetail(res))
  })).pipe(
    Command.withDescription("one delivery: its event, status, its newest 100 attempts with the receiver's answers")
  )

const NOT_SENT =
  "will not be sent: the webhook was changed, deleted or disabled since (or is gone or auto-disabled: resume it first)"

const redeliver = Command.make("redeliver", { id: deliveryId, json, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const req = yield* OwnerApi.request(WebhookLexicon.redeliver, { input: { id: o.id } }, ID)
    const res = yield* callWith(o, req)
    if (o.json) return yield* printJson(res)
    yield* out(`redelivering ${res.id} (was ${res.previousStatus})`)
    if (res.inactive === true) yield* out(`note: it ${NOT_SENT}`)
  })).pipe(
    Command.withDescription(
      "send one of your deliveries again, with the same id (any status but one a worker is attempting right now)"
    )
  )

const replay = Command.make(
  "replay",
  {
    rkey: optional(Options.text("rkey"), "RKEY", "only this webhook's dead letters"),
    since: optional(Options.text("since"), "TIME", "created at or after (ISO 8601, or 30m / 12h / 7d ago)"),
    until: optional(Options.text("until"), "TIME", "created before (ISO 8601, or 30m / 12h / 7d ago)"),
    json,
    ...serviceOptions
  },
  (o) =>
    Effect.gen(function*() {
      const { sinceT, untilT } = yield* parseRange(o.since, o.until)
      const req = yield* OwnerApi.request(WebhookLexicon.replay, {
        input: { rkey: Option.getOrUndefined(o.rkey), since: isoOf(sinceT), until: isoOf(untilT) }
      }, { rkey: ["--rkey", RKEY_RULE] })
      const res = yield* callWith(o, req)
      if (o.json) return yield* printJson(res)
      yield* out(`replaying ${res.replayed} dead letter${res.replayed === 1 ? "" : "s"}`)
      if (res.inactive !== undefined) yield* out(`note: ${res.inactive} of them ${NOT_SENT}`)
      if (res.truncated) yield* out(`(more than ${WebhookLexicon.REPLAY_MAX} match: run replay again)`)
    })
).pipe(Command.withDescription("send your dead letters again (at most 10,000 per call)"))

const testCommand = Command.make("test", { rkey: rkeyArg, json, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const req = yield* OwnerApi.request(WebhookLexicon.test, { input: { rkey: o.rkey } }, RKEY)
    const res = yield* callWith(o, req)
    if (o.json) return yield* printJson(res)
    yield* out(`test delivery ${res.id} queued for webhook ${o.rkey} (see: firehook hooks show ${res.id})`)
  })).pipe(Command.withDescription("send a signed test event (X-Firehook-Test: 1) to a webhook now"))

const resume = Command.make(
  "resume",
  {
    rkey: rkeyArg,
    replay: Options.boolean("replay").pipe(
      Options.withDescription("also send the deliveries parked while it was disabled")
    ),
    json,
    ...serviceOptions
  },
  (o) =>
    Effect.gen(function*() {
      const req = yield* OwnerApi.request(
        WebhookLexicon.resume,
        { input: { rkey: o.rkey, ...(o.replay ? { replay: true } : {}) } },
        RKEY
      )
      const res = yield* callWith(o, req)
      if (o.json) return yield* printJson(res)
      yield* out(
        `webhook ${o.rkey} is ${res.state}${o.replay ? `; replaying ${res.replayed} parked deliveries` : ""}`
      )
      if (res.truncated === true) {
        yield* out(`(more than ${WebhookLexicon.REPLAY_MAX} parked: run resume --replay again)`)
      }
    })
).pipe(Command.withDescription("resume a webhook firehook disabled (gone, or auto-disabled after failing)"))

const tailCommand = Command.make("tail", { json, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const end = yield* withApi(o, (api) =>
      tail(api, {
        onFrame: (frame) => (o.json ? out(terminalJson(frame, 0)) : out(View.tailLine(frame))),
        onLost: (what, n) => write(process.stderr, `${View.tailLostLine(what, n)}\n`)
      }))
    if (end.code !== 1000 && end.code !== 1001) {
      return yield* new OwnerApi.ApiFailed({
        error: "Closed",
        status: undefined,
        text: `the service closed the subscription (${end.code}${end.reason === "" ? "" : ` ${end.reason}`})`
      })
    }
    yield* write(process.stderr, `firehook: the service ended the subscription (${end.code})\n`)
  })).pipe(
    Command.withDescription("print the outcomes of your deliveries as they happen, one line each, until Ctrl-C")
  )

// ---------------------------------------------------------------------------------------------
// Secrets (wisp.place's methods)

const secretsCreateOrRotate = (name: "create" | "rotate") =>
  Command.make(name, { name: nameArg, json, ...serviceOptions }, (o) =>
    Effect.gen(function*() {
      const raw = { input: { name: o.name } }
      const flags = NAME
      const res: { readonly token: string } = name === "create"
        ? yield* callWith(o, yield* OwnerApi.request(SecretLexicon.create, raw, flags))
        : yield* callWith(o, yield* OwnerApi.request(SecretLexicon.rotate, raw, flags))
      if (o.json) return yield* printJson(res)
      // the token, once, as the only line (as the operator's `secrets create` prints it; no control character)
      yield* out(cell(res.token))
    })).pipe(
      Command.withDescription(
        name === "create"
          ? "create a server-managed signing secret (secretId) and print its token once"
          : "replace a secret's token and print the new one once (the old one stops signing within 10 s)"
      )
    )

const secretsList = Command.make("list", { json, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const res = yield* callWith(o, yield* OwnerApi.request(SecretLexicon.list, {}))
    if (o.json) return yield* printJson(res)
    if (res.secrets.length === 0) return yield* out("no secrets")
    yield* out(View.secretsTable(res.secrets))
  })).pipe(Command.withDescription("your secrets' names and times (never their tokens)"))

const secretsDelete = Command.make("delete", { name: nameArg, json, ...serviceOptions }, (o) =>
  Effect.gen(function*() {
    const req = yield* OwnerApi.request(SecretLexicon.remove, { input: { name: o.name } }, NAME)
    yield* callWith(o, req)
    if (o.json) return yield* printJson({ name: o.name, deleted: true })
    yield* out(`deleted secret ${o.name}`)
  })).pipe(Command.withDescription("delete a secret (hooks naming it fail until it exists again)"))

const secrets = Command.make("secrets", {}, () => usage("missing subcommand: create, rotate, list or delete")).pipe(
  Command.withDescription("your server-managed signing secrets on the firehook service (place.wisp.v2.secret.*)"),
  Command.withSubcommands([
    secretsCreateOrRotate("create"),
    secretsCreateOrRotate("rotate"),
    secretsList,
    secretsDelete
  ])
)

/** The owners' API commands, subcommands of `firehook hooks`. */
export const ownerApiCommands = [
  status,
  deliveries,
  show,
  redeliver,
  replay,
  testCommand,
  resume,
  tailCommand,
  secrets
] as const
