/**
 * firehook's owner methods on webhooks and deliveries (SPEC §8.5), `dev.firehook.webhook.*`. The
 * Schemas follow `lexicons/dev/firehook/webhook/*.json` (shared definitions in `defs.json`). These
 * are the contract the methods are implemented against; which of them a running service serves
 * is the owners' API's method table (`services/api`).
 *
 * Lists are newest first with an opaque `cursor` and `limit` 1–100 (default 50); times are RFC 3339
 * (SPEC §8.3).
 *
 * @since 0.1.0
 */
import { Schema } from "effect"
import { DELIVERY_STATUSES, TERMINAL_STATUSES } from "../services/matching/OutboxStatus.js"
import { MAX_NSID_LENGTH } from "./AtUri.js"
import { MAX_CID_LENGTH } from "./RecordEvent.js"
import { contract, Count, Datetime, HttpStatus, IntParam, NoParams, RecordKey, Token } from "./XrpcContract.js"

export const WEBHOOK_STATES = ["active", "disabled", "gone", "autoDisabled", "rejected"] as const
export const SIGNING_MODES = ["none", "inline", "secretId"] as const
export const CIRCUIT_STATES = ["closed", "open", "probing"] as const
export const MATCH_KINDS = ["direct", "backlink"] as const
export const OPERATIONS = ["create", "update", "delete"] as const
/** The `event` of an outcome frame: a record operation, or `test` (SPEC §8.5 `test`). */
export const OUTCOME_EVENTS = [...OPERATIONS, "test"] as const

/** Bounds shared with the lexicons. */
export const MAX_URL_LENGTH = 2048
/** `#webhookView.uri`: `at://<DID ≤ 2048>/place.wisp.v2.wh/<rkey ≤ 512>` fits (the lexicon's bound) */
export const MAX_URI_LENGTH = 8192
export const MAX_CURSOR_LENGTH = 512
export const MAX_DELIVERY_ID_LENGTH = 128
export const MAX_EXCERPT_LENGTH = 4096
export const MAX_ATTEMPTS_SHOWN = 100
export const LIST_LIMIT_DEFAULT = 50
export const LIST_LIMIT_MAX = 100

// ---------------------------------------------------------------------------------------------
// dev.firehook.webhook.defs

const DeliveryId = Token(MAX_DELIVERY_ID_LENGTH)
const Kind = Token(64)
const Did = Token(2048)
/**
 * A record's CID as intake took it: 1–512 characters of any kind (a Jetstream `cid` is checked for
 * its length only, `RecordEvent.MAX_CID_LENGTH`), so that a stored one is always a valid output.
 */
const Cid = Schema.String.pipe(
  Schema.minLength(1),
  Schema.maxLength(MAX_CID_LENGTH),
  Schema.annotations({ arbitrary: () => (fc) => fc.string({ unit: "grapheme", minLength: 1, maxLength: 64 }) })
)

/** `#errorInfo`: why the last attempt failed (a kind of SPEC §4.3, and the receiver's status). */
export const ErrorInfo = Schema.Struct({ kind: Kind, httpStatus: Schema.optional(HttpStatus) })

/** `#scope` of a webhook record (as stored; a rejected record's may not be canonical). */
export const Scope = Schema.Struct({
  aturi: Schema.String.pipe(Schema.maxLength(MAX_URL_LENGTH)),
  backlinks: Schema.optional(Schema.Boolean),
  backlinksOnly: Schema.optional(Schema.Boolean)
})

/** `#counts` of one webhook's deliveries. */
export const Counts = Schema.Struct({
  pending: Count,
  deadLetters: Count,
  delivered24h: Count,
  failed24h: Count
})

