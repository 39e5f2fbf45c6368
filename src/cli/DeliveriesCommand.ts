/**
 * `firehook deliveries …`: list, show, redeliver and replay deliveries.
 */
import { Command, Options } from "@effect/cli"
import { Effect, Option, Ref } from "effect"
import { decodeCursor, encodeCursor } from "../services/operator/ListKey.js"
import * as Operator from "../services/operator/Operator.js"
import {
  checkDeliveryId,
  checkDid,
  checkRkey,
  deliveryId,
  errorKind,
  json,
  optional,
  owner,
  parseRange,
  showUrls,
  since,
  until,
  webhook
} from "./Arguments.js"
import { Failed, usage } from "./Failure.js"
import { cell, flush, iso, out, printJson, REDACTED_URL, table, write } from "./Output.js"
import { withServices } from "./Services.js"

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

/**
 * The LAST ERROR cell: the kind of the last failure with its HTTP status, if any. A delivered row
 * keeps its receiver's 2xx in `lastHttpStatus` with no error kind: that is no error.
 */
const lastError = (d: Operator.Delivery): string | undefined =>
  d.lastErrorKind === undefined
    ? undefined
    : [d.lastErrorKind, d.lastHttpStatus].filter((x) => x !== undefined).join(" ")

/** The --owner / --webhook filter of `list` and `replay`, checked. */
const checkOwnerWebhook = (o: { readonly owner: Option.Option<string>; readonly webhook: Option.Option<string> }) =>
  Effect.gen(function*() {
    if (Option.isSome(o.owner)) yield* checkDid("--owner", o.owner.value)
    if (Option.isSome(o.webhook)) yield* checkRkey("--webhook", o.webhook.value)
  })

/** The filter of `list` and `replay`: the given fields only. */
const filterOf = (
  o: {
    readonly owner: Option.Option<string>
    readonly webhook: Option.Option<string>
    readonly errorKind: Option.Option<string>
  },
  sinceT: Date | undefined,
  untilT: Date | undefined
): Operator.ReplayFilter => ({
  ...(Option.isSome(o.owner) ? { owner: o.owner.value } : {}),
  ...(Option.isSome(o.webhook) ? { webhook: o.webhook.value } : {}),
  ...(Option.isSome(o.errorKind) ? { errorKind: o.errorKind.value } : {}),
  ...(sinceT === undefined ? {} : { since: sinceT }),
  ...(untilT === undefined ? {} : { until: untilT })
})

// ---------------------------------------------------------------------------------------------
// deliveries

const deliveriesList = Command.make(
  "list",
  {
    owner,
    webhook,
    status: Options.choice("status", Operator.DELIVERY_STATUSES).pipe(
      Options.withDescription("only deliveries in this status"),
      Options.optional
    ),
    errorKind,
    since,
    until,
    limit: optional(
      Options.integer("limit"),
      "N",
      `rows at most (1..${Operator.MAX_LIST_LIMIT}, default ${Operator.DEFAULT_LIST_LIMIT})`
    ),
    cursor: optional(
      Options.text("cursor"),
      "CURSOR",
      "the next page: the cursor printed at the end of the previous one"
    ),
    json,
    showUrls
  },
  (o) =>
    Effect.gen(function*() {
      yield* checkOwnerWebhook(o)
      const before = Option.isNone(o.cursor) ? undefined : decodeCursor(o.cursor.value)
      if (Option.isSome(o.cursor) && before === undefined) {
        return yield* usage("invalid --cursor: not a cursor printed by `firehook deliveries list`")
      }
      const limit = Option.getOrElse(o.limit, () => Operator.DEFAULT_LIST_LIMIT)
      if (limit < 1 || limit > Operator.MAX_LIST_LIMIT) {
        return yield* usage(`invalid --limit: must be in 1..${Operator.MAX_LIST_LIMIT}`)
      }
      const { sinceT, untilT } = yield* parseRange(o.since, o.until)
      // one page: `next` is set only when rows beyond the limit exist (a list of exactly --limit
      // rows is complete and says nothing)
      const page = yield* withServices(
        Effect.flatMap(Operator.Operator, (op) =>
          op.listPage({
            limit,
            ...(before === undefined ? {} : { before }),
            ...filterOf(o, sinceT, untilT),
            ...(Option.isSome(o.status) ? { status: o.status.value } : {})
          }))
      )
      const rows = page.deliveries
      // the next page goes on from the last row shown, with the same filters (rows sharing one
      // enqueue time, as an intake batch's do, are paged by their ids)
      const atLimit = page.next === undefined ?
        "" :
        `(${rows.length} ${rows.length === 1 ? "row" : "rows"}: the limit; more exist: add --cursor ${
          encodeCursor(page.next)
        } for the next page)`
      if (o.json) {
        // stdout stays one JSON array; a list cut at the limit says so on stderr
        if (atLimit !== "") yield* write(process.stderr, `${atLimit}\n`)
        return yield* printJson(rows.map((d) => deliveryJson(d, o.showUrls)))
      }
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
      if (atLimit !== "") yield* out(atLimit)
    })
).pipe(Command.withDescription("list deliveries, newest first (time filters: the enqueue time, created_at)"))

