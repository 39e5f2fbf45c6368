/**
 * firehook's delivery log and delivery actions for owners (SPEC §8.5), over the operator's own
 * statements (`operator/Operator`) limited to the caller, and the owner's test delivery
 * (`operator/TestDelivery`):
 * - `listDeliveries {rkey?, status?, since?, until?, limit, cursor?}` → `{deliveries, cursor?}`: the
 *   caller's outbox rows, newest first (by `created_at`, then delivery id), `since` inclusive and
 *   `until` exclusive on `created_at`; the cursor is opaque (the last row's key);
 * - `getDelivery {id}` → `{delivery, payload?, attempts, olderAttempts}`: the newest 100 attempts
 *   (attempt order) and the stored body parsed as JSON while it is retained;
 * - `redeliver {id}` → `{id, previousStatus, inactive?}` (`InProgress` while a worker holds a valid
 *   lease);
 * - `replay {rkey?, since?, until?}` → `{replayed, truncated, inactive?}`: the caller's dead letters, at
 *   most {@link WebhookLexicon.REPLAY_MAX} per call;
 * - `inactive` (as the operator's `subscriptionInactive` / `inactiveSubscription`): the rows whose
 *   webhook is no longer active as they were enqueued for (changed, deleted, disabled, gone,
 *   auto-disabled), which the worker cancels or parks again without a request (SPEC §4.2, §4.3);
 * - `test {rkey}` → `{id}`: a test delivery through the outbox.
 * Another owner's delivery id is `NotFound` exactly as an unknown one (the same statement with the
 * caller's DID in it answers nothing); no response carries a URL.
 */
import { Effect, Either, Option } from "effect"
import * as WebhookLexicon from "../../schemas/WebhookLexicon.js"
import { reportableStatus } from "../../schemas/XrpcContract.js"
import { decodeCursor, encodeCursor } from "../operator/ListKey.js"
import { type Delivery, Operator } from "../operator/Operator.js"
import * as TestDelivery from "../operator/TestDelivery.js"
import type { StoreError } from "../platform/Persistence.js"
import { recurringWarning } from "./ApiLog.js"
import { method } from "./Methods.js"
import { declared, internal, invalidRequest, type XrpcFailure } from "./XrpcError.js"

/** A store failure: logged (operation and driver code only), a 500. */
const storeFailure = (e: StoreError): Effect.Effect<never, XrpcFailure> =>
  recurringWarning("api: the delivery store failed", { op: e.op, code: e.code }).pipe(
    Effect.zipRight(Effect.fail(internal()))
  )

const notFound = () => declared("NotFound", "no delivery with this id")

// ---------------------------------------------------------------------------------------------
// Views

const iso = (d: Date): string => d.toISOString()

/** The JSON object of a stored body, or undefined (pruned, or not an object). */
const payloadOf = (body: string | undefined): { readonly [k: string]: unknown } | undefined => {
  if (body === undefined) return undefined
  const parsed = Either.try(() => JSON.parse(body) as unknown)
  if (Either.isLeft(parsed)) return undefined
  const v = parsed.right
  if (typeof v !== "object" || v === null || Array.isArray(v)) return undefined
  storedText.set(v, body)
  return v as { readonly [k: string]: unknown }
}

/**
 * A payload's stored text, by the parsed object: the response carries the text as stored (the
 * parse is for the lexicon's check and the `cid`), so an integer beyond 2^53, which intake keeps
 * exactly in the delivered body, is shown with its digits, not rounded by a re-encoding.
 */
const storedText = new WeakMap<object, string>()

/** `{httpStatus}` when the stored status is one the lexicon can show (100–599), else nothing. */
const statusOf = (stored: number | undefined): { readonly httpStatus?: number } => {
  const httpStatus = reportableStatus(stored)
  return httpStatus === undefined ? {} : { httpStatus }
}

/**
 * `#deliveryView` of an outbox row (the target URL is never part of it). A stored status outside
 * 100–599 (a receiver's 999, classified `http_5xx`) is left out: the error kind says what happened.
 */
export const deliveryView = (d: Delivery, cid?: string): WebhookLexicon.DeliveryView => ({
  id: d.deliveryId,
  eventId: d.eventId,
  rkey: d.webhookRkey,
  match: d.matchKind,
  event: {
    operation: d.eventOperation,
    did: d.eventDid,
    collection: d.eventCollection,
    rkey: d.eventRkey,
    ...(cid === undefined ? {} : { cid })
  },
  status: d.status,
  attempts: d.attemptCount,
  createdAt: iso(d.createdAt),
  ...(d.status === "pending" ? { nextAttemptAt: iso(d.nextAttemptAt) } : {}),
  ...(d.status === "delivered" && d.finishedAt !== undefined ? { deliveredAt: iso(d.finishedAt) } : {}),
  ...(d.lastErrorKind === undefined
    ? {}
    : {
      lastError: { kind: d.lastErrorKind, ...statusOf(d.lastHttpStatus) }
    })
})

// ---------------------------------------------------------------------------------------------
// Methods