/** `#webhookView`: one of the owner's webhook records and firehook's state for it. */
export const WebhookView = Schema.Struct({
  uri: Schema.String.pipe(Schema.maxLength(MAX_URI_LENGTH)),
  rkey: RecordKey,
  /** empty for a refused record whose version firehook did not learn */
  cid: Schema.String.pipe(Schema.maxLength(MAX_CID_LENGTH)),
  scope: Scope,
  events: Schema.Array(Schema.Literal(...OPERATIONS)).pipe(Schema.maxItems(3)),
  enabled: Schema.Boolean,
  signing: Schema.Literal(...SIGNING_MODES),
  url: Schema.String.pipe(Schema.maxLength(MAX_URL_LENGTH)),
  state: Schema.Literal(...WEBHOOK_STATES),
  stateReason: Schema.optional(Kind),
  stateSince: Schema.optional(Datetime),
  circuit: Schema.Literal(...CIRCUIT_STATES),
  counts: Counts,
  lastSuccessAt: Schema.optional(Datetime),
  lastFailureAt: Schema.optional(Datetime),
  lastError: Schema.optional(ErrorInfo)
})
export type WebhookView = typeof WebhookView.Type

/** `#eventRef`: the record event a delivery carries (`test`: an owner's test delivery, §8.5 `test`). */
export const EventRef = Schema.Struct({
  operation: Schema.Literal(...OUTCOME_EVENTS),
  did: Did,
  collection: Token(MAX_NSID_LENGTH),
  rkey: RecordKey,
  cid: Schema.optional(Cid)
})

/** `#deliveryView`: one outbox row of the caller's. */
export const DeliveryView = Schema.Struct({
  id: DeliveryId,
  eventId: DeliveryId,
  rkey: RecordKey,
  match: Schema.Literal(...MATCH_KINDS),
  event: EventRef,
  status: Schema.Literal(...DELIVERY_STATUSES),
  attempts: Count,
  createdAt: Datetime,
  nextAttemptAt: Schema.optional(Datetime),
  deliveredAt: Schema.optional(Datetime),
  lastError: Schema.optional(ErrorInfo)
})
export type DeliveryView = typeof DeliveryView.Type

/** `#attemptView`: one attempt, with the first 1 KiB of the receiver's response (SPEC §4.5). */
export const AttemptView = Schema.Struct({
  n: Schema.Int.pipe(Schema.between(1, 1_000_000)),
  startedAt: Datetime,
  durationMs: Count,
  outcome: Kind,
  httpStatus: Schema.optional(HttpStatus),
  errorKind: Schema.optional(Kind),
  responseExcerpt: Schema.optional(Schema.String.pipe(Schema.maxLength(MAX_EXCERPT_LENGTH / 4)))
})

/** A JSON object (the stored webhook payload). */
export const JsonObject = Schema.Record({ key: Schema.String, value: Schema.Unknown }).pipe(
  Schema.annotations({
    arbitrary: () => (fc) => fc.dictionary(fc.stringMatching(/^[a-z]{1,8}$/), fc.jsonValue({ maxDepth: 2 }))
  })
)

// ---------------------------------------------------------------------------------------------
// The methods

const Limit = Schema.optionalWith(IntParam(1, LIST_LIMIT_MAX), { default: () => LIST_LIMIT_DEFAULT })
const Cursor = Schema.optional(Token(MAX_CURSOR_LENGTH))

export const list = contract({
  nsid: "dev.firehook.webhook.list",
  kind: "query",
  params: NoParams,
  output: Schema.Struct({ webhooks: Schema.Array(WebhookView).pipe(Schema.maxItems(10_000)) })
})

export const ListDeliveriesParams = Schema.Struct({
  rkey: Schema.optional(RecordKey),
  status: Schema.optional(Schema.Literal(...DELIVERY_STATUSES)),
  since: Schema.optional(Datetime),
  until: Schema.optional(Datetime),
  limit: Limit,
  cursor: Cursor
})

export const listDeliveries = contract({
  nsid: "dev.firehook.webhook.listDeliveries",
  kind: "query",
  params: ListDeliveriesParams,
  output: Schema.Struct({
    deliveries: Schema.Array(DeliveryView).pipe(Schema.maxItems(LIST_LIMIT_MAX)),
    cursor: Cursor
  })
})