const deliveriesShow = Command.make("show", { id: deliveryId, json, showUrls }, (o) =>
  Effect.gen(function*() {
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
      return yield* printJson({
        delivery: deliveryJson(delivery, o.showUrls),
        attempts: attemptsJson,
        olderAttemptsNotShown
      })
    }
    const d = deliveryJson(delivery, o.showUrls)
    const fields: ReadonlyArray<[string, string | number | null]> = Object.entries(d)
    const width = fields.reduce((w, [k]) => Math.max(w, k.length), 0)
    yield* out(fields.map(([k, v]) => `${k.padEnd(width)}  ${cell(v === null ? undefined : v)}`).join("\n"))
    yield* out("")
    if (attempts.length === 0) return yield* out("no attempts")
    if (olderAttemptsNotShown > 0) {
      yield* out(
        `${olderAttemptsNotShown} older ${
          olderAttemptsNotShown === 1 ? "attempt" : "attempts"
        } not shown (the newest ${attempts.length} follow)`
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
  })).pipe(Command.withDescription("show one delivery with its newest 1,000 attempts"))

const INACTIVE_NOTE =
  "belongs to a subscription that is no longer active as enqueued (or is gone or auto-disabled) and will not be sent"

const deliveriesRedeliver = Command.make("redeliver", { id: deliveryId, json }, (o) =>
  Effect.gen(function*() {
    yield* checkDeliveryId(o.id)
    const result = yield* withServices(Effect.flatMap(Operator.Operator, (op) => op.redeliver(o.id)))
    switch (result._tag) {
      case "Missing":
        return yield* Effect.fail(new Failed({ text: "no such delivery" }))
      case "Leased":
        return yield* Effect.fail(
          new Failed({
            text: result.leasedUntil === undefined
              ? "the delivery is leased by a worker; if that worker has stopped, a running delivery worker frees the row within seconds (or its lease expires); try again then"
              : `the delivery is leased by a worker until ${result.leasedUntil.toISOString()}; if that worker has stopped, a running delivery worker frees the row within seconds (or at ${result.leasedUntil.toISOString()}); try again then`
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
  })).pipe(
    Command.withDescription(
      "deliver one delivery again (same delivery id, fresh attempt budget); refused while a worker holds a valid lease on it"
    )
  )

/** What an interrupted replay prints: the rows replayed by the statements that returned. */
const interruptedReplay = (replayed: number, asJson: boolean) =>
  (asJson
    ? printJson({ replayed, interrupted: true })
    : out(
      `interrupted: replayed at least ${replayed} dead-lettered ${
        replayed === 1 ? "delivery" : "deliveries"
      }; the others are still dead letters (run the same command again for them)`
    )).pipe(Effect.zipRight(flush(process.stdout)))

const deliveriesReplay = Command.make(
  "replay",
  {
    status: Options.choice("status", ["dead_letter"] as const).pipe(
      Options.withDescription("which deliveries to replay (only dead_letter)")
    ),
    owner,
    webhook,
    errorKind,
    since,
    until,
    json
  },
  (o) =>
    Effect.gen(function*() {
      yield* checkOwnerWebhook(o)
      const { sinceT, untilT } = yield* parseRange(o.since, o.until)
      // Ctrl-C: the statements that returned are committed; say how many rows they replayed
      const progress = yield* Ref.make(0)
      const result = yield* withServices(
        Effect.flatMap(Operator.Operator, (op) => op.replayDeadLetters(filterOf(o, sinceT, untilT), { progress }))
      ).pipe(Effect.onInterrupt(() => Effect.flatMap(Ref.get(progress), (n) => interruptedReplay(n, o.json))))
      const { complete, inactiveSubscription: inactive, replayed } = result
      if (o.json) return yield* printJson({ replayed, inactiveSubscription: inactive, complete })
      const of = inactive === 0
        ? ""
        : ` (${inactive} of them ${
          inactive === 1 ? "belongs" : "belong"
        } to a subscription that is no longer active as enqueued, or gone or auto-disabled, and will not be sent)`
      yield* out(`replayed ${replayed} dead-lettered ${replayed === 1 ? "delivery" : "deliveries"}${of}`)
      if (!complete) yield* out("(stopped at its statement bound; run the same command again for the rest)")
    })
).pipe(
  Command.withDescription(
    "make dead-lettered deliveries pending again (same ids, fresh attempt budget; the dead letters as of the start, each once; time filters: the enqueue time, created_at)"
  )
)

export const deliveries = Command.make(
  "deliveries",
  {},
  () => usage("missing subcommand: list, show, redeliver or replay")
).pipe(
  Command.withDescription("inspect, redeliver and replay deliveries"),
  Command.withSubcommands([deliveriesList, deliveriesShow, deliveriesRedeliver, deliveriesReplay])
)