export const listDeliveries = method(WebhookLexicon.listDeliveries, ({ caller, params }) =>
  Effect.gen(function*() {
    const before = params.cursor === undefined ? undefined : decodeCursor(params.cursor)
    if (params.cursor !== undefined && before === undefined) return yield* Effect.fail(invalidRequest("bad cursor"))
    const op = yield* Operator
    // the lexicon datetimes as given: the operator applies them to the microsecond
    const { since, until } = params
    const page = yield* op.listPage({
      owner: caller,
      limit: params.limit,
      ...(params.rkey === undefined ? {} : { webhook: params.rkey }),
      ...(params.status === undefined ? {} : { status: params.status }),
      ...(since === undefined ? {} : { since }),
      ...(until === undefined ? {} : { until }),
      ...(before === undefined ? {} : { before })
    })
    return {
      deliveries: page.deliveries.map((d) => deliveryView(d)),
      ...(page.next === undefined ? {} : { cursor: encodeCursor(page.next) })
    }
  }).pipe(
    Effect.catchTags({
      InvalidArgument: (e) => Effect.fail(invalidRequest(`${e.field} ${e.rule}`)),
      StoreError: storeFailure
    })
  ))

export const getDelivery = method(WebhookLexicon.getDelivery, ({ caller, params }) =>
  Effect.gen(function*() {
    const op = yield* Operator
    const shown = yield* op.showDelivery(params.id, {
      owner: caller,
      maxAttempts: WebhookLexicon.MAX_ATTEMPTS_SHOWN
    })
    if (Option.isNone(shown)) return yield* Effect.fail(notFound())
    const { attempts, body, delivery, olderAttemptsNotShown } = shown.value
    const payload = payloadOf(body)
    const cid = payload?.["cid"]
    return {
      delivery: deliveryView(delivery, typeof cid === "string" ? cid : undefined),
      ...(payload === undefined ? {} : { payload }),
      attempts: attempts.map((a) => ({
        n: a.attempt,
        startedAt: iso(a.startedAt),
        durationMs: a.durationMs,
        outcome: a.outcome,
        ...statusOf(a.httpStatus),
        ...(a.errorKind === undefined ? {} : { errorKind: a.errorKind }),
        ...(a.responseExcerpt === undefined ? {} : { responseExcerpt: a.responseExcerpt })
      })),
      olderAttempts: olderAttemptsNotShown
    }
  }).pipe(Effect.catchTag("StoreError", storeFailure)), {
  raw: (out) => {
    const json = out.payload === undefined ? undefined : storedText.get(out.payload)
    return json === undefined ? undefined : { key: "payload", json }
  }
})

export const redeliver = method(WebhookLexicon.redeliver, ({ caller, input }) =>
  Effect.gen(function*() {
    const op = yield* Operator
    const result = yield* op.redeliver(input.id, { owner: caller })
    switch (result._tag) {
      case "Redelivered":
        return {
          id: input.id,
          previousStatus: result.previousStatus,
          ...(result.subscriptionInactive ? { inactive: true } : {})
        }
      case "Leased":
        return yield* Effect.fail(declared("InProgress", "a worker is attempting this delivery right now"))
      case "Missing":
        return yield* Effect.fail(notFound())
    }
  }).pipe(Effect.catchTag("StoreError", storeFailure)))

export const replay = method(WebhookLexicon.replay, ({ caller, input }) =>
  Effect.gen(function*() {
    const op = yield* Operator
    const { since, until } = input
    const result = yield* op.replayDeadLetters({
      owner: caller,
      ...(input.rkey === undefined ? {} : { webhook: input.rkey }),
      ...(since === undefined ? {} : { since }),
      ...(until === undefined ? {} : { until })
    }, { max: WebhookLexicon.REPLAY_MAX })
    return {
      replayed: result.replayed,
      truncated: result.truncated || !result.complete,
      ...(result.inactiveSubscription > 0 ? { inactive: result.inactiveSubscription } : {})
    }
  }).pipe(
    Effect.catchTags({
      InvalidArgument: (e) => Effect.fail(invalidRequest(`${e.field} ${e.rule}`)),
      StoreError: storeFailure
    })
  ))

export const test = method(WebhookLexicon.test, ({ caller, input }) =>
  Effect.gen(function*() {
    const result = yield* TestDelivery.enqueue(caller, input.rkey)
    switch (result._tag) {
      case "Enqueued":
        return { id: result.deliveryId }
      case "NotFound":
        return yield* Effect.fail(declared("NotFound", "no webhook with this record key"))
      case "Inactive":
        return yield* Effect.fail(
          invalidRequest(
            result.reason === "gone"
              ? "the webhook is marked gone (its receiver answered 410): change the record or resume it first"
              : result.reason === "auto_disabled"
              ? "the webhook is auto-disabled (its receiver kept failing): resume it first"
              : "the webhook is disabled"
          )
        )
    }
  }).pipe(Effect.catchTag("StoreError", storeFailure)))

/** The delivery methods, as the API serves them. */
export const DELIVERY_METHODS = [listDeliveries, getDelivery, redeliver, replay, test] as const