export const getDelivery = contract({
  nsid: "dev.firehook.webhook.getDelivery",
  kind: "query",
  params: Schema.Struct({ id: DeliveryId }),
  output: Schema.Struct({
    delivery: DeliveryView,
    payload: Schema.optional(JsonObject),
    attempts: Schema.Array(AttemptView).pipe(Schema.maxItems(MAX_ATTEMPTS_SHOWN)),
    olderAttempts: Count
  }),
  errors: ["NotFound"]
})

export const redeliver = contract({
  nsid: "dev.firehook.webhook.redeliver",
  kind: "procedure",
  params: NoParams,
  input: Schema.Struct({ id: DeliveryId }),
  output: Schema.Struct({
    id: DeliveryId,
    previousStatus: Schema.Literal(...DELIVERY_STATUSES),
    /** present (true) when it will not be sent: its webhook changed, was deleted or disabled, or is gone or auto-disabled */
    inactive: Schema.optional(Schema.Boolean)
  }),
  errors: ["NotFound", "InProgress"]
})

/** SPEC §8.5: at most 10,000 dead letters per call, `truncated` beyond. */
export const REPLAY_MAX = 10_000

export const replay = contract({
  nsid: "dev.firehook.webhook.replay",
  kind: "procedure",
  params: NoParams,
  input: Schema.Struct({
    rkey: Schema.optional(RecordKey),
    since: Schema.optional(Datetime),
    until: Schema.optional(Datetime)
  }),
  output: Schema.Struct({
    replayed: Schema.Int.pipe(Schema.between(0, REPLAY_MAX)),
    truncated: Schema.Boolean,
    /** of `replayed`, those that will not be sent (as redeliver's `inactive`); present when > 0 */
    inactive: Schema.optional(Schema.Int.pipe(Schema.between(1, REPLAY_MAX)))
  })
})

export const test = contract({
  nsid: "dev.firehook.webhook.test",
  kind: "procedure",
  params: NoParams,
  input: Schema.Struct({ rkey: RecordKey }),
  output: Schema.Struct({ id: DeliveryId }),
  errors: ["NotFound"]
})

export const resume = contract({
  nsid: "dev.firehook.webhook.resume",
  kind: "procedure",
  params: NoParams,
  input: Schema.Struct({ rkey: RecordKey, replay: Schema.optional(Schema.Boolean) }),
  output: Schema.Struct({
    state: Schema.Literal(...WEBHOOK_STATES),
    /** parked deliveries replayed: at most {@link REPLAY_MAX} per call */
    replayed: Schema.Int.pipe(Schema.between(0, REPLAY_MAX)),
    /** present (true) when more parked deliveries are left: resume with replay again */
    truncated: Schema.optional(Schema.Boolean)
  }),
  errors: ["NotFound"]
})

/** `#outcome`: a terminal outcome of one of the caller's deliveries. */
export const OutcomeFrame = Schema.Struct({
  $type: Schema.Literal("dev.firehook.webhook.subscribeDeliveries#outcome"),
  id: DeliveryId,
  rkey: RecordKey,
  event: Schema.Literal(...OUTCOME_EVENTS),
  status: Schema.Literal(...TERMINAL_STATUSES),
  httpStatus: Schema.optional(HttpStatus),
  errorKind: Schema.optional(Kind),
  at: Datetime
})

/** `#info`: frames the connection dropped because its reader was slow (SPEC §8.5). */
export const InfoFrame = Schema.Struct({
  $type: Schema.Literal("dev.firehook.webhook.subscribeDeliveries#info"),
  name: Schema.Literal("DeliveriesDropped"),
  message: Schema.optional(Schema.String.pipe(Schema.maxLength(256))),
  dropped: Count
})

export const subscribeDeliveries = contract({
  nsid: "dev.firehook.webhook.subscribeDeliveries",
  kind: "subscription",
  params: NoParams,
  output: Schema.Union(OutcomeFrame, InfoFrame),
  errors: ["TooManyConnections"]
})

/** Every method of SPEC §8.5. */
export const WEBHOOK_CONTRACTS = [
  list,
  listDeliveries,
  getDelivery,
  redeliver,
  replay,
  test,
  resume,
  subscribeDeliveries
] as const
